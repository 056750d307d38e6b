//! Branches over HTTP (B-2..B-6, K-2, X-1): a session's execution list, its Activity, Fork
//! and Retry as commands, and the session stream with `session_reload`.

use serde_json::{json, Value};

use crate::http::TestServer;
use crate::http_debug::read_frames;

fn command(kind: &str) -> Value {
    json!({"command_id": uuid::Uuid::new_v4().to_string(), "kind": kind})
}

fn counts(activity: &Value) -> (usize, usize, usize) {
    let len = |section: &str| activity[section].as_array().map_or(0, Vec::len);
    (len("needs_attention"), len("in_progress"), len("history"))
}

#[test]
fn b2_k2_the_session_list_activity_and_a_fork_over_http() {
    let server = TestServer::new();
    let session = server.session();
    let first = server.start(
        &session,
        json!({"message": "hi", "script": [{"reply": "hello"}]}),
    );
    let first_id = first["execution_id"].as_str().expect("id").to_owned();
    server.wait_state(&session, &first_id, "completed");
    let activity_path = format!("/v1/sessions/{}/activity", session.0);
    let (status, activity) = server.call("GET", &activity_path, Some(&session.1), None);
    assert_eq!(status, 200, "{activity}");
    assert_eq!(counts(&activity), (0, 0, 1), "{activity}");
    assert_eq!(activity["history"][0]["executions"], 1);
    assert_eq!(activity["history"][0]["details"][0]["request"], "hi");

    let (status, forked) = server.command(&session, &first_id, command("retry"));
    assert_eq!(status, 202, "{forked}");
    let child = forked["execution_id"]
        .as_str()
        .expect("the child's id")
        .to_owned();
    let list_path = format!("/v1/sessions/{}/executions", session.0);
    let (status, list) = server.call("GET", &list_path, Some(&session.1), None);
    assert_eq!(status, 200, "{list}");
    let ids: Vec<&str> = list
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|snapshot| snapshot["execution_id"].as_str())
        .collect();
    assert_eq!(ids.len(), 2, "{list}");
    assert!(ids.contains(&first_id.as_str()) && ids.contains(&child.as_str()));
    let (_, activity) = server.call("GET", &activity_path, Some(&session.1), None);
    assert_eq!(
        counts(&activity),
        (1, 0, 1),
        "the paused child needs Continue: {activity}"
    );

    // Another session's token reaches none of it.
    let other = server.session();
    for path in [&activity_path, &list_path] {
        let (status, _) = server.call("GET", path, Some(&other.1), None);
        assert!(status == 401 || status == 404, "{path}: {status}");
    }
    // A fork at a point that is not a saved point is refused with 409, nothing created.
    let mut refused = command("fork");
    refused["checkpoint"] = json!(9_999);
    let (status, body) = server.command(&session, &first_id, refused);
    assert_eq!(status, 409, "{body}");
    let (_, list) = server.call("GET", &list_path, Some(&session.1), None);
    assert_eq!(list.as_array().map(Vec::len), Some(2));
}

/// B-6 over HTTP: the session stream carries the session's events and a `session_reload`
/// frame right after the terminal outcome, with global positions as resumable ids.
#[test]
fn b6_the_session_stream_emits_session_reload_after_the_terminal_event() {
    let server = TestServer::new();
    let session = server.session();
    let started = server.start(&session, json!({"message": "hi", "script": [{"tool": "echo", "args": {"text": "a"}}, {"reply": "done"}]}));
    let execution = started["execution_id"].as_str().expect("id").to_owned();
    server.wait_state(&session, &execution, "completed");
    let path = format!("/v1/sessions/{}/stream?after=0", session.0);
    let feed = server
        .runtime
        .session_feed(session.0.parse().expect("session"), 0, usize::MAX)
        .expect("feed")
        .entries;
    // Every entry is a frame; the terminal event's frame carries no id (its reload does).
    let frames = read_frames(&server, &path, &session.1, None, feed.len() - 1);
    let reload = frames
        .iter()
        .position(|(_, event, _)| event.as_deref() == Some("session_reload"))
        .expect("a session_reload frame");
    assert_eq!(frames[reload - 1].2["type"], "state_changed", "{frames:?}");
    assert_eq!(frames[reload - 1].0, None, "only the reload carries the id");
    assert_eq!(
        frames[reload].0,
        frames[reload - 1].2["position"].as_u64(),
        "the reload carries the terminal event's position"
    );
    // Resuming from the event before gives the terminal event and its reload: a reconnect
    // between the two never skips the reload.
    let before = frames[reload - 2].0.expect("id").to_string();
    let resumed = read_frames(
        &server,
        &format!("/v1/sessions/{}/stream", session.0),
        &session.1,
        Some(&before),
        1,
    );
    assert_eq!(resumed[0].2["type"], "state_changed");
    assert_eq!(resumed[1].1.as_deref(), Some("session_reload"));
}
