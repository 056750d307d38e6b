//! The sled store's handle (`Store`): opened by `open.rs`, it submits transitions and the
//! other requests to the committer (`log.rs`) and reads (`store/reads.rs`). The API it
//! implements, and PostgreSQL's store too, is `event_store.rs`.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};
use std::thread::JoinHandle;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::sync::{mpsc, oneshot};

use crate::codec::{self, DecodedFrame, FrameRef, RecordValue};
use crate::error::{Error, Result};
use crate::event::EventEnvelope;
use crate::event_store::{PurgeStep, SweepStep};
use crate::ids::{CommandId, EffectId, ExecutionId, ProcessId, SessionId, WaitId};
use crate::keys;
use crate::log::{self, Request};
use crate::open::{self, Opened, SalvageReport};
use crate::overlay::Overlay;
use crate::records::{
    BlobHash, CommandRecord, ExecutionHead, ExecutionState, JobRecord, ProcessRecord,
    ProjectionRecord, PurgedRecord, ReceiptRecord, WaitRecord,
};
use crate::shared::Shared;
use crate::transition::{Outcome, Transition};

mod reads;
mod retention;

pub use crate::event_store::{EventReader, EventStore};
pub use crate::open::{Incarnation, SEGMENT_BYTES};
pub use crate::shared::{Limits, MetricsSnapshot};

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
        let Opened {
            shared,
            data_file,
            acknowledged,
            incarnation,
            report,
        } = open::open(path, limits, salvaging)?;
        // The replayed tail is materialized before the store takes work (S-6).
        let (sender, committer) = log::spawn(&shared, data_file, acknowledged)?;
        tracing::info!(path = %path.display(), owner = %incarnation.owner_id, number = incarnation.number, "store opened");
        let inner = Inner {
            shared,
            sender: Some(sender),
            committer: Some(committer),
            incarnation,
        };
        Ok((
            Self {
                inner: Arc::new(inner),
            },
            report,
        ))
    }

    fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    /// The position of the newest durable event.
    pub fn durable_position(&self) -> u64 {
        self.shared().durable_position.load(Ordering::Acquire)
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
        let found = self.shared().blob_on_disk(hash)?;
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
        self.shared().quarantined()
    }

    fn incarnation(&self) -> &Incarnation {
        &self.inner.incarnation
    }

    fn metrics(&self) -> MetricsSnapshot {
        let queued = self.inner.sender.as_ref().map_or(0, |sender| {
            (sender.max_capacity() - sender.capacity()) as u64
        });
        self.shared().metrics.snapshot(1, queued)
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
