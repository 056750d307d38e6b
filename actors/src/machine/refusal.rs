//! Why the machine refuses a command or another input (`Refusal`): each reason with its
//! stable code (`code`) and what a person reads (`Display`).

use openprogram_storage::{EffectId, ExecutionState as Status, ProcessId, WaitId};

use crate::command::CommandKind;

/// Why a command (or another input) is refused: each reason has a stable code, which the
/// HTTP API answers with (409) and the command record keeps (`reason_code`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// K-4: the sender saw another version.
    #[error("stale expected_version {expected}: the current version is {current}")]
    StaleVersion { expected: u64, current: u64 },
    /// K-3: not among the controls the execution offers in its state.
    #[error("{kind} is not available while the execution is {state}")]
    NotAvailable { kind: CommandKind, state: Status },
    /// K-5: the execution is being cancelled.
    #[error(fmt = cancelling)]
    Cancelling { kind: CommandKind },
    /// K-2: Fork and Retry need the program the execution ran: its revision changed.
    #[error("{kind} is refused: the program's contract changed since this execution ran, so a child would not run the same tools")]
    RevisionChanged { kind: CommandKind },
    /// K-2: no checkpoint a fork may start from.
    #[error("this execution has no saved point to fork from")]
    NoForkPoint,
    /// K-2: the named checkpoint is not a saved point a fork may start from.
    #[error("checkpoint {checkpoint_seq} is not a saved point a fork may start from")]
    NotAForkPoint { checkpoint_seq: u64 },
    /// W-2: an answer or decline for "the pending wait", and no durable wait is pending.
    #[error("the execution is not waiting on a wait")]
    NoPendingWait,
    #[error("this execution has no wait {wait_id}")]
    UnknownWait { wait_id: WaitId },
    /// W-2: resolved, expired or invalidated: nothing is approved by a late answer.
    #[error("wait {wait_id} is {status}")]
    WaitClosed {
        wait_id: WaitId,
        status: &'static str,
    },
    /// W-3, W-4: a wait of an earlier checkpoint, or a question of an ended attempt.
    #[error("wait {wait_id} belongs to an earlier checkpoint or an ended attempt")]
    WaitNotCurrent { wait_id: WaitId },
    /// W-4: a question answered already, with another answer.
    #[error("question {wait_id} is answered already, with another answer")]
    AnsweredOtherwise { wait_id: WaitId },
    /// W-6: the answer does not fit the wait's request: `field` names the item. Nothing is
    /// recorded for it (a 400, like a body the runtime does not understand).
    #[error("the answer to {wait_id} does not fit: `{field}`: {message}")]
    InvalidAnswer {
        wait_id: WaitId,
        field: String,
        message: String,
    },
    #[error("this execution has no process {process_id}")]
    UnknownProcess { process_id: ProcessId },
    /// W-7: no grant of this execution has that id.
    #[error("this execution gave no grant {grant_id}")]
    UnknownGrant { grant_id: WaitId },
    /// W-7: revoked already.
    #[error("grant {grant_id} is revoked already")]
    GrantRevoked { grant_id: WaitId },
    /// P-2: the process has ended.
    #[error("process {process_id} is {state}")]
    ProcessEnded {
        process_id: ProcessId,
        state: &'static str,
    },
    /// the effect named is not the one awaiting reconciliation.
    #[error("effect {effect_id} is not awaiting reconciliation")]
    NotUnresolved { effect_id: EffectId },
    /// A durable function's execution does not take this kind: Steer (no function declares
    /// it takes steering yet).
    #[error("{kind} is refused: a durable function's execution does not take it (the function declares no steering)")]
    NotForFunctions { kind: CommandKind },
    /// K-3: a function an agent's call started answers to that call: a child of it would
    /// run the function again for nobody.
    #[error("{kind} is refused: this execution is the function call of agent {caller}, whose result goes to that call; {kind} the agent's execution instead")]
    SpawnedChild {
        kind: CommandKind,
        caller: openprogram_storage::ExecutionId,
    },
    /// K-7: a version policy belongs to durable functions' executions only.
    #[error("{kind} is refused: only a durable function's execution has a version policy")]
    FunctionsOnly { kind: CommandKind },
    /// J-1: a budget belongs to Jobs only.
    #[error("only a Job has a budget")]
    JobsOnly,
    /// J-1: a Continue that would leave the Job's budget spent (raise it with `budget`).
    #[error("the Job's budget is spent ({steps_used} steps, {wall_used_ms} ms under a lease): continue with a larger `budget`")]
    BudgetExhausted { steps_used: u32, wall_used_ms: u64 },
    /// An input that is not a command and does not fit the execution's state (a result
    /// for no pending call, a question asked by another attempt).
    #[error("{0}")]
    Invalid(String),
}

impl Refusal {
    pub fn code(&self) -> &'static str {
        match self {
            // The code a stale version had before refusals were typed: kept.
            Refusal::StaleVersion { .. } => "version_conflict",
            Refusal::NotAvailable { .. } => "not_available",
            Refusal::Cancelling { .. } => "cancelling",
            Refusal::RevisionChanged { .. } => "revision_changed",
            Refusal::NoForkPoint => "no_fork_point",
            Refusal::NotAForkPoint { .. } => "not_a_fork_point",
            Refusal::NoPendingWait => "no_pending_wait",
            Refusal::UnknownWait { .. } => "unknown_wait",
            Refusal::WaitClosed { .. } => "wait_closed",
            Refusal::WaitNotCurrent { .. } => "wait_not_current",
            Refusal::AnsweredOtherwise { .. } => "answered_otherwise",
            Refusal::InvalidAnswer { .. } => "invalid_answer",
            Refusal::UnknownProcess { .. } => "unknown_process",
            Refusal::UnknownGrant { .. } => "unknown_grant",
            Refusal::GrantRevoked { .. } => "grant_revoked",
            Refusal::ProcessEnded { .. } => "process_ended",
            Refusal::NotUnresolved { .. } => "not_unresolved",
            Refusal::NotForFunctions { .. } => "not_for_functions",
            Refusal::FunctionsOnly { .. } => "functions_only",
            Refusal::SpawnedChild { .. } => "spawned_child",
            Refusal::JobsOnly => "jobs_only",
            Refusal::BudgetExhausted { .. } => "budget_exhausted",
            Refusal::Invalid(_) => "invalid_input",
        }
    }
}

/// K-5: a Cancel of an execution being cancelled is refused in its own words.
fn cancelling(kind: &CommandKind, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
    match kind {
        CommandKind::Cancel => write!(f, "the execution is already being cancelled"),
        kind => write!(f, "{kind} is refused: cancellation takes precedence"),
    }
}
