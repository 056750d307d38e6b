//! What the pure machine knows of waits, live questions and managed processes: the types
//! (`WaitState`, `LiveOutcome`, `ManagedProcess`) and the derived wait id. Their rules are
//! in `waits.rs`; apart, so that `mod.rs` holds them without importing the
//! rules that work on the machine.

pub use crate::wait_request::WaitSpec;
use openprogram_storage::{
    AnswerScope, EffectId, Event, LiveBinding, ProcessId, ProcessState as ProcState, WaitId,
    WaitKind, WaitStatus,
};

/// One wait or live question, as the machine knows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct WaitState {
    pub wait_id: WaitId,
    /// The seq of its `WaitOpened`: waits are listed in this order.
    pub opened_seq: u64,
    pub kind: WaitKind,
    pub prompt: String,
    pub status: WaitStatus,
    /// The checkpoint it was opened at (0 for a live question, which has none).
    pub checkpoint_seq: u64,
    /// The submitted or accepted answer.
    pub answer: Option<String>,
    /// What an applied answer granted (W-2): this one operation, or nothing (discussion).
    pub scope: Option<AnswerScope>,
    pub live: Option<LiveBinding>,
    /// W-6: what it asks, structured (the canonical JSON text of a `WaitRequest`).
    #[serde(default)]
    pub request: Option<String>,
    /// W-8: how long it may stay open, and the wall-clock time it expires at (from the
    /// decision that opened it).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// W-8: the wait it re-opens (one that expired), if it is a re-opened one.
    #[serde(default)]
    pub reopens: Option<WaitId>,
}

/// What the call that asked a live question gets back (W-4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LiveOutcome {
    Answered(String),
    Declined,
    /// Cancelled, ended, or its owner lost: it will never be answered.
    Invalidated,
}

/// A managed process this execution started (P-1).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ManagedProcess {
    pub process_id: ProcessId,
    pub state: ProcState,
    pub output_bytes: u64,
}

/// The event of a managed process's change to `state`.
pub fn process_changed(process_id: ProcessId, state: ProcState) -> Event {
    let state = state.as_str().into();
    Event::ProcessChanged { process_id, state }
}

/// The wait id of the approval a model decision asks for: derived, so a replay or a
/// regenerated decision finds the same id (UUID v5 of the decision's id).
pub fn wait_of(decision: EffectId) -> WaitId {
    WaitId::from_uuid(uuid::Uuid::new_v5(decision.as_uuid(), b"wait"))
}
