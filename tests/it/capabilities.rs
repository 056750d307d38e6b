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

/// `open` issues a page token bound to the calling attempt; `observe` uses the latest token;
/// `open_and_fail` opens one and fails half way. With `close_on_release`, an attempt's pages
/// close when it ends; without, a later attempt finds them and is refused.
#[derive(Default)]
struct Browser {
    tokens: Mutex<HashMap<ExecutionId, (String, AttemptId)>>,
    released: Mutex<Vec<(ExecutionId, AttemptId)>>,
    close_on_release: bool,
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
            Some("open_and_fail") => {
                let token = format!("page-{}", call.effect_id);
                tokens.insert(call.execution_id, (token, call.attempt_id));
                Err("the page crashed while loading".to_owned())
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

    fn release(&self, execution_id: ExecutionId, attempt_id: AttemptId) {
        let mut tokens = self
            .tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.close_on_release {
            tokens.retain(|_, (_, bound)| *bound != attempt_id);
        }
        let mut released = self
            .released
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        released.push((execution_id, attempt_id));
    }
}

impl Browser {
    /// The attempts of `execution` released so far, and whether a page is still open for it.
    fn state_of(&self, execution: ExecutionId) -> (Vec<AttemptId>, bool) {
        let released = self.released.lock().expect("released");
        let attempts = released
            .iter()
            .filter(|(of, _)| *of == execution)
            .map(|(_, attempt)| *attempt)
            .collect();
        (
            attempts,
            self.tokens.lock().expect("tokens").contains_key(&execution),
        )
    }
}

/// The attempts of `execution`, in order, from its events.
fn attempts_of(harness: &Harness, execution: ExecutionId) -> Vec<AttemptId> {
    let events = harness.events(execution).into_iter();
    let attempts = events.filter_map(|envelope| match envelope.event {
        Event::AttemptStarted { attempt_id, .. } => Some(attempt_id),
        _ => None,
    });
    attempts.collect()
}

/// Waits until the tool was told of `count` released attempts of `execution` (an actor
/// stops just after its last commit, which the waits above see first).
async fn released(
    browser: &Browser,
    execution: ExecutionId,
    count: usize,
) -> (Vec<AttemptId>, bool) {
    let deadline = std::time::Instant::now() + DEADLINE;
    loop {
        let state = browser.state_of(execution);
        if state.0.len() >= count || std::time::Instant::now() > deadline {
            return state;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// E-7: an attempt's bindings go when it ends — suspended (paused), completed, or failed
/// after a tool call that errs half way — and only its own: each release names the attempt
/// that ended, and the tool closes that attempt's page.
#[tokio::test]
async fn e7_an_attempt_releases_its_bindings_when_it_suspends_completes_or_fails() {
    let tool = Arc::new(Browser {
        close_on_release: true,
        ..Browser::default()
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .tool(tool.clone())
        .open()
        .expect("open");
    let harness = Harness::with_runtime(runtime, dir);
    let script = vec![browser("open"), sleep(300), browser("open"), reply("done")];
    let execution = harness.start(script, None).await;
    harness.wait_for_sleep(execution).await;
    harness.command(execution, "pause", None).await;
    harness.wait_for_state(execution, "paused").await;
    let (suspended, page_open) = released(&tool, execution, 1).await;
    assert_eq!(
        suspended,
        attempts_of(&harness, execution),
        "the paused attempt's"
    );
    assert!(!page_open, "its page closed");
    harness.command(execution, "continue", None).await;
    harness.wait_for_state(execution, "completed").await;
    let (completed, page_open) = released(&tool, execution, 2).await;
    assert_eq!(
        completed,
        attempts_of(&harness, execution),
        "each attempt once, in order"
    );
    assert!(!page_open, "the second attempt's page closed too");
    // A tool call that errs half way (its page opened), then the execution fails.
    let failing = harness
        .start(vec![browser("open_and_fail"), reply("unreached")], Some(1))
        .await;
    harness.wait_for_state(failing, "failed").await;
    let (failed, page_open) = released(&tool, failing, 1).await;
    assert_eq!(failed, attempts_of(&harness, failing));
    assert!(!page_open, "the page the failed call opened closed");
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
