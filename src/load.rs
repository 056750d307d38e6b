//! `openprogram load`: drives concurrent agent turns against an embedded store and reports
//! durable steps per second and latency percentiles, optionally beside the raw store's
//! rate measured in the same run. Each execution is the scripted provider issuing `steps`
//! `echo` calls of `payload_bytes`, then a reply. A *step* (a provider decision and a tool
//! result, each durably checkpointed) is timed between consecutive tool calls of one
//! execution (K steps give K-1 samples); an execution, from admission to its terminal
//! state. Nothing here asserts a figure: it measures and reports.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::FutureExt;
use hdrhistogram::Histogram;
use openprogram_actors::agent::{Tool, ToolCall};
use openprogram_actors::machine::Recovery;
use openprogram_actors::service::ScriptElement;
use openprogram_storage::{ExecutionId, MetricsSnapshot, SessionId};
use serde_json::json;

use crate::load_report::{histogram, lock, ms, panicked};
pub use crate::load_report::{LoadOptions, LoadReport};
use crate::process_stats::{peak_rss_mib, rss_kib, Readings, Spent};
use crate::{Error, Result, Runtime, RuntimeBuilder, StartRequest};

/// Parks `n` executions, each in a session of its own (a session runs one turn at a time,
/// C-2): each is admitted paused and stepped once (its actor runs one model decision,
/// pauses and releases itself). Returns once no actor is live.
pub async fn park(runtime: &Runtime, n: usize, concurrency: usize) -> Result<()> {
    let script: Vec<ScriptElement> = vec![
        json!({"tool": "echo", "args": {"text": "x"}}).into(),
        json!({"reply": "done"}).into(),
    ];
    let mut admitted = 0;
    while admitted < n {
        let batch = concurrency.max(1).min(n - admitted);
        let parks = (0..batch).map(|_| async {
            let session = SessionId::new();
            let request = StartRequest {
                message: "park".into(),
                script: script.clone(),
                start_paused: true,
                ..StartRequest::default()
            };
            let started = runtime.start_execution(session, request).await?;
            let step = crate::Command::new(crate::CommandBody::Step);
            runtime.command(session, started.execution_id, step).await
        });
        for parked in futures::future::join_all(parks).await {
            parked?;
        }
        admitted += batch;
    }
    while runtime.live_executions() > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// `echo`, timing each call against the previous call of the same execution.
struct TimedEcho {
    clock: Arc<StepClock>,
}

#[derive(Default)]
struct StepClock {
    last_call: Mutex<HashMap<ExecutionId, Instant>>,
    steps_us: Latencies,
    /// Tool calls made: the steps actually run.
    calls: std::sync::atomic::AtomicU64,
}

impl StepClock {
    fn mark(&self, execution_id: ExecutionId) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let previous = lock(&self.last_call).insert(execution_id, now);
        if let Some(previous) = previous {
            self.steps_us.record(now - previous);
        }
    }
}

/// A latency histogram (µs) the workers share, taken whole once they are done.
struct Latencies(Mutex<Histogram<u64>>);

impl Default for Latencies {
    fn default() -> Self {
        Self(Mutex::new(histogram()))
    }
}

impl Latencies {
    fn record(&self, elapsed: Duration) {
        lock(&self.0).saturating_record(elapsed.as_micros() as u64);
    }

    fn take(&self) -> Histogram<u64> {
        std::mem::replace(&mut *lock(&self.0), histogram())
    }
}

impl Tool for TimedEcho {
    fn name(&self) -> &str {
        "echo"
    }
    fn recovery(&self) -> Recovery {
        Recovery::Idempotent
    }
    fn call(&self, call: ToolCall) -> BoxFuture<'static, openprogram_actors::agent::ToolResult> {
        self.clock.mark(call.execution_id);
        let text = call
            .args
            .get("text")
            .and_then(|text| text.as_str())
            .map(str::to_owned);
        futures::future::ready(text.ok_or_else(|| "missing `text`".into())).boxed()
    }
}

/// The script of every execution of the load, embedded or over HTTP: `steps` `echo` calls
/// of `payload_bytes`, then a reply.
pub(crate) fn script(options: &LoadOptions) -> Vec<ScriptElement> {
    let payload = "x".repeat(options.payload_bytes);
    let echo = ScriptElement::from(json!({"tool": "echo", "args": {"text": payload}}));
    let mut script = vec![echo; options.steps];
    script.push(json!({"reply": "done"}).into());
    script
}

/// Runs the load and returns what it measured.
pub async fn run(options: LoadOptions) -> Result<LoadReport> {
    validate(&options)?;
    let (temporary, data_dir) = store_dir(&options)?;
    let clock = Arc::new(StepClock::default());
    let runtime = open(&options, &data_dir, &clock)?;
    let drive = Drive::new(runtime.clone(), &options, Arc::clone(&clock));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let commander = commander(&options, &drive, &runtime, &done);
    let sampler = crate::load_store::start(&options, &runtime, &done);
    let store_before = runtime.store().metrics();
    let before = Readings::now(&data_dir);
    let started = Instant::now();
    drive
        .run(options.executions, options.concurrency, options.steps)
        .await?;
    let wall = started.elapsed();
    let spent = before.since();
    let queue = match options.jobs {
        true => Some((
            runtime.resources().await?,
            crate::load_jobs::committed_utilisation(runtime.store().as_ref(), &options.resources)?,
        )),
        false => None,
    };
    let store_after = runtime.store().metrics();
    drive.progress.finish_and_clear();
    done.store(true, Ordering::Release);
    let (store_samples, executions_purged) =
        crate::load_store::finish(sampler, &options, &runtime).await?;
    let commands = match commander {
        Some(commander) => Some(commander.await.map_err(panicked("the command sender"))??),
        None => None,
    };
    let parked = match options.park {
        Some(n) => Some(parked_memory(&runtime, n, options.concurrency).await?),
        None => None,
    };
    let retention_backlog = crate::load_store::retention_backlog(&options, &runtime)?;
    let fsyncs = runtime.store().metrics().fsyncs - store_before.fsyncs;
    let stored = runtime.store().disk_bytes();
    let (state_loads_parked, state_loads_replayed) = runtime.inspect().state_loads();
    // Before the baseline, whose own sled cache would count otherwise.
    let peak_rss_mib = peak_rss_mib();
    runtime.shutdown().await;
    // The store is closed: its temporary directory may go (sled 0.34 waits for good on a
    // last flush to deleted files).
    let (failed, executions_us, queue_waits_us) = drive.finish();
    drop(runtime);
    let (store_bytes_compacted, drain_samples, drain_bytes_compacted) =
        crate::load_store::drain(&options, &data_dir, || open(&options, &data_dir, &clock)).await?;
    drop(temporary);
    let raw_per_s = options
        .baseline
        .map(|duration| crate::load_store::raw_baseline(&options, duration))
        .transpose()?;
    let total_steps = clock.calls.load(Ordering::Relaxed);
    let steps_per_s = total_steps as f64 / wall.as_secs_f64();
    let report = LoadReport {
        total_steps,
        completed: options.executions - failed,
        failed,
        wall_s: wall.as_secs_f64(),
        steps_per_s,
        executions_per_s: options.executions as f64 / wall.as_secs_f64(),
        fsyncs,
        state_loads_parked,
        state_loads_replayed,
        peak_rss_mib,
        // Durable writes per step: an agent's tool step is two (decision, result), a
        // function's Idempotent step one (its result and checkpoint).
        ratio_to_raw: raw_per_s.map(|raw| {
            let writes = if options.function.is_some() { 1.0 } else { 2.0 };
            writes * steps_per_s / raw
        }),
        raw_per_s,
        parked: parked.map(|(n, _)| n),
        rss_per_parked_bytes: parked.map(|(_, bytes)| bytes.round()),
        store_samples,
        executions_purged,
        retention_backlog,
        store_bytes_compacted,
        drain_samples,
        drain_bytes_compacted,
        disk_bytes_stored_per_step: (total_steps > 0 && options.postgres().is_none())
            .then(|| stored as f64 / total_steps as f64),
        ..LoadReport::measured(
            "embedded".into(),
            &options,
            &clock.steps_us.take(),
            &executions_us,
        )
    };
    let report = spent_into_report(spent, report, total_steps, wall);
    let report = committer_into_report(report, &store_before, &store_after, wall);
    let report = queue_into_report(report, queue, &queue_waits_us, wall);
    Ok(crate::load_commands::into_report(commands, report))
}

/// With `--commands-per-s`: Pause/Continue pairs sent to running executions until `done`.
fn commander(
    options: &LoadOptions,
    drive: &Drive,
    runtime: &Runtime,
    done: &Arc<std::sync::atomic::AtomicBool>,
) -> Option<tokio::task::JoinHandle<Result<crate::load_commands::CommandLatencies>>> {
    options.commands_per_s.map(|per_s| {
        let (running, done) = (drive.running.clone(), done.clone());
        tokio::spawn(crate::load_commands::send(runtime.clone(), running, per_s, done))
    })
}

/// The runtime the load drives: its `echo` and function mark the step clock.
fn open(
    options: &LoadOptions,
    data_dir: &std::path::Path,
    clock: &Arc<StepClock>,
) -> Result<Runtime> {
    Runtime::builder()
        .data_dir(data_dir)
        .with(options.postgres(), RuntimeBuilder::store_url)
        .tool(Arc::new(TimedEcho {
            clock: Arc::clone(clock),
        }))
        .function(load_function(Arc::clone(clock)))
        .resources(&options.resources)
        .one_turn_per_session(!options.parallel_turns)
        .with(options.retain_finished, RuntimeBuilder::retain_finished)
        .open()
}

/// The name the load registers its function under.
const LOAD_FUNCTION: &str = "load_steps";

/// The function of `--function steps`: `count` Idempotent steps, each returning the payload
/// from memory and marking the step clock, then `{"done": count}`.
fn load_function(clock: Arc<StepClock>) -> openprogram_actors::function::DurableFunction {
    openprogram_actors::function::DurableFunction::with_identity(
        LOAD_FUNCTION,
        1,
        "load:steps:1",
        move |context, input| {
            let clock = Arc::clone(&clock);
            async move {
                let count = input["count"].as_u64().unwrap_or(0);
                let payload = "x".repeat(input["payload_bytes"].as_u64().unwrap_or(0) as usize);
                for index in 1..=count {
                    let clock = Arc::clone(&clock);
                    let payload = payload.clone();
                    let execution_id = context.execution_id();
                    let _: String = context
                        .step(
                            &format!("s{index}"),
                            Recovery::Idempotent,
                            move |_| async move {
                                clock.mark(execution_id);
                                Ok(payload)
                            },
                        )
                        .await
                        .map_err(|error| error.to_string())?;
                }
                Ok(json!({ "done": count }))
            }
        },
    )
}

/// Usage errors, before anything is opened.
fn validate(options: &LoadOptions) -> Result<()> {
    let invalid = |message: String| Err(Error::InvalidRequest(message));
    if let Some(function) = options.function.as_deref().filter(|name| *name != "steps") {
        return invalid(format!("--function {function}: the load runs `steps`"));
    }
    if options.baseline.is_some_and(|duration| duration.is_zero()) {
        return invalid("--baseline needs at least 1 second".into());
    }
    if options.jobs && options.resources.is_empty() {
        return invalid("--jobs needs at least one --resource NAME=CAPACITY".into());
    }
    if options.executions == 0 || options.concurrency == 0 {
        return invalid("executions and concurrency must be at least 1".into());
    }
    Ok(())
}

/// The store's directory (on PostgreSQL, the node's: its mark of what it acknowledged):
/// `--data`, or a fresh temporary one (kept while the guard lives).
fn store_dir(options: &LoadOptions) -> Result<(Option<tempfile::TempDir>, std::path::PathBuf)> {
    match options.data_dir() {
        Some(dir) => Ok((None, dir)),
        None => {
            let dir = tempfile::tempdir().map_err(|error| Error::Unavailable(error.to_string()))?;
            let path = dir.path().to_path_buf();
            Ok((Some(dir), path))
        }
    }
}

/// What the workers share: each takes the next execution, admits it, waits for its end,
/// and records its latency and outcome.
#[derive(Clone)]
struct Drive {
    runtime: Runtime,
    script: Arc<Vec<ScriptElement>>,
    next: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
    clock: Arc<StepClock>,
    executions_us: Arc<Latencies>,
    progress: indicatif::ProgressBar,
    /// Executions admitted and not yet ended, each in its own session (where the command
    /// sender aims).
    running: crate::load_commands::Running,
    /// `--function`: the input of the load's function, run instead of the script.
    function: Option<serde_json::Value>,
    /// `--jobs`: what each execution asks the queue for.
    job: Option<crate::JobRequest>,
    /// `--jobs`: each Job's wait from admission to its first lease (µs).
    queue_waits_us: Arc<Latencies>,
}

impl Drive {
    fn new(runtime: Runtime, options: &LoadOptions, clock: Arc<StepClock>) -> Self {
        let function = json!({"count": options.steps, "payload_bytes": options.payload_bytes});
        let resources = options.resources.iter().map(|(name, _)| (name.clone(), 1));
        Self {
            runtime,
            // Shared by the workers: cloned once per execution (its request owns it).
            script: Arc::new(script(options)),
            next: Arc::default(),
            failed: Arc::default(),
            clock,
            executions_us: Arc::default(),
            progress: options.progress_bar(),
            running: Arc::default(),
            function: options.function.is_some().then_some(function),
            job: options.jobs.then(|| crate::JobRequest {
                resources: resources.collect(),
                ..Default::default()
            }),
            queue_waits_us: Arc::default(),
        }
    }

    /// `total` executions of `steps` steps, `concurrency` at a time.
    async fn run(&self, total: usize, concurrency: usize, steps: usize) -> Result<()> {
        let workers: Vec<_> = (0..concurrency.min(total))
            .map(|_| {
                let drive = self.clone();
                tokio::spawn(async move {
                    while drive.next.fetch_add(1, Ordering::Relaxed) < total {
                        drive.one(steps as u32 + 1).await?;
                    }
                    Ok::<(), Error>(())
                })
            })
            .collect();
        for worker in workers {
            worker.await.map_err(panicked("a load worker"))??;
        }
        Ok(())
    }

    async fn one(&self, max_iterations: u32) -> Result<()> {
        // Each execution is its own conversation: a session runs one turn at a time (C-2).
        let session = SessionId::new();
        let admitted = Instant::now();
        let execution_id = match &self.function {
            Some(input) => {
                let start = crate::FunctionStart {
                    function: LOAD_FUNCTION.into(),
                    input: input.clone(),
                    job: self.job.clone(),
                    ..Default::default()
                };
                let started = self.runtime.start_function(session, start).await?;
                started.started.execution_id
            }
            None => {
                let request = StartRequest {
                    message: "load".into(),
                    script: self.script.as_ref().clone(),
                    max_iterations: Some(max_iterations),
                    job: self.job.clone(),
                    ..StartRequest::default()
                };
                let started = self.runtime.start_execution(session, request).await?;
                started.execution_id
            }
        };
        lock(&self.running).push((session, execution_id));
        let finished = self.runtime.wait_finished(session, execution_id).await;
        lock(&self.running).retain(|(_, id)| *id != execution_id);
        finished?;
        self.executions_us.record(admitted.elapsed());
        lock(&self.clock.last_call).remove(&execution_id);
        if self.job.is_some() {
            if let Some(job) = self.runtime.store().job(execution_id)? {
                let waited = job
                    .admitted_at_ms
                    .map(|at| at.saturating_sub(job.queued_at_ms));
                if let Some(waited) = waited {
                    self.queue_waits_us.record(Duration::from_millis(waited));
                }
            }
        }
        let head = self.runtime.store().head(execution_id)?;
        if head.map(|head| head.state) != Some(openprogram_storage::ExecutionState::Completed) {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        self.progress.inc(1);
        Ok(())
    }

    /// Drops the driver's runtime handle; the failed executions, the executions' latencies
    /// and the Jobs' waits.
    fn finish(self) -> (usize, Histogram<u64>, Histogram<u64>) {
        let failed = self.failed.load(Ordering::Relaxed);
        (
            failed,
            self.executions_us.take(),
            self.queue_waits_us.take(),
        )
    }
}

/// CPU per step (in all and by role) and the share of the wall each role waited.
fn spent_into_report(
    spent: Spent,
    mut report: LoadReport,
    total_steps: u64,
    wall: Duration,
) -> LoadReport {
    let per_step = |cpu: Duration| cpu.as_secs_f64() * 1e6 / total_steps.max(1) as f64;
    report.cpu_us_per_step = spent.cpu.filter(|_| total_steps > 0).map(per_step);
    // What the store's device got; a PostgreSQL store's writes are its server's.
    let written = spent.written.filter(|_| total_steps > 0 && report.store == "sled");
    report.disk_bytes_written_per_step = written.map(|bytes| bytes as f64 / total_steps as f64);
    report.cpu_us_per_step_by_role = spent.roles.filter(|_| total_steps > 0).map(|roles| {
        let per_role = roles.into_iter().map(|(role, cpu)| (role, per_step(cpu)));
        per_role.collect()
    });
    report.run_queue_wait_pct_by_role = spent.waited.map(|waited| {
        let pct = |time: Duration| time.as_secs_f64() / wall.as_secs_f64() * 100.0;
        waited
            .into_iter()
            .map(|(role, time)| (role, pct(time)))
            .collect()
    });
    report
}

/// The share of the wall the committer spent on group commits, in flush and in fsync.
fn committer_into_report(
    mut report: LoadReport,
    before: &MetricsSnapshot,
    after: &MetricsSnapshot,
    wall: Duration,
) -> LoadReport {
    let busy_pct = |micros: fn(&MetricsSnapshot) -> u64| {
        let spent = micros(after).saturating_sub(micros(before));
        Some(spent as f64 / 1e6 / wall.as_secs_f64() * 100.0)
    };
    report.committer_busy_pct = busy_pct(|metrics| metrics.group_micros_total);
    report.committer_flush_pct = busy_pct(|metrics| metrics.flush_micros_total);
    report.committer_fsync_pct = busy_pct(|metrics| metrics.fsync_micros_total);
    report
}

/// Parks `n` executions and measures the memory each holds (bytes).
async fn parked_memory(runtime: &Runtime, n: usize, concurrency: usize) -> Result<(usize, f64)> {
    let before_kib = rss_kib();
    park(runtime, n, concurrency).await?;
    let grown = rss_kib().saturating_sub(before_kib) * 1024;
    Ok((n, grown as f64 / n.max(1) as f64))
}

/// With `--jobs`: the queue's admissions, the Jobs' waits and the utilisation.
fn queue_into_report(
    mut report: LoadReport,
    queue: Option<(crate::QueueReport, Option<f64>)>,
    waits: &Histogram<u64>,
    wall: Duration,
) -> LoadReport {
    let Some((queue, utilisation)) = queue else {
        return report;
    };
    report.admissions = Some(queue.stats.admissions);
    report.admissions_per_s = Some(queue.stats.admissions as f64 / wall.as_secs_f64());
    report.queue_wait_p50_ms = Some(ms(waits, 0.50));
    report.queue_wait_p99_ms = Some(ms(waits, 0.99));
    report.utilisation = utilisation;
    report
}
