//! The actix actors of the runtime and the operations built on them.
//!
//! - `command` — the typed command (kind, body, payload hash), parsed once;
//! - `execution::machine` — the pure state machine of an agent turn;
//! - `execution::actor` — the actor shell around it;
//! - `agent` — the `Provider` and `Tool` traits and the built-ins of SPEC §6; `script`
//!   reads the scripted provider's elements;
//! - `providers` — real model providers over HTTP, OpenAI-compatible and Anthropic (feature
//!   `providers`);
//! - `http_tool` — the `http` tool, an External effect to the hosts an embedder allows
//!   (feature `providers`);
//! - `context` — the context a model request carries: its branch, then its own turn (E-8),
//!   pure; `context_read` reads a branch from the store;
//! - `deltas` — a model's streamed output published as it arrives, never stored (E-3);
//! - `telemetry` — the runtime's histograms and counters for `/metrics` (issue 36);
//! - `call` — what a running tool call can ask of its execution (`CallHandle`): no actor;
//! - `activity` — the Activity projection of a session's branches, pure (B-1..B-5);
//! - `branches` — Activity, Fork, Retry and the session feed in the command service;
//! - `attempt_lease` — the lease actor of each running attempt;
//! - `process` — managed processes: the process actor and its OS side (P-1..P-3);
//! - `env` — what a runtime's actors share;
//! - `directory` — the live execution actors: activation, takeover of lapsed attempts;
//! - `recovery` — the restart window, the clock and startup classification, pure;
//! - `supervisor` — the supervisor actor: startup recovery, lapsed leases, orderly shutdown;
//! - `service` — the command service and the reads (K-1);
//! - `system` — the actix system thread and its arbiters;
//! - `describe` — what an actor says about itself for the debug endpoint;
//! - `inspect` — the read-only view of a runtime that inspection gets;
//! - `wait_request` — what a structured wait asks and the check of an answer (W-6), pure;
//! - `wait_deadlines` — the actor that ends waits whose deadline passed (W-8);
//! - `transcript` — the messages of a conversation folded from an execution's events (C-1), pure;
//! - `conversation` — reading them by page, branch and change (C-1);
//! - `snapshot`, `error`.
//!
//! Architecture invariant: actors depend on `openprogram-storage`, never the reverse, and
//! the execution state machine stays pure (no actix, sled or clock). Nothing here writes to
//! disk except through a storage `Transition`.

pub mod activity;
#[cfg(test)]
mod activity_tests;
pub mod admission;
pub mod agent;
pub mod append_file;
pub mod attempt_lease;
pub mod branches;
pub mod call;
pub mod command;
mod command_fields;
pub mod compaction;
pub mod context;
pub mod context_read;
pub mod conversation;
pub mod conversation_follow_up;
pub mod conversation_hooks;
pub mod conversation_read;
pub mod deltas;
pub mod describe;
pub mod directory;
pub mod env;
pub mod error;
pub mod execution;
pub mod function;
mod function_boundary;
pub mod function_builtin;
#[cfg(feature = "providers")]
pub mod http_tool;
pub mod inspect;
pub mod lifecycle;
pub mod process;
#[cfg(feature = "providers")]
pub mod providers;
pub mod rebuild;
pub mod recovery;
pub mod resource_queue;
pub mod resources;
pub mod retention;
mod script;
pub mod service;
mod session_turns;
pub mod snapshot;
pub mod supervisor;
pub mod system;
pub mod telemetry;
pub mod transcript;
pub mod wait_deadlines;
pub mod wait_request;

pub use error::{Error, Result};
pub use openprogram_storage as storage;
