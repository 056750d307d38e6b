//! Durable functions under crashes and with agents (F-4, F-6, R-8): `serve` killed with
//! SIGKILL mid-steps, mid-fanout, inside nested workflows and agent-invoked functions;
//! operator reconciliation; an agent's call of a function, its cancel and its forks.

use openprogram::agent::Recovery;
use openprogram::storage::{Event, ExecutionId};
use openprogram::{DurableFunction, FunctionStart};
use serde_json::json;

use crate::functions::*;
use crate::support::*;

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
    let executions = executions_on(&served);
    let start = json!({
        "kind": "function",
        "function": "steps",
        "input": {"count": STEPS, "path": path, "sleep_ms": 30},
    });
    let (status, started) = served.call("POST", &executions, Some(&start));
    assert_eq!(status, 201, "{started}");
    assert_eq!(started["function_revision"], 1, "{started}");
    let execution = started["execution_id"]
        .as_str()
        .expect("execution id")
        .to_owned();
    let wait_lines = |at_least: usize| wait_for_lines(&path, at_least);
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
    let snapshot = completed_on(&served, &executions, &execution);
    assert_each_step_once(&path, STEPS);
    assert_eq!(snapshot["function"]["next_position"], STEPS, "{snapshot}");
    assert_eq!(snapshot["kind"], "function", "{snapshot}");
    served.stop();
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
    let executions = executions_on(&served);
    let names: Vec<String> = (0..6).map(|index| format!("b{index}")).collect();
    let start = json!({
        "kind": "function",
        "function": "fanout",
        "input": {"branches": names, "path": path, "sleep_ms": 150},
    });
    let (status, started) = served.call("POST", &executions, Some(&start));
    assert_eq!(status, 201, "{started}");
    let execution = started["execution_id"].as_str().expect("id").to_owned();
    let wait_lines = |at_least: usize| wait_for_lines(&path, at_least);
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
    let snapshot = completed_on(&served, &executions, &execution);
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
    let executions = executions_on(&served);
    let start = json!({
        "kind": "function",
        "function": "nested",
        "input": {"count": 6, "path": path, "sleep_ms": 30},
    });
    let (status, started) = served.call("POST", &executions, Some(&start));
    assert_eq!(status, 201, "{started}");
    let execution = started["execution_id"].as_str().expect("id").to_owned();
    let wait_lines = |at_least: usize| wait_for_lines(&path, at_least);
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

/// An embedder's function with one External step and no reconcile protocol.
fn charging() -> DurableFunction {
    DurableFunction::with_identity("charge", 1, "charge:v1", |context, _input| async move {
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

/// An agent turn whose script calls the `steps` function (`count` steps, appending to a log
/// in a temporary directory), then replies `called`: its harness, the directory, the log.
async fn agent_calling_steps(
    count: u32,
) -> (Harness, tempfile::TempDir, std::path::PathBuf, ExecutionId) {
    let harness = steps_harness();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("called.log");
    let call = json!({"call": "steps", "input": {"count": count, "path": path}});
    let agent = harness.start(vec![call, reply("called")], None).await;
    (harness, dir, path, agent)
}

/// The child execution an agent's call of a function started, as its session lists it.
async fn called_child(harness: &Harness) -> openprogram::Snapshot {
    let executions = harness
        .runtime
        .executions(harness.session)
        .await
        .expect("executions");
    let child = executions
        .into_iter()
        .find(|snapshot| snapshot.kind == "function");
    child.expect("the child")
}

/// F-6: an agent's scripted `{"call": …}` runs the function as a child execution (kind
/// `function`, the agent as its parent, its own revision and checkpoints) and its result
/// becomes that tool call's receipt before the agent's next decision.
#[tokio::test]
async fn f6_an_agent_calls_a_function_and_gets_its_result_at_the_call() {
    let (harness, _dir, path, agent) = agent_calling_steps(3).await;
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
    let child = called_child(&harness).await;
    assert_eq!(child.parent_execution_id, Some(agent));
    assert_eq!(child.state, "completed");
    assert_eq!(child.function.as_ref().map(|f| f.next_position), Some(3));
    // B-2: Activity lists the child task under its caller's branch; it is no branch.
    let activity = harness.runtime.activity(harness.session).expect("activity");
    assert_eq!(activity.history.len(), 1, "{activity:?}");
    let row = &activity.history[0];
    assert_eq!((row.executions, row.child_tasks), (1, 1), "{row:?}");
    let called = row
        .details
        .iter()
        .find(|detail| detail.child_of == Some(agent));
    assert_eq!(
        called.map(|detail| detail.execution_id),
        Some(child.execution_id)
    );
}

/// K-3: a function an agent's call started answers to that call: it offers no Fork or
/// Retry (a child would run it again for nobody), and refuses them naming its caller.
#[tokio::test]
async fn k3_a_function_an_agent_called_offers_no_fork_or_retry() {
    let (harness, _dir, path, agent) = agent_calling_steps(2).await;
    let done = harness.wait_for_state(agent, "completed").await;
    assert!(done.capabilities.contains(&"retry"), "{done:?}");
    let child = called_child(&harness).await;
    assert_eq!(child.state, "completed");
    assert!(
        !child.capabilities.contains(&"retry") && !child.capabilities.contains(&"fork"),
        "{child:?}"
    );
    let body = json!({"command_id": openprogram::storage::CommandId::new(), "kind": "retry"});
    let refused = harness.send(child.execution_id, body).await;
    assert_eq!(refused.status, "rejected");
    assert_eq!(
        refused.code.as_deref(),
        Some("spawned_child"),
        "{refused:?}"
    );
    assert!(refused
        .reason
        .unwrap_or_default()
        .contains(&agent.to_string()));
    assert_each_step_once(&path, 2);
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
    let executions = executions_on(&served);
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
    let wait_lines = |at_least: usize| wait_for_lines(&path, at_least);
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

/// A session on `served`; the path of its executions.
fn executions_on(served: &crate::served::Served) -> String {
    let (status, session) = served.call("POST", "/v1/sessions", Some(&json!({})));
    assert_eq!(status, 201, "{session}");
    let session = session["session_id"].as_str().expect("session id");
    format!("/v1/sessions/{session}/executions")
}

/// Waits until the file at `path` holds `at_least` lines.
fn wait_for_lines(path: &std::path::Path, at_least: usize) {
    let waited = std::time::Instant::now();
    while lines(path).len() < at_least {
        assert!(waited.elapsed() < DEADLINE, "waited for {at_least} lines");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Waits until the execution has completed; its snapshot.
fn completed_on(
    served: &crate::served::Served,
    executions: &str,
    execution: &str,
) -> serde_json::Value {
    let waited = std::time::Instant::now();
    loop {
        let (_, snapshot) = served.call("GET", &format!("{executions}/{execution}"), None);
        if snapshot["state"] == "completed" {
            return snapshot;
        }
        assert!(waited.elapsed() < DEADLINE, "not completed: {snapshot}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
