//! Durable functions through the library (F-1, F-2, F-4, F-5, F-7): the built-in `steps`
//! with its `append` file as the oracle (every step's line exactly once), controls at step
//! boundaries, a restart in the middle, and an embedder's own function.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use openprogram::agent::Recovery;
use openprogram::storage::{Event, ExecutionId};
use openprogram::{DurableFunction, FunctionStart, Runtime, StepError};
use serde_json::json;

use crate::support::*;

/// The lines of the `append` file, as (step id, effect id).
fn lines(path: &std::path::Path) -> Vec<(String, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split_once('\t'))
        .map(|(step, effect)| (step.to_owned(), effect.to_owned()))
        .collect()
}

/// Every step `s1..sK` appended exactly once, in order.
fn assert_each_step_once(path: &std::path::Path, count: u32) {
    let steps: Vec<String> = lines(path).into_iter().map(|(step, _)| step).collect();
    let expected: Vec<String> = (1..=count).map(|index| format!("s{index}")).collect();
    assert_eq!(steps, expected, "the append file");
}

/// A runtime with only `steps` revision 1 registered (all three are by default).
fn steps_harness() -> Harness {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .builtin_function_revisions(revisions(&[1]))
        .open()
        .expect("open");
    Harness::with_runtime(runtime, dir)
}

fn revisions(steps: &[u32]) -> Vec<(String, u32)> {
    steps
        .iter()
        .map(|revision| ("steps".to_owned(), *revision))
        .collect()
}

async fn start_steps(harness: &Harness, input: serde_json::Value) -> ExecutionId {
    let started = harness
        .runtime
        .start_function(
            harness.session,
            FunctionStart {
                function: "steps".into(),
                input,
                ..Default::default()
            },
        )
        .await
        .expect("start steps");
    assert_eq!(started.function_revision, 1);
    started.started.execution_id
}

#[tokio::test]
async fn f1_steps_runs_each_step_once_commits_each_result_and_returns() {
    let harness = steps_harness();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("steps.log");
    let execution = start_steps(&harness, json!({"count": 3, "path": path})).await;
    let snapshot = harness.wait_for_state(execution, "completed").await;
    assert_each_step_once(&path, 3);
    assert_eq!(snapshot.kind, "function");
    assert_eq!(snapshot.text, r#"{"done":3}"#);
    let function = snapshot.function.expect("the function object");
    assert_eq!((function.name.as_str(), function.revision), ("steps", 1));
    assert_eq!(function.policy, "keep_original");
    assert_eq!(function.next_position, 3);
    let completed: Vec<(&str, &str)> = function
        .completed_steps
        .iter()
        .map(|step| (step.step_id.as_str(), step.status))
        .collect();
    assert_eq!(
        completed,
        vec![
            ("s1", "confirmed"),
            ("s2", "confirmed"),
            ("s3", "confirmed")
        ]
    );
    // E-4: each External step's intent is durable before its result, one effect each, and
    // the receipts are the lines' effect ids.
    let events = harness.events(execution);
    let started = count(&events, |event| matches!(event, Event::StepStarted { .. }));
    let finished = count(&events, |event| matches!(event, Event::StepFinished { .. }));
    assert_eq!((started, finished), (3, 3));
    let receipts: Vec<String> = snapshot
        .receipts
        .iter()
        .map(|receipt| receipt.effect_id.to_string())
        .collect();
    let appended: Vec<String> = lines(&path).into_iter().map(|(_, effect)| effect).collect();
    assert_eq!(receipts, appended);
}

#[tokio::test]
async fn f1_an_unknown_function_and_an_input_it_refuses_start_nothing() {
    let harness = steps_harness();
    let unknown = harness
        .runtime
        .start_function(
            harness.session,
            FunctionStart {
                function: "nope".into(),
                ..Default::default()
            },
        )
        .await
        .expect_err("an unknown function");
    assert_eq!(unknown.code(), "unknown_function");
    let invalid = harness
        .runtime
        .start_function(
            harness.session,
            FunctionStart {
                function: "steps".into(),
                input: json!({"count": "three"}),
                ..Default::default()
            },
        )
        .await
        .expect_err("an input `steps` refuses");
    assert_eq!(invalid.code(), "invalid_input");
    let executions = harness
        .runtime
        .executions(harness.session)
        .await
        .expect("executions");
    assert!(executions.is_empty(), "{executions:?}");
}

#[tokio::test]
async fn f5_pause_suspends_at_the_next_boundary_and_continue_reuses_committed_steps() {
    let harness = steps_harness();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("steps.log");
    let execution = start_steps(&harness, json!({"count": 4, "path": path, "sleep_ms": 150})).await;
    harness
        .wait_for_event(execution, "the first step started", |event| {
            matches!(event, Event::StepStarted { .. })
        })
        .await;
    let paused = harness.command(execution, "pause", None).await;
    assert_eq!(paused.status, "applied", "{paused:?}");
    let snapshot = harness.wait_for_state(execution, "paused").await;
    assert_eq!(snapshot.pause_reason.as_deref(), Some("pause"));
    // The step running when the Pause landed finished; no step started after it.
    let events = harness.events(execution);
    let started = count(&events, |event| matches!(event, Event::StepStarted { .. }));
    let finished = count(&events, |event| matches!(event, Event::StepFinished { .. }));
    assert_eq!(started, finished, "a step started after the pause");
    assert!(finished < 4, "the pause came after the last step");
    assert_eq!(lines(&path).len(), finished);
    assert_eq!(
        snapshot.capabilities,
        vec!["continue", "step", "cancel", "set_policy", "fork"]
    );
    // Step: one boundary, then paused again.
    let step = harness.command(execution, "step", None).await;
    assert_eq!(step.status, "applied", "{step:?}");
    let stepped = harness
        .wait_for(execution, "paused after one step", |snapshot| {
            snapshot.state == "paused" && snapshot.pause_reason.as_deref() == Some("step")
        })
        .await;
    let after_step = stepped.function.expect("function").next_position as usize;
    assert_eq!(after_step, finished + 1);
    assert_eq!(lines(&path).len(), after_step);
    let resumed = harness.command(execution, "continue", None).await;
    assert_eq!(resumed.status, "applied", "{resumed:?}");
    harness.wait_for_state(execution, "completed").await;
    assert_each_step_once(&path, 4);
}

#[tokio::test]
async fn f5_cancel_wins_over_a_running_step_and_steer_is_refused_with_its_reason() {
    let harness = steps_harness();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("steps.log");
    let execution = start_steps(
        &harness,
        json!({"count": 50, "path": path, "sleep_ms": 100}),
    )
    .await;
    harness
        .wait_for_event(execution, "a step started", |event| {
            matches!(event, Event::StepStarted { .. })
        })
        .await;
    let steer = harness.command(execution, "steer", Some("faster")).await;
    assert_eq!(steer.status, "rejected", "{steer:?}");
    assert_eq!(
        steer.code.as_deref(),
        Some("not_for_functions"),
        "{steer:?}"
    );
    let cancelled = harness.command(execution, "cancel", None).await;
    assert_eq!(cancelled.status, "applied", "{cancelled:?}");
    let snapshot = harness.wait_for_state(execution, "cancelled").await;
    // The step the cancel stopped is in doubt (External, aborted): unknown, never re-run.
    let appended = lines(&path);
    assert!(appended.len() < 50, "the cancel did not stop the function");
    let mut seen = std::collections::BTreeSet::new();
    for (step, _) in &appended {
        assert!(seen.insert(step.clone()), "{step} appended twice");
    }
    // Ended: only a new run is offered (K-2).
    assert_eq!(snapshot.capabilities, vec!["retry"]);
}

#[tokio::test]
async fn f4_a_restart_mid_function_continues_it_and_repeats_no_step() {
    let restarts = Restarts::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("steps.log");
    let runtime = open_steps(&restarts, &[1]);
    let started = runtime
        .start_function(
            restarts.session,
            FunctionStart {
                function: "steps".into(),
                input: json!({"count": 6, "path": path, "sleep_ms": 50}),
                ..Default::default()
            },
        )
        .await
        .expect("start");
    let execution = started.started.execution_id;
    let waited = std::time::Instant::now();
    while lines(&path).len() < 2 {
        assert!(waited.elapsed() < DEADLINE, "no step ran");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // An orderly shutdown: the function pauses at its next boundary under the restart
    // intent (R-7), and the next start continues it from its committed steps.
    let report = runtime.shutdown().await;
    assert_eq!((report.live, report.left_running), (1, 0), "{report:?}");
    drop(runtime);
    let before = lines(&path).len();
    assert!(before < 6, "the function finished before the shutdown");
    let runtime = open_steps(&restarts, &[1]);
    let recovered = runtime.recovery().await.expect("recovery");
    assert_eq!(recovered.resumed.len(), 1, "{recovered:?}");
    runtime
        .wait_finished(restarts.session, execution)
        .await
        .expect("finished after the restart");
    let snapshot = runtime
        .snapshot(restarts.session, execution)
        .await
        .expect("snapshot");
    assert_eq!(snapshot.state, "completed", "{snapshot:?}");
    assert_each_step_once(&path, 6);
    runtime.halt();
}

/// An embedder's function: an Idempotent step that counts its runs, and an External one.
fn counting(runs: Arc<AtomicU32>, identity: &str) -> DurableFunction {
    DurableFunction::new("counting", 1, identity, move |context, input| {
        let runs = Arc::clone(&runs);
        async move {
            let times: u32 = serde_json::from_value(input).map_err(|error| error.to_string())?;
            let mut total = 0;
            for index in 0..times {
                let runs = Arc::clone(&runs);
                let value: u32 = context
                    .step(
                        &format!("add{index}"),
                        Recovery::Idempotent,
                        |_| async move { Ok(runs.fetch_add(1, Ordering::SeqCst) + 1) },
                    )
                    .await
                    .map_err(|error: StepError| error.to_string())?;
                total += value;
            }
            Ok(json!({ "total": total }))
        }
    })
}

#[tokio::test]
async fn f1_an_embedders_function_runs_its_steps_through_the_runtime() {
    let runs = Arc::new(AtomicU32::new(0));
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .function(counting(Arc::clone(&runs), "counting:v1"))
        .open()
        .expect("open");
    let harness = Harness::with_runtime(runtime, dir);
    let started = harness
        .runtime
        .start_function(
            harness.session,
            FunctionStart {
                function: "counting".into(),
                input: json!(3),
                ..Default::default()
            },
        )
        .await
        .expect("start");
    let snapshot = harness
        .wait_for_state(started.started.execution_id, "completed")
        .await;
    assert_eq!(snapshot.text, r#"{"total":6}"#);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[test]
fn f7_other_code_under_a_registered_name_and_revision_is_refused_before_anything_runs() {
    let runs = Arc::new(AtomicU32::new(0));
    let dir = tempfile::tempdir().expect("tempdir");
    let refused = Runtime::builder()
        .data_dir(dir.path())
        .function(counting(Arc::clone(&runs), "counting:v1"))
        .function(counting(Arc::clone(&runs), "counting:v1-edited"))
        .open()
        .expect_err("two bodies under one revision");
    assert_eq!(refused.code(), "invalid_request");
    assert!(
        refused.to_string().contains("another identity"),
        "{refused}"
    );
    // The same code twice is one registration.
    let same = Runtime::builder()
        .data_dir(dir.path())
        .function(counting(Arc::clone(&runs), "counting:v1"))
        .function(counting(Arc::clone(&runs), "counting:v1"))
        .open()
        .expect("the same identity twice");
    same.halt();
    // A built-in's name and revision cannot be taken by other code either.
    let builtin = Runtime::builder()
        .data_dir(dir.path())
        .function(DurableFunction::new("steps", 1, "mine", |_, _| async {
            Ok(json!(null))
        }))
        .open()
        .expect_err("other code as steps revision 1");
    assert_eq!(builtin.code(), "invalid_request");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// F-4, R-8 with real processes: `openprogram serve` runs `steps` and is killed with
/// SIGKILL twice in a row, mid-function; each restart continues from the committed steps
/// (a step caught between its intent and its result is reconciled by the `append`
/// protocol, never run on a guess), and the file holds every step's line exactly once.
#[test]
fn f4_kill9_twice_mid_function_every_step_appended_exactly_once() {
    use crate::served::Served;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let path = dir.path().join("steps.log");
    const STEPS: u32 = 8;
    let served = Served::start(
        &data,
        "function-test-token",
        &[],
        &["--function-revisions", "steps:1"],
    );
    let (status, session) = served.call("POST", "/v1/sessions", Some(&json!({})));
    assert_eq!(status, 201, "{session}");
    let session = session["session_id"]
        .as_str()
        .expect("session id")
        .to_owned();
    let start = json!({
        "kind": "function",
        "function": "steps",
        "input": {"count": STEPS, "path": path, "sleep_ms": 30},
    });
    let executions = format!("/v1/sessions/{session}/executions");
    let (status, started) = served.call("POST", &executions, Some(&start));
    assert_eq!(status, 201, "{started}");
    assert_eq!(started["function_revision"], 1, "{started}");
    let execution = started["execution_id"]
        .as_str()
        .expect("execution id")
        .to_owned();
    let wait_lines = |at_least: usize| {
        let waited = std::time::Instant::now();
        while lines(&path).len() < at_least {
            assert!(waited.elapsed() < DEADLINE, "waited for {at_least} lines");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    };
    wait_lines(2);
    served.kill9();
    let served = Served::start(
        &data,
        "function-test-token",
        &[],
        &["--function-revisions", "steps:1"],
    );
    wait_lines(5);
    served.kill9();
    let served = Served::start(
        &data,
        "function-test-token",
        &[],
        &["--function-revisions", "steps:1"],
    );
    let waited = std::time::Instant::now();
    let snapshot = loop {
        let (status, snapshot) = served.call("GET", &format!("{executions}/{execution}"), None);
        assert_eq!(status, 200, "{snapshot}");
        if snapshot["state"] == "completed" {
            break snapshot;
        }
        assert!(waited.elapsed() < DEADLINE, "not completed: {snapshot}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert_each_step_once(&path, STEPS);
    assert_eq!(snapshot["function"]["next_position"], STEPS, "{snapshot}");
    assert_eq!(snapshot["kind"], "function", "{snapshot}");
    served.stop();
}

/// A runtime on the restarts' dir with exactly these revisions of `steps`.
fn open_steps(restarts: &Restarts, steps: &[u32]) -> Runtime {
    restarts.open_with(|builder| {
        builder
            .restart_window(openprogram::RestartWindow::Unlimited)
            .builtin_function_revisions(revisions(steps))
    })
}

/// Starts `steps` (6 steps, 50 ms each) on revision 1 with `policy`, and shuts the runtime
/// down once two steps ran: the function pauses under the restart intent, partly done.
async fn interrupted_steps(
    restarts: &Restarts,
    path: &std::path::Path,
    policy: openprogram::VersionPolicy,
) -> (ExecutionId, usize) {
    let runtime = open_steps(restarts, &[1]);
    let started = runtime
        .start_function(
            restarts.session,
            FunctionStart {
                function: "steps".into(),
                input: json!({"count": 6, "path": path, "sleep_ms": 50}),
                policy: Some(policy),
                ..Default::default()
            },
        )
        .await
        .expect("start");
    assert_eq!(started.function_revision, 1);
    let waited = std::time::Instant::now();
    while lines(path).len() < 2 {
        assert!(waited.elapsed() < DEADLINE, "no step ran");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let report = runtime.shutdown().await;
    assert_eq!(report.left_running, 0, "{report:?}");
    drop(runtime);
    let done = lines(path).len();
    assert!(done < 6, "the function finished before the shutdown");
    (started.started.execution_id, done)
}

async fn wait_function(
    runtime: &Runtime,
    restarts: &Restarts,
    execution: ExecutionId,
    what: &str,
    done: impl Fn(&openprogram::Snapshot) -> bool,
) -> openprogram::Snapshot {
    let waited = std::time::Instant::now();
    loop {
        let snapshot = runtime
            .snapshot(restarts.session, execution)
            .await
            .expect("snapshot");
        if done(&snapshot) {
            return snapshot;
        }
        assert!(
            waited.elapsed() < DEADLINE,
            "waited for {what}: {snapshot:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn f3_keep_original_continues_on_revision_1_across_a_restart_with_revisions_1_to_3() {
    let restarts = Restarts::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("steps.log");
    let (execution, _) =
        interrupted_steps(&restarts, &path, openprogram::VersionPolicy::KeepOriginal).await;
    // New code deployed: revisions 2 and 3 beside 1.
    let runtime = open_steps(&restarts, &[1, 2, 3]);
    let snapshot = wait_function(&runtime, &restarts, execution, "completed", |snapshot| {
        snapshot.state == "completed"
    })
    .await;
    assert_each_step_once(&path, 6);
    let function = snapshot.function.expect("function");
    assert_eq!((function.revision, function.policy), (1, "keep_original"));
    runtime.halt();
}

#[tokio::test]
async fn f3_use_latest_1_to_2_runs_summary_once_and_keeps_the_steps_of_revision_1() {
    let restarts = Restarts::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("steps.log");
    let (execution, done) =
        interrupted_steps(&restarts, &path, openprogram::VersionPolicy::UseLatest).await;
    let runtime = open_steps(&restarts, &[1, 2]);
    let snapshot = wait_function(&runtime, &restarts, execution, "completed", |snapshot| {
        snapshot.state == "completed"
    })
    .await;
    let appended: Vec<String> = lines(&path).into_iter().map(|(step, _)| step).collect();
    let mut expected: Vec<String> = (1..=6).map(|index| format!("s{index}")).collect();
    expected.push("summary".into());
    assert_eq!(appended, expected, "each step once, then the summary once");
    let function = snapshot.function.expect("function");
    assert_eq!((function.revision, function.policy), (2, "use_latest"));
    // The steps committed before the switch keep their provenance (F-3).
    let provenance: Vec<(String, u32)> = function
        .completed_steps
        .iter()
        .map(|step| (step.step_id.clone(), step.revision))
        .collect();
    for (index, (step, revision)) in provenance.iter().enumerate() {
        let expected = if index < done { 1 } else { 2 };
        assert_eq!(*revision, expected, "{step}: {provenance:?}");
    }
    // Adopted before any step of revision 2 ran (F-7).
    let events = runtime
        .events(restarts.session, execution, 0)
        .expect("events");
    let adopted = events
        .iter()
        .position(|envelope| matches!(envelope.event, Event::RevisionAdopted { revision: 2, .. }))
        .expect("the adoption");
    let last_of_revision_1 = events
        .iter()
        .filter(|envelope| matches!(envelope.event, Event::StepFinished { .. }))
        .nth(done - 1)
        .map(|envelope| envelope.seq)
        .expect("the last step of revision 1");
    assert!(events[adopted].seq > last_of_revision_1);
    let first_of_revision_2 = events
        .iter()
        .filter(|envelope| matches!(envelope.event, Event::StepStarted { .. }))
        .nth(done)
        .map(|envelope| envelope.seq)
        .expect("a step of revision 2");
    assert!(events[adopted].seq < first_of_revision_2);
    runtime.halt();
}

#[tokio::test]
async fn f3_use_latest_1_to_3_pauses_with_the_differences_and_runs_nothing() {
    let restarts = Restarts::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("steps.log");
    let (execution, done) =
        interrupted_steps(&restarts, &path, openprogram::VersionPolicy::UseLatest).await;
    let runtime = open_steps(&restarts, &[1, 3]);
    let snapshot = wait_function(&runtime, &restarts, execution, "version_conflict", |s| {
        s.pause_reason.as_deref() == Some("version_conflict")
    })
    .await;
    assert_eq!(snapshot.state, "paused");
    assert_eq!(lines(&path).len(), done, "nothing ran");
    let function = snapshot.function.expect("function");
    assert_eq!(function.revision, 1, "never switched");
    assert!(
        function.differences[0].contains("declares no step correspondence with revision 1"),
        "{:?}",
        function.differences
    );
    assert_eq!(
        function.differences.len(),
        done + 1,
        "{:?}",
        function.differences
    );
    assert!(function.differences[1].contains("step `s1` completed in revision 1"));
    // K-7: the operator keeps the original code; the policy change alone starts nothing.
    let command = |kind: &str, extra: serde_json::Value| {
        let mut body = json!({"command_id": openprogram::storage::CommandId::new(), "kind": kind});
        if let (Some(body), serde_json::Value::Object(extra)) = (body.as_object_mut(), extra) {
            body.extend(extra);
        }
        openprogram::Command::from_json(&body).expect("a command")
    };
    let stale = runtime
        .command(
            restarts.session,
            execution,
            command(
                "set_policy",
                json!({"policy": "keep_original", "expected_version": 1}),
            ),
        )
        .await
        .expect("set_policy");
    assert_eq!(
        (stale.status, stale.code.as_deref()),
        ("rejected", Some("version_conflict"))
    );
    let kept = runtime
        .command(
            restarts.session,
            execution,
            command("set_policy", json!({"policy": "keep_original"})),
        )
        .await
        .expect("set_policy");
    assert_eq!(kept.status, "applied", "{kept:?}");
    let after = runtime
        .snapshot(restarts.session, execution)
        .await
        .expect("snapshot");
    assert_eq!(after.state, "paused", "a policy change starts nothing");
    assert_eq!(after.function.expect("function").policy, "keep_original");
    let resumed = runtime
        .command(restarts.session, execution, command("continue", json!({})))
        .await
        .expect("continue");
    assert_eq!(resumed.status, "applied", "{resumed:?}");
    wait_function(&runtime, &restarts, execution, "completed", |snapshot| {
        snapshot.state == "completed"
    })
    .await;
    assert_each_step_once(&path, 6);
    runtime.halt();
}

#[tokio::test]
async fn f3_its_revision_unregistered_a_keep_original_execution_pauses_revision_missing() {
    let restarts = Restarts::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("steps.log");
    let (execution, done) =
        interrupted_steps(&restarts, &path, openprogram::VersionPolicy::KeepOriginal).await;
    let runtime = open_steps(&restarts, &[2, 3]);
    let snapshot = wait_function(&runtime, &restarts, execution, "revision_missing", |s| {
        s.pause_reason.as_deref() == Some("revision_missing")
    })
    .await;
    assert_eq!(snapshot.state, "paused");
    assert_eq!(lines(&path).len(), done, "no other code ran");
    assert_eq!(snapshot.function.expect("function").revision, 1);
    runtime.halt();
}

#[tokio::test]
async fn k7_set_policy_is_a_functions_command() {
    let harness = steps_harness();
    let agent = harness.start(vec![reply("hi")], None).await;
    harness.wait_for_state(agent, "completed").await;
    let body = json!({"command_id": openprogram::storage::CommandId::new(), "kind": "set_policy", "policy": "use_latest"});
    let refused = harness
        .runtime
        .command(
            harness.session,
            agent,
            openprogram::Command::from_json(&body).expect("command"),
        )
        .await
        .expect("set_policy");
    assert_eq!(refused.status, "rejected");
    assert_eq!(
        refused.code.as_deref(),
        Some("functions_only"),
        "{refused:?}"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("steps.log");
    let started = harness
        .runtime
        .start_function(
            harness.session,
            FunctionStart {
                function: "steps".into(),
                input: json!({"count": 2, "path": path}),
                start_paused: true,
                ..Default::default()
            },
        )
        .await
        .expect("start");
    let execution = started.started.execution_id;
    let snapshot = harness.snapshot(execution).await;
    assert!(
        snapshot.capabilities.contains(&"set_policy"),
        "{:?}",
        snapshot.capabilities
    );
    let bad = json!({"command_id": openprogram::storage::CommandId::new(), "kind": "set_policy", "policy": "newest"});
    let error = openprogram::Command::from_json(&bad).expect_err("not a policy");
    assert_eq!(error.code(), "invalid_request");
    let completed = harness.command(execution, "continue", None).await;
    assert_eq!(completed.status, "applied");
    let done = harness.wait_for_state(execution, "completed").await;
    assert!(
        !done.capabilities.contains(&"set_policy"),
        "{:?}",
        done.capabilities
    );
    assert_each_step_once(&path, 2);
}

/// F-1, W-1, W-2: `steps` with `ask_at` waits for an approval before that step; the answer
/// lets it run, every step once; a decline skips it and the function goes on.
#[tokio::test]
async fn f1_an_ask_boundary_waits_for_a_person_and_resumes_with_the_answer() {
    let harness = steps_harness();
    let dir = tempfile::tempdir().expect("tempdir");
    for (answer, expected) in [
        ("answer", vec!["s1", "s2", "s3"]),
        ("decline", vec!["s1", "s3"]),
    ] {
        let path = dir.path().join(format!("{answer}.log"));
        let execution = start_steps(&harness, json!({"count": 3, "path": path, "ask_at": 2})).await;
        let waiting = harness.wait_for_state(execution, "waiting").await;
        assert_eq!(lines(&path).len(), 1, "only s1 ran before the ask");
        let wait = &waiting.waits[0];
        assert_eq!(
            (wait.kind, wait.status, wait.prompt.as_str()),
            ("approval", "open", "Run step s2?")
        );
        assert!(
            waiting.capabilities.contains(&"answer"),
            "{:?}",
            waiting.capabilities
        );
        let mut body = json!({"command_id": openprogram::storage::CommandId::new(), "kind": answer, "wait_id": wait.wait_id});
        if answer == "answer" {
            body["answer"] = json!("yes");
        }
        let reply = harness
            .runtime
            .command(
                harness.session,
                execution,
                openprogram::Command::from_json(&body).expect("command"),
            )
            .await
            .expect("command");
        assert_eq!(reply.status, "applied", "{reply:?}");
        let done = harness.wait_for_state(execution, "completed").await;
        let appended: Vec<String> = lines(&path).into_iter().map(|(step, _)| step).collect();
        assert_eq!(appended, expected, "{answer}");
        assert_eq!(
            done.waits.len(),
            1,
            "one wait, resolved once: {:?}",
            done.waits
        );
    }
}

/// The lines of a `fanout` file, sorted (branches run at once), and its last line.
fn fanout_lines(path: &std::path::Path) -> (Vec<String>, Option<String>) {
    let appended: Vec<String> = lines(path).into_iter().map(|(line, _)| line).collect();
    let last = appended.last().cloned();
    let mut sorted = appended;
    sorted.sort();
    (sorted, last)
}

/// F-1, F-4, F-5: `fanout`'s named branches run at once, each its own step; a Pause lets
/// the running branch steps finish (nothing is left in doubt) and stops before `join`;
/// Continue runs `join` once, and no branch again.
#[tokio::test]
async fn f5_a_pause_while_parallel_branches_run_lets_them_finish_and_join_runs_once() {
    let harness = steps_harness_with(&[("fanout", 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("fanout.log");
    let started = harness
        .runtime
        .start_function(
            harness.session,
            FunctionStart {
                function: "fanout".into(),
                input: json!({"branches": ["a", "b", "c"], "path": path, "sleep_ms": 2000}),
                ..Default::default()
            },
        )
        .await
        .expect("start fanout");
    let execution = started.started.execution_id;
    harness
        .wait_for(execution, "three branch steps started", |_| {
            let events = harness.events(execution);
            count(&events, |event| matches!(event, Event::StepStarted { .. })) == 3
        })
        .await;
    let paused = harness.command(execution, "pause", None).await;
    assert_eq!(paused.status, "applied", "{paused:?}");
    let snapshot = harness.wait_for_state(execution, "paused").await;
    assert_eq!(snapshot.pause_reason.as_deref(), Some("pause"));
    let (appended, _) = fanout_lines(&path);
    assert_eq!(
        appended,
        vec!["a", "b", "c"],
        "every running branch finished"
    );
    let steps: Vec<&str> = snapshot
        .function
        .as_ref()
        .expect("function")
        .completed_steps
        .iter()
        .map(|step| step.step_id.as_str())
        .collect();
    let mut sorted = steps.clone();
    sorted.sort();
    assert_eq!(sorted, vec!["a/append", "b/append", "c/append"]);
    let resumed = harness.command(execution, "continue", None).await;
    assert_eq!(resumed.status, "applied", "{resumed:?}");
    let done = harness.wait_for_state(execution, "completed").await;
    let (appended, last) = fanout_lines(&path);
    assert_eq!(appended, vec!["a", "b", "c", "join"]);
    assert_eq!(last.as_deref(), Some("join"));
    assert_eq!(done.text, r#"{"branches":3}"#);
}

/// A runtime with exactly these built-in revisions.
fn steps_harness_with(builtins: &[(&str, u32)]) -> Harness {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .builtin_function_revisions(
            builtins
                .iter()
                .map(|(name, revision)| (name.to_string(), *revision))
                .collect(),
        )
        .open()
        .expect("open");
    Harness::with_runtime(runtime, dir)
}

/// F-4, R-8 with real processes: `serve` killed with SIGKILL twice while `fanout`'s three
/// branches are in flight at once; every step in doubt is reconciled (one after another)
/// by the `append` protocol, and each branch's line and `join` are in the file once.
#[test]
fn f4_kill9_twice_during_parallel_branches_every_line_exactly_once() {
    use crate::served::Served;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let path = dir.path().join("fanout.log");
    let token = "function-test-token";
    let served = Served::start(&data, token, &[], &[]);
    let (_, session) = served.call("POST", "/v1/sessions", Some(&json!({})));
    let session = session["session_id"]
        .as_str()
        .expect("session id")
        .to_owned();
    let executions = format!("/v1/sessions/{session}/executions");
    let names: Vec<String> = (0..6).map(|index| format!("b{index}")).collect();
    let start = json!({
        "kind": "function",
        "function": "fanout",
        "input": {"branches": names, "path": path, "sleep_ms": 150},
    });
    let (status, started) = served.call("POST", &executions, Some(&start));
    assert_eq!(status, 201, "{started}");
    let execution = started["execution_id"].as_str().expect("id").to_owned();
    let wait_lines = |at_least: usize| {
        let waited = std::time::Instant::now();
        while lines(&path).len() < at_least {
            assert!(waited.elapsed() < DEADLINE, "waited for {at_least} lines");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    };
    // Mid-flight: some branches appended, others not yet; then again once the restarted
    // run appended more (or finished).
    wait_lines(1);
    served.kill9();
    let served = Served::start(&data, token, &[], &[]);
    let before = lines(&path).len();
    let waited = std::time::Instant::now();
    while lines(&path).len() == before {
        let (_, snapshot) = served.call("GET", &format!("{executions}/{execution}"), None);
        if snapshot["state"] == "completed" {
            break;
        }
        assert!(
            waited.elapsed() < DEADLINE,
            "no progress after the restart: {snapshot}"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    served.kill9();
    let served = Served::start(&data, token, &[], &[]);
    let waited = std::time::Instant::now();
    let snapshot = loop {
        let (_, snapshot) = served.call("GET", &format!("{executions}/{execution}"), None);
        if snapshot["state"] == "completed" {
            break snapshot;
        }
        assert!(waited.elapsed() < DEADLINE, "not completed: {snapshot}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let (appended, last) = fanout_lines(&path);
    let mut expected = names.clone();
    expected.push("join".into());
    expected.sort();
    assert_eq!(appended, expected, "{snapshot}");
    assert_eq!(last.as_deref(), Some("join"));
    let (_, events) = served.call("GET", &format!("{executions}/{execution}/events"), None);
    let in_doubt = events
        .as_array()
        .map(|events| {
            let unknown = |event: &&serde_json::Value| {
                event["type"] == "step_finished" && event["status"] == "Unknown"
            };
            events.iter().filter(unknown).count()
        })
        .unwrap_or_default();
    eprintln!("f4 fanout: {in_doubt} steps in doubt after the kills, each reconciled");
    // The kill lands while branches run (within a millisecond of the first line): some
    // step was in doubt, so the reconciliation queue was exercised.
    assert!(
        in_doubt >= 1,
        "no step was in doubt: the kills missed the branches"
    );
    served.stop();
}

/// F-1, F-4: `nested` calls `steps` revision 1 as a nested workflow: its steps are the
/// parent's (`inner/s1..`), its result is its own record (`inner`), then `after` runs.
#[tokio::test]
async fn f4_a_nested_workflow_keeps_its_parents_identity_and_its_own_record() {
    let harness = steps_harness_with(&[("steps", 1), ("nested", 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("nested.log");
    let started = harness
        .runtime
        .start_function(
            harness.session,
            FunctionStart {
                function: "nested".into(),
                input: json!({"count": 3, "path": path}),
                ..Default::default()
            },
        )
        .await
        .expect("start nested");
    let snapshot = harness
        .wait_for_state(started.started.execution_id, "completed")
        .await;
    let appended: Vec<String> = lines(&path).into_iter().map(|(line, _)| line).collect();
    assert_eq!(appended, vec!["s1", "s2", "s3", "after"]);
    let steps: Vec<String> = snapshot
        .function
        .expect("function")
        .completed_steps
        .into_iter()
        .map(|step| step.step_id)
        .collect();
    assert_eq!(
        steps,
        vec!["inner/s1", "inner/s2", "inner/s3", "inner", "after"]
    );
    assert_eq!(snapshot.text, r#"{"inner":{"done":3}}"#);
}

/// F-3: a nested call of a revision that is not registered pauses `revision_missing`.
#[tokio::test]
async fn f3_a_nested_call_of_an_unregistered_revision_pauses_revision_missing() {
    let harness = steps_harness_with(&[("steps", 2), ("nested", 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("nested.log");
    let started = harness
        .runtime
        .start_function(
            harness.session,
            FunctionStart {
                function: "nested".into(),
                input: json!({"count": 2, "path": path}),
                ..Default::default()
            },
        )
        .await
        .expect("start nested");
    let snapshot = harness
        .wait_for(started.started.execution_id, "revision_missing", |s| {
            s.pause_reason.as_deref() == Some("revision_missing")
        })
        .await;
    assert_eq!(snapshot.state, "paused");
    assert!(lines(&path).is_empty(), "no other code ran");
}

/// F-4, R-8 with real processes: `serve` killed twice while `nested`'s inner steps run;
/// every line exactly once, `after` last.
#[test]
fn f4_kill9_twice_inside_a_nested_workflow_every_line_exactly_once() {
    use crate::served::Served;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let path = dir.path().join("nested.log");
    let token = "function-test-token";
    let served = Served::start(&data, token, &[], &[]);
    let (_, session) = served.call("POST", "/v1/sessions", Some(&json!({})));
    let session = session["session_id"]
        .as_str()
        .expect("session id")
        .to_owned();
    let executions = format!("/v1/sessions/{session}/executions");
    let start = json!({
        "kind": "function",
        "function": "nested",
        "input": {"count": 6, "path": path, "sleep_ms": 30},
    });
    let (status, started) = served.call("POST", &executions, Some(&start));
    assert_eq!(status, 201, "{started}");
    let execution = started["execution_id"].as_str().expect("id").to_owned();
    let wait_lines = |at_least: usize| {
        let waited = std::time::Instant::now();
        while lines(&path).len() < at_least {
            assert!(waited.elapsed() < DEADLINE, "waited for {at_least} lines");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    };
    wait_lines(2);
    served.kill9();
    let served = Served::start(&data, token, &[], &[]);
    wait_lines(4);
    served.kill9();
    let served = Served::start(&data, token, &[], &[]);
    let waited = std::time::Instant::now();
    loop {
        let (_, snapshot) = served.call("GET", &format!("{executions}/{execution}"), None);
        if snapshot["state"] == "completed" {
            break;
        }
        assert!(waited.elapsed() < DEADLINE, "not completed: {snapshot}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let appended: Vec<String> = lines(&path).into_iter().map(|(line, _)| line).collect();
    assert_eq!(appended, vec!["s1", "s2", "s3", "s4", "s5", "s6", "after"]);
    served.stop();
}

/// B-2: Activity counts function executions like others: a finished one is History, with
/// its call as the request, one that waits for a person Needs attention.
#[tokio::test]
async fn b2_activity_counts_function_executions() {
    let harness = steps_harness();
    let dir = tempfile::tempdir().expect("tempdir");
    let done = start_steps(
        &harness,
        json!({"count": 1, "path": dir.path().join("a.log")}),
    )
    .await;
    harness.wait_for_state(done, "completed").await;
    let asking = start_steps(
        &harness,
        json!({"count": 2, "path": dir.path().join("b.log"), "ask_at": 1}),
    )
    .await;
    harness.wait_for_state(asking, "waiting").await;
    let activity = harness.runtime.activity(harness.session).expect("activity");
    let rows = |section: &[openprogram::actors::activity::BranchRow]| -> Vec<ExecutionId> {
        section
            .iter()
            .flat_map(|row| row.details.iter().map(|detail| detail.execution_id))
            .collect()
    };
    assert_eq!(rows(&activity.history), vec![done], "{activity:?}");
    assert_eq!(
        rows(&activity.needs_attention),
        vec![asking],
        "{activity:?}"
    );
}

/// An embedder's function with one External step and no reconcile protocol.
fn charging() -> DurableFunction {
    DurableFunction::new("charge", 1, "charge:v1", |context, _input| async move {
        let charged: String = context
            .step("charge", Recovery::External, |_| async {
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                Ok("charged".to_owned())
            })
            .await
            .map_err(|error| error.to_string())?;
        Ok(json!({ "charge": charged }))
    })
}

/// R-8 for functions: a step in doubt after a crash, with no protocol to ask, waits for an
/// operator; a confirmed outcome must carry the step's result as JSON (the body reads it
/// back), and then the function goes on without running the step again.
#[tokio::test]
async fn r8_an_operator_reconciles_a_functions_step_with_its_result() {
    let restarts = Restarts::new();
    let open = || restarts.open_with(|builder| builder.function(charging()));
    let runtime = open();
    let started = runtime
        .start_function(
            restarts.session,
            FunctionStart {
                function: "charge".into(),
                ..Default::default()
            },
        )
        .await
        .expect("start");
    let execution = started.started.execution_id;
    restarts
        .wait_events(&runtime, execution, "the step's intent", 1, |event| {
            matches!(event, Event::StepStarted { .. })
        })
        .await;
    runtime.halt();
    drop(runtime);
    let runtime = open();
    let snapshot = wait_function(&runtime, &restarts, execution, "reconciliation", |s| {
        s.state == "reconciliation_required"
    })
    .await;
    assert!(
        snapshot.capabilities.contains(&"reconcile"),
        "{:?}",
        snapshot.capabilities
    );
    let reconcile = |text: &str| {
        let body = json!({"command_id": openprogram::storage::CommandId::new(),
            "kind": "reconcile", "outcome": "confirmed", "text": text});
        openprogram::Command::from_json(&body).expect("command")
    };
    let refused = runtime
        .command(restarts.session, execution, reconcile("charged"))
        .await
        .expect("reconcile");
    assert_eq!(
        (refused.status, refused.code.as_deref()),
        ("rejected", Some("invalid_input"))
    );
    let applied = runtime
        .command(restarts.session, execution, reconcile("\"charged\""))
        .await
        .expect("reconcile");
    assert_eq!(applied.status, "applied", "{applied:?}");
    let done = wait_function(&runtime, &restarts, execution, "completed", |s| {
        s.state == "completed"
    })
    .await;
    assert_eq!(done.text, r#"{"charge":"charged"}"#);
    let events = runtime
        .events(restarts.session, execution, 0)
        .expect("events");
    let started = count(&events, |event| matches!(event, Event::StepStarted { .. }));
    assert_eq!(started, 1, "the step never ran again");
    runtime.halt();
}

/// A branch of `parallel`, boxed so that branches of different shapes share a list.
type Branch = Box<
    dyn FnOnce(
            openprogram::FunctionContext,
        ) -> futures::future::BoxFuture<'static, Result<String, String>>
        + Send,
>;

/// W-3 with parallel branches: one branch asks while another's step still runs; that
/// step's result is recorded without moving the checkpoint past the wait's, so the answer
/// is still the current wait's and the function goes on.
#[tokio::test]
async fn w3_a_branch_asks_while_another_step_runs_and_the_answer_still_counts() {
    let function =
        DurableFunction::new("ask_beside", 1, "ask_beside:v1", |context, _| async move {
            let branches: Vec<(String, Branch)> = vec![
                (
                    "asks".to_owned(),
                    Box::new(|branch: openprogram::FunctionContext| {
                        Box::pin(async move {
                            // After the other branch's step started: it runs while this
                            // asks.
                            branch
                                .step("first", Recovery::Idempotent, |_| async {
                                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                                    Ok(())
                                })
                                .await
                                .map_err(|error| error.to_string())?;
                            let answer = branch
                                .ask("go", "Go on?")
                                .await
                                .map_err(|error| error.to_string())?;
                            Ok(answer.unwrap_or_default())
                        })
                    }),
                ),
                (
                    "works".to_owned(),
                    Box::new(|branch: openprogram::FunctionContext| {
                        Box::pin(async move {
                            branch
                                .step("work", Recovery::Idempotent, |_| async {
                                    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                                    Ok("worked".to_owned())
                                })
                                .await
                                .map_err(|error| error.to_string())
                        })
                    }),
                ),
            ];
            let results = context
                .parallel(
                    branches
                        .into_iter()
                        .map(|(name, branch)| (name, move |c| branch(c)))
                        .collect(),
                )
                .await
                .map_err(|error| error.to_string())?;
            let results: Result<Vec<String>, String> = results.into_iter().collect();
            Ok(json!(results?))
        });
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .function(function)
        .open()
        .expect("open");
    let harness = Harness::with_runtime(runtime, dir);
    let started = harness
        .runtime
        .start_function(
            harness.session,
            FunctionStart {
                function: "ask_beside".into(),
                ..Default::default()
            },
        )
        .await
        .expect("start");
    let execution = started.started.execution_id;
    harness.wait_for_state(execution, "waiting").await;
    // The other branch's step finishes while the execution waits.
    harness
        .wait_for_event(
            execution,
            "the other branch's step",
            |event| matches!(event, Event::StepFinished { step_id, .. } if step_id == "works/work"),
        )
        .await;
    let snapshot = harness.snapshot(execution).await;
    assert_eq!(snapshot.state, "waiting", "{snapshot:?}");
    let body = json!({"command_id": openprogram::storage::CommandId::new(), "kind": "answer",
        "wait_id": snapshot.waits[0].wait_id, "answer": "yes"});
    let reply = harness
        .runtime
        .command(
            harness.session,
            execution,
            openprogram::Command::from_json(&body).expect("command"),
        )
        .await
        .expect("answer");
    assert_eq!(reply.status, "applied", "{reply:?}");
    let done = harness.wait_for_state(execution, "completed").await;
    assert_eq!(done.text, r#"["yes","worked"]"#);
}

/// F-6: an agent's scripted `{"call": …}` runs the function as a child execution (kind
/// `function`, the agent as its parent, its own revision and checkpoints) and its result
/// becomes that tool call's receipt before the agent's next decision.
#[tokio::test]
async fn f6_an_agent_calls_a_function_and_gets_its_result_at_the_call() {
    let harness = steps_harness();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("called.log");
    let agent = harness
        .start(
            vec![
                json!({"call": "steps", "input": {"count": 3, "path": path}}),
                reply("called"),
            ],
            None,
        )
        .await;
    let done = harness.wait_for_state(agent, "completed").await;
    assert_eq!(done.text, "called");
    assert_each_step_once(&path, 3);
    let call = done
        .receipts
        .iter()
        .find(|receipt| receipt.tool == "call" && receipt.status == "confirmed")
        .expect("the call's receipt");
    let events = harness.events(agent);
    let output = events
        .iter()
        .find_map(|envelope| match &envelope.event {
            Event::ToolFinished {
                effect_id, output, ..
            } if *effect_id == call.effect_id => Some(output.clone()),
            _ => None,
        })
        .expect("the call's result");
    assert_eq!(output, r#"{"done":3}"#);
    let executions = harness
        .runtime
        .executions(harness.session)
        .await
        .expect("executions");
    let child = executions
        .iter()
        .find(|snapshot| snapshot.kind == "function")
        .expect("the child");
    assert_eq!(child.parent_execution_id, Some(agent));
    assert_eq!(child.state, "completed");
    assert_eq!(child.function.as_ref().map(|f| f.next_position), Some(3));
}

/// F-6 with real processes: `serve` killed with SIGKILL twice while the function an agent
/// called runs; the agent continues the same call, which finds the same child, and gets its
/// result at the call's position: every step once, one child.
#[test]
fn f6_kill9_twice_inside_an_agent_invoked_function_returns_to_its_call() {
    use crate::served::Served;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let path = dir.path().join("called.log");
    let token = "function-test-token";
    let revisions = ["--function-revisions", "steps:1"];
    let served = Served::start(&data, token, &[], &revisions);
    let (_, session) = served.call("POST", "/v1/sessions", Some(&json!({})));
    let session = session["session_id"]
        .as_str()
        .expect("session id")
        .to_owned();
    let executions = format!("/v1/sessions/{session}/executions");
    let start = json!({
        "message": "call steps",
        "script": [
            {"call": "steps", "input": {"count": 6, "path": path, "sleep_ms": 40}},
            {"reply": "called"}
        ],
    });
    let (status, started) = served.call("POST", &executions, Some(&start));
    assert_eq!(status, 201, "{started}");
    let agent = started["execution_id"].as_str().expect("id").to_owned();
    let wait_lines = |at_least: usize| {
        let waited = std::time::Instant::now();
        while lines(&path).len() < at_least {
            assert!(waited.elapsed() < DEADLINE, "waited for {at_least} lines");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    };
    wait_lines(2);
    served.kill9();
    let served = Served::start(&data, token, &[], &revisions);
    wait_lines(4);
    served.kill9();
    let served = Served::start(&data, token, &[], &revisions);
    let waited = std::time::Instant::now();
    let snapshot = loop {
        let (_, snapshot) = served.call("GET", &format!("{executions}/{agent}"), None);
        if snapshot["state"] == "completed" {
            break snapshot;
        }
        assert!(
            waited.elapsed() < DEADLINE,
            "the agent did not complete: {snapshot}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    assert_eq!(snapshot["text"], "called", "{snapshot}");
    assert_each_step_once(&path, 6);
    let (_, all) = served.call("GET", &executions, None);
    let children: Vec<&serde_json::Value> = all
        .as_array()
        .into_iter()
        .flatten()
        .filter(|execution| execution["kind"] == "function")
        .collect();
    assert_eq!(children.len(), 1, "one child: {all}");
    assert_eq!(children[0]["parent_execution_id"], agent.as_str());
    served.stop();
}

/// F-6, K-5: cancelling an agent while the function it called runs cancels that function's
/// execution too.
#[tokio::test]
async fn f6_cancelling_the_agent_cancels_the_function_it_called() {
    let harness = steps_harness();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("called.log");
    let agent = harness
        .start(
            vec![
                json!({"call": "steps", "input": {"count": 5, "path": path, "sleep_ms": 300}}),
                reply("called"),
            ],
            None,
        )
        .await;
    let waited = std::time::Instant::now();
    let child = loop {
        let executions = harness
            .runtime
            .executions(harness.session)
            .await
            .expect("list");
        if let Some(child) = executions
            .iter()
            .find(|snapshot| snapshot.kind == "function")
        {
            break child.execution_id;
        }
        assert!(waited.elapsed() < DEADLINE, "no child");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    harness
        .wait_for_event(child, "the child's first step", |event| {
            matches!(event, Event::StepStarted { .. })
        })
        .await;
    let cancelled = harness.command(agent, "cancel", None).await;
    assert_eq!(cancelled.status, "applied", "{cancelled:?}");
    harness.wait_for_state(agent, "cancelled").await;
    harness.wait_for_state(child, "cancelled").await;
    assert!(lines(&path).len() < 5, "the child ran to its end");
}

// F-7: identities from code, with `#[durable_function]` and `#[durable_helper]`.
#[openprogram::durable_helper]
fn double(x: u64) -> u64 {
    x * 2
}

#[openprogram::durable_helper]
fn triple(x: u64) -> u64 {
    x * 3
}

mod identity_a {
    use openprogram::FunctionContext;
    use serde_json::{json, Value};

    #[openprogram::durable_function(name = "ident", revision = 1, helpers(super::double))]
    pub async fn ident(_context: FunctionContext, _input: Value) -> Result<Value, String> {
        Ok(json!(super::double(2)))
    }
}

mod identity_same_code {
    use openprogram::FunctionContext;
    use serde_json::{json, Value};

    /// The same code as `identity_a`, written otherwise (a doc comment, other line
    /// breaks).
    #[openprogram::durable_function(name = "ident", revision = 1, helpers(super::double))]
    pub async fn ident(_context: FunctionContext, _input: Value) -> Result<Value, String> {
        Ok(json!(super::double(2)))
    }
}

mod identity_other_helper {
    use openprogram::FunctionContext;
    use serde_json::{json, Value};

    #[openprogram::durable_function(name = "ident", revision = 1, helpers(super::triple))]
    pub async fn ident(_context: FunctionContext, _input: Value) -> Result<Value, String> {
        Ok(json!(super::triple(2)))
    }
}

#[test]
fn f7_a_functions_identity_is_its_code_and_its_helpers_code() {
    let a = identity_a::ident_durable();
    let same = identity_same_code::ident_durable();
    let other = identity_other_helper::ident_durable();
    assert_eq!(
        a.identity, same.identity,
        "formatting and comments are not code"
    );
    assert_ne!(a.identity, other.identity, "another helper is other code");
    assert!(
        a.identity.contains('+'),
        "the helper's identity is part of it: {}",
        a.identity
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let refused = Runtime::builder()
        .data_dir(dir.path())
        .function(a.clone())
        .function(other)
        .open()
        .expect_err("other code under ident revision 1");
    assert_eq!(refused.code(), "invalid_request");
    let accepted = Runtime::builder()
        .data_dir(dir.path())
        .function(a)
        .function(same)
        .open()
        .expect("the same code twice");
    accepted.halt();
}

/// F-7: an execution started on a revision whose code has changed since (another identity
/// under the same name and revision) is never continued on that other code: it pauses
/// `revision_missing`.
#[tokio::test]
async fn f7_changed_code_under_the_same_revision_is_not_that_revision() {
    let restarts = Restarts::new();
    let runs = Arc::new(AtomicU32::new(0));
    let open = |identity: &str| {
        let function = counting(Arc::clone(&runs), identity);
        restarts.open_with(|builder| builder.function(function))
    };
    let runtime = open("counting:v1");
    let started = runtime
        .start_function(
            restarts.session,
            FunctionStart {
                function: "counting".into(),
                input: json!(2),
                start_paused: true,
                ..Default::default()
            },
        )
        .await
        .expect("start");
    let execution = started.started.execution_id;
    runtime.halt();
    drop(runtime);
    let runtime = open("counting:v1-edited");
    let body = json!({"command_id": openprogram::storage::CommandId::new(), "kind": "continue"});
    let reply = runtime
        .command(
            restarts.session,
            execution,
            openprogram::Command::from_json(&body).expect("command"),
        )
        .await
        .expect("continue");
    assert_eq!(reply.status, "applied", "{reply:?}");
    let snapshot = wait_function(&runtime, &restarts, execution, "revision_missing", |s| {
        s.pause_reason.as_deref() == Some("revision_missing")
    })
    .await;
    assert_eq!(snapshot.state, "paused");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the edited code never ran");
    runtime.halt();
}

/// K-7: a `policy` on Continue takes effect in the same transition: a version conflict is
/// resolved by continuing on the original code; an agent's Continue with a policy is refused.
#[tokio::test]
async fn k7_continue_with_a_policy_resolves_a_version_conflict_in_one_command() {
    let restarts = Restarts::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("steps.log");
    let (execution, _) =
        interrupted_steps(&restarts, &path, openprogram::VersionPolicy::UseLatest).await;
    let runtime = open_steps(&restarts, &[1, 3]);
    wait_function(&runtime, &restarts, execution, "version_conflict", |s| {
        s.pause_reason.as_deref() == Some("version_conflict")
    })
    .await;
    let body = json!({"command_id": openprogram::storage::CommandId::new(), "kind": "continue",
        "policy": "keep_original"});
    let continued = runtime
        .command(
            restarts.session,
            execution,
            openprogram::Command::from_json(&body).expect("command"),
        )
        .await
        .expect("continue");
    assert_eq!(continued.status, "applied", "{continued:?}");
    let done = wait_function(&runtime, &restarts, execution, "completed", |s| {
        s.state == "completed"
    })
    .await;
    let function = done.function.expect("function");
    assert_eq!((function.revision, function.policy), (1, "keep_original"));
    assert_each_step_once(&path, 6);
    let agent = restarts.start_paused(&runtime, vec![reply("hi")]).await;
    let body = json!({"command_id": openprogram::storage::CommandId::new(), "kind": "continue",
        "policy": "use_latest"});
    let refused = runtime
        .command(
            restarts.session,
            agent,
            openprogram::Command::from_json(&body).expect("command"),
        )
        .await
        .expect("continue");
    assert_eq!(
        (refused.status, refused.code.as_deref()),
        ("rejected", Some("functions_only"))
    );
    runtime.halt();
}

/// K-2 for functions: Fork from a completed step makes a paused child that reuses the
/// parent's committed steps up to that point (they are not run again) and runs the rest;
/// Retry makes a child that runs the function afresh.
#[tokio::test]
async fn k2_fork_from_a_completed_step_reuses_the_prefix_and_retry_runs_afresh() {
    let harness = steps_harness();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("steps.log");
    let parent = start_steps(&harness, json!({"count": 4, "path": path})).await;
    let done = harness.wait_for_state(parent, "completed").await;
    assert!(
        done.capabilities.contains(&"fork"),
        "{:?}",
        done.capabilities
    );
    assert!(
        done.capabilities.contains(&"retry"),
        "{:?}",
        done.capabilities
    );
    // The checkpoint after the second step.
    let events = harness.events(parent);
    let second = events
        .iter()
        .filter(|envelope| matches!(envelope.event, Event::StepFinished { .. }))
        .nth(1)
        .expect("the second step")
        .seq;
    let checkpoint = events
        .iter()
        .find(|envelope| {
            envelope.seq > second && matches!(envelope.event, Event::CheckpointPublished { .. })
        })
        .expect("its checkpoint")
        .seq;
    let body = json!({"command_id": openprogram::storage::CommandId::new(), "kind": "fork",
        "checkpoint": checkpoint});
    let forked = harness
        .runtime
        .command(
            harness.session,
            parent,
            openprogram::Command::from_json(&body).expect("fork"),
        )
        .await
        .expect("fork");
    assert_eq!(forked.status, "applied", "{forked:?}");
    let child = forked.execution_id.expect("the child");
    let paused = harness.snapshot(child).await;
    assert_eq!(
        (paused.state, paused.pause_reason.as_deref()),
        ("paused", Some("fork"))
    );
    assert_eq!(paused.function.as_ref().map(|f| f.next_position), Some(2));
    let resumed = harness.command(child, "continue", None).await;
    assert_eq!(resumed.status, "applied", "{resumed:?}");
    harness.wait_for_state(child, "completed").await;
    let appended: Vec<String> = lines(&path).into_iter().map(|(step, _)| step).collect();
    // The parent's four, then the child's s3 and s4: s1 and s2 reused, not run again.
    assert_eq!(appended, vec!["s1", "s2", "s3", "s4", "s3", "s4"]);
    let retried = harness.command(parent, "retry", None).await;
    assert_eq!(retried.status, "applied", "{retried:?}");
    let fresh = retried.execution_id.expect("the retry");
    harness.command(fresh, "continue", None).await;
    harness.wait_for_state(fresh, "completed").await;
    assert_eq!(lines(&path).len(), 10, "the retry ran all four afresh");
}

/// `shape` revision 1: a step `price` returning `{"cents": 500}`, then an approval, then its
/// result as the price.
fn shape_v1() -> DurableFunction {
    DurableFunction::new("shape", 1, "shape:v1", |context, _| async move {
        let price: serde_json::Value = context
            .step("price", Recovery::Idempotent, |_| async {
                Ok(json!({"cents": 500}))
            })
            .await
            .map_err(|error| error.to_string())?;
        context
            .ask("go", "Go on?")
            .await
            .map_err(|error| error.to_string())?;
        Ok(price)
    })
}

/// `shape` revision 2: reads `price` as `{"amount": …}`, with `price` ↔ `price` and a
/// declared conversion from revision 1's shape (or one that refuses, `convertible`).
fn shape_v2(convertible: bool) -> DurableFunction {
    DurableFunction::new("shape", 2, "shape:v2", |context, _| async move {
        let price: serde_json::Value = context
            .step("price", Recovery::Idempotent, |_| async {
                Ok(json!({"amount": 5}))
            })
            .await
            .map_err(|error| error.to_string())?;
        context
            .ask("go", "Go on?")
            .await
            .map_err(|error| error.to_string())?;
        Ok(json!({"revision": 2, "price": price}))
    })
    .corresponds(1, |step| Some(step.to_owned()))
    .converts(1, move |step, result| {
        if !convertible {
            return Err(format!("{step}: cents have no amount here"));
        }
        let cents = serde_json::from_str::<serde_json::Value>(result)
            .map_err(|error| error.to_string())?["cents"]
            .as_u64()
            .ok_or("no cents")?;
        Ok(json!({"amount": cents / 100}).to_string())
    })
}

/// F-3: `use_latest` moves to a revision whose results' shape changed only through its
/// declared conversion: the new code reads the converted result (the committed one stays as
/// it was); a result that does not convert is a difference, and the execution pauses.
#[tokio::test]
async fn f3_use_latest_converts_committed_results_or_pauses_on_what_does_not_convert() {
    for convertible in [true, false] {
        let restarts = Restarts::new();
        let runtime = restarts.open_with(|builder| builder.function(shape_v1()));
        let started = runtime
            .start_function(
                restarts.session,
                FunctionStart {
                    function: "shape".into(),
                    policy: Some(openprogram::VersionPolicy::UseLatest),
                    ..Default::default()
                },
            )
            .await
            .expect("start");
        let execution = started.started.execution_id;
        let waiting = wait_function(&runtime, &restarts, execution, "waiting", |s| {
            s.state == "waiting"
        })
        .await;
        runtime.halt();
        drop(runtime);
        let runtime = restarts
            .open_with(|builder| builder.function(shape_v1()).function(shape_v2(convertible)));
        let body = json!({"command_id": openprogram::storage::CommandId::new(), "kind": "answer",
            "wait_id": waiting.waits[0].wait_id, "answer": "yes"});
        let reply = runtime
            .command(
                restarts.session,
                execution,
                openprogram::Command::from_json(&body).expect("answer"),
            )
            .await
            .expect("answer");
        assert_eq!(reply.status, "applied", "{reply:?}");
        if convertible {
            // The wait of revision 1 was answered before the switch; revision 2's `go`
            // is another run's ask of the same id: read back.
            let done = wait_function(&runtime, &restarts, execution, "completed", |s| {
                s.state == "completed"
            })
            .await;
            assert_eq!(done.text, r#"{"price":{"amount":5},"revision":2}"#);
            let function = done.function.expect("function");
            assert_eq!(function.revision, 2);
            assert_eq!(function.completed_steps[0].revision, 1, "provenance kept");
        } else {
            let paused = wait_function(&runtime, &restarts, execution, "version_conflict", |s| {
                s.pause_reason.as_deref() == Some("version_conflict")
            })
            .await;
            let differences = paused.function.expect("function").differences;
            assert!(
                differences[0].contains("does not convert to revision 2"),
                "{differences:?}"
            );
        }
        runtime.halt();
    }
}

/// K-2 with F-6: no fork of an agent starts at its call of a function (that would run the
/// function's effects again under a new child); a fork after it reuses the call's result.
#[tokio::test]
async fn k2_a_fork_of_an_agent_never_runs_a_called_function_again() {
    let harness = steps_harness();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("called.log");
    let agent = harness
        .start(
            vec![
                json!({"call": "steps", "input": {"count": 2, "path": path}}),
                echo("after"),
                reply("called"),
            ],
            None,
        )
        .await;
    harness.wait_for_state(agent, "completed").await;
    let events = harness.events(agent);
    let decided_call = events
        .iter()
        .find(|envelope| matches!(envelope.event, Event::ModelDecided { .. }))
        .expect("the call's decision")
        .seq;
    let at_call = events
        .iter()
        .find(|envelope| {
            envelope.seq > decided_call
                && matches!(envelope.event, Event::CheckpointPublished { .. })
        })
        .expect("the checkpoint naming the call")
        .seq;
    let fork = |checkpoint: Option<u64>| {
        let mut body =
            json!({"command_id": openprogram::storage::CommandId::new(), "kind": "fork"});
        if let Some(checkpoint) = checkpoint {
            body["checkpoint"] = json!(checkpoint);
        }
        openprogram::Command::from_json(&body).expect("fork")
    };
    let refused = harness
        .runtime
        .command(harness.session, agent, fork(Some(at_call)))
        .await
        .expect("fork");
    assert_eq!(
        refused.code.as_deref(),
        Some("not_a_fork_point"),
        "{refused:?}"
    );
    let forked = harness
        .runtime
        .command(harness.session, agent, fork(None))
        .await
        .expect("fork");
    let child = forked.execution_id.expect("a child");
    harness.command(child, "continue", None).await;
    harness.wait_for_state(child, "completed").await;
    assert_each_step_once(&path, 2);
    let functions = harness
        .runtime
        .executions(harness.session)
        .await
        .expect("list")
        .into_iter()
        .filter(|snapshot| snapshot.kind == "function")
        .count();
    assert_eq!(functions, 1, "one called function, never a second");
}
