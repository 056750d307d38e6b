//! The actix actors of the runtime and the operations built on them: an execution's pure
//! state machine and its actor shell (`execution`), the command service and its reads, the
//! lifecycle around executions, the plug-ins (providers, tools, durable functions), waits,
//! sessions and conversations, Jobs and managed processes. ARCHITECTURE.md's code map says
//! which file holds what.
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
mod command_hash;
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
pub mod figures;
pub mod function;
mod function_boundary;
pub mod function_builtin;
#[cfg(feature = "providers")]
pub mod http_tool;
pub mod inspect;
pub mod lifecycle;
pub mod machine;
pub mod mailbox;
#[cfg(test)]
mod mailbox_tests;
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
pub mod watchers;

pub use error::{Error, Result};
pub use openprogram_storage as storage;
