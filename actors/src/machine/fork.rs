//! Fork (K-2), pure: which saved points of an execution a fork may start from, and the state
//! a child resumes from. The child gets a copy of that state in its own `Forked` event, so
//! the original's history never changes and the child never reads it again.

use openprogram_storage::{EffectId, EventEnvelope};
use serde::{Deserialize, Serialize};

use crate::machine::{
    CompletedStep, Decision, ForkPoint, Machine, PendingTool, Present, Refusal, ToolArgs, Turn,
};

/// What a forked child resumes from: the context up to the saved point and the tool call
/// that came next, if any, under a fresh effect id (the child's call is its own effect).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForkState {
    pub context: Vec<Turn>,
    pub iterations: u32,
    pub steers: Vec<String>,
    pub next_tool: Option<ForkedTool>,
    /// A durable function's fork: its committed steps up to the saved point, which the
    /// child reads back instead of running (K-2, F-4).
    #[serde(default)]
    pub function: Option<ForkedFunction>,
}

/// What a durable function's fork copies: the revision the original ran then and the steps
/// it had committed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForkedFunction {
    pub revision: u32,
    pub identity: String,
    pub aliases: Vec<(String, u32)>,
    pub steps: Vec<CompletedStep>,
    /// The results as that revision reads them, where its conversion changed them (F-3).
    #[serde(default)]
    pub converted: Vec<(u32, String)>,
    /// The policy it ran under then.
    #[serde(default)]
    pub policy: openprogram_storage::VersionPolicy,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForkedTool {
    pub effect_id: EffectId,
    pub tool: String,
    pub args: ToolArgs,
}

/// A saved point a fork may start from: a checkpoint after which the work left needs no
/// decision of a person and no outcome is in doubt — not after the final reply, not at an
/// approval the original is (or was) waiting for, not between an approval and the
/// operation it granted (its scope is that one operation, of the original), not with an
/// effect awaiting reconciliation.
fn allowed(machine: &Machine) -> bool {
    let after_a_decision_for_people = last_step(&machine.context).is_some_and(for_people);
    !after_a_decision_for_people
        && machine.present.calls.unresolved.is_none()
        && machine.present.waits.pending_wait().is_none()
}

/// The context's last turn that is a step (a steer is none: it only shapes the next one).
pub(crate) fn last_step(context: &[Turn]) -> Option<&Turn> {
    context
        .iter()
        .rev()
        .find(|turn| !matches!(turn, Turn::Steer { .. }))
}

/// Whether a turn is a decision for people (a reply, a question) or a person's answer: no
/// fork starts right after one. All a projection keeps of the context's last turn.
pub(crate) fn for_people(turn: &Turn) -> bool {
    matches!(
        turn,
        Turn::Decided(Decision::Reply { .. } | Decision::Ask { .. }) | Turn::WaitResolved { .. }
    )
}

impl Machine {
    /// Notes the checkpoint just published at `seq` if a fork may start from it: an
    /// allowed point whose next step is not an External call dispatched already.
    pub(crate) fn note_fork_point(&mut self, seq: u64) {
        if self.present.function.is_some() {
            // A function's saved point: its steps so far committed, none in flight or in
            // doubt, no person asked.
            let settled = self.present.calls.pending_steps.is_empty()
                && self.present.calls.unresolved.is_none()
                && self.present.waits.pending_wait().is_none();
            if settled {
                self.fork_points.push(ForkPoint {
                    checkpoint_seq: seq,
                    next_effect: None,
                });
            }
            return;
        }
        let calls = &self.present.calls;
        let next_effect = calls.pending_effect();
        // A call of a function (F-6) starts a child whose steps take effect: a fork whose
        // next step is that call would run them all again under a new child.
        let repeats_an_effect = calls.function_call().is_some()
            || next_effect.is_some_and(|effect_id| self.dispatched_externals.contains(&effect_id));
        if allowed(self) && !repeats_an_effect {
            self.fork_points.push(ForkPoint {
                checkpoint_seq: seq,
                next_effect,
            });
        }
    }

    /// The checkpoint seq to fork from: `requested` if it is a saved point a fork may start
    /// from, else the latest one when none is requested. An External call is dispatched
    /// only after the checkpoint that names it, so a point stops being one when its next
    /// call is dispatched (`ToolDispatched`), never later.
    pub(crate) fn fork_point(&self, requested: Option<u64>) -> Result<u64, Refusal> {
        match requested {
            Some(seq) => self
                .fork_points
                .iter()
                .any(|point| point.checkpoint_seq == seq)
                .then_some(seq)
                .ok_or(Refusal::NotAForkPoint {
                    checkpoint_seq: seq,
                }),
            None => self
                .fork_points
                .last()
                .map(|point| point.checkpoint_seq)
                .ok_or(Refusal::NoForkPoint),
        }
    }
}

/// The state at `checkpoint_seq` (as found by `Machine::fork_point`), with `fresh` as the effect id
/// of the tool call that comes next.
pub fn fork_state(events: &[EventEnvelope], checkpoint_seq: u64, fresh: EffectId) -> ForkState {
    let mut machine = Machine::default();
    let mut ignored = Vec::new();
    for envelope in events
        .iter()
        .take_while(|envelope| envelope.seq <= checkpoint_seq)
    {
        machine.apply(&envelope.event, envelope.seq, &mut ignored);
        ignored.clear();
    }
    let function = machine.present.function.as_ref().map(|run| ForkedFunction {
        revision: run.active_revision,
        identity: run.active_identity.clone(),
        aliases: run.step_aliases.clone().into_iter().collect(),
        steps: machine.completed_steps.clone(),
        converted: machine.converted_outputs.clone().into_iter().collect(),
        policy: run.policy,
    });
    let forked = |pending: PendingTool| ForkedTool {
        effect_id: fresh,
        tool: pending.tool,
        args: pending.args,
    };
    ForkState {
        function,
        context: machine.context.as_ref().clone(),
        iterations: machine.present.turn.iterations,
        steers: machine.present.run.steers.clone(),
        next_tool: machine.present.calls.pending_tool.map(forked),
    }
}

impl Machine {
    /// The history of a `Forked` event: the child's context is the copied one.
    pub(crate) fn record_forked(&mut self, state: &str) {
        match serde_json::from_str::<ForkState>(state) {
            Ok(state) => {
                self.context = std::sync::Arc::new(state.context);
                let (steps, converted) = state
                    .function
                    .map(|function| (function.steps, function.converted))
                    .unwrap_or_default();
                self.converted_outputs.extend(converted);
                for step in steps {
                    self.step_index
                        .insert(step.step_id.clone(), self.completed_steps.len());
                    self.completed_steps.push(step);
                }
            }
            // Written by `fork_state` and checksummed on disk: unreadable only if this build
            // cannot read what another wrote. The child then has no history to act on.
            Err(_) => self.text = "the fork's saved state is unreadable".into(),
        }
    }
}

impl Present {
    /// Folds a `Forked` event: the child resumes from the copied state.
    pub(crate) fn apply_forked(&mut self, state: &str) {
        let Ok(state) = serde_json::from_str::<ForkState>(state) else {
            return;
        };
        self.turn.iterations = state.iterations;
        self.run.steers = state.steers;
        // A function's child was admitted with the function it runs.
        if let (Some(function), Some(run)) = (state.function, &mut self.function) {
            run.active_revision = function.revision;
            run.active_identity = function.identity;
            run.policy = function.policy;
            run.step_aliases = function.aliases.into_iter().collect();
            run.steps_done = u32::try_from(function.steps.len()).unwrap_or(u32::MAX);
        }
        self.calls.pending_tool = state
            .next_tool
            .map(|next| PendingTool::new(next.effect_id, next.tool, next.args));
    }
}
