//! What `openprogram load` runs (`LoadOptions`) and measured (`LoadReport`): the `--json`
//! line and the readable table, for a load embedded (`load.rs`) or driven over HTTP
//! (`load_remote.rs`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    /// The store to use; a fresh temporary one when `None` (and no `postgres`).
    pub data: Option<PathBuf>,
    /// N-1: a PostgreSQL database (`--store postgres://…`) instead of sled.
    pub postgres: Option<String>,
    pub executions: usize,
    /// Tool steps per execution.
    pub steps: usize,
    pub concurrency: usize,
    pub payload_bytes: usize,
    /// Also measure the raw store for this long: sled (batches of 256 + flush + fsync), or
    /// PostgreSQL (transactions of 256 rows inserted with one statement).
    pub baseline: Option<Duration>,
    /// Draw a progress bar on stderr.
    pub progress: bool,
    /// While the load runs, send this many Pause/Continue pairs per second to random running
    /// executions and time each command from the call to its `applied` answer.
    pub commands_per_s: Option<f64>,
    /// After the load, park this many executions (admitted paused, one Step, actor
    /// released) and report resident memory per parked execution.
    pub park: Option<usize>,
    /// F-1: run durable functions instead of agent turns: `steps`, each execution a
    /// function of `steps` steps (in-memory and Idempotent, like the agent load's `echo`,
    /// so that the two measure the runtime, not a file's fsyncs).
    pub function: Option<String>,
    /// J-1: admit every execution as a Job asking for 1 of each of `resources` (declared
    /// with those capacities): they run through the resource queue.
    pub jobs: bool,
    pub resources: Vec<(String, u32)>,
    /// S-8: purge executions ended longer ago than this while the load runs.
    pub retain_finished: Option<Duration>,
    /// S-8: sample the store's size on disk this often (with `retain_finished`: 10 s
    /// unless given).
    pub sample_store_every: Option<Duration>,
    /// C-2 off (`--parallel-turns`): what one turn per session costs, by difference.
    pub parallel_turns: bool,
}

/// What was measured (the `--json` line).
#[derive(Debug, Clone, Default, Serialize)]
pub struct LoadReport {
    /// `embedded`, or the URL of the server driven (`--url`).
    pub target: String,
    /// `agent`, or the function run (`steps`).
    pub kind: String,
    /// The store written: `sled` or `postgres` (N-1); `server` over HTTP (`--url`: the
    /// servers' own store, which they do not name).
    pub store: String,
    pub executions: usize,
    pub steps: usize,
    pub total_steps: u64,
    pub concurrency: usize,
    pub payload_bytes: usize,
    pub completed: usize,
    pub failed: usize,
    pub wall_s: f64,
    pub steps_per_s: f64,
    pub executions_per_s: f64,
    pub step_p50_ms: f64,
    pub step_p99_ms: f64,
    pub step_p999_ms: f64,
    pub step_max_ms: f64,
    pub execution_p50_ms: f64,
    pub execution_p99_ms: f64,
    pub fsyncs: u64,
    /// Execution states loaded for an activation or a read: from the parked states the
    /// runtime keeps, and by replaying an execution's events (Pause/Continue and commands to
    /// finished executions activate them).
    pub state_loads_parked: u64,
    pub state_loads_replayed: u64,
    pub peak_rss_mib: f64,
    /// CPU time of the whole process (every thread, user and system) while the load ran, per
    /// step; `None` where `/proc/self/stat` cannot be read. Steadier than steps/s on a
    /// machine whose speed varies: it does not count time spent waiting.
    pub cpu_us_per_step: Option<f64>,
    /// `cpu_us_per_step` by thread role (`process_stats::thread_role`: actors, committer,
    /// sled_io, tokio, other); a thread that ended during the run counts as `other`.
    pub cpu_us_per_step_by_role: Option<BTreeMap<&'static str, f64>>,
    /// Share of the wall (%) each role's threads spent runnable but waiting for a CPU (the
    /// scheduler's run queue), summed over the role's threads still live at the end: two
    /// arbiters each waiting half the run give 100. The committer's share is time every
    /// commit waited with it. `None` where the kernel keeps no `schedstat`, and over `--url`
    /// (the server's threads are not this process's).
    pub run_queue_wait_pct_by_role: Option<BTreeMap<&'static str, f64>>,
    /// Share of the run's wall time the store's one writer spent on group commits (%), and the
    /// shares of the wall it spent in sled's `flush()` and in fsync (both within the first):
    /// near 100, the committer is what limits the load. flush and fsync are mostly waits on
    /// the disk; sled's `flush()` also writes its buffer itself when no IO thread has. All
    /// three are wall time: they include the committer's waits for a CPU
    /// (`run_queue_wait_pct_by_role`).
    pub committer_busy_pct: Option<f64>,
    pub committer_flush_pct: Option<f64>,
    pub committer_fsync_pct: Option<f64>,
    /// Raw records per second of the same store (sled or PostgreSQL) in the same run, with
    /// `--baseline`.
    pub raw_per_s: Option<f64>,
    /// Durable transitions per second (two per step) over `raw_per_s`.
    pub ratio_to_raw: Option<f64>,
    /// With `--commands-per-s`: commands sent and rejected; the latency (call → answer) of
    /// the applied ones (Q-4: accepted → applied), and apart, the rejected ones' p99 (a
    /// command that reaches an execution just finished: it is activated to answer).
    pub commands: Option<u64>,
    pub commands_rejected: Option<u64>,
    pub command_p50_ms: Option<f64>,
    pub command_p99_ms: Option<f64>,
    pub rejected_p99_ms: Option<f64>,
    /// With `--park`: executions parked and resident memory per parked execution.
    pub parked: Option<usize>,
    pub rss_per_parked_bytes: Option<f64>,
    /// With `--url`: why the first failed execution failed, if one did.
    pub first_error: Option<String>,
    /// With `--jobs` (J-1): leases the queue granted, per second of the run; each Job's wait
    /// from admission to its first lease (the store's `queued_at_ms` → `admitted_at_ms`,
    /// millisecond resolution); and the utilisation while a Job waited: units held by
    /// committed leases over units declared, integrated over that time (from the log).
    pub admissions: Option<u64>,
    pub admissions_per_s: Option<f64>,
    pub queue_wait_p50_ms: Option<f64>,
    pub queue_wait_p99_ms: Option<f64>,
    pub utilisation: Option<f64>,
    /// S-8: the store's bytes on disk, sampled while the load ran.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub store_samples: Vec<StoreSample>,
    /// S-8: executions retention purged while the load ran.
    pub executions_purged: Option<u64>,
}

/// S-8: one sample of the store while a load runs: seconds since the load started, the store's bytes on disk, executions
/// purged and log records swept so far.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct StoreSample {
    pub at_s: f64,
    pub bytes: u64,
    pub purged: u64,
    pub swept: u64,
    pub examined: u64,
}

pub(crate) fn ms(histogram: &Histogram<u64>, quantile: f64) -> f64 {
    histogram.value_at_quantile(quantile) as f64 / 1000.0
}

/// The thread roles (`process_stats::thread_role`) in the order the table shows them.
const ROLES: [&str; 5] = ["actors", "committer", "sled_io", "tokio", "other"];

/// A value per role for the table, in `ROLES`' order: `actors 12.3, committer 4.5, …`.
fn by_role(values: &BTreeMap<&'static str, f64>, show: impl Fn(f64) -> String) -> String {
    let shown: Vec<String> = ROLES
        .iter()
        .filter_map(|role| Some(format!("{role} {}", show(*values.get(role)?))))
        .collect();
    shown.join(", ")
}

impl LoadReport {
    /// A report of a load of `options` on `target`, with the latency percentiles of its
    /// steps and executions (histograms in µs); the caller fills in the rest.
    pub(crate) fn measured(
        target: String,
        options: &LoadOptions,
        steps_us: &Histogram<u64>,
        executions_us: &Histogram<u64>,
    ) -> Self {
        Self {
            target,
            kind: options.function.clone().unwrap_or_else(|| "agent".into()),
            store: match options.postgres {
                Some(_) => "postgres".into(),
                None => "sled".into(),
            },
            executions: options.executions,
            steps: options.steps,
            concurrency: options.concurrency,
            payload_bytes: options.payload_bytes,
            step_p50_ms: ms(steps_us, 0.50),
            step_p99_ms: ms(steps_us, 0.99),
            step_p999_ms: ms(steps_us, 0.999),
            step_max_ms: steps_us.max() as f64 / 1000.0,
            execution_p50_ms: ms(executions_us, 0.50),
            execution_p99_ms: ms(executions_us, 0.99),
            ..Self::default()
        }
    }

    /// The readable summary table.
    pub fn table(&self) -> String {
        let mut rows = vec![
            ("target", self.target.clone()),
            ("kind", self.kind.clone()),
            (
                "executions",
                format!(
                    "{} ({} completed, {} failed)",
                    self.executions, self.completed, self.failed
                ),
            ),
            ("steps per execution", self.steps.to_string()),
            ("concurrency", self.concurrency.to_string()),
            ("payload bytes", self.payload_bytes.to_string()),
            ("wall", format!("{:.2} s", self.wall_s)),
            ("durable steps/s", format!("{:.0}", self.steps_per_s)),
            ("executions/s", format!("{:.0}", self.executions_per_s)),
            (
                "step p50 / p99 / p999 / max",
                format!(
                    "{:.3} / {:.3} / {:.3} / {:.3} ms",
                    self.step_p50_ms, self.step_p99_ms, self.step_p999_ms, self.step_max_ms
                ),
            ),
            (
                "execution p50 / p99",
                format!(
                    "{:.1} / {:.1} ms",
                    self.execution_p50_ms, self.execution_p99_ms
                ),
            ),
            ("fsyncs", self.fsyncs.to_string()),
            (
                "states: parked / replayed",
                format!(
                    "{} / {}",
                    self.state_loads_parked, self.state_loads_replayed
                ),
            ),
            ("peak RSS", format!("{:.1} MiB", self.peak_rss_mib)),
        ];
        if let Some(cpu) = self.cpu_us_per_step {
            rows.push(("CPU per step", format!("{cpu:.1} µs (all threads)")));
        }
        if let Some(roles) = &self.cpu_us_per_step_by_role {
            rows.push(("  by thread (µs)", by_role(roles, |us| format!("{us:.1}"))));
        }
        if let Some(waited) = &self.run_queue_wait_pct_by_role {
            let shown = by_role(waited, |pct| format!("{pct:.0}%"));
            rows.push(("  waiting for a CPU (of wall)", shown));
        }
        if let (Some(busy), Some(flush), Some(fsync)) = (
            self.committer_busy_pct,
            self.committer_flush_pct,
            self.committer_fsync_pct,
        ) {
            rows.push((
                "committer busy",
                format!("{busy:.0}% of wall (in flush {flush:.0}%, in fsync {fsync:.0}% of wall)"),
            ));
        }
        if let Some(sent) = self.commands {
            let rejected = self.commands_rejected.unwrap_or(0);
            rows.push(("commands (rejected)", format!("{sent} ({rejected})")));
            if let (Some(p50), Some(p99)) = (self.command_p50_ms, self.command_p99_ms) {
                rows.push((
                    "applied command p50 / p99",
                    format!("{p50:.3} / {p99:.3} ms"),
                ));
            }
            if let Some(p99) = self.rejected_p99_ms {
                rows.push(("rejected command p99", format!("{p99:.3} ms")));
            }
        }
        if let (Some(parked), Some(bytes)) = (self.parked, self.rss_per_parked_bytes) {
            rows.push(("parked executions", parked.to_string()));
            rows.push(("RSS per parked execution", format!("{bytes:.0} bytes")));
        }
        if let (Some(admissions), Some(per_s)) = (self.admissions, self.admissions_per_s) {
            rows.push(("admissions (per s)", format!("{admissions} ({per_s:.0}/s)")));
        }
        if let (Some(p50), Some(p99)) = (self.queue_wait_p50_ms, self.queue_wait_p99_ms) {
            rows.push(("queue wait p50 / p99", format!("{p50:.0} / {p99:.0} ms")));
        }
        if let Some(utilisation) = self.utilisation {
            rows.push(("utilisation (queue not empty)", format!("{utilisation:.3}")));
        }
        if let (Some(raw), Some(ratio)) = (self.raw_per_s, self.ratio_to_raw) {
            rows.push(("raw records/s (same store)", format!("{raw:.0}")));
            rows.push(("transitions / raw", format!("{ratio:.2}")));
        }
        rows.iter()
            .map(|(name, value)| format!("{name:<30} {value}\n"))
            .collect()
    }
}
