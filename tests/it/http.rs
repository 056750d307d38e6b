//! The HTTP API (SPEC §6, I-2, X-1, X-2, K-4) on a real listener on 127.0.0.1:0, through a
//! blocking client: sessions, executions, snapshots, commands and their status, events, and
//! every bad input (400, 401, 404, 409, 413). Conditions are waited for with a deadline.

use std::time::{Duration, Instant};

use openprogram::http::{self, Api, Tokens};
use openprogram::Runtime;
use serde_json::{json, Value};

use crate::support::DEADLINE;

pub const ADMIN: &str = "admin-token-for-tests";

/// A runtime and its HTTP server on a free port; stopped on drop.
pub struct TestServer {
    pub url: String,
    pub runtime: Runtime,
    handle: actix_web::dev::ServerHandle,
    tokio: tokio::runtime::Runtime,
    _dir: tempfile::TempDir,
}

impl TestServer {
    pub fn new() -> Self {
        Self::with(|_| {})
    }

    pub fn with(configure: impl FnOnce(&mut Api)) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        Self::on(dir, |builder| builder, configure)
    }

    /// A server on a store that may hold executions already, its runtime built by `build`.
    pub fn on(
        dir: tempfile::TempDir,
        build: impl FnOnce(openprogram::RuntimeBuilder) -> openprogram::RuntimeBuilder,
        configure: impl FnOnce(&mut Api),
    ) -> Self {
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio");
        let runtime = {
            let _entered = tokio.enter();
            build(
                Runtime::builder()
                    .data_dir(dir.path())
                    .process_stop_grace(Duration::from_millis(200)),
            )
            .open()
            .expect("open runtime")
        };
        let mut api = Api::new(runtime.clone(), Tokens::new(ADMIN, [7; 32]));
        api.poll = Duration::from_millis(20);
        configure(&mut api);
        let (server, addrs) = {
            let _entered = tokio.enter();
            http::start(api, "127.0.0.1:0").expect("listen")
        };
        let handle = server.handle();
        tokio.spawn(server);
        Self {
            url: format!("http://{}", addrs[0]),
            runtime,
            handle,
            tokio,
            _dir: dir,
        }
    }

    /// `(status, body)`; a body that is not JSON comes back as a string.
    pub fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> (u16, Value) {
        call_raw(
            &self.url,
            method,
            path,
            token,
            body.map(|body| body.to_string()),
        )
    }

    /// A new session: `(session_id, token)`.
    pub fn session(&self) -> (String, String) {
        let (status, body) = self.call("POST", "/v1/sessions", Some(ADMIN), None);
        assert_eq!(status, 201, "{body}");
        (
            body["session_id"].as_str().expect("session_id").to_string(),
            body["token"].as_str().expect("token").to_string(),
        )
    }

    pub fn start(&self, session: &(String, String), body: Value) -> Value {
        let path = format!("/v1/sessions/{}/executions", session.0);
        let (status, reply) = self.call("POST", &path, Some(&session.1), Some(&body));
        assert_eq!(status, 201, "{reply}");
        reply
    }

    pub fn snapshot(&self, session: &(String, String), execution: &str) -> Value {
        let path = format!("/v1/sessions/{}/executions/{execution}", session.0);
        let (status, body) = self.call("GET", &path, Some(&session.1), None);
        assert_eq!(status, 200, "{body}");
        body
    }

    /// `GET …/events/stream` of an execution, with its session's token: the SSE lines.
    pub fn events_stream(
        &self,
        session: &(String, String),
        execution: &str,
    ) -> std::io::BufReader<Box<dyn std::io::Read + Send + Sync>> {
        let path = format!(
            "{}/v1/sessions/{}/executions/{execution}/events/stream",
            self.url, session.0
        );
        let response = ureq::get(&path)
            .set("Authorization", &format!("Bearer {}", session.1))
            .timeout(DEADLINE)
            .call()
            .expect("stream");
        std::io::BufReader::new(response.into_reader())
    }

    pub fn command(
        &self,
        session: &(String, String),
        execution: &str,
        body: Value,
    ) -> (u16, Value) {
        let path = format!("/v1/sessions/{}/executions/{execution}/commands", session.0);
        self.call("POST", &path, Some(&session.1), Some(&body))
    }

    /// Waits until the snapshot satisfies `done`; returns it.
    pub fn wait_for(
        &self,
        session: &(String, String),
        execution: &str,
        what: &str,
        done: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let snapshot = self.snapshot(session, execution);
            if done(&snapshot) {
                return snapshot;
            }
            assert!(Instant::now() < deadline, "never {what}: {snapshot}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn wait_state(&self, session: &(String, String), execution: &str, state: &str) -> Value {
        self.wait_for(session, execution, state, |snapshot| {
            snapshot["state"] == state
        })
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        crate::support::end_processes(&self.runtime);
        self.tokio.block_on(self.handle.stop(false));
        self.runtime.halt();
    }
}

pub fn call_raw(
    url: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<String>,
) -> (u16, Value) {
    try_call_raw(url, method, path, token, body)
        .unwrap_or_else(|error| panic!("{method} {path}: {error}"))
}

/// `call_raw`, with a transport error (a refused or dropped connection) returned.
pub fn try_call_raw(
    url: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<String>,
) -> Result<(u16, Value), String> {
    let mut request = ureq::request(method, &format!("{url}{path}"));
    if let Some(token) = token {
        request = request.set("Authorization", &format!("Bearer {token}"));
    }
    let response = match body {
        Some(body) => request
            .set("Content-Type", "application/json")
            .send_string(&body),
        None => request.call(),
    };
    let (status, text) = match response {
        Ok(response) => (response.status(), response.into_string().expect("body")),
        Err(ureq::Error::Status(status, response)) => {
            (status, response.into_string().expect("body"))
        }
        Err(error) => return Err(error.to_string()),
    };
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Ok((status, body))
}

fn command_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn script_agent(script: Value) -> Value {
    json!({"kind": "agent", "message": "hi", "parent_message_id": null, "script": script, "max_iterations": 50})
}

#[test]
fn i2_a_session_starts_an_execution_and_reads_its_snapshot_and_events() {
    let server = TestServer::new();
    let session = server.session();
    let started = server.start(
        &session,
        script_agent(json!([
            {"tool": "echo", "args": {"text": "hello"}},
            {"reply": "done"}
        ])),
    );
    for field in [
        "execution_id",
        "run_id",
        "turn_id",
        "user_message_id",
        "reply_message_id",
        "version",
    ] {
        assert!(!started[field].is_null(), "{field} missing in {started}");
    }
    let execution = started["execution_id"].as_str().expect("id");
    let snapshot = server.wait_state(&session, execution, "completed");
    assert_eq!(snapshot["session_id"], session.0.as_str());
    assert_eq!(snapshot["text"], "done");
    assert_eq!(snapshot["receipts"][0]["status"], "confirmed");
    for field in [
        "run_id",
        "parent_execution_id",
        "turn_id",
        "kind",
        "pause_reason",
        "attempt",
        "capabilities",
        "waits",
        "processes",
        "restart_deadline_ms",
    ] {
        assert!(
            snapshot.get(field).is_some(),
            "{field} missing in {snapshot}"
        );
    }
    let path = format!(
        "/v1/sessions/{}/executions/{execution}/events?after=0",
        session.0
    );
    let (status, events) = server.call("GET", &path, Some(&session.1), None);
    assert_eq!(status, 200);
    let events = events.as_array().expect("a list").clone();
    assert_eq!(events[0]["type"], "admitted");
    assert_eq!(events[0]["seq"], 1);
    assert!(events
        .iter()
        .all(|event| event["position"].is_u64() && event["at_ms"].is_u64()));
    let path = format!(
        "/v1/sessions/{}/executions/{execution}/events?after=2",
        session.0
    );
    let (_, later) = server.call("GET", &path, Some(&session.1), None);
    assert_eq!(later[0]["seq"], 3);
    assert_eq!(later.as_array().map(Vec::len), Some(events.len() - 2));
}

#[test]
fn x2_a_missing_or_wrong_token_is_401() {
    let server = TestServer::new();
    let mine = server.session();
    let other = server.session();
    let execution = server.start(&mine, script_agent(json!([{"reply": "ok"}])));
    let path = format!(
        "/v1/sessions/{}/executions/{}",
        mine.0,
        execution["execution_id"].as_str().expect("id")
    );
    for token in [None, Some("wrong"), Some(other.1.as_str()), Some("")] {
        let (status, body) = server.call("GET", &path, token, None);
        assert_eq!(status, 401, "{token:?}: {body}");
        assert_eq!(body["code"], "unauthorized");
        assert!(body["message"].is_string());
    }
    // A session token reaches its session only: not session creation, not the debug endpoint.
    assert_eq!(
        server.call("POST", "/v1/sessions", Some(&mine.1), None).0,
        401
    );
    for debug in [
        "/debug/actors",
        "/debug/log",
        "/metrics",
        "/debug/executions",
    ] {
        assert_eq!(
            server.call("GET", debug, Some(&mine.1), None).0,
            401,
            "{debug}"
        );
    }
    // The admin token reaches every session.
    assert_eq!(server.call("GET", &path, Some(ADMIN), None).0, 200);
    // `/health` needs no token.
    assert_eq!(server.call("GET", "/health", None, None).0, 200);
}

#[test]
fn x1_another_sessions_execution_is_not_found() {
    let server = TestServer::new();
    let mine = server.session();
    let theirs = server.session();
    let their_execution = server.start(&theirs, script_agent(json!([{"reply": "theirs"}])));
    let their_execution = their_execution["execution_id"]
        .as_str()
        .expect("id")
        .to_string();
    let unknown = format!("ex_{}", uuid::Uuid::now_v7().simple());
    let mut bodies = Vec::new();
    for execution in [their_execution.as_str(), unknown.as_str(), "not-an-id"] {
        let base = format!("/v1/sessions/{}/executions/{execution}", mine.0);
        let (status, snapshot) = server.call("GET", &base, Some(&mine.1), None);
        assert_eq!(status, 404, "{snapshot}");
        bodies.push(snapshot);
        assert_eq!(
            server
                .call("GET", &format!("{base}/events"), Some(&mine.1), None)
                .0,
            404
        );
        assert_eq!(
            server
                .call("GET", &format!("{base}/events/stream"), Some(&mine.1), None)
                .0,
            404
        );
        let pause = json!({"command_id": command_id(), "kind": "pause"});
        assert_eq!(
            server
                .call(
                    "POST",
                    &format!("{base}/commands"),
                    Some(&mine.1),
                    Some(&pause)
                )
                .0,
            404
        );
    }
    // Indistinguishable: the same body for another session's id and an unknown one.
    assert_eq!(bodies[0], bodies[1]);
    assert_eq!(bodies[0]["code"], "not_found");
    // Their command is not found through my session either.
    let command = command_id();
    let (status, _) = server.command(
        &theirs,
        &their_execution,
        json!({"command_id": command, "kind": "pause"}),
    );
    assert!(status == 202 || status == 409);
    let (status, _) = server.call(
        "GET",
        &format!("/v1/sessions/{}/commands/{command}", mine.0),
        Some(&mine.1),
        None,
    );
    assert_eq!(status, 404);
    let (status, _) = server.call(
        "GET",
        &format!("/v1/sessions/{}/commands/{command}", theirs.0),
        Some(&theirs.1),
        None,
    );
    assert_eq!(status, 200);
}

#[test]
fn i2_malformed_input_is_400_never_500() {
    let server = TestServer::new();
    let session = server.session();
    let base = format!("/v1/sessions/{}/executions", session.0);
    let raw = |method: &str, path: &str, body: &str| {
        call_raw(
            &server.url,
            method,
            path,
            Some(&session.1),
            Some(body.to_string()),
        )
    };
    for body in [
        "{not json",
        "[]",
        "{\"script\": []}",
        "{\"message\": 5}",
        "{\"message\": \"x\", \"max_iterations\": 0}",
    ] {
        let (status, reply) = raw("POST", &base, body);
        assert_eq!(status, 400, "{body}: {reply}");
        assert_eq!(reply["code"], "invalid_request", "{body}");
    }
    let execution = server.start(
        &session,
        json!({"message": "x", "start_paused": true, "script": [{"reply": "ok"}]}),
    );
    let commands = format!(
        "{base}/{}/commands",
        execution["execution_id"].as_str().expect("id")
    );
    for body in [
        json!({"kind": "pause"}),
        json!({"command_id": "nope", "kind": "pause"}),
        json!({"command_id": command_id(), "kind": "explode"}),
        json!({"command_id": command_id(), "kind": "steer"}),
        json!({"command_id": command_id(), "kind": "reconcile"}),
        json!({"command_id": command_id(), "kind": "stop_process"}),
        json!({"command_id": command_id(), "kind": "answer", "scope": "everything"}),
        json!({"command_id": command_id(), "kind": "pause", "expected_version": -1}),
    ] {
        let (status, reply) = raw("POST", &commands, &body.to_string());
        assert_eq!(status, 400, "{body}: {reply}");
    }
    let events = format!(
        "{base}/{}/events?after=abc",
        execution["execution_id"].as_str().expect("id")
    );
    assert_eq!(server.call("GET", &events, Some(&session.1), None).0, 400);
    assert_eq!(
        server
            .call("GET", "/v1/nothing-here", Some(&session.1), None)
            .0,
        404
    );
}

#[test]
fn x2_a_body_over_the_limit_is_413() {
    let server = TestServer::with(|api| api.body_bytes_max = 4096);
    let session = server.session();
    let path = format!("/v1/sessions/{}/executions", session.0);
    let body = json!({"message": "x".repeat(8192), "script": []});
    let (status, reply) = server.call("POST", &path, Some(&session.1), Some(&body));
    assert_eq!(status, 413, "{reply}");
    assert_eq!(reply["code"], "payload_too_large");
}

#[test]
fn k4_the_same_command_id_twice_returns_the_same_reply_and_another_payload_conflicts() {
    let server = TestServer::new();
    let session = server.session();
    let started = server.start(
        &session,
        json!({"message": "x", "start_paused": true, "script": [{"reply": "ok"}]}),
    );
    let execution = started["execution_id"].as_str().expect("id");
    let id = command_id();
    let steer = json!({"command_id": id, "kind": "steer", "text": "be brief"});
    let (status, first) = server.command(&session, execution, steer.clone());
    assert_eq!(status, 202, "{first}");
    assert_eq!(first["status"], "applied");
    let (status, again) = server.command(&session, execution, steer);
    assert_eq!(status, 202);
    assert_eq!(again, first);
    let (status, conflict) = server.command(
        &session,
        execution,
        json!({"command_id": id, "kind": "steer", "text": "be long"}),
    );
    assert_eq!(status, 409, "{conflict}");
    assert_eq!(conflict["code"], "command_conflict");
    let (status, stored) = server.call(
        "GET",
        &format!("/v1/sessions/{}/commands/{id}", session.0),
        Some(&session.1),
        None,
    );
    assert_eq!(status, 200);
    assert_eq!(stored, first);
}

#[test]
fn k4_a_stale_version_or_a_control_not_offered_is_409() {
    let server = TestServer::new();
    let session = server.session();
    let started = server.start(
        &session,
        json!({"message": "x", "start_paused": true, "script": [{"reply": "ok"}]}),
    );
    let execution = started["execution_id"].as_str().expect("id");
    let (status, stale) = server.command(
        &session,
        execution,
        json!({"command_id": command_id(), "kind": "continue", "expected_version": 999}),
    );
    assert_eq!(status, 409, "{stale}");
    assert_eq!(stale["code"], "version_conflict");
    assert_eq!(stale["status"], "rejected");
    assert!(stale["message"]
        .as_str()
        .expect("message")
        .contains("current version"));
    // The stale command changed nothing: the version the client read before it commands.
    let version = started["version"].as_u64().expect("version");
    assert_eq!(server.snapshot(&session, execution)["version"], version);
    let (status, reply) = server.command(
        &session,
        execution,
        json!({"command_id": command_id(), "kind": "continue", "expected_version": version}),
    );
    assert_eq!(status, 202, "{reply}");
    server.wait_state(&session, execution, "completed");
    let (status, refused) = server.command(
        &session,
        execution,
        json!({"command_id": command_id(), "kind": "pause"}),
    );
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["code"], "not_available");
    assert!(refused["reason"]
        .as_str()
        .expect("reason")
        .contains("available"));
}

#[test]
fn k2_pause_step_continue_and_cancel_over_http() {
    let server = TestServer::new();
    let session = server.session();
    let script = json!([
        {"tool": "echo", "args": {"text": "a"}},
        {"tool": "echo", "args": {"text": "b"}},
        {"tool": "sleep", "args": {"ms": 60000}},
        {"reply": "never"}
    ]);
    let started = server.start(
        &session,
        json!({"message": "x", "start_paused": true, "script": script}),
    );
    let execution = started["execution_id"].as_str().expect("id");
    let capabilities = server.snapshot(&session, execution)["capabilities"].clone();
    assert!(
        capabilities
            .as_array()
            .expect("list")
            .contains(&json!("continue")),
        "{capabilities}"
    );
    let (status, reply) = server.command(
        &session,
        execution,
        json!({"command_id": command_id(), "kind": "step"}),
    );
    assert_eq!(status, 202, "{reply}");
    server.wait_for(&session, execution, "paused after one step", |snapshot| {
        snapshot["state"] == "paused" && snapshot["version"].as_u64() > started["version"].as_u64()
    });
    let (status, _) = server.command(
        &session,
        execution,
        json!({"command_id": command_id(), "kind": "continue"}),
    );
    assert_eq!(status, 202);
    server.wait_for(&session, execution, "sleeping", |snapshot| {
        snapshot["receipts"]
            .as_array()
            .is_some_and(|receipts| receipts.len() >= 2)
    });
    let (status, _) = server.command(
        &session,
        execution,
        json!({"command_id": command_id(), "kind": "cancel"}),
    );
    assert_eq!(status, 202);
    server.wait_state(&session, execution, "cancelled");
}

#[test]
fn w2_answer_and_decline_over_http() {
    let server = TestServer::new();
    let session = server.session();
    let script =
        json!([{"ask": "proceed?"}, {"tool": "echo", "args": {"text": "ran"}}, {"reply": "done"}]);
    let answered = server.start(&session, script_agent(script.clone()));
    let declined = server.start(&session, script_agent(script));
    for (started, kind) in [(&answered, "answer"), (&declined, "decline")] {
        let execution = started["execution_id"].as_str().expect("id");
        let waiting = server.wait_state(&session, execution, "waiting");
        let wait_id = waiting["waits"][0]["wait_id"].clone();
        assert_eq!(waiting["waits"][0]["status"], "open");
        let mut body = json!({"command_id": command_id(), "kind": kind, "wait_id": wait_id});
        if kind == "answer" {
            body["answer"] = json!("yes");
        }
        let (status, reply) = server.command(&session, execution, body);
        assert_eq!(status, 202, "{reply}");
    }
    let answered = server.wait_state(
        &session,
        answered["execution_id"].as_str().expect("id"),
        "completed",
    );
    assert_eq!(answered["waits"][0]["status"], "answered");
    let echoes = |snapshot: &Value| {
        snapshot["receipts"]
            .as_array()
            .expect("receipts")
            .iter()
            .filter(|receipt| receipt["tool"] == "echo")
            .count()
    };
    assert_eq!(echoes(&answered), 1, "{answered}");
    let declined = server.wait_state(
        &session,
        declined["execution_id"].as_str().expect("id"),
        "completed",
    );
    assert_eq!(declined["waits"][0]["status"], "declined");
    assert_eq!(echoes(&declined), 0, "a declined operation never runs");
}

#[test]
fn p2_stop_process_over_http() {
    let server = TestServer::new();
    let session = server.session();
    let script = json!([
        {"tool": "shell", "args": {"program": "sleep", "args": ["30"], "background": true}},
        {"reply": "started"}
    ]);
    let started = server.start(&session, script_agent(script));
    let execution = started["execution_id"].as_str().expect("id");
    let running = server.wait_for(&session, execution, "running a process", |snapshot| {
        snapshot["processes"][0]["state"] == "running" && snapshot["text"] == "started"
    });
    let process = running["processes"][0]["process_id"].clone();
    let (status, reply) = server.command(
        &session,
        execution,
        json!({"command_id": command_id(), "kind": "stop_process", "process_id": process}),
    );
    assert_eq!(status, 202, "{reply}");
    server.wait_for(&session, execution, "process stopped", |snapshot| {
        snapshot["processes"][0]["state"] == "stopped"
    });
}

/// the token is checked before the body is read: an anonymous client gets 401 for a
/// malformed or oversized body, never a 400 or 413 that judges it.
#[test]
fn x2_a_body_without_a_valid_token_is_401_before_it_is_read() {
    let server = TestServer::new();
    let session = server.session();
    let path = format!("/v1/sessions/{}/executions", session.0);
    let huge = format!("{{\"message\": \"{}\"}}", "x".repeat(300 * 1024));
    for (token, body) in [
        (None, "{not json".to_owned()),
        (Some("wrong"), "{not json".to_owned()),
        (Some("wrong"), huge.clone()),
    ] {
        let (status, reply) = call_raw(&server.url, "POST", &path, token, Some(body));
        assert_eq!(status, 401, "{reply}");
        assert_eq!(reply["code"], "unauthorized", "{reply}");
    }
    // A session segment that is not an id as written (malformed, percent-encoded) reaches
    // only the admin: the router would decode what the check did not.
    let encoded = path.replacen("ses_", "%73es_", 1);
    for odd in ["/v1/sessions/not-a-session/executions", encoded.as_str()] {
        let (status, reply) = call_raw(
            &server.url,
            "POST",
            odd,
            Some(&session.1),
            Some("{not json".into()),
        );
        assert_eq!(status, 401, "{odd}: {reply}");
    }
    // With the session's token, the same bodies are judged: 400 and 413.
    let malformed = call_raw(
        &server.url,
        "POST",
        &path,
        Some(&session.1),
        Some("{not json".into()),
    );
    assert_eq!(malformed.0, 400, "{}", malformed.1);
    let oversized = call_raw(&server.url, "POST", &path, Some(&session.1), Some(huge));
    assert_eq!(oversized.0, 413, "{}", oversized.1);
}
