//! The event stream (I-2, B-6: SSE resume from a cursor, `Last-Event-ID`, resync on a
//! stale cursor) and the debug endpoint (I-3): actors, the global log, executions, metrics,
//! health, the OpenAPI document and the page.

use std::io::{BufRead as _, BufReader};
use std::time::Duration;

use serde_json::{json, Value};

use crate::http::{TestServer, ADMIN};

/// Reads SSE frames until `count` events with an `id:` arrived; returns every frame
/// as `(id, event, data)`.
pub fn read_frames(
    server: &TestServer,
    path: &str,
    token: &str,
    last_event_id: Option<&str>,
    count: usize,
) -> Vec<(Option<u64>, Option<String>, Value)> {
    read_frames_after(server, path, token, last_event_id, count, || {})
}

/// `read_frames`, calling `opened` once the stream answered (its first line read).
pub fn read_frames_after(
    server: &TestServer,
    path: &str,
    token: &str,
    last_event_id: Option<&str>,
    count: usize,
    opened: impl FnOnce(),
) -> Vec<(Option<u64>, Option<String>, Value)> {
    let mut opened = Some(opened);
    let mut request = ureq::get(&format!("{}{path}", server.url))
        .set("Authorization", &format!("Bearer {token}"))
        .timeout(Duration::from_secs(20));
    if let Some(id) = last_event_id {
        request = request.set("Last-Event-ID", id);
    }
    let response = request.call().expect("stream");
    assert_eq!(response.content_type(), "text/event-stream");
    let mut reader = BufReader::new(response.into_reader());
    let mut frames: Vec<(Option<u64>, Option<String>, Value)> = Vec::new();
    let (mut id, mut event, mut data): (Option<u64>, Option<String>, Option<Value>) =
        (None, None, None);
    while frames.iter().filter(|(id, _, _)| id.is_some()).count() < count {
        let mut line = String::new();
        assert!(
            reader.read_line(&mut line).expect("read") > 0,
            "stream ended"
        );
        let line = line.trim_end_matches('\n');
        if let Some(opened) = opened.take() {
            opened();
        }
        if let Some(value) = line.strip_prefix("id: ") {
            id = value.parse().ok();
        } else if let Some(value) = line.strip_prefix("event: ") {
            event = Some(value.to_string());
        } else if let Some(value) = line.strip_prefix("data: ") {
            data = Some(serde_json::from_str(value).expect("data is JSON"));
        } else if line.is_empty() {
            if let Some(data) = data.take() {
                frames.push((id.take(), event.take(), data));
            }
            id = None;
            event = None;
        }
    }
    frames
}

#[test]
fn b6_event_stream_resumes_from_its_cursor_and_resyncs_a_stale_one() {
    let server = TestServer::new();
    let session = server.session();
    let started = server.start(
        &session,
        json!({"message": "x", "script": [{"tool": "echo", "args": {"text": "a"}}, {"reply": "ok"}]}),
    );
    let execution = started["execution_id"].as_str().expect("id");
    server.wait_state(&session, execution, "completed");
    let base = format!("/v1/sessions/{}/executions/{execution}", session.0);
    let (_, all) = server.call("GET", &format!("{base}/events"), Some(&session.1), None);
    let all = all.as_array().expect("events").clone();
    let last = all.len() as u64;
    assert!(last >= 4, "{all:?}");

    // From a cursor: exactly the events after it, in order, `id` = seq.
    let frames = read_frames(
        &server,
        &format!("{base}/events/stream?after=2"),
        &session.1,
        None,
        2,
    );
    assert_eq!(frames[0].0, Some(3));
    assert_eq!(frames[1].0, Some(4));
    assert_eq!(frames[0].2, all[2], "the same event as GET …/events");

    // Last-Event-ID (a reconnect) wins over `after`.
    let frames = read_frames(
        &server,
        &format!("{base}/events/stream?after=1"),
        &session.1,
        Some("3"),
        1,
    );
    assert_eq!(frames[0].0, Some(4));

    // A cursor past the end: one resync event, not an error; then new events stream on.
    let path = format!("{base}/events/stream?after={}", last + 100);
    let mut request = ureq::get(&format!("{}{path}", server.url))
        .set("Authorization", &format!("Bearer {}", session.1))
        .timeout(Duration::from_secs(20));
    request = request.set("Accept", "text/event-stream");
    let response = request.call().expect("a stale cursor is not an error");
    let mut reader = BufReader::new(response.into_reader());
    let mut text = String::new();
    while !text.contains("event: resync") {
        assert!(reader.read_line(&mut text).expect("read") > 0);
    }
    let mut data = String::new();
    reader.read_line(&mut data).expect("data");
    let data: Value = serde_json::from_str(data.trim_start_matches("data: ").trim()).expect("JSON");
    assert_eq!(data["last_seq"], last);
}

#[test]
fn b6_event_stream_delivers_events_committed_after_it_opened() {
    let server = TestServer::new();
    let session = server.session();
    let started = server.start(
        &session,
        json!({"message": "x", "start_paused": true, "script": [{"reply": "later"}]}),
    );
    let execution = started["execution_id"].as_str().expect("id").to_string();
    let base = format!("/v1/sessions/{}/executions/{execution}", session.0);
    let (_, before) = server.call("GET", &format!("{base}/events"), Some(&session.1), None);
    let after = before.as_array().expect("events").len();
    let path = format!("{base}/commands");
    let mut continued = None;
    // Continue only once the stream is open and has sent its first line: the event it
    // waits for is committed after, never caught up from before.
    let frames = read_frames_after(
        &server,
        &format!("{base}/events/stream?after={after}"),
        &session.1,
        None,
        1,
        || {
            let body = json!({"command_id": uuid::Uuid::new_v4().to_string(), "kind": "continue"});
            continued = Some(server.call("POST", &path, Some(&session.1), Some(&body)).0);
        },
    );
    assert_eq!(frames[0].0, Some(after as u64 + 1));
    assert_eq!(continued, Some(202));
}

#[test]
fn i3_debug_actors_log_executions_and_metrics() {
    let server = TestServer::new();
    let session = server.session();
    let sleeping = server.start(&session, json!({"message": "x", "script": [{"tool": "sleep", "args": {"ms": 60000}}, {"reply": "never"}]}));
    let execution = sleeping["execution_id"].as_str().expect("id");
    server.wait_for(&session, execution, "sleeping", |snapshot| {
        snapshot["state"] == "running" && snapshot["version"].as_u64() > Some(2)
    });

    let (status, actors) = server.call("GET", "/debug/actors", Some(ADMIN), None);
    assert_eq!(status, 200);
    let actors = actors.as_array().expect("list").clone();
    for actor in &actors {
        for field in ["kind", "id", "arbiter", "mailbox_len", "handled", "state"] {
            assert!(actor.get(field).is_some(), "{field} missing in {actor}");
        }
        // Every actor that answered counts what waits in its mailbox.
        assert!(actor["mailbox_len"].is_u64(), "{actor}");
    }
    assert!(actors.iter().any(|actor| actor["kind"] == "supervisor"));
    let live = actors
        .iter()
        .find(|actor| actor["id"] == execution)
        .expect("the running execution is live");
    assert_eq!(live["kind"], "execution");
    assert!(live["handled"].as_u64() > Some(0), "{live}");
    assert!(live["arbiter"].is_string(), "{live}");
    // Its running attempt holds a lease actor, which describes itself too.
    let lease = actors
        .iter()
        .find(|actor| actor["kind"] == "attempt_lease")
        .expect("the attempt lease actor is listed");
    assert!(
        lease["state"].as_str().expect("state").contains(execution),
        "{lease}"
    );
    let supervisor = actors
        .iter()
        .find(|actor| actor["kind"] == "supervisor")
        .expect("supervisor");
    assert!(supervisor["handled"].as_u64() >= Some(1), "{supervisor}");
    let committer = actors
        .iter()
        .find(|actor| actor["kind"] == "committer")
        .expect("the committer");
    assert!(committer["mailbox_len"].is_u64(), "{committer}");
    assert!(committer["handled"].as_u64() > Some(0), "{committer}");
    assert!(live["state"]
        .as_str()
        .expect("state")
        .starts_with("running"));
    let (status, one) = server.call(
        "GET",
        &format!("/debug/actors/{execution}"),
        Some(ADMIN),
        None,
    );
    assert_eq!(status, 200);
    assert_eq!(one["id"], execution);
    assert_eq!(
        server
            .call("GET", "/debug/actors/nobody", Some(ADMIN), None)
            .0,
        404
    );

    let (status, log) = server.call("GET", "/debug/log?after=0", Some(ADMIN), None);
    assert_eq!(status, 200);
    let positions: Vec<u64> = log
        .as_array()
        .expect("log")
        .iter()
        .map(|event| event["position"].as_u64().expect("position"))
        .collect();
    assert!(
        positions.windows(2).all(|pair| pair[0] < pair[1]),
        "{positions:?}"
    );
    let (_, later) = server.call(
        "GET",
        &format!("/debug/log?after={}", positions[1]),
        Some(ADMIN),
        None,
    );
    assert_eq!(later[0]["position"], positions[2]);
    assert_eq!(
        server
            .call("GET", "/debug/log?after=x", Some(ADMIN), None)
            .0,
        400
    );

    let (_, executions) = server.call("GET", "/debug/executions", Some(ADMIN), None);
    let row = executions["executions"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|row| row["execution_id"] == execution)
        .cloned()
        .expect("listed");
    assert_eq!(row["session_id"], session.0.as_str());

    let (status, metrics) = server.call("GET", "/metrics", Some(ADMIN), None);
    assert_eq!(status, 200);
    let metrics = metrics.as_str().expect("text").to_string();
    for name in [
        "openprogram_commits_total ",
        "openprogram_fsyncs_total ",
        // The decision to sleep; the sleep itself has not finished.
        "openprogram_steps_total 1\n",
        "openprogram_committer_queue_depth ",
        "openprogram_state_loads_total{from=\"replay\"} ",
        "openprogram_live_actors{kind=\"execution\"} 1",
        "openprogram_execution_mailbox_messages 0\n",
        "openprogram_executions{state=\"running\"} 1",
        "# TYPE openprogram_commits_total counter",
    ] {
        assert!(metrics.contains(name), "{name} missing in\n{metrics}");
    }
    // What an operator reads says what a figure is, not which requirement it serves.
    for help in metrics.lines().filter(|line| line.starts_with("# HELP")) {
        let ids = crate::support::requirement_ids(help);
        assert!(ids.is_empty(), "{help} names {ids:?}");
    }
    let (_, reply) = server.command(
        &session,
        execution,
        json!({"command_id": uuid::Uuid::new_v4().to_string(), "kind": "cancel"}),
    );
    assert_eq!(reply["status"], "applied");
}

#[test]
fn i3_health_openapi_and_page_need_no_token() {
    let server = TestServer::new();
    let (status, health) = server.call("GET", "/health", None, None);
    assert_eq!(status, 200);
    assert_eq!(health["status"], "ok");
    let (status, openapi) = server.call("GET", "/openapi.json", None, None);
    assert_eq!(status, 200);
    assert_eq!(openapi["openapi"], "3.0.3");
    let paths = openapi["paths"].as_object().expect("paths");
    for path in [
        "/v1/sessions",
        "/v1/sessions/{sid}/executions",
        "/v1/sessions/{sid}/executions/{eid}",
        "/v1/sessions/{sid}/executions/{eid}/commands",
        "/v1/sessions/{sid}/commands/{cid}",
        "/v1/sessions/{sid}/executions/{eid}/events",
        "/v1/sessions/{sid}/executions/{eid}/events/stream",
        "/debug/actors",
        "/debug/actors/{id}",
        "/debug/log",
        "/debug/executions",
        "/metrics",
        "/health",
    ] {
        assert!(paths.contains_key(path), "{path} not documented");
    }
    let (status, page) = server.call("GET", "/", None, None);
    assert_eq!(status, 200);
    // The page's files are its own, by name, no token needed; nothing runs inline (its
    // content security policy allows only them).
    let page = page.as_str().expect("html").to_owned();
    let scripts: Vec<&str> = page.split("<script src=\"").skip(1).collect();
    assert!(scripts.len() > 3, "{page}");
    assert_eq!(
        page.matches("<script").count(),
        scripts.len(),
        "an inline script"
    );
    let mut code = String::new();
    for script in scripts {
        let path = script.split('"').next().expect("a path");
        let (status, body) = server.call("GET", path, None, None);
        assert_eq!(status, 200, "{path}");
        code.push_str(body.as_str().expect("script"));
    }
    assert!(code.contains("events/stream"));
    let (status, _) = server.call("GET", "/page/page.css", None, None);
    assert_eq!(status, 200);
    let (status, body) = server.call("GET", "/page/secrets.js", None, None);
    assert_eq!(
        (status, &body["code"]),
        (404, &json!("not_found")),
        "{body}"
    );
    // Only the page's own files run or style it, never framed, never sniffed.
    for path in ["/", "/page/core.js"] {
        let response = ureq::get(&format!("{}{path}", server.url))
            .call()
            .expect(path);
        let csp = response.header("Content-Security-Policy");
        assert_eq!(
            csp,
            Some("default-src 'self'; frame-ancestors 'none'"),
            "{path}"
        );
        assert_eq!(
            response.header("X-Content-Type-Options"),
            Some("nosniff"),
            "{path}"
        );
    }
}

/// Issue 36: `GET /debug/log/stream` follows the global log from its end (what the page's
/// overview watches), or from `after`; an admin read.
#[test]
fn i3_the_global_log_streams_from_its_end_or_a_cursor() {
    let server = TestServer::new();
    let session = server.session();
    let script = json!([{"reply": "ok"}]);
    let before = server.start(&session, json!({"message": "before", "script": script}));
    let before = before["execution_id"].as_str().expect("id").to_owned();
    server.wait_state(&session, &before, "completed");
    let mut after = None;
    let frames = read_frames_after(&server, "/debug/log/stream", ADMIN, None, 1, || {
        let started = server.start(&session, json!({"message": "after", "script": script}));
        after = started["execution_id"].as_str().map(str::to_owned);
    });
    let first = &frames
        .iter()
        .find(|(id, _, _)| id.is_some())
        .expect("an event")
        .2;
    assert_eq!(
        first["execution_id"].as_str(),
        after.as_deref(),
        "{frames:?}"
    );
    assert_eq!(first["type"], "admitted");
    let frames = read_frames(&server, "/debug/log/stream?after=0", ADMIN, None, 1);
    let first = &frames
        .iter()
        .find(|(id, _, _)| id.is_some())
        .expect("an event")
        .2;
    assert_eq!(first["execution_id"], before.as_str());
    assert_eq!(first["position"], 1);
    let (status, _) = server.call("GET", "/debug/log/stream", Some(&session.1), None);
    assert_eq!(status, 401, "an admin read");
    let (status, _) = server.call("GET", "/debug/log/stream?from=end", Some(ADMIN), None);
    assert_eq!(status, 400, "an unknown field");
}

/// I-2: the HTTP reference (`openapi.json`) and the router agree: every route the router
/// serves, with its method, is documented, and every documented one is served. Read from
/// the router's source, where each route is one `.route("PATH", web::METHOD()…)`.
#[test]
fn i2_every_route_the_router_serves_is_in_the_http_reference_and_back() {
    let source = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/http/mod.rs"))
        .expect("the router's source");
    let mut served = std::collections::BTreeSet::new();
    for call in source.split(".route(").skip(1) {
        let mut quoted = call.split('"');
        let (Some(_), Some(path)) = (quoted.next(), quoted.next()) else {
            continue;
        };
        let method = call
            .split("web::")
            .nth(1)
            .and_then(|rest| rest.split("()").next())
            .expect("a method");
        served.insert((path.to_owned(), method.to_owned()));
    }
    assert!(served.len() > 20, "the routes were read: {served:?}");
    let reference: serde_json::Value =
        serde_json::from_str(openprogram::http::OPENAPI_JSON).expect("the reference is JSON");
    let mut documented = std::collections::BTreeSet::new();
    for (path, item) in reference["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("a path item").keys() {
            if method != "parameters" {
                documented.insert((path.clone(), method.clone()));
            }
        }
    }
    let missing: Vec<_> = served.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "served but not in the reference: {missing:?}"
    );
    let stale: Vec<_> = documented.difference(&served).collect();
    assert!(
        stale.is_empty(),
        "in the reference but not served: {stale:?}"
    );
}

/// the page signs in without the admin token in a URL: the one-time link `serve`
/// prints sets a cookie that answers as the admin token (never beside a token), once.
#[test]
fn x2_a_sign_in_link_works_once_and_its_cookie_answers_as_the_admin_token() {
    let mut tokens = None;
    let server = TestServer::with(|api| tokens = Some(api.tokens.clone()));
    let code = tokens.expect("the server's tokens").sign_in().code();
    let agent = ureq::AgentBuilder::new().redirects(0).build();
    let login = format!("{}/login?code={code}", server.url);
    let signed = agent.get(&login).call().expect("signed in");
    assert_eq!(signed.status(), 303);
    assert_eq!(signed.header("Location"), Some("/"));
    let set = signed.header("Set-Cookie").expect("a cookie").to_owned();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    let cookie = set.split(';').next().expect("name=value").to_owned();
    assert!(!cookie.contains(ADMIN), "the admin token is not the cookie");
    let actors = |cookie: &str| {
        agent
            .get(&format!("{}/debug/actors", server.url))
            .set("Cookie", cookie)
            .call()
            .map(|response| response.status())
            .unwrap_or_else(|error| match error {
                ureq::Error::Status(status, _) => status,
                other => panic!("{other}"),
            })
    };
    assert_eq!(
        actors(&cookie),
        200,
        "the cookie answers as the admin token"
    );
    assert_eq!(
        actors("openprogram_admin=1.00"),
        401,
        "only a signed cookie"
    );
    let session = server.session();
    let own = format!("{}/v1/sessions/{}/activity", server.url, session.0);
    let read = agent
        .get(&own)
        .set("Cookie", &cookie)
        .call()
        .expect("any session's");
    assert_eq!(read.status(), 200);
    // A change on the cookie alone: the page's JSON request, never a cross-site form's.
    let sessions = format!("{}/v1/sessions", server.url);
    let post = |kind: &str| {
        let sent = agent
            .post(&sessions)
            .set("Cookie", &cookie)
            .set("Content-Type", kind);
        match sent.send_string("{}") {
            Ok(response) => response.status(),
            Err(ureq::Error::Status(status, _)) => status,
            Err(other) => panic!("{other}"),
        }
    };
    assert_eq!(post("application/json"), 201);
    assert_eq!(post("text/plain"), 401, "a form's body is no sign-in");
    let again = agent.get(&login).call();
    assert!(
        matches!(again, Err(ureq::Error::Status(401, _))),
        "a link works once"
    );
}

/// Issue 55: the recent figures the page charts: a sample at start and every ten seconds, each
/// with the steps so far, the executions in each unfinished state and the Jobs waiting; an
/// admin read.
#[test]
fn i3_recent_figures_are_sampled_for_the_page() {
    let server = TestServer::new();
    // The first sample is taken as the runtime starts; its Jobs come from the queue's answer.
    let deadline = std::time::Instant::now() + crate::support::DEADLINE;
    let figures = loop {
        let (status, figures) = server.call("GET", "/debug/figures", Some(ADMIN), None);
        assert_eq!(status, 200, "{figures}");
        if !figures["samples"][0].is_null() {
            break figures;
        }
        assert!(std::time::Instant::now() < deadline, "no sample: {figures}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(figures["every_ms"], 10_000);
    let first = &figures["samples"][0];
    assert_eq!(first["steps"], 0, "{figures}");
    assert_eq!(first["by_state"]["running"], 0, "{figures}");
    assert_eq!(first["jobs_waiting"], 0, "{figures}");
    assert!(
        first["at_ms"].as_u64().is_some_and(|at| at > 0),
        "{figures}"
    );
    let session = server.session();
    let (status, _) = server.call("GET", "/debug/figures", Some(&session.1), None);
    assert_eq!(status, 401, "an admin read");
}
