//! The canonical event of an execution (a fact, appended and never rewritten) and its
//! envelope: their shape only; the committer and the actors decide who appends what, when.
//!
//! bincode stores enum variants by index: append new variants, never reorder, rename or
//! reshape one; a change of shape needs a new record format and a migration (`migrate.rs`).

use serde::{Deserialize, Serialize};

use crate::ids::{
    AttemptId, CommandId, EffectId, ExecutionId, LeaseId, MessageId, OwnerId, ProcessId,
    RevisionId, RunId, SessionId, TurnId, WaitId,
};
use crate::records::{
    Control, ExecutionKind, ExecutionState, JobBudget, LiveBinding, ReceiptStatus, RestartIntent,
    WaitKind, WaitStatus,
};

/// An event as stored: the fact plus where and when it was committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventEnvelope {
    pub execution_id: ExecutionId,
    /// 1-based, gap-free per execution; assigned by the committer.
    pub seq: u64,
    /// 1-based, gap-free over the whole store: the cursor of the global log.
    pub position: u64,
    /// Wall-clock time of the commit, for people. Never used for leases or ordering.
    pub at_ms: u64,
    /// Fencing epoch of the attempt that wrote it; 0 for writes made by no attempt
    /// (admission, accepted commands).
    pub writer_epoch: u64,
    pub event: Event,
}

/// A durable fact about one execution. JSON-shaped payloads (tool arguments, model
/// decisions) are carried as JSON text: bincode cannot encode self-describing values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// The execution exists: its identity and immutable input.
    Admitted {
        kind: ExecutionKind,
        session_id: SessionId,
        run_id: RunId,
        parent_execution_id: Option<ExecutionId>,
        revision_id: RevisionId,
        turn_id: TurnId,
        user_message_id: MessageId,
        reply_message_id: MessageId,
        parent_message_id: Option<MessageId>,
        /// The admission input as JSON text.
        input: String,
    },
    /// A new attempt owns the execution with a higher fencing epoch.
    AttemptStarted {
        attempt_id: AttemptId,
        owner_id: OwnerId,
        epoch: u64,
    },
    /// The execution's state changed.
    StateChanged {
        state: ExecutionState,
        reason: String,
    },
    /// A command was saved before its owner applies it (K-1).
    CommandAccepted { command_id: CommandId, kind: String },
    /// The owner applied the command.
    CommandApplied { command_id: CommandId },
    /// The owner refused the command.
    CommandRejected {
        command_id: CommandId,
        reason: String,
    },
    /// A model request was started.
    ModelRequested { effect_id: EffectId },
    /// The model decided; `decision` is JSON text.
    ModelDecided {
        effect_id: EffectId,
        decision: String,
    },
    /// A tool call was dispatched (recorded before an `External` tool runs).
    ToolDispatched {
        effect_id: EffectId,
        tool: String,
        args: String,
    },
    /// A tool call has an outcome; its receipt is stored in the same transition.
    ToolFinished {
        effect_id: EffectId,
        status: ReceiptStatus,
        output: String,
    },
    /// The next action was published as the execution's checkpoint (E-3).
    CheckpointPublished { checkpoint_seq: u64 },
    /// A restart intent was recorded.
    RestartIntentRecorded { intent: RestartIntent },
    /// A wait was opened or changed status.
    WaitChanged { wait_id: WaitId, status: WaitStatus },
    /// A managed process was started or changed state.
    ProcessChanged {
        process_id: ProcessId,
        state: String,
    },
    /// A known model error or abort: the response record of a failed model request (E-6).
    ModelFailed { effect_id: EffectId, error: String },
    /// A control command took effect (K-2); applied in mailbox order by the execution.
    ControlApplied {
        command_id: CommandId,
        control: Control,
    },
    /// The assistant reply of the execution, as delivered.
    Replied { text: String },
    /// Restart recovery claimed an abandoned execution: under the fixed command
    /// `command_id` (one claim per abandoned attempt), resuming from the exact checkpoint it
    /// inherits. Followed in the same transition by the new `AttemptStarted`.
    Resumed {
        command_id: CommandId,
        /// The fencing epoch of the attempt that was abandoned (0: never activated).
        abandoned_epoch: u64,
        inherited_checkpoint_seq: Option<u64>,
    },
    /// A control command was saved (K-1) with its payload; replaces `CommandAccepted` for
    /// controls. Its decision follows in the same transition; in older logs it may stand
    /// alone (a crash before the decision), and the attempt that resumes decides it.
    ControlAccepted {
        command_id: CommandId,
        control: Control,
    },
    /// A wait was opened (W-1) at the checkpoint published just before it in the same
    /// transition, or a live question was asked (W-4, `live` set, no checkpoint).
    WaitOpened {
        wait_id: WaitId,
        kind: WaitKind,
        prompt: String,
        live: Option<LiveBinding>,
    },
    /// A managed process produced output (P-1): the total so far; its tail is in the
    /// process record.
    ProcessOutput {
        process_id: ProcessId,
        output_bytes: u64,
    },
    /// K-2 Fork: this execution continues another's history from one of its checkpoints.
    /// `state` is the JSON the machine resumes from (context, iterations, the next tool
    /// call under a fresh effect id): a copy, so the original's events never change and
    /// nothing here depends on them staying readable.
    Forked {
        from_execution_id: ExecutionId,
        checkpoint_seq: u64,
        state: String,
    },
    /// F-2: a durable function's External step `step_id` is about to run as the effect
    /// `effect_id`: its intent, durable before the step starts (E-4). An Idempotent step
    /// has none; it is recorded only by its result.
    StepStarted {
        step_id: String,
        effect_id: EffectId,
    },
    /// F-2: a durable function's step ended: its receipt, and as `output` its result (the
    /// JSON text the function reads back on every later run, F-4) or its error.
    StepFinished {
        step_id: String,
        effect_id: EffectId,
        status: ReceiptStatus,
        output: String,
    },
    /// F-3, F-7: a durable function continues on `revision` from here, recorded before any
    /// of its steps runs. `steps`: each of its step ids that stands for a committed step,
    /// with that step's position among the committed steps (its result keeps its
    /// provenance).
    RevisionAdopted {
        revision: u32,
        /// F-7: the identity of that revision's code.
        identity: String,
        steps: Vec<(String, u32)>,
        /// The committed results the revision's declared conversion changed, by position:
        /// what its steps read back (the original results stay as they were committed).
        converted: Vec<(u32, String)>,
    },
    /// F-1, F-4: a durable function's nested call `call_id` (a step id of its caller) runs
    /// revision `revision` of `function` with `input` (JSON text): its own record, kept so
    /// that its steps in doubt are reconciled by its own function.
    WorkflowCalled {
        call_id: String,
        function: String,
        revision: u32,
        input: String,
    },
    /// F-3: `use_latest` found `revision` and could not move to it: the differences (a
    /// committed step it does not account for, no declared correspondence). The execution
    /// pauses `version_conflict` in the same transition; nothing ran.
    VersionConflict {
        revision: u32,
        differences: Vec<String>,
    },
    /// J-1, written once at admission: the execution is a background Job that runs only while
    /// it holds a lease of `resources`; its place in the queue is its id (admission order).
    JobQueued {
        resources: Vec<(String, u32)>,
        queued_at_ms: u64,
        /// A Job not admitted by then ends `expired`, never run.
        queue_deadline_ms: Option<u64>,
        budget: JobBudget,
    },
    /// J-1: the queue leased `resources` to the Job's attempt of `epoch`; it runs.
    LeaseGranted {
        lease_id: LeaseId,
        epoch: u64,
        resources: Vec<(String, u32)>,
        granted_at_ms: u64,
    },
    /// J-2: the lease `lease_id` is given back (a pause, an end, a new attempt), after
    /// `held_ms` of holding it: what the Job's wall budget is charged.
    LeaseReleased {
        lease_id: LeaseId,
        reason: String,
        held_ms: u64,
    },
    /// J-1: a Continue raised the Job's budget to `budget` (totals, not increments).
    BudgetRaised { budget: JobBudget },
    /// E-6: what the model call `effect_id` used, as its provider reported it: tokens, and
    /// the tries it retried (charged to the execution's retry budget); written in the
    /// transition that records the call's decision or error.
    ModelUsage {
        effect_id: EffectId,
        input_tokens: u64,
        output_tokens: u64,
        retries: u32,
    },
    /// W-6, W-8: what the wait `wait_id` opened just before it in the same transition asks
    /// (a structured request, JSON text) and until when: `deadline_ms` (wall clock) is
    /// `timeout_ms` after the decision that opened it. A re-opened wait (a Continue after
    /// it expired) names the wait it replaces as `reopens`.
    WaitDetails {
        wait_id: WaitId,
        request: Option<String>,
        timeout_ms: Option<u64>,
        deadline_ms: Option<u64>,
        reopens: Option<WaitId>,
    },
    /// W-7: an approval for `tool` was given without a new wait, by the grant of the
    /// approval `grant_id`: this execution's (`session_version` `None`), or its session's,
    /// as the session record stood at `session_version` (checked in the same write).
    GrantUsed {
        grant_id: WaitId,
        tool: String,
        session_version: Option<u64>,
    },
    /// C-2: the execution is its session's foreground turn, admitted with `strategy` (what
    /// a message does while another turn runs: queue, steer, reject, interrupt), queued
    /// `behind` the turn that held the session then (`None`: it took the session at once).
    SessionTurn {
        strategy: String,
        behind: Option<ExecutionId>,
    },
    /// C-2: a queued turn took its session (written with the session record's change); it
    /// `interrupted` the turn that held it, paused, if it did.
    SessionTurnStarted { interrupted: Option<ExecutionId> },
    /// E-8: which earlier turns of its branch this turn's model requests carry, fixed before
    /// its first model request (and whenever that changes), so that a request regenerated
    /// after a restart is the one made before it.
    ContextPinned {
        /// The compaction summaries standing for the branch's oldest turns, as they read
        /// then (a later compaction may drop one from the conversation record): each one's
        /// message id and text.
        summaries: Vec<(MessageId, String)>,
        /// With summaries: the oldest turn of the branch after them.
        first_kept: Option<ExecutionId>,
        /// Earlier turns of the branch that had not ended: each counts through this seq.
        open: Vec<(ExecutionId, u64)>,
        /// How many of the oldest earlier entries are left out to keep within the context
        /// budget.
        left_out: u32,
    },
    /// K-2: a person continued the execution under the runtime's contract `revision_id`,
    /// another than the one it ran under (schema 17): it runs under this one from here.
    ContractAdopted { revision_id: RevisionId },
}

impl Event {
    /// A short stable name, for logs, metrics and the `type` field of the HTTP contract.
    pub fn type_name(&self) -> &'static str {
        match self {
            Event::Admitted { .. } => "admitted",
            Event::AttemptStarted { .. } => "attempt_started",
            Event::StateChanged { .. } => "state_changed",
            Event::CommandAccepted { .. } => "command_accepted",
            Event::CommandApplied { .. } => "command_applied",
            Event::CommandRejected { .. } => "command_rejected",
            Event::ModelRequested { .. } => "model_requested",
            Event::ModelDecided { .. } => "model_decided",
            Event::ToolDispatched { .. } => "tool_dispatched",
            Event::ToolFinished { .. } => "tool_finished",
            Event::CheckpointPublished { .. } => "checkpoint_published",
            Event::RestartIntentRecorded { .. } => "restart_intent_recorded",
            Event::WaitChanged { .. } => "wait_changed",
            Event::ProcessChanged { .. } => "process_changed",
            Event::ModelFailed { .. } => "model_failed",
            Event::ControlApplied { .. } => "control_applied",
            Event::Replied { .. } => "replied",
            Event::Resumed { .. } => "resumed",
            Event::ControlAccepted { .. } => "command_accepted",
            Event::WaitOpened { .. } => "wait_opened",
            Event::ProcessOutput { .. } => "process_output",
            Event::Forked { .. } => "forked",
            Event::StepStarted { .. } => "step_started",
            Event::StepFinished { .. } => "step_finished",
            Event::RevisionAdopted { .. } => "revision_adopted",
            Event::WorkflowCalled { .. } => "workflow_called",
            Event::VersionConflict { .. } => "version_conflict",
            Event::JobQueued { .. } => "job_queued",
            Event::LeaseGranted { .. } => "lease_granted",
            Event::LeaseReleased { .. } => "lease_released",
            Event::BudgetRaised { .. } => "budget_raised",
            Event::ModelUsage { .. } => "model_usage",
            Event::WaitDetails { .. } => "wait_details",
            Event::GrantUsed { .. } => "grant_used",
            Event::SessionTurn { .. } => "session_turn",
            Event::SessionTurnStarted { .. } => "session_turn_started",
            Event::ContextPinned { .. } => "context_pinned",
            Event::ContractAdopted { .. } => "contract_adopted",
        }
    }
}
