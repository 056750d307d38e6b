//! The committed state that is not yet written to its own keys.
//!
//! The hot path writes each group of transitions as log records only (one sled insert per
//! ~64 KiB of frames). Heads, event chunks and records are kept here and written to their
//! own keys every so often by a *materialization*, which coalesces many transitions of one
//! execution into one head write and one event-chunk write.
//!
//! Invariant: only the committer thread mutates the overlay, and only after the group that
//! produced the change is durable. Invariant: a materialization writes to sled first and
//! clears the overlay after, bumping `generation` under the write lock, so a reader that
//! reads the overlay, then sled, and sees the same generation before and after, saw a
//! consistent state (`Store::read_consistent`).

use std::collections::HashMap;

use crate::codec::{Frame, RecordValue};
use crate::event::EventEnvelope;
use crate::ids::ExecutionId;
use crate::keys;
use crate::records::{ExecutionHead, ExecutionState};

/// An execution changed since the last materialization.
#[derive(Debug, Clone)]
pub(crate) struct Dirty {
    pub head: ExecutionHead,
    /// The state under which the by-state index on disk lists this execution, if any.
    pub indexed_state: Option<ExecutionState>,
    /// Events committed since the last materialization, in seq order.
    pub events: Vec<EventEnvelope>,
}

pub(crate) type RecordKey = [u8; 17];

#[derive(Debug, Default)]
pub(crate) struct Overlay {
    pub execs: HashMap<ExecutionId, Dirty>,
    pub records: HashMap<RecordKey, RecordValue>,
}

impl Overlay {
    pub fn len(&self) -> usize {
        self.execs.len() + self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.execs.is_empty() && self.records.is_empty()
    }

    /// Adds a committed frame. `indexed_state` is asked only when the execution is not yet
    /// dirty: it is what the by-state index on disk says about it.
    pub fn merge(&mut self, frame: Frame, indexed_state: Option<ExecutionState>) {
        for record in frame.records {
            self.records.insert(record_key(&record), record);
        }
        let execution_id = frame.head.execution_id;
        match self.execs.get_mut(&execution_id) {
            Some(dirty) => {
                dirty.head = frame.head;
                dirty.events.extend(frame.events);
            }
            None => {
                self.execs.insert(
                    execution_id,
                    Dirty { head: frame.head, indexed_state, events: frame.events },
                );
            }
        }
    }
}

/// The sled key of a record.
pub(crate) fn record_key(record: &RecordValue) -> RecordKey {
    match record {
        RecordValue::Command(command) => keys::command(command.command_id),
        RecordValue::Receipt(receipt) => keys::receipt(receipt.effect_id),
        RecordValue::Wait(wait) => keys::wait(wait.wait_id),
        RecordValue::Process(process) => keys::process(process.process_id),
    }
}

/// The state the by-state index holds for a head: non-terminal states only.
pub(crate) fn index_state(head: &ExecutionHead) -> Option<ExecutionState> {
    (!head.state.is_terminal()).then_some(head.state)
}
