//! C-1: the transcript read model through the library and HTTP — messages on the
//! conversation graph, built from the event log: each assistant message with its reasoning,
//! text, tool calls and receipts, steps, steering where it arrived, and the waits it opened
//! with their outcome; paged; by branch (a fork reads right on both); changes by cursor.

use openprogram::storage::{CommandId, ExecutionId, MessageId};
use openprogram::{Message, MessagesPage, MessagesQuery, StartRequest};
use serde_json::{json, Value};

use crate::support::*;

fn page(harness: &Harness, query: MessagesQuery) -> MessagesPage {
    harness
        .runtime
        .messages(harness.session, &query)
        .expect("messages")
}

fn blocks(message: &Message) -> Vec<Value> {
    message
        .blocks
        .iter()
        .map(|block| serde_json::to_value(block).expect("json"))
        .collect()
}

async fn command(harness: &Harness, execution: ExecutionId, body: Value) {
    let reply = harness
        .runtime
        .command(harness.session, execution, command_of(body))
        .await
        .expect("command");
    assert_eq!(reply.status, "applied", "{reply:?}");
}

#[tokio::test]
async fn c1_an_assistant_message_holds_what_the_turn_produced_in_order() {
    let harness = Harness::new();
    let script = vec![
        json!({"tool": "echo", "args": {"text": "a"}, "text": "Looking.", "reasoning": ["think 1", "think 2"]}),
        json!({"question": "Which?", "items": [{"id": "pick", "type": "choice", "options": ["x", "y"]}]}),
        json!({"tool": "echo", "args": {"text": "b"}}),
        json!({"reply": "done", "reasoning": ["last thought"]}),
    ];
    let execution = harness.start(script, None).await;
    let waiting = harness.wait_for_state(execution, "waiting").await;
    let wait_id = waiting.waits[0].wait_id;
    command(
        &harness,
        execution,
        json!({"command_id": CommandId::new(), "kind": "steer", "text": "be brief"}),
    )
    .await;
    command(
        &harness,
        execution,
        json!({"command_id": CommandId::new(), "kind": "answer",
        "wait_id": wait_id, "answer": {"pick": "y"}}),
    )
    .await;
    harness.wait_for_state(execution, "completed").await;

    let read = page(&harness, MessagesQuery::default());
    assert_eq!(read.messages.len(), 2, "{read:#?}");
    let (user, assistant) = (&read.messages[0], &read.messages[1]);
    assert_eq!((user.role, user.text.as_str()), ("user", "test"));
    assert_eq!(assistant.role, "assistant");
    assert_eq!(assistant.parent_id, Some(user.message_id));
    assert_eq!(assistant.state, Some("completed"));
    assert_eq!(assistant.text, "done\n[steer] be brief");
    let kinds: Vec<String> = blocks(assistant)
        .iter()
        .map(|block| block["type"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(
        kinds,
        [
            "reasoning",
            "reasoning",
            "text",
            "tool_call",
            "wait",
            "steer",
            "tool_call",
            "reasoning"
        ],
        "{:#?}",
        blocks(assistant)
    );
    let all = blocks(assistant);
    assert_eq!(all[2]["text"], "Looking.");
    assert_eq!(all[3]["tool"], "echo");
    assert_eq!(all[3]["receipt"]["status"], "confirmed");
    assert_eq!(all[4]["kind"], "question");
    assert_eq!(all[4]["status"], "answered");
    assert_eq!(all[4]["answer"], r#"{"pick":"y"}"#);
    assert_eq!(all[4]["request"]["items"][0]["id"], "pick");
    assert_eq!(all[5]["text"], "be brief", "the steer where it arrived");
    assert_eq!(all[6]["args"]["text"], "b");
    assert_eq!(all[7]["text"], "last thought");
    let seqs: Vec<u64> = all
        .iter()
        .map(|block| block["seq"].as_u64().expect("seq"))
        .collect();
    assert!(
        seqs.windows(2).all(|pair| pair[0] <= pair[1]),
        "in log order: {seqs:?}"
    );
}

#[tokio::test]
async fn c1_pages_follow_the_graph_and_changes_come_by_cursor() {
    let harness = Harness::new();
    let mut parent: Option<MessageId> = None;
    let mut executions = Vec::new();
    for turn in 0..5 {
        let request = StartRequest {
            message: format!("turn {turn}"),
            parent_message_id: parent,
            script: elements(vec![reply(&format!("answer {turn}"))]),
            ..Default::default()
        };
        let started = harness
            .runtime
            .start_execution(harness.session, request)
            .await
            .expect("start");
        let execution = started.execution_id;
        let done = harness.wait_for_state(execution, "completed").await;
        parent = Some(done.reply_message_id);
        executions.push(execution);
    }
    let mut read = Vec::new();
    let mut after = None;
    loop {
        let next = page(
            &harness,
            MessagesQuery {
                after,
                limit: Some(2),
                ..Default::default()
            },
        );
        assert!(next.messages.len() <= 4);
        read.extend(next.messages);
        match next.next {
            Some(cursor) => after = Some(cursor),
            None => break,
        }
    }
    let texts: Vec<&str> = read.iter().map(|message| message.text.as_str()).collect();
    let expected: Vec<String> = (0..5)
        .flat_map(|turn| [format!("turn {turn}"), format!("answer {turn}")])
        .collect();
    assert_eq!(texts, expected);
    for pair in read.windows(2) {
        assert_eq!(
            pair[1].parent_id,
            Some(pair[0].message_id),
            "one chain of messages"
        );
    }
    // Changes after a cursor: nothing new, then the one turn that moved.
    let since = page(
        &harness,
        MessagesQuery {
            changed_after: Some(0),
            ..Default::default()
        },
    );
    let cursor = since.changed_through.expect("a cursor");
    assert_eq!(since.messages.len(), 10);
    let quiet = page(
        &harness,
        MessagesQuery {
            changed_after: Some(cursor),
            ..Default::default()
        },
    );
    assert!(quiet.messages.is_empty());
    let request = StartRequest {
        message: "turn 5".into(),
        parent_message_id: parent,
        script: elements(vec![reply("answer 5")]),
        ..Default::default()
    };
    let started = harness
        .runtime
        .start_execution(harness.session, request)
        .await
        .expect("start");
    harness
        .wait_for_state(started.execution_id, "completed")
        .await;
    let moved = page(
        &harness,
        MessagesQuery {
            changed_after: Some(cursor),
            ..Default::default()
        },
    );
    let texts: Vec<&str> = moved
        .messages
        .iter()
        .map(|message| message.text.as_str())
        .collect();
    assert_eq!(texts, ["turn 5", "answer 5"]);
    // A cursor that is not on the transcript, and a branch that is not there.
    let stranger = harness.runtime.messages(
        harness.session,
        &MessagesQuery {
            after: Some(ExecutionId::new()),
            ..Default::default()
        },
    );
    assert!(
        matches!(stranger, Err(openprogram::Error::InvalidRequest(_))),
        "{stranger:?}"
    );
    let nowhere = harness.runtime.messages(
        harness.session,
        &MessagesQuery {
            branch: Some(MessageId::new()),
            ..Default::default()
        },
    );
    assert!(
        matches!(nowhere, Err(openprogram::Error::NotFound)),
        "{nowhere:?}"
    );
}

#[tokio::test]
async fn c1_a_fork_reads_right_on_both_branches() {
    let harness = Harness::new();
    let original = harness
        .start(vec![echo("a"), echo("b"), reply("original")], None)
        .await;
    harness.wait_for_state(original, "completed").await;
    let checkpoints: Vec<u64> = harness
        .events(original)
        .iter()
        .filter(|envelope| {
            matches!(
                envelope.event,
                openprogram::storage::Event::CheckpointPublished { .. }
            )
        })
        .map(|envelope| envelope.seq)
        .collect();
    // The checkpoint whose next step is the call of `b`: the fork runs it and replies.
    let reply = harness
        .runtime
        .command(
            harness.session,
            original,
            command_of(json!({"command_id": CommandId::new(), "kind": "fork", "checkpoint": checkpoints[2]})),
        )
        .await
        .expect("fork");
    let child = reply.execution_id.expect("child");
    command(
        &harness,
        child,
        json!({"command_id": CommandId::new(), "kind": "continue"}),
    )
    .await;
    harness.wait_for_state(child, "completed").await;

    let activity = harness.runtime.activity(harness.session).expect("activity");
    let branches: Vec<_> = activity.history.iter().map(|row| row.branch_id).collect();
    assert_eq!(branches.len(), 2, "{activity:#?}");
    let whole = page(&harness, MessagesQuery::default());
    let roles: Vec<&str> = whole.messages.iter().map(|message| message.role).collect();
    assert_eq!(
        roles,
        ["user", "assistant", "assistant"],
        "the user message once"
    );
    let mut seen = Vec::new();
    for branch in branches {
        let read = page(
            &harness,
            MessagesQuery {
                branch: Some(branch),
                ..Default::default()
            },
        );
        assert_eq!(read.messages.len(), 2, "{read:#?}");
        assert_eq!(read.messages[0].text, "test");
        let assistant = &read.messages[1];
        let calls: Vec<String> = blocks(assistant)
            .iter()
            .filter(|block| block["type"] == "tool_call")
            .map(|block| {
                let inherited = if block["inherited"] == true {
                    " inherited"
                } else {
                    ""
                };
                format!(
                    "{}{inherited} {}",
                    block["args"]["text"], block["receipt"]["status"]
                )
            })
            .collect();
        seen.push((
            assistant.execution_id,
            calls,
            assistant.forked_from.is_some(),
        ));
    }
    seen.sort_by_key(|(execution, ..)| *execution == child);
    assert_eq!(seen[0].0, original);
    assert_eq!(seen[0].1, [r#""a" "confirmed""#, r#""b" "confirmed""#]);
    assert!(!seen[0].2);
    assert_eq!(seen[1].0, child);
    // The original decided both calls before the fork's checkpoint; the fork ran `b` itself.
    assert_eq!(
        seen[1].1,
        [
            r#""a" inherited "confirmed""#,
            r#""b" inherited "confirmed""#
        ]
    );
    assert!(seen[1].2);
}

#[tokio::test]
async fn c1_a_long_turn_is_read_on_from_where_a_message_stops() {
    let harness = Harness::new();
    let mut script: Vec<Value> = (0..700).map(|n| echo(&n.to_string())).collect();
    script.push(reply("long"));
    let execution = harness.start(script, Some(800)).await;
    harness.wait_for_state(execution, "completed").await;
    let first = page(&harness, MessagesQuery::default());
    let assistant = &first.messages[1];
    let after = assistant.more_after_seq.expect("more to read");
    let mut calls = assistant.blocks.len();
    let mut from = after;
    loop {
        let more = page(
            &harness,
            MessagesQuery {
                execution: Some(execution),
                after_seq: from,
                ..Default::default()
            },
        );
        let message = &more.messages[0];
        calls += message.blocks.len();
        match message.more_after_seq {
            Some(next) => from = next,
            None => {
                assert_eq!(message.text, "long");
                break;
            }
        }
    }
    assert_eq!(calls, 700, "every tool call, once");
}

#[test]
fn c1_messages_over_http_refuse_unknown_fields_and_bad_ids() {
    let app = crate::http::TestServer::new();
    let session = app.session();
    let started = app.start(
        &session,
        json!({"kind": "agent", "message": "hello", "script": [{"reply": "hi"}]}),
    );
    let execution = started["execution_id"].as_str().expect("id").to_owned();
    app.wait_for(&session, &execution, "completed", |s: &Value| {
        s["state"] == "completed"
    });
    let path = format!("/v1/sessions/{}/messages", session.0);
    let (status, body) = app.call("GET", &path, Some(&session.1), None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["messages"][0]["text"], "hello");
    assert_eq!(body["messages"][1]["text"], "hi");
    assert_eq!(body["next"], Value::Null);
    let (status, body) = app.call("GET", &format!("{path}?colour=red"), Some(&session.1), None);
    assert_eq!(status, 400, "{body}");
    let (status, body) = app.call("GET", &format!("{path}?after=nope"), Some(&session.1), None);
    assert_eq!(
        (status, body["code"].as_str()),
        (400, Some("invalid_request")),
        "{body}"
    );
    let other = app.session();
    let (status, _) = app.call("GET", &path, Some(&other.1), None);
    assert_eq!(
        status, 401,
        "another session's token reads nothing of it (X-1)"
    );
}

#[tokio::test]
async fn c1_a_functions_steps_and_its_ask_are_blocks_of_its_message() {
    let harness = Harness::new();
    let dir = tempfile::tempdir().expect("sink");
    let started = harness
        .runtime
        .start_function(
            harness.session,
            openprogram::FunctionStart {
                function: "steps".into(),
                input: json!({"count": 2, "path": dir.path().join("sink"), "ask_at": 2}),
                ..Default::default()
            },
        )
        .await
        .expect("start");
    let execution = started.started.execution_id;
    let waiting = harness.wait_for_state(execution, "waiting").await;
    command(
        &harness,
        execution,
        json!({"command_id": CommandId::new(), "kind": "answer",
        "wait_id": waiting.waits[0].wait_id, "answer": "yes"}),
    )
    .await;
    harness.wait_for_state(execution, "completed").await;
    let read = page(&harness, MessagesQuery::default());
    assert!(
        read.messages[0].text.starts_with("steps {"),
        "{:?}",
        read.messages[0].text
    );
    let summary: Vec<String> = blocks(&read.messages[1])
        .iter()
        .map(|block| match block["type"].as_str() {
            Some("step") => format!("step {} {}", block["step_id"], block["receipt"]["status"]),
            Some("wait") => format!("wait {}", block["status"]),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        summary,
        [
            r#"step "t1" "confirmed""#,
            r#"wait "answered""#,
            r#"step "t2" "confirmed""#
        ]
    );
}
