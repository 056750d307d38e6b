//! Rebuilding an execution's machine from the store: by replaying its events (`replay`,
//! `load`), or from its projection and the events after it (`project`, `load_projected`:
//! S-8, a cost that does not grow with its history). Recovery's and readers' way in; the
//! actions a replay folds are dropped.

use openprogram_storage::{EventStore, ExecutionHead, ExecutionId};

use crate::error::{Error, Result};
use crate::machine::projection::Projected;
use crate::machine::Machine;

/// Rebuilds an execution's machine from its events (recovery: actions are dropped).
pub fn load(store: &dyn EventStore, execution_id: ExecutionId) -> Result<(ExecutionHead, Machine)> {
    let head = store.head(execution_id)?.ok_or(Error::NotFound)?;
    let machine = replay(store, execution_id, u64::MAX)?;
    Ok((head, machine))
}

/// An execution's head and the machine a reader needs (S-8): rebuilt from its projection
/// and the events after it — a partial machine, at a cost that does not grow with its
/// history — or by a replay where it has no usable projection.
pub fn load_projected(
    store: &dyn EventStore,
    execution_id: ExecutionId,
) -> Result<(ExecutionHead, Machine)> {
    let head = store.head(execution_id)?.ok_or(Error::NotFound)?;
    let machine = project(store, execution_id, head.last_seq)?;
    Ok((head, machine))
}

/// The machine of an execution through `through_seq` (its head's `last_seq`): from its
/// projection if it has one it can use (see `load_projected`), else replayed.
pub fn project(
    store: &dyn EventStore,
    execution_id: ExecutionId,
    through_seq: u64,
) -> Result<Machine> {
    let record = match store.projection(execution_id) {
        Ok(record) => record,
        Err(error) => {
            // A cache of the log: the events say the same.
            tracing::warn!(%execution_id, %error, "projection unreadable; replaying");
            None
        }
    };
    let usable = record
        .filter(|record| record.through_seq > 0 && record.through_seq <= through_seq)
        .and_then(|record| Some((Projected::read(&record)?, record.through_seq)));
    let Some((projected, from_seq)) = usable else {
        return replay(store, execution_id, through_seq);
    };
    let mut ignored = Vec::new();
    let mut admitted = Machine::default();
    for envelope in store.events_after(execution_id, 0, 1)? {
        admitted.apply(&envelope.event, envelope.seq, &mut ignored);
    }
    let mut machine = projected.into_machine(admitted);
    let limit = usize::try_from(through_seq - from_seq).unwrap_or(usize::MAX);
    for envelope in store.events_after(execution_id, from_seq, limit)? {
        machine.apply(&envelope.event, envelope.seq, &mut ignored);
        ignored.clear();
    }
    debug_assert!(
        through_seq > PROJECTION_CHECKED_MAX
            || replay(store, execution_id, through_seq).is_ok_and(|whole| machine.reads_as(&whole)),
        "a projection and the events after it read as the whole history does"
    );
    Ok(machine)
}

/// Debug builds check every projected machine against a replay up to this many events.
const PROJECTION_CHECKED_MAX: u64 = 20_000;

/// Rebuilds an execution's machine from its events up to `through_seq` (a head's
/// `last_seq`: exactly the state that head describes), without reading the head again.
/// Seqs run gap-free from 1, so those are the first `through_seq` events.
pub fn replay(
    store: &dyn EventStore,
    execution_id: ExecutionId,
    through_seq: u64,
) -> Result<Machine> {
    let mut machine = Machine::default();
    let mut ignored = Vec::new();
    let limit = usize::try_from(through_seq).unwrap_or(usize::MAX);
    for envelope in store.events_after(execution_id, 0, limit)? {
        machine.apply(&envelope.event, envelope.seq, &mut ignored);
        ignored.clear();
    }
    Ok(machine)
}
