//! S-8, pure: an execution's projection (what a reader needs of its machine as of a seq)
//! and the partial machine rebuilt from it, so a read folds only the events after it. The
//! plan writes one every `EVERY_EVENTS` seqs, keeping the newest `KEPT` items of each
//! history; it is a cache: one too large or undecodable is left out and events replayed.
//! A partial machine decides every command but Fork and Retry, and runs nothing until the
//! actor replays the whole history (`ExecutionActor::complete_history`).

use openprogram_storage::{EffectId, ExecutionId, ProjectionRecord};
use serde::{Deserialize, Serialize};

use super::{
    CompletedStep, Decision, Dropped, ForkPoint, Machine, Present, Receipt, Turn, WaitState,
};

/// The encoding of `Projected` in `ProjectionRecord::state`: JSON (a tool call's arguments
/// are JSON text, kept as they are). A projection of another format is ignored: readers
/// replay until the next one is written.
pub const FORMAT: u32 = 4;

/// A transition whose events cross a multiple of this many seqs writes a projection.
pub const EVERY_EVENTS: u64 = 128;

/// How many of the newest receipts, ended waits and completed steps a projection keeps — and a snapshot shows.
pub const KEPT: usize = 20;

/// The stored state of a projection (`FORMAT` 4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Projected {
    present: Present,
    text: String,
    /// The context's last turn, as much as the fork rule reads of it: whether it is a
    /// decision for people (`fork::for_people`); `None` for an empty context.
    last_turn_for_people: Option<bool>,
    receipts: Vec<Receipt>,
    ended_waits: Vec<WaitState>,
    completed_steps: Vec<CompletedStep>,
    /// The fork points whose next step is the pending call (any other is in
    /// `dropped.fork_points`).
    fork_points: Vec<ForkPoint>,
    /// The pending tool's effect, if it was dispatched: the only dispatched effect a later
    /// fork point's rule can ask about (a point's next step is the pending call).
    dispatched_pending: Option<EffectId>,
    /// The effects in doubt (`unresolved`, and the queue of a function's), if dispatched: one
    /// reconciled `NotApplied` becomes the pending call again, same effect id, and a fork
    /// point before it must still know it was dispatched.
    dispatched_unresolved: Vec<EffectId>,
    /// W-7: the newest tool calls that ran on an approval or grant, with it.
    #[serde(default)]
    relied_on: Vec<(EffectId, openprogram_storage::WaitId)>,
    dropped: Dropped,
}

fn newest<T: Clone>(items: &[T]) -> (&[T], u64) {
    let left_out = items.len().saturating_sub(KEPT);
    (&items[left_out..], left_out as u64)
}

impl Projected {
    /// The projection of `machine` (complete or partial).
    pub fn of(machine: &Machine) -> Self {
        let before = machine.partial.unwrap_or_default();
        let receipts: Vec<Receipt> = machine.receipts.iter().cloned().collect();
        let (receipts, receipts_out) = newest(&receipts);
        let (ended_waits, waits_out) = newest(&machine.ended_waits);
        let (completed_steps, steps_out) = newest(&machine.completed_steps);
        // What a snapshot shows of a step, not its result: a function's run reads results
        // from the whole history.
        let completed_steps = completed_steps
            .iter()
            .map(|step| CompletedStep {
                output: String::new(),
                ..step.clone()
            })
            .collect::<Vec<_>>();
        // Only a point whose next step is the pending call can be taken back (when that call
        // is dispatched, `ToolDispatched`); every other one is kept for good, and counted.
        let calls = &machine.present.calls;
        let pending = calls.pending_effect();
        let (fork_points, settled): (Vec<ForkPoint>, Vec<ForkPoint>) = machine
            .fork_points
            .iter()
            .partition(|point| point.next_effect.is_some() && point.next_effect == pending);
        let points_out = settled.len() as u64;
        let dispatched_pending =
            pending.filter(|effect_id| machine.dispatched_externals.contains(effect_id));
        let dispatched_unresolved = calls
            .unresolved
            .iter()
            .chain(&calls.unresolved_queue)
            .map(|unresolved| unresolved.effect_id)
            .filter(|effect_id| machine.dispatched_externals.contains(effect_id))
            .collect();
        let last_step = super::fork::last_step(&machine.context);
        Self {
            present: machine.present.clone(),
            text: machine.text.clone(),
            last_turn_for_people: last_step.map(super::fork::for_people),
            receipts: receipts.to_vec(),
            ended_waits: ended_waits.to_vec(),
            completed_steps,
            fork_points,
            dispatched_pending,
            dispatched_unresolved,
            relied_on: newest(&machine.relied_on).0.to_vec(),
            dropped: Dropped {
                receipts: before.receipts + receipts_out,
                ended_waits: before.ended_waits + waits_out,
                completed_steps: before.completed_steps + steps_out,
                fork_points: before.fork_points + points_out,
                // A partial machine keeps a stand-in for the last step, if there is one.
                context: (before.context + machine.context.len() as u64)
                    .saturating_sub(u64::from(last_step.is_some())),
            },
        }
    }

    /// The record of `machine`'s projection, as of `through_seq`.
    pub fn record(
        machine: &Machine,
        execution_id: ExecutionId,
        through_seq: u64,
    ) -> ProjectionRecord {
        let state = serde_json::to_vec(&Self::of(machine)).unwrap_or_default();
        ProjectionRecord {
            execution_id,
            through_seq,
            format: FORMAT,
            state,
        }
    }

    /// Reads a stored projection; `None` if it is of another format or does not decode.
    pub fn read(record: &ProjectionRecord) -> Option<Self> {
        if record.format != FORMAT {
            return None;
        }
        serde_json::from_slice(&record.state).ok()
    }

    /// The partial machine this projection describes. `admitted` is a machine that folded
    /// the execution's first event (the admission, with its input).
    pub fn into_machine(self, admitted: Machine) -> Machine {
        let mut machine = Machine::default();
        let input = admitted.present.turn.input;
        machine.present = self.present;
        machine.present.turn.input = input;
        machine.text = self.text;
        // A turn of the same kind stands for the last one (what the fork rule reads).
        let last_turn = self
            .last_turn_for_people
            .map(|for_people| match for_people {
                true => Turn::Decided(Decision::reply(String::new())),
                false => Turn::ToolResult {
                    tool: String::new(),
                    status: openprogram_storage::ReceiptStatus::Confirmed,
                    output: String::new(),
                },
            });
        machine.context = std::sync::Arc::new(last_turn.into_iter().collect());
        for receipt in self.receipts {
            machine.receipts.restore(receipt);
        }
        machine.ended_waits = self.ended_waits;
        machine.completed_steps = self.completed_steps;
        machine.fork_points = self.fork_points;
        machine.dispatched_externals = self
            .dispatched_pending
            .into_iter()
            .chain(self.dispatched_unresolved)
            .collect();
        machine.relied_on = self.relied_on;
        machine.partial = Some(self.dropped);
        machine
    }
}

/// Whether a transition appending `events` events after `last_seq` writes a projection.
pub fn due(last_seq: u64, events: usize) -> bool {
    (last_seq + events as u64) / EVERY_EVENTS > last_seq / EVERY_EVENTS
}

impl Machine {
    /// Whether the whole history is here (a replay of every event), not a projection's part.
    pub fn is_complete(&self) -> bool {
        self.partial.is_none()
    }

    /// K-2: whether a fork may start somewhere (a partial machine counts the points it left
    /// out).
    pub fn has_fork_point(&self) -> bool {
        !self.fork_points.is_empty() || self.partial.is_some_and(|dropped| dropped.fork_points > 0)
    }

    /// How many receipts, ended waits and completed steps the execution has in all.
    pub fn totals(&self) -> (u64, u64, u64) {
        let dropped = self.partial.unwrap_or_default();
        (
            dropped.receipts + self.receipts.iter().count() as u64,
            dropped.ended_waits + self.ended_waits.len() as u64,
            dropped.completed_steps + self.completed_steps.len() as u64,
        )
    }

    /// Whether this machine, complete or partial, reads as `complete` does: the same present
    /// and the same projection (what any reader is shown).
    pub fn reads_as(&self, complete: &Machine) -> bool {
        self.present == complete.present && Projected::of(self) == Projected::of(complete)
    }
}
