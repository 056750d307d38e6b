//! State shared by the committer thread and the readers of one open store: the sled
//! handle, the overlay, counters, quarantine and fail-stop flags, and the store's limits.
//! It does not decide anything: the committer (`log.rs`) writes, `store.rs` reads.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::codec::{self, RecordValue};
use crate::error::{Error, Result};
use crate::head_record::{self, HeadIndex};
use crate::histogram::{Histogram, NamedHistogram};
use crate::history::Segments;
use crate::ids::ExecutionId;
use crate::keys;
use crate::overlay::Overlay;
use crate::records::{
    BlobHash, CommandRecord, ExecutionHead, JobRecord, ProcessRecord, ProjectionRecord,
    ReceiptRecord, WaitRecord,
};
use crate::transition::Outcome;

/// Bounds of the store. Every queue and batch has one.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Transitions waiting for the committer; a full queue makes `submit` wait
    /// (backpressure) rather than grow memory.
    pub queue_len_max: usize,
    /// Transitions the committer takes into one group commit.
    pub batch_len_max: usize,
    /// Encoded size of one transition (head, events and records, admission inputs included)
    /// when submitted; the committer checks its frame again (inputs stored as blobs apart).
    pub transition_bytes_max: usize,
    /// Size of one blob (S-5).
    pub blob_bytes_max: usize,
    /// Dirty executions and records kept before they are written to their own keys; also
    /// bounds the log tail replayed at open.
    pub overlay_len_max: usize,
    /// Longest time between two materializations while transitions arrive.
    pub materialize_interval_ms: u64,
    /// Entries of a running materialization written with each group commit (at least; see
    /// `log.rs`), so that no single commit waits for a whole materialization.
    pub materialize_slice_len: usize,
    /// sled's page cache. Without a bound it keeps everything written in memory, so parked
    /// executions would cost memory, not just disk.
    pub cache_bytes: u64,
    /// Frame refs (where an execution's newest events are in the log) its head record keeps
    /// before they move to an index chunk: below it, a materialization writes one key per
    /// execution instead of two. 0: every materialization writes a chunk. Every read of a
    /// head decodes them, so a few dozen at most.
    pub head_frame_refs_max: usize,
    /// sled's files are copied into a new generation (`generation.rs`) once they have grown
    /// by this share (in percent) of their size after the last copy...
    pub sled_copy_growth_percent: u64,
    /// ...and by at least this many bytes.
    pub sled_copy_min_growth_bytes: u64,
    /// How often the committer looks at the size of sled's files.
    pub sled_copy_check_ms: u64,
    /// The size of a journal segment, where history lives (`history.rs`).
    pub journal_segment_bytes: u64,
    /// Zeros are written a little ahead of the journal's frames (`zero_ahead.rs`), so that a
    /// group's fdatasync allocates no blocks. Off where that gains nothing: a copy-on-write
    /// file system (btrfs, ZFS) only writes them twice.
    pub journal_zero_ahead: bool,
    /// How long no record has left a mostly dead journal segment before the records still
    /// living in it are copied forward, so that it goes (what is dying soon is left to die).
    pub relocate_settled_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            queue_len_max: 16 * 1024,
            batch_len_max: 4 * 1024,
            transition_bytes_max: 1024 * 1024,
            blob_bytes_max: 8 * 1024 * 1024,
            overlay_len_max: 64 * 1024,
            materialize_interval_ms: 250,
            materialize_slice_len: 32,
            cache_bytes: 64 * 1024 * 1024,
            head_frame_refs_max: 16,
            sled_copy_growth_percent: 100,
            sled_copy_min_growth_bytes: 64 * 1024 * 1024,
            sled_copy_check_ms: 2_000,
            journal_segment_bytes: crate::journal::SEGMENT_BYTES,
            journal_zero_ahead: true,
            relocate_settled_ms: 30_000,
        }
    }
}

impl Limits {
    /// Every bound must let work through: a zero would stall the queue, the groups or the
    /// materialization.
    pub fn validate(&self) -> Result<()> {
        let bounds = [
            ("queue_len_max", self.queue_len_max),
            ("batch_len_max", self.batch_len_max),
            ("transition_bytes_max", self.transition_bytes_max),
            ("overlay_len_max", self.overlay_len_max),
            ("materialize_slice_len", self.materialize_slice_len),
        ];
        if let Some((name, _)) = bounds.iter().find(|(_, value)| *value == 0) {
            return Err(Error::InvalidLimits(format!("{name} must be at least 1")));
        }
        match self.journal_segment_bytes < 64 * 1024 {
            true => Err(Error::InvalidLimits(
                "journal_segment_bytes must be at least 64 KiB".into(),
            )),
            false => Ok(()),
        }
    }
}

/// Counters and histograms of the write path, for `/metrics` and benchmarks.
#[derive(Debug)]
pub(crate) struct Metrics {
    /// Each group commit's wall time, from taking the group to its fsync.
    pub group_seconds: Histogram,
    /// Each group's fsync (sled: the journal's fdatasync; PostgreSQL: the COMMIT, its WAL flush).
    pub fsync_seconds: Histogram,
    /// Transitions per group commit.
    pub group_transitions: Histogram,
    pub groups: AtomicU64,
    pub transitions: AtomicU64,
    pub fsyncs: AtomicU64,
    pub fsync_micros_total: AtomicU64,
    /// Wall time the committer spent on group commits, from taking a group to answering it.
    pub group_micros_total: AtomicU64,
    /// Wall time writing each group's journal frame (and the flusher's sled `flush()`).
    pub flush_micros_total: AtomicU64,
    pub materializations: AtomicU64,
    pub replayed_frames: AtomicU64,
    pub fenced: AtomicU64,
    pub purge_steps: AtomicU64,
    pub log_records_swept: AtomicU64,
    pub sled_generations: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            group_seconds: Histogram::latency(),
            fsync_seconds: Histogram::latency(),
            group_transitions: Histogram::sizes(),
            groups: AtomicU64::default(),
            transitions: AtomicU64::default(),
            fsyncs: AtomicU64::default(),
            fsync_micros_total: AtomicU64::default(),
            group_micros_total: AtomicU64::default(),
            flush_micros_total: AtomicU64::default(),
            materializations: AtomicU64::default(),
            replayed_frames: AtomicU64::default(),
            fenced: AtomicU64::default(),
            purge_steps: AtomicU64::default(),
            log_records_swept: AtomicU64::default(),
            sled_generations: AtomicU64::default(),
        }
    }
}

impl Metrics {
    /// An outcome that wrote nothing, counted (`fenced`) on its way to the caller.
    pub(crate) fn answered(&self, outcome: Outcome) -> Outcome {
        if let Outcome::Fenced { .. } = outcome {
            self.fenced.fetch_add(1, Ordering::Relaxed);
        }
        outcome
    }

    /// The write path's histograms, as `/metrics` shows them.
    pub fn histograms(&self) -> Vec<NamedHistogram> {
        let named = |name, help, histogram: &Histogram| NamedHistogram {
            name,
            help,
            labels: String::new(),
            snapshot: histogram.snapshot(),
        };
        vec![
            named(
                "group_commit_seconds",
                "Each group commit's wall time: validate, write, flush, fsync.",
                &self.group_seconds,
            ),
            named(
                "fsync_seconds",
                "Each group commit's fsync (embedded store: the journal's; PostgreSQL: the COMMIT, which waits for the WAL flush).",
                &self.fsync_seconds,
            ),
            named(
                "group_commit_transitions",
                "Transitions per group commit.",
                &self.group_transitions,
            ),
        ]
    }

    /// A copy of the counters; a store of several `committers` reports the mean of their
    /// busy times. `queued`: the requests waiting now.
    pub(crate) fn snapshot(&self, committers: u64, queued: u64) -> MetricsSnapshot {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        MetricsSnapshot {
            groups: read(&self.groups),
            transitions: read(&self.transitions),
            fsyncs: read(&self.fsyncs),
            fsync_micros_total: read(&self.fsync_micros_total) / committers,
            group_micros_total: read(&self.group_micros_total) / committers,
            flush_micros_total: read(&self.flush_micros_total),
            materializations: read(&self.materializations),
            replayed_frames: read(&self.replayed_frames),
            fenced: read(&self.fenced),
            purge_steps: read(&self.purge_steps),
            log_records_swept: read(&self.log_records_swept),
            sled_generations: read(&self.sled_generations),
            queued,
        }
    }
}

/// The wall clock the stores stamp on what they write (events, heads, incarnations).
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as u64)
        .unwrap_or(0)
}

/// Adds the time since `since` to a counter of microseconds.
pub(crate) fn add_elapsed_micros(counter: &AtomicU64, since: Instant) {
    counter.fetch_add(since.elapsed().as_micros() as u64, Ordering::Relaxed);
}

/// A copy of the write-path counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MetricsSnapshot {
    pub groups: u64,
    pub transitions: u64,
    pub fsyncs: u64,
    /// Wall time in the fsyncs (with the fsync of any file sled put under `blobs/`, whose
    /// listing is read each time).
    pub fsync_micros_total: u64,
    /// Wall time the committer spent on group commits: over a run's wall time, how busy the
    /// one writer was (near 100%, the store is what limits throughput). A store with
    /// several committers (PostgreSQL's) reports their mean, here and in the fsync time.
    pub group_micros_total: u64,
    /// Wall time in sled's `flush()`: sled writing its buffers and waiting for the disk,
    /// before our fsync. Part of `group_micros_total`, except for the materializations at
    /// open (of a replayed tail) and at close, which are not group commits.
    pub flush_micros_total: u64,
    pub materializations: u64,
    /// Log frames replayed when the store was opened: the unmaterialized tail (S-6).
    pub replayed_frames: u64,
    /// Writes refused because a newer attempt holds the execution.
    pub fenced: u64,
    /// S-8: purge steps written, and log records the sweep removed.
    pub purge_steps: u64,
    pub log_records_swept: u64,
    /// Times sled was copied into a new generation, which it then used (S-9).
    pub sled_generations: u64,
    /// Requests waiting in the committer's queue now (its mailbox depth).
    pub queued: u64,
}

/// A lock whose holder panicked is still usable: no update under the stores' locks can be
/// left half-done (each is one assignment or a completed merge).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What a store refuses, whichever its engine: the executions quarantined for a corrupted
/// record (S-4), and every write once it stopped acknowledging (fail-stop).
#[derive(Debug, Default)]
pub(crate) struct Refusals {
    quarantine: Mutex<BTreeMap<ExecutionId, String>>,
    failure: Mutex<Option<String>>,
}

impl Refusals {
    pub fn new(quarantine: BTreeMap<ExecutionId, String>) -> Self {
        Self {
            quarantine: Mutex::new(quarantine),
            failure: Mutex::new(None),
        }
    }

    /// Why the store stopped acknowledging, if it did.
    pub fn failure(&self) -> Option<String> {
        lock(&self.failure).clone()
    }

    /// Stops acknowledging from now on; the first reason stays.
    pub fn fail(&self, reason: String) {
        lock(&self.failure).get_or_insert(reason);
    }

    pub fn check_quarantine(&self, execution_id: ExecutionId) -> Result<()> {
        match lock(&self.quarantine).get(&execution_id) {
            Some(reason) => Err(Error::Quarantined {
                execution_id,
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Refuses the execution from now on; the first reason stays.
    pub fn quarantine(&self, execution_id: ExecutionId, reason: String) {
        tracing::error!(%execution_id, %reason, "execution quarantined");
        lock(&self.quarantine).entry(execution_id).or_insert(reason);
    }

    /// Executions refused for corrupted records, with the reason, in id order.
    pub fn quarantined(&self) -> Vec<(ExecutionId, String)> {
        let quarantine = lock(&self.quarantine);
        quarantine
            .iter()
            .map(|(id, why)| (*id, why.clone()))
            .collect()
    }
}

/// State shared by the committer thread and readers.
#[derive(Debug)]
pub(crate) struct Shared {
    /// sled, and which generation of it (`generation.rs`): read through `db()`; `None`
    /// once the store is closed.
    sled: RwLock<(Option<sled::Db>, u64)>,
    /// The store's lock (`open.rs`), held until the store is closed.
    lock: Mutex<Option<std::fs::File>>,
    pub path: PathBuf,
    pub limits: Limits,
    pub(crate) overlay: RwLock<Overlay>,
    /// Odd while a materialization slice is being applied to sled and the overlay has not
    /// dropped it yet; bumped before and after. Readers that see the same even value before and
    /// after reading the overlay and then disk saw a consistent state.
    pub seqlock: AtomicU64,
    /// Held (write) by the committer from applying a slice to sled until the overlay has
    /// dropped it; readers that keep missing a stable seqlock take it (read) instead.
    pub(crate) slice_lock: RwLock<()>,
    /// Where the log records live (`history.rs`): read through `Segments::record`.
    pub history: Arc<Segments>,
    /// The position of the newest event on disk (fsynced).
    pub durable_position: AtomicU64,
    pub refusals: Refusals,
    /// Blobs written by the group being committed: on sled, not yet durable, not readable.
    pub in_flight_blobs: Mutex<HashSet<BlobHash>>,
    /// Records written to their own keys by the group being committed (a rejection's
    /// command record): on sled, not yet durable, not readable.
    pub in_flight_records: Mutex<HashSet<[u8; 17]>>,
    /// Records the group being committed rewrites at their own keys (a conversation
    /// record), with the durable value each had before (`None`: none): read instead of the
    /// new value until the group is durable.
    pub in_flight_overwrites: Mutex<HashMap<[u8; 17], Option<sled::IVec>>>,
    pub metrics: Metrics,
}

impl Shared {
    /// The state of a store `open` is opening: nothing replayed yet.
    pub fn new(
        (db, generation, lock): (sled::Db, u64, std::fs::File),
        path: PathBuf,
        limits: Limits,
        quarantine: BTreeMap<ExecutionId, String>,
        history: Arc<Segments>,
    ) -> Self {
        Self {
            sled: RwLock::new((Some(db), generation)),
            lock: Mutex::new(Some(lock)),
            path,
            history,
            overlay: RwLock::new(Overlay::new(limits.head_frame_refs_max)),
            limits,
            seqlock: AtomicU64::new(0),
            slice_lock: RwLock::new(()),
            durable_position: AtomicU64::new(0),
            refusals: Refusals::new(quarantine),
            in_flight_blobs: Mutex::new(HashSet::new()),
            in_flight_records: Mutex::new(HashSet::new()),
            in_flight_overwrites: Mutex::new(HashMap::new()),
            metrics: Metrics::default(),
        }
    }

    /// The store's sled (a handle: it stays readable after a switch of generation), or
    /// `Closed` once the store is closed.
    pub fn db(&self) -> Result<sled::Db> {
        let sled = self.sled.read().unwrap_or_else(PoisonError::into_inner);
        sled.0.clone().ok_or(Error::Closed)
    }

    /// `Closed` once the store is closed: what a read that may not reach sled checks first.
    pub fn check_open(&self) -> Result<()> {
        let sled = self.sled.read().unwrap_or_else(PoisonError::into_inner);
        sled.0.as_ref().map(|_| ()).ok_or(Error::Closed)
    }

    /// The value at `key` in the store's sled now.
    pub fn get(&self, key: &[u8]) -> Result<Option<sled::IVec>> {
        Ok(self.db()?.get(key)?)
    }

    /// Closes the store once its committer has stopped: drops sled, waits until sled's own
    /// threads have let its files go (they may hold them a few milliseconds after the last
    /// handle), then releases the store's lock. Reads after it answer `Closed`; another
    /// opener, in this process or another, can open the directory at once.
    pub fn close(&self) -> Result<()> {
        let Some(lock) = lock(&self.lock).take() else {
            return Ok(());
        };
        let dir = self.generation_of_sled().1;
        let db = self
            .sled
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .take();
        drop(db);
        let released = crate::sled_db::wait_until_released(&dir.join("db"));
        drop(lock);
        released
    }

    /// The generation of sled in use, and its directory.
    pub fn generation_of_sled(&self) -> (u64, PathBuf) {
        let number = self.sled.read().unwrap_or_else(PoisonError::into_inner).1;
        (number, crate::generation::dir_of(&self.path, number))
    }

    /// Makes `db`, generation `number`, the store's sled (`generation.rs`); between two
    /// groups, with `seqlock` bumped so that a reader across it reads again.
    pub fn switch_sled(&self, db: sled::Db, number: u64) {
        self.seqlock.fetch_add(2, Ordering::AcqRel);
        *self.sled.write().unwrap_or_else(PoisonError::into_inner) = (Some(db), number);
    }

    pub fn overlay_read(&self) -> RwLockReadGuard<'_, Overlay> {
        self.overlay.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn slice_lock_write(&self) -> RwLockWriteGuard<'_, ()> {
        self.slice_lock
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub fn slice_lock_read(&self) -> RwLockReadGuard<'_, ()> {
        self.slice_lock
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub fn overlay_write(&self) -> RwLockWriteGuard<'_, Overlay> {
        self.overlay.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The group is durable: its blobs and records become readable.
    pub fn in_flight_blobs_clear(&self) {
        lock(&self.in_flight_blobs).clear();
        lock(&self.in_flight_records).clear();
        lock(&self.in_flight_overwrites).clear();
    }

    /// Quarantines the execution a frame of the log record at `key` is of (as far as its
    /// header tells): the frame `why`.
    pub fn quarantine_frame(&self, execution_id: ExecutionId, key: &[u8], why: &str) {
        let at = keys::display(key);
        let reason = format!("a frame of the log record at {at} {why}");
        self.refusals.quarantine(execution_id, reason);
    }

    /// Quarantines the execution when `result` is a corruption of one of its records.
    pub fn quarantine_on_corruption<T>(
        &self,
        execution_id: ExecutionId,
        result: Result<T>,
    ) -> Result<T> {
        if let Err(error @ Error::Corrupted { .. }) = &result {
            self.refusals.quarantine(execution_id, error.to_string());
        }
        result
    }

    /// Where the log's materialization reached: every frame up to it is in its own keys.
    pub fn materialized_through(&self) -> Result<u64> {
        let key = keys::meta(keys::META_MATERIALIZED_THROUGH);
        match self.db()?.get(&key)? {
            Some(bytes) => codec::decode(&key, &bytes),
            None => Ok(0),
        }
    }

    /// A blob as stored, its hash checked; for readers of durable data only (the blobs of a
    /// group not yet durable are refused by `EventReader::blob`).
    pub fn blob_on_disk(&self, hash: BlobHash) -> Result<Option<Vec<u8>>> {
        let key = keys::blob(hash);
        match self.db()?.get(key)? {
            Some(bytes) if BlobHash::of(&bytes) == hash => Ok(Some(bytes.to_vec())),
            Some(_) => Err(Error::corrupted(&key)),
            None => Ok(None),
        }
    }

    pub fn head_on_disk(&self, execution_id: ExecutionId) -> Result<Option<ExecutionHead>> {
        Ok(self
            .head_record_on_disk(execution_id)?
            .map(|(head, _)| head))
    }

    /// The index of an execution's head record on disk (a materialization that does not
    /// know it reads it).
    pub fn head_index_on_disk(&self, execution_id: ExecutionId) -> Result<Option<HeadIndex>> {
        Ok(self
            .head_record_on_disk(execution_id)?
            .map(|(_, index)| index))
    }

    /// The head record on disk: the head, and where its newest events are.
    pub fn head_record_on_disk(
        &self,
        execution_id: ExecutionId,
    ) -> Result<Option<(ExecutionHead, HeadIndex)>> {
        let key = keys::head(execution_id);
        let result = match self.db()?.get(key)? {
            Some(bytes) => head_record::decode(&key, &bytes).map(Some),
            None => Ok(None),
        };
        self.quarantine_on_corruption(execution_id, result)
    }

    pub fn record_on_disk<T>(&self, key: &[u8]) -> Result<Option<T>>
    where
        RecordValue: TryInto<T>,
    {
        match self.db()?.get(key)? {
            Some(bytes) => typed(key, codec::decode(key, &bytes)?).map(Some),
            None => Ok(None),
        }
    }

    /// A record as committed: the overlay's (`cached`, read by the caller), else disk's.
    pub fn record_or_disk<T>(&self, key: &[u8], cached: Option<RecordValue>) -> Result<Option<T>>
    where
        RecordValue: TryInto<T>,
    {
        match cached {
            Some(record) => typed(key, record).map(Some),
            None => self.record_on_disk(key),
        }
    }

    /// A record as committed, read by the committer (which sees no group in flight but its
    /// own): the overlay's, else disk's.
    pub fn committed_record<T>(&self, key: &[u8; 17]) -> Result<Option<T>>
    where
        RecordValue: TryInto<T>,
    {
        let cached = self.overlay_read().record(key).cloned();
        self.record_or_disk(key, cached)
    }
}

/// `record` as the type its key holds; another is a corruption of that key.
fn typed<T>(key: &[u8], record: RecordValue) -> Result<T>
where
    RecordValue: TryInto<T>,
{
    record.try_into().map_err(|_| Error::corrupted(key))
}

macro_rules! record_conversion {
    ($variant:ident, $record:ty) => {
        impl TryFrom<RecordValue> for $record {
            type Error = ();
            fn try_from(value: RecordValue) -> std::result::Result<Self, ()> {
                match value {
                    RecordValue::$variant(record) => Ok(record),
                    _ => Err(()),
                }
            }
        }
    };
}
record_conversion!(Command, CommandRecord);
record_conversion!(Receipt, ReceiptRecord);
record_conversion!(Wait, WaitRecord);
record_conversion!(Process, ProcessRecord);
record_conversion!(Job, JobRecord);
record_conversion!(Projection, ProjectionRecord);
record_conversion!(Session, crate::records::SessionRecord);
