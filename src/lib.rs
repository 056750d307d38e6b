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

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

pub use openprogram_actors::env::NodeIdentity;
use openprogram_actors::inspect::Inspector;
pub use openprogram_actors::retention::RetentionStats;
use openprogram_actors::service::Service;
use openprogram_actors::supervisor::{begin_shutdown, Shutdown, Supervisor};
use openprogram_actors::system::ActorSystem;
use openprogram_storage::{CommandId, EventEnvelope, EventReader, ExecutionId, SessionId};

mod builder;
mod conversation;
mod nodes;
mod stores;

pub use builder::{RuntimeBuilder, LEASE_TTL_DEFAULT, SHUTDOWN_TIMEOUT_DEFAULT};
pub use nodes::{NodeReport, NodesReport};
pub use stores::is_postgres_url;

pub mod overview;

/// Items of the server only: the `server` feature, on by default; an embedder turns it off.
macro_rules! server {
    ($($item:item)*) => { $(#[cfg(feature = "server")] $item)* };
}

server! {
    pub mod cluster;
    pub mod cpu_cap;
    pub mod http;
    pub mod load;
    mod load_commands;
    mod load_jobs;
    pub mod load_remote;
    mod load_report;
    mod load_store;
    pub mod model_args;
    pub mod observability;
    pub mod process_stats;
    pub mod serve;
    pub mod soak;
}

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
pub use openprogram_actors::recovery::{Clock, ManualClock, RestartWindow};
pub use openprogram_actors::resource_queue::{QueueReport, QueueStats, WAIT_BUCKETS_MS};
pub use openprogram_actors::resources::{Lease, ResourceView};
pub use openprogram_actors::service::{
    CommandReply, FunctionStart, ScriptElement, StartReply, StartRequest,
};
pub use openprogram_actors::transcript::{Block, BlockBody, Message};
pub use openprogram_actors::wait_request::{InvalidAnswer, WaitRequest, WaitSpec};
pub use openprogram_actors::watchers::CommitWatch;

pub use openprogram_macros::{durable_function, durable_helper};

/// How the runtime knows which code a durable function's revision is.
///
/// `#[durable_function]` identifies a revision by its code and the code of the helpers it
/// declares, each marked `#[durable_helper]`: an execution started on a revision whose code
/// has changed since waits (`revision_missing`) instead of running other code under its name.
/// So a body must declare every function of its crate it calls; one it does not declare is
/// a compile error:
///
/// ```compile_fail
/// #[openprogram::durable_helper]
/// fn amount(input: &serde_json::Value) -> u64 {
///     input["amount"].as_u64().unwrap_or(0)
/// }
///
/// #[openprogram::durable_function(name = "refund", revision = 1)]
/// async fn refund(
///     _ctx: openprogram::FunctionContext,
///     input: serde_json::Value,
/// ) -> Result<serde_json::Value, String> {
///     Ok(serde_json::json!(amount(&input)))
/// }
/// ```
///
/// Declared, it compiles, and a change to `amount` is a change of `refund`'s identity:
///
/// ```
/// #[openprogram::durable_helper]
/// fn amount(input: &serde_json::Value) -> u64 {
///     input["amount"].as_u64().unwrap_or(0)
/// }
///
/// #[openprogram::durable_function(name = "refund", revision = 1, helpers(amount))]
/// async fn refund(
///     _ctx: openprogram::FunctionContext,
///     input: serde_json::Value,
/// ) -> Result<serde_json::Value, String> {
///     Ok(serde_json::json!(amount(&input)))
/// }
///
/// let _runtime_registers = refund_durable();
/// ```
///
/// A function of another crate is called by its path (`serde_json::to_string`); one of this
/// crate through a module path is not seen by the check, so call it by its `crate::` path.
pub mod identity {}
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

/// What `Runtime::follow` returns: an execution's newest seq, and its watches from then on.
#[derive(Debug)]
pub struct Following {
    /// The execution's newest event's seq when it was followed.
    pub last_seq: u64,
    /// The pieces of its model responses streaming in on this node (E-3).
    pub deltas: DeltaWatch,
    /// The events its actor on this node commits, each transition's as it commits.
    pub commits: CommitWatch,
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
    supervisor: openprogram_actors::mailbox::Mailbox<Supervisor>,
    recovered: futures::future::Shared<futures::future::BoxFuture<'static, Result<RecoveryReport>>>,
    shutdown_timeout: Duration,
    /// What an open with `accept_loss` found.
    salvage: Option<openprogram_storage::SalvageReport>,
    retention_stats: Arc<RetentionStats>,
    /// The recent figures the page draws (`openprogram_actors::figures`).
    figures: openprogram_actors::figures::FigureSamples,
    node: Option<NodeIdentity>,
    /// The runtime opened its store (from `data_dir` or `store_url`), so `shutdown` closes
    /// it; a store the caller passed to `RuntimeBuilder::store` is the caller's to close.
    owns_store: bool,
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

    /// S-7: what the open found lost, when it was opened with `accept_loss` and something was.
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

    /// W-4: a handle for a tool call the embedder makes itself, outside any execution: its
    /// questions go to the `question_handler` (or get `AskError::NoInteraction`); it starts
    /// no process and calls no function.
    pub fn outside_call(&self, effect_id: openprogram_storage::EffectId) -> agent::CallHandle {
        self.inner.service.env().outside_call(effect_id)
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
    /// the paused executions within the restart window. Then the store the runtime opened
    /// is closed: everything queued is written, its files and connections are let go, and
    /// the data directory can be opened again, or removed, once this returns
    /// (`ShutdownReport::store_close_error` says otherwise). Reads through this runtime
    /// afterwards answer `closed`.
    pub async fn shutdown(&self) -> ShutdownReport {
        let timeout = self.inner.shutdown_timeout;
        // Stop new work now; the supervisor may still be busy with startup recovery, which
        // sees the flag and claims nothing more.
        begin_shutdown(self.inner.service.env());
        let asked = self.inner.supervisor.send(Shutdown { timeout });
        let mut report = asked.await.unwrap_or_default();
        self.halt();
        if self.inner.owns_store {
            if let Err(error) = self.inner.service.env().store.close().await {
                tracing::error!(%error, "closing the store at shutdown");
                report.store_close_error = Some(error.to_string());
            }
        }
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

    /// What following an execution live takes, with one read of the store: its newest seq now,
    /// and from now on the pieces of its model responses (as `deltas`) and the events its
    /// actor on this node commits, as each transition commits (what other writers and nodes
    /// commit is only in the store).
    pub fn follow(&self, session: SessionId, execution: ExecutionId) -> Result<Following> {
        let last_seq = self.inner.service.last_seq(session, execution)?;
        Ok(Following {
            last_seq,
            deltas: self.inner.inspector.deltas(execution),
            commits: self.inner.inspector.commits(execution),
        })
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
        self.inner.service.last_seq(session, execution)
    }

    /// J-1: the resource queue now: each resource's capacity, units in use, the leases and
    /// the Jobs waiting in order; and what it admitted so far.
    pub async fn resources(&self) -> Result<QueueReport> {
        self.inner.service.resources().await
    }

    /// The figures of the last ten minutes, a sample every ten seconds, oldest first: steps
    /// committed on this node, executions by unfinished state, Jobs waiting for resources.
    pub fn figures(&self) -> Vec<openprogram_actors::figures::FigureSample> {
        self.inner.figures.all()
    }

    /// F-1: the durable functions this runtime can start, each with its registered revisions.
    pub fn functions(&self) -> Vec<(String, Vec<u32>)> {
        self.inner.service.env().functions.catalog()
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
        let asked = self
            .inner
            .supervisor
            .send(openprogram_actors::describe::Describe);
        asked
            .await
            .map_err(|error| Error::Unavailable(error.to_string()))
    }
}
