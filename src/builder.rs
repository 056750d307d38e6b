//! `RuntimeBuilder`: what a `Runtime` is opened with, and `open`, which opens the store and
//! starts the actors around it: the executions' environment, the resource queue, the wait
//! deadlines, retention and the supervisor, whose startup recovery runs in the background.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use actix::Actor as _;
use futures::FutureExt as _;
use openprogram_actors::agent::{Provider, QuestionHandler, Scripted, Tool, ToolRegistry};
use openprogram_actors::conversation_hooks::ConversationHooks;
use openprogram_actors::directory::{Directory, Executions};
use openprogram_actors::env::{Env, NodeIdentity};
use openprogram_actors::figures::{FigureSamples, Figures};
use openprogram_actors::function::FunctionRegistry;
use openprogram_actors::inspect::Inspector;
use openprogram_actors::mailbox::Mailbox;
use openprogram_actors::recovery::{Clock, SystemClock};
use openprogram_actors::resource_queue::{JobHost, Load, ResourceQueue};
use openprogram_actors::resources::Resources;
use openprogram_actors::retention::{Retention, RetentionStats};
use openprogram_actors::service::Service;
use openprogram_actors::supervisor::{keep_node_lease, renew_node, Recover, Supervisor};
use openprogram_actors::system::ActorSystem;
use openprogram_actors::wait_deadlines::{DeadlineHost, Load as LoadDeadlines, WaitDeadlines};
use openprogram_storage::{EventReader, EventStore, Limits};

use crate::{DurableFunction, Error, Inner, RestartWindow, Result, Runtime, VersionPolicy};

/// Configures and opens a `Runtime`.
#[derive(Default)]
pub struct RuntimeBuilder {
    pub(crate) data_dir: Option<PathBuf>,
    provider: Option<Arc<dyn Provider>>,
    tools: Option<ToolRegistry>,
    functions: Vec<DurableFunction>,
    builtin_revisions: Option<Vec<(String, u32)>>,
    function_policy: Option<VersionPolicy>,
    /// C-2 off: the turns of a session run side by side (`one_turn_per_session(false)`).
    pub(crate) parallel_turns: bool,
    pub(crate) conversation_hooks: openprogram_actors::conversation_hooks::ConversationHooks,
    pub(crate) limits: Limits,
    lease_ttl: Option<Duration>,
    restart_window: RestartWindow,
    clock: Option<Arc<dyn Clock>>,
    shutdown_timeout: Option<Duration>,
    process_stop_grace: Option<Duration>,
    pub(crate) accept_loss: bool,
    /// A store opened by the caller: the actors' handle, and the readers' one on the same store.
    pub(crate) store: Option<(Arc<dyn EventStore>, Arc<dyn EventReader>)>,
    pub(crate) store_url: Option<String>,
    resources: Vec<(String, u32)>,
    retain_finished: Option<Duration>,
    node: Option<NodeIdentity>,
    question_handler: Option<Arc<dyn QuestionHandler>>,
}

/// How long an attempt keeps its lease without a heartbeat, unless configured.
pub const LEASE_TTL_DEFAULT: Duration = Duration::from_secs(10);

/// How long an orderly shutdown waits for running effects to reach a safe point, unless configured.
pub const SHUTDOWN_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

impl std::fmt::Debug for RuntimeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeBuilder")
            .field("data_dir", &self.data_dir)
            .finish()
    }
}

impl RuntimeBuilder {
    /// A store opened by the caller, instead of `data_dir` (which is then not needed, nor `limits`
    /// and `accept_loss`, which the caller's open decided). The caller keeps its own handle; the
    /// runtime's actors write through theirs, and `Runtime::store` reads. Any `EventStore` serves:
    /// the embedded `Store` (sled) or, with the feature `postgres`, a `storage::pg::PgStore`.
    /// `Runtime::shutdown` leaves such a store open: closing it (`EventStore::close`) is the
    /// caller's.
    pub fn store<S: EventStore + Clone>(mut self, store: S) -> Self {
        self.store = Some((Arc::new(store.clone()), Arc::new(store)));
        self
    }

    /// N-1: the store named as `serve --store` names it: `postgres://…` (or `postgresql://…`) is a
    /// PostgreSQL database, which needs the feature `postgres` (`invalid_request` without it);
    /// anything else is the sled store's directory, as `data_dir`. With a database, `data_dir`
    /// is this node's own directory, where it keeps the highest position it saw acknowledged,
    /// to refuse a database restored from an older dump (S-7); without one, nothing is kept.
    pub fn store_url(mut self, url: impl Into<String>) -> Self {
        self.store_url = Some(url.into());
        self
    }

    /// Where the embedded sled store lives. Required, unless `store` or `store_url` gives one.
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

    /// How long an attempt keeps its lease without a heartbeat. Default 10 s.
    pub fn lease_ttl(mut self, ttl: Duration) -> Self {
        self.lease_ttl = Some(ttl);
        self
    }

    /// how long after an interruption executions continue by themselves. Default
    /// `RestartWindow::Unlimited` (`-1`).
    pub fn restart_window(mut self, window: RestartWindow) -> Self {
        self.restart_window = window;
        self
    }

    /// Who answers the questions code asks outside a managed execution (a tool's reconcile
    /// protocol at startup, a tool the embedder calls itself with `Runtime::outside_call`):
    /// a headless service's policy or prompt. Without one they get `AskError::NoInteraction`.
    pub fn question_handler(mut self, handler: Arc<dyn QuestionHandler>) -> Self {
        self.question_handler = Some(handler);
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

    /// Time between SIGTERM and SIGKILL when `stop_process` stops a managed process. Default 5 s.
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

    /// S-7: open a store that lost acknowledged history (a damaged or truncated file, a database
    /// restored from an older dump) and keep what remains, instead of refusing it
    /// (`acknowledged_lost`). `Runtime::salvage` then says what was lost. An operator's explicit
    /// choice; never needed for a healthy store.
    pub fn accept_loss(mut self, accept: bool) -> Self {
        self.accept_loss = accept;
        self
    }

    /// `set` with `value`, if there is one: an optional setting passed on as it is.
    #[cfg(feature = "server")]
    pub(crate) fn with<T>(self, value: Option<T>, set: impl FnOnce(Self, T) -> Self) -> Self {
        let Some(value) = value else { return self };
        set(self, value)
    }

    /// `resource` for each of `resources` (NAME=CAPACITY flags).
    #[cfg(feature = "server")]
    pub(crate) fn resources(self, resources: &[(String, u32)]) -> Self {
        let declare = |builder: Self, (name, capacity): &(String, u32)| {
            builder.resource(name.clone(), *capacity)
        };
        resources.iter().fold(self, declare)
    }

    /// Opens the store, starts the actor system and the supervisor, and begins startup
    /// recovery in the background (`Runtime::recovery` waits for its report).
    pub fn open(mut self) -> Result<Runtime> {
        let conversation_hooks = self.conversation_hooks()?;
        let functions = self.function_registry()?;
        // Inspection gets the store's reads only; the actors, the one writer.
        let owns_store = self.store.is_none();
        let ((store, reader), salvage) = self.open_store()?;
        let system = ActorSystem::start("openprogram")?;
        let env = self.env(store, functions, conversation_hooks)?;
        let env = Executions::new(Arc::new(env), Directory::new(system.arbiters()));
        if env.node.is_some() {
            keep_node_lease(Arc::downgrade(env.env()))
                .map_err(|error| Error::Unavailable(format!("the node lease thread: {error}")))?;
        }
        let arbiter = &system.arbiters()[0];
        let host = || Arc::downgrade(&env) as Weak<Executions>;
        // J-1: the resource queue; it leases nothing before recovery is over (`Load`).
        let queue = {
            let host: Weak<dyn JobHost> = host();
            let (resources, reader, clock) = (
                env.resources.clone(),
                Arc::clone(&reader),
                Arc::clone(&env.clock),
            );
            Mailbox::start_in(arbiter, move |mailbox| {
                ResourceQueue::new(resources, host, reader, clock, mailbox)
            })
        };
        env.set_queue(queue.clone());
        // W-8: the wait deadlines; pending ones are read once recovery is over (`Load`).
        let deadlines = {
            let deadlines =
                WaitDeadlines::new(host() as Weak<dyn DeadlineHost>, Arc::clone(&env.clock));
            WaitDeadlines::start_in_arbiter(arbiter, move |_| deadlines)
        };
        env.set_deadlines(deadlines.clone());
        // S-8: purges a crash left half done, ended executions past the retention policy,
        // and the log's sweep.
        let retention_stats = Arc::new(RetentionStats::default());
        let retention = Retention::new(
            Arc::clone(&env.store),
            Arc::clone(&env.clock),
            self.retain_finished,
            Arc::clone(&retention_stats),
        );
        Retention::start_in_arbiter(arbiter, move |_| retention);
        // The page's charts: recent figures, sampled until the actors stop.
        let figures = FigureSamples::default();
        let sampler = Figures::new(Arc::clone(env.env()), figures.clone());
        Figures::start_in_arbiter(arbiter, move |_| sampler);
        let supervisor_env = Arc::clone(&env);
        let supervisor = Mailbox::start_in(arbiter, move |mailbox| {
            Supervisor::new(supervisor_env, mailbox)
        });
        let recovered = {
            let (recovery, env) = (supervisor.send(Recover), Arc::clone(&env));
            async move {
                let report = recovery.await;
                // The queue starts leasing once recovery is over, whether or not it
                // succeeded: what it reads from the store is the truth either way.
                let (unread, stopped) = (
                    "the resource queue could not read every Job",
                    "the resource queue is not running",
                );
                logged(queue.send(Load).await, unread, stopped);
                let (unread, stopped) = (
                    "the wait deadlines could not all be read",
                    "the wait deadlines actor is not running",
                );
                logged(deadlines.send(LoadDeadlines).await, unread, stopped);
                report.unwrap_or_else(|error| {
                    // The supervisor never ran it: commands must not wait for it forever.
                    env.lifecycle.mark_recovered();
                    Err(Error::Unavailable(error.to_string()))
                })
            }
            .boxed()
            .shared()
        };
        // Recovery runs even if nobody asks for its report.
        arbiter.spawn(recovered.clone().map(|_| ()));
        Ok(Runtime {
            inner: Arc::new(Inner {
                node: env.node.clone(),
                inspector: Inspector::new(Arc::clone(&env), reader),
                service: Service::new(env),
                system: Mutex::new(Some(system)),
                supervisor,
                recovered,
                shutdown_timeout: self.shutdown_timeout.unwrap_or(SHUTDOWN_TIMEOUT_DEFAULT),
                salvage,
                retention_stats,
                figures,
                owns_store,
            }),
        })
    }

    /// The built-in functions (those `builtin_function_revisions` keeps) and the registered ones.
    fn function_registry(&mut self) -> Result<FunctionRegistry> {
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
        Ok(functions)
    }

    /// The executions' environment as configured, registered as a node (N-2) before
    /// anything runs, so that no other node takes this one's executions for abandoned ones.
    fn env(
        &mut self,
        store: Arc<dyn EventStore>,
        functions: FunctionRegistry,
        conversation_hooks: ConversationHooks,
    ) -> Result<Env> {
        let owner = store.incarnation().owner_id;
        let mut env = Env::new(
            store,
            self.provider.take().unwrap_or_else(|| Arc::new(Scripted)),
            self.tools.take().unwrap_or_else(ToolRegistry::builtin),
            owner,
            self.lease_ttl.unwrap_or(LEASE_TTL_DEFAULT),
            self.clock.take().unwrap_or_else(|| Arc::new(SystemClock)),
            self.restart_window,
        );
        env.process_stop_grace = self.process_stop_grace.unwrap_or(env.process_stop_grace);
        env.resources = Resources::new(std::mem::take(&mut self.resources))?;
        env.functions = Arc::new(functions);
        env.one_turn_per_session = !self.parallel_turns;
        env.conversation_hooks = conversation_hooks;
        env.function_policy = self.function_policy.unwrap_or(env.function_policy);
        env.node = self.node.take();
        env.question_handler = self.question_handler.take();
        if let Some(node) = renew_node(&env)? {
            tracing::info!(node_id = %node.node_id, url = %node.url, "registered as a node");
        }
        Ok(env)
    }
}

/// Logs a background actor that could not read what it keeps (`Load`), or is not running:
/// it runs on with what it has.
fn logged<T>(
    answer: std::result::Result<Result<T>, actix::MailboxError>,
    unread: &str,
    stopped: &str,
) {
    match answer {
        Ok(Ok(_)) => {}
        Ok(Err(error)) => tracing::error!(%error, "{unread}"),
        Err(error) => tracing::error!(%error, "{stopped}"),
    }
}
