//! The actix actors of the runtime: execution, attempt lease, managed process, supervisor
//! and command service. Built on the storage crate's `EventStore`; nothing here writes to
//! disk except through a storage `Transition`.
//!
//! Architecture invariant: actors depend on `openprogram-storage`, never the reverse, and
//! the execution state machine (`execution::machine`) stays pure (no actix, sled or clock).

pub mod execution;

pub use openprogram_storage as storage;
