//! OpenProgram: an embeddable, actor-based durable-execution runtime.
//!
//! This crate is the facade: the `Runtime` builder and handle, and later the HTTP API, the
//! CLI and the load generator. Today it re-exports the storage layer, which is the part that
//! exists (see `ARCHITECTURE.md` for the plan and the code map).
//!
//! Architecture invariant: dependencies flow `openprogram → openprogram-actors →
//! openprogram-storage`, never back.

pub use openprogram_storage as storage;
