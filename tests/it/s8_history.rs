//! S-8: a long execution is read from its projection and the events after it, never by
//! replaying its whole history: after a restart its snapshot is the one it had, its
//! capabilities the same, a command on it is decided and applied, and the actor that then
//! runs it has the whole history (the reply comes after every earlier step). A Fork from
//! an early checkpoint, which needs that history, still works.

use openprogram::storage::{Event, ExecutionId};
use openprogram::{RestartWindow, Runtime};
use serde_json::json;

use crate::support::*;

/// Steps before the approval: well past a projection's interval (`EVERY_EVENTS`, 128
/// events) and the lists a snapshot keeps (`KEPT`, 20).
const STEPS: usize = 40;

fn head_and_projection(runtime: &Runtime, execution: ExecutionId) -> (u64, u64) {
    let store = runtime.store();
    let head = store.head(execution).expect("head").expect("exists");
    let projection = store
        .projection(execution)
        .expect("projection")
        .expect("a long execution has a projection");
    (head.last_seq, projection.through_seq)
}

#[tokio::test]
async fn s8_a_long_parked_execution_reads_and_resumes_from_its_projection() {
    let restarts = Restarts::new();
    let runtime = restarts.open(RestartWindow::Unlimited);
    let mut script: Vec<_> = (0..STEPS)
        .map(|step| echo(&format!("step {step}")))
        .collect();
    script.push(json!({"ask": "go on?"}));
    script.push(reply("done"));
    let execution = restarts.start(&runtime, script).await.execution_id;
    let before = restarts.wait_state(&runtime, execution, "waiting").await;
    runtime.shutdown().await;
    drop(runtime);

    let runtime = restarts.open(RestartWindow::Unlimited);
    runtime.recovery().await.expect("recovery");
    let (last_seq, through_seq) = head_and_projection(&runtime, execution);
    assert!(
        through_seq > 0 && through_seq < last_seq && last_seq - through_seq <= 128 + 4,
        "a projection through {through_seq} of {last_seq} events"
    );
    let loads = runtime.inspect().projected_loads();
    let after = restarts.snapshot(&runtime, execution).await;
    assert_eq!(
        after, before,
        "the snapshot a projection gives is the one it had"
    );
    assert_eq!(
        runtime.inspect().projected_loads(),
        loads + 1,
        "read from the projection"
    );
    assert_eq!(after.receipts_total, 2 * STEPS as u64 + 1);
    assert_eq!(after.receipts.len(), 20, "the newest receipts");
    assert_eq!(after.waits_total, 1);

    let answer = command_of(json!({"kind": "answer", "wait_id": after.waits[0].wait_id,
        "answer": "yes"}));
    let reply = runtime
        .command(restarts.session, execution, answer)
        .await
        .expect("answer");
    assert_eq!(reply.status, "applied", "{reply:?}");
    let done = restarts.wait_state(&runtime, execution, "completed").await;
    assert_eq!(done.text, "done");
    assert_eq!(done.receipts_total, 2 * STEPS as u64 + 2);

    // K-2 on the whole history: a fork from the first checkpoint starts a paused child.
    let first = restarts
        .events(&runtime, execution)
        .iter()
        .find(|envelope| matches!(envelope.event, Event::CheckpointPublished { .. }))
        .map(|envelope| envelope.seq)
        .expect("a checkpoint");
    let fork = command_of(json!({"kind": "fork", "checkpoint": first}));
    let forked = runtime
        .command(restarts.session, execution, fork)
        .await
        .expect("fork");
    assert_eq!(forked.status, "applied", "{forked:?}");
    let child = forked.execution_id.expect("a child");
    let child = restarts.wait_state(&runtime, child, "paused").await;
    assert!(child.capabilities.contains(&"continue"), "{child:?}");
}
