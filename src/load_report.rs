//! What `openprogram load` runs (`LoadOptions`) and measured (`LoadReport`): the `--json` line and
//! the readable table, for a load embedded (`load.rs`) or driven over HTTP (`load_remote.rs`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use hdrhistogram::Histogram;
use openprogram_actors::resources::Resources;
use serde::Serialize;

use crate::overview::parse_duration;

/// What to run: `openprogram load`'s command line (the flags' docs are its `--help`).
#[derive(Debug, Clone, clap::Args)]
pub struct LoadOptions {
    /// The store to use (default: a fresh temporary one).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// The store as `serve --store` names it: a directory (sled, as --data) or
    /// postgres://….
    #[arg(long, conflicts_with_all = ["data", "url"])]
    pub store: Option<String>,
    /// Agent turns (or function executions) to run, each in a session of its own.
    #[arg(long, default_value_t = 1000)]
    pub executions: usize,
    /// Tool steps per execution.
    #[arg(long, default_value_t = 50)]
    pub steps: usize,
    /// How many executions run at once.
    #[arg(long, default_value_t = 1000)]
    pub concurrency: usize,
    /// Bytes of text each step's tool call carries and returns.
    #[arg(long, default_value_t = 200)]
    pub payload_bytes: usize,
    /// Also measure the raw store for this many seconds: sled (batches of 256 + flush +
    /// fsync), or PostgreSQL (transactions of 256 rows inserted by one statement).
    #[arg(long, num_args = 0..=1, default_missing_value = "3", value_parser = seconds)]
    pub baseline: Option<Duration>,
    /// Send this many Pause/Continue pairs per second to random running executions and
    /// report command latency.
    #[arg(long)]
    pub commands_per_s: Option<f64>,
    /// After the load, park this many executions and report memory per parked one.
    #[arg(long)]
    pub park: Option<usize>,
    /// Run durable functions instead of agent turns: `steps`, a function of
    /// --steps in-memory steps each. Embedded only.
    #[arg(long, conflicts_with = "url")]
    pub function: Option<String>,
    /// Admit every execution as a Job through the resource queue, asking for 1 of
    /// each --resource. Embedded only.
    #[arg(long, conflicts_with = "url")]
    pub jobs: bool,
    /// With --jobs: a resource as NAME=CAPACITY (repeatable; default model=8).
    #[arg(long = "resource", value_parser = Resources::parse_one, requires = "jobs")]
    pub resources: Vec<(String, u32)>,
    /// Purge executions ended longer ago than this while the load runs, and
    /// sample the store's size on disk (every 10 s unless --sample-store-every).
    #[arg(long, value_parser = parse_duration, conflicts_with = "url")]
    pub retain_finished: Option<Duration>,
    /// Sample the store's size on disk this often.
    #[arg(long, value_parser = parse_duration, conflicts_with = "url")]
    pub sample_store_every: Option<Duration>,
    /// With --retain-finished: after the load, report what `compact` would keep of the
    /// store, then reopen it for this long while retention purges what the load left,
    /// sampling its size, and report what `compact` keeps of that too.
    #[arg(long, value_parser = parse_duration, requires = "retain_finished")]
    pub drain: Option<Duration>,
    /// Run without one turn per session, to measure what it costs.
    #[arg(long, conflicts_with = "url")]
    pub parallel_turns: bool,
    /// One JSON line on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Drive a running server over HTTP instead of an embedded store; several
    /// (comma-separated) are nodes of one store, dealt the executions round robin.
    #[arg(long, value_delimiter = ',')]
    pub url: Vec<String>,
    /// The admin token for `--url` (else OPENPROGRAM_TOKEN).
    #[arg(long, requires = "url")]
    pub token: Option<String>,
    /// Log lines and spans of the embedded runtime, as `serve` has them (its figure with
    /// and without them measures their cost).
    #[command(flatten)]
    pub observability: crate::observability::ObservabilityArgs,
}

/// `--baseline`: whole seconds.
fn seconds(text: &str) -> Result<Duration, std::num::ParseIntError> {
    text.parse().map(Duration::from_secs)
}

impl LoadOptions {
    /// N-1: the PostgreSQL database `--store` names, if it names one.
    pub fn postgres(&self) -> Option<&str> {
        self.store
            .as_deref()
            .filter(|url| crate::is_postgres_url(url))
    }

    /// The sled store's directory: `--store`'s or `--data`; `None`: a temporary one, or PostgreSQL.
    pub fn data_dir(&self) -> Option<PathBuf> {
        match &self.store {
            Some(directory) if self.postgres().is_none() => Some(PathBuf::from(directory)),
            _ => self.data.clone(),
        }
    }

    /// A progress bar on stderr, unless the output is the JSON line.
    pub(crate) fn progress_bar(&self) -> indicatif::ProgressBar {
        match self.json {
            false => indicatif::ProgressBar::new(self.executions as u64),
            true => indicatif::ProgressBar::hidden(),
        }
    }
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
    /// Bytes written per step to the device that holds the store while the load ran (its
    /// journal and the zeros ahead of it, sled's pages, the file system's metadata; other
    /// processes' writes to that device too), where the kernel says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_bytes_written_per_step: Option<f64>,
    /// The store's size on disk when the load ended, per step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_bytes_stored_per_step: Option<f64>,
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
    /// shares of the wall it spent in sled's `flush()` and in fsync (both within the first): near
    /// 100, the committer is what limits the load. flush and fsync are mostly waits on the disk;
    /// sled's `flush()` also writes its buffer itself when no IO thread has. All three are wall
    /// time: they include the committer's waits for a CPU (`run_queue_wait_pct_by_role`).
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
    /// S-9, with retention: executions that ended longer ago than the retention period
    /// and one retention round when the load ended, and were not purged yet.
    pub retention_backlog: Option<u64>,
    /// S-9, with `--drain`: the bytes `compact` keeps of the store as the load left it.
    pub store_bytes_compacted: Option<u64>,
    /// S-9, with `--drain`: the store's bytes on disk while retention purged what the load
    /// left (seconds since the drain began), and what `compact` keeps after it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub drain_samples: Vec<StoreSample>,
    pub drain_bytes_compacted: Option<u64>,
}

/// S-8: one sample of the store while a load runs: seconds since the load started, the store's
/// bytes on disk, executions purged and log records swept so far.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct StoreSample {
    pub at_s: f64,
    pub bytes: u64,
    pub purged: u64,
    pub swept: u64,
    pub examined: u64,
}

/// A latency histogram in µs: three significant digits up to an hour.
pub(crate) fn histogram() -> Histogram<u64> {
    // `new_with_bounds` cannot fail for these constants.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("invariant: valid histogram bounds")
}

/// A lock a panicked holder left: what it guards is still whole (counters, samples).
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What a task that panicked is reported as.
pub(crate) fn panicked(what: &'static str) -> impl Fn(tokio::task::JoinError) -> crate::Error {
    move |error| crate::Error::Internal(format!("{what} panicked: {error}"))
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
            store: match options.postgres() {
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
        let disk = (self.disk_bytes_written_per_step, self.disk_bytes_stored_per_step);
        if let (Some(written), Some(stored)) = disk {
            let shown = format!("{written:.0} / {stored:.0} bytes");
            rows.push(("disk written / stored per step", shown));
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
        rows.extend(self.work_rows());
        rows.extend(self.retention_rows());
        rows.iter()
            .map(|(name, value)| format!("{name:<30} {value}\n"))
            .collect()
    }
}

impl LoadReport {
    /// Commands, parked executions, Jobs and the raw baseline, where the load measured them.
    fn work_rows(&self) -> Vec<(&'static str, String)> {
        let mut rows = Vec::new();
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
        rows
    }

    /// With retention: what it purged and left behind, and the store against what
    /// `compact` keeps of it.
    fn retention_rows(&self) -> Vec<(&'static str, String)> {
        let mib = |bytes: u64| format!("{:.1} MiB", bytes as f64 / 1048576.0);
        let mut rows = Vec::new();
        if let (Some(purged), Some(backlog)) = (self.executions_purged, self.retention_backlog) {
            let shown = format!("{purged} ({backlog} past the period not yet)");
            rows.push(("executions purged", shown));
        }
        if let (Some(last), Some(kept)) = (self.store_samples.last(), self.store_bytes_compacted) {
            let shown = format!("{} ({} after compact)", mib(last.bytes), mib(kept));
            rows.push(("store at the end", shown));
        }
        if let (Some(last), Some(kept)) = (self.drain_samples.last(), self.drain_bytes_compacted) {
            let shown = format!("{} ({} after compact)", mib(last.bytes), mib(kept));
            rows.push(("store after the drain", shown));
        }
        rows
    }
}
