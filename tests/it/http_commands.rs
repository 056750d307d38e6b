//! Commands over HTTP (issue 28): for each control kind, K-3 and K-4 through the API a
//! client uses — offered, the command is applied (202); not offered, it is refused (409)
//! with its stable code, the snapshot and the events stay exactly as they were, and the
//! version read before the refusal still commands. And X-3: a body the runtime does not
//! fully understand is a 400 naming what, and nothing is stored. The combinations of every
//! kind in every state are the property test's (`k3_property.rs`).

use std::sync::Arc;

use openprogram::storage::{CommandId, ProcessId, WaitId};
use serde_json::{json, Value};

use crate::http::TestServer;
use crate::support::{crash, echo, elements, reply, sleep, Restarts};

type Session = (String, String);

/// What a state is called, and the script that leads to it (`paused` admits it paused).
#[derive(Clone, Copy)]
enum State {
    Paused,
    Running,
    Waiting,
    CompletedReplyOnly,
    CompletedWithSteps,
    ProcessRunning,
}

fn build(server: &TestServer, session: &Session, state: State) -> String {
    let (script, paused) = match state {
        State::Paused => (json!([echo("a"), reply("done")]), true),
        State::Running => (json!([sleep(600_000), reply("done")]), false),
        State::Waiting => (json!([{"ask": "go on?"}, echo("b"), reply("done")]), false),
        State::CompletedReplyOnly => (json!([reply("done")]), false),
        State::CompletedWithSteps => (json!([echo("a"), echo("b"), reply("done")]), false),
        State::ProcessRunning => (
            json!([{"tool": "shell", "args": {"program": "sleep", "args": ["600"], "background": true}}, reply("done")]),
            false,
        ),
    };
    let body = json!({"kind": "agent", "message": "m", "script": script, "start_paused": paused});
    let execution = server.start(session, body)["execution_id"]
        .as_str()
        .expect("id")
        .to_owned();
    server.wait_for(session, &execution, "its state", |now| match state {
        State::Paused => now["state"] == "paused",
        // The model decided the sleep: it is in flight.
        State::Running => {
            now["state"] == "running" && !now["receipts"].as_array().is_some_and(Vec::is_empty)
        }
        State::Waiting => now["state"] == "waiting",
        State::CompletedReplyOnly | State::CompletedWithSteps => now["state"] == "completed",
        State::ProcessRunning => {
            now["state"] == "completed" && now["processes"][0]["state"] == "running"
        }
    });
    execution
}

/// A body of `kind` with valid arguments for the execution `now` describes, at its version.
fn body(kind: &str, now: &Value) -> Value {
    let mut body =
        json!({"command_id": CommandId::new(), "kind": kind, "expected_version": now["version"]});
    let open_wait = now["waits"]
        .as_array()
        .and_then(|waits| waits.iter().find(|wait| wait["status"] == "open"))
        .map_or_else(|| json!(WaitId::new()), |wait| wait["wait_id"].clone());
    match kind {
        "steer" => body["text"] = json!("steered"),
        "answer" => {
            body["wait_id"] = open_wait;
            body["answer"] = json!("yes");
        }
        "decline" => body["wait_id"] = open_wait,
        "reconcile" => body["outcome"] = json!("confirmed"),
        "stop_process" => {
            body["process_id"] = now["processes"]
                .as_array()
                .and_then(|all| all.iter().find(|process| process["state"] == "running"))
                .map_or_else(
                    || json!(ProcessId::new()),
                    |process| process["process_id"].clone(),
                )
        }
        _ => {}
    }
    body
}

fn events(server: &TestServer, session: &Session, execution: &str) -> Value {
    let path = format!(
        "/v1/sessions/{}/executions/{execution}/events?after=0",
        session.0
    );
    let (status, events) = server.call("GET", &path, Some(&session.1), None);
    assert_eq!(status, 200, "{events}");
    events
}

/// K-3, K-4 over HTTP for `kind`: applied on `offered`, refused on `refused` without a trace
/// on the execution. Each is `(session, execution)`: one session runs one turn at a time
/// (C-2), so two turns in different states are in two sessions.
fn check(server: &TestServer, kind: &str, offered: (&Session, &str), refused: (&Session, &str)) {
    let ((offered_session, offered), (session, refused)) = (offered, refused);
    let before = server.snapshot(offered_session, offered);
    assert!(
        before["capabilities"]
            .as_array()
            .expect("list")
            .contains(&json!(kind)),
        "{before}"
    );
    let (status, applied) = server.command(offered_session, offered, body(kind, &before));
    assert_eq!(
        (status, &applied["status"]),
        (202, &json!("applied")),
        "{kind}: {applied}"
    );

    let before = server.snapshot(session, refused);
    let events_before = events(server, session, refused);
    assert!(
        !before["capabilities"]
            .as_array()
            .expect("list")
            .contains(&json!(kind)),
        "{before}"
    );
    let (status, rejection) = server.command(session, refused, body(kind, &before));
    assert_eq!(status, 409, "{kind}: {rejection}");
    assert_eq!(rejection["status"], "rejected");
    assert!(
        rejection["code"]
            .as_str()
            .is_some_and(|code| code != "command_rejected"),
        "{kind}: a typed code: {rejection}"
    );
    assert_eq!(
        server.snapshot(session, refused),
        before,
        "{kind}: the refusal changed it"
    );
    assert_eq!(
        events(server, session, refused),
        events_before,
        "{kind}: events appended"
    );
    // The refusal is stored, and reads back the same (K-4).
    let path = format!(
        "/v1/sessions/{}/commands/{}",
        session.0,
        rejection["command_id"].as_str().expect("id")
    );
    let (status, stored) = server.call("GET", &path, Some(&session.1), None);
    assert_eq!(status, 200, "{stored}");
    assert_eq!(stored["status"], "rejected");
    assert_eq!(stored["code"], rejection["code"]);
    // The version read before the refusal still commands what is offered.
    if let Some(other) = before["capabilities"]
        .as_array()
        .and_then(|all| all.first())
    {
        let other = other.as_str().expect("kind");
        let (status, reply) = server.command(session, refused, body(other, &before));
        assert_eq!(status, 202, "{other} after a refused {kind}: {reply}");
    }
}

fn run(kind: &str, offered: State, refused: State) {
    let server = TestServer::new();
    let (offered_session, refused_session) = (server.session(), server.session());
    let offered = build(&server, &offered_session, offered);
    let refused = build(&server, &refused_session, refused);
    check(
        &server,
        kind,
        (&offered_session, &offered),
        (&refused_session, &refused),
    );
}

#[test]
fn k3_pause_over_http() {
    run("pause", State::Running, State::Paused);
}

#[test]
fn k3_continue_over_http() {
    run("continue", State::Paused, State::Running);
}

#[test]
fn k3_step_over_http() {
    run("step", State::Paused, State::CompletedWithSteps);
}

#[test]
fn k3_steer_over_http() {
    run("steer", State::Paused, State::CompletedReplyOnly);
}

#[test]
fn k3_cancel_over_http() {
    run("cancel", State::Running, State::CompletedWithSteps);
}

/// The defect of issue 28: a reply-only turn advertised `fork`, then refused it.
#[test]
fn k3_fork_over_http() {
    run("fork", State::CompletedWithSteps, State::CompletedReplyOnly);
}

#[test]
fn k3_retry_over_http() {
    run("retry", State::CompletedReplyOnly, State::Paused);
}

#[test]
fn k3_answer_over_http() {
    run("answer", State::Waiting, State::Paused);
}

#[test]
fn k3_decline_over_http() {
    run("decline", State::Waiting, State::Running);
}

#[test]
fn k3_stop_process_over_http() {
    run(
        "stop_process",
        State::ProcessRunning,
        State::CompletedWithSteps,
    );
}

/// Reconcile is offered only after a crash left an effect unknown: the store is prepared
/// through the library (an External call in flight when its runtime dies), then served.
#[test]
fn k3_reconcile_over_http() {
    let restarts = Restarts::new();
    let prepared = tokio::runtime::Runtime::new().expect("tokio");
    let unknown = prepared.block_on(async {
        let runtime = restarts.open_with(|builder| builder.tool(Arc::new(crate::k3_world::Hang)));
        let request = openprogram::StartRequest {
            message: "m".into(),
            script: elements(vec![json!({"tool": "hang", "args": {}}), reply("done")]),
            ..Default::default()
        };
        let started = runtime
            .start_execution(restarts.session, request)
            .await
            .expect("start");
        restarts
            .wait_events(&runtime, started.execution_id, "the dispatch", 1, |event| {
                matches!(event, openprogram::storage::Event::ToolDispatched { .. })
            })
            .await;
        crash(runtime);
        started.execution_id
    });
    drop(prepared);
    let Restarts { dir, session, .. } = restarts;
    let server = TestServer::on(
        dir,
        |builder| builder.tool(Arc::new(crate::k3_world::Hang)),
        |_| {},
    );
    // The prepared execution's session, reached with the admin token.
    let session = (session.to_string(), crate::http::ADMIN.to_owned());
    let unknown = unknown.to_string();
    server.wait_state(&session, &unknown, "reconciliation_required");
    let paused = build(&server, &session, State::Paused);
    check(
        &server,
        "reconcile",
        (&session, &unknown),
        (&session, &paused),
    );
}

/// unknown fields, kinds not built and kinds that do not exist are 400s naming what,
/// before anything is stored.
#[test]
fn x3_a_body_the_runtime_does_not_understand_is_refused_and_stores_nothing() {
    let server = TestServer::new();
    let session = server.session();
    let path = format!("/v1/sessions/{}/executions", session.0);
    for (body, code, field) in [
        (
            json!({"message": "m", "job": {"resources": {"gpu": 1}}}),
            "unknown_resource",
            None,
        ),
        (
            json!({"message": "m", "policy": "use_latest"}),
            "unknown_field",
            Some("policy"),
        ),
        (
            json!({"message": "m", "max_iteration": 3}),
            "unknown_field",
            Some("max_iteration"),
        ),
        (
            json!({"kind": "function", "function": "steps", "input": {}}),
            "invalid_input",
            None,
        ),
        (
            json!({"kind": "function", "function": "steps", "message": "m"}),
            "unknown_field",
            Some("message"),
        ),
        (
            json!({"kind": "function", "function": "steps", "input": {"count": 1, "path": "x"}, "policy": "sideways"}),
            "invalid_request",
            None,
        ),
        (
            json!({"kind": "job", "message": "m"}),
            "unsupported_kind",
            None,
        ),
        (
            json!({"kind": "agnet", "message": "m"}),
            "unknown_kind",
            None,
        ),
    ] {
        let (status, reply) = server.call("POST", &path, Some(&session.1), Some(&body));
        assert_eq!(
            (status, reply["code"].as_str()),
            (400, Some(code)),
            "{body}: {reply}"
        );
        if let Some(field) = field {
            assert_eq!(reply["field"], field, "{reply}");
            assert!(
                reply["message"].as_str().is_some_and(|m| m.contains(field)),
                "{reply}"
            );
        }
    }
    let unknown = json!({"kind": "function", "function": "nope", "input": {}});
    let (status, reply) = server.call("POST", &path, Some(&session.1), Some(&unknown));
    assert_eq!(
        (status, reply["code"].as_str()),
        (404, Some("unknown_function")),
        "{reply}"
    );
    let (status, listed) = server.call("GET", &path, Some(&session.1), None);
    assert_eq!((status, listed), (200, json!([])), "nothing was admitted");

    let execution = build(&server, &session, State::Paused);
    let before = server.snapshot(&session, &execution);
    for (body, code) in [
        (json!({"kind": "pause", "text": "x"}), "unknown_field"),
        (
            json!({"kind": "continue", "expected_verison": 1}),
            "unknown_field",
        ),
        (
            json!({"kind": "set_policy", "policy": "newest"}),
            "invalid_request",
        ),
        (json!({"kind": "pasue"}), "unknown_kind"),
        (json!({"kind": "steer"}), "invalid_request"),
    ] {
        let mut body = body;
        body["command_id"] = json!(CommandId::new());
        let (status, reply) = server.command(&session, &execution, body.clone());
        assert_eq!(
            (status, reply["code"].as_str()),
            (400, Some(code)),
            "{body}: {reply}"
        );
        let path = format!(
            "/v1/sessions/{}/commands/{}",
            session.0,
            body["command_id"].as_str().expect("id")
        );
        let (status, _) = server.call("GET", &path, Some(&session.1), None);
        assert_eq!(status, 404, "{body}: a refused request stores no command");
    }
    assert_eq!(server.snapshot(&session, &execution), before);
}

/// A random JSON value, `depth` levels at most, biased toward the names the bodies use.
fn random_json(rng: &mut impl rand::Rng, depth: u32) -> Value {
    const NAMES: [&str; 14] = [
        "kind",
        "message",
        "script",
        "command_id",
        "expected_version",
        "text",
        "wait_id",
        "answer",
        "scope",
        "process_id",
        "outcome",
        "checkpoint",
        "start_paused",
        "job",
    ];
    match rng.gen_range(0..if depth == 0 { 5 } else { 7 }) {
        0 => Value::Null,
        1 => json!(rng.gen::<bool>()),
        2 => json!(rng.gen::<i64>() >> rng.gen_range(0..63)),
        3 => json!(rng.gen::<f64>() * 1e6),
        4 => {
            let words = [
                "pause", "continue", "steer", "answer", "agent", "", "\u{0}", "é",
            ];
            json!(words[rng.gen_range(0..words.len())].repeat(rng.gen_range(0..3)))
        }
        5 => Value::Array(
            (0..rng.gen_range(0..4))
                .map(|_| random_json(rng, depth - 1))
                .collect(),
        ),
        _ => {
            let mut object = serde_json::Map::new();
            for _ in 0..rng.gen_range(0..6) {
                let name = NAMES[rng.gen_range(0..NAMES.len())].to_owned();
                object.insert(name, random_json(rng, depth - 1));
            }
            Value::Object(object)
        }
    }
}

/// R16: random and mangled request bodies to the start and command endpoints are refused
/// (4xx) or taken (2xx), never a 5xx or a dropped connection, and the server keeps serving.
/// Seeded (`OP_FUZZ_SEED`, `OP_FUZZ_CASES`).
#[test]
fn r16_random_request_bodies_never_get_a_5xx() {
    use rand::{Rng, SeedableRng};
    let seed: u64 = std::env::var("OP_FUZZ_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    let cases: usize = std::env::var("OP_FUZZ_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(300);
    eprintln!("r16 bodies: seed {seed} (replay with OP_FUZZ_SEED={seed}), {cases} cases");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let server = TestServer::new();
    let session = server.session();
    let execution = build(&server, &session, State::Paused);
    let start = format!("/v1/sessions/{}/executions", session.0);
    let commands = format!("{start}/{execution}/commands");
    for case in 0..cases {
        let path = if case % 2 == 0 { &start } else { &commands };
        let mut body = random_json(&mut rng, 3).to_string();
        if rng.gen_bool(0.2) && !body.is_empty() {
            // Mangled: a byte replaced, or the text cut.
            let mut bytes = body.into_bytes();
            let at = rng.gen_range(0..bytes.len());
            bytes[at] = rng.gen();
            bytes.truncate(rng.gen_range(at..=bytes.len()));
            body = String::from_utf8_lossy(&bytes).into_owned();
        }
        let (status, reply) = crate::http::try_call_raw(
            &server.url,
            "POST",
            path,
            Some(&session.1),
            Some(body.clone()),
        )
        .unwrap_or_else(|error| panic!("seed {seed}, case {case}: {error} for {body}"));
        assert!(
            status < 500,
            "seed {seed}, case {case}: {status} {reply} for {body}"
        );
    }
    assert_eq!(
        server.snapshot(&session, &execution)["execution_id"],
        json!(execution)
    );
}
