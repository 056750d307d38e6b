//! `openprogram serve`: the runtime as a long-running process on its embedded store, with
//! the HTTP API, debug endpoint and page (`http/`). Startup recovery runs first;
//! SIGTERM or SIGINT stops the HTTP server, then shuts the runtime down in order.
//!
//! Tokens: the admin token is `--token`, else `OPENPROGRAM_TOKEN`, else the one in
//! `DIR/admin.token` (generated with mode 0600 on first start). A non-loopback `--listen`
//! needs a token the operator chose.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::http::{self, auth, Api, Tokens};
use crate::{Error, RestartWindow, Result, Runtime};

/// The address `serve` listens on unless told.
pub const LISTEN_DEFAULT: &str = "127.0.0.1:7878";

/// What `serve` needs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The node's directory (tokens), and the sled store's unless `store` names another.
    pub data: PathBuf,
    /// N-1: the event store, as `--store` names it (a directory, or `postgres://…`).
    pub store: Option<String>,
    pub restart_window: RestartWindow,
    pub listen: String,
    /// The admin token chosen by the operator (`--token` or `OPENPROGRAM_TOKEN`).
    pub token: Option<String>,
    /// Seed sample sessions into an empty store (once).
    pub demo: bool,
    /// S-7: open a store that lost acknowledged history, listing what was lost first.
    pub accept_loss: bool,
    /// the attempt lease's ttl (default `LEASE_TTL_DEFAULT`).
    pub lease_ttl: Option<Duration>,
    /// F-3: exactly these revisions of the built-in functions (default all).
    pub function_revisions: Option<Vec<(String, u32)>>,
    /// C-2 off: the turns of a session run side by side (`--parallel-turns`).
    pub parallel_turns: bool,
    /// J-1: the resources Jobs are admitted for (`--resource NAME=CAPACITY`).
    pub resources: Vec<(String, u32)>,
    /// S-8: purge executions ended longer ago than this (`--retain-finished`).
    pub retain_finished: Option<Duration>,
    /// N-2: run as this node of a shared store (`--node-id`).
    pub node_id: Option<String>,
    /// N-3: the URL other nodes reach this one at (`--advertise`; default
    /// `http://LISTEN`).
    pub advertise: Option<String>,
    /// Issue 35: a real model provider (`--provider …`); the scripted one if none.
    pub model: crate::model_args::ModelArgs,
}

/// How `serve` runs conversations: one turn per session unless `--parallel-turns`; a
/// session named by its first words, or by the model (`--name-sessions-with-model`); a
/// prefix compacted to excerpts of what it replaces; the `--context-budget`.
fn conversations(
    builder: crate::RuntimeBuilder,
    options: &ServeOptions,
    provider: Option<Arc<dyn openprogram_actors::agent::Provider>>,
) -> crate::RuntimeBuilder {
    let namer: Arc<dyn crate::SessionNamer> = match provider {
        Some(provider) if options.model.name_sessions_with_model => {
            Arc::new(crate::ModelNamer::new(provider))
        }
        _ => Arc::new(crate::FirstWords),
    };
    let builder = builder
        .one_turn_per_session(!options.parallel_turns)
        .session_namer(namer)
        .compactor(Arc::new(crate::Excerpts));
    match options.model.context_budget {
        Some(tokens) => builder.context_budget(tokens),
        None => builder,
    }
}

/// The shortest admin token `serve` accepts from its operator.
pub const TOKEN_CHARS_MIN: usize = 8;

/// Runs until SIGTERM or SIGINT, then shuts down in order. The listen URL goes to stdout;
/// progress lines go to stderr. `InvalidRequest` means a usage error (exit 2).
pub async fn run(options: ServeOptions) -> Result<()> {
    // Listening before the runtime opens: a SIGTERM during startup recovery is an orderly
    // shutdown too.
    let stop = stop_signal()?;
    if let Some(token) = &options.token {
        // An empty `--token ""` or `OPENPROGRAM_TOKEN=` is a mistake, never "no token".
        if token.trim().len() < TOKEN_CHARS_MIN {
            return Err(Error::InvalidRequest(format!(
                "a token must have at least {TOKEN_CHARS_MIN} characters"
            )));
        }
    }
    if options.token.is_none() && !http::is_loopback(&options.listen) {
        return Err(Error::InvalidRequest(format!(
            "refusing to listen on {} without a token: pass --token or set OPENPROGRAM_TOKEN (X-2)",
            options.listen
        )));
    }
    let mut builder = Runtime::builder();
    let mut tools = openprogram_actors::agent::ToolRegistry::builtin();
    for tool in options.model.tools()? {
        tools.register(tool.clone());
        builder = builder.tool(tool);
    }
    let provider = options.model.provider(&tools)?;
    if let Some(provider) = &provider {
        builder = builder.provider(Arc::clone(provider));
    }
    builder = conversations(builder, &options, provider);
    if let Some(revisions) = &options.function_revisions {
        builder = builder.builtin_function_revisions(revisions.clone());
    }
    for (name, capacity) in &options.resources {
        builder = builder.resource(name.clone(), *capacity);
    }
    if let Some(retain) = options.retain_finished {
        builder = builder.retain_finished(retain);
    }
    if let Some(node_id) = &options.node_id {
        builder = builder.node(node_id.clone(), node_url(&options)?);
    }
    builder = match &options.store {
        Some(store) => builder.store_url(store.clone()),
        None => builder.data_dir(&options.data),
    };
    let runtime = builder
        .restart_window(options.restart_window)
        .accept_loss(options.accept_loss)
        .lease_ttl(options.lease_ttl.unwrap_or(crate::LEASE_TTL_DEFAULT))
        .open()?;
    if let Some(salvage) = runtime.salvage() {
        // Listed before anything is served (S-7).
        crate::observability::say(format!(
            "openprogram: opened to salvage: {}",
            serde_json::to_string(salvage).unwrap_or_else(|error| error.to_string())
        ));
    }
    let io = |what: &str, error: std::io::Error| Error::Unavailable(format!("{what}: {error}"));
    // The node's directory holds its tokens even when the store is elsewhere (PostgreSQL).
    std::fs::create_dir_all(&options.data).map_err(|e| io("the data directory", e))?;
    let (admin_token, token_source) = auth::admin_token(&options.data, options.token.clone())
        .map_err(|e| io("admin token", e))?;
    let session_key =
        auth::load_or_create_session_key(&options.data).map_err(|e| io("session key", e))?;
    let tokens = Tokens::new(&admin_token, session_key);
    let demo = Arc::new(OnceLock::new());
    let mut api = Api::new(runtime.clone(), tokens.clone());
    api.demo = Some(Arc::clone(&demo));
    let (server, addrs) = match http::start(api, &options.listen) {
        Ok(started) => started,
        Err(error) => {
            runtime.shutdown().await;
            return Err(Error::Unavailable(format!(
                "cannot listen on {}: {error}",
                options.listen
            )));
        }
    };
    let handle = server.handle();
    let server_task = tokio::spawn(server);
    for addr in &addrs {
        println!("http://{addr}");
    }
    crate::observability::say(format!(
        "openprogram: runtime on {} (restart window {}); admin token: {}; SIGTERM or SIGINT stops it in order",
        store_name(&options),
        options.restart_window,
        if token_source == "given" { "as given".to_string() } else { format!("in {token_source}") }
    ));
    tokio::pin!(stop);
    let report = tokio::select! {
        report = runtime.recovery() => report,
        () = &mut stop => {
            crate::observability::say("openprogram: stopping during startup recovery");
            return stop_all(&runtime, handle, server_task).await;
        }
    };
    match report {
        Ok(report) => crate::observability::say(format!(
            "openprogram: startup recovery: {} classified, {} resumed, {} expired, {} held, {} reconciling, in {} ms",
            report.classified,
            report.resumed.len(),
            report.expired.len(),
            report.held.len(),
            report.reconciling.len(),
            report.elapsed.as_millis()
        )),
        Err(error) => {
            stop_all(&runtime, handle, server_task).await?;
            return Err(error);
        }
    }
    if options.demo {
        tokio::select! {
            seeded = http::demo::seed_once(&runtime, &tokens, &options.data) => match seeded {
                Ok(Some(seeded)) => {
                    let _ = demo.set(seeded);
                }
                Ok(None) => crate::observability::say("openprogram: --demo: the store is not empty and was not seeded by --demo; nothing seeded"),
                Err(error) => crate::observability::say(format!("openprogram: --demo: seeding failed: {error}")),
            },
            () = &mut stop => return stop_all(&runtime, handle, server_task).await,
        }
    }
    tokio::select! {
        () = stop => {}
        reason = runtime.lease_lost() => {
            // N-2: other nodes may run this node's executions now, and effects of its old
            // attempts may still be in flight here: no orderly shutdown (it would write),
            // the process ends and its next start is a new incarnation.
            crate::observability::say(format!("openprogram: this node lost its lease ({reason}); exiting for a clean restart"));
            std::process::exit(LEASE_LOST_EXIT);
        }
    }
    stop_all(&runtime, handle, server_task).await
}

/// N-2: `serve`'s exit status when its node lost its lease (EX_TEMPFAIL: start it again).
pub const LEASE_LOST_EXIT: i32 = 75;

/// Stops the HTTP server (no new requests; streams close), then the runtime in order.
async fn stop_all(
    runtime: &Runtime,
    handle: actix_web::dev::ServerHandle,
    server_task: tokio::task::JoinHandle<std::io::Result<()>>,
) -> Result<()> {
    crate::observability::say(
        "openprogram: stopping: HTTP first, then pausing running executions for restart recovery",
    );
    handle.stop(true).await;
    let _ = server_task.await;
    let stopped = runtime.shutdown().await;
    crate::observability::say(format!(
        "openprogram: stopped: {} live, {} left running, in {} ms",
        stopped.live,
        stopped.left_running,
        stopped.elapsed.as_millis()
    ));
    Ok(())
}

/// Registers for SIGTERM and SIGINT now; the future resolves at the first of them.
pub(crate) fn stop_signal() -> Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let unavailable = |error: std::io::Error| Error::Unavailable(format!("signals: {error}"));
    let mut terminate = signal(SignalKind::terminate()).map_err(unavailable)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(unavailable)?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    })
}

/// N-3: where other nodes reach this one: `--advertise`, else `http://LISTEN` when LISTEN
/// names a port (a port the system picks cannot be advertised before it is bound).
fn node_url(options: &ServeOptions) -> Result<String> {
    if let Some(url) = &options.advertise {
        return Ok(url.clone());
    }
    match options.listen.rsplit_once(':') {
        Some((_, port)) if port.parse::<u16>().is_ok_and(|port| port != 0) => {
            Ok(format!("http://{}", options.listen))
        }
        _ => Err(Error::InvalidRequest(format!(
            "--node-id needs --listen with a port other nodes can reach (not {}), or --advertise URL",
            options.listen
        ))),
    }
}

/// The store, as the operator reads it: a PostgreSQL URL without its password.
fn store_name(options: &ServeOptions) -> String {
    match &options.store {
        Some(url) if crate::is_postgres_url(url) => without_password(url),
        Some(directory) => directory.clone(),
        None => options.data.display().to_string(),
    }
}

/// `postgres://user:secret@host/db` → `postgres://user:***@host/db`.
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.rsplit_once('@') {
        Some((user_info, host)) => match user_info.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}
