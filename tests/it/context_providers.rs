//! E-8 on the wire: a second turn's request to the OpenAI and Anthropic stubs carries the
//! first turn — its user message, the tool call, the result, the reply — in order, tool-call
//! ids paired across the turns, then "continue".

use openprogram::providers::Api;
use openprogram::storage::MessageId;
use openprogram::StartRequest;
use serde_json::{json, Value};

use crate::model_stub::{Reply, Stub};
use crate::providers::{config, serve_on_stub, Turn};

/// Runs `message` answering `parent` to its end; its reply message id.
async fn run(turn: &Turn, message: &str, parent: Option<MessageId>) -> MessageId {
    let started = turn
        .runtime
        .start_execution(
            turn.session,
            StartRequest {
                message: message.into(),
                parent_message_id: parent,
                ..Default::default()
            },
        )
        .await
        .expect("start");
    let done = crate::support::wait_state(
        &turn.runtime,
        turn.session,
        started.execution_id,
        "completed",
    )
    .await;
    assert_eq!(done.state, "completed", "{done:?}");
    started.reply_message_id
}

/// The three replies of both turns, in `api`'s format: a call of `echo`, the first turn's
/// reply, the second turn's.
fn replies(api: Api) -> Vec<Reply> {
    match api {
        Api::OpenAi => {
            let message = |message: Value, finish: &str| {
                Reply::json(&json!({
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 3},
                }))
            };
            vec![
                message(
                    json!({"role": "assistant", "content": null, "tool_calls": [{"id": "x1",
                        "type": "function", "function": {"name": "echo",
                        "arguments": "{\"text\":\"a.log\"}"}}]}),
                    "tool_calls",
                ),
                message(
                    json!({"role": "assistant", "content": "a.log it is."}),
                    "stop",
                ),
                message(json!({"role": "assistant", "content": "Deleted."}), "stop"),
            ]
        }
        Api::Anthropic => {
            let message = |content: Value, stop: &str| {
                Reply::json(&json!({
                    "type": "message", "role": "assistant", "stop_reason": stop,
                    "content": content,
                    "usage": {"input_tokens": 10, "output_tokens": 3},
                }))
            };
            vec![
                message(
                    json!([{"type": "tool_use", "id": "toolu_1", "name": "echo",
                        "input": {"text": "a.log"}}]),
                    "tool_use",
                ),
                message(
                    json!([{"type": "text", "text": "a.log it is."}]),
                    "end_turn",
                ),
                message(json!([{"type": "text", "text": "Deleted."}]), "end_turn"),
            ]
        }
    }
}

async fn second_request(api: Api) -> Vec<Value> {
    let stub = Stub::start(replies(api));
    let turn = Turn::open(config(api, &stub, false));
    let first = run(&turn, "Find the largest file", None).await;
    run(&turn, "continue", Some(first)).await;
    let requests = stub.requests();
    assert_eq!(requests.len(), 3);
    turn.runtime.shutdown().await;
    requests[2].body["messages"]
        .as_array()
        .expect("messages")
        .clone()
}

#[tokio::test]
async fn e8_openai_the_second_turn_carries_the_first() {
    let messages = second_request(Api::OpenAi).await;
    assert_eq!(
        messages,
        vec![
            json!({"role": "user", "content": "Find the largest file"}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call00001",
                "type": "function", "function": {"name": "echo",
                "arguments": "{\"text\":\"a.log\"}"}}]}),
            json!({"role": "tool", "tool_call_id": "call00001", "content": "a.log"}),
            json!({"role": "assistant", "content": "a.log it is."}),
            json!({"role": "user", "content": "continue"}),
        ]
    );
}

#[tokio::test]
async fn e8_anthropic_the_second_turn_carries_the_first() {
    let messages = second_request(Api::Anthropic).await;
    assert_eq!(
        messages,
        vec![
            json!({"role": "user", "content": [{"type": "text", "text": "Find the largest file"}]}),
            json!({"role": "assistant", "content": [{"type": "tool_use", "id": "call00001",
                "name": "echo", "input": {"text": "a.log"}}]}),
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call00001",
                "content": "a.log", "is_error": false}]}),
            json!({"role": "assistant", "content": [{"type": "text", "text": "a.log it is."}]}),
            json!({"role": "user", "content": [{"type": "text", "text": "continue"}]}),
        ]
    );
}

/// E-8 with a real process: `serve --provider openai` killed with SIGKILL while turn 3 of a
/// three-turn conversation waits for its second model response (its tool call committed).
/// After the restart the request is made again, byte for byte the one before — turns 1 and
/// 2, then turn 3's message, call and result — and the committed call is not run again.
#[test]
fn e8_kill9_mid_turn_3_regenerates_the_same_request_byte_for_byte() {
    use crate::model_stub::{openai_text_frames, openai_tool_call_frames};
    use crate::served::Served;
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let text = |pieces: &[&str]| Reply::Stream {
        frames: openai_text_frames(pieces),
        cut: false,
    };
    let call = |arguments: &str| Reply::Stream {
        frames: openai_tool_call_frames("echo", arguments),
        cut: false,
    };
    let mut half = openai_text_frames(&["Half ", "of it"]);
    half.truncate(1);
    let stub = Stub::start(vec![
        call(r#"{"text":"a.log"}"#),
        text(&["a.log is ", "the largest."]),
        text(&["b.log is second."]),
        call(r#"{"text":"rm b.log"}"#),
        Reply::StreamHeld { frames: half },
        text(&["Deleted ", "b.log."]),
    ]);
    let token = "context-test-token";
    let served = serve_on_stub(&data, token, &stub);
    let (status, session) = served.call("POST", "/v1/sessions", Some(&json!({})));
    assert_eq!(status, 201, "{session}");
    let executions = format!(
        "/v1/sessions/{}/executions",
        session["session_id"].as_str().expect("session id")
    );
    let start = |served: &Served, message: &str, parent: &Value| {
        let body = json!({"message": message, "parent_message_id": parent});
        let (status, started) = served.call("POST", &executions, Some(&body));
        assert_eq!(status, 201, "{started}");
        started
    };
    let state_of = |served: &Served, started: &Value| {
        let path = format!(
            "{executions}/{}",
            started["execution_id"].as_str().expect("id")
        );
        served.call("GET", &path, None).1
    };
    let finish = |served: &Served, started: &Value| {
        let deadline = std::time::Instant::now() + crate::support::DEADLINE;
        loop {
            let snapshot = state_of(served, started);
            if snapshot["state"] == "completed" {
                return snapshot;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "not completed: {snapshot}"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };
    let first = start(&served, "Find the largest files", &Value::Null);
    finish(&served, &first);
    let second = start(&served, "And the second?", &first["reply_message_id"]);
    finish(&served, &second);
    let third = start(&served, "Delete it", &second["reply_message_id"]);
    stub.wait_requests(5);
    served.kill9();
    stub.release();
    let served = serve_on_stub(&data, token, &stub);
    let done = finish(&served, &third);
    assert_eq!(done["text"], "Deleted b.log.");
    let requests = stub.requests();
    assert_eq!(requests.len(), 6, "the request is made again once");
    assert_eq!(
        requests[4].bytes, requests[5].bytes,
        "the regenerated request differs from the one before the crash"
    );
    let messages = requests[5].body["messages"].as_array().expect("messages");
    let roles: Vec<&str> = messages
        .iter()
        .map(|message| message["role"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        roles,
        [
            "user",
            "assistant",
            "tool",
            "assistant",
            "user",
            "assistant",
            "user",
            "assistant",
            "tool"
        ]
    );
    assert_eq!(messages[8]["tool_call_id"], "call00002");
    let receipts = done["receipts"].as_array().expect("receipts");
    let calls = receipts
        .iter()
        .filter(|receipt| receipt["tool"] == "echo")
        .count();
    assert_eq!(calls, 1, "the committed call ran again: {receipts:?}");
    served.stop();
}

/// Opens a runtime on `stub` whose sessions the model names.
fn named_by_model(stub: &Stub) -> (openprogram::Runtime, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let provider: std::sync::Arc<dyn openprogram::agent::Provider> = std::sync::Arc::new(
        openprogram::providers::HttpProvider::new(config(Api::OpenAi, stub, false))
            .expect("provider"),
    );
    let runtime = openprogram::Runtime::builder()
        .data_dir(dir.path())
        .provider(provider.clone())
        .session_namer(std::sync::Arc::new(openprogram::ModelNamer::new(provider)))
        .open()
        .expect("open");
    (runtime, dir)
}

/// The session's name once the naming hook gave one.
async fn name_of(
    runtime: &openprogram::Runtime,
    session: openprogram::storage::SessionId,
) -> String {
    let deadline = std::time::Instant::now() + crate::support::DEADLINE;
    loop {
        if let Some(name) = runtime.session(session).expect("session").name {
            return name;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the session was never named"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

fn openai_text(text: &str) -> Reply {
    Reply::json(&json!({
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
            "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3},
    }))
}

#[tokio::test]
async fn e8_the_model_names_a_session_and_a_failure_leaves_its_first_words() {
    let stub = Stub::start(vec![
        openai_text("a.log is the largest."),
        openai_text("\"Largest log files\""),
    ]);
    let (runtime, _dir) = named_by_model(&stub);
    let session = openprogram::storage::SessionId::new();
    let turn = Turn {
        runtime,
        session,
        dir: tempfile::tempdir().expect("tempdir"),
    };
    run(&turn, "Find the largest files in /var/log", None).await;
    assert_eq!(name_of(&turn.runtime, session).await, "Largest log files");
    let asked = &stub.requests()[1].body["messages"];
    let asked = asked.to_string();
    assert!(
        asked.contains("short title") && asked.contains("a.log is the largest."),
        "{asked}"
    );
    turn.runtime.shutdown().await;

    let failing = Stub::start(vec![
        openai_text("a.log is the largest."),
        Reply::status(400, &[], r#"{"error":{"message":"no"}}"#),
    ]);
    let (runtime, _dir) = named_by_model(&failing);
    let turn = Turn {
        runtime,
        session,
        dir: tempfile::tempdir().expect("tempdir"),
    };
    run(&turn, "Find the largest files in /var/log", None).await;
    assert_eq!(
        name_of(&turn.runtime, session).await,
        "Find the largest files in /var/log"
    );
    turn.runtime.shutdown().await;
}
