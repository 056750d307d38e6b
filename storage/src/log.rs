//! The committer: the one thread that writes to the store (S-2, S-3).
//!
//! Callers submit transitions through a bounded queue (`Limits::queue_len_max`). The
//! committer takes everything queued, up to `Limits::batch_len_max`, validates each
//! transition against its own view (it is the only writer, so the view is consistent),
//! writes the whole group as one sled `Batch`, calls `flush()` **and then fsyncs sled's data
//! file itself** — sled 0.34.7's `flush()` ends in `sync_file_range`, which does not make
//! data durable — and only then answers each caller.
//!
//! Why one log record per ~16 KiB of frames, not a record per event and a record per head:
//! sled tops out near 100–180k inserts/s on two cores however it is batched, and a step is
//! two transitions. Heads, events and records are written to their own keys later, many
//! transitions at once (`overlay.rs`).
//!
//! Invariant: nothing is answered before the group that carries it is fsynced; a failed
//! write, flush or fsync answers every waiter with `FailStop` and the store takes no more
//! writes until it is reopened (fail-stop: after a failed fsync the page cache cannot be
//! trusted to say what is on disk).
//! This module does not read on behalf of callers; see `store.rs`.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::File;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use foldhash::{HashMap, HashMapExt};
use tokio::sync::{mpsc, oneshot};

mod apply;
mod purge;

use crate::acknowledged::Acknowledged;
use crate::codec::{
    encode_frame_into, inputs_to_blob, Frame, HeadIdentity, LogRecordWriter, RecordValue,
    LOG_RECORD_BYTES_MAX,
};
use crate::error::{Error, Result};
use crate::event::{Event, EventEnvelope};
use crate::head_record::HeadIndex;
use crate::ids::{CommandId, ExecutionId};
use crate::keys;
use crate::overlay::{index_state, Overlay, Slice};
use crate::records::{CommandRecord, ExecutionHead, ExecutionState, PurgeStep, SweepStep};
use crate::shared::{add_elapsed_micros, Shared};
use crate::transition::{Committed, Outcome, Transition, Upsert};

/// What waits in the committer's queue.
// Nearly every request is a transition; boxing it would cost an allocation per transition
// to make the rare `Tick` smaller.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum Request {
    /// A transition, with where to send its answer.
    Transition {
        transition: Transition,
        reply: oneshot::Sender<Result<Outcome>>,
    },
    /// Time passed: lets an idle store finish (or start) a materialization, so the overlay
    /// drains without waiting for the next commit. Sent by the ticker thread.
    Tick,
    /// S-8: one step of an execution's purge (`purge.rs`).
    Purge {
        execution_id: ExecutionId,
        ended_key: Option<u64>,
        ended_before: Option<u64>,
        reply: oneshot::Sender<Result<PurgeStep>>,
    },
    /// S-8: one step of the log's sweep (`purge.rs`).
    Sweep {
        from_position: u64,
        max_records: usize,
        reply: oneshot::Sender<Result<SweepStep>>,
    },
    /// Issue 37: a conversation record's compare-and-swap.
    Conversation {
        write: crate::conversation::ConversationWrite,
        reply: oneshot::Sender<Result<crate::conversation::ConversationOutcome>>,
    },
}

/// A materialization is written in at most this many slices (see `Committer::next_slice`).
const MATERIALIZE_SLICES_TARGET: usize = 32;

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as u64)
        .unwrap_or(0)
}

/// The committer's loop. Returns when every sender is gone, after a last materialization.
///
/// It first writes the log tail the open replayed to its own keys and moves the mark, then
/// tells `ready`: a run killed before its first materialization must not leave the next open
/// a longer tail to replay (S-6), or repeated crashes would grow it without bound.
pub(crate) fn run(
    shared: Arc<Shared>,
    mut queue: mpsc::Receiver<Request>,
    data_file: File,
    acknowledged: Acknowledged,
    ready: std::sync::mpsc::Sender<Result<()>>,
) {
    let mut committer = Committer {
        shared,
        data_file,
        acknowledged,
        synced_sled_blobs: HashSet::new(),
        last_materialization: Instant::now(),
        frame_bytes: Vec::new(),
    };
    let replayed = {
        let overlay = committer.shared.overlay_read();
        overlay.active_len() > 0 || overlay.is_materializing()
    };
    let materialized = if replayed {
        committer.materialize_all()
    } else {
        Ok(())
    };
    let failed = materialized.is_err();
    if ready.send(materialized).is_err() || failed {
        return;
    }
    while let Some(first) = queue.blocking_recv() {
        let started = Instant::now();
        // Sized for what is queued now: grown one push at a time, the group's requests
        // (~0.5 KiB each) were copied over and over.
        let mut requests =
            Vec::with_capacity((queue.len() + 1).min(committer.shared.limits.batch_len_max));
        requests.push(first);
        while requests.len() < committer.shared.limits.batch_len_max {
            match queue.try_recv() {
                Ok(request) => requests.push(request),
                Err(_) => break,
            }
        }
        committer.commit_group(requests);
        add_elapsed_micros(&committer.shared.metrics.group_micros_total, started);
    }
    if committer.shared.failure().is_none() {
        if let Err(error) = committer.materialize_all() {
            tracing::error!(%error, "final materialization failed; the log will be replayed at next open");
        }
    }
}

struct Committer {
    shared: Arc<Shared>,
    data_file: File,
    /// S-7: the highest position acknowledged, kept apart from sled's files.
    acknowledged: Acknowledged,
    /// Files sled wrote under `blobs/` that we have fsynced already.
    synced_sled_blobs: HashSet<OsString>,
    last_materialization: Instant,
    /// The frame encoding buffer, kept between groups (see `Group::frame_bytes`).
    frame_bytes: Vec<u8>,
}

/// What one group changes, before it is durable.
#[derive(Default)]
struct Group {
    /// The index in `frames` of each execution's newest frame in this group.
    heads: HashMap<ExecutionId, usize>,
    commands: HashMap<CommandId, CommandRecord>,
    /// Session records as this group's transitions left them (issue 37).
    sessions: HashMap<crate::ids::SessionId, crate::records::SessionRecord>,
    /// Conversation records as this group's writes left them (issue 37).
    conversations: HashMap<crate::ids::SessionId, crate::conversation::ConversationRecord>,
    /// Committed frames, with what they are merged into the overlay with.
    frames: Vec<GroupFrame>,
    log_records: Vec<(u64, Vec<u8>)>,
    writer: Option<(u64, LogRecordWriter)>,
    next_position: u64,
    /// Each frame is encoded here, then copied into its log record (the committer's buffer,
    /// lent to the group).
    frame_bytes: Vec<u8>,
    /// Executions a purge step of this group touched: no transition of theirs commits.
    purged: std::collections::HashSet<ExecutionId>,
    /// Executions whose rejection records this group writes: no purge step of theirs runs.
    recorded: std::collections::HashSet<ExecutionId>,
}

/// A committed frame of the group, merged into the overlay once the group is durable.
struct GroupFrame {
    frame: Frame,
    /// The key of the log record holding it.
    record: u64,
    /// What disk says of the execution (for the overlay's new entry): its by-state index
    /// state, and its head record's index if the transition read it from disk.
    indexed_state: Option<ExecutionState>,
    disk_index: Option<HeadIndex>,
    /// Where its answer is in the group's answers.
    answer: usize,
}

/// What a transition is checked against, read from the head as the group would leave it.
struct Current {
    version: u64,
    fencing_epoch: u64,
    last_seq: u64,
    identity: HeadIdentity,
    indexed_state: Option<ExecutionState>,
    disk_index: Option<HeadIndex>,
    /// A copy of the head, if asked for (`copy_head`).
    head: Option<ExecutionHead>,
}

impl Current {
    fn of(head: &ExecutionHead, on_disk: OnDiskState<'_>, copy_head: bool) -> Self {
        Self {
            version: head.version,
            fencing_epoch: head.fencing_epoch,
            last_seq: head.last_seq,
            identity: HeadIdentity::of(head),
            indexed_state: on_disk.indexed_state,
            disk_index: on_disk.index.cloned(),
            head: copy_head.then(|| head.clone()),
        }
    }
}

/// What disk says of an execution whose head a transition reads: its by-state index state,
/// and its head record's index when the head was read from disk.
#[derive(Clone, Copy)]
struct OnDiskState<'a> {
    indexed_state: Option<ExecutionState>,
    index: Option<&'a HeadIndex>,
}

impl Committer {
    fn commit_group(&mut self, requests: Vec<Request>) {
        let started = Instant::now();
        if let Some(reason) = self.shared.failure() {
            for request in requests {
                let failed = || Error::FailStop(reason.clone());
                match request {
                    Request::Transition { reply, .. } => drop(reply.send(Err(failed()))),
                    Request::Purge { reply, .. } => drop(reply.send(Err(failed()))),
                    Request::Sweep { reply, .. } => drop(reply.send(Err(failed()))),
                    Request::Conversation { reply, .. } => drop(reply.send(Err(failed()))),
                    Request::Tick => {}
                }
            }
            return;
        }
        let at_ms = now_ms();
        let mut group = Group {
            heads: HashMap::with_capacity(requests.len()),
            frames: Vec::with_capacity(requests.len()),
            next_position: self
                .shared
                .durable_position
                .load(Ordering::Acquire)
                .saturating_add(1),
            frame_bytes: std::mem::take(&mut self.frame_bytes),
            ..Group::default()
        };
        let mut batch = sled::Batch::default();
        let mut answers = Vec::with_capacity(requests.len());
        let mut purges = Vec::new();
        let mut sweeps = Vec::new();
        let mut conversations = Vec::new();
        for request in requests {
            match request {
                Request::Transition { transition, reply } => {
                    let answer =
                        self.apply(&mut group, &mut batch, transition, at_ms, answers.len());
                    answers.push((reply, answer));
                }
                Request::Purge {
                    execution_id,
                    ended_key,
                    ended_before,
                    reply,
                } => {
                    let when = purge::When {
                        ended_key,
                        ended_before,
                        at_ms,
                    };
                    let step = self.purge_step(&mut group, &mut batch, execution_id, when);
                    purges.push((reply, step));
                }
                Request::Sweep {
                    from_position,
                    max_records,
                    reply,
                } => sweeps.push((
                    reply,
                    self.sweep_step(&group, &mut batch, from_position, max_records),
                )),
                Request::Conversation { write, reply } => conversations.push((
                    reply,
                    self.write_conversation(&mut group, &mut batch, write),
                )),
                Request::Tick => {}
            }
        }
        self.frame_bytes = std::mem::take(&mut group.frame_bytes);
        if let Some((first_position, writer)) = group.writer.take() {
            group
                .log_records
                .push((first_position, writer.finish(group.next_position - 1)));
        }
        for (first_position, bytes) in group.log_records.drain(..) {
            batch.insert(&keys::log(first_position), bytes);
        }
        let mut slice = self.next_slice();
        if answers.is_empty()
            && purges.is_empty()
            && sweeps.is_empty()
            && conversations.is_empty()
            && slice.is_empty()
        {
            return; // only ticks, and nothing to materialize
        }
        // While a slice is applied to sled, readers cannot combine the overlay with disk: the
        // generation is odd and the slice lock is held until the overlay has dropped the
        // slice. That is the apply alone (sled's own batch lock stops its readers then too),
        // not the flush and fsync: the slice holds only what earlier, durable groups
        // committed, so reading it from sled before this group's fsync reads nothing
        // unacknowledged, and a crash leaves the mark unmoved (the replay writes it again).
        let shared = Arc::clone(&self.shared);
        let on_disk = |execution_id| shared.head_index_on_disk(execution_id);
        let sliced = match slice.is_empty() {
            true => Ok(()),
            false => shared
                .overlay_read()
                .write_slice(&mut slice, &mut batch, &on_disk),
        };
        let slice_guard = (!slice.is_empty() && sliced.is_ok()).then(|| {
            let guard = shared.slice_lock_write();
            shared.generation.fetch_add(1, Ordering::AcqRel);
            guard
        });
        // B09: the group is decided, nothing of it written.
        crate::failpoint!("B09");
        let applied = sliced.and_then(|()| self.shared.db.apply_batch(batch).map_err(Error::from));
        // B02: the group is in sled's memory, not flushed.
        crate::failpoint!("B02");
        let mut written = HashMap::new();
        if let Some(guard) = slice_guard {
            if applied.is_ok() {
                written = self.shared.overlay_write().finish_slice(slice);
            }
            self.shared.generation.fetch_add(1, Ordering::AcqRel);
            drop(guard);
        }
        // S-7: the group's last position is recorded as acknowledged once it is durable in
        // sled and before anyone is answered; a group of rejections or ticks adds none.
        let last_position = group.next_position - 1;
        let acknowledged =
            |committer: &mut Self| match last_position > committer.acknowledged.position() {
                true => committer.acknowledged.write(last_position),
                false => Ok(()),
            };
        let durable = applied.and_then(|()| self.sync());
        // B10: durable in sled, not yet recorded as acknowledged (S-7).
        crate::failpoint!("B10");
        if let Err(error) = durable.and_then(|()| acknowledged(self)) {
            let reason = error.to_string();
            self.shared.fail(reason.clone());
            for (reply, _) in answers {
                let _ = reply.send(Err(Error::FailStop(reason.clone())));
            }
            for (reply, _) in purges {
                let _ = reply.send(Err(Error::FailStop(reason.clone())));
            }
            for (reply, _) in sweeps {
                let _ = reply.send(Err(Error::FailStop(reason.clone())));
            }
            for (reply, _) in conversations {
                let _ = reply.send(Err(Error::FailStop(reason.clone())));
            }
            return;
        }
        // B03: durable and recorded, no caller answered yet.
        crate::failpoint!("B03");
        self.shared.in_flight_blobs_clear();
        {
            let mut overlay = self.shared.overlay_write();
            for GroupFrame {
                frame,
                record,
                indexed_state,
                disk_index,
                answer,
            } in group.frames
            {
                // An execution the slice just wrote is listed on disk under its written
                // state now, with the head record index it wrote, not what this group's
                // transition was prepared against.
                let (indexed_state, disk_index) = match written.remove(&frame.head.execution_id) {
                    Some(written) => written,
                    None => (indexed_state, disk_index),
                };
                let events = overlay.merge(frame, record, indexed_state, disk_index);
                // Handed back to the writer, which folds them and frees them on its own thread.
                if let Some((_, Ok(Outcome::Committed(committed)))) = answers.get_mut(answer) {
                    committed.events = events;
                }
            }
            self.shared
                .durable_position
                .store(group.next_position - 1, Ordering::Release);
        }
        let metrics = &self.shared.metrics;
        let committed = answers
            .iter()
            .filter(|(_, answer)| matches!(answer, Ok(Outcome::Committed(_))))
            .count() as u64;
        metrics.group_seconds.observe_duration(started.elapsed());
        metrics.group_transitions.observe(committed as f64);
        metrics.groups.fetch_add(1, Ordering::Relaxed);
        metrics.transitions.fetch_add(committed, Ordering::Relaxed);
        for (reply, answer) in answers {
            let _ = reply.send(answer);
        }
        for (reply, step) in purges {
            let _ = reply.send(step);
        }
        for (reply, step) in sweeps {
            let _ = reply.send(step);
        }
        for (reply, outcome) in conversations {
            let _ = reply.send(outcome);
        }
    }

    /// Issue 37: a conversation record's compare-and-swap, against the record as this group
    /// leaves it. Written to its own key in the batch; until the group is durable, readers
    /// get the durable value it had (`in_flight_overwrites`). Nothing else writes that key.
    fn write_conversation(
        &self,
        group: &mut Group,
        batch: &mut sled::Batch,
        write: crate::conversation::ConversationWrite,
    ) -> Result<crate::conversation::ConversationOutcome> {
        let key = keys::conversation(write.session_id);
        let current = match group.conversations.get(&write.session_id) {
            Some(record) => Some(record.clone()),
            // The batch is applied at the group's end: disk holds the durable value.
            None => match self.shared.db.get(key)? {
                Some(bytes) => {
                    let record = crate::codec::decode(&key, &bytes)?;
                    self.shared.in_flight_overwrite(key, Some(bytes));
                    Some(record)
                }
                None => {
                    self.shared.in_flight_overwrite(key, None);
                    None
                }
            },
        };
        let record = match write.decide(current.as_ref()) {
            Ok(record) => record,
            Err(conflict) => return Ok(conflict),
        };
        batch.insert(&key[..], crate::codec::encode(&record));
        let version = record.version;
        group.conversations.insert(write.session_id, record);
        Ok(crate::conversation::ConversationOutcome::Written { version })
    }

    /// `read` of the execution's head as this group would leave it (the group's own changes,
    /// then the overlay, then disk) and of what the by-state index on disk says of it; read
    /// in place, not copied.
    fn with_head<T>(
        &self,
        group: &Group,
        execution_id: ExecutionId,
        read: impl FnOnce(&ExecutionHead, OnDiskState<'_>) -> T,
    ) -> Result<Option<T>> {
        let in_group = group.heads.get(&execution_id);
        if let Some(in_group) = in_group.and_then(|&i| group.frames.get(i)) {
            let on_disk = OnDiskState {
                indexed_state: in_group.indexed_state,
                index: in_group.disk_index.as_ref(),
            };
            return Ok(Some(read(&in_group.frame.head, on_disk)));
        }
        if let Some((head, indexed_state)) = self.shared.overlay_read().current(execution_id) {
            let on_disk = OnDiskState {
                indexed_state,
                index: None,
            };
            return Ok(Some(read(head, on_disk)));
        }
        // S-8: a purged execution takes no transition, and its id is never created again.
        if group.purged.contains(&execution_id)
            || self.shared.db.contains_key(keys::purged(execution_id))?
        {
            return Err(Error::Purged(execution_id));
        }
        let head = self.shared.head_record_on_disk(execution_id)?;
        Ok(head.map(|(head, index)| {
            let on_disk = OnDiskState {
                indexed_state: index_state(&head),
                index: Some(&index),
            };
            read(&head, on_disk)
        }))
    }

    /// A session's record as of this group: staged in it, committed (overlay), or on disk.
    fn session(
        &self,
        group: &Group,
        session_id: crate::ids::SessionId,
    ) -> Result<Option<crate::records::SessionRecord>> {
        if let Some(record) = group.sessions.get(&session_id) {
            return Ok(Some(record.clone()));
        }
        let key = keys::session(session_id);
        if let Some(RecordValue::Session(record)) = self.shared.overlay_read().record(&key) {
            return Ok(Some(record.clone()));
        }
        self.shared.record_on_disk(&key)
    }

    fn command(&self, group: &Group, command_id: CommandId) -> Result<Option<CommandRecord>> {
        if let Some(command) = group.commands.get(&command_id) {
            return Ok(Some(command.clone()));
        }
        let key = keys::command(command_id);
        if let Some(RecordValue::Command(command)) = self.shared.overlay_read().record(&key) {
            return Ok(Some(command.clone()));
        }
        self.shared.record_on_disk(&key)
    }

    /// Starts a materialization when one is due, and picks the part of it this group
    /// writes: `materialize_slice_len` entries or a 32nd of the materialization,
    /// whichever is more, or all of it when new commits have filled `active` to
    /// `overlay_len_max` meanwhile (the bound on the overlay's memory wins over a smooth
    /// latency).
    fn next_slice(&mut self) -> Slice {
        let limits = &self.shared.limits;
        let due = {
            let overlay = self.shared.overlay_read();
            !overlay.is_materializing()
                && overlay.active_len() > 0
                && (overlay.active_len() >= limits.overlay_len_max
                    || self.last_materialization.elapsed()
                        >= Duration::from_millis(limits.materialize_interval_ms))
        };
        if due {
            let through = self.shared.durable_position.load(Ordering::Acquire);
            self.shared.overlay_write().freeze(through);
            self.shared
                .metrics
                .materializations
                .fetch_add(1, Ordering::Relaxed);
            self.last_materialization = Instant::now();
        }
        let overlay = self.shared.overlay_read();
        let len_max = if overlay.active_len() >= limits.overlay_len_max {
            usize::MAX
        } else {
            // Fast enough that a materialization ends within a few groups even when many
            // executions are dirty; small enough that no single group pays for all of it.
            limits
                .materialize_slice_len
                .max(overlay.frozen_len_at_freeze() / MATERIALIZE_SLICES_TARGET)
        };
        overlay.slice(len_max)
    }

    /// Writes `batch` atomically, flushes and fsyncs.
    fn write_durably(&mut self, batch: sled::Batch) -> Result<()> {
        self.shared.db.apply_batch(batch)?;
        self.sync()
    }

    /// Makes everything applied to sled durable: sled's flush, then an fsync of its data
    /// file (sled's flush alone ends in `sync_file_range`, which is not durable).
    fn sync(&mut self) -> Result<()> {
        let started = Instant::now();
        self.shared.db.flush()?;
        // B08: sled flushed (`sync_file_range`), not fsynced.
        crate::failpoint!("B08");
        add_elapsed_micros(&self.shared.metrics.flush_micros_total, started);
        let started = Instant::now();
        if crate::planted::planted(crate::planted::Bug::AckBeforeFsync) {
            return Ok(());
        }
        self.data_file.sync_data().map_err(|error| Error::Io {
            path: self.shared.path.join("db"),
            message: error.to_string(),
        })?;
        self.sync_sled_blobs()?;
        self.shared.metrics.fsyncs.fetch_add(1, Ordering::Relaxed);
        add_elapsed_micros(&self.shared.metrics.fsync_micros_total, started);
        self.shared
            .metrics
            .fsync_seconds
            .observe_duration(started.elapsed());
        Ok(())
    }

    /// Writes everything the overlay holds (when the store closes), so the next open
    /// replays nothing.
    fn materialize_all(&mut self) -> Result<()> {
        let mut batch = sled::Batch::default();
        let through = self.shared.durable_position.load(Ordering::Acquire);
        let shared = Arc::clone(&self.shared);
        let on_disk = |execution_id| shared.head_index_on_disk(execution_id);
        shared
            .overlay_read()
            .write_all(&mut batch, through, &on_disk)?;
        let shared = Arc::clone(&self.shared);
        let _slice_guard = shared.slice_lock_write();
        shared.generation.fetch_add(1, Ordering::AcqRel);
        self.write_durably(batch)?;
        *self.shared.overlay_write() = Overlay::new(self.shared.limits.head_frame_refs_max);
        self.shared.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// sled writes a value or node larger than a quarter segment to its own file under
    /// `blobs/` and never fsyncs it. Our limits keep that rare; when it happens, fsync the
    /// new files and the directory before acknowledging.
    fn sync_sled_blobs(&mut self) -> Result<()> {
        let dir = self.shared.path.join("blobs");
        let io_error = |path: &Path, error: std::io::Error| Error::Io {
            path: path.to_path_buf(),
            message: error.to_string(),
        };
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(error) => return Err(io_error(&dir, error)),
        };
        let mut synced_any = false;
        let mut present = HashSet::new();
        for entry in entries {
            let entry = entry.map_err(|error| io_error(&dir, error))?;
            let name = entry.file_name();
            present.insert(name.clone());
            if self.synced_sled_blobs.contains(&name) {
                continue;
            }
            let path = entry.path();
            match File::open(&path) {
                Ok(file) => file.sync_all().map_err(|error| io_error(&path, error))?,
                // sled removed it meanwhile (blob garbage collection).
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(error) => return Err(io_error(&path, error)),
            }
            self.synced_sled_blobs.insert(name);
            synced_any = true;
        }
        // Forget files sled has garbage-collected.
        self.synced_sled_blobs.retain(|name| present.contains(name));
        if synced_any {
            File::open(&dir)
                .and_then(|dir_file| dir_file.sync_all())
                .map_err(|error| io_error(&dir, error))?;
        }
        Ok(())
    }
}
