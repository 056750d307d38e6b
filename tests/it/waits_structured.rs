//! Structured waits (W-6) and wait deadlines (W-8) through `openprogram serve`, a child
//! process killed with SIGKILL and started again on the same store: a question with items
//! survives the kill and checks each answer; a deadline that passes while the server is down
//! expires the wait at startup, never approving it, and a Continue opens a fresh wait.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::served::Served;
use crate::support::DEADLINE;

const TOKEN: &str = "waits-structured-token";

/// A session and an execution of `script` on `served`: (the execution's path, its id).
fn start(served: &Served, script: Value) -> (String, String) {
    let (status, session) = served.call("POST", "/v1/sessions", Some(&json!({})));
    assert_eq!(status, 201, "{session}");
    let sessions = format!(
        "/v1/sessions/{}/executions",
        session["session_id"].as_str().expect("sid")
    );
    let body = json!({"kind": "agent", "message": "m", "script": script, "max_iterations": 8});
    let (status, started) = served.call("POST", &sessions, Some(&body));
    assert_eq!(status, 201, "{started}");
    let execution = started["execution_id"].as_str().expect("id").to_owned();
    (format!("{sessions}/{execution}"), execution)
}

/// The snapshot once `done` holds (a liveness bound, not a timing assertion).
fn wait_for(served: &Served, path: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (status, snapshot) = served.call("GET", path, None);
        if status == 200 && done(&snapshot) {
            return snapshot;
        }
        assert!(Instant::now() < deadline, "never {what}: {snapshot}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn command(served: &Served, path: &str, body: Value) -> (u16, Value) {
    served.call("POST", &format!("{path}/commands"), Some(&body))
}

fn events(served: &Served, path: &str) -> Vec<Value> {
    let (status, events) = served.call("GET", &format!("{path}/events"), None);
    assert_eq!(status, 200, "{events}");
    events.as_array().cloned().unwrap_or_default()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

fn question() -> Value {
    json!({"question": "Where and how many?", "items": [
        {"id": "env", "label": "Environment", "type": "choice", "options": ["staging", "prod"]},
        {"id": "checks", "type": "choice", "options": ["lint", "test"], "multiple": true},
        {"id": "replicas", "type": "integer", "min": 1, "max": 5},
        {"id": "note", "type": "text", "max_length": 40, "required": false}
    ]})
}

#[test]
fn w6_a_structured_question_survives_kill9_and_a_wrong_answer_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let served = Served::start(&data, TOKEN, &[], &[]);
    let script =
        json!([question(), {"tool": "echo", "args": {"text": "deploying"}}, {"reply": "deployed"}]);
    let (path, _) = start(&served, script);
    let waiting = wait_for(&served, &path, "waiting", |s| s["state"] == "waiting");
    let wait = waiting["waits"][0].clone();
    assert_eq!(wait["kind"], "question", "{waiting}");
    assert_eq!(
        wait["request"]["items"][0]["options"],
        json!(["staging", "prod"])
    );
    served.kill9();

    let served = Served::start(&data, TOKEN, &[], &[]);
    let after = wait_for(&served, &path, "waiting again", |s| s["state"] == "waiting");
    assert_eq!(
        after["waits"][0], wait,
        "the same wait, with its request, after the kill"
    );
    let version = after["version"].clone();

    let command_id = uuid::Uuid::new_v4().to_string();
    for (answer, field) in [
        (
            json!({"env": "dev", "checks": ["lint"], "replicas": 2}),
            "env",
        ),
        (
            json!({"env": "prod", "checks": [], "replicas": 2}),
            "checks",
        ),
        (
            json!({"env": "prod", "checks": ["lint"], "replicas": 9}),
            "replicas",
        ),
        (json!({"env": "prod", "checks": ["lint"]}), "replicas"),
        (
            json!({"env": "prod", "checks": ["lint"], "replicas": 2, "colour": "red"}),
            "colour",
        ),
        (json!("prod"), "answer"),
    ] {
        let body = json!({"command_id": command_id, "kind": "answer",
            "wait_id": wait["wait_id"], "answer": answer});
        let (status, refused) = command(&served, &path, body);
        assert_eq!(status, 400, "{answer}: {refused}");
        assert_eq!(refused["code"], "invalid_answer", "{refused}");
        assert_eq!(refused["field"], field, "{answer}: {refused}");
    }
    // Nothing was recorded: not the command, not a version, not the wait.
    let unchanged = wait_for(&served, &path, "read", |_| true);
    assert_eq!(unchanged["version"], version);
    assert_eq!(unchanged["waits"][0]["status"], "open");
    let session_path = path.split("/executions/").next().expect("session path");
    let (status, _) = served.call(
        "GET",
        &format!("{session_path}/commands/{command_id}"),
        None,
    );
    assert_eq!(status, 404, "a refused answer leaves no command record");

    // The same command id carries the corrected answer.
    let fits = json!({"env": "prod", "checks": ["test", "lint"], "replicas": 3, "note": "go"});
    let body = json!({"command_id": command_id, "kind": "answer",
        "wait_id": wait["wait_id"], "answer": fits});
    let (status, reply) = command(&served, &path, body);
    assert_eq!(status, 202, "{reply}");
    let done = wait_for(&served, &path, "completed", |s| s["state"] == "completed");
    assert_eq!(done["text"], "deployed");
    assert_eq!(done["waits"][0]["status"], "answered");
    let answered: Value =
        serde_json::from_str(done["waits"][0]["answer"].as_str().expect("answer")).expect("json");
    assert_eq!(answered["replicas"], 3);
    served.stop();
}

#[test]
fn w8_a_deadline_that_passes_while_the_server_is_down_expires_the_wait_at_startup() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let sink = dir.path().join("sink");
    let served = Served::start(&data, TOKEN, &[], &[]);
    let script = json!([
        {"ask": "append?", "timeout_ms": 1500},
        {"tool": "append", "args": {"path": sink, "line": "approved"}},
        {"reply": "done"}
    ]);
    let (path, _) = start(&served, script);
    let waiting = wait_for(&served, &path, "waiting", |s| s["state"] == "waiting");
    let first = waiting["waits"][0].clone();
    let deadline = first["deadline_ms"].as_u64().expect("a deadline");
    // Measured from the wait's creation: the event that opened it, plus the timeout.
    let opened_at = events(&served, &path)
        .iter()
        .find(|event| event["type"] == "wait_opened")
        .and_then(|event| event["at_ms"].as_u64())
        .expect("wait_opened");
    assert!(
        deadline <= opened_at + 1500 && deadline + 1000 > opened_at + 1500,
        "{deadline} vs {opened_at}"
    );
    served.kill9();
    // The server is down past the deadline.
    while now_ms() <= deadline + 50 {
        std::thread::sleep(Duration::from_millis(50));
    }

    let served = Served::start(&data, TOKEN, &[], &[]);
    let expired = wait_for(&served, &path, "expired", |s| s["state"] == "paused");
    assert_eq!(expired["pause_reason"], "wait_expired", "{expired}");
    assert_eq!(expired["waits"][0]["status"], "expired");
    assert!(
        !sink.exists(),
        "an expired approval never runs the operation"
    );
    // A late answer to the expired wait approves nothing.
    let late = json!({"command_id": uuid::Uuid::new_v4().to_string(), "kind": "answer",
        "wait_id": first["wait_id"], "answer": "yes"});
    let (status, refused) = command(&served, &path, late);
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["code"], "not_available", "{refused}");

    // Continue opens a fresh wait, with a deadline from now; its answer runs the operation.
    let body = json!({"command_id": uuid::Uuid::new_v4().to_string(), "kind": "continue"});
    let (status, reply) = command(&served, &path, body);
    assert_eq!(status, 202, "{reply}");
    let reopened = wait_for(&served, &path, "waiting again", |s| s["state"] == "waiting");
    let fresh = reopened["waits"][1].clone();
    assert_eq!(fresh["reopens"], first["wait_id"], "{reopened}");
    assert_ne!(fresh["wait_id"], first["wait_id"]);
    assert_eq!(fresh["status"], "open");
    assert!(fresh["deadline_ms"].as_u64().expect("deadline") > deadline + 1500);
    let body = json!({"command_id": uuid::Uuid::new_v4().to_string(), "kind": "answer",
        "wait_id": fresh["wait_id"], "answer": "yes"});
    let (status, reply) = command(&served, &path, body);
    assert_eq!(status, 202, "{reply}");
    wait_for(&served, &path, "completed", |s| s["state"] == "completed");
    let lines = std::fs::read_to_string(&sink).expect("sink");
    assert_eq!(lines.lines().count(), 1, "{lines}");
    assert!(lines.starts_with("approved\t"), "{lines}");
    served.stop();
}

#[test]
fn w8_a_deadline_expires_a_wait_while_the_server_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let served = Served::start(&data, TOKEN, &[], &[]);
    let script = json!([{"permission": "network", "resource": "api.example.com", "timeout_ms": 300},
        {"reply": "done"}]);
    let (path, _) = start(&served, script);
    let expired = wait_for(&served, &path, "expired", |s| s["state"] == "paused");
    assert_eq!(expired["pause_reason"], "wait_expired", "{expired}");
    let wait = &expired["waits"][0];
    assert_eq!(wait["kind"], "permission");
    assert_eq!(wait["status"], "expired");
    assert_eq!(
        wait["request"],
        json!({"permission": "network", "resource": "api.example.com"})
    );
    assert!(
        !events(&served, &path)
            .iter()
            .any(|event| event["type"] == "control_applied"),
        "nothing answered it"
    );
    served.stop();
}

/// W-6 in a durable function: `ask_with` a form; an answer that does not fit is refused, one
/// that fits comes back to the body as its JSON text; a decline is `None` for the whole form.
#[tokio::test]
async fn w6_a_functions_form_is_answered_through_the_same_commands() {
    use openprogram::storage::WaitStatus;
    use openprogram::{DurableFunction, FunctionStart, Runtime, WaitSpec};

    let form = DurableFunction::with_identity("form", 1, "form:v1", |context, _input| async move {
        let spec = WaitSpec::form(
            "Release details",
            &json!({"items": [
                {"id": "version", "type": "text", "max_length": 10},
                {"id": "notify", "type": "boolean", "required": false}]}),
        )?;
        match context.ask_with("details", spec).await {
            Ok(Some(answer)) => Ok(json!({"answer": answer})),
            Ok(None) => Ok(json!("declined")),
            Err(error) => Err(error.to_string()),
        }
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .function(form)
        .open()
        .expect("open");
    let harness = crate::support::Harness::with_runtime(runtime, dir);
    let mut outcomes = Vec::new();
    for decline in [false, true] {
        let started = harness
            .runtime
            .start_function(
                harness.session,
                FunctionStart {
                    function: "form".into(),
                    input: json!(null),
                    ..Default::default()
                },
            )
            .await
            .expect("start");
        let execution = started.started.execution_id;
        let waiting = harness.wait_for_state(execution, "waiting").await;
        let wait = &waiting.waits[0];
        assert_eq!(wait.kind, "form");
        assert_eq!(
            wait.request.as_ref().expect("request")["items"][0]["id"],
            "version"
        );
        let body = if decline {
            json!({"command_id": uuid::Uuid::new_v4(), "kind": "decline", "wait_id": wait.wait_id})
        } else {
            let wrong = json!({"command_id": uuid::Uuid::new_v4(), "kind": "answer",
                "wait_id": wait.wait_id, "answer": {"version": "far too long a version"}});
            let refused = harness
                .runtime
                .command(
                    harness.session,
                    execution,
                    crate::support::command_of(wrong),
                )
                .await
                .expect_err("refused");
            assert!(
                matches!(&refused, openprogram::Error::InvalidAnswer { field, .. } if field == "version"),
                "{refused:?}"
            );
            json!({"command_id": uuid::Uuid::new_v4(), "kind": "answer",
                "wait_id": wait.wait_id, "answer": {"version": "1.2", "notify": true}})
        };
        harness
            .runtime
            .command(harness.session, execution, crate::support::command_of(body))
            .await
            .expect("command");
        let done = harness.wait_for_state(execution, "completed").await;
        let status = if decline {
            WaitStatus::Declined
        } else {
            WaitStatus::Answered
        };
        assert_eq!(done.waits[0].status, status.as_str());
        outcomes.push(done.text);
    }
    let answered: Value = serde_json::from_str(&outcomes[0]).expect("json");
    let answer: Value =
        serde_json::from_str(answered["answer"].as_str().expect("text")).expect("json");
    assert_eq!(answer, json!({"version": "1.2", "notify": true}));
    assert_eq!(outcomes[1], r#""declined""#);
}

/// W-6 from a tool: a live question with items; a wrong answer never reaches the call, the
/// right one does, as its JSON text.
struct Chooser;

impl openprogram::agent::Tool for Chooser {
    fn name(&self) -> &str {
        "chooser"
    }
    fn recovery(&self) -> openprogram::actors::machine::Recovery {
        openprogram::actors::machine::Recovery::Idempotent
    }
    fn call(
        &self,
        call: openprogram::agent::ToolCall,
    ) -> futures::future::BoxFuture<'static, openprogram::agent::ToolResult> {
        use futures::FutureExt;
        let handle = call.handle;
        async move {
            let spec = openprogram::WaitSpec::question(
                "Which colour?",
                &json!({"items": [{"id": "colour", "type": "choice", "options": ["red", "blue"]}]}),
            )?;
            match handle.ask_with(spec).await {
                Ok(openprogram::actors::machine::LiveOutcome::Answered(answer)) => Ok(answer),
                other => Err(format!("{other:?}").into()),
            }
        }
        .boxed()
    }
}

#[tokio::test]
async fn w6_a_tools_live_question_checks_the_answer_before_the_call_sees_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = openprogram::Runtime::builder()
        .data_dir(dir.path())
        .tool(std::sync::Arc::new(Chooser))
        .open()
        .expect("open");
    let harness = crate::support::Harness::with_runtime(runtime, dir);
    let script = vec![json!({"tool": "chooser"}), crate::support::reply("done")];
    let execution = harness.start(script, None).await;
    let asked = crate::support::wait_until(
        &harness.runtime,
        harness.session,
        execution,
        "the live question",
        |now| now.waits.iter().any(|wait| wait.status == "open"),
    )
    .await;
    let wait = &asked.waits[0];
    assert_eq!(wait.kind, "live");
    assert_eq!(
        wait.request.as_ref().expect("request")["items"][0]["id"],
        "colour"
    );
    let send = |answer: Value| {
        let body = json!({"command_id": uuid::Uuid::new_v4(), "kind": "answer",
            "wait_id": wait.wait_id, "answer": answer});
        harness
            .runtime
            .command(harness.session, execution, crate::support::command_of(body))
    };
    let refused = send(json!({"colour": "green"})).await.expect_err("refused");
    assert!(
        matches!(refused, openprogram::Error::InvalidAnswer { ref field, .. } if field == "colour")
    );
    send(json!({"colour": "blue"})).await.expect("answered");
    harness.wait_for_state(execution, "completed").await;
    let events = harness.events(execution);
    let result = events
        .iter()
        .find_map(|envelope| match &envelope.event {
            openprogram::storage::Event::ToolFinished { output, .. } => Some(output.clone()),
            _ => None,
        })
        .expect("the call's result");
    assert_eq!(result, r#"{"colour":"blue"}"#);
}
