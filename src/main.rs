//! The `openprogram` command line (SPEC §6). `load` and `serve` (without its HTTP API yet)
//! run here; `ctl`, `inspect` and serve's HTTP options arrive with issue 8 and say so. Exit codes: 0 ok, 1 the operation failed, 2 usage error;
//! errors are one line on stderr.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use openprogram::load::{self, LoadOptions};
use openprogram::serve::{self, ServeOptions};
use openprogram::RestartWindow;

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
    /// Drive concurrent agent turns against an embedded store and report throughput and
    /// latency percentiles.
    Load {
        /// The store to use (default: a fresh temporary one).
        #[arg(long)]
        data: Option<PathBuf>,
        #[arg(long, default_value_t = 1000)]
        executions: usize,
        /// Tool steps per execution.
        #[arg(long, default_value_t = 50)]
        steps: usize,
        #[arg(long, default_value_t = 1000)]
        concurrency: usize,
        #[arg(long, default_value_t = 200)]
        payload_bytes: usize,
        /// Also measure raw sled (batches of 256 + flush + fsync) for this many seconds.
        #[arg(long, num_args = 0..=1, default_missing_value = "3")]
        baseline: Option<u64>,
        /// Send this many Pause/Continue pairs per second to random running executions and
        /// report command latency.
        #[arg(long)]
        commands_per_s: Option<f64>,
        /// After the load, park this many executions and report memory per parked one.
        #[arg(long)]
        park: Option<usize>,
        /// One JSON line on stdout instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Run the runtime on its store until SIGTERM/SIGINT (orderly shutdown). The HTTP API,
    /// debug page and --demo are not in this build yet.
    Serve {
        #[arg(long, default_value = "./openprogram-data")]
        data: PathBuf,
        /// -1 (no limit), 0 (no automatic restart) or a duration such as 90s, 15m, 2h.
        #[arg(long, default_value = "-1", allow_hyphen_values = true)]
        restart_window: RestartWindow,
        #[arg(long)]
        listen: Option<String>,
        #[arg(long)]
        token: Option<String>,
        #[arg(long)]
        demo: bool,
    },
    /// Send a control to an execution over HTTP (not in this build yet).
    Ctl,
    /// Read sessions, executions and events over HTTP (not in this build yet).
    Inspect,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let code = if error.use_stderr() { 2 } else { 0 };
            let _ = error.print();
            return ExitCode::from(code);
        }
    };
    match cli.command {
        Command::Load {
            data,
            executions,
            steps,
            concurrency,
            payload_bytes,
            baseline,
            commands_per_s,
            park,
            json,
        } => {
            let options = LoadOptions {
                data,
                executions,
                steps,
                concurrency,
                payload_bytes,
                baseline: baseline.map(Duration::from_secs),
                progress: !json,
                commands_per_s,
                park,
            };
            let runtime = match tokio_runtime() {
                Ok(runtime) => runtime,
                Err(code) => return code,
            };
            match runtime.block_on(load::run(options)) {
                Ok(report) if json => match serde_json::to_string(&report) {
                    Ok(line) => {
                        println!("{line}");
                        ExitCode::SUCCESS
                    }
                    Err(error) => fail(&error.to_string()),
                },
                Ok(report) => {
                    print!("{}", report.table());
                    ExitCode::SUCCESS
                }
                Err(openprogram::Error::InvalidRequest(message)) => {
                    eprintln!("openprogram: {message}");
                    ExitCode::from(2)
                }
                Err(error) => fail(&error.to_string()),
            }
        }
        Command::Serve {
            listen: None,
            token: None,
            demo: false,
            data,
            restart_window,
        } => {
            let runtime = match tokio_runtime() {
                Ok(runtime) => runtime,
                Err(code) => return code,
            };
            let options = ServeOptions {
                data,
                restart_window,
            };
            match runtime.block_on(serve::run(options)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => fail(&error.to_string()),
            }
        }
        Command::Serve { .. } => {
            eprintln!("openprogram: serve's --listen, --token and --demo need the HTTP API, which is not in this build yet (see README.md)");
            ExitCode::from(2)
        }
        Command::Ctl | Command::Inspect => {
            eprintln!(
                "openprogram: this subcommand is not available in this build yet (see README.md)"
            );
            ExitCode::from(2)
        }
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

fn fail(message: &str) -> ExitCode {
    eprintln!("openprogram: {message}");
    ExitCode::from(1)
}
