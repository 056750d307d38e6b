//! The PostgreSQL backend of `EventStore` (feature `postgres`): the event log of several
//! runtime nodes on one database. Same contract as the sled store (S-2): a
//! transition's version check, fencing check, events, head and records commit in one SQL
//! transaction, and many transitions share one (group commit), so throughput follows the
//! database's commit rate rather than one round trip per step.
//!
//! - `pg/schema.rs` — the tables and their versioned migrations (S-1).
//! - `pg/commit.rs` — the committer threads: one SQL transaction per group.
//! - `pg/group.rs` — a group: what it reads and locks, its decisions, the rows it writes.
//! - `pg/statements.rs` — the group's prepared statements and the numbers readers share.
//! - `pg/reads.rs` — `EventReader`, served by a small pool of reader threads.
//! - `pg/mark.rs` — the highest position a node saw acknowledged, kept beside its data (S-7).
//! - `pg/baseline.rs` — the database's raw insert rate, the ceiling `load` compares with.
//!
//! Threads, not tasks: each committer and each reader own a blocking client (the `postgres`
//! crate) on a thread of their own, as the sled store's committer does. A read called from
//! an actor blocks that thread for one round trip, as a sled read blocks it for a page-in;
//! it never runs a client on a runtime thread (the blocking client would refuse).
//!
//! Positions (`log_after`'s cursor) are counted from each group's transaction id
//! (`pg/commit.rs`), not handed out under a lock: a group committing later may hold a lower
//! position than one already visible, so `log_after` returns only positions below the oldest
//! transaction still running (`pg/reads.rs`) — a reader's cursor never moves past a position
//! that may still appear.

pub mod baseline;
mod commit;
mod conversation;
mod group;
pub mod local;
mod mark;
mod readers;
mod reads;
pub mod schema;
mod statements;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, Result};
use crate::event_store::{EventStore, NodeRecord, PurgeStep, SweepStep};
use crate::ids::{ExecutionId, OwnerId};
use crate::open::{Incarnation, SalvageReport};
use crate::shared::{lock, Limits, Metrics, MetricsSnapshot, Refusals};
use crate::transition::{Outcome, Transition};

/// Reader threads (each with its own connection).
const READERS: usize = 4;

/// Committer threads (each with its own connection), whose groups commit side by side.
const COMMITTERS: usize = 2;

/// A handle on an event log in PostgreSQL. Cheap to clone; the committers and the readers
/// stop when the last handle drops, after the committers answered everything queued.
#[derive(Debug, Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shared: Arc<Shared>,
    /// One queue per committer; an execution's requests go to `senders[shard(id)]`. Empty
    /// once the store is closed.
    senders: Mutex<Vec<mpsc::Sender<commit::Queued>>>,
    /// The committers' threads, until the store is closed.
    committers: Mutex<Vec<JoinHandle<()>>>,
    readers: readers::Readers,
    /// The node lease's own connection (N-2): a renewal never queues behind reads (a
    /// takeover's scan, a recovery, a client's long page), whose wait would let it lapse.
    lease: readers::Readers,
    incarnation: Incarnation,
    /// S-7: the node's mark, written as its groups commit (when opened with a directory).
    mark: Mutex<Option<mark::Writer>>,
}

impl Inner {
    /// Closes the queues (each committer answers what is in its queue, then stops), waits
    /// for the committers, writes the mark a last time and stops the readers. Blocks; every
    /// caller returns once it is done.
    fn close(&self) {
        let mut committers = lock(&self.committers);
        for sender in std::mem::take(&mut *lock(&self.senders)) {
            // Refused only if that committer stopped already.
            let _ = futures::executor::block_on(sender.send(commit::Queued::Close));
        }
        for committer in committers.drain(..) {
            if committer.join().is_err() {
                tracing::error!("a PostgreSQL committer thread panicked");
            }
        }
        // After the committers: the mark's last write covers their last groups.
        lock(&self.mark).take();
        self.readers.close();
        self.lease.close();
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.close();
    }
}

/// What the committer and the readers share.
#[derive(Debug)]
struct Shared {
    url: String,
    limits: Limits,
    /// A quarantine is also in `op_quarantine`, so every node and every later start
    /// refuses it too; fail-stop follows a commit whose outcome is unknown.
    refusals: Refusals,
    metrics: Metrics,
    /// The last position of this node's newest committed group (S-7, `pg/mark.rs`).
    acknowledged: Arc<AtomicU64>,
}

/// A database error, kept as text (errors are `Clone` for every waiter of a group).
pub(crate) fn database(error: postgres::Error) -> Error {
    Error::Database(error.to_string())
}

/// Connects to `url` (a libpq connection string or `postgres://` URL), without TLS.
fn connect(url: &str) -> Result<postgres::Client> {
    postgres::Client::connect(url, postgres::NoTls).map_err(database)
}

impl PgStore {
    /// Opens the event log in the database at `url` with default limits.
    pub fn open(url: &str) -> Result<Self> {
        Self::open_with(url, Limits::default())
    }

    /// Opens the event log: migrates the schema (once, under an advisory lock, whichever
    /// node gets there first), records a new incarnation, loads the quarantine, and starts
    /// the committer and the readers. Keeps no mark of what it acknowledged: a node should
    /// open with `open_node`.
    pub fn open_with(url: &str, limits: Limits) -> Result<Self> {
        Self::open_inner(url, limits, None).map(|(store, _)| store)
    }

    /// Opens the event log as `open_with` does, as a node whose own data is in `dir` (S-7,
    /// N-4): it keeps there the highest position it saw acknowledged, and refuses a database
    /// that holds less (`Error::AcknowledgedLost`: restored from an older dump) unless
    /// `accept_loss`, which serves it and returns what was lost.
    pub fn open_node(
        url: &str,
        limits: Limits,
        dir: &Path,
        accept_loss: bool,
    ) -> Result<(Self, Option<SalvageReport>)> {
        Self::open_inner(url, limits, Some((dir.to_path_buf(), accept_loss)))
    }

    fn open_inner(
        url: &str,
        limits: Limits,
        node: Option<(PathBuf, bool)>,
    ) -> Result<(Self, Option<SalvageReport>)> {
        limits.validate()?;
        // On a thread of its own: the blocking client refuses to run on a runtime thread
        // (`open` may be called from async code), and the client moves on to the committer.
        let target = url.to_owned();
        let opened = std::thread::Builder::new()
            .name("openprogram-pg-open".into())
            .spawn(move || -> Result<_> {
                let mut client = connect(&target)?;
                schema::migrate(&mut client)?;
                let quarantine = schema::load_quarantine(&mut client)?;
                let marked = match node {
                    Some((dir, accept_loss)) => {
                        let quarantined = quarantine.clone().into_iter().collect();
                        let (mark, report) =
                            mark::open(&mut client, &dir, accept_loss, quarantined)?;
                        (Some(mark), report)
                    }
                    None => (None, None),
                };
                let incarnation = schema::record_incarnation(&mut client, OwnerId::new())?;
                Ok((client, incarnation, quarantine, marked))
            })
            .map_err(|error| Error::Database(format!("opening: {error}")))?
            .join()
            .map_err(|_| Error::Database("opening: the thread panicked".into()))?;
        let (client, incarnation, quarantine, (mark, report)) = opened?;
        let shared = Arc::new(Shared {
            url: url.to_owned(),
            limits: limits.clone(),
            refusals: Refusals::new(quarantine),
            metrics: Metrics::default(),
            acknowledged: Arc::new(AtomicU64::new(0)),
        });
        let mark = mark
            .map(|mark| mark::Writer::start(mark, Arc::clone(&shared.acknowledged)))
            .transpose()?;
        let readers = readers::Readers::start(&shared, "reader", READERS)?;
        let lease = readers::Readers::start(&shared, "lease", 1)?;
        let (mut senders, mut committers) = (Vec::new(), Vec::new());
        // The first committer takes the opening's connection; the others connect themselves.
        let mut client = Some(client);
        for index in 0..COMMITTERS {
            let (sender, queue) = mpsc::channel(limits.queue_len_max.max(1));
            let committer_shared = Arc::clone(&shared);
            let client = client.take();
            let committer = std::thread::Builder::new()
                .name(format!("openprogram-pg-committer-{index}"))
                .spawn(move || commit::run(committer_shared, client, queue))
                .map_err(|error| Error::Database(format!("starting a committer: {error}")))?;
            senders.push(sender);
            committers.push(committer);
        }
        tracing::info!(owner = %incarnation.owner_id, number = incarnation.number, "PostgreSQL store opened");
        let inner = Inner {
            shared,
            senders: Mutex::new(senders),
            committers: Mutex::new(committers),
            readers,
            lease,
            incarnation,
            mark: Mutex::new(mark),
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

    /// Queues a request for the committer and waits for its answer.
    fn request<T: Send + 'static>(
        &self,
        make: impl FnOnce(oneshot::Sender<Result<T>>) -> commit::Request,
    ) -> BoxFuture<'static, Result<T>> {
        if let Some(reason) = self.shared().refusals.failure() {
            return futures::future::ready(Err(Error::FailStop(reason))).boxed();
        }
        let (reply, answer) = oneshot::channel();
        let request = make(reply);
        let sender = {
            let senders = lock(&self.inner.senders);
            let shard =
                request.execution_id().as_uuid().as_u64_pair().1 as usize % senders.len().max(1);
            senders.get(shard).cloned()
        };
        let Some(sender) = sender else {
            return futures::future::ready(Err(Error::Closed)).boxed();
        };
        async move {
            sender
                .send(commit::Queued::Request(request))
                .await
                .map_err(|_| Error::Closed)?;
            answer.await.map_err(|_| Error::Closed)?
        }
        .boxed()
    }

    fn metrics_snapshot(&self) -> MetricsSnapshot {
        let senders = lock(&self.inner.senders);
        let queued = senders
            .iter()
            .map(|sender| (sender.max_capacity() - sender.capacity()) as u64);
        // Of the committers, each busy part of the time: their mean.
        let metrics = &self.shared().metrics;
        metrics.snapshot(COMMITTERS as u64, queued.sum())
    }
}

impl EventStore for PgStore {
    fn close(&self) -> BoxFuture<'static, Result<()>> {
        let inner = Arc::clone(&self.inner);
        crate::event_store::off_thread(move || {
            inner.close();
            Ok(())
        })
    }

    fn write_conversation(
        &self,
        write: crate::conversation::ConversationWrite,
    ) -> BoxFuture<'static, Result<crate::conversation::ConversationOutcome>> {
        if let Err(error) = write.check() {
            return futures::future::ready(Err(error)).boxed();
        }
        if let Some(reason) = self.shared().refusals.failure() {
            return futures::future::ready(Err(Error::FailStop(reason))).boxed();
        }
        let store = self.clone();
        async move {
            // A reader's connection, off the async threads: one short transaction.
            tokio::task::spawn_blocking(move || {
                store
                    .inner
                    .readers
                    .run(move |client| conversation::write(client, &write))
            })
            .await
            .map_err(|error| Error::Database(format!("a conversation write: {error}")))?
        }
        .boxed()
    }

    fn submit(&self, transition: Transition) -> BoxFuture<'static, Result<Outcome>> {
        let limits = &self.shared().limits;
        if let Err(error) =
            transition.check_sizes(limits.blob_bytes_max, limits.transition_bytes_max)
        {
            return futures::future::ready(Err(error)).boxed();
        }
        if transition.events.len() > statements::GROUP_EVENTS_MAX {
            return futures::future::ready(Err(Error::InvalidTransition(format!(
                "{} events in one transition (at most {})",
                transition.events.len(),
                statements::GROUP_EVENTS_MAX
            ))))
            .boxed();
        }
        self.request(|reply| commit::Request::Transition { transition, reply })
    }

    fn purge(
        &self,
        execution_id: ExecutionId,
        _ended_key: Option<u64>,
        ended_before: Option<u64>,
    ) -> BoxFuture<'static, Result<PurgeStep>> {
        // `ended_key` names a sled index entry; here the retention index is a column of
        // the head's row and goes with it.
        self.request(|reply| commit::Request::Purge {
            execution_id,
            ended_before,
            reply,
        })
    }

    fn sweep_log(
        &self,
        _from_position: u64,
        _max_records: usize,
    ) -> BoxFuture<'static, Result<SweepStep>> {
        // Events are rows of their own execution, deleted by its purge: no log record is
        // shared, so there is nothing to sweep.
        futures::future::ready(Ok(SweepStep::default())).boxed()
    }

    fn renew_node(&self, node_id: &str, url: &str, ttl: std::time::Duration) -> Result<NodeRecord> {
        let (node_id, url) = (node_id.to_owned(), url.to_owned());
        let incarnation = self.inner.incarnation.clone();
        let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
        self.inner.lease.run(move |client| {
            // A later incarnation's row is never overwritten by an earlier one (a node
            // stopped past its lease and resumed after its restart registered again).
            let row = client
                .query_opt(
                    "INSERT INTO op_nodes AS n \
                         (node_id, owner_id, incarnation, url, started_at_ms, lease_expires_at_ms) \
                     VALUES ($1, $2, $3, $4, $5, \
                         (extract(epoch FROM clock_timestamp()) * 1000)::bigint + $6) \
                     ON CONFLICT (node_id) DO UPDATE SET owner_id = EXCLUDED.owner_id, \
                         incarnation = EXCLUDED.incarnation, url = EXCLUDED.url, \
                         started_at_ms = EXCLUDED.started_at_ms, \
                         lease_expires_at_ms = EXCLUDED.lease_expires_at_ms \
                     WHERE n.incarnation <= EXCLUDED.incarnation \
                     RETURNING node_id, owner_id, incarnation, url, started_at_ms, \
                         lease_expires_at_ms",
                    &[
                        &node_id as &(dyn postgres::types::ToSql + Sync),
                        incarnation.owner_id.as_uuid(),
                        &(incarnation.number as i64),
                        &url,
                        &(incarnation.started_at_ms as i64),
                        &ttl_ms,
                    ],
                )
                .map_err(database)?;
            match row {
                Some(row) => Ok(reads::node_of(&row)),
                None => Err(Error::NodeSuperseded(node_id)),
            }
        })
    }
}
