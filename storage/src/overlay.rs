//! The committed state that is not yet written to its own keys: a group commit writes log
//! records only; heads (with their newest frame refs, `head_record.rs`), event-index chunks
//! and records wait here until a *materialization* writes many transitions of an execution
//! as one head record write.
//!
//! New commits go to `active`. A materialization *freezes* it (as `frozen`, with the log
//! position it covers) and writes `frozen` a slice per group commit, so no group pays for
//! the whole overlay; the last slice's batch moves the materialization mark.
//!
//! Invariants: only the committer thread mutates the overlay, after the group that made the
//! change is durable. A slice is applied to sled before it leaves `frozen`, under the write
//! lock with `seqlock` bumped, so a reader that sees the same seqlock before and after
//! reading the overlay then sled saw a consistent state (`Store::read_consistent`). A partly
//! written materialization is harmless: the mark has not moved, the replay writes the same
//! heads and records again, and refs a head record already covers are not added again.

use std::borrow::Cow;
use std::collections::hash_map::Entry;

use foldhash::{HashMap, HashMapExt};

use crate::codec::{self, Frame, FrameRef, RecordValue};
use crate::error::{Error, Result};
use crate::event::EventEnvelope;
use crate::head_record::{self, HeadIndex};
use crate::ids::ExecutionId;
use crate::keys;
use crate::records::{ExecutionHead, ExecutionState};
use crate::writes::Writes;

/// An execution changed since it was last written to its own keys.
#[derive(Debug, Clone)]
pub(crate) struct Dirty {
    pub head: ExecutionHead,
    /// The state under which the by-state index on disk lists this execution, if any.
    pub indexed_state: Option<ExecutionState>,
    /// Where the events committed since are in the log (not the events: they are read from
    /// there), in seq order: what the event index gets.
    pub frame_refs: Vec<FrameRef>,
    /// The head record's index on disk before this entry is written (as an earlier entry
    /// being written will leave it), when known without a read; else read when written.
    pub base: Option<HeadIndex>,
}

pub(crate) type RecordKey = [u8; 17];

#[derive(Debug, Default)]
struct Layer {
    execs: HashMap<ExecutionId, Dirty>,
    records: HashMap<RecordKey, RecordValue>,
    /// How many of `records` each execution's purge removes (`RecordValue::purged_with`).
    owners: HashMap<ExecutionId, usize>,
}

impl Layer {
    fn len(&self) -> usize {
        self.execs.len() + self.records.len()
    }

    fn insert_record(&mut self, record: RecordValue) {
        let owner = record.purged_with();
        if self.records.insert(record_key(&record), record).is_none() {
            if let Some(owner) = owner {
                *self.owners.entry(owner).or_default() += 1;
            }
        }
    }

    fn remove_record(&mut self, key: &RecordKey) {
        let removed = self.records.remove(key);
        let Some(owner) = removed.and_then(|record| record.purged_with()) else {
            return;
        };
        if let Entry::Occupied(mut count) = self.owners.entry(owner) {
            *count.get_mut() -= 1;
            if *count.get() == 0 {
                count.remove();
            }
        }
    }
}

#[derive(Debug)]
pub(crate) struct Overlay {
    /// `Limits::head_frame_refs_max`.
    head_frame_refs_max: usize,
    active: Layer,
    frozen: Layer,
    /// The log position `frozen` covers: the mark written with its last slice.
    frozen_through: u64,
    /// How many entries `frozen` held when it was frozen.
    frozen_len_at_freeze: usize,
}

/// The part of `frozen` one group commit writes.
#[derive(Debug, Default)]
pub(crate) struct Slice {
    execs: Vec<ExecutionId>,
    records: Vec<RecordKey>,
    /// The head record index `write_slice` wrote for each execution it wrote.
    written: HashMap<ExecutionId, HeadIndex>,
}

impl Slice {
    pub fn is_empty(&self) -> bool {
        self.execs.is_empty() && self.records.is_empty()
    }
}

impl Overlay {
    pub fn new(head_frame_refs_max: usize) -> Self {
        Self {
            head_frame_refs_max,
            active: Layer::default(),
            frozen: Layer::default(),
            frozen_through: 0,
            frozen_len_at_freeze: 0,
        }
    }

    pub fn frozen_len_at_freeze(&self) -> usize {
        self.frozen_len_at_freeze
    }

    pub fn active_len(&self) -> usize {
        self.active.len()
    }

    pub fn is_materializing(&self) -> bool {
        self.frozen.len() > 0
    }

    /// The newest head of an execution held here, and what the by-state index on disk says
    /// about it.
    pub fn current(
        &self,
        execution_id: ExecutionId,
    ) -> Option<(&ExecutionHead, Option<ExecutionState>)> {
        let frozen = self.frozen.execs.get(&execution_id);
        let newest = self.active.execs.get(&execution_id).or(frozen)?;
        let indexed_state = frozen.map_or(newest.indexed_state, |dirty| dirty.indexed_state);
        Some((&newest.head, indexed_state))
    }

    /// Whether anything of the execution is held here: its head, or a record its purge
    /// removes.
    pub fn holds(&self, execution_id: ExecutionId) -> bool {
        [&self.active, &self.frozen].into_iter().any(|layer| {
            layer.execs.contains_key(&execution_id) || layer.owners.contains_key(&execution_id)
        })
    }

    /// The executions of a session held here (new ones are not on disk yet).
    pub fn in_session(&self, session_id: crate::ids::SessionId) -> Vec<ExecutionId> {
        let sessions = self.sessions().into_iter();
        sessions
            .filter_map(|(session, execution_id)| (session == session_id).then_some(execution_id))
            .collect()
    }

    /// Every (session, execution) held here.
    pub fn sessions(&self) -> Vec<(crate::ids::SessionId, ExecutionId)> {
        [&self.frozen, &self.active]
            .into_iter()
            .flat_map(|layer| layer.execs.iter())
            .map(|(execution_id, dirty)| (dirty.head.session_id, *execution_id))
            .collect()
    }

    /// The records held here that `pick` takes, by key, the newest version of each.
    pub fn records<T>(&self, pick: fn(&RecordValue) -> Option<T>) -> HashMap<RecordKey, T> {
        // Collected frozen first, so the active version of a record wins.
        [&self.frozen, &self.active]
            .into_iter()
            .flat_map(|layer| &layer.records)
            .filter_map(|(key, value)| Some((*key, pick(value)?)))
            .collect()
    }

    pub fn record(&self, key: &RecordKey) -> Option<&RecordValue> {
        self.active
            .records
            .get(key)
            .or_else(|| self.frozen.records.get(key))
    }

    /// Where the events held here with `seq > after_seq` are, oldest first.
    pub fn frame_refs_after(&self, execution_id: ExecutionId, after_seq: u64) -> Vec<FrameRef> {
        [&self.frozen, &self.active]
            .into_iter()
            .filter_map(|layer| layer.execs.get(&execution_id))
            .flat_map(|dirty| dirty.frame_refs.iter())
            .filter(|frame_ref| frame_ref.last_seq > after_seq)
            .copied()
            .collect()
    }

    /// Drops everything held about a quarantined execution, so that no materialization
    /// writes a partial state of it.
    pub fn forget(&mut self, execution_id: ExecutionId) {
        self.active.execs.remove(&execution_id);
        self.frozen.execs.remove(&execution_id);
    }

    /// Executions that are in `state` now but not listed so on disk, and those listed so on
    /// disk but no longer in it.
    pub fn state_changes(&self, state: ExecutionState) -> (Vec<ExecutionId>, Vec<ExecutionId>) {
        let (mut added, mut removed) = (Vec::new(), Vec::new());
        let active = self.active.execs.keys();
        let ids = active.filter(|id| !self.frozen.execs.contains_key(id));
        for execution_id in self.frozen.execs.keys().chain(ids) {
            match self.current(*execution_id) {
                Some((head, _)) if head.state == state => added.push(*execution_id),
                Some((_, indexed)) if indexed == Some(state) => removed.push(*execution_id),
                _ => {}
            }
        }
        (added, removed)
    }

    /// Adds a committed frame, stored in the log record keyed `record`. `indexed_state` and
    /// `disk_index` are used only when the execution is not yet in `active`: what the by-state
    /// index on disk says about it, and its head record's index on disk if the caller read it
    /// (a new execution's is empty). Returns the frame's events, which the overlay does not
    /// keep.
    pub fn merge(
        &mut self,
        frame: Frame,
        record: u64,
        indexed_state: Option<ExecutionState>,
        disk_index: Option<HeadIndex>,
    ) -> Vec<EventEnvelope> {
        for record in frame.records {
            self.active.insert_record(record);
        }
        let frame_ref = FrameRef {
            first_seq: frame.events.first().map_or(0, |event| event.seq),
            last_seq: frame.head.last_seq,
            record,
        };
        match self.active.execs.entry(frame.head.execution_id) {
            Entry::Occupied(mut entry) => {
                let dirty = entry.get_mut();
                dirty.head = frame.head;
                dirty.frame_refs.push(frame_ref);
            }
            Entry::Vacant(entry) => {
                // A frozen entry still to be written decides what the index on disk becomes:
                // `finish_slice` hands this entry the index it wrote (and `write_all` uses
                // what it leaves), so it is not worked out here a second time.
                let base = disk_index.filter(|_| !self.frozen.execs.contains_key(entry.key()));
                entry.insert(Dirty {
                    head: frame.head,
                    indexed_state,
                    frame_refs: vec![frame_ref],
                    base,
                });
            }
        }
        frame.events
    }

    /// Starts a materialization of everything in `active`, covering the log through
    /// `through`. Invariant: the previous one is finished.
    pub fn freeze(&mut self, through: u64) {
        assert!(
            !self.is_materializing(),
            "a materialization is already running"
        );
        self.frozen = std::mem::take(&mut self.active);
        self.frozen_through = through;
        self.frozen_len_at_freeze = self.frozen.len();
    }

    /// Picks up to `len_max` entries of `frozen` to write next.
    pub fn slice(&self, len_max: usize) -> Slice {
        let execs: Vec<ExecutionId> = self.frozen.execs.keys().take(len_max).copied().collect();
        let budget = len_max.saturating_sub(execs.len());
        let records = self.frozen.records.keys().take(budget).copied().collect();
        Slice {
            written: HashMap::with_capacity(execs.len()),
            execs,
            records,
        }
    }

    /// Adds the slice's writes to `batch`, and the mark if the slice finishes `frozen`.
    /// `on_disk` reads a head record's index that an entry does not know (`Dirty::base`).
    pub fn write_slice(
        &self,
        slice: &mut Slice,
        batch: &mut Writes,
        on_disk: &OnDisk<'_>,
    ) -> Result<()> {
        for execution_id in &slice.execs {
            if let Some(written) = self.write_frozen(*execution_id, batch, on_disk)? {
                slice.written.insert(*execution_id, written);
            }
        }
        for key in &slice.records {
            if let Some(record) = self.frozen.records.get(key) {
                put_record(batch, key, record);
            }
        }
        if slice.execs.len() + slice.records.len() == self.frozen.len() {
            write_mark(batch, self.frozen_through);
        }
        Ok(())
    }

    /// The slice is applied to sled: drop it from `frozen`, and tell `active` entries of the same
    /// executions what the by-state index and the head record on disk say now. Returns that
    /// for every execution written, for the entries the caller merges next.
    pub fn finish_slice(&mut self, mut slice: Slice) -> HashMap<ExecutionId, OnDiskNow> {
        let mut indexed = HashMap::with_capacity(slice.execs.len());
        for execution_id in slice.execs {
            if let Some(written) = self.frozen.execs.remove(&execution_id) {
                let now = index_state(&written.head);
                let index = slice.written.remove(&execution_id);
                if let Some(newer) = self.active.execs.get_mut(&execution_id) {
                    // Created since the freeze, so without a base of its own (`merge`).
                    newer.indexed_state = now;
                    newer.base = index.clone();
                }
                indexed.insert(execution_id, (now, index));
            }
        }
        for key in slice.records {
            self.frozen.remove_record(&key);
        }
        indexed
    }

    /// Adds everything held here to `batch`, with the mark at `through` (the last
    /// materialization, when the store closes).
    pub fn write_all(&self, batch: &mut Writes, through: u64, on_disk: &OnDisk<'_>) -> Result<()> {
        let refs_max = self.head_frame_refs_max;
        // What the frozen writes leave: the batch is not applied yet, so disk does not say.
        let mut left = HashMap::new();
        for execution_id in self.frozen.execs.keys() {
            if let Some(written) = self.write_frozen(*execution_id, batch, on_disk)? {
                left.insert(*execution_id, written);
            }
        }
        for (key, record) in &self.frozen.records {
            put_record(batch, key, record);
        }
        for (execution_id, dirty) in &self.active.execs {
            // Later writes of the same key in one batch win: the active head replaces the
            // frozen one, and the index moves on from where the frozen write left it.
            let frozen = self.frozen.execs.get(execution_id);
            let indexed_state =
                frozen.map_or(dirty.indexed_state, |frozen| index_state(&frozen.head));
            let base = match left.remove(execution_id) {
                Some(base) => Some(Cow::Owned(base)),
                None => resolve_base(dirty, *execution_id, on_disk, batch)?,
            };
            if let Some(base) = base {
                write_dirty(batch, *execution_id, dirty, indexed_state, &base, refs_max);
            }
        }
        for (key, record) in &self.active.records {
            put_record(batch, key, record);
        }
        write_mark(batch, through);
        Ok(())
    }

    /// Adds the write of an execution's frozen entry to `batch`; returns the head record
    /// index it writes, `None` if there is no such entry or its head record on disk is
    /// corrupted (`resolve_base`).
    fn write_frozen(
        &self,
        execution_id: ExecutionId,
        batch: &mut Writes,
        on_disk: &OnDisk<'_>,
    ) -> Result<Option<HeadIndex>> {
        let Some(dirty) = self.frozen.execs.get(&execution_id) else {
            return Ok(None);
        };
        let Some(base) = resolve_base(dirty, execution_id, on_disk, batch)? else {
            return Ok(None);
        };
        let indexed = dirty.indexed_state;
        let refs_max = self.head_frame_refs_max;
        let written = write_dirty(batch, execution_id, dirty, indexed, &base, refs_max);
        Ok(Some(written))
    }
}

/// Reads the index of an execution's head record on disk (`None`: no head there).
pub(crate) type OnDisk<'a> = dyn Fn(ExecutionId) -> Result<Option<HeadIndex>> + 'a;

/// What a slice's write left on disk for an execution: its by-state index state, and its
/// head record's index (`None` if it was not written: its head record is corrupted).
pub(crate) type OnDiskNow = (Option<ExecutionState>, Option<HeadIndex>);

/// The index an entry's write starts from: known, else read. A head record on disk that
/// fails its checksum quarantines the execution (the read did) and is left as it is: its
/// entry is not written, and the quarantine is written in the same batch, so the next open
/// refuses the execution too instead of reading a history whose index was never written.
fn resolve_base<'a>(
    dirty: &'a Dirty,
    execution_id: ExecutionId,
    on_disk: &OnDisk<'_>,
    batch: &mut Writes,
) -> Result<Option<Cow<'a, HeadIndex>>> {
    if let Some(base) = &dirty.base {
        return Ok(Some(Cow::Borrowed(base)));
    }
    match on_disk(execution_id) {
        Ok(index) => Ok(Some(Cow::Owned(index.unwrap_or_default()))),
        Err(error @ Error::Corrupted { .. }) => {
            batch.insert(
                &keys::quarantine(execution_id)[..],
                codec::encode(&error.to_string()),
            );
            Ok(None)
        }
        Err(error) => Err(error),
    }
}

/// The index a write of `refs` over `base` leaves, and the chunk it writes. A ref the base
/// covers already (a replay after a materialization that was cut short wrote it) is not
/// added twice.
fn written_index(
    base: &HeadIndex,
    refs: &[FrameRef],
    refs_max: usize,
) -> (HeadIndex, Option<Vec<FrameRef>>) {
    let covered = base.covered_through();
    let new = refs
        .iter()
        .position(|frame_ref| frame_ref.last_seq > covered);
    base.extended(new.map_or(&[][..], |first| &refs[first..]), refs_max)
}

/// Writes one execution's head record over `base` (with the newest frame refs, or an index
/// chunk when they outgrow the head) and its by-state index change. Returns the index
/// written.
fn write_dirty(
    batch: &mut Writes,
    execution_id: ExecutionId,
    dirty: &Dirty,
    indexed_on_disk: Option<ExecutionState>,
    base: &HeadIndex,
    refs_max: usize,
) -> HeadIndex {
    let (index, chunk) = written_index(base, &dirty.frame_refs, refs_max);
    batch.insert(
        &keys::head(execution_id)[..],
        head_record::encode(&dirty.head, &index),
    );
    if let Some(chunk) = chunk.filter(|chunk| !chunk.is_empty()) {
        batch.insert(
            &keys::events(execution_id, chunk[0].first_seq)[..],
            codec::encode(&chunk),
        );
    }
    if let Some(first) = dirty.frame_refs.first() {
        if first.first_seq == 1 {
            // The frame that created the execution: list it under its session, once.
            let key = keys::by_session(dirty.head.session_id, execution_id);
            batch.insert(&key[..], &[]);
        }
    }
    if dirty.head.state.is_terminal() {
        // S-8: listed by when it ended, for retention (again if it moves on: a purge of it
        // removes the entry it finds, and a stale one names a purged execution).
        let key = keys::ended(dirty.head.last_activity_ms, execution_id);
        batch.insert(&key[..], &[]);
    }
    let now_indexed = index_state(&dirty.head);
    if indexed_on_disk != now_indexed {
        if let Some(old) = indexed_on_disk {
            batch.remove(&keys::by_state(old, execution_id)[..]);
        }
        if let Some(new) = now_indexed {
            batch.insert(&keys::by_state(new, execution_id)[..], &[]);
        }
    }
    index
}

fn write_mark(batch: &mut Writes, through: u64) {
    batch.insert(
        keys::meta(keys::META_MATERIALIZED_THROUGH),
        codec::encode(&through),
    );
}

/// Writes a record to its key and, for a record an execution owns (a command, receipt, wait
/// or process), lists it under that execution (S-8: a purge finds what to remove there).
pub(crate) fn put_record(batch: &mut Writes, key: &RecordKey, record: &RecordValue) {
    batch.insert(&key[..], codec::encode(record));
    if let Some(owner) = record.owner() {
        batch.insert(&keys::owned(owner, key)[..], &[]);
    }
}

/// The sled key of a record.
pub(crate) fn record_key(record: &RecordValue) -> RecordKey {
    match record {
        RecordValue::Command(command) => keys::command(command.command_id),
        RecordValue::Receipt(receipt) => keys::receipt(receipt.effect_id),
        RecordValue::Wait(wait) => keys::wait(wait.wait_id),
        RecordValue::Process(process) => keys::process(process.process_id),
        RecordValue::Job(job) => keys::job(job.job_id),
        RecordValue::Projection(projection) => keys::projection(projection.execution_id),
        RecordValue::Session(session) => keys::session(session.session_id),
        RecordValue::Policy(policy) => keys::policy(policy.execution_id),
    }
}

/// The state the by-state index holds for a head: non-terminal states only.
pub(crate) fn index_state(head: &ExecutionHead) -> Option<ExecutionState> {
    (!head.state.is_terminal()).then_some(head.state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Event;
    use crate::ids::{RunId, SessionId};
    use crate::records::ExecutionKind;

    /// A frame of an execution (its event `seq`, logged at position 1), merged as the
    /// committer merges one whose head record index it did not read (`disk_index: None`):
    /// the index is read when it is written.
    fn overlay_with_one_unread_entry(seq: u64) -> (Overlay, ExecutionId) {
        let execution_id = ExecutionId::new();
        let mut head = ExecutionHead::new(
            execution_id,
            SessionId::new(),
            RunId::new(),
            ExecutionKind::AgentTurn,
        );
        head.last_seq = seq;
        let event = EventEnvelope {
            execution_id,
            seq,
            position: 1,
            at_ms: 0,
            writer_epoch: 0,
            event: Event::StateChanged {
                state: ExecutionState::Running,
                reason: "test".into(),
            },
        };
        let frame = Frame {
            head,
            events: vec![event],
            records: Vec::new(),
        };
        let mut overlay = Overlay::new(16);
        overlay.merge(frame, 1, None, None);
        overlay.freeze(1);
        (overlay, execution_id)
    }

    /// S-8: a purge waits for everything of its execution in memory, its head and the
    /// records it owns, which a materialization may write in a later slice than the head.
    #[test]
    fn s8_an_execution_is_held_until_its_records_are_written_too() {
        let (mut overlay, execution_id) = overlay_with_one_unread_entry(1);
        let command = crate::records::CommandRecord {
            command_id: crate::ids::CommandId::new(),
            execution_id,
            kind: "pause".into(),
            payload_hash: [0; 32],
            status: crate::records::CommandStatus::Rejected,
            reason: None,
            reason_code: None,
            result_version: None,
            child_execution_id: None,
            accepted_at_ms: 0,
        };
        overlay.active.insert_record(RecordValue::Command(command));
        overlay
            .frozen
            .records
            .extend(overlay.active.records.drain());
        overlay.frozen.owners.extend(overlay.active.owners.drain());
        let other = ExecutionId::new();
        assert!(overlay.holds(execution_id) && !overlay.holds(other));
        // The head's slice first: the head is written, the record is not.
        let head_only = overlay.slice(1);
        assert!(head_only.records.is_empty());
        overlay.finish_slice(head_only);
        assert!(overlay.current(execution_id).is_none());
        assert!(
            overlay.holds(execution_id),
            "its record is still to be written"
        );
        let records = overlay.slice(1);
        overlay.finish_slice(records);
        assert!(!overlay.holds(execution_id));
    }

    /// `batch` applied to a new sled database (kept alive by the returned directory).
    fn applied(batch: Writes) -> (tempfile::TempDir, sled::Db) {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::open(dir.path()).expect("sled");
        db.apply_batch(crate::writes::batch_of(&batch.into_ops()))
            .expect("apply");
        (dir, db)
    }

    #[test]
    fn s4_a_head_record_a_materialization_finds_corrupted_is_left_and_its_quarantine_written() {
        let (overlay, execution_id) = overlay_with_one_unread_entry(1);
        let corrupted = |_| {
            Err(Error::Corrupted {
                tree: "heads",
                key: "03…".into(),
            })
        };
        let mut slice = overlay.slice(usize::MAX);
        let mut batch = Writes::default();
        overlay
            .write_slice(&mut slice, &mut batch, &corrupted)
            .expect("the slice is written without it");
        let (_dir, db) = applied(batch);
        assert_eq!(db.get(keys::head(execution_id)).expect("get"), None);
        let quarantine = db
            .get(keys::quarantine(execution_id))
            .expect("get")
            .expect("the quarantine is written with the slice");
        let reason: String =
            codec::decode(&keys::quarantine(execution_id), &quarantine).expect("decode");
        assert!(reason.contains("heads"), "{reason}");
        // The slice still finishes the materialization: the mark moves.
        let mark = keys::meta(keys::META_MATERIALIZED_THROUGH);
        let mark = db
            .get(&mark)
            .expect("get")
            .map(|bytes| codec::decode::<u64>(&mark, &bytes));
        assert_eq!(mark.map(|decoded| decoded.expect("mark")), Some(1));
    }

    #[test]
    fn r13_a_head_record_a_materialization_cannot_read_fails_the_slice() {
        let (overlay, _) = overlay_with_one_unread_entry(1);
        let unreadable = |_| {
            Err(Error::Io {
                path: "db".into(),
                message: "test: read failed".into(),
            })
        };
        let mut slice = overlay.slice(usize::MAX);
        let mut batch = Writes::default();
        let written = overlay.write_slice(&mut slice, &mut batch, &unreadable);
        assert!(matches!(written, Err(Error::Io { .. })), "{written:?}");
    }

    #[test]
    fn s1_an_entry_whose_index_was_not_read_is_written_over_the_one_on_disk() {
        // Disk lists the execution's first frame; the entry brings its second.
        let (overlay, execution_id) = overlay_with_one_unread_entry(2);
        let first = FrameRef {
            first_seq: 1,
            last_seq: 1,
            record: 0,
        };
        let on_disk = |_| {
            Ok(Some(HeadIndex {
                chunked_through: 0,
                tail: vec![first],
            }))
        };
        let mut slice = overlay.slice(usize::MAX);
        let mut batch = Writes::default();
        overlay
            .write_slice(&mut slice, &mut batch, &on_disk)
            .expect("written");
        let (_dir, db) = applied(batch);
        let key = keys::head(execution_id);
        let bytes = db.get(key).expect("get").expect("the head record");
        let (_, index) = head_record::decode(&key, &bytes).expect("decode");
        let second = FrameRef {
            first_seq: 2,
            last_seq: 2,
            record: 1,
        };
        assert_eq!(index.tail, vec![first, second]);
    }
}
