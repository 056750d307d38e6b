//! Live questions through the library (W-4, W-5): a running tool asks through its
//! `CallHandle`; the answer command's text comes back to that very call; cancel, the call
//! ending and owner loss invalidate the question, and a restart never replays it.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use openprogram::actors::call::{AskError, CallHandle};
use openprogram::actors::machine::{LiveOutcome, Recovery};
use openprogram::agent::{Tool, ToolCall};
use openprogram::storage::{CommandId, EffectId, ExecutionId, WaitId, WaitStatus};
use openprogram::{Runtime, StartRequest};
use serde_json::{json, Value};

use crate::support::*;
use crate::waits::{answer, answer_request, send, wait_until};

/// Asks the questions of its `questions` argument at the same time and returns their
/// outcomes in order, as JSON.
struct Asker;

impl Tool for Asker {
    fn name(&self) -> &str {
        "asker"
    }
    fn recovery(&self) -> Recovery {
        Recovery::Idempotent
    }
    fn call(&self, call: ToolCall) -> BoxFuture<'static, openprogram::agent::ToolResult> {
        let questions: Vec<String> = call.args["questions"]
            .as_array()
            .map(|all| {
                all.iter()
                    .filter_map(|q| q.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        let handle = call.handle;
        async move {
            let asked = questions.into_iter().map(|question| handle.ask(question));
            let outcomes = futures::future::join_all(asked).await;
            let outcomes: Vec<String> = outcomes
                .into_iter()
                .map(|outcome| match outcome {
                    Ok(LiveOutcome::Answered(answer)) => format!("answered:{answer}"),
                    Ok(LiveOutcome::Declined) => "declined".into(),
                    Ok(LiveOutcome::Invalidated) => "invalidated".into(),
                    Err(error) => format!("error:{error}"),
                })
                .collect();
            Ok(json!(outcomes).to_string())
        }
        .boxed()
    }
}

fn asking_harness() -> Harness {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .tool(Arc::new(Asker))
        .open()
        .expect("open");
    Harness::with_runtime(runtime, dir)
}

fn asker(questions: &[&str]) -> Value {
    json!({"tool": "asker", "args": {"questions": questions}})
}

/// The open live questions of an execution, by prompt, once there are `count`.
async fn open_questions(
    harness: &Harness,
    execution: ExecutionId,
    count: usize,
) -> Vec<(String, WaitId)> {
    let snapshot = harness
        .wait_for(execution, "the live questions", |snapshot| {
            snapshot
                .waits
                .iter()
                .filter(|wait| wait.kind == "live" && wait.status == "open")
                .count()
                == count
        })
        .await;
    snapshot
        .waits
        .iter()
        .filter(|wait| wait.kind == "live" && wait.status == "open")
        .map(|wait| (wait.prompt.clone(), wait.wait_id))
        .collect()
}

#[tokio::test]
async fn w4_a_live_question_returns_its_answer_to_the_asking_call_once() {
    let harness = asking_harness();
    let execution = harness
        .start(vec![asker(&["branch?"]), reply("done")], None)
        .await;
    let questions = open_questions(&harness, execution, 1).await;
    let wait_id = questions[0].1;
    let running = harness.snapshot(execution).await;
    assert_eq!(
        running.state, "running",
        "a live question is not a checkpointed wait"
    );
    assert!(running.capabilities.contains(&"answer"));
    let command_id = CommandId::new();
    let first = answer(&harness, execution, command_id, wait_id, "main").await;
    assert_eq!(first.status, "applied", "{first:?}");
    let retried = answer(&harness, execution, command_id, wait_id, "main").await;
    assert_eq!(retried, first, "a same-id retry returns the stored outcome");
    let other = answer(&harness, execution, CommandId::new(), wait_id, "dev").await;
    assert_eq!(other.status, "rejected", "{other:?}");
    harness.wait_for_state(execution, "completed").await;
    let events = harness.events(execution);
    let result = events.iter().find_map(|envelope| match &envelope.event {
        openprogram::storage::Event::ToolFinished { output, .. } => Some(output.clone()),
        _ => None,
    });
    assert_eq!(result.as_deref(), Some(r#"["answered:main"]"#));
}

/// W-5 for live questions: a running call's question is shown with its execution's own
/// reply message, and with nothing else.
#[tokio::test]
async fn w5_a_live_question_attaches_to_its_own_reply_message() {
    let harness = asking_harness();
    let started = harness
        .runtime
        .start_execution(
            harness.session,
            StartRequest {
                message: "ask".into(),
                script: elements(vec![asker(&["branch?"]), reply("done")]),
                ..Default::default()
            },
        )
        .await
        .expect("start");
    let (_, wait_id) = open_questions(&harness, started.execution_id, 1).await[0].clone();
    let found = harness
        .runtime
        .pending_waits(harness.session, started.reply_message_id)
        .await
        .expect("waits");
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!((found[0].wait_id, found[0].kind), (wait_id, "live"));
    let elsewhere = harness
        .runtime
        .pending_waits(harness.session, started.user_message_id)
        .await
        .expect("waits");
    assert!(elsewhere.is_empty());
    harness.command(started.execution_id, "cancel", None).await;
}

#[tokio::test]
async fn w4_concurrent_askers_receive_only_their_own_answers() {
    let harness = asking_harness();
    let one = harness
        .start(vec![asker(&["a?", "b?"]), reply("one")], None)
        .await;
    let two = harness
        .start(vec![asker(&["c?"]), reply("two")], None)
        .await;
    for (execution, count) in [(one, 2), (two, 1)] {
        for (prompt, wait_id) in open_questions(&harness, execution, count).await {
            let text = format!("to {prompt}");
            let reply = answer(&harness, execution, CommandId::new(), wait_id, &text).await;
            assert_eq!(reply.status, "applied");
        }
    }
    // Each call got exactly the answers to its own questions, in its own order.
    for (execution, expected) in [
        (one, r#"["answered:to a?","answered:to b?"]"#),
        (two, r#"["answered:to c?"]"#),
    ] {
        harness.wait_for_state(execution, "completed").await;
        let result = harness
            .events(execution)
            .iter()
            .find_map(|envelope| match &envelope.event {
                openprogram::storage::Event::ToolFinished { output, .. } => Some(output.clone()),
                _ => None,
            });
        assert_eq!(result.as_deref(), Some(expected));
    }
}

#[tokio::test]
async fn w4_a_question_of_another_execution_is_not_answered_through_this_one() {
    let harness = asking_harness();
    let one = harness
        .start(vec![asker(&["a?"]), reply("one")], None)
        .await;
    // In another session: a session's turns run one at a time (C-2).
    let two = harness
        .start_apart(vec![asker(&["b?"]), reply("two")])
        .await;
    let (_, theirs) = open_questions(&harness, two, 1).await[0].clone();
    open_questions(&harness, one, 1).await;
    let (runtime, session) = (&harness.runtime, harness.session);
    let crossed = send(
        runtime,
        session,
        one,
        answer_request(CommandId::new(), Some(theirs), "x"),
    )
    .await;
    assert_eq!(crossed.status, "rejected", "{crossed:?}");
    assert_eq!(open_questions(&harness, two, 1).await[0].1, theirs);
    for execution in [one, two] {
        harness.command(execution, "cancel", None).await;
    }
}

#[tokio::test]
async fn w4_cancel_invalidates_a_live_question() {
    let harness = asking_harness();
    let execution = harness
        .start(vec![asker(&["go?"]), reply("done")], None)
        .await;
    let wait_id = open_questions(&harness, execution, 1).await[0].1;
    let cancelled = harness.command(execution, "cancel", None).await;
    assert_eq!(cancelled.status, "applied");
    let done = harness.wait_for_state(execution, "cancelled").await;
    assert_eq!(done.waits[0].status, "invalidated");
    let runtime = &harness.runtime;
    let late = answer(&harness, execution, CommandId::new(), wait_id, "yes").await;
    assert_eq!(late.status, "rejected");
    let record = runtime
        .store()
        .wait(wait_id)
        .expect("read")
        .expect("record");
    assert_eq!(record.status, WaitStatus::Invalidated);
}

/// Owner loss: the runtime crashes while a call waits for its answer. The next start does
/// not replay the question: the old one is invalidated (record included), and the resumed
/// call asks afresh under a new wait id, which is the one answered.
#[tokio::test]
async fn w4_owner_loss_invalidates_a_live_question_and_restart_does_not_replay_it() {
    let restarts = Restarts::new();
    let open = || restarts.open_with(|builder| builder.tool(Arc::new(Asker)));
    let runtime = open();
    let execution = restarts
        .start(&runtime, vec![asker(&["go?"]), reply("done")])
        .await
        .execution_id;
    let old = wait_until(&restarts, &runtime, execution, |snapshot| {
        snapshot.waits.iter().any(|wait| wait.status == "open")
    })
    .await
    .waits[0]
        .wait_id;
    crash(runtime);
    let runtime = open();
    runtime.recovery().await.expect("recovery");
    let asked_again = wait_until(&restarts, &runtime, execution, |snapshot| {
        snapshot.waits.len() == 2
    })
    .await;
    assert_eq!(asked_again.waits[0].wait_id, old);
    assert_eq!(asked_again.waits[0].status, "invalidated");
    let record = runtime.store().wait(old).expect("read").expect("record");
    assert_eq!(record.status, WaitStatus::Invalidated);
    let late = send(
        &runtime,
        restarts.session,
        execution,
        answer_request(CommandId::new(), Some(old), "yes"),
    )
    .await;
    assert_eq!(late.status, "rejected", "{late:?}");
    let new = asked_again.waits[1].wait_id;
    let answered = send(
        &runtime,
        restarts.session,
        execution,
        answer_request(CommandId::new(), Some(new), "yes"),
    )
    .await;
    assert_eq!(answered.status, "applied");
    restarts.wait_state(&runtime, execution, "completed").await;
    runtime.halt();
}

#[tokio::test]
async fn w4_asking_outside_a_managed_execution_is_no_interaction() {
    let outside = CallHandle::detached(EffectId::new());
    assert_eq!(outside.ask("anyone?").await, Err(AskError::NoInteraction));
}
