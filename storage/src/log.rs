//! The committer: the one thread that writes to the store (S-2, S-3).
//!
//! Callers submit transitions through a bounded queue (`Limits::queue_len_max`). The
//! committer takes everything queued, up to `Limits::batch_len_max`, validates each
//! transition against its own view (it is the only writer, so the view is consistent),
//! appends the group's writes to the journal and fdatasyncs it — one device wait per group
//! (`journal.rs`) — then applies them to sled in memory, and only then answers each caller.
//! sled is flushed and fsynced in the background (`log/flusher.rs`; sled 0.34.7's own
//! `flush()` ends in `sync_file_range`, which does not make data durable).
//!
//! Why one log record per ~16 KiB of frames, not a record per event and a record per head:
//! sled tops out near 100–180k inserts/s on two cores however it is batched, and a step is
//! two transitions. Heads, events and records are written to their own keys later, many
//! transitions at once (`overlay.rs`).
//!
//! Invariant: nothing is answered before the journal frame that carries it is fsynced; a
//! failed write, flush or fsync answers every waiter with `FailStop` and the store takes no more
//! writes until it is reopened (fail-stop: after a failed fsync the page cache cannot be
//! trusted to say what is on disk).
//! This module does not read on behalf of callers; see `store.rs`.

use std::collections::HashSet;
use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use foldhash::{HashMap, HashMapExt};
use tokio::sync::{mpsc, oneshot};

mod apply;
mod conversation;
mod flusher;
mod generations;
mod materialize;
mod purge;

use crate::acknowledged::Acknowledged;
use crate::codec::{Frame, LogRecordWriter};
use crate::conversation::{ConversationOutcome, ConversationRecord, ConversationWrite};
use crate::error::{Error, Result};
use crate::event_store::{PurgeStep, SweepStep};
use crate::head_record::HeadIndex;
use crate::history::{self, Liveness, Location};
use crate::ids::{CommandId, ExecutionId, SessionId};
use crate::journal::Journal;
use crate::keys;
use crate::overlay::{OnDiskNow, Overlay, Slice};
use crate::records::{BlobHash, CommandRecord, SessionRecord};
use crate::shared::{add_elapsed_micros, now_ms, Limits, Shared};
use crate::transition::{Outcome, Transition};
use crate::writes::{batch_of, Writes};

/// Writes of a group small enough to go to sled key by key (see `Committer::write`).
const SMALL_GROUP_WRITES: usize = 64;

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
    /// The store closes (`Store::close`): the queue takes nothing more, and the committer
    /// stops once it has answered what is in it.
    Close,
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
    /// A conversation record's compare-and-swap.
    Conversation {
        write: ConversationWrite,
        reply: oneshot::Sender<Result<ConversationOutcome>>,
    },
}

impl Request {
    /// Answers it `FailStop` undecided: the store has stopped.
    fn fail(self, reason: &str) {
        let failed = || Error::FailStop(reason.to_owned());
        match self {
            Request::Transition { reply, .. } => drop(reply.send(Err(failed()))),
            Request::Purge { reply, .. } => drop(reply.send(Err(failed()))),
            Request::Sweep { reply, .. } => drop(reply.send(Err(failed()))),
            Request::Conversation { reply, .. } => drop(reply.send(Err(failed()))),
            Request::Tick | Request::Close => {}
        }
    }
}

/// A request the group decided, with its answer: sent once the group is durable.
enum Answer {
    Transition(oneshot::Sender<Result<Outcome>>, Result<Outcome>),
    Purge(oneshot::Sender<Result<PurgeStep>>, Result<PurgeStep>),
    Sweep(oneshot::Sender<Result<SweepStep>>, Result<SweepStep>),
    Conversation(
        oneshot::Sender<Result<ConversationOutcome>>,
        Result<ConversationOutcome>,
    ),
}

impl Answer {
    /// Sends what was decided; a caller that went away needs no answer.
    fn send(self) {
        match self {
            Answer::Transition(reply, answer) => drop(reply.send(answer)),
            Answer::Purge(reply, answer) => drop(reply.send(answer)),
            Answer::Sweep(reply, answer) => drop(reply.send(answer)),
            Answer::Conversation(reply, answer) => drop(reply.send(answer)),
        }
    }

    /// The group never became durable: `FailStop` instead of what was decided.
    fn fail(self, reason: &str) {
        let failed = || Error::FailStop(reason.to_owned());
        match self {
            Answer::Transition(reply, _) => drop(reply.send(Err(failed()))),
            Answer::Purge(reply, _) => drop(reply.send(Err(failed()))),
            Answer::Sweep(reply, _) => drop(reply.send(Err(failed()))),
            Answer::Conversation(reply, _) => drop(reply.send(Err(failed()))),
        }
    }
}

/// Starts the committer thread (`run`) on the store `open` prepared, and the ticker that
/// keeps it materializing while idle; returns once the replayed tail is materialized (S-6),
/// with the queue's sender.
pub(crate) fn spawn(
    shared: &Arc<Shared>,
    data_file: File,
    acknowledged: Acknowledged,
    journal: Journal,
) -> Result<(mpsc::Sender<Request>, std::thread::JoinHandle<()>)> {
    let limits = &shared.limits;
    let io_error = |error| Error::io(&shared.path, error);
    let (sender, queue) = mpsc::channel(limits.queue_len_max.max(1));
    let committer_shared = Arc::clone(shared);
    let (ready, is_ready) = std::sync::mpsc::channel();
    // What the open replayed is synced: sled holds every frame before the next.
    let flushing = flusher::Flushing::new(data_file, acknowledged, journal.next_seq() - 1);
    let liveness = Liveness::read(&shared.db()?)?;
    journal.check_present(&liveness)?;
    let flusher = flusher::spawn(Arc::clone(shared), Arc::clone(&flushing)).map_err(io_error)?;
    let committer = Committer {
        generations: generations::Generations::new(),
        shared: committer_shared,
        journal,
        liveness,
        flushing,
        flusher: Some(flusher),
        journal_bytes: 0,
        last_materialization: Instant::now(),
        frame_bytes: Vec::new(),
    };
    let committer = std::thread::Builder::new()
        .name("openprogram-committer".into())
        .spawn(move || run(committer, queue, ready))
        .map_err(io_error)?;
    is_ready.recv().map_err(|_| Error::Io {
        path: shared.path.clone(),
        message: "the committer thread stopped while opening".into(),
    })??;
    spawn_ticker(&sender, limits).map_err(io_error)?;
    Ok((sender, committer))
}

/// Starts the thread that sends `Request::Tick` to the committer every eighth of the
/// materialization interval. It holds only a weak sender, so it never keeps the queue open:
/// once the store closes, its next tick finds the queue gone and it ends.
fn spawn_ticker(sender: &mpsc::Sender<Request>, limits: &Limits) -> std::io::Result<()> {
    let weak = sender.downgrade();
    let tick = Duration::from_millis((limits.materialize_interval_ms / 8).max(5));
    std::thread::Builder::new()
        .name("openprogram-ticker".into())
        .spawn(move || loop {
            std::thread::sleep(tick);
            let Some(sender) = weak.upgrade() else { return };
            if let Err(mpsc::error::TrySendError::Closed(_)) = sender.try_send(Request::Tick) {
                return;
            }
        })?;
    Ok(())
}

/// The committer's loop. Returns when every sender is gone, after a last materialization.
///
/// It first writes the log tail the open replayed to its own keys and moves the mark, then
/// tells `ready`: a run killed before its first materialization must not leave the next open
/// a longer tail to replay (S-6), or repeated crashes would grow it without bound.
fn run(
    mut committer: Committer,
    mut queue: mpsc::Receiver<Request>,
    ready: std::sync::mpsc::Sender<Result<()>>,
) {
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
        committer.stop_flusher();
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
        if requests
            .iter()
            .any(|request| matches!(request, Request::Close))
        {
            // Senders now fail at once; what is queued is still taken.
            queue.close();
        }
        committer.commit_group(requests);
        add_elapsed_micros(&committer.shared.metrics.group_micros_total, started);
    }
    committer.stop_flusher();
    committer.generations.abandon();
    if committer.shared.refusals.failure().is_none() {
        // Every group durable in sled, and only then the direct write of the
        // materialization: no later open replays a frame over it.
        let closed = committer
            .flushing
            .sync(&committer.shared)
            .and_then(|_| committer.materialize_all());
        if let Err(error) = closed {
            tracing::error!(%error, "final materialization failed; the journal and log will be replayed at next open");
        }
    }
}

struct Committer {
    shared: Arc<Shared>,
    /// Each group's writes, fdatasynced before it is answered; the home of history.
    journal: Journal,
    /// What lives in each journal segment.
    liveness: Liveness,
    /// sled's generations: a copy under way, and when the next is due.
    generations: generations::Generations,
    /// sled made durable in the background, and what it holds.
    flushing: Arc<flusher::Flushing>,
    /// The flusher's thread, until it is stopped.
    flusher: Option<std::thread::JoinHandle<()>>,
    /// Journal bytes written since the flusher was last asked to flush.
    journal_bytes: u64,
    last_materialization: Instant,
    /// The frame encoding buffer, kept between groups (see `Group::frame_bytes`).
    frame_bytes: Vec<u8>,
}

/// One group commit: what its requests change before it is durable, and their answers.
#[derive(Default)]
struct Group {
    /// The time stamped on everything the group writes.
    at_ms: u64,
    /// What the group writes, in one journal frame: its log records, the records a
    /// rejection or a conversation writes to their own keys, purge and sweep steps.
    batch: Writes,
    /// It holds a purge or sweep step: sled takes it as one batch, which readers see whole.
    atomic: bool,
    answers: Vec<Answer>,
    /// The index in `frames` of each execution's newest frame in this group.
    heads: HashMap<ExecutionId, usize>,
    commands: HashMap<CommandId, CommandRecord>,
    /// Session records as this group's transitions left them.
    sessions: HashMap<SessionId, SessionRecord>,
    /// Conversation records as this group's writes left them.
    conversations: HashMap<SessionId, ConversationRecord>,
    /// Committed frames, with what they are merged into the overlay with.
    frames: Vec<GroupFrame>,
    /// The log record being filled (its first position, its frames so far).
    writer: Option<(u64, LogRecordWriter)>,
    next_position: u64,
    /// Each frame is encoded here, then copied into its log record (the committer's buffer,
    /// lent to the group).
    frame_bytes: Vec<u8>,
    /// Executions a purge step of this group touched: no transition of theirs commits.
    purged: HashSet<ExecutionId>,
    /// Executions whose rejection records this group writes: no purge step of theirs runs.
    recorded: HashSet<ExecutionId>,
    /// Blobs this group's transitions use: no purge of this group removes them.
    blobs_used: HashSet<BlobHash>,
    /// Blobs this group's purges remove: a transition of this group that uses one writes it
    /// again.
    blobs_removed: HashSet<BlobHash>,
}

/// A committed frame of the group, merged into the overlay once the group is durable.
struct GroupFrame {
    frame: Frame,
    /// The key of the log record holding it.
    record: u64,
    /// What disk says of the execution (for the overlay's new entry): its by-state index
    /// state, and its head record's index if the transition read it from disk.
    on_disk: OnDiskNow,
    /// Where its answer is in the group's answers.
    answer: usize,
}

impl Committer {
    /// Stops the flusher and waits for its thread: nothing of the store runs after the
    /// committer.
    fn stop_flusher(&mut self) {
        self.flushing.stop();
        if let Some(flusher) = self.flusher.take() {
            if flusher.join().is_err() {
                tracing::error!("the flusher thread panicked");
            }
        }
    }

    /// One group: decided, written with a slice of the materialization, made durable, then
    /// answered; if the write fails, every request is refused `FailStop` and the store stops.
    fn commit_group(&mut self, requests: Vec<Request>) {
        let started = Instant::now();
        if let Some(reason) = self.shared.refusals.failure() {
            return requests
                .into_iter()
                .for_each(|request| request.fail(&reason));
        }
        if let Err(error) = self.tend_generations() {
            let reason = error.to_string();
            tracing::error!(%reason, "store entered fail-stop: sled's new generation failed");
            self.shared.refusals.fail(reason.clone());
            return requests
                .into_iter()
                .for_each(|request| request.fail(&reason));
        }
        let mut group = self.decide(requests);
        self.relocate(&mut group);
        let slice = self.next_slice();
        if group.answers.is_empty() && slice.is_empty() && group.batch.is_empty() {
            return; // only ticks, and nothing to materialize or copy forward
        }
        let batch = std::mem::take(&mut group.batch);
        match self.write(batch, slice, group.next_position - 1, group.atomic) {
            Ok(written) => {
                self.answer(group, written, started);
                self.drop_dead_segments();
            }
            Err(error) => {
                let reason = error.to_string();
                tracing::error!(%reason, "store entered fail-stop: no more writes are acknowledged");
                self.shared.refusals.fail(reason.clone());
                group
                    .answers
                    .into_iter()
                    .for_each(|answer| answer.fail(&reason));
            }
        }
    }

    /// Decides the group's requests in order, each against what the ones before it left,
    /// into the group's batch; nothing is visible to readers yet.
    fn decide(&mut self, requests: Vec<Request>) -> Group {
        let mut group = Group {
            at_ms: now_ms(),
            answers: Vec::with_capacity(requests.len()),
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
        for request in requests {
            group.atomic |= matches!(request, Request::Purge { .. } | Request::Sweep { .. });
            let answer = match request {
                Request::Transition { transition, reply } => {
                    Answer::Transition(reply, self.apply(&mut group, transition))
                }
                Request::Purge {
                    execution_id,
                    ended_key,
                    ended_before,
                    reply,
                } => Answer::Purge(
                    reply,
                    self.purge_step(&mut group, execution_id, ended_key, ended_before),
                ),
                Request::Sweep {
                    from_position,
                    max_records,
                    reply,
                } => Answer::Sweep(
                    reply,
                    self.sweep_step(&mut group, from_position, max_records),
                ),
                Request::Conversation { write, reply } => {
                    Answer::Conversation(reply, self.write_conversation(&mut group, write))
                }
                Request::Tick | Request::Close => continue,
            };
            group.answers.push(answer);
        }
        self.frame_bytes = std::mem::take(&mut group.frame_bytes);
        if let Some((first_position, writer)) = group.writer.take() {
            let bytes = writer.finish(group.next_position - 1);
            group.batch.insert(&keys::log(first_position), bytes);
        }
        group
    }

    /// Writes the group's batch with a slice of the materialization to the journal and
    /// fdatasyncs it — the group is durable — then applies it to sled (in memory; the flusher
    /// makes it durable there). sled never holds what the journal does not. A small group
    /// goes to sled key by key: sled's batch writes out its log buffer before and after
    /// itself, waiting on the device each time, which would triple a lone transition's
    /// latency; a large one, or one with purge or sweep steps (`atomic`: readers see it
    /// whole), as one batch, whose fixed waits cost less than taking sled's locks key by key.
    /// Returns what the slice wrote of each execution.
    fn write(
        &mut self,
        mut batch: Writes,
        mut slice: Slice,
        last_position: u64,
        atomic: bool,
    ) -> Result<HashMap<ExecutionId, OnDiskNow>> {
        let shared = Arc::clone(&self.shared);
        let on_disk = |execution_id| shared.head_index_on_disk(execution_id);
        if !slice.is_empty() {
            shared
                .overlay_read()
                .write_slice(&mut slice, &mut batch, &on_disk)?;
        }
        let mut ops = batch.into_ops();
        // B09: the group is decided, nothing of it written.
        crate::failpoint!("B09");
        let (seq, locations) = self.journal_append(last_position, &ops)?;
        history::locate(&mut ops, &locations);
        // B02: the group is durable in the journal, not applied to sled.
        crate::failpoint!("B02");
        // While a slice is applied to sled, readers cannot combine the overlay with disk: the
        // seqlock is odd and the slice lock is held until the overlay has dropped the
        // slice.
        let db = shared.db()?;
        let slice_guard = (!slice.is_empty()).then(|| {
            let guard = shared.slice_lock_write();
            shared.seqlock.fetch_add(1, Ordering::AcqRel);
            guard
        });
        let applied = match atomic || ops.len() > SMALL_GROUP_WRITES {
            true => db.apply_batch(batch_of(&ops)).map_err(Error::from),
            false => apply_each(&db, &ops),
        };
        let mut written = HashMap::new();
        if let Some(guard) = slice_guard {
            if applied.is_ok() {
                written = shared.overlay_write().finish_slice(slice);
            }
            shared.seqlock.fetch_add(1, Ordering::AcqRel);
            drop(guard);
        }
        applied?;
        self.generations.forward(&ops);
        self.liveness.apply(&ops)?;
        self.flushing.applied(seq, last_position);
        Ok(written)
    }

    /// Appends the group's writes to the journal and fdatasyncs it; asks the flusher to
    /// flush sled when the journal grew enough. Returns the frame's seq and where each value
    /// lies.
    fn journal_append(
        &mut self,
        last_position: u64,
        ops: &[(sled::IVec, Option<sled::IVec>)],
    ) -> Result<(u64, Vec<Option<Location>>)> {
        let metrics = &self.shared.metrics;
        let started = Instant::now();
        let written = self.journal.write(last_position, ops)?;
        let (seq, frame_bytes) = (written.seq, written.bytes);
        add_elapsed_micros(&metrics.flush_micros_total, started);
        // B08: the group is in the journal, not yet fdatasynced.
        crate::failpoint!("B08");
        let started = Instant::now();
        self.journal.sync()?;
        metrics.fsyncs.fetch_add(1, Ordering::Relaxed);
        add_elapsed_micros(&metrics.fsync_micros_total, started);
        metrics.fsync_seconds.observe_duration(started.elapsed());
        self.journal_bytes += frame_bytes;
        if self.journal_bytes >= flusher::FLUSH_JOURNAL_BYTES {
            self.journal_bytes = 0;
            self.flushing.nudge();
        }
        Ok((seq, written.locations))
    }

    /// The group is durable: its frames join the overlay, where readers find them, the
    /// durable position moves past them, and every request is answered.
    fn answer(&self, group: Group, mut written: HashMap<ExecutionId, OnDiskNow>, started: Instant) {
        // B03: the group is durable (its journal frame fdatasynced), no caller answered yet.
        crate::failpoint!("B03");
        self.shared.in_flight_blobs_clear();
        let Group {
            frames,
            mut answers,
            next_position,
            ..
        } = group;
        {
            let mut overlay = self.shared.overlay_write();
            for GroupFrame {
                frame,
                record,
                on_disk,
                answer,
            } in frames
            {
                // An execution the slice just wrote is listed on disk under its written
                // state now, with the head record index it wrote, not what this group's
                // transition was prepared against.
                let (indexed_state, disk_index) =
                    written.remove(&frame.head.execution_id).unwrap_or(on_disk);
                let events = overlay.merge(frame, record, indexed_state, disk_index);
                // Handed back to the writer, which folds them and frees them on its own thread.
                if let Some(Answer::Transition(_, Ok(Outcome::Committed(committed)))) =
                    answers.get_mut(answer)
                {
                    committed.events = events;
                }
            }
            self.shared
                .durable_position
                .store(next_position - 1, Ordering::Release);
        }
        let metrics = &self.shared.metrics;
        let committed = answers
            .iter()
            .filter(|answer| matches!(answer, Answer::Transition(_, Ok(Outcome::Committed(_)))))
            .count() as u64;
        metrics.group_seconds.observe_duration(started.elapsed());
        metrics.group_transitions.observe(committed as f64);
        metrics.groups.fetch_add(1, Ordering::Relaxed);
        metrics.transitions.fetch_add(committed, Ordering::Relaxed);
        answers.into_iter().for_each(Answer::send);
    }
}

/// Applies a group's writes to sled one key at a time, in the order they were made.
fn apply_each(db: &sled::Db, ops: &[(sled::IVec, Option<sled::IVec>)]) -> Result<()> {
    for (key, value) in ops {
        match value {
            Some(value) => db.insert(key, value.clone())?,
            None => db.remove(key)?,
        };
    }
    Ok(())
}
