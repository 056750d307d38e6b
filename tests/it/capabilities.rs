//! E-7: a capability bound to one attempt (a browser page token, say) is refused from
//! another, as an explicit tool error with its original reason; a capability issued afresh
//! to the resumed attempt is accepted. The runtime's part is to tell every tool call which
//! attempt and owner make it; binding is the tool's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use futures::FutureExt;
use openprogram::actors::machine::Recovery;
use openprogram::agent::{Tool, ToolCall};
use openprogram::storage::{AttemptId, Event, ExecutionId, ReceiptStatus};
use openprogram::Runtime;
use serde_json::json;

use crate::support::*;

/// `open` issues a page token bound to the calling attempt; `observe` uses the latest token.
#[derive(Default)]
struct Browser {
    tokens: Mutex<HashMap<ExecutionId, (String, AttemptId)>>,
}

impl Tool for Browser {
    fn name(&self) -> &str {
        "browser"
    }
    fn recovery(&self) -> Recovery {
        Recovery::Idempotent
    }
    fn call(&self, call: ToolCall) -> BoxFuture<'static, openprogram::agent::ToolResult> {
        let mut tokens = self
            .tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let result = match call.args.get("op").and_then(|op| op.as_str()) {
            Some("open") => {
                let token = format!("page-{}", call.effect_id);
                tokens.insert(call.execution_id, (token.clone(), call.attempt_id));
                Ok(token)
            }
            Some("observe") => match tokens.get(&call.execution_id) {
                Some((token, bound)) if *bound == call.attempt_id => {
                    Ok(format!("observed with {token}"))
                }
                Some((token, bound)) => Err(format!(
                    "page token {token} is bound to attempt {bound}, not {}",
                    call.attempt_id
                )),
                None => Err("no page is open".into()),
            },
            _ => Err("unknown op".into()),
        };
        futures::future::ready(result.map_err(Into::into)).boxed()
    }
}

fn browser(op: &str) -> serde_json::Value {
    json!({"tool": "browser", "args": {"op": op}})
}

#[tokio::test]
async fn e7_capability_of_the_first_attempt_is_refused_after_resume_and_a_fresh_one_accepted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .tool(Arc::new(Browser::default()))
        .open()
        .expect("open");
    let harness = Harness::with_runtime(runtime, dir);
    let script = vec![
        browser("open"),
        browser("observe"),
        sleep(300),
        browser("observe"),
        browser("open"),
        browser("observe"),
        reply("done"),
    ];
    let execution = harness.start(script, None).await;
    harness.wait_for_sleep(execution).await;
    harness.command(execution, "pause", None).await;
    harness.wait_for_state(execution, "paused").await;
    // Continue resumes the same execution in a new attempt.
    harness.command(execution, "continue", None).await;
    let snapshot = harness.wait_for_state(execution, "completed").await;
    assert_eq!(snapshot.attempt, 2);
    let results: Vec<(ReceiptStatus, String)> = harness
        .events(execution)
        .into_iter()
        .filter_map(|envelope| match envelope.event {
            Event::ToolFinished { status, output, .. } => Some((status, output)),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 6, "{results:#?}");
    assert_eq!(
        results[1].0,
        ReceiptStatus::Confirmed,
        "same attempt: accepted"
    );
    assert_eq!(
        results[3].0,
        ReceiptStatus::Failed,
        "another attempt: refused"
    );
    assert!(
        results[3].1.contains("is bound to attempt"),
        "the original reason: {}",
        results[3].1
    );
    assert_eq!(
        results[5].0,
        ReceiptStatus::Confirmed,
        "a token issued to the resumed attempt: accepted"
    );
}
