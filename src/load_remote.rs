//! `openprogram load --url URL[,URL…] --token T`: `load.rs`'s executions and report, driven
//! through running servers' HTTP API (SPEC §6). Several URLs are nodes of one PostgreSQL
//! store (N-2), dealt the slots round robin; each execution is a session of its own (C-2).
//! Each slot is a thread that admits an execution on its node, follows its event stream to
//! its end, then takes the next. Timing is the server's clock, so the client's delays do not
//! count: a step is the interval between consecutive `tool_finished` events' `at_ms`, an
//! execution spans its first to its last event, steps/s is over the run's first to last
//! event. fsyncs, CPU and committer time are the servers' summed (busy: the mean across
//! nodes), peak RSS the largest, from `/metrics` before and after.

use std::io::BufRead as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::http::client::{Failure, Target};
use crate::load::{LoadOptions, LoadReport};
use crate::load_report::lock;

/// How long one execution's stream may stay open.
const EXECUTION_TIMEOUT: Duration = Duration::from_secs(600);
/// Stack of a slot's thread: it only reads a stream and parses small JSON lines.
const SLOT_STACK_BYTES: usize = 256 * 1024;

/// What one execution's events said.
#[derive(Debug, Default)]
struct Followed {
    /// `at_ms` of its `tool_finished` events, in order.
    tool_results_ms: Vec<u64>,
    first_ms: u64,
    last_ms: u64,
    /// The terminal state it reached (`None`: the stream ended first).
    state: Option<String>,
}

/// Runs the load against `targets` (nodes of one store). Options that need the embedded
/// store (`--data`, `--baseline`, `--commands-per-s`, `--park`) are refused.
pub fn run(options: &LoadOptions, targets: &[Target]) -> Result<LoadReport, Failure> {
    if targets.is_empty() {
        return Err(Failure::Usage("--url names no server".into()));
    }
    let embedded_only = [
        ("--data", options.data.is_some()),
        ("--baseline", options.baseline.is_some()),
        ("--commands-per-s", options.commands_per_s.is_some()),
        ("--park", options.park.is_some()),
    ];
    if let Some((flag, _)) = embedded_only.iter().find(|(_, given)| *given) {
        return Err(Failure::Usage(format!(
            "{flag} needs the embedded store; it cannot be used with --url"
        )));
    }
    if options.executions == 0 || options.concurrency == 0 {
        return Err(Failure::Usage(
            "--executions and --concurrency must be at least 1".into(),
        ));
    }
    let before = ServerMetrics::read_all(targets)?;
    let body = json!({
        "kind": "agent",
        "message": "load",
        "script": crate::load::script(options),
        "max_iterations": options.steps + 1,
    });
    let progress = options.progress_bar();
    let next = AtomicUsize::new(0);
    let followed: Mutex<Vec<Result<Followed, Failure>>> = Mutex::default();
    let started = Instant::now();
    std::thread::scope(|scope| {
        for slot in 0..options.concurrency.min(options.executions) {
            let target = &targets[slot % targets.len()];
            let (next, body) = (&next, &body);
            let (progress, followed) = (&progress, &followed);
            let spawned = std::thread::Builder::new()
                .stack_size(SLOT_STACK_BYTES)
                .spawn_scoped(scope, move || {
                    while next.fetch_add(1, Ordering::Relaxed) < options.executions {
                        let result = admit_and_follow(target, body);
                        progress.inc(1);
                        lock(followed).push(result);
                    }
                });
            if let Err(error) = spawned {
                // Fewer slots than asked: the load still runs, with the slots that started.
                tracing::warn!(%error, "a load slot could not start");
            }
        }
    });
    let wall = started.elapsed();
    progress.finish_and_clear();
    let after = ServerMetrics::read_all(targets)?;
    let followed = followed
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    let first_error = followed.iter().find_map(|result| match result {
        Err(Failure::Failed(message) | Failure::Usage(message)) => Some(message.clone()),
        Ok(followed) => match followed.state.as_deref() {
            Some("completed") => None,
            Some(state) => Some(format!("an execution ended {state}")),
            None => Some("an execution's event stream ended before the execution".into()),
        },
    });
    let url = targets
        .iter()
        .map(|target| target.url.as_str())
        .collect::<Vec<_>>()
        .join(",");
    let mut report = report(options, url, followed, wall, &before, &after);
    if report.completed == 0 {
        return Err(Failure::Failed(format!(
            "no execution completed{}",
            first_error.map_or(String::new(), |error| format!(": {error}"))
        )));
    }
    report.first_error = first_error;
    report.store = "server".into();
    Ok(report)
}

/// Admits one execution, in a session of its own, and reads its event stream until it ends.
fn admit_and_follow(target: &Target, body: &Value) -> Result<Followed, Failure> {
    let session = target.call("POST", "/v1/sessions", Some(&json!({})))?;
    let session = session["session_id"]
        .as_str()
        .ok_or_else(|| Failure::Failed("the server named no session_id".into()))?;
    let admitted = target.call(
        "POST",
        &format!("/v1/sessions/{session}/executions"),
        Some(body),
    )?;
    let execution = admitted["execution_id"]
        .as_str()
        .ok_or_else(|| Failure::Failed("the server named no execution_id".into()))?;
    let stream = target.stream(
        &format!("/v1/sessions/{session}/executions/{execution}/events/stream?after=0"),
        EXECUTION_TIMEOUT,
    )?;
    let mut followed = Followed::default();
    for line in std::io::BufReader::new(stream).lines() {
        let line = line.map_err(|error| Failure::Failed(format!("reading events: {error}")))?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let Ok(event) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        let Some(at_ms) = event["at_ms"].as_u64() else {
            continue; // not an event (a `resync` notice)
        };
        if followed.first_ms == 0 {
            followed.first_ms = at_ms;
        }
        followed.last_ms = at_ms;
        match event["type"].as_str() {
            Some("tool_finished") => followed.tool_results_ms.push(at_ms),
            Some("state_changed") => {
                let state = event["state"].as_str().unwrap_or_default().to_lowercase();
                if matches!(state.as_str(), "completed" | "failed" | "cancelled") {
                    followed.state = Some(state);
                    break;
                }
            }
            _ => {}
        }
    }
    Ok(followed)
}

/// The counters of `/metrics` the report uses.
#[derive(Debug, Default)]
struct ServerMetrics {
    fsyncs: f64,
    /// The committer's busy, flush and fsync seconds; `None` from a server that does not
    /// report its busy time (an older build).
    committer_s: Option<[f64; 3]>,
    cpu_s: f64,
    peak_resident_bytes: f64,
    loads_parked: f64,
    loads_replayed: f64,
}

impl ServerMetrics {
    /// Several nodes' counters: summed, but the committer's busy fractions averaged (each
    /// node has its own committer) and peak RSS the largest.
    fn read_all(targets: &[Target]) -> Result<Self, Failure> {
        let mut all = Self {
            committer_s: Some([0.0; 3]),
            ..Self::default()
        };
        for target in targets {
            let one = Self::read(target)?;
            all.fsyncs += one.fsyncs;
            all.cpu_s += one.cpu_s;
            all.peak_resident_bytes = all.peak_resident_bytes.max(one.peak_resident_bytes);
            all.loads_parked += one.loads_parked;
            all.loads_replayed += one.loads_replayed;
            // Known only if every node reports it.
            all.committer_s = all
                .committer_s
                .zip(one.committer_s)
                .map(|(sum, one)| [sum[0] + one[0], sum[1] + one[1], sum[2] + one[2]]);
        }
        if let Some(sum) = all.committer_s.as_mut() {
            let nodes = targets.len().max(1) as f64;
            sum.iter_mut().for_each(|seconds| *seconds /= nodes);
        }
        Ok(all)
    }

    fn read(target: &Target) -> Result<Self, Failure> {
        let text = target.text("GET", "/metrics", None)?;
        let value = |name: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.trim().parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        Ok(Self {
            fsyncs: value("openprogram_fsyncs_total "),
            committer_s: text
                .contains("openprogram_committer_busy_seconds_total ")
                .then(|| {
                    [
                        value("openprogram_committer_busy_seconds_total "),
                        value("openprogram_flush_seconds_total "),
                        value("openprogram_fsync_seconds_total "),
                    ]
                }),
            cpu_s: value("openprogram_process_cpu_seconds_total "),
            peak_resident_bytes: value("openprogram_process_peak_resident_bytes "),
            loads_parked: value("openprogram_state_loads_total{from=\"parked\"} "),
            loads_replayed: value("openprogram_state_loads_total{from=\"replay\"} "),
        })
    }
}

fn report(
    options: &LoadOptions,
    url: String,
    followed: Vec<Result<Followed, Failure>>,
    wall: Duration,
    before: &ServerMetrics,
    after: &ServerMetrics,
) -> LoadReport {
    let mut steps_us = crate::load_report::histogram();
    let mut executions_us = crate::load_report::histogram();
    let (mut completed, mut total_steps) = (0usize, 0u64);
    let (mut first_ms, mut last_ms) = (u64::MAX, 0u64);
    for result in followed {
        let Ok(execution) = result else {
            continue;
        };
        if execution.state.as_deref() == Some("completed") {
            completed += 1;
        }
        total_steps += execution.tool_results_ms.len() as u64;
        for pair in execution.tool_results_ms.windows(2) {
            steps_us.saturating_record(pair[1].saturating_sub(pair[0]) * 1000);
        }
        if execution.first_ms > 0 {
            executions_us
                .saturating_record(execution.last_ms.saturating_sub(execution.first_ms) * 1000);
            first_ms = first_ms.min(execution.first_ms);
            last_ms = last_ms.max(execution.last_ms);
        }
    }
    let span_s = (last_ms.saturating_sub(first_ms) as f64 / 1000.0).max(0.001);
    let counted = |value: f64| value.max(0.0).round() as u64;
    let committer_pct = |i: usize| {
        let (after, before) = (after.committer_s?, before.committer_s?);
        Some((after[i] - before[i]) / wall.as_secs_f64() * 100.0)
    };
    LoadReport {
        total_steps,
        completed,
        // Also those never admitted (a slot that could not start).
        failed: options.executions - completed,
        wall_s: wall.as_secs_f64(),
        steps_per_s: total_steps as f64 / span_s,
        executions_per_s: completed as f64 / span_s,
        fsyncs: counted(after.fsyncs - before.fsyncs),
        state_loads_parked: counted(after.loads_parked - before.loads_parked),
        state_loads_replayed: counted(after.loads_replayed - before.loads_replayed),
        peak_rss_mib: after.peak_resident_bytes / (1024.0 * 1024.0),
        cpu_us_per_step: (total_steps > 0 && after.cpu_s > 0.0)
            .then(|| (after.cpu_s - before.cpu_s) * 1e6 / total_steps as f64),
        committer_busy_pct: committer_pct(0),
        committer_flush_pct: committer_pct(1),
        committer_fsync_pct: committer_pct(2),
        ..LoadReport::measured(url, options, &steps_us, &executions_us)
    }
}
