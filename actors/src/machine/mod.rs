//! The execution state machine of an agent turn: pure (no actix, no sled, no clock, no
//! randomness; ids are handed in). `decide` turns an input into events or a rejection;
//! `apply` folds a committed event into the state and returns the shell's actions; `next`
//! says what a running, idle execution does next; `plan` (`plan.rs`) makes the transition.
//! Recovery replays stored events through the same `apply`, actions dropped.

mod controls;
mod decide;
mod decision;
pub mod fork;
mod function_types;
mod functions;
pub mod grants;
mod history;
pub mod job;
mod job_state;
mod next;
pub mod plan;
mod processes;
pub mod projection;
mod refusal;
mod restart;
pub mod session;
mod types;
mod wait_types;
pub mod waits;

#[cfg(test)]
mod grants_tests;
#[cfg(test)]
mod restart_tests;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod sim_checks;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod waits_tests;

use std::collections::BTreeSet;

use openprogram_storage::{
    AttemptId, Control, EffectId, Event, ExecutionState as Status, OwnerId, ReceiptStatus,
    RevisionId,
};

pub use self::function_types::*;
use self::types::default_max_iterations;
pub use self::types::*;
pub use self::wait_types::{process_changed, wait_of, LiveOutcome, ManagedProcess, WaitState};

/// The state of one agent turn, rebuilt from its events: the present, which decides what
/// comes next, and the history, which only grows and is read by snapshots, forks and model
/// requests. A transition's plan (`plan.rs`) folds its events into a copy of the present
/// alone, so its cost does not grow with the execution's length; committed events are folded
/// into both (`apply`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Machine {
    /// Read through `Deref`: `machine.status()`, `machine.pending_tool`.
    pub present: Present,
    /// Shared with the model request in flight; a push copies only if a request still holds
    /// it (`Arc::make_mut`), so a step costs O(1) here, not O(history).
    pub context: std::sync::Arc<Vec<Turn>>,
    /// The reply, or the reason of a failure.
    pub text: String,
    pub receipts: Receipts,
    /// Commands applied or rejected, so a redelivered command is never decided twice (K-4).
    pub decided_commands: BTreeSet<openprogram_storage::CommandId>,
    /// K-2: the checkpoints a fork may start from, oldest first (`fork.rs`).
    pub fork_points: Vec<ForkPoint>,
    /// External tool calls dispatched so far: a fork never starts at a point whose next
    /// step is one of them (it would run that effect a second time).
    pub dispatched_externals: BTreeSet<EffectId>,
    /// Waits and live questions that ended (answered, declined, expired, invalidated): they
    /// never change again. The pending ones are in the present.
    pub ended_waits: Vec<WaitState>,
    /// A durable function's steps with a committed result, in the order they completed,
    /// and where each is by step id (F-4).
    pub completed_steps: Vec<CompletedStep>,
    pub step_index: std::collections::BTreeMap<String, usize>,
    /// A durable function's nested calls, by call id (their step ids' prefix).
    pub nested_calls: std::collections::BTreeMap<String, FunctionInput>,
    /// F-3: committed results as an adopted revision reads them (its declared conversion),
    /// by position among the completed steps.
    pub converted_outputs: std::collections::BTreeMap<u32, String>,
    /// W-7: each tool call that ran on an approval or grant, with the approval it relied on.
    pub relied_on: Vec<(EffectId, openprogram_storage::WaitId)>,
    /// S-8: `Some` for a machine rebuilt from a projection (`projection.rs`): its history
    /// holds only the newest items, and this says how many it left out. It reads and decides
    /// commands; it runs nothing until the whole history is replayed.
    pub partial: Option<Dropped>,
}

/// What decides the next step: everything a transition's events can change but the history.
/// Cheap to copy whatever the execution's length (its waits are the pending ones only).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Present {
    pub status: Option<Status>,
    pub pause_reason: Option<String>,
    /// Immutable after admission; shared with every model request. Not in a projection:
    /// read from the admission's event.
    #[serde(skip)]
    pub input: std::sync::Arc<AgentInput>,
    /// Model decisions made so far (E-5 counts them against `max_iterations`).
    pub iterations: u32,
    pub pending_tool: Option<PendingTool>,
    /// A tool call recorded `Unknown`: the execution is `reconciliation_required` until a
    /// reconciliation resolves it.
    pub unresolved: Option<PendingTool>,
    /// The seq of the `Unknown` receipt of `unresolved`: one reconciliation round each (an
    /// effect found `not_applied` runs again and may become unknown again).
    pub unresolved_seq: u64,
    /// Steer texts for work not yet run, in order (K-2).
    pub steers: Vec<String>,
    pub pause_requested: bool,
    /// Steps left before pausing, while a Step runs.
    pub steps_left: Option<u32>,
    pub cancel_requested: bool,
    /// The seq of the latest published checkpoint.
    pub checkpoint_seq: u64,
    /// The owner of the newest attempt.
    pub attempt_owner: Option<OwnerId>,
    /// Commands accepted and not yet decided, oldest first: a command is accepted and
    /// decided in one transition, so only logs written before that (a crash between their
    /// two transitions) leave any; the resumed attempt decides them before its next step.
    pub pending_commands: Vec<(openprogram_storage::CommandId, Control)>,
    /// The newest attempt: live questions are bound to it (W-4).
    pub attempt_id: Option<AttemptId>,
    /// The pending waits and live questions, oldest first (W-1..W-4). A plan's fold also
    /// keeps those its events end, to write their records; `Machine::apply` moves them to
    /// the history.
    pub active_waits: Vec<WaitState>,
    /// Managed processes this execution started, oldest first (P-1). All of them: a few per
    /// execution, and small.
    pub processes: Vec<ManagedProcess>,
    /// The message the user message answers (B-1), from the admission.
    pub parent_message_id: Option<openprogram_storage::MessageId>,
    /// The revision the execution was admitted with (K-2: Fork and Retry need it loadable).
    pub revision_id: Option<RevisionId>,
    /// A durable function's execution: what it runs (F-1); `None` for an agent turn. Its
    /// External steps in flight are `pending_steps`; one in doubt is `unresolved` (then
    /// `unresolved_queue`), with the step id as the tool.
    pub function: Option<std::sync::Arc<FunctionInput>>,
    /// A durable function's steps with a committed result so far: its next position.
    pub steps_done: u32,
    /// A durable function's External steps dispatched and not finished (parallel branches
    /// run several at once), oldest first.
    pub pending_steps: Vec<PendingTool>,
    /// Further steps recorded `Unknown` beside `unresolved`, reconciled one after another.
    pub unresolved_queue: Vec<PendingTool>,
    /// F-3: the function's version policy now, and the revision it runs (the one it
    /// started with, or one it adopted).
    pub policy: openprogram_storage::VersionPolicy,
    pub active_revision: u32,
    /// F-7: the identity of the active revision's code, as admitted or adopted.
    pub active_identity: String,
    /// F-3: the step ids of an adopted revision that stand for committed steps, with the
    /// committed steps' positions (`Machine::completed_steps`).
    pub step_aliases: std::collections::BTreeMap<String, u32>,
    /// F-3: why `use_latest` could not move to the newest revision, while it waits on
    /// them (paused `version_conflict`).
    pub differences: Vec<String>,
    /// J-1: a Job's standing (`job.rs`); `None` for an execution that is no Job.
    pub job: Option<self::job_state::JobState>,
    /// E-6: what its model calls used, summed (`ModelUsage` events): tokens and retries.
    #[serde(default)]
    pub usage: ModelUsage,
    /// W-8: the durable wait that expired last, while the execution is paused
    /// `wait_expired`: a Continue re-opens it as a fresh wait.
    #[serde(default)]
    pub expired_wait: Option<WaitState>,
    /// W-7: the grants this execution gave (`machine_grants.rs`).
    #[serde(default)]
    pub grants: Vec<Grant>,
    /// W-7: the approval or grant the next tool call relies on, and the tool it names (an
    /// approval naming none covers whatever the next call is).
    #[serde(default)]
    pub granted_next: Option<openprogram_storage::WaitId>,
    #[serde(default)]
    pub granted_tool: Option<String>,
    /// C-2: its part as its session's foreground turn (`machine_session.rs`); `None` for an
    /// execution that is none (a Job, a function, a fork).
    #[serde(default)]
    pub session_turn: Option<SessionTurn>,
    /// E-8: the earlier turns its model requests carry, as last fixed.
    #[serde(default)]
    pub context_pin: Option<ContextPin>,
    /// E-8: the size of its last model request under that pin, as the provider reported.
    #[serde(default)]
    pub last_prompt: Option<LastPrompt>,
}

impl std::ops::Deref for Machine {
    type Target = Present;

    fn deref(&self) -> &Present {
        &self.present
    }
}

impl std::ops::DerefMut for Machine {
    fn deref_mut(&mut self) -> &mut Present {
        &mut self.present
    }
}

impl Machine {
    /// Every wait and live question, oldest first.
    pub fn waits(&self) -> Vec<&WaitState> {
        let mut waits: Vec<&WaitState> = self
            .ended_waits
            .iter()
            .chain(&self.present.active_waits)
            .collect();
        waits.sort_by_key(|wait| wait.opened_seq);
        waits
    }
}

impl Present {
    pub fn status(&self) -> Status {
        self.status.unwrap_or(Status::Queued)
    }
}

impl Machine {
    /// A refusal of an input that is not a command (a result, a question): no controls are
    /// part of its answer.
    pub(crate) fn reject(&self, refusal: Refusal) -> Rejection {
        Rejection {
            refusal,
            capabilities: Vec::new(),
        }
    }

    /// What `apply` does with an `Admitted` event whose input parses to `input`. The
    /// admission calls it directly with the input it just serialized into that event, so a
    /// new execution starts without reading its events back or parsing its input again.
    pub fn admit(
        &mut self,
        revision_id: RevisionId,
        parent_message_id: Option<openprogram_storage::MessageId>,
        input: AgentInput,
    ) {
        self.present.admit(revision_id, parent_message_id, input);
    }

    /// `apply` for an event of a transition decided by `decide_decision`: its `ModelDecided`
    /// is folded with `decision`, the decision its text was written from, which reads back
    /// from that text as itself, and taken: a later `ModelDecided` of the same transition
    /// would be folded from its text.
    pub fn apply_decided(
        &mut self,
        event: &Event,
        seq: u64,
        actions: &mut Vec<Action>,
        decision: &mut Option<Decision>,
    ) {
        let decided = match event {
            Event::ModelDecided { decision: text, .. } => match decision.take() {
                Some(decision) => {
                    debug_assert_eq!(
                        serde_json::from_str::<Decision>(text).ok().as_ref(),
                        Some(&decision),
                        "a decision is folded as the text it was written to reads back"
                    );
                    Some(decision)
                }
                None => serde_json::from_str(text).ok(),
            },
            _ => None,
        };
        self.record(event, seq);
        self.present.fold(event, seq, decided.as_ref(), actions);
        if let Some(decision) = decided {
            std::sync::Arc::make_mut(&mut self.context).push(Turn::Decided(decision));
        }
        self.retire_waits();
    }

    /// E-8: the event that fixes `pin` as the earlier turns this turn's model requests
    /// carry, if it is not fixed so already. A turn that answers no message has none to fix.
    pub fn pin_context(&self, pin: &ContextPin) -> Option<Event> {
        let unneeded = self.parent_message_id.is_none() && *pin == ContextPin::default();
        (!unneeded && self.context_pin.as_ref() != Some(pin)).then(|| pin.event())
    }

    /// Folds one committed event into the present and the history. `seq` is the event's seq.
    pub fn apply(&mut self, event: &Event, seq: u64, actions: &mut Vec<Action>) {
        self.apply_decided(event, seq, actions, &mut None);
    }
}

impl Present {
    /// E-6, E-8: what a model call used, summed; its prompt's size is the budget's next
    /// estimate's start.
    #[inline]
    fn usage_folded(&mut self, used: ModelUsage) {
        self.usage.add(used);
        if used.input_tokens > 0 {
            self.last_prompt = Some(LastPrompt {
                input_tokens: used.input_tokens,
                output_tokens: used.output_tokens,
            });
        }
    }

    /// E-8: the earlier turns the turn's requests carry, fixed before a model request.
    #[inline]
    fn pin_folded(&mut self, event: &Event, actions: &mut Vec<Action>) {
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

    /// See `Machine::admit`.
    fn admit(
        &mut self,
        revision_id: RevisionId,
        parent_message_id: Option<openprogram_storage::MessageId>,
        mut input: AgentInput,
    ) {
        self.revision_id = Some(revision_id);
        if input.max_iterations == 0 {
            input.max_iterations = default_max_iterations();
        }
        self.parent_message_id = parent_message_id;
        self.input = std::sync::Arc::new(input);
        self.status = Some(Status::Queued);
    }

    /// Folds one event into the present and says what the shell must do once it is
    /// committed. A `ModelDecided` is folded from `decision`, else from its text. The events
    /// of every step are folded here; the rarer ones by the rules of their part (commands,
    /// waits, processes, durable functions).
    pub(crate) fn fold(
        &mut self,
        event: &Event,
        seq: u64,
        decision: Option<&Decision>,
        actions: &mut Vec<Action>,
    ) {
        self.fold_job(event, actions);
        match event {
            Event::ModelUsage {
                input_tokens,
                output_tokens,
                retries,
                ..
            } => self.usage_folded(ModelUsage {
                input_tokens: *input_tokens,
                output_tokens: *output_tokens,
                retries: *retries,
            }),
            Event::ModelDecided { decision: text, .. } => match decision {
                Some(decision) => self.model_decided(event, Some(decision), actions),
                None => {
                    let parsed = serde_json::from_str::<Decision>(text).ok();
                    self.model_decided(event, parsed.as_ref(), actions);
                }
            },
            Event::ToolDispatched { .. } => self.tool_dispatched(actions),
            Event::ToolFinished { status, .. } => self.tool_finished(*status, seq, actions),
            Event::StateChanged { state, reason } => self.state_changed(*state, reason, actions),
            Event::CheckpointPublished { .. } => self.checkpoint_seq = seq,
            Event::ContextPinned { .. } => self.pin_folded(event, actions),
            Event::AttemptStarted {
                owner_id,
                attempt_id,
                ..
            } => self.attempt_started(*owner_id, *attempt_id, actions),
            Event::Admitted { .. } => self.admitted(event),
            Event::ControlAccepted { .. }
            | Event::CommandAccepted { .. }
            | Event::CommandRejected { .. }
            | Event::ControlApplied { .. } => self.fold_command(event, seq, actions),
            Event::WaitOpened { .. } | Event::WaitDetails { .. } | Event::WaitChanged { .. } => {
                self.fold_wait(event, seq, actions)
            }
            Event::GrantUsed { grant_id, tool, .. } => {
                self.granted_next = Some(*grant_id);
                self.granted_tool = Some(tool.clone());
            }
            Event::SessionTurn { strategy, behind } => self.apply_session_turn(strategy, *behind),
            Event::SessionTurnStarted { .. } => self.apply_session_turn_started(),
            Event::ProcessChanged { .. } | Event::ProcessOutput { .. } => self.fold_process(event),
            Event::Forked { state, .. } => self.apply_forked(state),
            Event::StepStarted { .. }
            | Event::StepFinished { .. }
            | Event::RevisionAdopted { .. }
            | Event::VersionConflict { .. } => self.fold_function(event, seq, actions),
            _ => {}
        }
    }

    /// The admission: an agent turn's input, or what a durable function runs (F-1).
    fn admitted(&mut self, event: &Event) {
        let Event::Admitted {
            kind,
            input,
            parent_message_id,
            revision_id,
            ..
        } = event
        else {
            return;
        };
        if *kind != openprogram_storage::ExecutionKind::Function {
            let parsed = serde_json::from_str(input).unwrap_or_else(|_| AgentInput {
                message: input.clone(),
                ..AgentInput::default()
            });
            self.admit(*revision_id, *parent_message_id, parsed);
            return;
        }
        // Written by the admission from a `FunctionInput`; one that does not read back
        // leaves a function execution with nothing to run (it fails at once).
        let function: Option<FunctionInput> = serde_json::from_str(input).ok();
        if let Some(function) = &function {
            self.policy = function.policy;
            self.active_revision = function.revision;
            self.active_identity.clone_from(&function.identity);
        }
        self.function = function.map(std::sync::Arc::new);
        self.admit(*revision_id, *parent_message_id, AgentInput::default());
        if self.function.is_none() {
            self.status = Some(Status::Failed);
        }
    }

    /// A new attempt owns the execution: a call the old one dispatched is now uncertain,
    /// its live questions end (W-4), and a running execution runs on.
    fn attempt_started(
        &mut self,
        owner_id: OwnerId,
        attempt_id: AttemptId,
        actions: &mut Vec<Action>,
    ) {
        self.attempt_owner = Some(owner_id);
        self.attempt_id = Some(attempt_id);
        // Live questions are never replayed: a new attempt ends the old ones (W-4).
        self.invalidate_live_of_other_attempts(attempt_id);
        if let Some(pending) = self
            .pending_tool
            .as_mut()
            .filter(|pending| pending.dispatched)
        {
            pending.uncertain = true;
        }
        for step in &mut self.pending_steps {
            step.uncertain = true;
        }
        match self.status() {
            // A Job without a lease waits in the queue (J-1).
            Status::Queued | Status::Running if self.needs_lease() => {
                self.status = Some(Status::Queued);
                actions.push(Action::Enqueue);
            }
            // A turn waiting for its session: the shell sees whether it may take it (C-2).
            Status::Queued if self.session_turn.as_ref().is_some_and(|turn| turn.queued) => {
                actions.push(Action::Advance);
            }
            Status::Queued | Status::Running => {
                self.status = Some(Status::Running);
                actions.push(Action::Advance);
            }
            Status::Cancelling => actions.push(Action::Advance),
            _ => {}
        }
    }

    /// The pause reason says why a paused execution is paused: it goes with the pause.
    /// A Job never runs without a lease: `running` is `queued` for one (J-1).
    fn state_changed(&mut self, state: Status, reason: &str, actions: &mut Vec<Action>) {
        let before = self.status();
        let state = if state == Status::Running {
            self.run_state()
        } else {
            state
        };
        self.status = Some(state);
        self.session_queued_again(state, reason, actions);
        self.job_state_changed(before, reason, actions);
        self.pause_reason = (state == Status::Paused).then(|| reason.to_owned());
        match state {
            Status::Paused => {
                self.pause_requested = false;
                self.steps_left = None;
                actions.push(Action::Park);
            }
            Status::Running => {
                self.differences.clear();
                actions.push(Action::Advance);
            }
            Status::Cancelled | Status::Completed | Status::Failed => {
                actions.push(Action::Finished)
            }
            Status::ReconciliationRequired => actions.push(Action::Reconcile),
            Status::Waiting => actions.push(Action::Park),
            _ => {}
        }
    }

    /// The intent of a tool call is durable: it may run now.
    fn tool_dispatched(&mut self, actions: &mut Vec<Action>) {
        if let Some(pending) = &mut self.pending_tool {
            pending.dispatched = true;
            pending.dispatched_by = self.attempt_owner;
            pending.dispatched_in = self.attempt_id;
        }
        actions.push(Action::RunDispatched);
    }

    /// A tool call's outcome: the call is done, or, `Unknown`, awaits reconciliation.
    fn tool_finished(&mut self, status: ReceiptStatus, seq: u64, actions: &mut Vec<Action>) {
        let pending = self.pending_tool.take();
        if status == ReceiptStatus::Unknown {
            self.unresolved = pending;
            self.unresolved_seq = seq;
            return;
        }
        self.step_taken(actions);
    }

    /// A committed model decision; `None` if its text does not read as one.
    fn model_decided(
        &mut self,
        event: &Event,
        decision: Option<&Decision>,
        actions: &mut Vec<Action>,
    ) {
        let Event::ModelDecided { effect_id, .. } = event else {
            return;
        };
        self.iterations += 1;
        // W-7: an approval or grant covers the one call decided right after it, if it is a
        // call of the tool it names.
        let granted = self.granted_next.take();
        let granted_tool = self.granted_tool.take();
        if let Some(Decision::Tool { tool, args, .. }) = decision {
            let mut pending = PendingTool::new(tool_effect(*effect_id), tool.clone(), args.clone());
            pending.grant =
                granted.filter(|_| granted_tool.as_ref().is_none_or(|named| named == tool));
            self.pending_tool = Some(pending);
        }
        self.step_taken(actions);
    }

    /// One declared step finished: count it against a Step, and go on if still running.
    pub(crate) fn step_taken(&mut self, actions: &mut Vec<Action>) {
        if let Some(left) = &mut self.steps_left {
            *left = left.saturating_sub(1);
        }
        if self.status() == Status::Running {
            actions.push(Action::Advance);
        }
    }

    /// The checkpoint's next action, as JSON text for the execution head (E-3).
    pub fn next_action(&self) -> String {
        let next = match (&self.pending_tool, self.status()) {
            (_, status) if status.is_terminal() => NextAction::None,
            _ if self.function.is_some() => NextAction::Function {
                next_position: self.steps_done,
            },
            (_, Status::Waiting) => NextAction::Wait {
                wait_id: self
                    .active_waits
                    .iter()
                    .find(|wait| wait.status.is_pending())
                    .map(|wait| wait.wait_id),
            },
            (Some(pending), _) => NextAction::Tool {
                effect_id: pending.effect_id,
                tool: &pending.tool,
            },
            (None, _) => NextAction::Model {
                iterations: self.iterations,
            },
        };
        // Serializing ids, strings and numbers cannot fail.
        serde_json::to_string(&next).unwrap_or_default()
    }
}

/// The pause reason of the cooperative pause owned by restart recovery: only a
/// pause with this reason and a recorded restart intent resumes automatically.
pub const RESTART_PAUSE_REASON: &str = "restart_recovery";

/// The event of a change to `state`, for `reason`.
pub fn state_changed(state: Status, reason: impl Into<String>) -> Event {
    Event::StateChanged {
        state,
        reason: reason.into(),
    }
}

pub(crate) fn cancelled() -> Event {
    state_changed(Status::Cancelled, "cancel")
}
