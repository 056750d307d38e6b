//! E-6 against a local stub of each API (`model_stub`): what a provider's errors become —
//! retried after the wait asked for, or not at all; a clear record of a malformed body, a
//! refusal or a filtered response; an API key echoed in an error redacted before it is
//! recorded; and an execution's retries capped by its budget.

use std::time::Duration;

use openprogram::providers::Api;
use serde_json::json;

use crate::model_stub::{openai_text_frames, Reply, Stub};
use crate::providers::{assert_nowhere_in, config, quick_retries, Turn, KEY};

#[tokio::test]
async fn e6_a_429_is_retried_after_the_wait_the_server_asked_for() {
    let stub = Stub::start(vec![
        Reply::status(
            429,
            &[("retry-after-ms", "400")],
            r#"{"error":{"message":"slow down"}}"#,
        ),
        Reply::Stream {
            frames: openai_text_frames(&["fine"]),
            cut: false,
        },
    ]);
    let turn = Turn::open(config(Api::OpenAi, &stub, true));
    let (_, snapshot) = turn.run("hi").await;
    assert_eq!(snapshot.state, "completed", "{snapshot:?}");
    assert_eq!(snapshot.text, "fine");
    let requests = stub.requests();
    assert_eq!(requests.len(), 2);
    let waited = requests[1].at - requests[0].at;
    // The policy's own backoff is at most 5 ms: only the server's 400 ms explains this.
    assert!(
        waited >= Duration::from_millis(400),
        "retried after {waited:?}"
    );
    turn.runtime.shutdown().await;
}

#[tokio::test]
async fn e6_a_500_then_a_success_completes_the_turn() {
    let stub = Stub::start(vec![
        Reply::status(500, &[], r#"{"error":{"message":"internal"}}"#),
        Reply::status(503, &[], "upstream unavailable"),
        Reply::json(&json!({"choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "recovered"}}]})),
    ]);
    let turn = Turn::open(config(Api::OpenAi, &stub, false));
    let (_, snapshot) = turn.run("hi").await;
    assert_eq!(snapshot.state, "completed", "{snapshot:?}");
    assert_eq!(snapshot.text, "recovered");
    assert_eq!(stub.requests().len(), 3);
    turn.runtime.shutdown().await;
}

#[tokio::test]
async fn e6_retries_that_run_out_fail_the_turn_with_the_providers_message() {
    let stub = Stub::start(
        (0..4)
            .map(|_| Reply::status(503, &[], r#"{"error":{"message":"overloaded right now"}}"#))
            .collect(),
    );
    let turn = Turn::open(config(Api::OpenAi, &stub, false));
    let (_, snapshot) = turn.run("hi").await;
    assert_eq!(snapshot.state, "failed", "{snapshot:?}");
    assert!(
        snapshot.text.contains("HTTP 503: overloaded right now")
            && snapshot.text.contains("gave up after 4 tries"),
        "{}",
        snapshot.text
    );
    assert_eq!(stub.requests().len(), 4, "the first try and 3 retries");
    turn.runtime.shutdown().await;
}

#[tokio::test]
async fn e6_a_malformed_body_is_a_clear_error_record_never_retried() {
    let stub = Stub::start(vec![Reply::status(200, &[], "{\"choices\": [oops")]);
    let turn = Turn::open(config(Api::OpenAi, &stub, false));
    let (_, snapshot) = turn.run("hi").await;
    assert_eq!(snapshot.state, "failed", "{snapshot:?}");
    assert!(
        snapshot
            .text
            .starts_with("openai provider: the response is not JSON"),
        "{}",
        snapshot.text
    );
    assert_eq!(stub.requests().len(), 1);
    turn.runtime.shutdown().await;
}

#[tokio::test]
async fn e6_a_bad_request_is_not_retried() {
    let stub = Stub::start(vec![Reply::status(
        400,
        &[],
        r#"{"type":"error","error":{"type":"invalid_request_error","message":"model: unknown"}}"#,
    )]);
    let turn = Turn::open(config(Api::Anthropic, &stub, true));
    let (_, snapshot) = turn.run("hi").await;
    assert_eq!(snapshot.state, "failed", "{snapshot:?}");
    assert_eq!(
        snapshot.text,
        "anthropic provider: HTTP 400: model: unknown"
    );
    assert_eq!(stub.requests().len(), 1);
    turn.runtime.shutdown().await;
}

#[tokio::test]
async fn e6_a_refusal_is_a_response_record_not_a_reply() {
    let stub = Stub::start(vec![Reply::json(&json!({"choices": [{"index": 0,
        "finish_reason": "stop",
        "message": {"role": "assistant", "content": null, "refusal": "I can't help with that."}}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 2}}))]);
    let turn = Turn::open(config(Api::OpenAi, &stub, false));
    let (_, snapshot) = turn.run("hi").await;
    assert_eq!(snapshot.state, "failed", "{snapshot:?}");
    assert_eq!(
        snapshot.text,
        "openai provider: the model refused: I can't help with that."
    );
    // A refusal was paid for too.
    assert_eq!(
        (snapshot.usage.input_tokens, snapshot.usage.output_tokens),
        (9, 2)
    );
    turn.runtime.shutdown().await;
}

/// A gateway that echoes the key in its error body: the execution's error record says
/// `[redacted]`, and no stored byte holds the key.
#[tokio::test]
async fn e6_a_key_echoed_in_an_error_is_redacted_before_it_is_recorded() {
    let stub = Stub::start(vec![Reply::status(
        401,
        &[],
        &format!(r#"{{"error":{{"message":"invalid key: Bearer {KEY}"}}}}"#),
    )]);
    let turn = Turn::open(config(Api::OpenAi, &stub, true));
    let (_, snapshot) = turn.run("hi").await;
    assert_eq!(snapshot.state, "failed", "{snapshot:?}");
    assert_eq!(
        snapshot.text,
        "openai provider: HTTP 401: invalid key: Bearer [redacted]"
    );
    turn.runtime.shutdown().await;
    assert_nowhere_in(turn.dir.path(), KEY);
}

/// A response cut short by the model's side (a content filter) is an error record, never a
/// reply; a whole JSON body sent for a streamed request is read as JSON.
#[tokio::test]
async fn e6_a_filtered_response_fails_and_a_json_answer_to_a_stream_is_read() {
    let stub = Stub::start(vec![
        Reply::json(&json!({"choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "plain JSON"}}]})),
        Reply::json(
            &json!({"choices": [{"index": 0, "finish_reason": "content_filter",
            "message": {"role": "assistant", "content": "Part of"}}]}),
        ),
    ]);
    let turn = Turn::open(config(Api::OpenAi, &stub, true));
    let (_, snapshot) = turn.run("one").await;
    assert_eq!(snapshot.state, "completed", "{snapshot:?}");
    assert_eq!(snapshot.text, "plain JSON");
    let (_, snapshot) = turn.run("two").await;
    assert_eq!(snapshot.state, "failed", "{snapshot:?}");
    assert!(
        snapshot.text.starts_with(
            "openai provider: the response stopped before it was complete (content_filter"
        ),
        "{}",
        snapshot.text
    );
    turn.runtime.shutdown().await;
}

/// E-6: an execution's model calls share one retry budget: retries spent by an earlier call
/// are charged, and a later call gives up when the budget is spent even though its own
/// per-request allowance is not.
#[tokio::test]
async fn e6_an_executions_retries_are_capped_by_its_budget() {
    let busy = || Reply::status(503, &[], r#"{"error":{"message":"busy"}}"#);
    let stub = Stub::start(vec![
        busy(),
        busy(),
        Reply::json(
            &json!({"choices": [{"index": 0, "finish_reason": "tool_calls",
            "message": {"role": "assistant", "content": null,
                "tool_calls": [{"id": "x", "type": "function",
                    "function": {"name": "echo", "arguments": "{\"text\":\"a\"}"}}]}}]}),
        ),
        busy(),
        busy(),
        busy(),
        busy(),
    ]);
    let mut policy = quick_retries(3);
    policy.execution_retries = 4;
    let turn = Turn::open(config(Api::OpenAi, &stub, false).retry(policy));
    let (_, snapshot) = turn.run("echo a").await;
    assert_eq!(snapshot.state, "failed", "{snapshot:?}");
    assert!(
        snapshot
            .text
            .contains("the execution's retry budget of 4 is spent"),
        "{}",
        snapshot.text
    );
    assert_eq!(snapshot.usage.retries, 4);
    // 3 tries for the first decision, 3 for the second (its own allowance would give 4).
    assert_eq!(stub.requests().len(), 6);
    turn.runtime.shutdown().await;
}
