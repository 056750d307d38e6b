//! What decides an execution's next step (`Present`), as the parts that own their data: its
//! standing under control (`Run`), the attempt that holds it (`Attempt`), the calls in
//! flight or in doubt (`Calls`), what the turn was admitted with and has used (`TurnState`),
//! its waits and grants (`Waits`), a durable function's run (`FunctionRun`), a Job's
//! standing and its managed processes. A part's own rules are its methods here; the rules
//! that read or change several parts live in the files named beside each.

use std::collections::BTreeMap;
use std::sync::Arc;

use openprogram_storage::{
    AttemptId, CommandId, Control, EffectId, Event, ExecutionState as Status, MessageId, OwnerId,
    RevisionId, VersionPolicy, WaitId,
};
use serde::{Deserialize, Serialize};

use super::function_types::FunctionInput;
use super::job_state::JobState;
use super::types::{
    Action, AgentInput, ContextPin, Grant, LastPrompt, ModelUsage, PendingTool, SessionTurn,
};
use super::wait_types::{ManagedProcess, WaitState};

/// What decides the next step: everything a transition's events can change but the history.
/// Cheap to copy whatever the execution's length (its waits are the pending ones only).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Present {
    pub run: Run,
    pub attempt: Attempt,
    pub calls: Calls,
    pub turn: TurnState,
    pub waits: Waits,
    /// A durable function's execution (F-1); `None` for an agent turn (`functions.rs`).
    pub function: Option<FunctionRun>,
    /// J-1: a Job's standing (`job.rs`); `None` for an execution that is no Job.
    pub job: Option<JobState>,
    /// Managed processes this execution started, oldest first (P-1, `processes.rs`). All of
    /// them: a few per execution, and small.
    pub processes: Vec<ManagedProcess>,
}

/// Its standing under the controls (`controls.rs`): its state, why it is paused, and what
/// was asked of it and not yet done.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub status: Option<Status>,
    pub pause_reason: Option<String>,
    pub pause_requested: bool,
    /// Steps left before pausing, while a Step runs.
    pub steps_left: Option<u32>,
    pub cancel_requested: bool,
    /// Steer texts for work not yet run, in order (K-2).
    pub steers: Vec<String>,
    /// Commands accepted and not yet decided, oldest first: a command is accepted and
    /// decided in one transition, so only logs written before that (a crash between their
    /// two transitions) leave any; the resumed attempt decides them before its next step.
    pub pending_commands: Vec<(CommandId, Control)>,
    /// The seq of the latest published checkpoint.
    pub checkpoint_seq: u64,
    /// K-7: its own restart window, if it was given one (else the runtime's applies).
    #[serde(default)]
    pub restart_window: Option<openprogram_storage::RestartWindow>,
}

impl Run {
    /// A command accepted, to be decided before the next step.
    pub(crate) fn accepted(&mut self, command_id: CommandId, control: Control) {
        self.pending_commands.push((command_id, control));
    }

    /// The control of the command `command_id`, while it is pending.
    pub fn pending(&self, command_id: CommandId) -> Option<&Control> {
        let mut pending = self.pending_commands.iter();
        pending
            .find(|(id, _)| *id == command_id)
            .map(|(_, control)| control)
    }

    /// A command decided (applied or rejected): no longer pending.
    pub(crate) fn decided(&mut self, command_id: CommandId) {
        self.pending_commands
            .retain(|(pending, _)| *pending != command_id);
    }
}

/// The newest attempt: who runs the execution. Live questions are bound to it (W-4).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    pub owner: Option<OwnerId>,
    pub id: Option<AttemptId>,
}

/// The calls in flight and in doubt.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Calls {
    /// The agent's tool call decided and not finished.
    pub pending_tool: Option<PendingTool>,
    /// A call recorded `Unknown`: the execution is `reconciliation_required` until a
    /// reconciliation resolves it (R-8, `restart.rs`).
    pub unresolved: Option<PendingTool>,
    /// The seq of the `Unknown` receipt of `unresolved`: one reconciliation round each (an
    /// effect found `not_applied` runs again and may become unknown again).
    pub unresolved_seq: u64,
    /// Further steps recorded `Unknown` beside `unresolved`, reconciled one after another.
    pub unresolved_queue: Vec<PendingTool>,
    /// A durable function's External steps dispatched and not finished (parallel branches
    /// run several at once), oldest first; one in doubt is `unresolved`, with the step id
    /// as the tool.
    pub pending_steps: Vec<PendingTool>,
}

impl Calls {
    /// The effect of the agent's tool call decided and not finished, if any.
    pub fn pending_effect(&self) -> Option<EffectId> {
        self.pending_tool.as_ref().map(|call| call.effect_id)
    }

    /// F-6: the pending tool call, if it is a call of a durable function (the `call` tool),
    /// which starts a child execution.
    pub fn function_call(&self) -> Option<&PendingTool> {
        let pending = self.pending_tool.as_ref();
        pending.filter(|call| call.tool == "call")
    }

    /// The effect in doubt reconciled first, if any.
    pub fn unresolved_effect(&self) -> Option<EffectId> {
        self.unresolved.as_ref().map(|call| call.effect_id)
    }

    /// The intent of the pending tool call is durable, written by `attempt`: it may run.
    pub(crate) fn dispatched(&mut self, attempt: Attempt) {
        if let Some(pending) = &mut self.pending_tool {
            pending.dispatched = true;
            pending.dispatched_by = attempt.owner;
            pending.dispatched_in = attempt.id;
        }
    }

    /// A new attempt took over: whatever the old one dispatched may or may not have run.
    pub(crate) fn left_in_doubt(&mut self) {
        let pending = self.pending_tool.iter_mut();
        for call in pending
            .filter(|call| call.dispatched)
            .chain(&mut self.pending_steps)
        {
            call.uncertain = true;
        }
    }
}

/// What the turn was admitted with and what its model calls have used.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TurnState {
    /// Immutable after admission; shared with every model request. Not in a projection:
    /// read from the admission's event.
    #[serde(skip)]
    pub input: Arc<AgentInput>,
    /// The message the user message answers (B-1), from the admission.
    pub parent_message_id: Option<MessageId>,
    /// The revision the execution was admitted with (K-2: Fork and Retry need it loadable).
    pub revision_id: Option<RevisionId>,
    /// Model decisions made so far (E-5 counts them against `max_iterations`).
    pub iterations: u32,
    /// E-6: what its model calls used, summed (`ModelUsage` events): tokens and retries.
    pub usage: ModelUsage,
    /// C-2: its part as its session's foreground turn (`session.rs`); `None` for an
    /// execution that is none (a Job, a function, a fork).
    pub session_turn: Option<SessionTurn>,
    /// E-8: the earlier turns its model requests carry, as last fixed.
    pub context_pin: Option<ContextPin>,
    /// E-8: the size of its last model request under that pin, as the provider reported.
    pub last_prompt: Option<LastPrompt>,
}

impl TurnState {
    /// C-2: a foreground turn in its session's line, not holding the session.
    pub fn queued_for_session(&self) -> bool {
        self.session_turn.as_ref().is_some_and(|turn| turn.queued)
    }

    /// E-6, E-8: what a model call used, summed; its prompt's size is the budget's next
    /// estimate's start.
    #[inline]
    pub(crate) fn used(&mut self, used: ModelUsage) {
        self.usage.add(used);
        if used.input_tokens > 0 {
            self.last_prompt = Some(LastPrompt {
                input_tokens: used.input_tokens,
                output_tokens: used.output_tokens,
            });
        }
    }

    /// E-8: the earlier turns the turn's requests carry, fixed before a model request.
    pub(crate) fn pinned(&mut self, event: &Event, actions: &mut Vec<Action>) {
        let Event::ContextPinned {
            summaries,
            first_kept,
            open,
            left_out,
        } = event
        else {
            return;
        };
        self.context_pin = Some(ContextPin {
            summaries: summaries.clone(),
            first_kept: *first_kept,
            open: open.clone(),
            left_out: *left_out,
        });
        // Reported of a request that held other earlier turns.
        self.last_prompt = None;
        // Fixed before a model request: make it.
        actions.push(Action::Advance);
    }
}

/// The pending waits and live questions (W-1..W-4, `waits.rs`) and the grants (W-7,
/// `grants.rs`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Waits {
    /// Pending, oldest first. A plan's fold also keeps those its events end, to write their
    /// records; `Machine::apply` moves them to the history.
    pub active: Vec<WaitState>,
    /// W-8: the durable wait that expired last, while the execution is paused
    /// `wait_expired`: a Continue re-opens it as a fresh wait.
    pub expired: Option<WaitState>,
    /// The grants this execution gave.
    pub grants: Vec<Grant>,
    /// The approval or grant the next tool call relies on, and the tool it names (an
    /// approval naming none covers whatever the next call is).
    pub granted_next: Option<WaitId>,
    pub granted_tool: Option<String>,
}

/// A durable function's run (F-1..F-7): what it runs and how far it got.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionRun {
    /// What it runs, as admitted.
    pub input: Arc<FunctionInput>,
    /// Its steps with a committed result so far: its next position.
    pub steps_done: u32,
    /// F-3: its version policy now, and the revision it runs (the one it started with, or
    /// one it adopted).
    pub policy: VersionPolicy,
    pub active_revision: u32,
    /// F-7: the identity of the active revision's code, as admitted or adopted.
    pub active_identity: String,
    /// F-3: the step ids of an adopted revision that stand for committed steps, with the
    /// committed steps' positions (`Machine::completed_steps`).
    pub step_aliases: BTreeMap<String, u32>,
    /// F-3: why `use_latest` could not move to the newest revision, while it waits on
    /// them (paused `version_conflict`).
    pub differences: Vec<String>,
}

impl FunctionRun {
    /// The run of `input` as admitted: its policy, revision and identity.
    pub fn admitted(input: FunctionInput) -> Self {
        FunctionRun {
            steps_done: 0,
            policy: input.policy,
            active_revision: input.revision,
            active_identity: input.identity.clone(),
            step_aliases: BTreeMap::new(),
            differences: Vec::new(),
            input: Arc::new(input),
        }
    }
}

impl FunctionRun {
    /// F-3: the run moved to `revision`, its steps by their ids there (`steps`).
    pub(crate) fn adopted(&mut self, revision: u32, identity: &str, steps: &[(String, u32)]) {
        self.active_revision = revision;
        self.active_identity = identity.to_owned();
        self.step_aliases = steps.iter().cloned().collect();
        self.differences.clear();
    }
}

impl Present {
    /// The revision a durable function runs now (0 for an agent turn).
    pub fn active_revision(&self) -> u32 {
        self.function.as_ref().map_or(0, |run| run.active_revision)
    }

    /// What kind of execution this is, as the contract rule reads it (K-2): a durable
    /// function's, or one that runs a model (an agent turn, a Job).
    pub fn kind(&self) -> openprogram_storage::ExecutionKind {
        match self.function {
            Some(_) => openprogram_storage::ExecutionKind::Function,
            None => openprogram_storage::ExecutionKind::AgentTurn,
        }
    }

    pub fn status(&self) -> Status {
        self.run.status.unwrap_or(Status::Queued)
    }
}
