//! The `openprogram` command line (SPEC §6): `load` (embedded), `serve` (the runtime with
//! its HTTP API), and the HTTP clients `ctl` (controls) and `inspect` (reads). Exit codes:
//! 0 ok, 1 the operation failed, 2 usage error; errors are one line on stderr.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use openprogram::http::client::{self, Failure, Target};
use openprogram::http::client_select;
use openprogram::load::{self, LoadOptions};
use openprogram::serve::{self, ServeOptions};
use openprogram::soak;
use openprogram::CommandKind;

/// jemalloc rather than glibc malloc: sled and the actors free on one thread memory that another
/// allocated, and glibc's per-arena locks then made the committer and the actor threads wait on
/// each other (README, "Figures"). The library sets no allocator: an embedder chooses its own.
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
    Load(LoadOptions),
    /// Run the runtime with its HTTP API, debug endpoint and page until SIGTERM/SIGINT
    /// (orderly shutdown). Prints the listen URL.
    Serve(ServeOptions),
    /// Start a throwaway PostgreSQL and N nodes on loopback sharing it, until
    /// SIGINT/SIGTERM; prints the nodes (one JSON line on stdout).
    Cluster(openprogram::cluster::ClusterArgs),
    /// Run the long fault harnesses (the server killed with SIGKILL in a loop, a model-based
    /// test of random controls, 10,000 executions under a crash loop) and print one JSON
    /// summary; exit 1 if an invariant broke.
    Soak(SoakArgs),
    /// Copy a closed store into a new directory, leaving out the space purged data took
    /// (sled reuses freed space but never shrinks its file). The old directory is
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
    /// Start a durable function's execution over HTTP: its newest registered
    /// revision, with `--input` as its input.
    Call(CallArgs),
    /// Read sessions, executions, events and actors over HTTP.
    Inspect(InspectArgs),
    /// Start an agent turn with a message over HTTP, in a new session unless --session
    /// names one; --follow waits until it stops running and prints its reply.
    Send(SendArgs),
    /// Approve what an execution waits for your approval of, over HTTP.
    Approve(DecisionArgs),
    /// Deny what an execution waits for your approval of: it does not run.
    Deny(DecisionArgs),
}

// `send`'s arguments.
#[derive(Debug, clap::Args)]
struct SendArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// The message.
    message: String,
    /// The session to send it to (its token as --token); default: a new session (made
    /// with the admin token).
    #[arg(long)]
    session: Option<String>,
    /// For the built-in scripted model: its decisions, as a JSON array.
    #[arg(long)]
    script: Option<String>,
    /// Wait until the turn stops running (ends, or waits for someone) and print its reply.
    #[arg(long)]
    follow: bool,
    /// Print only the execution's id (for scripts: `EID=$(openprogram send … --quiet)`).
    #[arg(long, conflicts_with = "json")]
    quiet: bool,
    /// Print the server's replies as JSON.
    #[arg(long)]
    json: bool,
}

// `approve`'s and `deny`'s arguments.
#[derive(Debug, clap::Args)]
struct DecisionArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// The execution waiting for an approval: EXECUTION (any session's, with the admin
    /// token), or SESSION EXECUTION.
    #[arg(required = true, num_args = 1..=2)]
    ids: Vec<String>,
    /// approve: what it grants: operation (this one call), tool (this tool for the rest of
    /// the execution) or session (this tool for every execution of the session).
    #[arg(long, default_value = "operation")]
    scope: String,
    /// Then wait until it stops running again and print its state and reply.
    #[arg(long)]
    follow: bool,
    /// Print the server's reply as JSON.
    #[arg(long)]
    json: bool,
}

// `soak`'s flags.
#[derive(Debug, clap::Args)]
struct SoakArgs {
    /// Kills of the server (SIGKILL at random moments), each followed by a restart.
    #[arg(long, default_value_t = 1000)]
    kills: usize,
    /// Random cases of the model-based test, 30 actions each.
    #[arg(long, default_value_t = 2000)]
    cases: u64,
    /// Executions run through the crash loop (20 kills); 0 skips it.
    #[arg(long, alias = "r24-executions", default_value_t = 10_000)]
    crash_loop_executions: usize,
    /// Replays a run (default: random, printed in the summary).
    #[arg(long)]
    seed: Option<u64>,
}

// `call`'s arguments.
#[derive(Debug, clap::Args)]
struct CallArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// The session to start it in.
    session: String,
    /// A registered durable function's name.
    function: String,
    /// The function's input, as JSON.
    #[arg(long, default_value = "null")]
    input: String,
    /// `keep_original` (the server's default) or `use_latest`.
    #[arg(long)]
    policy: Option<String>,
    /// Print the server's reply as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct CtlArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// The control to send.
    kind: CtlKind,
    /// The execution's session, or the execution alone (any session's, with the admin
    /// token: the server finds its session).
    #[arg(required_unless_present = "wheres")]
    session: Option<String>,
    /// The execution to control (after its SESSION).
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
    #[command(flatten)]
    control: client::Control,
    /// Print the server's reply as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct InspectArgs {
    #[command(flatten)]
    target: TargetArgs,
    /// What to read.
    what: InspectWhat,
    /// execution, events: SESSION EXECUTION; executions: [SESSION]; activity: SESSION;
    /// actors: [ID]; resources: the resource queue; tail: the global log, followed.
    ids: Vec<String>,
    /// events: only those after this seq; tail: after this position (default: now).
    #[arg(long)]
    after: Option<u64>,
    #[command(flatten)]
    selection: client_select::Selection,
    /// Print what the server answered as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct TargetArgs {
    /// The server to talk to, as `serve` printed it.
    #[arg(long, env = "OPENPROGRAM_URL", default_value = "http://127.0.0.1:7878")]
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
    // A subcommand that fails before it runs exits with `Err`'s code.
    let exit = match cli.command {
        Command::Load(args) => load_command(args),
        Command::Serve(args) => serve_command(args),
        Command::Soak(args) => soak(args),
        Command::Compact { data, into, json } => Ok(compact(&data, &into, json)),
        Command::Cluster(args) => args
            .options()
            .and_then(|options| openprogram::cluster::run(&options))
            .map(|()| ExitCode::SUCCESS)
            .map_err(|message| fail(&message)),
        Command::Ctl(args) => Ok(ctl_command(args)),
        Command::Call(args) => Ok(finish(target_of(args.target).and_then(|target| {
            let policy = args.policy.as_deref();
            client::call(
                &target,
                &args.session,
                &args.function,
                &args.input,
                policy,
                args.json,
            )
        }))),
        Command::Inspect(args) => Ok(inspect_command(args)),
        Command::Send(args) => Ok(finish(target_of(args.target).and_then(|target| {
            use openprogram::http::client_verbs::{send, Sending, Shown};
            let shown = match (args.json, args.quiet) {
                (true, _) => Shown::Json,
                (_, true) => Shown::Id,
                _ => Shown::Text,
            };
            let sending = Sending {
                session: args.session.as_deref(),
                message: &args.message,
                script: args.script.as_deref(),
                follow: args.follow,
                shown,
            };
            send(&target, sending)
        }))),
        Command::Approve(args) => Ok(decision(args, true)),
        Command::Deny(args) => Ok(decision(args, false)),
    };
    exit.unwrap_or_else(|code| code)
}

fn load_command(mut options: LoadOptions) -> Result<ExitCode, ExitCode> {
    let _observability = options
        .observability
        .init()
        .map_err(|error| fail(&error.to_string()))?;
    if options.jobs && options.resources.is_empty() {
        options.resources = vec![("model".to_owned(), 8)];
    }
    if !options.url.is_empty() {
        let remote = options
            .url
            .iter()
            .map(|url| {
                let (url, token) = (url.clone(), options.token.clone());
                target_of(TargetArgs { url, token })
            })
            .collect::<Result<Vec<_>, _>>()
            .and_then(|targets| openprogram::load_remote::run(&options, &targets));
        return Ok(match remote {
            Ok(report) => print_report(&report, options.json),
            Err(failure) => failed_client(failure),
        });
    }
    let runtime = tokio_runtime()?;
    let json = options.json;
    Ok(match runtime.block_on(load::run(options)) {
        Ok(report) => print_report(&report, json),
        Err(error) => failed(error),
    })
}

fn serve_command(mut options: ServeOptions) -> Result<ExitCode, ExitCode> {
    // Flushed (its spans exported) when dropped, after the server stopped.
    let _observability = options.observability.init().map_err(failed)?;
    let runtime = tokio_runtime()?;
    options.token = options
        .token
        .or_else(|| std::env::var("OPENPROGRAM_TOKEN").ok());
    runtime.block_on(serve::run(options)).map_err(failed)?;
    Ok(ExitCode::SUCCESS)
}

fn ctl_command(args: CtlArgs) -> ExitCode {
    let mut control = client::Control {
        kind: args.kind.0.as_str().into(),
        ..args.control
    };
    let (wheres, json) = (args.wheres, args.json);
    let ids: Vec<String> = [args.session, args.execution]
        .into_iter()
        .flatten()
        .collect();
    finish(target_of(args.target).and_then(|target| {
        if wheres.is_empty() {
            let resolved = openprogram::http::client_verbs::session_and_execution(&target, &ids)?;
            (control.session, control.execution) = resolved;
            return client::ctl(&target, &control, json);
        }
        let mut selection = client_select::Selection::from_wheres(&wheres)?;
        selection.limit = Some(args.where_limit.unwrap_or(1000));
        client_select::ctl_where(&target, &control, &selection, args.dry_run, json)
    }))
}

fn inspect_command(args: InspectArgs) -> ExitCode {
    let InspectArgs {
        target,
        what,
        ids,
        after,
        mut selection,
        json,
    } = args;
    // Before the session is set: the flags alone.
    let filtered = !selection.is_empty() || selection.limit.is_some();
    selection.session = ids.first().cloned();
    let what = match what {
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
        // Named as the command line names it.
        what => clap::ValueEnum::to_possible_value(&what)
            .map(|value| value.get_name().to_owned())
            .unwrap_or_default(),
    };
    let after = after.unwrap_or(0);
    finish(target_of(target).and_then(|target| {
        // An execution named alone: the server finds its session.
        let ids = match (what.as_str(), ids.as_slice()) {
            ("execution" | "events", [execution]) => {
                let session = openprogram::http::client_verbs::session_of(&target, execution)?;
                vec![session, execution.clone()]
            }
            _ => ids,
        };
        client::inspect(&target, &what, &ids, after, json)
    }))
}

/// `approve` (`approve`: true) or `deny`.
fn decision(args: DecisionArgs, approve: bool) -> ExitCode {
    use openprogram::http::client_verbs::{decide, followed_to_the_end, session_and_execution};
    finish(target_of(args.target).and_then(|target| {
        let scope = approve.then_some(args.scope.as_str());
        let (session, execution) = session_and_execution(&target, &args.ids)?;
        let mut said = decide(&target, &session, &execution, approve, scope, args.json)?;
        if args.follow {
            said.push_str(&followed_to_the_end(&target, &session, &execution)?);
        }
        Ok(said)
    }))
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
        Err(failure) => failed_client(failure),
    }
}

/// The exit of a client command's failure: a usage error 2, anything else 1.
fn failed_client(failure: Failure) -> ExitCode {
    match failure {
        Failure::Usage(message) => {
            eprintln!("openprogram: {message}");
            ExitCode::from(2)
        }
        Failure::Failed(message) => fail(&message),
    }
}

/// `openprogram soak`: the harnesses in turn, a progress bar each on stderr, the summary on stdout.
fn soak(args: SoakArgs) -> Result<ExitCode, ExitCode> {
    let binary = std::env::current_exe()
        .map_err(|error| fail(&format!("cannot find this binary: {error}")))?;
    let seed = args.seed.unwrap_or_else(rand::random);
    let (kills, cases, r24) = (args.kills, args.cases, args.crash_loop_executions);
    let options = soak::SoakOptions::new(binary, seed, kills, cases, r24);
    let runtime = tokio_runtime()?;
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
    let report = report.map_err(|error| fail(&format!("soak: {error}")))?;
    let json = serde_json::to_string_pretty(&report)
        .map_err(|error| fail(&format!("cannot print the summary: {error}")))?;
    println!("{json}");
    match report.clean {
        true => Ok(ExitCode::SUCCESS),
        false => Err(fail("an invariant broke; see the summary")),
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

/// The exit of a runtime error: a usage error (`InvalidRequest`) 2, anything else 1 (its
/// message with its stable code).
fn failed(error: openprogram::Error) -> ExitCode {
    match error {
        openprogram::Error::InvalidRequest(message) => {
            eprintln!("openprogram: {message}");
            ExitCode::from(2)
        }
        error => fail(&format!("{error} ({})", error.code())),
    }
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Every argument of every command says what it does in `--help` (defaults are shown
    /// by clap beside it).
    #[test]
    fn i4_every_argument_says_what_it_does() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for argument in command.get_arguments() {
                let id = argument.get_id().as_str();
                let said = argument.get_help().or(argument.get_long_help());
                if said.is_none() && !matches!(id, "help" | "version") {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in command.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&super::Cli::command(), "openprogram", &mut missing);
        assert!(missing.is_empty(), "no help: {missing:#?}");
    }
}
