//! Durable functions' parallel branches (F-1, F-5, W-3): a Pause while branches run, and a
//! branch asking while another's step runs.

use openprogram::agent::Recovery;
use openprogram::storage::Event;
use openprogram::{DurableFunction, FunctionStart, Runtime};
use serde_json::json;

use crate::functions::*;
use crate::support::*;

/// F-1, F-4, F-5: `fanout`'s named branches run at once, each its own step; a Pause lets
/// the running branch steps finish (nothing is left in doubt) and stops before `join`;
/// Continue runs `join` once, and no branch again.
#[tokio::test]
async fn f5_a_pause_while_parallel_branches_run_lets_them_finish_and_join_runs_once() {
    let harness = steps_harness_with(&[("fanout", 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("fanout.log");
    let started = harness
        .runtime
        .start_function(
            harness.session,
            FunctionStart {
                function: "fanout".into(),
                input: json!({"branches": ["a", "b", "c"], "path": path, "sleep_ms": 2000}),
                ..Default::default()
            },
        )
        .await
        .expect("start fanout");
    let execution = started.started.execution_id;
    harness
        .wait_for(execution, "three branch steps started", |_| {
            let events = harness.events(execution);
            count(&events, |event| matches!(event, Event::StepStarted { .. })) == 3
        })
        .await;
    let paused = harness.command(execution, "pause", None).await;
    assert_eq!(paused.status, "applied", "{paused:?}");
    let snapshot = harness.wait_for_state(execution, "paused").await;
    assert_eq!(snapshot.pause_reason.as_deref(), Some("pause"));
    let (appended, _) = fanout_lines(&path);
    assert_eq!(
        appended,
        vec!["a", "b", "c"],
        "every running branch finished"
    );
    let steps: Vec<&str> = snapshot
        .function
        .as_ref()
        .expect("function")
        .completed_steps
        .iter()
        .map(|step| step.step_id.as_str())
        .collect();
    let mut sorted = steps.clone();
    sorted.sort();
    assert_eq!(sorted, vec!["a/append", "b/append", "c/append"]);
    let resumed = harness.command(execution, "continue", None).await;
    assert_eq!(resumed.status, "applied", "{resumed:?}");
    let done = harness.wait_for_state(execution, "completed").await;
    let (appended, last) = fanout_lines(&path);
    assert_eq!(appended, vec!["a", "b", "c", "join"]);
    assert_eq!(last.as_deref(), Some("join"));
    assert_eq!(done.text, r#"{"branches":3}"#);
}

/// A branch of `parallel`, boxed so that branches of different shapes share a list.
type Branch = Box<
    dyn FnOnce(
            openprogram::FunctionContext,
        ) -> futures::future::BoxFuture<'static, Result<String, String>>
        + Send,
>;

/// W-3 with parallel branches: one branch asks while another's step still runs; that
/// step's result is recorded without moving the checkpoint past the wait's, so the answer
/// is still the current wait's and the function goes on.
#[tokio::test]
async fn w3_a_branch_asks_while_another_step_runs_and_the_answer_still_counts() {
    let function =
        DurableFunction::with_identity("ask_beside", 1, "ask_beside:v1", |context, _| async move {
            let branches: Vec<(String, Branch)> = vec![
                (
                    "asks".to_owned(),
                    Box::new(|branch: openprogram::FunctionContext| {
                        Box::pin(async move {
                            // After the other branch's step started: it runs while this
                            // asks.
                            branch
                                .step("first", Recovery::Idempotent, |_| async {
                                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                                    Ok(())
                                })
                                .await
                                .map_err(|error| error.to_string())?;
                            let answer = branch
                                .ask("go", "Go on?")
                                .await
                                .map_err(|error| error.to_string())?;
                            Ok(answer.unwrap_or_default())
                        })
                    }),
                ),
                (
                    "works".to_owned(),
                    Box::new(|branch: openprogram::FunctionContext| {
                        Box::pin(async move {
                            branch
                                .step("work", Recovery::Idempotent, |_| async {
                                    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                                    Ok("worked".to_owned())
                                })
                                .await
                                .map_err(|error| error.to_string())
                        })
                    }),
                ),
            ];
            let results = context
                .parallel(
                    branches
                        .into_iter()
                        .map(|(name, branch)| (name, move |c| branch(c)))
                        .collect(),
                )
                .await
                .map_err(|error| error.to_string())?;
            let results: Result<Vec<String>, String> = results.into_iter().collect();
            Ok(json!(results?))
        });
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .function(function)
        .open()
        .expect("open");
    let harness = Harness::with_runtime(runtime, dir);
    let started = harness
        .runtime
        .start_function(
            harness.session,
            FunctionStart {
                function: "ask_beside".into(),
                ..Default::default()
            },
        )
        .await
        .expect("start");
    let execution = started.started.execution_id;
    harness.wait_for_state(execution, "waiting").await;
    // The other branch's step finishes while the execution waits.
    harness
        .wait_for_event(
            execution,
            "the other branch's step",
            |event| matches!(event, Event::StepFinished { step_id, .. } if step_id == "works/work"),
        )
        .await;
    let snapshot = harness.snapshot(execution).await;
    assert_eq!(snapshot.state, "waiting", "{snapshot:?}");
    let body = json!({"command_id": openprogram::storage::CommandId::new(), "kind": "answer",
        "wait_id": snapshot.waits[0].wait_id, "answer": "yes"});
    let reply = harness.send(execution, body).await;
    assert_eq!(reply.status, "applied", "{reply:?}");
    let done = harness.wait_for_state(execution, "completed").await;
    assert_eq!(done.text, r#"["yes","worked"]"#);
}
