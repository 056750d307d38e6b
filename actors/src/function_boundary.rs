//! The boundaries of a durable function's body (F-1, F-4, W-1): the messages its
//! `FunctionContext` sends the execution actor at each step, ask and nested call, and the
//! answers it gets. The execution actor handles them (`execution/function_run.rs`).

use actix::prelude::*;
use openprogram_storage::{EffectId, ExecutionId, ReceiptStatus};

use crate::machine::Recovery;

/// Why a step did not give a result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    /// The execution pauses or is cancelled at this boundary (or its attempt ended): the
    /// body must return; a later run continues from here.
    #[error("the execution is suspended at this step")]
    Suspended,
    /// The step ran and failed; its failure is committed like a result.
    #[error("step failed: {0}")]
    Failed(String),
    /// The step's result does not read back as the type asked for.
    #[error("step result does not decode: {0}")]
    Decode(String),
}

/// What running a step gets: its effect id (an idempotency key for the outside world).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepRun {
    pub execution_id: ExecutionId,
    pub effect_id: EffectId,
    /// The running attempt's fencing epoch (see `ToolCall::epoch`).
    pub epoch: u64,
}

/// The execution's answer at a step boundary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Boundary {
    /// Committed already: its receipt status and output, never run again (F-4).
    Committed {
        status: ReceiptStatus,
        output: String,
    },
    /// Run it as `effect_id` by the attempt at `epoch` (for an External step, its intent is
    /// durable now).
    Run { effect_id: EffectId, epoch: u64 },
    /// Do not run it: the execution pauses, is cancelled, or this run of the body is over.
    Suspend,
}

/// Asked by a step before it runs.
#[derive(Debug, Message)]
#[rtype(result = "Boundary")]
pub struct StepBoundary {
    pub step_id: String,
    pub recovery: Recovery,
    /// Which run of the body asks: a run the execution has ended gets `Suspend`.
    pub run: u64,
}

/// Sent by a step once it ran: its result to commit. Answered once it is durable.
#[derive(Debug, Message)]
#[rtype(result = "bool")]
pub struct StepDone {
    pub step_id: String,
    pub effect_id: EffectId,
    pub status: ReceiptStatus,
    pub output: String,
    pub run: u64,
}

/// Asked by `ask` (F-1, W-1): the durable wait `ask_id`, opened with `prompt` if it is not
/// yet.
#[derive(Debug, Message)]
#[rtype(result = "Asked")]
pub struct AskBoundary {
    pub ask_id: String,
    pub spec: crate::wait_request::WaitSpec,
    pub run: u64,
}

/// The execution's answer to an `ask`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    Answered(String),
    Declined,
    /// Opened now (the execution waits for a person), or the run is over: the body returns;
    /// the run after the answer reads it.
    Suspend,
}

/// Sent by a nested `workflow` before its body first runs: its own record (which function,
/// revision and input), committed once. Answered `false` if the run is over.
#[derive(Debug, Message)]
#[rtype(result = "bool")]
pub struct CallStarted {
    pub run: u64,
    pub call_id: String,
    pub function: String,
    pub revision: u32,
    pub input: serde_json::Value,
}

/// Sent by a nested `workflow` whose function revision is not registered: the execution
/// pauses `revision_missing` (F-3) and this run stops.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct RevisionMissing {
    pub run: u64,
}
