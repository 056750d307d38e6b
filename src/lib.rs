//! OpenProgram: an embeddable, actor-based durable-execution runtime.
//!
//! ```no_run
//! # async fn example() -> Result<(), openprogram::Error> {
//! use openprogram::{Runtime, StartRequest};
//! let runtime = Runtime::builder().data_dir("./openprogram-data").open()?;
//! let session = openprogram::storage::SessionId::new();
//! let started = runtime
//!     .start_execution(session, StartRequest { message: "hi".into(), ..Default::default() })
//!     .await?;
//! let snapshot = runtime.snapshot(session, started.execution_id).await?;
//! runtime.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! This crate is the facade (I-1): the `Runtime` builder and handle. The work happens in
//! `openprogram-actors` (executions, commands) on top of `openprogram-storage` (the log).
//! Architecture invariant: dependencies flow `openprogram → openprogram-actors →
//! openprogram-storage`, never back; no global state, so two runtimes can share a process.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use futures::FutureExt as _;
use std::time::Duration;

use actix::Actor as _;
use openprogram_actors::agent::{Provider, Scripted, Tool, ToolRegistry};
use openprogram_actors::directory::{Directory, Executions};
use openprogram_actors::env::Env;
pub use openprogram_actors::env::NodeIdentity;
use openprogram_actors::inspect::Inspector;
use openprogram_actors::recovery::{Clock, SystemClock};
use openprogram_actors::resource_queue::{JobHost, Load, ResourceQueue};
use openprogram_actors::resources::Resources;
use openprogram_actors::retention::Retention;
pub use openprogram_actors::retention::RetentionStats;
use openprogram_actors::service::Service;
use openprogram_actors::supervisor::{begin_shutdown, Recover, Shutdown, Supervisor};
use openprogram_actors::system::ActorSystem;
use openprogram_actors::wait_deadlines::{DeadlineHost, Load as LoadDeadlines, WaitDeadlines};
use openprogram_storage::{
    CommandId, EventEnvelope, EventReader, EventStore, ExecutionId, Limits, SessionId,
};

// The server's modules (the `server` feature, on by default; an embedder turns it off).
mod conversation;
mod nodes;
mod stores;

pub use nodes::{NodeReport, NodesReport};
pub use stores::is_postgres_url;

#[cfg(feature = "server")]
pub mod cluster;
#[cfg(feature = "server")]
pub mod http;
#[cfg(feature = "server")]
pub mod load;
#[cfg(feature = "server")]
mod load_jobs;
#[cfg(feature = "server")]
pub mod load_remote;
#[cfg(feature = "server")]
mod load_report;
#[cfg(feature = "server")]
mod load_store;
#[cfg(feature = "server")]
pub mod model_args;
#[cfg(feature = "server")]
pub mod observability;
pub mod overview;
#[cfg(feature = "server")]
pub mod process_stats;
#[cfg(feature = "server")]
pub mod serve;
#[cfg(feature = "server")]
pub mod soak;

pub use openprogram_actors as actors;
pub use openprogram_actors::admission::{BudgetRequest, BusyStrategy, JobRequest};
pub use openprogram_actors::agent;
pub use openprogram_actors::command::{
    Command, CommandBody, CommandKind, EffectRef, ReconcileOutcome, WaitRef,
};
pub use openprogram_actors::conversation::SessionView;
pub use openprogram_actors::conversation::{MessagesPage, MessagesQuery};
pub use openprogram_actors::conversation_hooks::{
    CompactionPolicy, Compactor, Excerpts, FirstWords, ModelNamer, SessionNamer,
};
pub use openprogram_actors::deltas::{Delta, DeltaKind, DeltaWatch};
pub use openprogram_actors::function::{DurableFunction, FunctionContext, StepError};
#[cfg(feature = "providers")]
pub use openprogram_actors::http_tool;
#[cfg(feature = "providers")]
pub use openprogram_actors::providers;
pub use openprogram_actors::recovery::{ManualClock, RestartWindow};
pub use openprogram_actors::resource_queue::{QueueReport, QueueStats, WAIT_BUCKETS_MS};
pub use openprogram_actors::resources::{Lease, ResourceView};
pub use openprogram_actors::service::{
    CommandReply, FunctionStart, ScriptElement, StartReply, StartRequest,
};
pub use openprogram_actors::transcript::{Block, BlockBody, Message};
pub use openprogram_actors::wait_request::{InvalidAnswer, WaitRequest, WaitSpec};
pub use openprogram_macros::{durable_function, durable_helper};
pub use openprogram_storage::JobBudget;
pub use openprogram_storage::VersionPolicy;

/// A started function execution: the start reply and the function revision it runs.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct FunctionStarted {
    #[serde(flatten)]
    pub started: StartReply,
    pub function_revision: u32,
}
pub use openprogram_actors::snapshot::Snapshot;
pub use openprogram_actors::supervisor::{RecoveryReport, ShutdownReport};
pub use openprogram_actors::{Error, Result};
pub use openprogram_storage as storage;

/// Configures and opens a `Runtime`.
#[derive(Default)]
pub struct RuntimeBuilder {
    data_dir: Option<PathBuf>,
    provider: Option<Arc<dyn Provider>>,
    tools: Option<ToolRegistry>,
    functions: Vec<DurableFunction>,
    builtin_revisions: Option<Vec<(String, u32)>>,
    function_policy: Option<VersionPolicy>,
    /// C-2 off: the turns of a session run side by side (`one_turn_per_session(false)`).
    parallel_turns: bool,
    conversation_hooks: openprogram_actors::conversation_hooks::ConversationHooks,
    limits: Limits,
    lease_ttl: Option<Duration>,
    restart_window: RestartWindow,
    clock: Option<Arc<dyn Clock>>,
    shutdown_timeout: Option<Duration>,
    process_stop_grace: Option<Duration>,
    accept_loss: bool,
    /// A store opened by the caller: the actors' handle, and the readers' one on the same store.
    store: Option<(Arc<dyn EventStore>, Arc<dyn EventReader>)>,
    store_url: Option<String>,
    resources: Vec<(String, u32)>,
    retain_finished: Option<Duration>,
    node: Option<NodeIdentity>,
}

/// How long an attempt keeps its lease without a heartbeat, unless configured.
pub const LEASE_TTL_DEFAULT: Duration = Duration::from_secs(10);

/// How long an orderly shutdown waits for running effects to reach a safe point, unless
/// configured.
pub const SHUTDOWN_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

impl std::fmt::Debug for RuntimeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeBuilder")
            .field("data_dir", &self.data_dir)
            .finish()
    }
}

impl RuntimeBuilder {
    /// A store opened by the caller, instead of `data_dir` (which is then not needed, nor
    /// `limits` and `accept_loss`, which the caller's open decided). The caller keeps its own
    /// handle; the runtime's actors write through theirs, and `Runtime::store` reads.
    /// Any `EventStore` serves: the embedded `Store` (sled) or, with the feature `postgres`,
    /// a `storage::pg::PgStore`.
    pub fn store<S: EventStore + Clone>(mut self, store: S) -> Self {
        self.store = Some((Arc::new(store.clone()), Arc::new(store)));
        self
    }

    /// N-1: the store named as `serve --store` names it: `postgres://…` (or
    /// `postgresql://…`) is a PostgreSQL database, which needs the feature `postgres`
    /// (`invalid_request` without it); anything else is the sled store's directory, as
    /// `data_dir`.
    pub fn store_url(mut self, url: impl Into<String>) -> Self {
        self.store_url = Some(url.into());
        self
    }

    /// Where the embedded sled store lives. Required, unless `store` or `store_url` gives
    /// one.
    pub fn data_dir(mut self, path: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(path.into());
        self
    }

    /// The model provider; the built-in `scripted` provider if none is given.
    pub fn provider(mut self, provider: Arc<dyn Provider>) -> Self {
        self.provider = Some(provider);
        self
    }

    /// Adds a tool to the built-in ones (replacing one of the same name).
    pub fn tool(mut self, tool: Arc<dyn Tool>) -> Self {
        self.tools
            .get_or_insert_with(ToolRegistry::builtin)
            .register(tool);
        self
    }

    /// Registers a revision of a durable function beside the built-in ones (F-1). `open`
    /// refuses (`invalid_request`) a registration under a name and revision known with
    /// another identity (F-7).
    pub fn function(mut self, function: DurableFunction) -> Self {
        self.functions.push(function);
        self
    }

    /// Registers exactly these revisions of the built-in functions (by name and revision),
    /// instead of all: how a test deploys new code across a restart (F-3).
    pub fn builtin_function_revisions(mut self, keep: Vec<(String, u32)>) -> Self {
        self.builtin_revisions = Some(keep);
        self
    }

    /// F-3: the version policy of a function execution started without one. Default
    /// `keep_original`.
    pub fn function_policy(mut self, policy: VersionPolicy) -> Self {
        self.function_policy = Some(policy);
        self
    }

    /// The store's bounds (queue, batch, payload sizes).
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// How long an attempt keeps its lease without a heartbeat (A-1). Default 10 s.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = Some(ttl);
        self
    }

    /// R-2: how long after an interruption executions continue by themselves. Default
    /// `RestartWindow::Unlimited` (`-1`).
    pub fn restart_window(mut self, window: RestartWindow) -> Self {
        self.restart_window = window;
        self
    }

    /// The wall clock restart deadlines are measured with (tests inject a `ManualClock`).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// How long `Runtime::shutdown` waits for running effects to finish. Default 10 s.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = Some(timeout);
        self
    }

    /// Time between SIGTERM and SIGKILL when `stop_process` stops a managed process.
    /// Default 5 s.
    pub fn process_stop_grace(mut self, grace: Duration) -> Self {
        self.process_stop_grace = Some(grace);
        self
    }

    /// J-1: declares a resource Jobs are admitted for, with its capacity (repeatable; a name
    /// twice or a capacity of 0 is refused at `open`).
    pub fn resource(mut self, name: impl Into<String>, capacity: u32) -> Self {
        self.resources.push((name.into(), capacity));
        self
    }

    /// S-8: purges executions that ended longer than `retain` ago, with their events,
    /// receipts and waits, in the background (a round a second); their reads answer
    /// `purged`. Unset (the default): kept for good.
    pub fn retain_finished(mut self, retain: Duration) -> Self {
        self.retain_finished = Some(retain);
        self
    }

    /// N-2: runs this runtime as node `node_id` of a shared store (PostgreSQL), reachable
    /// at `url` (its HTTP API: other nodes forward commands for its executions there). Its
    /// lease (`lease_ttl`) is renewed in the background; a node whose lease lapses has its
    /// running executions taken over by the others. `open` refuses a store of one process
    /// (`single_node_store`).
    pub fn node(mut self, node_id: impl Into<String>, url: impl Into<String>) -> Self {
        self.node = Some(NodeIdentity {
            node_id: node_id.into(),
            url: url.into(),
        });
        self
    }

    /// S-7: open a store that lost acknowledged history (a damaged or truncated file) and
    /// keep what remains, instead of refusing it (`acknowledged_lost`). `Runtime::salvage`
    /// then says what was lost. An operator's explicit choice; never needed for a healthy
    /// store.
    pub fn accept_loss(mut self, accept: bool) -> Self {
        self.accept_loss = accept;
        self
    }

    /// Opens the store, starts the actor system and the supervisor, and begins startup
    /// recovery in the background (`Runtime::recovery` waits for its report).
    pub fn open(mut self) -> Result<Runtime> {
        let conversation_hooks = self.conversation_hooks()?;
        let mut functions = openprogram_actors::function_builtin::builtin();
        if let Some(keep) = &self.builtin_revisions {
            functions.retain(|name, revision| {
                keep.iter()
                    .any(|(kept, kept_revision)| kept == name && *kept_revision == revision)
            });
        }
        for function in std::mem::take(&mut self.functions) {
            functions
                .register(function)
                .map_err(|error| Error::InvalidRequest(error.to_string()))?;
        }
        let (store, salvage) = self.open_store()?;
        // Inspection gets the store's reads only; the actors, the one writer.
        let (store, reader) = store;
        let owner = store.incarnation().owner_id;
        let system = ActorSystem::start("openprogram")?;
        let mut env = Env::new(
            store,
            self.provider.unwrap_or_else(|| Arc::new(Scripted)),
            self.tools.unwrap_or_else(ToolRegistry::builtin),
            owner,
            self.lease_ttl.unwrap_or(LEASE_TTL_DEFAULT),
            self.clock.unwrap_or_else(|| Arc::new(SystemClock)),
            self.restart_window,
        );
        if let Some(grace) = self.process_stop_grace {
            env.process_stop_grace = grace;
        }
        env.resources = Resources::new(self.resources)?;
        env.functions = Arc::new(functions);
        env.one_turn_per_session = !self.parallel_turns;
        env.conversation_hooks = conversation_hooks;
        if let Some(policy) = self.function_policy {
            env.function_policy = policy;
        }
        // N-2: registered before anything runs, so that no other node takes this one's
        // executions for abandoned ones.
        env.node = self.node;
        if let Some(node) = openprogram_actors::supervisor::renew_node(&env)? {
            tracing::info!(node_id = %node.node_id, url = %node.url, "registered as a node");
        }
        let env = Executions::new(Arc::new(env), Directory::new(system.arbiters()));
        if env.node.is_some() {
            openprogram_actors::supervisor::keep_node_lease(Arc::downgrade(env.env()))
                .map_err(|error| Error::Unavailable(format!("the node lease thread: {error}")))?;
        }
        // J-1: the resource queue; it leases nothing before recovery is over (`Load`).
        let queue = {
            let host: Weak<dyn JobHost> = Arc::downgrade(&env) as Weak<Executions>;
            let queue = ResourceQueue::new(
                env.resources.clone(),
                host,
                Arc::clone(&reader),
                Arc::clone(&env.clock),
            );
            ResourceQueue::start_in_arbiter(&system.arbiters()[0], move |_| queue)
        };
        env.set_queue(queue.clone());
        // W-8: the wait deadlines; pending ones are read once recovery is over (`Load`).
        let deadlines = {
            let host: Weak<dyn DeadlineHost> = Arc::downgrade(&env) as Weak<Executions>;
            let deadlines = WaitDeadlines::new(host, Arc::clone(&env.clock));
            WaitDeadlines::start_in_arbiter(&system.arbiters()[0], move |_| deadlines)
        };
        env.set_deadlines(deadlines.clone());
        // S-8: purges a crash left half done, ended executions past the retention policy,
        // and the log's sweep.
        let retention_stats = Arc::new(RetentionStats::default());
        {
            let retention = Retention::new(
                Arc::clone(&env.store),
                Arc::clone(&env.clock),
                self.retain_finished,
                Arc::clone(&retention_stats),
            );
            Retention::start_in_arbiter(&system.arbiters()[0], move |_| retention);
        }
        let supervisor_env = Arc::clone(&env);
        let supervisor = Supervisor::start_in_arbiter(&system.arbiters()[0], move |_| {
            Supervisor::new(supervisor_env)
        });
        let recovery = supervisor.send(Recover);
        let recovery_env = Arc::clone(&env);
        let recovered = async move {
            let report = recovery.await;
            // The queue starts leasing once recovery is over, whether or not it succeeded:
            // what it reads from the store is the truth either way.
            match queue.send(Load).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::error!(%error, "the resource queue could not read every Job")
                }
                Err(error) => tracing::error!(%error, "the resource queue is not running"),
            }
            match deadlines.send(LoadDeadlines).await {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => {
                    tracing::error!(%error, "the wait deadlines could not all be read")
                }
                Err(error) => tracing::error!(%error, "the wait deadlines actor is not running"),
            }
            match report {
                Ok(report) => report,
                Err(error) => {
                    // The supervisor never ran it: commands must not wait for it forever.
                    recovery_env.lifecycle.mark_recovered();
                    Err(Error::Unavailable(error.to_string()))
                }
            }
        }
        .boxed()
        .shared();
        // Recovery runs even if nobody asks for its report.
        system.arbiters()[0].spawn(recovered.clone().map(|_| ()));
        let node = env.node.clone();
        Ok(Runtime {
            inner: Arc::new(Inner {
                inspector: Inspector::new(Arc::clone(&env), reader),
                service: Service::new(env),
                system: Mutex::new(Some(system)),
                supervisor,
                recovered,
                shutdown_timeout: self.shutdown_timeout.unwrap_or(SHUTDOWN_TIMEOUT_DEFAULT),
                salvage,
                retention_stats,
                node,
            }),
        })
    }
}

/// A running runtime: `Send + Sync + Clone`, usable from any tokio runtime.
#[derive(Debug, Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

struct Inner {
    service: Service,
    inspector: Inspector,
    system: Mutex<Option<ActorSystem>>,
    supervisor: actix::Addr<Supervisor>,
    recovered: futures::future::Shared<futures::future::BoxFuture<'static, Result<RecoveryReport>>>,
    shutdown_timeout: Duration,
    /// What an open with `accept_loss` found.
    salvage: Option<openprogram_storage::SalvageReport>,
    retention_stats: Arc<RetentionStats>,
    node: Option<NodeIdentity>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("service", &self.service)
            .finish()
    }
}

impl Runtime {
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
    }

    /// Admits a new agent turn in `session` and starts it.
    pub async fn start_execution(
        &self,
        session: SessionId,
        request: StartRequest,
    ) -> Result<StartReply> {
        self.inner.service.start_execution(session, request).await
    }

    /// F-1: admits an execution of the newest registered revision of a durable function in
    /// `session` and starts it: `unknown_function` if none is registered, `invalid_input`
    /// if the function refuses the input. Controlled and read like an agent execution.
    pub async fn start_function(
        &self,
        session: SessionId,
        request: FunctionStart,
    ) -> Result<FunctionStarted> {
        let (started, function_revision) =
            self.inner.service.start_function(session, request).await?;
        Ok(FunctionStarted {
            started,
            function_revision,
        })
    }

    /// Sends a command (K-1..K-5, K-2 Fork and Retry): the execution decides it and the
    /// reply says `applied` (with a Fork's or Retry's child) or `rejected` with the reason
    /// and its code. A rejected command changes nothing of the execution.
    pub async fn command(
        &self,
        session: SessionId,
        execution: ExecutionId,
        command: Command,
    ) -> Result<CommandReply> {
        self.inner
            .service
            .command(session, execution, command)
            .await
    }

    /// The stored outcome of a command.
    pub fn command_status(&self, session: SessionId, command: CommandId) -> Result<CommandReply> {
        self.inner.service.command_status(session, command)
    }

    pub async fn snapshot(&self, session: SessionId, execution: ExecutionId) -> Result<Snapshot> {
        self.inner.service.snapshot(session, execution).await
    }

    /// The snapshots of a session's executions, oldest first.
    pub async fn executions(&self, session: SessionId) -> Result<Vec<Snapshot>> {
        self.inner.service.executions(session).await
    }

    /// Resolves once the execution has ended (completed, failed or cancelled).
    pub async fn wait_finished(&self, session: SessionId, execution: ExecutionId) -> Result<()> {
        self.inner.service.check_session(session, execution)?;
        let env = self.inner.service.env();
        env.lifecycle
            .wait_finished(env.store.as_ref(), execution)
            .await
    }

    /// Events of an execution with `seq > after`.
    pub fn events(
        &self,
        session: SessionId,
        execution: ExecutionId,
        after: u64,
    ) -> Result<Vec<EventEnvelope>> {
        self.inner
            .service
            .events(session, execution, after, usize::MAX)
    }

    /// S-7: what the open found lost, when it was opened with `accept_loss` and something
    /// was.
    pub fn salvage(&self) -> Option<&openprogram_storage::SalvageReport> {
        self.inner.salvage.as_ref()
    }

    /// The report of startup recovery (R-3, R-4), once it is done.
    pub async fn recovery(&self) -> Result<RecoveryReport> {
        self.inner.recovered.clone().await
    }

    /// Replaces running attempts whose lease lapsed by new attempts with a higher epoch; the
    /// old attempts are fenced at their next write (A-1, R05). The supervisor does this every
    /// half lease; returns the executions taken over.
    pub async fn reclaim_lapsed_attempts(&self) -> Result<Vec<ExecutionId>> {
        self.inner.service.actors().reclaim_lapsed().await
    }

    /// Execution actors alive now (the rest are parked in storage).
    pub fn live_executions(&self) -> usize {
        self.inner.inspector.live_executions()
    }

    /// The store underneath, read-only: only the runtime's actors write.
    pub fn store(&self) -> &Arc<dyn EventReader> {
        self.inner.inspector.store()
    }

    /// A read-only view for inspection: the store's reads, the live actors' accounts, the
    /// runtime's counters (the HTTP layer, the debug endpoint and the CLI read through it).
    pub fn inspect(&self) -> &Inspector {
        &self.inner.inspector
    }

    /// Orderly shutdown (R-7): stops new work and recovery, asks every running execution for
    /// a pause owned by restart recovery (recording its restart intent, R-3) at its next safe
    /// point, waits up to the shutdown timeout, then stops the actors. The next start resumes
    /// the paused executions within the restart window. The store closes when the last
    /// handle is dropped, after writing everything queued.
    pub async fn shutdown(&self) -> ShutdownReport {
        let timeout = self.inner.shutdown_timeout;
        // Stop new work now; the supervisor may still be busy with startup recovery, which
        // sees the flag and claims nothing more.
        begin_shutdown(self.inner.service.env());
        let report = self
            .inner
            .supervisor
            .send(Shutdown { timeout })
            .await
            .unwrap_or_default();
        self.halt();
        report
    }

    /// Stops the actors at once, without pausing anything: what a crash leaves behind,
    /// minus the lost process. Running executions stay running in storage and the next
    /// start treats them as abandoned.
    pub fn halt(&self) {
        // Nothing may wait for a recovery that will not finish. (No restart pause: a halt
        // leaves storage as a crash does.)
        self.inner.service.env().lifecycle.mark_recovered();
        self.inner.service.env().lifecycle.drop_waiters();
        self.inner.service.env().lifecycle.mark_halted();
        let system = self
            .inner
            .system
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(mut system) = system {
            system.stop();
        }
    }

    // ---- For the HTTP API and debug endpoint (issue 8, `src/http/`) ----

    /// Events of an execution of `session` with `seq > after`, at most `limit`.
    pub fn events_page(
        &self,
        session: SessionId,
        execution: ExecutionId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<EventEnvelope>> {
        self.inner.service.events(session, execution, after, limit)
    }

    /// S-8: purges every execution of `session`, once all of them ended (else
    /// `active_executions`, nothing purged); their reads answer `purged` from then on.
    /// Returns how many it purged. Their log records are removed by the background sweep.
    pub async fn purge_session(&self, session: SessionId) -> Result<usize> {
        let purged = self.inner.service.purge_session(session).await?;
        // Its name and summaries go with it.
        self.inner.service.forget_conversation(session).await?;
        Ok(purged)
    }

    /// S-8: what retention (and the log's sweep) did since the runtime opened.
    pub fn retention_stats(&self) -> &RetentionStats {
        &self.inner.retention_stats
    }

    /// E-3: the pieces of an execution's model responses as they stream in, from now on —
    /// on the node that runs its model calls. Never stored: a piece is a preview, and the
    /// decision's event holds the whole response (a `Delta` at offset 0 after others means
    /// the request was made again: drop what was shown).
    pub fn deltas(&self, session: SessionId, execution: ExecutionId) -> Result<DeltaWatch> {
        self.inner.service.check_session(session, execution)?;
        Ok(self.inner.inspector.deltas(execution))
    }

    /// Issue 36: executions across sessions, as `filter` selects them, needs attention
    /// first (an admin read: `GET /debug/overview`).
    pub fn overview(
        &self,
        filter: &overview::OverviewFilter,
    ) -> Result<Vec<overview::OverviewRow>> {
        overview::overview(self.store().as_ref(), filter)
    }

    /// The seq of the newest event of an execution of `session` (0: none yet).
    pub fn last_seq(&self, session: SessionId, execution: ExecutionId) -> Result<u64> {
        self.inner.service.check_session(session, execution)?;
        let head = self
            .store()
            .head(execution)?
            .ok_or(Error::Purged(execution))?;
        Ok(head.last_seq)
    }

    /// J-1: the resource queue now: each resource's capacity, units in use, the leases and
    /// the Jobs waiting in order; and what it admitted so far.
    pub async fn resources(&self) -> Result<QueueReport> {
        self.inner.service.resources().await
    }

    /// Whether the supervisor actor is still running.
    pub fn supervisor_running(&self) -> bool {
        self.inner.supervisor.connected()
    }

    /// The resource queue's own account of itself (debug endpoint, J-1).
    pub async fn describe_queue(&self) -> Result<openprogram_actors::describe::ActorSummary> {
        self.inner.service.describe_queue().await
    }

    /// The supervisor's own account of itself (debug endpoint).
    pub async fn describe_supervisor(&self) -> Result<openprogram_actors::describe::ActorSummary> {
        self.inner
            .supervisor
            .send(openprogram_actors::describe::Describe)
            .await
            .map_err(|error| Error::Unavailable(error.to_string()))
    }
}
