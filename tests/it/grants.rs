//! W-7, approval scopes, through the library on a real store: an approval for a tool answered
//! for the session approves that tool in the session's other executions without a wait, each
//! receipt keeping the grant it ran on; a revoke ends it (also after the granting execution
//! ended), and a grant never reaches another session. The session's record is written in the
//! answer's and the revoke's own transitions, and checked in the one relying on it.

use openprogram::storage::{CommandId, Event, ExecutionId, WaitId};
use openprogram::{Runtime, StartRequest};
use serde_json::{json, Value};

use crate::support::*;

fn guarded(sink: &std::path::Path, line: &str) -> Vec<Value> {
    vec![
        json!({"ask": "append?", "tool": "append"}),
        json!({"tool": "append", "args": {"path": sink, "line": line}}),
        reply("done"),
    ]
}

async fn start(
    runtime: &Runtime,
    session: openprogram::storage::SessionId,
    script: Vec<Value>,
) -> ExecutionId {
    let request = StartRequest {
        message: "append".into(),
        script: elements(script),
        ..Default::default()
    };
    runtime
        .start_execution(session, request)
        .await
        .expect("start")
        .execution_id
}

async fn command(
    harness: &Harness,
    execution: ExecutionId,
    body: Value,
) -> openprogram::CommandReply {
    harness
        .runtime
        .command(harness.session, execution, command_of(body))
        .await
        .expect("command")
}

#[tokio::test]
async fn w7_a_session_grant_approves_the_tool_across_the_session_until_revoked() {
    let harness = Harness::new();
    let dir = tempfile::tempdir().expect("sink");
    let sink = dir.path().join("sink");

    let first = harness.start(guarded(&sink, "a"), None).await;
    let waiting = harness.wait_for_state(first, "waiting").await;
    let grant: WaitId = waiting.waits[0].wait_id;
    assert_eq!(
        waiting.waits[0].request.as_ref().expect("request")["tool"],
        "append"
    );
    let applied = command(
        &harness,
        first,
        json!({"command_id": CommandId::new(), "kind": "answer",
        "wait_id": grant, "answer": "yes", "scope": "session"}),
    )
    .await;
    assert_eq!(applied.status, "applied", "{applied:?}");
    let done = harness.wait_for_state(first, "completed").await;
    assert_eq!(done.grants.len(), 1);
    assert_eq!(
        (done.grants[0].scope, done.grants[0].revoked),
        ("session", false)
    );
    let appended = done
        .receipts
        .iter()
        .find(|receipt| receipt.tool == "append")
        .expect("append");
    assert_eq!(
        appended.grant,
        Some(grant),
        "the receipt keeps its approval"
    );

    // Another execution of the session: no wait; its receipt keeps the grant it ran on.
    let second = start(&harness.runtime, harness.session, guarded(&sink, "b")).await;
    let done = harness.wait_for_state(second, "completed").await;
    assert!(done.waits.is_empty(), "{done:?}");
    let appended = done
        .receipts
        .iter()
        .find(|receipt| receipt.tool == "append")
        .expect("append");
    assert_eq!(appended.grant, Some(grant));
    let used = harness
        .events(second)
        .iter()
        .find_map(|envelope| match &envelope.event {
            Event::GrantUsed {
                grant_id,
                session_version,
                ..
            } => Some((*grant_id, *session_version)),
            _ => None,
        });
    // The record's versions: 1 the first turn's admission (it took the session), 2 the
    // answer (the grant, and the turn running again), 3 the second turn's admission.
    assert_eq!(
        used,
        Some((grant, Some(3))),
        "relied on the session record as the second turn read it"
    );
    let messages = harness
        .runtime
        .messages(
            harness.session,
            &openprogram::MessagesQuery {
                execution: Some(second),
                ..Default::default()
            },
        )
        .expect("messages");
    let blocks = serde_json::to_value(&messages.messages[0].blocks).expect("json");
    assert_eq!(blocks[0]["type"], "grant", "{blocks}");
    assert_eq!(blocks[1]["grant"], json!(grant), "{blocks}");

    // Another session: nothing granted there.
    let other_session = openprogram::storage::SessionId::new();
    let elsewhere = start(&harness.runtime, other_session, guarded(&sink, "c")).await;
    wait_state(&harness.runtime, other_session, elsewhere, "waiting").await;

    // Any execution of the session offers to revoke it; revoked through another than the one
    // that gave it (both ended): nothing approves any more.
    let offered = harness.snapshot(second).await;
    assert!(offered.capabilities.contains(&"revoke"), "{offered:?}");
    assert_eq!(offered.grants[0].granted_by, first);
    let revoked = command(
        &harness,
        second,
        json!({"command_id": CommandId::new(), "kind": "revoke", "grant_id": grant}),
    )
    .await;
    assert_eq!(revoked.status, "applied", "{revoked:?}");
    let after = harness.snapshot(first).await;
    assert!(after.grants[0].revoked);
    assert!(!after.capabilities.contains(&"revoke"));
    let third = start(&harness.runtime, harness.session, guarded(&sink, "d")).await;
    let third = harness.wait_for_state(third, "waiting").await;
    assert_eq!(third.waits[0].status, "open", "a new wait after the revoke");
    // Revoked twice: refused, nothing changes.
    let again = command(
        &harness,
        first,
        json!({"command_id": CommandId::new(), "kind": "revoke",
        "grant_id": grant}),
    )
    .await;
    assert_eq!(
        (again.status, again.code.as_deref()),
        ("rejected", Some("not_available"))
    );
    let lines = std::fs::read_to_string(&sink).expect("sink");
    assert_eq!(
        lines.lines().count(),
        2,
        "a and b ran, c and d wait: {lines}"
    );
}

#[tokio::test]
async fn w7_a_tool_grant_stays_in_its_execution_and_an_operation_answer_approves_one_call() {
    let harness = Harness::new();
    let dir = tempfile::tempdir().expect("sink");
    let sink = dir.path().join("sink");
    let mut script = guarded(&sink, "a");
    script.pop();
    script.extend(guarded(&sink, "b"));
    let execution = harness.start(script, None).await;
    let waiting = harness.wait_for_state(execution, "waiting").await;
    let grant = waiting.waits[0].wait_id;
    command(
        &harness,
        execution,
        json!({"command_id": CommandId::new(), "kind": "answer",
        "wait_id": grant, "answer": "", "scope": "tool"}),
    )
    .await;
    let done = harness.wait_for_state(execution, "completed").await;
    assert_eq!(
        done.waits.len(),
        1,
        "the second append ran on the grant: {done:?}"
    );
    let grants: Vec<_> = done
        .receipts
        .iter()
        .filter_map(|receipt| receipt.grant)
        .collect();
    assert_eq!(grants, [grant, grant]);
    // The session was not granted anything.
    let other = start(&harness.runtime, harness.session, guarded(&sink, "c")).await;
    harness.wait_for_state(other, "waiting").await;
    let snapshot = harness.snapshot(other).await;
    let wait = snapshot.waits[0].wait_id;
    command(
        &harness,
        other,
        json!({"command_id": CommandId::new(), "kind": "answer",
        "wait_id": wait, "answer": "ok"}),
    )
    .await;
    let done = harness.wait_for_state(other, "completed").await;
    assert_eq!(
        done.receipts
            .iter()
            .filter_map(|receipt| receipt.grant)
            .count(),
        1
    );
    assert!(done.grants.is_empty(), "an operation answer grants nothing");
}
