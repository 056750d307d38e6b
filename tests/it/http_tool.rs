//! The `http` tool (issue 35): an External effect to the hosts an embedder allowed, against an
//! in-process stub server. What it sent is recorded by the stub; what the runtime recorded is
//! read back from the execution's events.

use std::sync::Arc;
use std::time::{Duration, Instant};

use openprogram::http_tool::HttpTool;
use openprogram::storage::{Event, ExecutionId, ReceiptStatus};
use openprogram::Runtime;
use serde_json::{json, Value};

use crate::model_stub::{Reply, Stub};
use crate::support::*;

/// A runtime whose `http` tool may reach the stub (and nothing else).
fn harness(stub: &Stub, tool: impl FnOnce(HttpTool) -> HttpTool) -> Harness {
    let host = stub.url.trim_start_matches("http://");
    let http = tool(HttpTool::new([host]).expect("the http tool"));
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .tool(Arc::new(http))
        .open()
        .expect("open runtime");
    Harness::with_runtime(runtime, dir)
}

fn http(args: Value) -> Value {
    json!({"tool": "http", "args": args})
}

/// The `http` call's receipt: its effect id, status and output.
fn receipt(harness: &Harness, execution: ExecutionId) -> (String, ReceiptStatus, String) {
    let events = harness.events(execution);
    let dispatched = events.iter().find_map(|envelope| match &envelope.event {
        Event::ToolDispatched {
            effect_id, tool, ..
        } if tool == "http" => Some(*effect_id),
        _ => None,
    });
    let dispatched = dispatched.expect("the http call was dispatched");
    events
        .iter()
        .find_map(|envelope| match &envelope.event {
            Event::ToolFinished {
                effect_id,
                status,
                output,
            } if *effect_id == dispatched => Some((effect_id.to_string(), *status, output.clone())),
            _ => None,
        })
        .expect("the http call has a receipt")
}

/// E-4, R-8: a request carries its effect id as `Idempotency-Key`; its answer, whatever
/// its status, is the confirmed result the model sees.
#[tokio::test]
async fn e4_an_http_call_sends_its_effect_id_and_confirms_the_answer() {
    let stub = Stub::start(vec![Reply::status(
        409,
        &[("x-served-by", "stub")],
        r#"{"error":"exists"}"#,
    )]);
    let harness = harness(&stub, |tool| tool);
    let url = format!("{}/orders?x=1", stub.url);
    let execution = harness
        .start(
            vec![
                http(json!({
                    "method": "post",
                    "url": url,
                    "headers": {"X-Trace": "t1", "Idempotency-Key": "mine"},
                    "body": {"item": 7},
                })),
                reply("done"),
            ],
            None,
        )
        .await;
    harness.wait_for_state(execution, "completed").await;
    let (effect_id, status, output) = receipt(&harness, execution);
    assert_eq!(status, ReceiptStatus::Confirmed, "{output}");
    let output: Value = serde_json::from_str(&output).expect("the output is JSON");
    assert_eq!(output["status"], 409);
    assert_eq!(output["body"], r#"{"error":"exists"}"#);
    assert_eq!(output["headers"]["x-served-by"], "stub");
    assert_eq!(output["truncated"], false);
    let requests = stub.requests();
    assert_eq!(requests.len(), 1);
    let sent = &requests[0];
    assert_eq!(
        (sent.method.as_str(), sent.path.as_str()),
        ("POST", "/orders?x=1")
    );
    assert_eq!(sent.header("idempotency-key"), Some(effect_id.as_str()));
    assert_eq!(sent.header("x-trace"), Some("t1"));
    assert_eq!(sent.header("content-type"), Some("application/json"));
    assert_eq!(sent.body, json!({"item": 7}));
}

/// X-4 (nothing reachable by default): a host off the allow-list, a scheme other than
/// http(s) and bad arguments are failed receipts, and nothing is sent.
#[tokio::test]
async fn e4_a_request_the_tool_refuses_is_failed_and_never_sent() {
    let stub = Stub::start(vec![]);
    let harness = harness(&stub, |tool| tool);
    let port = stub.url.rsplit(':').next().expect("port");
    for (args, expected) in [
        (
            json!({"url": format!("http://localhost:{port}/")}),
            "host_not_allowed",
        ),
        (json!({"url": "http://127.0.0.1:1/"}), "host_not_allowed"),
        (json!({"url": "file:///etc/passwd"}), "only http and https"),
        (
            json!({"url": stub.url, "method": "NOT A METHOD"}),
            "not an HTTP method",
        ),
        (
            json!({"url": stub.url, "headers": {"a": 1}}),
            "must be a string",
        ),
        (json!({"method": "GET"}), "missing string argument `url`"),
        (
            json!({"url": stub.url, "headers": {"Host": "admin.internal"}}),
            "set by the tool",
        ),
        (
            json!({"url": stub.url, "headers": {"Transfer-Encoding": "chunked"}}),
            "set by the tool",
        ),
    ] {
        let execution = harness
            .start(vec![http(args.clone()), reply("done")], None)
            .await;
        harness.wait_for_state(execution, "completed").await;
        let (_, status, output) = receipt(&harness, execution);
        assert_eq!(status, ReceiptStatus::Failed, "{args}: {output}");
        assert!(output.contains(expected), "{args}: {output}");
    }
    assert!(stub.requests().is_empty(), "{:?}", stub.requests());
}

/// E-4: no connection could be made, so nothing was sent: a failed receipt, not an unknown.
#[tokio::test]
async fn e4_a_refused_connection_is_failed() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = closed.local_addr().expect("address");
    drop(closed);
    let dir = tempfile::tempdir().expect("tempdir");
    let tool = HttpTool::new([address.to_string()]).expect("the http tool");
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .tool(Arc::new(tool))
        .open()
        .expect("open runtime");
    let harness = Harness::with_runtime(runtime, dir);
    let url = format!("http://{address}/");
    let execution = harness
        .start(vec![http(json!({"url": url})), reply("done")], None)
        .await;
    harness.wait_for_state(execution, "completed").await;
    let (_, status, output) = receipt(&harness, execution);
    assert_eq!(status, ReceiptStatus::Failed, "{output}");
    assert!(output.contains("not sent"), "{output}");
}

/// A body past the tool's limit is cut, and says so.
#[tokio::test]
async fn e4_a_response_past_the_limit_is_cut() {
    let stub = Stub::start(vec![Reply::status(200, &[], &"x".repeat(10_000))]);
    let harness = harness(&stub, |tool| tool.response_bytes_max(1_000));
    let execution = harness
        .start(vec![http(json!({"url": stub.url})), reply("done")], None)
        .await;
    harness.wait_for_state(execution, "completed").await;
    let (_, status, output) = receipt(&harness, execution);
    assert_eq!(status, ReceiptStatus::Confirmed);
    let output: Value = serde_json::from_str(&output).expect("JSON");
    assert_eq!(output["body"].as_str().map(str::len), Some(1_000));
    assert_eq!(output["truncated"], true);
}

/// R-8: a request that went out and got no answer is `unknown`: the execution waits for
/// reconciliation and the request is never sent again; an operator's `reconcile` resolves
/// it and the turn goes on.
#[tokio::test]
async fn r8_an_http_request_without_an_answer_is_unknown_and_never_sent_again() {
    let stub = Stub::start(vec![Reply::Hold]);
    let harness = harness(&stub, |tool| tool);
    let execution = harness
        .start(
            vec![
                http(json!({"method": "POST", "url": stub.url, "body": "pay", "timeout_ms": 300})),
                reply("done"),
            ],
            None,
        )
        .await;
    let snapshot = harness
        .wait_for_state(execution, "reconciliation_required")
        .await;
    assert!(snapshot.capabilities.contains(&"reconcile"), "{snapshot:?}");
    let (_, status, output) = receipt(&harness, execution);
    assert_eq!(status, ReceiptStatus::Unknown, "{output}");
    assert!(output.contains("may have been sent"), "{output}");
    stub.release();
    let reply = harness
        .send(
            execution,
            json!({"kind": "reconcile", "outcome": "confirmed", "text": "paid, by the ledger"}),
        )
        .await;
    assert_eq!(reply.status, "applied", "{reply:?}");
    harness.wait_for_state(execution, "completed").await;
    assert_eq!(
        stub.requests().len(),
        1,
        "an unknown request is never sent again"
    );
}

/// R-5, R-8: kill -9 of a child `serve` while its `http` call waits for an answer. After the
/// restart the call is `unknown` (it was dispatched): the execution waits for
/// reconciliation, the request is not sent again, and `reconcile` finishes the turn.
#[test]
fn r8_kill9_mid_http_call_leaves_it_unknown_and_never_repeats_it() {
    use crate::served::Served;
    let stub = Stub::start(vec![Reply::Hold]);
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let host = stub.url.trim_start_matches("http://").to_owned();
    let args = ["--http-allow", host.as_str()];
    let token = "http-tool-test-token";
    let served = Served::start(&data, token, &[], &args);
    let (status, session) = served.call("POST", "/v1/sessions", Some(&json!({})));
    assert_eq!(status, 201, "{session}");
    let executions = format!(
        "/v1/sessions/{}/executions",
        session["session_id"].as_str().expect("session id")
    );
    let script = json!([
        {"tool": "http", "args": {"method": "POST", "url": stub.url, "body": "charge 5"}},
        {"reply": "charged"},
    ]);
    let (status, started) = served.call(
        "POST",
        &executions,
        Some(&json!({"message": "charge", "script": script})),
    );
    assert_eq!(status, 201, "{started}");
    let execution = format!(
        "{executions}/{}",
        started["execution_id"].as_str().expect("execution id")
    );
    let sent = stub.wait_requests(1);
    served.kill9();
    stub.release();
    let served = Served::start(&data, token, &[], &args);
    let snapshot = wait_served(&served, &execution, "reconciliation_required");
    let receipts = snapshot["receipts"].as_array().expect("receipts");
    let http = receipts
        .iter()
        .find(|r| r["tool"] == "http")
        .expect("the http call's receipt");
    assert_eq!(http["status"], "unknown", "{snapshot}");
    let effect_id = http["effect_id"].as_str().expect("effect id");
    assert_eq!(sent[0].header("idempotency-key"), Some(effect_id));
    assert_eq!(sent[0].raw, "charge 5");
    let (status, reply) = served.call(
        "POST",
        &format!("{execution}/commands"),
        Some(
            &json!({"command_id": openprogram::storage::CommandId::new(),
            "kind": "reconcile", "outcome": "confirmed", "text": "charged once"}),
        ),
    );
    assert!(status == 200 || status == 202, "{status} {reply}");
    let done = wait_served(&served, &execution, "completed");
    assert_eq!(done["text"], "charged");
    assert_eq!(stub.requests().len(), 1, "the request is never sent again");
    served.stop();
}

fn wait_served(served: &crate::served::Served, execution: &str, state: &str) -> Value {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let (_, snapshot) = served.call("GET", execution, None);
        if snapshot["state"] == state {
            return snapshot;
        }
        assert!(Instant::now() < deadline, "never {state}: {snapshot}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
