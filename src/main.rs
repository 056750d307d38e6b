//! The `openprogram` command line (SPEC §6): `load` (embedded), `serve` (the runtime with
//! its HTTP API), and the HTTP clients `ctl` (controls) and `inspect` (reads). Exit codes:
//! 0 ok, 1 the operation failed, 2 usage error; errors are one line on stderr.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use openprogram::http::client::{self, Failure, Target};
use openprogram::http::client_select;
use openprogram::load::{self, LoadOptions};
use openprogram::serve::{self, ServeOptions};
use openprogram::soak;
use openprogram::{CommandKind, RestartWindow};

/// jemalloc rather than glibc malloc: sled and the actors free on one thread memory that
/// another allocated, and glibc's per-arena locks then made the committer and the actor
/// threads wait on each other (README, "Figures"). The library sets no allocator: an
/// embedder chooses its own.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Debug, Parser)]
#[command(
    name = "openprogram",
    version,
    about = "An actor-based durable-execution runtime"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Drive concurrent agent turns against an embedded store (or, with --url, a running
    /// server) and report throughput and latency percentiles.
    Load(LoadArgs),
    /// Run the runtime with its HTTP API, debug endpoint and page until SIGTERM/SIGINT
    /// (orderly shutdown). Prints the listen URL.
    Serve(ServeArgs),
    /// Start a throwaway PostgreSQL and N nodes on loopback sharing it (N-2), until
    /// SIGINT/SIGTERM; prints the nodes (one JSON line on stdout).
    Cluster(openprogram::cluster::ClusterArgs),
    /// Run the long fault harnesses (R02 kill -9 loop, R22 model-based test, R24 10,000
    /// executions under a crash loop) and print one JSON summary; exit 1 if an invariant
    /// broke.
    Soak {
        /// R02: kills of the server.
        #[arg(long, default_value_t = 1000)]
        kills: usize,
        /// R22: random cases of 30 actions each.
        #[arg(long, default_value_t = 2000)]
        cases: u64,
        /// R24: executions under the crash loop (20 kills).
        #[arg(long, default_value_t = 10_000)]
        r24_executions: usize,
        /// Replays a run (default: random, printed in the summary).
        #[arg(long)]
        seed: Option<u64>,
    },
    /// Copy a closed store into a new directory, leaving out the space purged data took
    /// (S-8: sled reuses freed space but never shrinks its file). The old directory is
    /// never written; point `serve --data` at the new one afterwards.
    Compact {
        /// The store to compact (no server may have it open).
        #[arg(long)]
        data: PathBuf,
        /// A new or empty directory for the compacted store.
        #[arg(long)]
        into: PathBuf,
        /// One JSON line instead of the summary.
        #[arg(long)]
        json: bool,
    },
    /// Send a control to an execution over HTTP, or with --where to every execution selected
    /// (each fenced by the version it was listed at; --dry-run lists them).
    Ctl(CtlArgs),
    /// Start a durable function's execution over HTTP (F-1): its newest registered
    /// revision, with `--input` as its input.
    Call {
        #[command(flatten)]
        target: TargetArgs,
        session: String,
        function: String,
        /// The function's input, as JSON.
        #[arg(long, default_value = "null")]
        input: String,
        /// `keep_original` (the server's default) or `use_latest` (F-3).
        #[arg(long)]
        policy: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Read sessions, executions, events and actors over HTTP.
    Inspect(InspectArgs),
}

#[derive(Debug, clap::Args)]
struct LoadArgs {
    /// The store to use (default: a fresh temporary one).
    #[arg(long)]
    data: Option<PathBuf>,
    /// The store as `serve --store` names it: a directory (sled, as --data) or
    /// postgres://… (N-1).
    #[arg(long, conflicts_with_all = ["data", "url"])]
    store: Option<String>,
    #[arg(long, default_value_t = 1000)]
    executions: usize,
    /// Tool steps per execution.
    #[arg(long, default_value_t = 50)]
    steps: usize,
    #[arg(long, default_value_t = 1000)]
    concurrency: usize,
    #[arg(long, default_value_t = 200)]
    payload_bytes: usize,
    /// Also measure the raw store for this many seconds: sled (batches of 256 + flush +
    /// fsync), or PostgreSQL (transactions of 256 rows inserted by one statement).
    #[arg(long, num_args = 0..=1, default_missing_value = "3")]
    baseline: Option<u64>,
    /// Send this many Pause/Continue pairs per second to random running executions and
    /// report command latency.
    #[arg(long)]
    commands_per_s: Option<f64>,
    /// After the load, park this many executions and report memory per parked one.
    #[arg(long)]
    park: Option<usize>,
    /// Run durable functions instead of agent turns (F-1): `steps`, a function of
    /// --steps in-memory steps each. Embedded only.
    #[arg(long, conflicts_with = "url")]
    function: Option<String>,
    /// Admit every execution as a Job through the resource queue (J-1), asking for 1 of
    /// each --resource. Embedded only.
    #[arg(long, conflicts_with = "url")]
    jobs: bool,
    /// With --jobs: a resource as NAME=CAPACITY (repeatable; default model=8).
    #[arg(long = "resource", value_parser = resource, requires = "jobs")]
    resources: Vec<(String, u32)>,
    /// Purge executions ended longer ago than this while the load runs (S-8), and
    /// sample the store's size on disk (every 10 s unless --sample-store-every).
    #[arg(long, value_parser = retain_finished, conflicts_with = "url")]
    retain_finished: Option<Duration>,
    /// Sample the store's size on disk this often (S-8).
    #[arg(long, value_parser = retain_finished, conflicts_with = "url")]
    sample_store_every: Option<Duration>,
    /// Run without one turn per session (C-2), to measure what it costs.
    #[arg(long, conflicts_with = "url")]
    parallel_turns: bool,
    /// One JSON line on stdout instead of the table.
    #[arg(long)]
    json: bool,
    /// Drive a running server over HTTP instead of an embedded store; several
    /// (comma-separated) are nodes of one store, dealt the executions round robin.
    #[arg(long, value_delimiter = ',')]
    url: Vec<String>,
    /// The admin token for `--url` (else OPENPROGRAM_TOKEN).
    #[arg(long, requires = "url")]
    token: Option<String>,
    /// Log lines and spans of the embedded runtime, as `serve` has them (its figure with
    /// and without them measures their cost).
    #[command(flatten)]
    observability: openprogram::observability::ObservabilityArgs,
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// The node's directory: its admin token and session key, and the sled store unless
    /// --store names another.
    #[arg(long, default_value = "./openprogram-data")]
    data: PathBuf,
    /// The event store: a directory (sled; default --data) or postgres://… (N-1), which
    /// several nodes may share.
    #[arg(long)]
    store: Option<String>,
    /// -1 (no limit), 0 (no automatic restart) or a duration such as 90s, 15m, 2h.
    #[arg(long, default_value = "-1", allow_hyphen_values = true)]
    restart_window: RestartWindow,
    #[arg(long, default_value = serve::LISTEN_DEFAULT)]
    listen: String,
    /// The admin token (else OPENPROGRAM_TOKEN, else DIR/admin.token, generated once).
    #[arg(long)]
    token: Option<String>,
    /// Seed sample sessions into an empty store (once).
    #[arg(long)]
    demo: bool,
    /// Open a store that lost acknowledged history (a damaged or truncated file) and keep
    /// what remains; prints what was lost (JSON, stderr) before serving (S-7).
    #[arg(long)]
    accept_loss: bool,
    /// How long an attempt whose process stops making progress (SIGSTOP, a frozen VM)
    /// keeps its execution before a new attempt takes it over: a duration such as 10s
    /// (the default) or 500ms.
    #[arg(long, value_parser = lease_ttl)]
    lease_ttl: Option<Duration>,
    /// Register exactly these revisions of the built-in functions, as NAME:REVISION
    /// separated by commas (steps:1,steps:2); default all. How a deployment of new
    /// code across a restart is simulated (F-3).
    #[arg(long, value_parser = function_revisions)]
    function_revisions: Option<FunctionRevisions>,
    /// Let the turns of a session run side by side. By default a session has one
    /// foreground turn (C-2): a message sent while another turn of its session runs
    /// follows its `when_busy` (queue, steer, reject, interrupt).
    #[arg(long)]
    parallel_turns: bool,
    /// Declare a resource Jobs are admitted for, as NAME=CAPACITY (repeatable), such
    /// as model=8 (J-1).
    #[arg(long = "resource", value_parser = resource)]
    resources: Vec<(String, u32)>,
    /// Purge executions that ended longer ago than this (a duration such as 10s, 30m
    /// or 7d: `d`, `h`, `m`, `s`, `ms`), with their events, receipts and waits; their
    /// reads answer 410 purged (S-8). Default: keep everything.
    #[arg(long, value_parser = retain_finished)]
    retain_finished: Option<Duration>,
    /// Run as this node of a shared PostgreSQL store (N-2): its lease is renewed every
    /// third of --lease-ttl; once it lapses, the other nodes take over its running
    /// executions. Commands for another node's executions are forwarded to it (N-3).
    #[arg(long, requires = "store")]
    node_id: Option<String>,
    /// The URL other nodes reach this node's API at (default http://LISTEN).
    #[arg(long, requires = "node_id")]
    advertise: Option<String>,
    #[command(flatten)]
    model: openprogram::model_args::ModelArgs,
    #[command(flatten)]
    observability: openprogram::observability::ObservabilityArgs,
}

#[derive(Debug, clap::Args)]
struct CtlArgs {
    #[command(flatten)]
    target: TargetArgs,
    kind: CtlKind,
    #[arg(required_unless_present = "wheres")]
    session: Option<String>,
    #[arg(required_unless_present = "wheres")]
    execution: Option<String>,
    /// Select executions instead: state=S, kind=K, session=SID, since=DURATION, id=ID.
    #[arg(long = "where", conflicts_with_all = ["session", "execution"])]
    wheres: Vec<String>,
    /// With --where: list what would be sent, send nothing.
    #[arg(long, requires = "wheres")]
    dry_run: bool,
    /// With --where: at most this many executions (default and most: 1,000).
    #[arg(long = "limit", requires = "wheres")]
    where_limit: Option<usize>,
    /// steer: the instructions; reconcile: the confirmed output.
    #[arg(long)]
    text: Option<String>,
    /// answer, decline: the wait (required unless --expected-version pins the pending
    /// one).
    #[arg(long)]
    wait: Option<String>,
    /// A UUID; the same id again returns the stored outcome (K-4). Default: a new one.
    #[arg(long)]
    command_id: Option<String>,
    #[arg(long)]
    expected_version: Option<u64>,
    /// answer: the answer text.
    #[arg(long)]
    answer: Option<String>,
    /// answer: `operation` (default), `tool`, `session` (W-7) or `discussion`; a
    /// structured answer is its JSON (`--answer '{"env": "prod"}'`).
    #[arg(long)]
    scope: Option<String>,
    /// revoke: the approval that gave the grant (`wait_…`).
    #[arg(long)]
    grant: Option<String>,
    /// stop-process: the process id.
    #[arg(long)]
    process: Option<String>,
    /// reconcile: `confirmed` or `not_applied`.
    #[arg(long)]
    outcome: Option<String>,
    /// fork: the checkpoint seq to fork from (default: the latest saved point).
    #[arg(long)]
    checkpoint: Option<u64>,
    /// set-policy: `keep_original` or `use_latest` (F-3).
    #[arg(long)]
    policy: Option<String>,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct InspectArgs {
    #[command(flatten)]
    target: TargetArgs,
    what: InspectWhat,
    /// execution, events: SESSION EXECUTION; executions: [SESSION]; activity: SESSION;
    /// actors: [ID]; resources: the resource queue (J-1); tail: the global log, followed.
    ids: Vec<String>,
    /// events: only those after this seq; tail: after this position (default: now).
    #[arg(long)]
    after: Option<u64>,
    /// executions, across sessions: in this state, of this kind (agent, job, function),
    /// admitted within DURATION, found by any id, at most N (needs attention first).
    #[arg(long)]
    state: Option<String>,
    #[arg(long)]
    kind: Option<String>,
    #[arg(long)]
    since: Option<String>,
    #[arg(long)]
    id: Option<String>,
    #[arg(long)]
    limit: Option<usize>,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct TargetArgs {
    #[arg(long, default_value = "http://127.0.0.1:7878")]
    url: String,
    /// The token (else OPENPROGRAM_TOKEN).
    #[arg(long)]
    token: Option<String>,
}

/// A control `ctl` sends: a command kind of the contract (`CommandKind`, spelled there
/// once), written with dashes on the command line (`stop-process`) or as the API writes it.
#[derive(Debug, Clone, Copy)]
struct CtlKind(CommandKind);

/// Every kind `ctl` takes, in the contract's order.
static CTL_KINDS: std::sync::LazyLock<Vec<CtlKind>> =
    std::sync::LazyLock::new(|| CommandKind::ALL.into_iter().map(CtlKind).collect());

impl clap::ValueEnum for CtlKind {
    fn value_variants<'a>() -> &'a [Self] {
        &CTL_KINDS
    }

    /// Also as the API and `inspect` write it (`stop_process`).
    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        let kind = self.0.as_str();
        let value = clap::builder::PossibleValue::new(kind.replace('_', "-"));
        Some(match kind.contains('_') {
            true => value.alias(kind),
            false => value,
        })
    }
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum InspectWhat {
    Sessions,
    Executions,
    Execution,
    Events,
    Actors,
    Activity,
    Resources,
    Tail,
}

fn main() -> ExitCode {
    // RELIABILITY.md's durable boundaries: `OP_FAILPOINT=B05[:SKIP]` aborts there (R01).
    if let Some((name, skip)) = openprogram::storage::failpoints::arm_from_env() {
        eprintln!("openprogram: failpoint {name} armed (after {skip} hits)");
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // `--help` and `--version` print in full; a usage error is one line (I-4).
        Err(error) if !error.use_stderr() => {
            let _ = error.print();
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            let rendered = error.render().to_string();
            let first = rendered.lines().next().unwrap_or("usage error");
            eprintln!(
                "openprogram: {} (see --help)",
                first.trim_start_matches("error: ")
            );
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::Load(args) => load_command(args),
        Command::Serve(args) => serve_command(args),
        Command::Soak {
            kills,
            cases,
            r24_executions,
            seed,
        } => soak(kills, cases, r24_executions, seed),
        Command::Compact { data, into, json } => compact(&data, &into, json),
        Command::Cluster(args) => match args
            .options()
            .and_then(|options| openprogram::cluster::run(&options))
        {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => fail(&message),
        },
        Command::Ctl(args) => ctl_command(args),
        Command::Call {
            target,
            session,
            function,
            input,
            policy,
            json,
        } => finish(target_of(target).and_then(|target| {
            client::call(
                &target,
                &session,
                &function,
                &input,
                policy.as_deref(),
                json,
            )
        })),
        Command::Inspect(args) => inspect_command(args),
    }
}

fn load_command(args: LoadArgs) -> ExitCode {
    let LoadArgs {
        data,
        store,
        executions,
        steps,
        concurrency,
        payload_bytes,
        baseline,
        commands_per_s,
        park,
        function,
        jobs,
        resources,
        retain_finished,
        sample_store_every,
        parallel_turns,
        json,
        url,
        token,
        observability,
    } = args;
    let _observability = match observability.init() {
        Ok(installed) => installed,
        Err(error) => return fail(&error.to_string()),
    };
    let resources = match (jobs, resources.is_empty()) {
        (true, true) => vec![("model".to_owned(), 8)],
        _ => resources,
    };
    let (data, postgres) = match store {
        Some(url) if openprogram::is_postgres_url(&url) => (None, Some(url)),
        Some(directory) => (Some(PathBuf::from(directory)), None),
        None => (data, None),
    };
    let options = LoadOptions {
        data,
        postgres,
        executions,
        steps,
        concurrency,
        payload_bytes,
        baseline: baseline.map(Duration::from_secs),
        progress: !json,
        commands_per_s,
        park,
        function,
        jobs,
        resources,
        retain_finished,
        sample_store_every,
        parallel_turns,
    };
    if !url.is_empty() {
        let remote = url
            .into_iter()
            .map(|url| {
                let token = token.clone();
                target_of(TargetArgs { url, token })
            })
            .collect::<Result<Vec<_>, _>>()
            .and_then(|targets| openprogram::load_remote::run(&options, &targets));
        return match remote {
            Ok(report) => print_report(&report, json),
            Err(Failure::Usage(message)) => {
                eprintln!("openprogram: {message}");
                ExitCode::from(2)
            }
            Err(Failure::Failed(message)) => fail(&message),
        };
    }
    let runtime = match tokio_runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    match runtime.block_on(load::run(options)) {
        Ok(report) => print_report(&report, json),
        Err(error) => failed(error),
    }
}

fn serve_command(args: ServeArgs) -> ExitCode {
    let ServeArgs {
        data,
        store,
        restart_window,
        listen,
        token,
        demo,
        accept_loss,
        lease_ttl,
        function_revisions,
        parallel_turns,
        resources,
        retain_finished,
        node_id,
        advertise,
        model,
        observability,
    } = args;
    // Flushed (its spans exported) when dropped, after the server stopped.
    let _observability = match observability.init() {
        Ok(installed) => installed,
        Err(error) => return failed(error),
    };
    let runtime = match tokio_runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let options = ServeOptions {
        data,
        store,
        restart_window,
        listen,
        token: token.or_else(|| std::env::var("OPENPROGRAM_TOKEN").ok()),
        demo,
        accept_loss,
        lease_ttl,
        function_revisions: function_revisions.map(|revisions| revisions.0),
        parallel_turns,
        resources,
        retain_finished,
        node_id,
        advertise,
        model,
    };
    match runtime.block_on(serve::run(options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => failed(error),
    }
}

fn ctl_command(args: CtlArgs) -> ExitCode {
    let CtlArgs {
        target,
        kind,
        session,
        execution,
        text,
        wait,
        command_id,
        expected_version,
        answer,
        scope,
        grant,
        process,
        outcome,
        checkpoint,
        policy,
        json,
        wheres,
        dry_run,
        where_limit,
    } = args;
    let control = client::Control {
        checkpoint,
        policy,
        kind: kind.0.as_str().into(),
        session: session.unwrap_or_default(),
        execution: execution.unwrap_or_default(),
        text,
        wait,
        command_id,
        expected_version,
        answer,
        scope,
        grant,
        process,
        outcome,
    };
    if !wheres.is_empty() {
        return finish(target_of(target).and_then(|target| {
            let mut selection = client_select::Selection::from_wheres(&wheres)?;
            selection.limit = Some(where_limit.unwrap_or(1000));
            client_select::ctl_where(&target, &control, &selection, dry_run, json)
        }));
    }
    finish(target_of(target).and_then(|target| client::ctl(&target, &control, json)))
}

fn inspect_command(args: InspectArgs) -> ExitCode {
    let InspectArgs {
        target,
        what,
        ids,
        after,
        json,
        state,
        kind,
        since,
        id,
        limit,
    } = args;
    let selection = client_select::Selection {
        state,
        kind,
        session: ids.first().cloned(),
        since,
        id,
        limit,
    };
    let filtered = selection.state.is_some()
        || selection.kind.is_some()
        || selection.since.is_some()
        || selection.id.is_some()
        || selection.limit.is_some();
    match what {
        InspectWhat::Tail => {
            return finish(
                target_of(target).and_then(|target| client_select::tail(&target, after, json)),
            )
        }
        InspectWhat::Executions if filtered || ids.is_empty() => {
            return finish(
                target_of(target).and_then(|target| client_select::list(&target, &selection, json)),
            )
        }
        _ => {}
    }
    let after = after.unwrap_or(0);
    let what = match what {
        InspectWhat::Sessions => "sessions",
        InspectWhat::Executions => "executions",
        InspectWhat::Execution => "execution",
        InspectWhat::Events => "events",
        InspectWhat::Actors => "actors",
        InspectWhat::Activity => "activity",
        InspectWhat::Resources => "resources",
        InspectWhat::Tail => "tail",
    };
    finish(target_of(target).and_then(|target| client::inspect(&target, what, &ids, after, json)))
}

fn target_of(args: TargetArgs) -> Result<Target, Failure> {
    let token = args
        .token
        .or_else(|| std::env::var("OPENPROGRAM_TOKEN").ok())
        .ok_or_else(|| Failure::Usage("a token is needed: --token or OPENPROGRAM_TOKEN".into()))?;
    Ok(Target {
        url: args.url,
        token,
    })
}

/// Prints what a client command produced, or its one error line; its exit code.
fn finish(result: Result<String, Failure>) -> ExitCode {
    match result {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(Failure::Usage(message)) => {
            eprintln!("openprogram: {message}");
            ExitCode::from(2)
        }
        Err(Failure::Failed(message)) => fail(&message),
    }
}

/// `openprogram soak`: the harnesses in turn, a progress bar each on stderr, the summary
/// on stdout.
fn soak(kills: usize, cases: u64, r24_executions: usize, seed: Option<u64>) -> ExitCode {
    let binary = match std::env::current_exe() {
        Ok(binary) => binary,
        Err(error) => return fail(&format!("cannot find this binary: {error}")),
    };
    let seed = seed.unwrap_or_else(rand::random);
    let options = soak::SoakOptions::new(binary, seed, kills, cases, r24_executions);
    let runtime = match tokio_runtime() {
        Ok(runtime) => runtime,
        Err(code) => return code,
    };
    let bar = indicatif::ProgressBar::new(0);
    let progress = |harness: &str, done: u64, of: u64| {
        if bar.length() != Some(of) || bar.message() != harness {
            bar.reset();
            bar.set_length(of);
            bar.set_message(harness.to_owned());
            bar.set_style(
                indicatif::ProgressStyle::with_template("{msg} {bar:40} {pos}/{len} {elapsed}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
        }
        bar.set_position(done);
    };
    let report = runtime.block_on(soak::run(&options, progress));
    bar.finish_and_clear();
    match report {
        Ok(report) => {
            match serde_json::to_string_pretty(&report) {
                Ok(json) => println!("{json}"),
                Err(error) => return fail(&format!("cannot print the summary: {error}")),
            }
            match report.clean {
                true => ExitCode::SUCCESS,
                false => fail("an invariant broke; see the summary"),
            }
        }
        Err(error) => fail(&format!("soak: {error}")),
    }
}

/// The tokio runtime the subcommands run on: two workers, one per core of the target machine.
fn tokio_runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|error| fail(&format!("cannot start tokio: {error}")))
}

/// Prints a load report: one JSON line, or the table.
fn print_report(report: &load::LoadReport, json: bool) -> ExitCode {
    if let Some(error) = &report.first_error {
        eprintln!(
            "openprogram: {} executions failed; the first: {error}",
            report.failed
        );
    }
    if !json {
        print!("{}", report.table());
        return ExitCode::SUCCESS;
    }
    match serde_json::to_string(report) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(error) => fail(&error.to_string()),
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("openprogram: {message}");
    ExitCode::from(1)
}

/// The exit of a runtime error: a usage error (`InvalidRequest`) 2, anything else 1.
fn failed(error: openprogram::Error) -> ExitCode {
    match error {
        openprogram::Error::InvalidRequest(message) => {
            eprintln!("openprogram: {message}");
            ExitCode::from(2)
        }
        error => fail(&error.to_string()),
    }
}

/// `--function-revisions`: NAME:REVISION, comma separated.
#[derive(Debug, Clone)]
struct FunctionRevisions(Vec<(String, u32)>);

/// `--resource NAME=CAPACITY`.
fn resource(text: &str) -> Result<(String, u32), String> {
    openprogram::actors::resources::Resources::parse_one(text).map_err(|error| error.to_string())
}

fn function_revisions(text: &str) -> Result<FunctionRevisions, String> {
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
        .collect::<Result<Vec<_>, String>>()
        .map(FunctionRevisions)
}

/// `openprogram compact`: a spinner with the keys copied, then the sizes before and after.
fn compact(data: &std::path::Path, into: &std::path::Path, json: bool) -> ExitCode {
    let spinner = match json {
        true => indicatif::ProgressBar::hidden(),
        false => indicatif::ProgressBar::new_spinner(),
    };
    let copied = openprogram::storage::compact::compact(data, into, |keys| {
        spinner.set_message(format!("{keys} keys copied"));
        spinner.tick();
    });
    spinner.finish_and_clear();
    match copied {
        Ok(report) if json => {
            println!("{}", serde_json::json!(report));
            ExitCode::SUCCESS
        }
        Ok(report) => {
            let mib = |bytes: u64| bytes as f64 / 1048576.0;
            println!(
                "compacted {} keys into {}: {:.1} MiB -> {:.1} MiB",
                report.keys,
                into.display(),
                mib(report.bytes_before),
                mib(report.bytes_after)
            );
            ExitCode::SUCCESS
        }
        Err(error) => fail(&format!("{} ({})", error, error.code())),
    }
}

/// `--retain-finished`: a duration such as 0s, 500ms, 10s, 30m, 12h or 7d.
fn retain_finished(text: &str) -> Result<Duration, String> {
    openprogram::overview::parse_duration(text)
}

/// `--lease-ttl`: a positive duration, written as the restart window's are.
fn lease_ttl(text: &str) -> Result<Duration, String> {
    match text.parse::<RestartWindow>() {
        Ok(RestartWindow::Within(ttl)) if !ttl.is_zero() => Ok(ttl),
        _ => Err(format!(
            "invalid lease ttl `{text}`: use a positive duration like 10s or 500ms"
        )),
    }
}
