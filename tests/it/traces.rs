//! I-5, issue 36: `serve --otlp-endpoint` exports the runtime's spans — execution, attempt,
//! step, model call, tool call, commit — to an OTLP/HTTP collector (an in-process stub that
//! decodes the protobuf), each with its ids and its parent; `--log-format json` logs one
//! JSON object per line.

use std::collections::HashMap;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use prost::Message as _;
use serde_json::json;

use crate::model_stub::{Reply, Stub};
use crate::served::{stderr_path, Served};

/// A span as the collector got it.
#[derive(Debug)]
struct Span {
    name: String,
    id: Vec<u8>,
    parent: Vec<u8>,
    trace: Vec<u8>,
    attributes: HashMap<String, String>,
}

fn spans(stub: &Stub) -> Vec<Span> {
    let mut spans = Vec::new();
    for request in stub.requests() {
        assert_eq!(request.path, "/v1/traces");
        assert_eq!(
            request.header("content-type"),
            Some("application/x-protobuf")
        );
        let export = ExportTraceServiceRequest::decode(request.bytes.as_slice())
            .expect("an OTLP export request");
        for resource in export.resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|resource| &resource.attributes)
                .find(|attribute| attribute.key == "service.name")
                .and_then(|attribute| attribute.value.as_ref()?.value.clone());
            assert_eq!(service, Some(Any::StringValue("openprogram".into())));
            for scope in resource.scope_spans {
                for span in scope.spans {
                    let attributes = span
                        .attributes
                        .iter()
                        .filter_map(|attribute| {
                            let value = match attribute.value.as_ref()?.value.as_ref()? {
                                Any::StringValue(text) => text.clone(),
                                Any::IntValue(number) => number.to_string(),
                                other => format!("{other:?}"),
                            };
                            Some((attribute.key.clone(), value))
                        })
                        .collect();
                    spans.push(Span {
                        name: span.name,
                        id: span.span_id,
                        parent: span.parent_span_id,
                        trace: span.trace_id,
                        attributes,
                    });
                }
            }
        }
    }
    spans
}

#[test]
fn i5_spans_reach_a_collector_with_their_ids_and_parents() {
    let collector = Stub::start(vec![Reply::status(200, &[], ""); 64]);
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let token = "traces-test-token";
    let served = Served::start_with_env(
        &data,
        token,
        &[],
        &["--otlp-endpoint", &collector.url, "--log-format", "json"],
        &[("RUST_LOG", "info")],
    );
    let (status, session) = served.call("POST", "/v1/sessions", Some(&json!({})));
    assert_eq!(status, 201, "{session}");
    let executions = format!(
        "/v1/sessions/{}/executions",
        session["session_id"].as_str().expect("session id")
    );
    let script = json!([{"tool": "echo", "args": {"text": "hi"}}, {"reply": "done"}]);
    let (status, started) = served.call(
        "POST",
        &executions,
        Some(&json!({"message": "m", "script": script})),
    );
    assert_eq!(status, 201, "{started}");
    let execution_id = started["execution_id"].as_str().expect("id").to_owned();
    let execution = format!("{executions}/{execution_id}");
    let deadline = std::time::Instant::now() + crate::support::DEADLINE;
    while served.call("GET", &execution, None).1["state"] != "completed" {
        assert!(std::time::Instant::now() < deadline, "never completed");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    // An orderly stop flushes the spans still buffered.
    served.stop();

    let all = spans(&collector);
    let mine: Vec<&Span> = all
        .iter()
        .filter(|span| span.attributes.get("execution_id") == Some(&execution_id))
        .collect();
    let named = |name: &str| -> Vec<&Span> {
        mine.iter()
            .copied()
            .filter(|span| span.name == name)
            .collect()
    };
    let by_id: HashMap<&[u8], &Span> = mine
        .iter()
        .map(|span| (span.id.as_slice(), *span))
        .collect();
    let parent = |span: &Span| {
        by_id
            .get(span.parent.as_slice())
            .map(|parent| parent.name.as_str())
    };
    let executions = named("execution");
    assert_eq!(executions.len(), 1, "{mine:#?}");
    assert!(
        executions[0].parent.is_empty(),
        "an execution is a root span"
    );
    let attempts = named("attempt");
    assert_eq!(attempts.len(), 1);
    assert_eq!(parent(attempts[0]), Some("execution"));
    let attempt_id = attempts[0]
        .attributes
        .get("attempt_id")
        .expect("attempt_id");
    // Two decisions and one tool call, each a step of the attempt.
    let steps = named("step");
    assert_eq!(steps.len(), 3, "{mine:#?}");
    assert!(steps.iter().all(|span| parent(span) == Some("attempt")));
    let model_calls = named("model_call");
    assert_eq!(model_calls.len(), 2);
    assert!(model_calls.iter().all(|span| parent(span) == Some("step")));
    let tool_calls = named("tool_call");
    assert_eq!(tool_calls.len(), 1);
    assert_eq!(parent(tool_calls[0]), Some("step"));
    assert_eq!(
        tool_calls[0].attributes.get("tool").map(String::as_str),
        Some("echo")
    );
    // Each step's result is committed inside the step.
    let commits = named("commit");
    assert!(
        commits
            .iter()
            .filter(|span| parent(span) == Some("step"))
            .count()
            >= 3,
        "{commits:#?}"
    );
    assert!(commits
        .iter()
        .all(|span| matches!(parent(span), Some("step" | "attempt"))));
    for span in &mine {
        assert_eq!(
            span.attributes.get("attempt_id"),
            Some(attempt_id),
            "{span:?}"
        );
        assert_eq!(
            span.trace, executions[0].trace,
            "one trace per execution: {span:?}"
        );
    }
    // Every log line is a JSON object, the progress lines too.
    let logged = std::fs::read_to_string(stderr_path(&data)).expect("the log");
    assert!(logged.contains("runtime on"), "{logged}");
    for line in logged.lines() {
        let parsed: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|error| panic!("{error}: {line}"));
        assert!(parsed["level"].is_string(), "{line}");
    }
}

/// `--otlp-sample 0` exports no execution's spans (the sampler decides per execution);
/// a share outside 0..1 is a usage error.
#[test]
fn i5_a_sample_of_zero_exports_no_execution() {
    let collector = Stub::start(vec![Reply::status(200, &[], ""); 16]);
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let served = Served::start(
        &data,
        "traces-test-token",
        &[],
        &["--otlp-endpoint", &collector.url, "--otlp-sample", "0"],
    );
    let (_, session) = served.call("POST", "/v1/sessions", Some(&json!({})));
    let executions = format!(
        "/v1/sessions/{}/executions",
        session["session_id"].as_str().expect("session id")
    );
    let (status, started) = served.call(
        "POST",
        &executions,
        Some(&json!({"message": "m", "script": [{"reply": "done"}]})),
    );
    assert_eq!(status, 201, "{started}");
    let execution = format!(
        "{executions}/{}",
        started["execution_id"].as_str().expect("id")
    );
    let deadline = std::time::Instant::now() + crate::support::DEADLINE;
    while served.call("GET", &execution, None).1["state"] != "completed" {
        assert!(std::time::Instant::now() < deadline, "never completed");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    served.stop();
    let exported = spans(&collector);
    assert!(
        exported
            .iter()
            .all(|span| !span.attributes.contains_key("execution_id")),
        "{exported:#?}"
    );
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_openprogram"))
        .args([
            "serve",
            "--otlp-endpoint",
            "http://127.0.0.1:1",
            "--otlp-sample",
            "2",
        ])
        .output()
        .expect("run serve");
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
}
