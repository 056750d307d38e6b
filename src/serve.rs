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

use openprogram_actors::resources::Resources;

use crate::http::{self, auth, Api, Tokens};
use crate::observability::say;
use crate::overview::parse_duration;
use crate::{Error, RestartWindow, Result, Runtime, RuntimeBuilder};

/// The address `serve` listens on unless told.
pub const LISTEN_DEFAULT: &str = "127.0.0.1:7878";

/// What `serve` needs: its command line (`openprogram serve`), whose flags' docs are its
/// `--help`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeOptions {
    /// The node's directory: its admin token and session key, the sled store unless
    /// --store names another, and with a database, the newest position it saw written there.
    #[arg(long, default_value = "./openprogram-data")]
    pub data: PathBuf,
    /// The event store: a directory (sled; default --data) or postgres://…, which
    /// several nodes may share.
    #[arg(long)]
    pub store: Option<String>,
    /// -1 (no limit), 0 (no automatic restart) or a duration such as 90s, 15m, 2h.
    #[arg(long, default_value = "-1", allow_hyphen_values = true)]
    pub restart_window: RestartWindow,
    /// The address the HTTP API, the page and /metrics listen on (port 0: any free
    /// port; the URL is printed). Another address than loopback needs --token.
    #[arg(long, default_value = LISTEN_DEFAULT)]
    pub listen: String,
    /// The admin token (else OPENPROGRAM_TOKEN, else DIR/admin.token, generated once).
    #[arg(long)]
    pub token: Option<String>,
    /// Seed sample sessions into an empty store (once).
    #[arg(long)]
    pub demo: bool,
    /// Open a store that lost acknowledged history (a damaged or truncated file, or a
    /// database restored from an older dump) and keep what remains; prints what was lost
    /// (JSON, stderr) before serving.
    #[arg(long)]
    pub accept_loss: bool,
    /// How long an attempt whose process stops making progress (SIGSTOP, a frozen VM)
    /// keeps its execution before a new attempt takes it over: a duration such as 10s
    /// (the default) or 500ms.
    #[arg(long, value_parser = lease_ttl)]
    pub lease_ttl: Option<Duration>,
    /// Register exactly these revisions of the built-in functions, as NAME:REVISION
    /// separated by commas (steps:1,steps:2); default all. How a deployment of new
    /// code across a restart is simulated.
    // Spelled out: clap would take a plain `Vec` for a repeated flag.
    #[arg(long, value_parser = function_revisions)]
    pub function_revisions: Option<std::vec::Vec<(String, u32)>>,
    /// Let the turns of a session run side by side. By default a session has one
    /// foreground turn: a message sent while another turn of its session runs
    /// follows its `when_busy` (queue, steer, reject, interrupt).
    #[arg(long)]
    pub parallel_turns: bool,
    /// Declare a resource Jobs are admitted for, as NAME=CAPACITY (repeatable), such
    /// as model=8.
    #[arg(long = "resource", value_parser = Resources::parse_one)]
    pub resources: Vec<(String, u32)>,
    /// Purge executions that ended longer ago than this (a duration such as 10s, 30m
    /// or 7d: `d`, `h`, `m`, `s`, `ms`), with their events, receipts and waits; their
    /// reads answer 410 purged. Default: keep everything.
    #[arg(long, value_parser = parse_duration)]
    pub retain_finished: Option<Duration>,
    /// Run as this node of a shared PostgreSQL store: its lease is renewed every
    /// third of --lease-ttl; once it lapses, the other nodes take over its running
    /// executions. Commands for another node's executions are forwarded to it.
    #[arg(long, requires = "store")]
    pub node_id: Option<String>,
    /// The URL other nodes reach this node's API at (default http://LISTEN).
    #[arg(long, requires = "node_id")]
    pub advertise: Option<String>,
    #[command(flatten)]
    pub model: crate::model_args::ModelArgs,
    #[command(flatten)]
    pub observability: crate::observability::ObservabilityArgs,
}

/// `--lease-ttl`: a positive duration, written as the restart window's are.
fn lease_ttl(text: &str) -> std::result::Result<Duration, String> {
    match text.parse::<RestartWindow>() {
        Ok(RestartWindow::Within(ttl)) if !ttl.is_zero() => Ok(ttl),
        _ => Err(format!(
            "invalid lease ttl `{text}`: use a positive duration like 10s or 500ms"
        )),
    }
}

/// `--function-revisions`: NAME:REVISION, comma separated.
fn function_revisions(text: &str) -> std::result::Result<Vec<(String, u32)>, String> {
    text.split(',')
        .filter(|item| !item.trim().is_empty())
        .map(|item| {
            let (name, revision) = item
                .trim()
                .split_once(':')
                .ok_or_else(|| format!("`{item}` is not NAME:REVISION"))?;
            let revision = revision
                .parse::<u32>()
                .map_err(|_| format!("`{item}`: the revision is not a number"))?;
            Ok((name.to_owned(), revision))
        })
        .collect()
}

/// The shortest admin token `serve` accepts from its operator.
pub const TOKEN_CHARS_MIN: usize = 8;

/// N-2: `serve`'s exit status when its node lost its lease (EX_TEMPFAIL: start it again).
pub const LEASE_LOST_EXIT: i32 = 75;

/// Runs until SIGTERM or SIGINT, then shuts down in order. The listen URL goes to stdout;
/// progress lines go to stderr. `InvalidRequest` means a usage error (exit 2).
pub async fn run(options: ServeOptions) -> Result<()> {
    // Listening before the runtime opens: a SIGTERM during startup recovery is an orderly
    // shutdown too.
    let stop = stop_signal()?;
    check_token(&options)?;
    let runtime = runtime(&options)?.open()?;
    if let Some(salvage) = runtime.salvage() {
        // Listed before anything is served (S-7).
        say(format!(
            "openprogram: opened to salvage: {}",
            serde_json::to_string(salvage).unwrap_or_else(|error| error.to_string())
        ));
    }
    let (tokens, token_source) = tokens(&options)?;
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
    let serving = Serving {
        runtime: &runtime,
        handle: server.handle(),
        task: tokio::spawn(server),
    };
    for addr in &addrs {
        println!("http://{addr}");
    }
    let window = match options.restart_window {
        RestartWindow::Unlimited => "interrupted work continues at the next start, however late".to_owned(),
        RestartWindow::Disabled => "interrupted work waits for a person's continue".to_owned(),
        within => format!("interrupted work continues at a start within {within}, else waits for a person"),
    };
    say(format!(
        "openprogram: runtime on {} ({window}); admin token: {}; SIGTERM or SIGINT stops it in order",
        store_name(&options),
        if token_source == "given" { "as given".to_string() } else { format!("in {token_source}") }
    ));
    if let Some(addr) = addrs.first() {
        sign_in_link(&tokens, *addr, &options.data);
    }
    tokio::pin!(stop);
    let report = tokio::select! {
        report = runtime.recovery() => report,
        () = &mut stop => {
            say("openprogram: stopping during startup recovery");
            return serving.stop().await;
        }
    };
    match report {
        Ok(report) => say(format!(
            "openprogram: startup recovery: {} classified, {} resumed, {} expired, {} held, {} reconciling, in {} ms",
            report.classified,
            report.resumed.len(),
            report.expired.len(),
            report.held.len(),
            report.reconciling.len(),
            report.elapsed.as_millis()
        )),
        Err(error) => {
            serving.stop().await?;
            return Err(error);
        }
    }
    if options.demo {
        tokio::select! {
            seeded = http::demo::seed_once(&runtime, &tokens, &options.data) => match seeded {
                Ok(Some(seeded)) => {
                    let _ = demo.set(seeded);
                }
                Ok(None) => say("openprogram: --demo: the store is not empty and was not seeded by --demo; nothing seeded"),
                Err(error) => say(format!("openprogram: --demo: seeding failed: {error}")),
            },
            () = &mut stop => return serving.stop().await,
        }
    }
    tokio::select! {
        () = stop => {}
        reason = runtime.lease_lost() => {
            // N-2: other nodes may run this node's executions now, and effects of its old
            // attempts may still be in flight here: no orderly shutdown (it would write),
            // the process ends and its next start is a new incarnation.
            say(format!("openprogram: this node lost its lease ({reason}); exiting for a clean restart"));
            std::process::exit(LEASE_LOST_EXIT);
        }
    }
    serving.stop().await
}

/// a token the operator chose is long enough, and there is one unless the API listens
/// on loopback only.
fn check_token(options: &ServeOptions) -> Result<()> {
    match &options.token {
        // An empty `--token ""` or `OPENPROGRAM_TOKEN=` is a mistake, never "no token".
        Some(token) if token.trim().len() < TOKEN_CHARS_MIN => Err(Error::InvalidRequest(format!(
            "a token must have at least {TOKEN_CHARS_MIN} characters"
        ))),
        None if !http::is_loopback(&options.listen) => Err(Error::InvalidRequest(format!(
            "refusing to listen on {} without a token: pass --token or set OPENPROGRAM_TOKEN",
            options.listen
        ))),
        _ => Ok(()),
    }
}

/// The runtime as `options` ask for it. Conversations: one turn per session unless
/// `--parallel-turns`; a session named by its first words, or by the model
/// (`--name-sessions-with-model`); a prefix compacted to excerpts of what it replaces; the
/// `--context-budget`.
fn runtime(options: &ServeOptions) -> Result<RuntimeBuilder> {
    let mut builder = Runtime::builder();
    let mut tools = openprogram_actors::agent::ToolRegistry::builtin();
    for tool in options.model.tools()? {
        tools.register(tool.clone());
        builder = builder.tool(tool);
    }
    let provider = options.model.provider(&tools)?;
    let namer: Arc<dyn crate::SessionNamer> = match &provider {
        Some(provider) if options.model.name_sessions_with_model => {
            Arc::new(crate::ModelNamer::new(Arc::clone(provider)))
        }
        _ => Arc::new(crate::FirstWords),
    };
    let node = match &options.node_id {
        Some(node_id) => Some((node_id.clone(), node_url(options)?)),
        None => None,
    };
    Ok(builder
        .with(provider, RuntimeBuilder::provider)
        .one_turn_per_session(!options.parallel_turns)
        .session_namer(namer)
        .compactor(Arc::new(crate::Excerpts))
        .with(options.model.context_budget, RuntimeBuilder::context_budget)
        .with(
            options.function_revisions.clone(),
            RuntimeBuilder::builtin_function_revisions,
        )
        .resources(&options.resources)
        .with(options.retain_finished, RuntimeBuilder::retain_finished)
        .with(node, |builder, (node_id, url)| builder.node(node_id, url))
        .data_dir(&options.data)
        .with(options.store.clone(), RuntimeBuilder::store_url)
        .restart_window(options.restart_window)
        .accept_loss(options.accept_loss)
        .lease_ttl(options.lease_ttl.unwrap_or(crate::LEASE_TTL_DEFAULT)))
}

/// The page's one-time sign-in link (the admin token itself never goes into a URL or a log):
/// on the terminal that started `serve`, else (logs may be kept and read by others) in
/// `DIR/sign-in.url`, readable by its owner only.
fn sign_in_link(tokens: &Tokens, addr: std::net::SocketAddr, data: &std::path::Path) {
    use std::io::IsTerminal as _;
    let host = match addr.ip().is_unspecified() {
        true => std::net::SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port()),
        false => addr,
    };
    let link = format!("http://{host}/login?code={}", tokens.sign_in().code());
    if std::io::stderr().is_terminal() {
        return say(format!("openprogram: open the page signed in (once, within ten minutes): {link}"));
    }
    let path = data.join("sign-in.url");
    match http::auth::write_secret(&path, &link) {
        Ok(()) => say(format!(
            "openprogram: the page's sign-in link (once, within ten minutes) is in {}",
            path.display()
        )),
        Err(error) => tracing::warn!(%error, "the page's sign-in link could not be written"),
    }
}

/// The node's tokens, and where its admin token came from. Its directory holds them even
/// when the store is elsewhere (PostgreSQL).
fn tokens(options: &ServeOptions) -> Result<(Tokens, String)> {
    let io = |what: &str, error: std::io::Error| Error::Unavailable(format!("{what}: {error}"));
    std::fs::create_dir_all(&options.data).map_err(|e| io("the data directory", e))?;
    let (admin_token, token_source) = auth::admin_token(&options.data, options.token.clone())
        .map_err(|e| io("admin token", e))?;
    let session_key =
        auth::load_or_create_session_key(&options.data).map_err(|e| io("session key", e))?;
    Ok((Tokens::new(&admin_token, session_key), token_source))
}

/// The HTTP server running beside the runtime.
struct Serving<'a> {
    runtime: &'a Runtime,
    handle: actix_web::dev::ServerHandle,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Serving<'_> {
    /// Stops the HTTP server (no new requests; streams close), then the runtime in order.
    async fn stop(self) -> Result<()> {
        say("openprogram: stopping: HTTP first, then pausing running executions for restart recovery");
        self.handle.stop(true).await;
        let _ = self.task.await;
        let stopped = self.runtime.shutdown().await;
        say(format!(
            "openprogram: stopped: {} live, {} left running, in {} ms",
            stopped.live,
            stopped.left_running,
            stopped.elapsed.as_millis()
        ));
        if let Some(error) = stopped.store_close_error {
            say(format!("openprogram: the store did not close cleanly: {error}"));
        }
        Ok(())
    }
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
