//! Durable functions through the library (F-1, F-2, F-4, F-5, F-7): the built-in `steps`
//! with its `append` file as the oracle (every step's line exactly once), controls at step
//! boundaries, a restart in the middle, and an embedder's own function.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use openprogram::agent::Recovery;
use openprogram::storage::{Event, ExecutionId, ReceiptStatus};
use openprogram::{DurableFunction, FunctionStart, Runtime, StepError};
use serde_json::json;

use crate::support::*;

/// The lines of the `append` file, as (step id, effect id).
pub(crate) fn lines(path: &std::path::Path) -> Vec<(String, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split_once('\t'))
        .map(|(step, effect)| (step.to_owned(), effect.to_owned()))
        .collect()
}

/// Every step `s1..sK` appended exactly once, in order.
pub(crate) fn assert_each_step_once(path: &std::path::Path, count: u32) {
    let steps: Vec<String> = lines(path).into_iter().map(|(step, _)| step).collect();
    let expected: Vec<String> = (1..=count).map(|index| format!("s{index}")).collect();
    assert_eq!(steps, expected, "the append file");
}

/// A runtime with only `steps` revision 1 registered (all three are by default).
pub(crate) fn steps_harness() -> Harness {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .builtin_function_revisions(revisions(&[1]))
        .open()
        .expect("open");
    Harness::with_runtime(runtime, dir)
}

pub(crate) fn revisions(steps: &[u32]) -> Vec<(String, u32)> {
    steps
        .iter()
        .map(|revision| ("steps".to_owned(), *revision))
        .collect()
}

pub(crate) async fn start_steps(harness: &Harness, input: serde_json::Value) -> ExecutionId {
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
pub(crate) fn counting(runs: Arc<AtomicU32>, identity: &str) -> DurableFunction {
    DurableFunction::with_identity("counting", 1, identity, move |context, input| {
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
    let counting = counting(Arc::clone(&runs), "counting:v1");
    let (harness, execution) = started_function(counting, json!(3)).await;
    let snapshot = harness.wait_for_state(execution, "completed").await;
    assert_eq!(snapshot.text, r#"{"total":6}"#);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

/// A runtime on a new store with `function` registered, and an execution of it started
/// with `input` (its newest revision).
async fn started_function(
    function: DurableFunction,
    input: serde_json::Value,
) -> (Harness, ExecutionId) {
    let name = function.name.clone();
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .function(function)
        .open()
        .expect("open");
    let harness = Harness::with_runtime(runtime, dir);
    let start = FunctionStart {
        function: name,
        input,
        ..Default::default()
    };
    let started = harness.runtime.start_function(harness.session, start);
    let execution = started.await.expect("start").started.execution_id;
    (harness, execution)
}

/// A runtime on the restarts' dir with exactly these revisions of `steps`.
pub(crate) fn open_steps(restarts: &Restarts, steps: &[u32]) -> Runtime {
    restarts.open_with(|builder| {
        builder
            .restart_window(openprogram::RestartWindow::Unlimited)
            .builtin_function_revisions(revisions(steps))
    })
}

/// Starts `steps` (6 steps, 50 ms each) on revision 1 with `policy`, and shuts the runtime
/// down once two steps ran: the function pauses under the restart intent, partly done.
pub(crate) async fn interrupted_steps(
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

pub(crate) async fn wait_function(
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
        let reply = harness.send(execution, body).await;
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
pub(crate) fn fanout_lines(path: &std::path::Path) -> (Vec<String>, Option<String>) {
    let appended: Vec<String> = lines(path).into_iter().map(|(line, _)| line).collect();
    let last = appended.last().cloned();
    let mut sorted = appended;
    sorted.sort();
    (sorted, last)
}

/// A runtime with exactly these built-in revisions.
pub(crate) fn steps_harness_with(builtins: &[(&str, u32)]) -> Harness {
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
    let forked = harness.send(parent, body).await;
    assert_eq!(forked.status, "applied", "{forked:?}");
    let child = forked.execution_id.expect("the child");
    // K-2: a function's child follows its scheduler: it runs with no person's Continue.
    let done = harness.wait_for_state(child, "completed").await;
    assert_eq!(done.function.as_ref().map(|f| f.next_position), Some(4));
    let appended: Vec<String> = lines(&path).into_iter().map(|(step, _)| step).collect();
    // The parent's four, then the child's s3 and s4: s1 and s2 reused, not run again.
    assert_eq!(appended, vec!["s1", "s2", "s3", "s4", "s3", "s4"]);
    let retried = harness.command(parent, "retry", None).await;
    assert_eq!(retried.status, "applied", "{retried:?}");
    let fresh = retried.execution_id.expect("the retry");
    harness.wait_for_state(fresh, "completed").await;
    assert_eq!(lines(&path).len(), 10, "the retry ran all four afresh");
}

/// F-5: only a step that never started is `not_started`: a cancel that stops an External
/// step while its code runs leaves it `unknown` (it may have taken effect), and the
/// execution `cancelled`. (The machine's tests cover the step that never started: here
/// the body calls a step's code in the same poll that learns it may run.)
#[tokio::test]
async fn f5_a_step_cancelled_while_it_runs_is_unknown_not_not_started() {
    let running = Arc::new(tokio::sync::Notify::new());
    let told = Arc::clone(&running);
    let stuck = DurableFunction::with_identity("stuck", 1, "stuck:v1", move |context, _input| {
        let told = Arc::clone(&told);
        async move {
            let step = |_| async move {
                told.notify_one();
                futures::future::pending::<Result<bool, String>>().await
            };
            context
                .step("s", Recovery::External, step)
                .await
                .map_err(|error: StepError| error.to_string())?;
            Ok(json!("done"))
        }
    });
    let (harness, execution) = started_function(stuck, json!(null)).await;
    tokio::time::timeout(DEADLINE, running.notified())
        .await
        .expect("the step's code runs");
    let cancelled = harness.command(execution, "cancel", None).await;
    assert_eq!(cancelled.status, "applied", "{cancelled:?}");
    harness.wait_for_state(execution, "cancelled").await;
    let receipt = harness
        .events(execution)
        .into_iter()
        .find_map(|e| match e.event {
            Event::StepFinished { status, .. } => Some(status),
            _ => None,
        });
    assert_eq!(receipt, Some(ReceiptStatus::Unknown));
}

/// F-5 through the actor: a body that drops a step after the runtime committed its intent
/// and told it to run, but before it started (polled once, so its boundary is asked; then
/// the next step's boundary, answered after it in mailbox order; then dropped), never runs
/// it. The step is `not_started` and the function completes; it is never `unknown` waiting
/// for an operator.
#[tokio::test]
async fn f5_a_step_dropped_before_it_started_is_not_started_and_the_function_completes() {
    let ran = Arc::new(AtomicU32::new(0));
    let marks = Arc::clone(&ran);
    let dropping =
        DurableFunction::with_identity("dropping", 1, "dropping:v1", move |context, _input| {
            let marks = Arc::clone(&marks);
            async move {
                let mut step = Box::pin(context.step("s", Recovery::External, |_| async move {
                    marks.fetch_add(1, Ordering::SeqCst);
                    Ok(true)
                }));
                let asked: std::task::Poll<Result<bool, StepError>> = futures::poll!(step.as_mut());
                assert!(asked.is_pending(), "the step's boundary is asked");
                let after = context.step("t", Recovery::Idempotent, |_| async { Ok(1) });
                let _: u32 = after.await.map_err(|error: StepError| error.to_string())?;
                drop(step);
                Ok(json!("done"))
            }
        });
    let (harness, execution) = started_function(dropping, json!(null)).await;
    harness.wait_for_state(execution, "completed").await;
    let receipts: Vec<(String, ReceiptStatus)> = harness
        .events(execution)
        .into_iter()
        .filter_map(|e| match e.event {
            Event::StepFinished {
                step_id, status, ..
            } => Some((step_id, status)),
            _ => None,
        })
        .collect();
    let s = receipts.iter().find(|(step, _)| step == "s");
    assert_eq!(
        s.map(|(_, status)| *status),
        Some(ReceiptStatus::NotStarted),
        "{receipts:?}"
    );
    assert_eq!(ran.load(Ordering::SeqCst), 0, "the dropped step never ran");
}
