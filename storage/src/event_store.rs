//! The event log's API, whatever the engine underneath (`Store`, sled; `PgStore`): `EventStore`
//! writes (only the actors hold one), `EventReader` reads (inspection), with the answers only
//! this API gives: purge and sweep steps (S-8), the node registry (N-2). It names no engine's
//! type, so another backend stands beside these without touching `actors/`.

use futures::future::BoxFuture;
use futures::FutureExt;
use serde::{Deserialize, Serialize};

use crate::conversation::{ConversationOutcome, ConversationRecord, ConversationWrite};
use crate::error::{Error, Result};
use crate::event::EventEnvelope;
use crate::histogram::NamedHistogram;
use crate::ids::{CommandId, EffectId, ExecutionId, OwnerId, ProcessId, SessionId, WaitId};
use crate::open::Incarnation;
use crate::records::{
    BlobHash, CommandRecord, ExecutionHead, ExecutionState, JobRecord, ProcessRecord,
    ProjectionRecord, PurgedRecord, ReceiptRecord, SessionRecord, WaitRecord,
};
use crate::shared::MetricsSnapshot;
use crate::transition::{Outcome, Transition};

/// Runs `work`, which blocks, on a thread of its own: a future that waits for it without
/// blocking its executor.
pub(crate) fn off_thread(
    work: impl FnOnce() -> Result<()> + Send + 'static,
) -> BoxFuture<'static, Result<()>> {
    let (done, finished) = futures::channel::oneshot::channel();
    let started = std::thread::Builder::new()
        .name("openprogram-close".into())
        .spawn(move || drop(done.send(work())));
    async move {
        started.map_err(|error| Error::Io {
            path: Default::default(),
            message: format!("starting a thread: {error}"),
        })?;
        finished.await.map_err(|_| Error::Closed)?
    }
    .boxed()
}

/// Reads and writes of the event log, independent of the engine underneath. Only the
/// actors write: everything else gets an `EventReader`.
pub trait EventStore: EventReader {
    /// Closes the store: what is queued is committed and answered; later writes and reads
    /// answer `Closed`; its files and connections are let go (the sled store's directory
    /// can be opened again, or removed, once this returns). Closing twice is closing once.
    fn close(&self) -> BoxFuture<'static, Result<()>>;

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

    /// A compare-and-swap of a session's conversation record (its name and
    /// compactions), durable before it answers `Written`.
    fn write_conversation(
        &self,
        write: ConversationWrite,
    ) -> BoxFuture<'static, Result<ConversationOutcome>>;

    /// N-2: registers this handle's incarnation as node `node_id`, reachable at `url`, or
    /// renews its lease: it expires `ttl` from now by the database's clock. Refused
    /// (`NodeSuperseded`) once a later incarnation registered under the same id, and
    /// (`SingleNode`) by a store only one process opens. Blocks for one round trip.
    fn renew_node(&self, node_id: &str, url: &str, ttl: std::time::Duration) -> Result<NodeRecord> {
        let _ = (node_id, url, ttl);
        Err(Error::SingleNode("sled"))
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
    /// A session's record (grants, foreground turn); `None` before its first write.
    fn session(&self, session_id: SessionId) -> Result<Option<SessionRecord>>;
    /// A session's name and compactions; `None` before its first write.
    fn conversation(&self, session_id: SessionId) -> Result<Option<ConversationRecord>>;
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
    /// K-7: every execution's own restart window, in one read (recovery's).
    fn policies(&self) -> Result<crate::policy::Policies>;
    fn blob(&self, hash: BlobHash) -> Result<Option<Vec<u8>>>;
    /// Executions currently in a non-terminal `state`, from the by-state index (S-6).
    /// Terminal states are not indexed: asking for one returns an empty list.
    fn executions_in_state(&self, state: ExecutionState) -> Result<Vec<ExecutionId>>;
    /// How many executions `executions_in_state` would list.
    fn count_in_state(&self, state: ExecutionState) -> Result<usize> {
        Ok(self.executions_in_state(state)?.len())
    }
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
    fn histograms(&self) -> Vec<NamedHistogram> {
        Vec::new()
    }
    /// Why the store stopped acknowledging writes (fail-stop after a failed write or
    /// fsync), if it did.
    fn failure(&self) -> Option<String>;
}

/// How far one step of a purge got (`EventStore::purge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PurgeStep {
    /// Purged, every key it owned gone.
    Done,
    /// Purged and unreadable; more of its keys are left for the next step.
    More,
    /// The execution has not ended: nothing done.
    NotEnded,
    /// Its latest transitions are not yet written to their own keys: nothing done; try
    /// again after the next materialization.
    Unsettled,
    /// No such execution.
    Unknown,
}

/// What one step of the log's sweep did (`EventStore::sweep_log`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SweepStep {
    /// Where the next step starts; `None` once the sweep reached the log's materialized end.
    pub next_position: Option<u64>,
    pub records_examined: usize,
    /// Log records removed: every frame in them was of a purged execution.
    pub records_deleted: usize,
    pub bytes_deleted: u64,
}

/// N-2: a runtime node in a shared store's registry. Its lease is renewed in the background;
/// once it lapses (by the database's clock), other nodes take over the executions whose
/// attempts carry its `owner_id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub node_id: String,
    /// The incarnation running as this node: the owner of the attempts it runs.
    pub owner_id: OwnerId,
    pub incarnation: u64,
    /// Where its HTTP API listens (requests for its executions are forwarded there).
    pub url: String,
    pub started_at_ms: u64,
    pub lease_expires_at_ms: u64,
}

/// N-2: the nodes registered, and the database's time when they were read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nodes {
    pub now_ms: u64,
    pub nodes: Vec<NodeRecord>,
}

impl Nodes {
    /// The node whose lease holds now and that runs as `owner_id`.
    pub fn live_owner(&self, owner_id: OwnerId) -> Option<&NodeRecord> {
        self.nodes
            .iter()
            .find(|node| node.owner_id == owner_id && node.lease_expires_at_ms > self.now_ms)
    }
}
