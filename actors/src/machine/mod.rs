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
mod present;
mod processes;
pub mod projection;
mod refusal;
pub(crate) mod restart;
pub mod session;
mod types;
mod wait_types;
pub mod waits;

#[cfg(test)]
mod functions_tests;
#[cfg(test)]
mod grants_tests;
#[cfg(test)]
mod restart_tests;
#[cfg(test)]
mod session_tests;
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
    AttemptId, EffectId, Event, ExecutionState as Status, OwnerId, ReceiptStatus, RevisionId,
};

pub use self::function_types::*;
pub use self::present::{Attempt, Calls, FunctionRun, Present, Run, TurnState, Waits};
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
    /// What decides the next step (`present.rs`).
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

impl Machine {
    /// Its state (`queued` until admitted).
    pub fn status(&self) -> Status {
        self.present.status()
    }

    /// Every wait and live question, oldest first.
    pub fn waits(&self) -> Vec<&WaitState> {
        let ended = self.ended_waits.iter();
        let mut waits: Vec<&WaitState> = ended.chain(&self.present.waits.active).collect();
        waits.sort_by_key(|wait| wait.opened_seq);
        waits
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
        let unneeded =
            self.present.turn.parent_message_id.is_none() && *pin == ContextPin::default();
        (!unneeded && self.present.turn.context_pin.as_ref() != Some(pin)).then(|| pin.event())
    }

    /// Folds one committed event into the present and the history. `seq` is the event's seq.
    pub fn apply(&mut self, event: &Event, seq: u64, actions: &mut Vec<Action>) {
        self.apply_decided(event, seq, actions, &mut None);
    }
}

impl Present {
    /// What folding an `Admitted` event whose input parses to `input` does. The admission
    /// calls it directly with the input it just serialized into that event, so a new
    /// execution starts without reading its events back or parsing its input again.
    pub fn admit(
        &mut self,
        revision_id: RevisionId,
        parent_message_id: Option<openprogram_storage::MessageId>,
        mut input: AgentInput,
    ) {
        self.turn.revision_id = Some(revision_id);
        if input.max_iterations == 0 {
            input.max_iterations = default_max_iterations();
        }
        self.turn.parent_message_id = parent_message_id;
        self.turn.input = std::sync::Arc::new(input);
        self.run.status = Some(Status::Queued);
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
            } => self.turn.used(ModelUsage {
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
            Event::CheckpointPublished { .. } => self.run.checkpoint_seq = seq,
            Event::ContextPinned { .. } => self.turn.pinned(event, actions),
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
                self.waits
                    .fold(event, seq, self.run.checkpoint_seq, actions)
            }
            Event::GrantUsed { grant_id, tool, .. } => {
                self.waits.granted_next = Some(*grant_id);
                self.waits.granted_tool = Some(tool.clone());
            }
            Event::SessionTurn { strategy, behind } => self.apply_session_turn(strategy, *behind),
            Event::SessionTurnStarted { .. } => self.apply_session_turn_started(),
            Event::ProcessChanged { .. } | Event::ProcessOutput { .. } => self.fold_process(event),
            Event::Forked { state, .. } => self.apply_forked(state),
            Event::ContractAdopted { revision_id } => self.turn.revision_id = Some(*revision_id),
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
        self.function = function.map(FunctionRun::admitted);
        self.admit(*revision_id, *parent_message_id, AgentInput::default());
        if self.function.is_none() {
            self.run.status = Some(Status::Failed);
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
        self.attempt.owner = Some(owner_id);
        self.attempt.id = Some(attempt_id);
        // Live questions are never replayed: a new attempt ends the old ones (W-4).
        self.waits.invalidate_live_of_other_attempts(attempt_id);
        self.calls.left_in_doubt();
        match self.status() {
            // A Job without a lease waits in the queue (J-1).
            Status::Queued | Status::Running if self.needs_lease() => {
                self.run.status = Some(Status::Queued);
                actions.push(Action::Enqueue);
            }
            // A turn waiting for its session: the shell sees whether it may take it (C-2).
            Status::Queued if self.turn.queued_for_session() => actions.push(Action::Advance),
            Status::Queued | Status::Running => {
                self.run.status = Some(Status::Running);
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
        self.run.status = Some(state);
        self.session_queued_again(state, reason, actions);
        self.job_state_changed(before, reason, actions);
        self.run.pause_reason = (state == Status::Paused).then(|| reason.to_owned());
        match state {
            Status::Paused => {
                self.run.pause_requested = false;
                self.run.steps_left = None;
                actions.push(Action::Park);
            }
            Status::Running => {
                if let Some(function) = &mut self.function {
                    function.differences.clear();
                }
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
        self.calls.dispatched(self.attempt);
        actions.push(Action::RunDispatched);
    }

    /// A tool call's outcome: the call is done, or, `Unknown`, awaits reconciliation.
    fn tool_finished(&mut self, status: ReceiptStatus, seq: u64, actions: &mut Vec<Action>) {
        let pending = self.calls.pending_tool.take();
        if status == ReceiptStatus::Unknown {
            self.calls.unresolved = pending;
            self.calls.unresolved_seq = seq;
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
        self.turn.iterations += 1;
        // W-7: an approval or grant covers the one call decided right after it, if it is a
        // call of the tool it names.
        let granted = self.waits.granted_next.take();
        let granted_tool = self.waits.granted_tool.take();
        if let Some(Decision::Tool { tool, args, .. }) = decision {
            let mut pending = PendingTool::new(tool_effect(*effect_id), tool.clone(), args.clone());
            pending.grant =
                granted.filter(|_| granted_tool.as_ref().is_none_or(|named| named == tool));
            self.calls.pending_tool = Some(pending);
        }
        self.step_taken(actions);
    }

    /// One declared step finished: count it against a Step, and go on if still running.
    pub(crate) fn step_taken(&mut self, actions: &mut Vec<Action>) {
        if let Some(left) = &mut self.run.steps_left {
            *left = left.saturating_sub(1);
        }
        if self.status() == Status::Running {
            actions.push(Action::Advance);
        }
    }

    /// The checkpoint's next action, as JSON text for the execution head (E-3).
    pub fn next_action(&self) -> String {
        let next = match (&self.calls.pending_tool, self.status(), &self.function) {
            (_, status, _) if status.is_terminal() => NextAction::None,
            (_, _, Some(function)) => NextAction::Function {
                next_position: function.steps_done,
            },
            (_, Status::Waiting, None) => NextAction::Wait {
                wait_id: self.waits.first_pending().map(|wait| wait.wait_id),
            },
            (Some(pending), _, None) => NextAction::Tool {
                effect_id: pending.effect_id,
                tool: &pending.tool,
            },
            (None, _, None) => NextAction::Model {
                iterations: self.turn.iterations,
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
