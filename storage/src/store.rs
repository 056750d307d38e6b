//! The sled store's handle (`Store`): opened by `open.rs`, it submits transitions and the
//! other requests to the committer (`log.rs`) and reads (`store/reads.rs`). The API it
//! implements, and PostgreSQL's store too, is `event_store.rs`.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
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
use crate::shared::{lock, Shared};
use crate::transition::{Outcome, Transition};

mod reads;

pub use crate::event_store::{EventReader, EventStore};
pub use crate::open::Incarnation;
pub use crate::shared::{Limits, MetricsSnapshot};
pub use crate::sled_db::SEGMENT_BYTES;

/// A handle on an open store. Cheap to clone; the store closes at `close`, or when the last
/// handle drops, after the committer has written everything queued.
#[derive(Debug, Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shared: Arc<Shared>,
    sender: Option<mpsc::Sender<Request>>,
    /// The committer's thread, until the store is closed.
    committer: Mutex<Option<JoinHandle<()>>>,
    incarnation: Incarnation,
}

impl Inner {
    /// Closes the committer's queue (it answers what is in it, then stops), waits for it,
    /// then closes sled and releases the store's lock. Blocks; every caller returns once it
    /// is done.
    fn close(&self) -> Result<()> {
        let mut committer = lock(&self.committer);
        if let Some(committer) = committer.take() {
            if let Some(sender) = &self.sender {
                // Refused only if the committer stopped already.
                let _ = futures::executor::block_on(sender.send(Request::Close));
            }
            if committer.join().is_err() {
                tracing::error!("the committer thread panicked");
            }
        }
        self.shared.close()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Err(error) = self.close() {
            tracing::error!(%error, "closing the store");
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
            journal,
            incarnation,
            report,
        } = open::open(path, limits, salvaging)?;
        // The replayed tail is materialized before the store takes work (S-6).
        let (sender, committer) = log::spawn(&shared, data_file, acknowledged, journal)?;
        tracing::info!(path = %path.display(), owner = %incarnation.owner_id, number = incarnation.number, "store opened");
        let inner = Inner {
            shared,
            sender: Some(sender),
            committer: Mutex::new(Some(committer)),
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

    /// Closes the store: what is queued is committed and answered, later requests and reads
    /// answer `Closed`, sled is flushed and let go, and the directory's lock is released, so
    /// the directory can be opened again (or removed) once this returns.
    pub fn close(&self) -> BoxFuture<'static, Result<()>> {
        let inner = Arc::clone(&self.inner);
        crate::event_store::off_thread(move || inner.close())
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
            .db()?
            .range(start..=end)
            .map(|item| {
                let (key, value) = item?;
                codec::decode(&key, &value)
            })
            .collect()
    }

    /// Queues a request other than a transition and waits for its answer.
    fn request<T: Send + 'static>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T>>) -> Request,
    ) -> BoxFuture<'static, Result<T>> {
        if let Some(reason) = self.shared().refusals.failure() {
            return futures::future::ready(Err(Error::FailStop(reason))).boxed();
        }
        let Some(sender) = self.inner.sender.clone() else {
            return futures::future::ready(Err(Error::Closed)).boxed();
        };
        let (reply, answer) = oneshot::channel();
        let request = make(reply);
        async move {
            sender.send(request).await.map_err(|_| Error::Closed)?;
            answer.await.map_err(|_| Error::Closed)?
        }
        .boxed()
    }
}

impl EventStore for Store {
    fn close(&self) -> BoxFuture<'static, Result<()>> {
        Store::close(self)
    }

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
        let checked = match self.shared().refusals.failure() {
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
