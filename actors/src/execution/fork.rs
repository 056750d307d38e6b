//! Fork (K-2), pure: which saved points of an execution a fork may start from, and the state
//! a child resumes from. The child gets a copy of that state in its own `Forked` event, so
//! the original's history never changes and the child never reads it again.

use openprogram_storage::{EffectId, EventEnvelope};
use serde::{Deserialize, Serialize};

use crate::execution::machine::{
    Decision, ForkPoint, Machine, PendingTool, Present, Refusal, ToolArgs, Turn,
};

/// What a forked child resumes from: the context up to the saved point and the tool call
/// that came next, if any, under a fresh effect id (the child's call is its own effect).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForkState {
    pub context: Vec<Turn>,
    pub iterations: u32,
    pub steers: Vec<String>,
    pub next_tool: Option<ForkedTool>,
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
    let after_a_decision_for_people = matches!(
        machine.context.last(),
        Some(
            Turn::Decided(Decision::Reply { .. } | Decision::Ask { .. })
                | Turn::WaitResolved { .. }
        )
    );
    !after_a_decision_for_people && machine.unresolved.is_none() && machine.pending_wait().is_none()
}

impl Machine {
    /// Notes the checkpoint just published at `seq` if a fork may start from it: an
    /// allowed point whose next step is not an External call dispatched already.
    pub(super) fn note_fork_point(&mut self, seq: u64) {
        if self.present.function.is_some() {
            return; // Fork of a durable function is not built yet.
        }
        let next_effect = self.pending_tool.as_ref().map(|next| next.effect_id);
        let repeats_an_effect =
            next_effect.is_some_and(|effect_id| self.dispatched_externals.contains(&effect_id));
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
    pub(super) fn fork_point(&self, requested: Option<u64>) -> Result<u64, Refusal> {
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
    ForkState {
        context: machine.context.as_ref().clone(),
        iterations: machine.iterations,
        steers: machine.steers.clone(),
        next_tool: machine.present.pending_tool.map(|pending| ForkedTool {
            effect_id: fresh,
            tool: pending.tool,
            args: pending.args,
        }),
    }
}

impl Machine {
    /// The history of a `Forked` event: the child's context is the copied one.
    pub(super) fn record_forked(&mut self, state: &str) {
        match serde_json::from_str::<ForkState>(state) {
            Ok(state) => self.context = std::sync::Arc::new(state.context),
            // Written by `fork_state` and checksummed on disk: unreadable only if this build
            // cannot read what another wrote. The child then has no history to act on.
            Err(_) => self.text = "the fork's saved state is unreadable".into(),
        }
    }
}

impl Present {
    /// Folds a `Forked` event: the child resumes from the copied state.
    pub(super) fn apply_forked(&mut self, state: &str) {
        let Ok(state) = serde_json::from_str::<ForkState>(state) else {
            return;
        };
        self.iterations = state.iterations;
        self.steers = state.steers;
        self.pending_tool = state
            .next_tool
            .map(|next| PendingTool::new(next.effect_id, next.tool, next.args));
    }
}
