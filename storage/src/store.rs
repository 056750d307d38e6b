//! The store: opening (lock, migrations, log replay, incarnation), the read API, and the
//! handle that submits transitions to the committer (`log.rs`).
//!
//! The public API names no sled type: callers see `Store`, the `EventStore` trait and owned
//! records, so another backend (PostgreSQL for several runtime nodes) can stand beside this
//! one without touching `actors/`.

use std::collections::{BTreeSet, HashSet};
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::thread::JoinHandle;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::sync::{mpsc, oneshot};

use crate::acknowledged::Acknowledged;
use crate::codec::{self, DecodedFrame, FrameRef, RecordValue};
use crate::error::{Error, Result};
use crate::event::EventEnvelope;
use crate::ids::{CommandId, EffectId, ExecutionId, ProcessId, SessionId, WaitId};
use crate::keys;
use crate::log::{self, Request};
use crate::migrate;
use crate::open::{
    load_quarantine, open_sled, record_incarnation, replay, salvage_report, SalvageReport,
};
use crate::overlay::Overlay;
use crate::records::{
    BlobHash, CommandRecord, ExecutionHead, ExecutionState, JobRecord, NodeRecord, Nodes,
    ProcessRecord, ProjectionRecord, PurgeStep, PurgedRecord, ReceiptRecord, SweepStep, WaitRecord,
};
use crate::shared::{Metrics, Shared};
use crate::transition::{Outcome, Transition};

mod reads;
mod retention;

pub use crate::open::{Incarnation, SEGMENT_BYTES};
pub use crate::shared::{Limits, MetricsSnapshot};

/// Reads and writes of the event log, independent of the engine underneath. Only the
/// actors write: everything else gets an `EventReader`.
pub trait EventStore: EventReader {
    /// Queues a transition for the next group commit: at once when the queue has room,
    /// else when the future is first polled, waiting while the queue is full. The future
    /// resolves once the group is fsynced (or rejected). Transitions that must commit in a
    /// given order are submitted one after the other, each awaited (as the actors do).
    fn submit(&self, transition: Transition) -> BoxFuture<'static, Result<Outcome>>;

    /// S-8: one step of the purge of an ended execution, written with the next group
    /// commit: the first makes it unreadable (`purged` from then on), each removes a bounded
    /// part of what it owned; call again while it answers `More`. `ended_key`: the time of
    /// its entry in `ended_before`, removed with it. `ended_before`: purge it only if its
    /// last activity is older (else `NotEnded`).
    fn purge(
        &self,
        execution_id: ExecutionId,
        ended_key: Option<u64>,
        ended_before: Option<u64>,
    ) -> BoxFuture<'static, Result<PurgeStep>>;

    /// S-8: one step of the log's sweep, from `from_position`: removes the log records
    /// (of at most `max_records` examined) whose every frame is of a purged execution.
    fn sweep_log(
        &self,
        from_position: u64,
        max_records: usize,
    ) -> BoxFuture<'static, Result<SweepStep>>;

    /// Issue 37: a compare-and-swap of a session's conversation record (its name and
    /// compactions), durable before it answers `Written`.
    fn write_conversation(
        &self,
        write: crate::conversation::ConversationWrite,
    ) -> BoxFuture<'static, Result<crate::conversation::ConversationOutcome>>;

    /// N-2: registers this handle's incarnation as node `node_id`, reachable at `url`, or
    /// renews its lease: it expires `ttl` from now by the database's clock. Refused
    /// (`NodeSuperseded`) once a later incarnation registered under the same id, and
    /// (`SingleNode`) by a store only one process opens. Blocks for one round trip.
    fn renew_node(&self, node_id: &str, url: &str, ttl: std::time::Duration) -> Result<NodeRecord> {
        let _ = (node_id, url, ttl);
        Err(crate::error::Error::SingleNode("sled"))
    }
}

/// The reads of the event log: what inspection (HTTP, the debug endpoint, the CLI) may do.
pub trait EventReader: Send + Sync + 'static {
    fn head(&self, execution_id: ExecutionId) -> Result<Option<ExecutionHead>>;
    /// Events of one execution with `seq > after_seq`, oldest first, at most `limit`.
    fn events_after(
        &self,
        execution_id: ExecutionId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<EventEnvelope>>;
    /// Events of the whole store with `position > after_position`, at most `limit`, in
    /// position order; a later call never returns a position below one returned before.
    /// Positions rise, gapless in sled; in PostgreSQL they have gaps, and the log stops
    /// below the oldest transaction still running on the server (`pg.rs`).
    fn log_after(&self, after_position: u64, limit: usize) -> Result<Vec<EventEnvelope>>;
    fn command(&self, command_id: CommandId) -> Result<Option<CommandRecord>>;
    fn receipt(&self, effect_id: EffectId) -> Result<Option<ReceiptRecord>>;
    fn wait(&self, wait_id: WaitId) -> Result<Option<WaitRecord>>;
    fn process(&self, process_id: ProcessId) -> Result<Option<ProcessRecord>>;
    /// J-1: a Job's standing with the resource queue; `None` for an execution that is no Job.
    fn job(&self, job_id: ExecutionId) -> Result<Option<JobRecord>>;
    /// Issue 37: a session's record (grants, foreground turn); `None` before its first write.
    fn session(&self, session_id: SessionId) -> Result<Option<crate::records::SessionRecord>>;
    /// Issue 37: a session's name and compactions; `None` before its first write.
    fn conversation(
        &self,
        session_id: SessionId,
    ) -> Result<Option<crate::conversation::ConversationRecord>>;
    /// S-8: the execution's latest projection (`None` before its first).
    fn projection(&self, execution_id: ExecutionId) -> Result<Option<ProjectionRecord>>;
    /// S-8: what is left of a purged execution (`None`: never purged).
    fn purged(&self, execution_id: ExecutionId) -> Result<Option<PurgedRecord>>;
    /// S-8: executions that ended before `before_ms`, oldest first, at most `limit`, with the
    /// time each is listed under; listed after the entry `after` if given (a cursor).
    fn ended_before(
        &self,
        before_ms: u64,
        after: Option<(u64, ExecutionId)>,
        limit: usize,
    ) -> Result<Vec<(u64, ExecutionId)>>;
    /// S-8: purges begun and not finished (a crash between their steps).
    fn purges_unfinished(&self) -> Result<Vec<ExecutionId>>;
    /// S-8: the bytes the store's files take on disk now (every file under its directory).
    fn disk_bytes(&self) -> u64;
    /// The executions of a session, in id order (ids are time-ordered: admission order).
    fn executions_in_session(&self, session_id: SessionId) -> Result<Vec<ExecutionId>>;
    /// Every session with at least one execution, with how many it has, in id order. Reads
    /// the whole by-session index: one small key per execution (an admin read).
    fn sessions(&self) -> Result<Vec<(SessionId, usize)>>;
    /// Every process record (P-3: startup marks those of a dead owner lost). Process
    /// records are few (one per started process), so this reads them all.
    fn processes(&self) -> Result<Vec<ProcessRecord>>;
    fn blob(&self, hash: BlobHash) -> Result<Option<Vec<u8>>>;
    /// Executions currently in a non-terminal `state`, from the by-state index (S-6).
    /// Terminal states are not indexed: asking for one returns an empty list.
    fn executions_in_state(&self, state: ExecutionState) -> Result<Vec<ExecutionId>>;
    /// Executions refused for corrupted records, with the reason (S-4).
    fn quarantined(&self) -> Vec<(ExecutionId, String)>;
    /// The incarnation this handle opened the store as.
    fn incarnation(&self) -> &Incarnation;
    /// N-2: the runtime nodes registered in a shared store, with the time by the clock their
    /// leases are measured on (the database's). A store of one process has none.
    fn nodes(&self) -> Result<Nodes> {
        Ok(Nodes::default())
    }
    /// Counters of the write path (groups, transitions, fsyncs...).
    fn metrics(&self) -> MetricsSnapshot;
    /// The position of the newest event in the whole log (0: none): where a reader that wants
    /// only what comes next starts. By default read page by page to the end.
    fn log_end(&self) -> Result<u64> {
        let mut end = 0;
        loop {
            let page = self.log_after(end, 1024)?;
            match page.last() {
                Some(last) => end = last.position.max(end + 1),
                None => return Ok(end),
            }
        }
    }
    /// Histograms of the write path: group commits' time and size, fsyncs' time.
    fn histograms(&self) -> Vec<crate::NamedHistogram> {
        Vec::new()
    }
    /// Why the store stopped acknowledging writes (fail-stop after a failed write or
    /// fsync), if it did.
    fn failure(&self) -> Option<String>;
}

/// A handle on an open store. Cheap to clone; the store closes when the last handle drops,
/// after the committer has written everything queued.
#[derive(Debug, Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shared: Arc<Shared>,
    sender: Option<mpsc::Sender<Request>>,
    committer: Option<JoinHandle<()>>,
    incarnation: Incarnation,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the queue ends the committer's loop after it has answered everything queued.
        self.sender.take();
        if let Some(committer) = self.committer.take() {
            if committer.join().is_err() {
                tracing::error!("the committer thread panicked");
            }
        }
    }
}

/// Bound on optimistic read attempts before a read holds the overlay lock instead.
const READ_ATTEMPTS_MAX: usize = 3;

impl Store {
    /// Opens (or creates) the store in `path` with default limits.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, Limits::default())
    }

    /// Opens (or creates) the store: takes the lock, runs migrations, replays the log tail
    /// and records a new incarnation. Never scans the whole history (S-6).
    pub fn open_with(path: impl AsRef<Path>, limits: Limits) -> Result<Self> {
        Self::open_checked(path.as_ref(), limits, false).map(|(store, _)| store)
    }

    /// S-7: opens a store that may have lost acknowledged history (a damaged or truncated
    /// file), keeping what remains: the report (`Some` only if something was lost) lists
    /// what was lost and what can be named of it. Later opens check against what this one
    /// found. A healthy store opens as with `open_with`; an operator's explicit choice
    /// (`serve --accept-loss`).
    pub fn open_salvaging(
        path: impl AsRef<Path>,
        limits: Limits,
    ) -> Result<(Self, Option<SalvageReport>)> {
        Self::open_checked(path.as_ref(), limits, true)
    }

    fn open_checked(
        path: &Path,
        limits: Limits,
        salvaging: bool,
    ) -> Result<(Self, Option<SalvageReport>)> {
        let path = path.to_path_buf();
        limits.validate()?;
        let io_error = |error: std::io::Error| Error::Io {
            path: path.clone(),
            message: error.to_string(),
        };
        std::fs::create_dir_all(&path).map_err(io_error)?;
        let db = open_sled(&path, limits.cache_bytes)?;
        // Read under sled's lock: no other opener is writing it.
        let (acknowledged, mark_unreadable) = match Acknowledged::read(&path) {
            Err(Error::AcknowledgedUnreadable { .. }) if salvaging => (None, true),
            read => (read?, false),
        };
        let data_file = File::open(path.join("db")).map_err(io_error)?;
        let mut sync = || {
            data_file.sync_data().map_err(|error| Error::Io {
                path: path.join("db"),
                message: error.to_string(),
            })
        };
        // The directory entries of sled's files must survive a power loss too.
        File::open(&path)
            .and_then(|dir| dir.sync_all())
            .map_err(io_error)?;
        migrate::run(&db, &mut sync)?;

        let quarantine = load_quarantine(&db)?;
        let shared = Arc::new(Shared {
            db,
            path: path.clone(),
            limits: limits.clone(),
            overlay: RwLock::new(Overlay::new(limits.head_frame_refs_max)),
            generation: AtomicU64::new(0),
            slice_lock: RwLock::new(()),
            durable_position: AtomicU64::new(0),
            quarantine: Mutex::new(quarantine),
            failure: Mutex::new(None),
            in_flight_blobs: Mutex::new(HashSet::new()),
            in_flight_records: Mutex::new(HashSet::new()),
            in_flight_overwrites: Mutex::new(std::collections::HashMap::new()),
            metrics: Metrics::default(),
        });
        replay(&shared, salvaging)?;
        // S-7: the log must reach every position acknowledged before: refuse to serve less.
        let present = shared.durable_position.load(Ordering::Acquire);
        let lost = acknowledged.filter(|acked| *acked > present);
        if let Some(acknowledged_through) = lost {
            if !salvaging {
                return Err(Error::AcknowledgedLost {
                    acknowledged_through,
                    present_through: present,
                });
            }
        }
        // Salvage only what was lost: a healthy store opened with `accept_loss` is opened
        // as usual, and its mark never lowered.
        let report = if lost.is_some() || mark_unreadable {
            tracing::error!(
                ?acknowledged,
                present,
                "the store lost acknowledged history; salvaging what remains"
            );
            Some(salvage_report(&shared, acknowledged, present)?)
        } else {
            None
        };
        let incarnation = record_incarnation(&shared.db)?;
        shared.db.flush()?;
        sync()?;
        // Written after the sync above, and never raised here: what this open found may
        // hold a tail that was written and never acknowledged (a crash before its fsync);
        // only the committer raises the mark, for groups it acknowledges. Lowered only to
        // what a salvage found.
        let mark = Acknowledged::open(&path, acknowledged.unwrap_or(0).min(present))?;

        let (sender, queue) = mpsc::channel(limits.queue_len_max.max(1));
        let committer_shared = Arc::clone(&shared);
        let (ready, is_ready) = std::sync::mpsc::channel();
        let committer = std::thread::Builder::new()
            .name("openprogram-committer".into())
            .spawn(move || log::run(committer_shared, queue, data_file, mark, ready))
            .map_err(io_error)?;
        // The replayed tail is materialized before the store takes work (S-6).
        is_ready.recv().map_err(|_| Error::Io {
            path: path.to_path_buf(),
            message: "the committer thread stopped while opening".into(),
        })??;
        spawn_ticker(&sender, &limits).map_err(io_error)?;
        tracing::info!(path = %path.display(), owner = %incarnation.owner_id, number = incarnation.number, "store opened");
        let store = Self {
            inner: Arc::new(Inner {
                shared,
                sender: Some(sender),
                committer: Some(committer),
                incarnation,
            }),
        };
        Ok((store, report))
    }

    fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    /// A blob as stored, its hash checked; for readers of durable data only (the blobs of a
    /// group not yet durable are refused by `EventStore::blob`).
    fn blob_on_disk(&self, hash: BlobHash) -> Result<Option<Vec<u8>>> {
        let key = keys::blob(hash);
        match self.shared().db.get(key)? {
            Some(bytes) if BlobHash::of(&bytes) == hash => Ok(Some(bytes.to_vec())),
            Some(_) => Err(Error::Corrupted {
                tree: "blobs",
                key: keys::display(&key),
            }),
            None => Ok(None),
        }
    }

    /// The position of the newest durable event.
    pub fn durable_position(&self) -> u64 {
        self.shared().durable_position.load(Ordering::Acquire)
    }

    fn metrics_snapshot(&self) -> MetricsSnapshot {
        let metrics = &self.shared().metrics;
        MetricsSnapshot {
            groups: metrics.groups.load(Ordering::Relaxed),
            transitions: metrics.transitions.load(Ordering::Relaxed),
            fsyncs: metrics.fsyncs.load(Ordering::Relaxed),
            fsync_micros_total: metrics.fsync_micros_total.load(Ordering::Relaxed),
            group_micros_total: metrics.group_micros_total.load(Ordering::Relaxed),
            flush_micros_total: metrics.flush_micros_total.load(Ordering::Relaxed),
            materializations: metrics.materializations.load(Ordering::Relaxed),
            replayed_frames: metrics.replayed_frames.load(Ordering::Relaxed),
            fenced: metrics.fenced.load(Ordering::Relaxed),
            purge_steps: metrics.purge_steps.load(Ordering::Relaxed),
            log_records_swept: metrics.log_records_swept.load(Ordering::Relaxed),
            queued: self.inner.sender.as_ref().map_or(0, |sender| {
                (sender.max_capacity() - sender.capacity()) as u64
            }),
        }
    }

    /// Every incarnation recorded in this store, oldest first.
    pub fn incarnations(&self) -> Result<Vec<Incarnation>> {
        let start = keys::incarnation(0);
        let end = keys::incarnation(u64::MAX);
        self.shared()
            .db
            .range(start..=end)
            .map(|item| {
                let (key, value) = item?;
                codec::decode(&key, &value)
            })
            .collect()
    }

    /// Reads the overlay, then disk, and retries if a materialization slice was written in
    /// between (see `overlay.rs`); after `READ_ATTEMPTS_MAX` tries it reads holding the slice
    /// lock, which no slice write can overlap.
    fn read_consistent<A, T>(
        &self,
        from_overlay: impl Fn(&Overlay) -> A,
        from_disk: impl Fn(A) -> Result<T>,
    ) -> Result<T> {
        let shared = self.shared();
        for _ in 0..READ_ATTEMPTS_MAX {
            let generation = shared.generation.load(Ordering::Acquire);
            if generation % 2 == 1 {
                std::thread::yield_now();
                continue; // a slice is being written
            }
            let seen = from_overlay(&shared.overlay_read());
            let result = from_disk(seen)?;
            if shared.generation.load(Ordering::Acquire) == generation {
                return Ok(result);
            }
        }
        // No slice can be in flight while this is held.
        let _no_slice = shared.slice_lock_read();
        let seen = from_overlay(&shared.overlay_read());
        from_disk(seen)
    }

    fn record<T>(&self, key: [u8; 17]) -> Result<Option<T>>
    where
        T: serde::de::DeserializeOwned,
        RecordValue: TryInto<T>,
    {
        self.read_consistent(
            |overlay| overlay.record(&key).cloned(),
            |cached| match cached {
                Some(record) => record.try_into().map(Some).map_err(|_| Error::Corrupted {
                    tree: keys::tree_name(&key),
                    key: keys::display(&key),
                }),
                // A rejection's record written by the group being committed is not
                // durable yet: absent until it is. Disk first, then the in-flight set (which
                // holds the key from before the batch is applied until after the fsync), so a
                // record read from disk is checked against the set as it is afterwards.
                None => {
                    let found = self.shared().record_on_disk(&key)?;
                    Ok(found.filter(|_| !self.shared().is_record_in_flight(&key)))
                }
            },
        )
    }
}

impl EventStore for Store {
    fn write_conversation(
        &self,
        write: crate::conversation::ConversationWrite,
    ) -> BoxFuture<'static, Result<crate::conversation::ConversationOutcome>> {
        if let Err(error) = write.check() {
            return futures::future::ready(Err(error)).boxed();
        }
        self.request(|reply| Request::Conversation { write, reply })
    }

    fn purge(
        &self,
        execution_id: ExecutionId,
        ended_key: Option<u64>,
        ended_before: Option<u64>,
    ) -> BoxFuture<'static, Result<PurgeStep>> {
        self.request(|reply| Request::Purge {
            execution_id,
            ended_key,
            ended_before,
            reply,
        })
    }

    fn sweep_log(
        &self,
        from_position: u64,
        max_records: usize,
    ) -> BoxFuture<'static, Result<SweepStep>> {
        self.request(|reply| Request::Sweep {
            from_position,
            max_records,
            reply,
        })
    }

    fn submit(&self, transition: Transition) -> BoxFuture<'static, Result<Outcome>> {
        let limits = &self.shared().limits;
        let checked = match self.shared().failure() {
            Some(reason) => Err(Error::FailStop(reason)),
            None => transition.check_sizes(limits.blob_bytes_max, limits.transition_bytes_max),
        };
        if let Err(error) = checked {
            return futures::future::ready(Err(error)).boxed();
        }
        let Some(sender) = &self.inner.sender else {
            return futures::future::ready(Err(Error::Closed)).boxed();
        };
        // Queued now when there is room: the future then holds only the answer's receiver,
        // a small allocation instead of one that carries the whole transition.
        let (reply, answer) = oneshot::channel();
        match sender.try_send(Request::Transition { transition, reply }) {
            Ok(()) => async move { answer.await.map_err(|_| Error::Closed)? }.boxed(),
            Err(mpsc::error::TrySendError::Full(request)) => {
                let sender = sender.clone();
                async move {
                    sender.send(request).await.map_err(|_| Error::Closed)?;
                    answer.await.map_err(|_| Error::Closed)?
                }
                .boxed()
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                futures::future::ready(Err(Error::Closed)).boxed()
            }
        }
    }
}

impl EventReader for Store {
    fn head(&self, execution_id: ExecutionId) -> Result<Option<ExecutionHead>> {
        self.shared().check_quarantine(execution_id)?;
        self.read_consistent(
            |overlay| overlay.current(execution_id).map(|(head, _)| head.clone()),
            |cached| match cached {
                Some(head) => Ok(Some(head)),
                None => self.shared().head_on_disk(execution_id),
            },
        )
    }

    fn events_after(
        &self,
        execution_id: ExecutionId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<EventEnvelope>> {
        self.shared().check_quarantine(execution_id)?;
        let result = self.read_consistent(
            |overlay| overlay.frame_refs_after(execution_id, after_seq),
            |pending| {
                let mut refs = self.frame_refs_on_disk(execution_id, after_seq, limit)?;
                refs.extend(pending);
                self.events_at(execution_id, refs, after_seq, limit)
            },
        );
        self.shared().quarantine_on_corruption(execution_id, result)
    }

    fn log_after(&self, after_position: u64, limit: usize) -> Result<Vec<EventEnvelope>> {
        self.read_log_after(after_position, limit)
    }

    fn command(&self, command_id: CommandId) -> Result<Option<CommandRecord>> {
        self.record(keys::command(command_id))
    }

    fn receipt(&self, effect_id: EffectId) -> Result<Option<ReceiptRecord>> {
        self.record(keys::receipt(effect_id))
    }

    fn wait(&self, wait_id: WaitId) -> Result<Option<WaitRecord>> {
        self.record(keys::wait(wait_id))
    }

    fn process(&self, process_id: ProcessId) -> Result<Option<ProcessRecord>> {
        self.record(keys::process(process_id))
    }

    fn job(&self, job_id: ExecutionId) -> Result<Option<JobRecord>> {
        self.record(keys::job(job_id))
    }

    fn session(&self, session_id: SessionId) -> Result<Option<crate::records::SessionRecord>> {
        self.record(keys::session(session_id))
    }

    fn conversation(
        &self,
        session_id: SessionId,
    ) -> Result<Option<crate::conversation::ConversationRecord>> {
        // Written straight to its key by the committer, never through the overlay.
        // Disk first, then the group in flight (its entry made before its batch is applied,
        // dropped after the fsync): while it rewrites the record, its durable value is read.
        let key = keys::conversation(session_id);
        let on_disk = self.shared().db.get(key)?;
        let bytes = match self.shared().overwritten(&key) {
            Some(durable) => durable,
            None => on_disk,
        };
        match bytes {
            Some(bytes) => crate::codec::decode(&key, &bytes).map(Some),
            None => Ok(None),
        }
    }

    fn projection(&self, execution_id: ExecutionId) -> Result<Option<ProjectionRecord>> {
        self.shared().check_quarantine(execution_id)?;
        self.record(keys::projection(execution_id))
    }

    fn purged(&self, execution_id: ExecutionId) -> Result<Option<PurgedRecord>> {
        self.read_purged(execution_id)
    }

    fn ended_before(
        &self,
        before_ms: u64,
        after: Option<(u64, ExecutionId)>,
        limit: usize,
    ) -> Result<Vec<(u64, ExecutionId)>> {
        self.read_ended_before(before_ms, after, limit)
    }

    fn purges_unfinished(&self) -> Result<Vec<ExecutionId>> {
        self.read_purges_unfinished()
    }

    fn disk_bytes(&self) -> u64 {
        crate::shared::disk_bytes(&self.shared().path)
    }

    fn executions_in_session(&self, session_id: SessionId) -> Result<Vec<ExecutionId>> {
        self.read_consistent(
            |overlay| overlay.in_session(session_id),
            |held| {
                let mut found: BTreeSet<ExecutionId> = held.into_iter().collect();
                for item in self
                    .shared()
                    .db
                    .scan_prefix(keys::by_session_prefix(session_id))
                {
                    let (key, _) = item?;
                    let execution_id =
                        keys::execution_at(&key, 17).ok_or_else(|| Error::Corrupted {
                            tree: "by_session",
                            key: keys::display(&key),
                        })?;
                    found.insert(execution_id);
                }
                Ok(found.into_iter().collect())
            },
        )
    }

    fn sessions(&self) -> Result<Vec<(SessionId, usize)>> {
        self.read_consistent(
            |overlay| overlay.sessions(),
            |held| {
                let mut found: std::collections::BTreeMap<SessionId, BTreeSet<ExecutionId>> =
                    std::collections::BTreeMap::new();
                for (session_id, execution_id) in held {
                    found.entry(session_id).or_default().insert(execution_id);
                }
                for item in self.shared().db.scan_prefix([keys::BY_SESSION]) {
                    let (key, _) = item?;
                    let corrupted = || Error::Corrupted {
                        tree: "by_session",
                        key: keys::display(&key),
                    };
                    let session_id = keys::session_at(&key, 1).ok_or_else(corrupted)?;
                    let execution_id = keys::execution_at(&key, 17).ok_or_else(corrupted)?;
                    found.entry(session_id).or_default().insert(execution_id);
                }
                Ok(found.into_iter().map(|(id, all)| (id, all.len())).collect())
            },
        )
    }

    fn processes(&self) -> Result<Vec<ProcessRecord>> {
        self.read_consistent(
            |overlay| overlay.processes(),
            |mut found| {
                for item in self.shared().db.scan_prefix([keys::PROCESS]) {
                    let (key, bytes) = item?;
                    let Ok(key) = <[u8; 17]>::try_from(key.as_ref()) else {
                        return Err(Error::Corrupted {
                            tree: "processes",
                            key: keys::display(&key),
                        });
                    };
                    if found.contains_key(&key) {
                        continue; // newer in the overlay
                    }
                    let record: RecordValue = codec::decode(&key, &bytes)?;
                    let RecordValue::Process(process) = record else {
                        return Err(Error::Corrupted {
                            tree: "processes",
                            key: keys::display(&key),
                        });
                    };
                    found.insert(key, process);
                }
                Ok(found.into_values().collect())
            },
        )
    }

    fn blob(&self, hash: BlobHash) -> Result<Option<Vec<u8>>> {
        // Read first, then ask whether it is in flight: the other order could miss a blob
        // the committer inserted (not yet durable) between the two.
        let found = self.blob_on_disk(hash)?;
        let in_flight = self
            .shared()
            .in_flight_blobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(&hash);
        Ok(found.filter(|_| !in_flight))
    }

    fn executions_in_state(&self, state: ExecutionState) -> Result<Vec<ExecutionId>> {
        if state.is_terminal() {
            return Ok(Vec::new());
        }
        self.read_consistent(
            |overlay| overlay.state_changes(state),
            |(added, removed)| {
                let mut found = BTreeSet::new();
                for item in self.shared().db.scan_prefix(keys::by_state_prefix(state)) {
                    let (key, _) = item?;
                    let execution_id =
                        keys::execution_at(&key, 2).ok_or_else(|| Error::Corrupted {
                            tree: "by_state",
                            key: keys::display(&key),
                        })?;
                    found.insert(execution_id);
                }
                for execution_id in removed {
                    found.remove(&execution_id);
                }
                found.extend(added);
                Ok(found.into_iter().collect())
            },
        )
    }

    fn quarantined(&self) -> Vec<(ExecutionId, String)> {
        let quarantine = self
            .shared()
            .quarantine
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        quarantine
            .iter()
            .map(|(id, reason)| (*id, reason.clone()))
            .collect()
    }

    fn incarnation(&self) -> &Incarnation {
        &self.inner.incarnation
    }

    fn metrics(&self) -> MetricsSnapshot {
        self.metrics_snapshot()
    }

    fn histograms(&self) -> Vec<crate::NamedHistogram> {
        self.shared().metrics.histograms()
    }

    fn log_end(&self) -> Result<u64> {
        Ok(self.durable_position())
    }

    fn failure(&self) -> Option<String> {
        self.shared().failure()
    }
}

/// Starts the thread that sends `Request::Tick` to the committer every eighth of the
/// materialization interval. It holds only a weak sender, so it never keeps the queue open:
/// once the store closes, its next tick finds the queue gone and it ends.
fn spawn_ticker(sender: &mpsc::Sender<Request>, limits: &Limits) -> std::io::Result<()> {
    let weak = sender.downgrade();
    let tick = std::time::Duration::from_millis((limits.materialize_interval_ms / 8).max(5));
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
