//! The sled-backed event log of the OpenProgram runtime: the persisted schema and the one
//! write path every state change goes through.
//!
//! - `ids` — typed identifiers (SPEC §3).
//! - `event`, `records` — what is stored: canonical events, execution heads, commands,
//!   receipts, waits, processes, blobs.
//! - `keys`, `codec` — how it is stored: key layout and checksummed record formats;
//!   `frame` — a log frame's contents; `head_record` — a head key's value (the head and
//!   its newest frame refs).
//! - `transition` — what callers submit and get back (S-2).
//! - `log` — the committer thread: group commit, fencing, fsync (S-3).
//! - `overlay` — committed state not yet written to its own keys.
//! - `shared` — what the committer and readers share; `Limits`.
//! - `open` — lock, log replay, quarantine, incarnation.
//! - `event_store` — the API every backend implements (`EventStore`, `EventReader`).
//! - `store` — sled's `Store` handle and its reads.
//! - `migrate` — schema versions (S-1).
//! - `pg` (feature `postgres`) — the PostgreSQL backend of `EventStore`, for several
//!   runtime nodes on one database.
//! - `baseline` — the raw sled limit that figures are a ratio of.
//!
//! Architecture invariant: this crate knows nothing of actix, of actors or of HTTP, and its
//! public API names no sled type.

mod acknowledged;
pub mod baseline;
pub mod codec;
mod commit;
pub mod compact;
pub mod conversation;
pub mod error;
pub mod event;
mod event_store;
pub mod failpoints;
mod frame;
mod frame_v3;
mod generation;
mod head_record;
pub mod histogram;
mod history;
pub mod ids;
mod journal;
pub mod keys;
mod log;
pub mod migrate;
mod open;
mod overlay;
#[cfg(feature = "postgres")]
pub mod pg;
pub mod planted;
pub mod policy;
mod record_value;
pub mod records;
mod shared;
mod sled_db;
pub mod store;
pub mod transition;
mod writes;
mod zero_ahead;

pub use conversation::{Compaction, ConversationOutcome, ConversationRecord, ConversationWrite};
pub use error::{Error, Result};
pub use event::{Event, EventEnvelope};
pub use event_store::{EventReader, EventStore, NodeRecord, Nodes, PurgeStep, SweepStep};
pub use histogram::{Histogram, HistogramSnapshot, NamedHistogram};
pub use ids::*;
pub use open::SalvageReport;
#[cfg(feature = "postgres")]
pub use pg::PgStore;
pub use policy::{Policies, PolicyRecord, RestartWindow};
pub use records::*;
pub use store::{Incarnation, Limits, MetricsSnapshot, Store};
pub use transition::{Committed, Outcome, SessionWrite, Transition, Upsert};
