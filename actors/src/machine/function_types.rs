//! What the pure machine knows of durable functions (F-1..F-7): what an execution was
//! admitted with, its committed steps, and what version policy decides from. Apart from
//! `types.rs`; `mod.rs` re-exports both.

use openprogram_storage::{EffectId, Event, ReceiptStatus};
use serde::{Deserialize, Serialize};

/// What a durable function's execution was admitted with (F-2): the function, the revision
/// it runs, and its input. Stored as the `Admitted` event's input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionInput {
    pub function: String,
    pub revision: u32,
    pub input: serde_json::Value,
    /// F-3: the policy it was started with (a `set_policy` overrides it).
    #[serde(default)]
    pub policy: openprogram_storage::VersionPolicy,
    /// F-7: the identity of the revision's code when it was admitted: other code registered
    /// later under the same revision is not that revision.
    #[serde(default)]
    pub identity: String,
    /// F-6: the agent whose call started it, as its child task (B-4).
    #[serde(default)]
    pub called_by: Option<openprogram_storage::ExecutionId>,
}

/// F-3: what is registered of a function execution's function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registered {
    /// Its active revision is registered, with the code it ran (F-7).
    pub active: bool,
    /// The newest registered revision and its identity, if any is.
    pub latest: Option<(u32, String)>,
}

/// F-3: a declared step correspondence: an earlier revision's step id to the step of the
/// newer revision that stands for it, if any.
pub type StepMap = dyn Fn(&str) -> Option<String> + Send + Sync;

/// F-3: a declared state conversion: a committed step's result (JSON text) as the newer
/// revision's step (its id given) reads it, or why it does not convert.
pub type StepConvert = dyn Fn(&str, &str) -> Result<String, String> + Send + Sync;

/// F-3: what a run of a function's body runs.
#[derive(Debug, Clone, PartialEq)]
pub enum RunDecision {
    Run(u32),
    /// Persist these first (an adoption, a conflict, a missing revision).
    Persist(Vec<Event>),
}

/// A durable function's step with a committed result (F-2, F-4): what every later run of
/// the body reads back instead of running it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CompletedStep {
    pub step_id: String,
    /// The revision that ran it: its provenance, kept when the function moves on (F-3).
    pub revision: u32,
    pub effect_id: EffectId,
    /// `confirmed` (its result) or `failed` (its error).
    pub status: ReceiptStatus,
    pub output: String,
}
