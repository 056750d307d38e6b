//! Fork (K-2), pure: which saved points of an execution a fork may start from, and the state
//! a child resumes from. The child gets a copy of that state in its own `Forked` event, so
//! the original's history never changes and the child never reads it again.

use openprogram_storage::{EffectId, Event, EventEnvelope};
use serde::{Deserialize, Serialize};

use crate::execution::machine::{Decision, Machine, PendingTool, Recovery, ToolArgs, Turn};

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

/// The checkpoint seq to fork from: `requested` if it is an allowed saved point of these
/// events, else the latest allowed one when none is requested. `Err` says why not.
///
/// A point whose next step is an External tool call the original dispatched (or may have:
/// it has any receipt) is never allowed: the child would run that effect a second time.
pub fn fork_point(
    events: &[EventEnvelope],
    requested: Option<u64>,
    recovery: impl Fn(&str) -> Recovery,
) -> Result<u64, String> {
    let dispatched: std::collections::HashSet<EffectId> = events
        .iter()
        .filter_map(|envelope| match &envelope.event {
            Event::ToolDispatched { effect_id, .. } | Event::ToolFinished { effect_id, .. } => {
                Some(*effect_id)
            }
            _ => None,
        })
        .collect();
    let mut machine = Machine::default();
    let mut ignored = Vec::new();
    let mut latest = None;
    for envelope in events {
        machine.apply(&envelope.event, envelope.seq, &mut ignored);
        ignored.clear();
        if !matches!(envelope.event, Event::CheckpointPublished { .. }) {
            continue;
        }
        let repeats_an_effect = machine.pending_tool.as_ref().is_some_and(|next| {
            recovery(&next.tool) == Recovery::External && dispatched.contains(&next.effect_id)
        });
        let ok = allowed(&machine) && !repeats_an_effect;
        if requested == Some(envelope.seq) {
            return if ok {
                Ok(envelope.seq)
            } else {
                Err(format!(
                    "checkpoint {} is not a saved point a fork may start from",
                    envelope.seq
                ))
            };
        }
        if ok {
            latest = Some(envelope.seq);
        }
    }
    match requested {
        Some(seq) => Err(format!("this execution has no checkpoint {seq}")),
        None => latest.ok_or_else(|| "this execution has no saved point to fork from".into()),
    }
}

/// The state at `checkpoint_seq` (as found by `fork_point`), with `fresh` as the effect id
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
        next_tool: machine.pending_tool.map(|pending| ForkedTool {
            effect_id: fresh,
            tool: pending.tool,
            args: pending.args,
        }),
    }
}

impl Machine {
    /// Folds a `Forked` event: the child resumes from the copied state.
    pub(super) fn apply_forked(&mut self, state: &str) {
        let Ok(state) = serde_json::from_str::<ForkState>(state) else {
            // Written by `fork_state` and checksummed on disk: unreadable only if this build
            // cannot read what another wrote. The child then has no history to act on.
            self.text = "the fork's saved state is unreadable".into();
            return;
        };
        self.context = std::sync::Arc::new(state.context);
        self.iterations = state.iterations;
        self.steers = state.steers;
        self.pending_tool = state
            .next_tool
            .map(|next| PendingTool::new(next.effect_id, next.tool, next.args));
    }
}
