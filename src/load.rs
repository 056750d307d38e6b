//! `openprogram load`: drives concurrent agent turns against an embedded store and reports
//! durable steps per second and latency percentiles, optionally against the raw
//! storage limit measured in the same run.
//!
//! Each execution is the scripted provider issuing `steps` `echo` calls of `payload_bytes`,
//! then a reply. A *step* is a provider decision and a tool result, each durably
//! checkpointed; it is timed as the interval between consecutive tool calls of one
//! execution (so an execution of K steps gives K-1 samples). An execution is timed from
//! admission to its terminal state. Nothing here asserts a figure: it measures and reports.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::FutureExt;
use hdrhistogram::Histogram;
use openprogram_actors::agent::{Tool, ToolCall};
use openprogram_actors::execution::machine::Recovery;
use openprogram_actors::service::ScriptElement;
use openprogram_storage::{ExecutionId, MetricsSnapshot, SessionId};
use serde_json::json;

use crate::load_report::ms;
pub use crate::load_report::{LoadOptions, LoadReport};
use crate::process_stats::{
    cpu_by_role, peak_rss_mib, process_cpu, rss_kib, thread_times, waited_by_role,
};
use crate::{Error, Result, Runtime, StartRequest};

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

/// Sends Pause/Continue pairs to random running executions until `done`, each pair in its
/// own task so slow commands do not lower the rate; returns the latencies (µs) of the applied
/// and of the rejected commands.
async fn send_commands(
    runtime: Runtime,
    running: Arc<Mutex<Vec<(SessionId, ExecutionId)>>>,
    per_s: f64,
    done: Arc<std::sync::atomic::AtomicBool>,
) -> Result<CommandLatencies> {
    let interval = Duration::from_secs_f64(1.0 / per_s.max(0.001));
    // xorshift64 picks the targets; which ones does not change what is measured.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut pairs = Vec::new();
    // One pair at a time per execution: overlapping pairs could leave it paused.
    let commanded: Arc<Mutex<std::collections::HashSet<ExecutionId>>> = Arc::default();
    while !done.load(Ordering::Acquire) {
        tokio::time::sleep(interval).await;
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let (session, target) = {
            let running = running.lock().unwrap_or_else(PoisonError::into_inner);
            match running.len() {
                0 => continue,
                len => running[(state % len as u64) as usize],
            }
        };
        if !commanded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(target)
        {
            continue;
        }
        let (runtime, commanded) = (runtime.clone(), commanded.clone());
        pairs.push(tokio::spawn(async move {
            let pair = pause_then_continue(runtime, session, target).await;
            commanded
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&target);
            pair
        }));
    }
    let mut latencies = CommandLatencies {
        applied: histogram(),
        rejected: histogram(),
    };
    for pair in pairs {
        let pair = pair
            .await
            .map_err(|error| Error::Internal(format!("a command task panicked: {error}")))??;
        for (micros, applied) in pair {
            if applied {
                latencies.applied.saturating_record(micros);
            } else {
                latencies.rejected.saturating_record(micros);
            }
        }
    }
    Ok(latencies)
}

/// Command latencies (µs), applied and rejected apart.
struct CommandLatencies {
    applied: Histogram<u64>,
    rejected: Histogram<u64>,
}

/// How many times a Continue is retried while its execution is still paused.
const CONTINUE_ATTEMPTS_MAX: usize = 5;

/// Pauses an execution and continues it again (a paused execution would never finish);
/// returns each command's latency (µs) and whether it was applied.
async fn pause_then_continue(
    runtime: Runtime,
    session: SessionId,
    target: ExecutionId,
) -> Result<Vec<(u64, bool)>> {
    let mut timings = Vec::new();
    let sent_at = Instant::now();
    let paused = runtime
        .command(
            session,
            target,
            crate::Command::new(crate::CommandBody::Pause),
        )
        .await?;
    timings.push((
        sent_at.elapsed().as_micros() as u64,
        paused.status == "applied",
    ));
    if paused.status != "applied" {
        return Ok(timings);
    }
    for _ in 0..CONTINUE_ATTEMPTS_MAX {
        let sent_at = Instant::now();
        let continued = runtime
            .command(
                session,
                target,
                crate::Command::new(crate::CommandBody::Continue {
                    policy: None,
                    budget: None,
                }),
            )
            .await?;
        timings.push((
            sent_at.elapsed().as_micros() as u64,
            continued.status == "applied",
        ));
        if continued.status == "applied"
            || runtime
                .store()
                .head(target)?
                .map(|head| head.state.is_terminal())
                .unwrap_or(true)
        {
            break;
        }
    }
    Ok(timings)
}

/// `echo`, timing each call against the previous call of the same execution.
struct TimedEcho {
    clock: Arc<StepClock>,
}

#[derive(Default)]
struct StepClock {
    last_call: Mutex<HashMap<ExecutionId, Instant>>,
    steps_us: Mutex<Option<Histogram<u64>>>,
    /// Tool calls made: the steps actually run.
    calls: std::sync::atomic::AtomicU64,
}

impl StepClock {
    fn mark(&self, execution_id: ExecutionId) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let previous = self
            .last_call
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(execution_id, now);
        if let Some(previous) = previous {
            record(&self.steps_us, now - previous);
        }
    }
}

fn record(histogram: &Mutex<Option<Histogram<u64>>>, elapsed: Duration) {
    let mut histogram = histogram.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(histogram) = histogram.as_mut() {
        histogram.saturating_record(elapsed.as_micros() as u64);
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

pub(crate) fn histogram() -> Histogram<u64> {
    // Three significant digits up to an hour in microseconds: `new_with_bounds` cannot fail
    // for these constants.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("invariant: valid histogram bounds")
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
    let clock = Arc::new(StepClock {
        steps_us: Mutex::new(Some(histogram())),
        ..StepClock::default()
    });
    let mut builder = match &options.postgres {
        Some(url) => Runtime::builder().store_url(url.clone()),
        None => Runtime::builder().data_dir(&data_dir),
    };
    builder = builder
        .tool(Arc::new(TimedEcho {
            clock: Arc::clone(&clock),
        }))
        .function(load_function(Arc::clone(&clock)));
    for (name, capacity) in &options.resources {
        builder = builder.resource(name.clone(), *capacity);
    }
    builder = builder.one_turn_per_session(!options.parallel_turns);
    if let Some(retain) = options.retain_finished {
        builder = builder.retain_finished(retain);
    }
    let runtime = builder.open()?;
    let progress = match options.progress {
        true => indicatif::ProgressBar::new(options.executions as u64),
        false => indicatif::ProgressBar::hidden(),
    };
    let drive = Drive {
        runtime: runtime.clone(),
        // Shared by the workers: cloned once per execution (its request owns it).
        script: Arc::new(script(&options)),
        next: Arc::default(),
        failed: Arc::default(),
        clock: Arc::clone(&clock),
        executions_us: Arc::new(Mutex::new(Some(histogram()))),
        progress: progress.clone(),
        running: Arc::default(),
        function: options
            .function
            .is_some()
            .then(|| json!({"count": options.steps, "payload_bytes": options.payload_bytes})),
        job: options.jobs.then(|| crate::JobRequest {
            resources: options
                .resources
                .iter()
                .map(|(name, _)| (name.clone(), 1))
                .collect(),
            ..Default::default()
        }),
        queue_waits_us: Arc::new(Mutex::new(Some(histogram()))),
    };
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let commander = options.commands_per_s.map(|per_s| {
        tokio::spawn(send_commands(
            runtime.clone(),
            drive.running.clone(),
            per_s,
            done.clone(),
        ))
    });
    let sampler = crate::load_store::start(&options, &runtime, &done);
    let store_before = runtime.store().metrics();
    let before = Readings::now();
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
    progress.finish_and_clear();
    done.store(true, Ordering::Release);
    let (store_samples, executions_purged) =
        crate::load_store::finish(sampler, &options, &runtime).await?;
    let commands =
        match commander {
            Some(commander) => Some(commander.await.map_err(|error| {
                Error::Internal(format!("the command sender panicked: {error}"))
            })??),
            None => None,
        };
    let parked = match options.park {
        Some(n) => Some(parked_memory(&runtime, n, options.concurrency).await?),
        None => None,
    };
    let fsyncs = runtime.store().metrics().fsyncs - store_before.fsyncs;
    let (state_loads_parked, state_loads_replayed) = runtime.inspect().state_loads();
    // Before the baseline, whose own sled cache would count otherwise.
    let peak_rss_mib = peak_rss_mib();
    runtime.shutdown().await;
    let Drive {
        runtime: driven,
        failed,
        executions_us,
        queue_waits_us,
        ..
    } = drive;
    // The store closes with its last handle, the driver's or the runtime's; only then may a
    // temporary directory go (sled 0.34 waits for good on a last flush to deleted files).
    drop(driven);
    drop(runtime);
    drop(temporary);
    let take = |histogram: &Mutex<Option<Histogram<u64>>>| {
        histogram
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .unwrap_or_else(self::histogram)
    };
    let steps_us = take(&clock.steps_us);
    let executions_us = take(&executions_us);
    let total_steps = clock.calls.load(Ordering::Relaxed);
    let steps_per_s = total_steps as f64 / wall.as_secs_f64();
    let raw_per_s = match options.baseline {
        Some(duration) => Some(crate::load_store::raw_baseline(&options, duration)?),
        None => None,
    };
    let busy_pct = |micros: fn(&MetricsSnapshot) -> u64| {
        let spent = micros(&store_after).saturating_sub(micros(&store_before));
        Some(spent as f64 / 1e6 / wall.as_secs_f64() * 100.0)
    };
    let failed = failed.load(Ordering::Relaxed);
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
        committer_busy_pct: busy_pct(|metrics| metrics.group_micros_total),
        committer_flush_pct: busy_pct(|metrics| metrics.flush_micros_total),
        committer_fsync_pct: busy_pct(|metrics| metrics.fsync_micros_total),
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
        ..LoadReport::measured("embedded".into(), &options, &steps_us, &executions_us)
    };
    let mut report = spent.into_report(report, total_steps, wall);
    if let Some((queue, utilisation)) = queue {
        let waits = take(&queue_waits_us);
        let stats = &queue.stats;
        report.admissions = Some(stats.admissions);
        report.admissions_per_s = Some(stats.admissions as f64 / wall.as_secs_f64());
        report.queue_wait_p50_ms = Some(ms(&waits, 0.50));
        report.queue_wait_p99_ms = Some(ms(&waits, 0.99));
        report.utilisation = utilisation;
    }
    Ok(commands_into_report(report, commands.as_ref()))
}

/// The name the load registers its function under.
const LOAD_FUNCTION: &str = "load_steps";

/// The function of `--function steps`: `count` Idempotent steps, each returning the payload
/// from memory and marking the step clock, then `{"done": count}`.
fn load_function(clock: Arc<StepClock>) -> openprogram_actors::function::DurableFunction {
    openprogram_actors::function::DurableFunction::new(
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
    if let Some(function) = options.function.as_deref().filter(|name| *name != "steps") {
        return Err(Error::InvalidRequest(format!(
            "--function {function}: the load runs `steps`"
        )));
    }
    if options.baseline.is_some_and(|duration| duration.is_zero()) {
        return Err(Error::InvalidRequest(
            "--baseline needs at least 1 second".into(),
        ));
    }
    if options.jobs && options.resources.is_empty() {
        return Err(Error::InvalidRequest(
            "--jobs needs at least one --resource NAME=CAPACITY".into(),
        ));
    }
    if options.executions == 0 || options.concurrency == 0 {
        return Err(Error::InvalidRequest(
            "executions and concurrency must be at least 1".into(),
        ));
    }
    Ok(())
}

/// The store's directory: `--data`, or a fresh temporary one (kept while the guard lives).
fn store_dir(options: &LoadOptions) -> Result<(Option<tempfile::TempDir>, std::path::PathBuf)> {
    match &options.data {
        Some(dir) => Ok((None, dir.clone())),
        // PostgreSQL: no directory is written.
        None if options.postgres.is_some() => Ok((None, std::path::PathBuf::new())),
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
    executions_us: Arc<Mutex<Option<Histogram<u64>>>>,
    progress: indicatif::ProgressBar,
    /// Executions admitted and not yet ended, each in its own session (where the command
    /// sender aims).
    running: Arc<Mutex<Vec<(SessionId, ExecutionId)>>>,
    /// `--function`: the input of the load's function, run instead of the script.
    function: Option<serde_json::Value>,
    /// `--jobs`: what each execution asks the queue for.
    job: Option<crate::JobRequest>,
    /// `--jobs`: each Job's wait from admission to its first lease (µs).
    queue_waits_us: Arc<Mutex<Option<Histogram<u64>>>>,
}

impl Drive {
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
            worker
                .await
                .map_err(|error| Error::Internal(format!("a load worker panicked: {error}")))??;
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
        self.running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((session, execution_id));
        let finished = self.runtime.wait_finished(session, execution_id).await;
        {
            let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(index) = running.iter().position(|(_, id)| *id == execution_id) {
                running.swap_remove(index);
            }
        }
        finished?;
        record(&self.executions_us, admitted.elapsed());
        self.clock
            .last_call
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&execution_id);
        if self.job.is_some() {
            if let Some(job) = self.runtime.store().job(execution_id)? {
                let waited = job
                    .admitted_at_ms
                    .map(|at| at.saturating_sub(job.queued_at_ms));
                if let Some(waited) = waited {
                    record(&self.queue_waits_us, Duration::from_millis(waited));
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
}

/// The process's CPU and its threads' times at the start of the run. The threads are read
/// inside the process's readings, so that their sum stays within it.
struct Readings {
    cpu: Option<Duration>,
    threads: Option<std::collections::BTreeMap<u32, crate::process_stats::ThreadTimes>>,
}

/// What the run spent: CPU in all and by thread role, and each role's wait for a CPU.
struct Spent {
    cpu: Option<Duration>,
    roles: Option<std::collections::BTreeMap<&'static str, Duration>>,
    waited: Option<std::collections::BTreeMap<&'static str, Duration>>,
}

impl Readings {
    fn now() -> Self {
        let cpu = process_cpu();
        Self {
            cpu,
            threads: thread_times(),
        }
    }

    fn since(self) -> Spent {
        let threads_after = thread_times();
        let cpu = process_cpu()
            .zip(self.cpu)
            .map(|(after, before)| after.saturating_sub(before));
        let waited = self
            .threads
            .as_ref()
            .zip(threads_after.as_ref())
            .and_then(|(before, after)| waited_by_role(before, after));
        let roles = self
            .threads
            .zip(threads_after)
            .zip(cpu)
            .map(|((before, after), cpu)| cpu_by_role(&before, &after, cpu));
        Spent { cpu, roles, waited }
    }
}

impl Spent {
    /// CPU per step (in all and by role) and the share of the wall each role waited.
    fn into_report(self, mut report: LoadReport, total_steps: u64, wall: Duration) -> LoadReport {
        let per_step = |cpu: Duration| cpu.as_secs_f64() * 1e6 / total_steps.max(1) as f64;
        report.cpu_us_per_step = self.cpu.filter(|_| total_steps > 0).map(per_step);
        report.cpu_us_per_step_by_role = self.roles.filter(|_| total_steps > 0).map(|roles| {
            let per_role = roles.into_iter().map(|(role, cpu)| (role, per_step(cpu)));
            per_role.collect()
        });
        report.run_queue_wait_pct_by_role = self.waited.map(|waited| {
            let pct = |time: Duration| time.as_secs_f64() / wall.as_secs_f64() * 100.0;
            waited
                .into_iter()
                .map(|(role, time)| (role, pct(time)))
                .collect()
        });
        report
    }
}

/// Parks `n` executions and measures the memory each holds (bytes).
async fn parked_memory(runtime: &Runtime, n: usize, concurrency: usize) -> Result<(usize, f64)> {
    let before_kib = rss_kib();
    park(runtime, n, concurrency).await?;
    let grown = rss_kib().saturating_sub(before_kib) * 1024;
    Ok((n, grown as f64 / n.max(1) as f64))
}

/// The command sender's latencies, if it ran.
fn commands_into_report(mut report: LoadReport, commands: Option<&CommandLatencies>) -> LoadReport {
    let Some(latencies) = commands else {
        return report;
    };
    report.commands = Some(latencies.applied.len() + latencies.rejected.len());
    report.commands_rejected = Some(latencies.rejected.len());
    if !latencies.applied.is_empty() {
        report.command_p50_ms = Some(ms(&latencies.applied, 0.50));
        report.command_p99_ms = Some(ms(&latencies.applied, 0.99));
    }
    if !latencies.rejected.is_empty() {
        report.rejected_p99_ms = Some(ms(&latencies.rejected, 0.99));
    }
    report
}
