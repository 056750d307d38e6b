//! Restart recovery with real processes (R02, R11, R-7): `openprogram serve` runs the
//! executions on the store and is killed with SIGKILL at random moments, or stopped with
//! SIGTERM. The oracle is a sink file outside the data dir, written by the built-in `append`
//! (one fsynced `LINE<TAB>EFFECT_ID` per delivery).
//!
//! `OP_KILL_SEED` replays a run; `OP_KILL_CYCLES` sets the number of kills (20 by default;
//! the soak runs 1,000, see README).

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use openprogram::storage::{Event, EventReader, ExecutionState, Store};
use openprogram::{RestartWindow, StartReply};
use serde_json::json;

use crate::support::*;
pub(crate) use openprogram::soak::oracle::sink_lines;

pub(crate) fn serve(data: &Path, stderr: Stdio) -> Child {
    Command::new(env!("CARGO_BIN_EXE_openprogram"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(data)
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn openprogram serve")
}

pub(crate) fn kill9(mut child: Child) {
    child.kill().expect("SIGKILL"); // by pid: the child this test started
    child.wait().expect("reap");
}

fn sigterm(child: &Child) {
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(status.success());
}

/// I1: no effect delivered twice; no line written twice.
pub(crate) fn assert_no_duplicate(sink: &Path, when: &str) {
    let lines = sink_lines(sink);
    let mut effects = HashSet::new();
    let mut whats = HashSet::new();
    for (what, effect) in &lines {
        assert!(
            effects.insert(effect),
            "{when}: effect {effect} delivered twice"
        );
        assert!(whats.insert(what), "{when}: {what} delivered twice");
    }
}

/// Admits `executions` turns of `steps` appends each, each in a session of its own, on a runtime whose provider never
/// answers, and crashes it: every execution is abandoned with a model request in flight.
pub(crate) async fn abandoned_appends(
    restarts: &Restarts,
    sink: &Path,
    executions: usize,
    steps: usize,
    mut pause: impl FnMut() -> Option<serde_json::Value>,
    extra: impl Fn(usize) -> Vec<serde_json::Value>,
) -> Vec<StartReply> {
    // The append protocol reads the file; a missing one proves nothing, so it exists.
    std::fs::write(sink, "").expect("sink");
    let runtime = restarts.open_freezing(0, RestartWindow::Unlimited);
    let mut started = Vec::new();
    for execution in 0..executions {
        let mut script = Vec::new();
        for step in 0..steps {
            script.push(json!({"tool": "append", "args": {"path": sink, "line": format!("e{execution}-s{step}")}}));
            script.extend(pause());
        }
        script.extend(extra(execution));
        script.push(reply(&format!("done {execution}")));
        let request = openprogram::StartRequest {
            message: "test".into(),
            max_iterations: Some(script.len() as u32),
            script: elements(script),
            ..Default::default()
        };
        // Each in a session of its own, to run side by side (C-2).
        let session = openprogram::storage::SessionId::new();
        let admitted = runtime
            .start_execution(session, request)
            .await
            .expect("start");
        restarts.apart.admitted(admitted.execution_id, session);
        started.push(admitted);
    }
    crash(runtime);
    started
}

/// After quiescence: every execution completed with its original ids (I7, L1), every step
/// delivered exactly once (I1, I8), at most one dispatch per effect and epoch (I4).
pub(crate) async fn assert_all_completed_exactly_once(
    restarts: &Restarts,
    sink: &Path,
    started: &[StartReply],
    steps: usize,
) -> usize {
    let runtime = restarts.open(RestartWindow::Unlimited);
    runtime.recovery().await.expect("recovery");
    // What is left of a soak's work may take longer than a test's usual deadline: each step
    // sleeps up to 250 ms.
    let deadline =
        tokio::time::Instant::now() + DEADLINE.max(Duration::from_millis(300) * steps as u32);
    let mut reconciled = 0;
    for (index, execution) in started.iter().enumerate() {
        let id = execution.execution_id;
        let finished =
            tokio::time::timeout_at(deadline, runtime.wait_finished(restarts.session_of(id), id))
                .await;
        let snapshot = restarts.snapshot(&runtime, id).await;
        assert!(
            matches!(finished, Ok(Ok(()))),
            "not finished: {snapshot:#?}"
        );
        assert_eq!(snapshot.state, "completed", "{snapshot:#?}");
        assert_eq!(snapshot.text, format!("done {index}"));
        assert_eq!(snapshot.turn_id, execution.turn_id);
        assert_eq!(snapshot.reply_message_id, execution.reply_message_id);
        assert_eq!(snapshot.user_message_id, execution.user_message_id);
        let events = restarts.events(&runtime, id);
        let mut dispatches = HashMap::new();
        for envelope in &events {
            if let Event::ToolDispatched { effect_id, .. } = envelope.event {
                *dispatches
                    .entry((effect_id, envelope.writer_epoch))
                    .or_insert(0) += 1;
            }
        }
        assert!(dispatches.values().all(|n| *n == 1), "I4: {dispatches:?}");
        reconciled += count(&events, |e| {
            matches!(
                e,
                Event::ControlApplied {
                    control: openprogram::storage::Control::Reconcile { .. },
                    ..
                }
            )
        });
    }
    runtime.halt();
    drop(runtime);
    assert_no_duplicate(sink, "after quiescence");
    let lines = sink_lines(sink);
    assert_eq!(
        lines.len(),
        started.len() * steps,
        "every step delivered once"
    );
    reconciled
}

/// The environment variable `name` parsed, else `default` (a test's size or seed).
pub(crate) fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// I1, I8, L1 of a kill loop's report: every effect delivered once, every execution ended.
fn assert_every_effect_once(report: &openprogram::soak::kill_loop::KillLoopReport) {
    assert_eq!(report.tally.duplicates, 0, "I1: {report:#?}");
    assert_eq!(report.tally.lost, 0, "I8: {report:#?}");
    assert_eq!(
        report.tally.deliveries,
        report.executions * report.steps,
        "{report:#?}"
    );
    assert_eq!(report.unfinished, 0, "L1: {report:#?}");
}

/// R02: 50 executions appending to the sink; `openprogram serve` is killed with SIGKILL at
/// random moments (50–500 ms) and started again; then it runs to quiescence. The harness is
/// the one `openprogram soak` runs with 1,000 kills (`openprogram::soak::kill_loop`).
#[test]
fn r02_kill9_loop_delivers_every_effect_exactly_once_with_the_original_ids() {
    r02_on(None);
}

/// The R02 loop on the sled store (`None`) or on a PostgreSQL database (N-1: `postgres.rs`).
pub(crate) fn r02_on(store: Option<String>) {
    let seed = env_or("OP_KILL_SEED", rand::random::<u64>());
    let cycles: usize = env_or("OP_KILL_CYCLES", 20);
    eprintln!("r02: OP_KILL_SEED={seed} OP_KILL_CYCLES={cycles}");
    let mut options = openprogram::soak::SoakOptions::new(
        env!("CARGO_BIN_EXE_openprogram").into(),
        seed,
        cycles,
        0,
        0,
    )
    .r02
    .expect("R02 runs");
    options.store = store;
    let report = openprogram::soak::kill_loop::run(&options, |_| {}).expect("the harness");
    eprintln!("r02: {}", serde_json::to_string(&report).expect("json"));
    assert_every_effect_once(&report);
    assert_eq!(report.quarantined, 0, "{report:#?}");
    assert!(report.violations.is_empty(), "I3, I4, I7: {report:#?}");
    // Startup recovery ran to its end after kills (the last server's always can; the others
    // may be killed during it); that the kills landed on work in progress is in the report's
    // `reconciled`.
    assert!(report.recoveries > 0, "{report:#?}");
}

/// R24, small: many executions in flight under a crash loop — `openprogram soak`'s R24 harness
/// (10,000 executions, 20 kills) at 1,000 executions and 4 kills, each server killed 1.5–3 s
/// after it started, so kills land during recoveries and on work in progress. Nothing
/// delivered twice or lost, every execution completes; recovery time and RSS are reported.
/// `OP_R24_EXECUTIONS`, `OP_KILL_SEED` size and replay it.
#[test]
fn r24_many_executions_under_a_crash_loop_lose_and_repeat_nothing() {
    let seed = env_or("OP_KILL_SEED", rand::random::<u64>());
    let executions = env_or("OP_R24_EXECUTIONS", 1000);
    eprintln!("r24: OP_KILL_SEED={seed} OP_R24_EXECUTIONS={executions}");
    let binary = env!("CARGO_BIN_EXE_openprogram").into();
    let soak = openprogram::soak::SoakOptions::new(binary, seed, 0, 0, executions);
    let mut options = soak.r24.expect("R24 runs");
    options.cycles = 4;
    options.kill_after_ms = (1_500, 3_000);
    options.sleep_ms = (50, 400);
    let report = openprogram::soak::kill_loop::run(&options, |_| {}).expect("the harness");
    eprintln!("r24: {}", serde_json::to_string(&report).expect("json"));
    assert_every_effect_once(&report);
    assert!(report.clean(), "{report:#?}");
    assert!(
        report.recoveries > 0 && report.peak_rss_mib > 0.0,
        "{report:#?}"
    );
}

/// R11: startups crash in the middle of their recovery (killed a few ms after the
/// store is open, the supervisor claiming behind it; the delay grows by a quarter until a
/// kill lands inside a recovery, twice); then a startup runs to the end. A crashed recovery dispatched nothing
/// (the sink is unchanged: claims come before any step), no effect is delivered twice, and
/// every execution completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r11_repeated_startup_with_crashes_during_recovery_dispatches_nothing_twice() {
    const EXECUTIONS: usize = 200;
    let restarts = Restarts::new();
    let sink_dir = tempfile::tempdir().expect("sink dir");
    let sink = sink_dir.path().join("sink");
    let started = abandoned_appends(&restarts, &sink, EXECUTIONS, 1, || None, |_| Vec::new()).await;
    // (executions left to recover, claimed by the crashed startup, delay)
    let mut crashes = Vec::new();
    let mut delay_ms = 2;
    let mut claims_so_far = 0;
    while crashes
        .iter()
        .filter(|c: &&(usize, usize, u64)| c.1 > 0 && c.1 < c.0)
        .count()
        < 2
    {
        assert!(
            delay_ms <= 2_000,
            "no kill landed inside a recovery: {crashes:?}"
        );
        let (left, claims_before) = {
            let store = Store::open(restarts.dir.path()).expect("store");
            claims(&store, &started)
        };
        assert!(
            left > 0,
            "a startup ran its recovery to the end before two kills landed inside one: {crashes:?}"
        );
        assert_eq!(claims_before, claims_so_far);
        let delivered_before = sink_lines(&sink);
        let mut child = serve(restarts.dir.path(), Stdio::piped());
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        // The first line comes once the runtime is open, recovery running behind it.
        let first = lines.next().expect("a line").expect("utf-8");
        assert!(first.contains("runtime on"), "{first}");
        std::thread::sleep(Duration::from_millis(delay_ms));
        kill9(child);
        assert_no_duplicate(&sink, "after a crash during recovery");
        let store = Store::open(restarts.dir.path()).expect("store");
        let (_, claims_after) = claims(&store, &started);
        let claimed = claims_after - claims_so_far;
        claims_so_far = claims_after;
        if claimed > 0 && claimed < left {
            assert_eq!(
                sink_lines(&sink),
                delivered_before,
                "a recovery that did not finish dispatched something"
            );
        }
        let inside = claimed > 0 && claimed < left;
        crashes.push((left, claimed, delay_ms));
        // Small steps, so the delay cannot jump over a recovery of a few tens of ms (one that
        // runs to the end leaves no abandoned execution to crash in); a delay that landed
        // inside one is kept for the second.
        if !inside {
            delay_ms += (delay_ms / 4).max(1);
        }
    }
    let reconciled = assert_all_completed_exactly_once(&restarts, &sink, &started, 1).await;
    eprintln!("r11: crashed startups (left to recover, claimed, kill after ms) {crashes:?}, {reconciled} reconciled");
}

/// (executions a startup resumes, recovery claims recorded so far) of `started`. An
/// execution awaiting reconciliation is not resumed: recovery hands it to its protocol.
fn claims(store: &Store, started: &[StartReply]) -> (usize, usize) {
    let mut left = 0;
    let mut claims = 0;
    for execution in started {
        let head = store
            .head(execution.execution_id)
            .expect("head")
            .expect("exists");
        left += usize::from(
            !head.state.is_terminal() && head.state != ExecutionState::ReconciliationRequired,
        );
        claims += store
            .events_after(execution.execution_id, 0, usize::MAX)
            .expect("events")
            .iter()
            .filter(|e| matches!(e.event, Event::Resumed { .. }))
            .count();
    }
    (left, claims)
}

/// SIGTERM with executions in flight pauses them under a restart intent; the next start
/// resumes them with their ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r7_sigterm_with_executions_in_flight_resumes_them_on_the_next_start() {
    const EXECUTIONS: usize = 5;
    let restarts = Restarts::new();
    let sink_dir = tempfile::tempdir().expect("sink dir");
    let sink = sink_dir.path().join("sink");
    let started = abandoned_appends(
        &restarts,
        &sink,
        EXECUTIONS,
        1,
        || None,
        |_| vec![sleep(300), sleep(300), sleep(300)],
    )
    .await;
    let mut child = serve(restarts.dir.path(), Stdio::piped());
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let deadline = Instant::now() + DEADLINE;
    loop {
        let line = lines.next().expect("a line").expect("utf-8");
        if line.contains("startup recovery") {
            assert!(line.contains(&format!("{EXECUTIONS} resumed")), "{line}");
            break;
        }
        assert!(Instant::now() < deadline);
    }
    // The appends land, then the executions sleep: stop them mid-sleep.
    while sink_lines(&sink).len() < EXECUTIONS {
        assert!(Instant::now() < deadline, "the appends never landed");
        std::thread::sleep(Duration::from_millis(10));
    }
    sigterm(&child);
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    let status = child.wait().expect("wait");
    assert!(status.success(), "{status:?}: {rest:?}");
    assert!(
        rest.iter().any(|line| line.contains("0 left running")),
        "{rest:?}"
    );
    {
        let store = Store::open(restarts.dir.path()).expect("store");
        for execution in &started {
            let head = store
                .head(execution.execution_id)
                .expect("head")
                .expect("exists");
            assert_eq!(head.state, ExecutionState::Paused, "{head:?}");
            assert_eq!(head.pause_reason.as_deref(), Some("restart_recovery"));
            assert!(head.restart_intent.is_some());
        }
    }
    assert_all_completed_exactly_once(&restarts, &sink, &started, 1).await;
}
