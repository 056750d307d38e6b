//! I-3, issue 36: `/metrics` read back by a Prometheus text-format parser — the write
//! path's and the runtime's histograms, rejections by code, reconciliations.

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt as _;
use openprogram::agent::{Recovery, Tool, ToolCall, ToolError, ToolResult};
use prometheus_parse::{Scrape, Value as Sampled};
use serde_json::json;

use crate::http::{TestServer, ADMIN};

/// An External call whose answer never came: `unknown` at once.
struct Unanswered;

impl Tool for Unanswered {
    fn name(&self) -> &str {
        "unanswered"
    }
    fn recovery(&self) -> Recovery {
        Recovery::External
    }
    fn call(&self, _call: ToolCall) -> BoxFuture<'static, ToolResult> {
        futures::future::ready(Err(ToolError::Unknown("no answer came".into()))).boxed()
    }
}

fn scrape(server: &TestServer) -> Scrape {
    let (status, body) = server.call("GET", "/metrics", Some(ADMIN), None);
    assert_eq!(status, 200);
    let text = body.as_str().expect("text").to_owned();
    Scrape::parse(text.lines().map(|line| Ok(line.to_owned()))).expect("Prometheus text")
}

/// The sample `name` with `labels` (besides a histogram's `le`).
fn sample<'a>(scrape: &'a Scrape, name: &str, labels: &[(&str, &str)]) -> &'a Sampled {
    &scrape
        .samples
        .iter()
        .find(|sample| {
            sample.metric == name
                && labels
                    .iter()
                    .all(|(key, value)| sample.labels.get(key) == Some(*value))
        })
        .unwrap_or_else(|| panic!("no sample {name} {labels:?}"))
        .value
}

/// The histogram `name` with `labels`: its buckets (bound, cumulative count).
fn histogram(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> Vec<(f64, f64)> {
    match sample(scrape, name, labels) {
        Sampled::Histogram(buckets) => buckets
            .iter()
            .map(|bucket| (bucket.less_than, bucket.count))
            .collect(),
        other => panic!("{name} is not a histogram: {other:?}"),
    }
}

fn value(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    match sample(scrape, name, labels) {
        Sampled::Counter(value) | Sampled::Gauge(value) | Sampled::Untyped(value) => *value,
        other => panic!("{name}: {other:?}"),
    }
}

/// The count of a histogram: its `+Inf` bucket, which holds every observation.
fn count(buckets: &[(f64, f64)]) -> f64 {
    buckets
        .iter()
        .find(|(bound, _)| bound.is_infinite())
        .map_or(0.0, |(_, count)| *count)
}

#[test]
fn i3_metrics_are_prometheus_text_with_histograms_and_counters() {
    let server = TestServer::on(
        tempfile::tempdir().expect("tempdir"),
        |builder| builder.tool(Arc::new(Unanswered)),
        |_| {},
    );
    let session = server.session();
    let script = json!([
        {"tool": "echo", "args": {"text": "a"}},
        {"tool": "echo", "args": {"text": "b"}},
        {"reply": "done"},
    ]);
    let mut done = Vec::new();
    for _ in 0..3 {
        let started = server.start(&session, json!({"message": "m", "script": script}));
        done.push(started["execution_id"].as_str().expect("id").to_owned());
    }
    for execution in &done {
        server.wait_state(&session, execution, "completed");
    }
    // A command the execution cannot take now: rejected with its code, nothing changed.
    let (_, rejected) = server.command(
        &session,
        &done[0],
        json!({"command_id": uuid::Uuid::new_v4().to_string(), "kind": "pause"}),
    );
    assert_eq!(rejected["status"], "rejected", "{rejected}");
    let code = rejected["code"].as_str().expect("a code").to_owned();
    // An unknown effect, reconciled by an operator.
    let started = server.start(
        &session,
        json!({"message": "m", "script": [{"tool": "unanswered"}, {"reply": "done"}]}),
    );
    let unknown = started["execution_id"].as_str().expect("id");
    server.wait_state(&session, unknown, "reconciliation_required");
    let (_, reconciled) = server.command(
        &session,
        unknown,
        json!({"command_id": uuid::Uuid::new_v4().to_string(), "kind": "reconcile",
            "outcome": "confirmed", "text": "it went through"}),
    );
    assert_eq!(reconciled["status"], "applied", "{reconciled}");
    server.wait_state(&session, unknown, "completed");

    // The runtime counts a step once its actor has the commit, which a reader of the store
    // may see first: read until every count is in (a liveness bound).
    let deadline = std::time::Instant::now() + crate::support::DEADLINE;
    let (scrape, tool_steps, model_steps) = loop {
        let scrape = scrape(&server);
        let tool_steps = histogram(&scrape, "openprogram_step_seconds", &[("kind", "tool")]);
        let model_steps = histogram(&scrape, "openprogram_step_seconds", &[("kind", "model")]);
        // A group commit counted by one and not yet the other (a background one) reads
        // again too.
        let groups = count(&histogram(&scrape, "openprogram_group_commit_seconds", &[]));
        let fsyncs = count(&histogram(&scrape, "openprogram_fsync_seconds", &[]));
        let sizes = count(&histogram(
            &scrape,
            "openprogram_group_commit_transitions",
            &[],
        ));
        let counted = groups == value(&scrape, "openprogram_group_commits_total", &[])
            && fsyncs == value(&scrape, "openprogram_fsyncs_total", &[])
            && sizes == groups;
        // 3 × 2 echo calls and the unknown one; 3 × 3 + 2 model decisions.
        if (count(&tool_steps), count(&model_steps)) == (7.0, 11.0) && counted {
            break (scrape, tool_steps, model_steps);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{tool_steps:?} {model_steps:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    for name in [
        "openprogram_group_commit_seconds",
        "openprogram_fsync_seconds",
        "openprogram_step_seconds",
        "openprogram_commands_rejected_total",
        "openprogram_reconciliations_total",
        "openprogram_parked_executions",
    ] {
        assert!(scrape.docs.contains_key(name), "no HELP for {name}");
    }
    assert!(count(&model_steps) > 0.0);
    // Cumulative: never falling, bounds rising.
    for window in tool_steps.windows(2) {
        assert!(
            window[0].0 < window[1].0 && window[0].1 <= window[1].1,
            "{tool_steps:?}"
        );
    }
    let groups = histogram(&scrape, "openprogram_group_commit_seconds", &[]);
    assert!(count(&groups) >= 1.0);
    assert!(count(&histogram(&scrape, "openprogram_activation_seconds", &[])) >= 1.0);
    let applied = histogram(
        &scrape,
        "openprogram_command_seconds",
        &[("outcome", "applied")],
    );
    assert_eq!(count(&applied), 1.0, "the reconcile");
    let refused = histogram(
        &scrape,
        "openprogram_command_seconds",
        &[("outcome", "rejected")],
    );
    assert_eq!(count(&refused), 1.0);
    assert_eq!(
        value(
            &scrape,
            "openprogram_commands_rejected_total",
            &[("code", &code)]
        ),
        1.0
    );
    assert_eq!(
        value(&scrape, "openprogram_reconciliations_total", &[]),
        1.0
    );
    // Every family is typed.
    let typed: HashMap<&str, usize> = scrape
        .samples
        .iter()
        .map(|sample| (sample.metric.as_str(), 1))
        .collect();
    assert!(typed.len() > 20, "{typed:?}");
}
