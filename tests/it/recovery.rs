//! What a new attempt does with an execution another attempt left behind (E-4, A-1).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use openprogram::actors::machine::Recovery;
use openprogram::agent::{Tool, ToolCall};
use openprogram::storage::Event;
use openprogram::StartRequest;

use crate::support::*;

/// An External tool that never finishes: the worker "dies" while it is in flight.
struct Hang {
    calls: AtomicUsize,
}

impl Tool for Hang {
    fn name(&self) -> &str {
        "hang"
    }
    fn recovery(&self) -> Recovery {
        Recovery::External
    }
    fn call(&self, _call: ToolCall) -> BoxFuture<'static, openprogram::agent::ToolResult> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        futures::future::pending().boxed()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e4_an_external_effect_left_in_flight_becomes_unknown_and_never_runs_again() {
    e4_an_external_effect_left_in_flight_becomes_unknown_and_never_runs_again_on(Restarts::new())
        .await
}

/// The body of the test above, on either store (N-1: `postgres.rs` runs it on PostgreSQL).
pub(crate) async fn e4_an_external_effect_left_in_flight_becomes_unknown_and_never_runs_again_on(
    restarts: Restarts,
) {
    let hang = Arc::new(Hang {
        calls: AtomicUsize::new(0),
    });
    let session = restarts.session;
    let execution = {
        let runtime = restarts.open_with(|builder| builder.tool(hang.clone()));
        let request = StartRequest {
            message: "test".into(),
            script: elements(vec![
                serde_json::json!({"tool": "hang", "args": {}}),
                reply("never"),
            ]),
            ..Default::default()
        };
        let execution = runtime
            .start_execution(session, request)
            .await
            .expect("start")
            .execution_id;
        let started = std::time::Instant::now();
        while hang.calls.load(Ordering::SeqCst) == 0 {
            assert!(started.elapsed() < DEADLINE, "the tool never started");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        runtime.halt();
        execution
    };
    // A new runtime: startup recovery finds the execution `running` under a dead owner, its
    // effect dispatched, and resumes it with a new attempt.
    let runtime = restarts.open_with(|builder| builder.tool(hang.clone()));
    let report = runtime.recovery().await.expect("recovery");
    assert_eq!(report.resumed, vec![execution], "{report:?}");
    let started = std::time::Instant::now();
    let snapshot = loop {
        let snapshot = runtime
            .snapshot(session, execution)
            .await
            .expect("snapshot");
        if snapshot.state == "reconciliation_required" {
            break snapshot;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "never flagged for reconciliation: {snapshot:#?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    assert!(
        snapshot
            .receipts
            .iter()
            .any(|r| r.tool == "hang" && r.status == "unknown"),
        "{:?}",
        snapshot.receipts
    );
    assert_eq!(
        hang.calls.load(Ordering::SeqCst),
        1,
        "an External effect is never repeated"
    );
    let events = runtime.events(session, execution, 0).expect("events");
    let epochs: Vec<u64> = events
        .iter()
        .filter_map(|e| match e.event {
            Event::AttemptStarted { epoch, .. } => Some(epoch),
            _ => None,
        })
        .collect();
    assert_eq!(epochs, vec![1, 2]);
    runtime.halt();
}

/// K-1/K-4: a command saved `accepted` whose worker died before deciding it (a log written
/// when accepting and deciding were two transitions) is decided when delivered again — checked against the version its client saw when it was accepted, not
/// against the version its own acceptance moved the execution to.
#[tokio::test]
async fn k4_a_command_accepted_before_a_crash_is_decided_on_redelivery() {
    use openprogram::storage::{CommandId, Event, EventStore, Transition, Upsert};
    let (harness, store) = Harness::keeping_store();
    let execution = harness.start_paused(vec![reply("done")]).await;
    let seen = harness.snapshot(execution).await.version;
    let continue_request = command_of(serde_json::json!({
        "command_id": CommandId::new(), "kind": "continue", "expected_version": seen
    }));
    // What the execution wrote before its worker died: the command, accepted.
    let accepted = continue_request.accepted_record(execution);
    let event = Event::CommandAccepted {
        command_id: accepted.command_id,
        kind: "continue".into(),
    };
    let saved = store
        .submit(Transition::new(execution, vec![event]).with(Upsert::Command(accepted)))
        .await
        .expect("accept");
    assert!(saved.committed().is_some());
    // The client retries with the same command and the version it saw.
    let reply = harness
        .runtime
        .command(harness.session, execution, continue_request)
        .await
        .expect("retry");
    assert_eq!(reply.status, "applied", "{reply:?}");
    assert_eq!(
        harness.wait_for_state(execution, "completed").await.text,
        "done"
    );
}

#[tokio::test]
async fn i1_wait_finished_returns_for_ended_and_refuses_unknown_executions() {
    let harness = Harness::new();
    let execution = harness.start(vec![reply("done")], None).await;
    harness
        .runtime
        .wait_finished(harness.session, execution)
        .await
        .expect("ends");
    // Already ended: returns at once, and leaves no waiter behind.
    harness
        .runtime
        .wait_finished(harness.session, execution)
        .await
        .expect("ended");
    let unknown = openprogram::storage::ExecutionId::new();
    let error = harness
        .runtime
        .wait_finished(harness.session, unknown)
        .await
        .expect_err("unknown");
    assert_eq!(error.code(), "not_found");
}
