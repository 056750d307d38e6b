//! How each state of the K-3 property (`k3_property.rs`) is built: through the library, on
//! the world's store, with a restart between steps one time in three.

use std::time::Duration;

use openprogram::storage::{Event, ExecutionId};
use serde_json::{json, Value};

use crate::k3_world::{sleep_long, World};
use crate::support::*;

pub(crate) async fn running_a_tool(world: &mut World) -> ExecutionId {
    world.maybe_restart().await;
    let execution = world
        .start(vec![sleep_long(), reply("done")], None, false)
        .await;
    world
        .until_event(execution, "the sleep", is_sleep_dispatch_or_decision)
        .await;
    execution
}

pub(crate) async fn pause_requested(world: &mut World) -> ExecutionId {
    let execution = running_a_tool(world).await;
    let reply = world.send(execution, json!({"kind": "pause"})).await;
    assert_eq!(reply.status, "applied", "{reply:?}");
    execution
}

pub(crate) async fn stepping(world: &mut World) -> ExecutionId {
    let execution = world
        .start(vec![sleep_long(), reply("done")], None, true)
        .await;
    world.maybe_restart().await;
    world.send(execution, json!({"kind": "step"})).await;
    world
        .until(execution, "the first step", |now| {
            now.state == "paused" && now.pause_reason.as_deref() == Some("step")
        })
        .await;
    world.maybe_restart().await;
    world.send(execution, json!({"kind": "step"})).await;
    world.until_state(execution, "running").await;
    execution
}

pub(crate) async fn paused_at_start(world: &mut World) -> ExecutionId {
    let execution = world
        .start(vec![echo("a"), reply("done")], None, true)
        .await;
    world.maybe_restart().await;
    execution
}

pub(crate) async fn paused_after_step(world: &mut World) -> ExecutionId {
    let execution = world
        .start(vec![echo("a"), echo("b"), reply("done")], None, true)
        .await;
    for _ in 0..2 {
        world.maybe_restart().await;
        world.send(execution, json!({"kind": "step"})).await;
        world
            .until(execution, "a step", |now| {
                now.state == "paused" && now.pause_reason.as_deref() == Some("step")
            })
            .await;
    }
    execution
}

pub(crate) async fn waiting_on_approval(world: &mut World) -> ExecutionId {
    let script = vec![
        echo("a"),
        json!({"ask": "go on?"}),
        echo("b"),
        reply("done"),
    ];
    waiting_on(world, script).await
}

/// A turn of `script` left waiting for a person (across a restart now and then).
async fn waiting_on(world: &mut World, script: Vec<Value>) -> ExecutionId {
    let execution = world.start(script, None, false).await;
    world.until_state(execution, "waiting").await;
    world.maybe_restart().await;
    execution
}

/// W-6, W-8: a structured question with a deadline far away.
pub(crate) async fn waiting_on_a_question(world: &mut World) -> ExecutionId {
    let script = vec![
        json!({"question": "which?", "timeout_ms": 3_600_000, "items": [
            {"id": "env", "type": "choice", "options": ["a", "b"]},
            {"id": "count", "type": "integer", "min": 2, "max": 3},
            {"id": "ok", "type": "boolean"}]}),
        echo("b"),
        reply("done"),
    ];
    waiting_on(world, script).await
}

/// W-8: paused `wait_expired`: the runtime's clock moved past the question's deadline.
pub(crate) async fn wait_expired(world: &mut World) -> ExecutionId {
    let script = vec![
        json!({"question": "which?", "timeout_ms": 1_000, "items": [
            {"id": "ok", "type": "boolean"}]}),
        echo("b"),
        reply("done"),
    ];
    let execution = waiting_on(world, script).await;
    world.restarts.clock.advance(Duration::from_secs(2));
    world
        .until(execution, "the wait expired", |now| {
            now.pause_reason.as_deref() == Some("wait_expired")
        })
        .await;
    world.maybe_restart().await;
    execution
}

pub(crate) async fn asking_live(world: &mut World) -> ExecutionId {
    world.maybe_restart().await;
    let script = vec![
        json!({"tool": "ask_once", "args": {"question": "which branch?"}}),
        reply("done"),
    ];
    let execution = world.start(script, None, false).await;
    world
        .until(execution, "the live question", |now| {
            now.waits.iter().any(|wait| wait.status == "open")
        })
        .await
        .execution_id
}

pub(crate) async fn process_running(world: &mut World) -> ExecutionId {
    world.maybe_restart().await;
    let shell =
        json!({"tool": "shell", "args": {"program": "sleep", "args": ["600"], "background": true}});
    let execution = world.start(vec![shell, reply("done")], None, false).await;
    world
        .until(execution, "completed with its process running", |now| {
            now.state == "completed"
                && now
                    .processes
                    .iter()
                    .any(|process| process.state == "running")
        })
        .await
        .execution_id
}

pub(crate) async fn reconciliation_required(world: &mut World) -> ExecutionId {
    let execution = world
        .start(
            vec![
                echo("a"),
                json!({"tool": "hang", "args": {}}),
                reply("done"),
            ],
            None,
            false,
        )
        .await;
    world
        .until_event(
            execution,
            "the hanging call's dispatch",
            |event| matches!(event, Event::ToolDispatched { tool, .. } if tool == "hang"),
        )
        .await;
    // Its attempt dies with the call in flight: the outcome is unknown (E-4, R-8).
    world.restart().await;
    world
        .until_state(execution, "reconciliation_required")
        .await;
    world.maybe_restart().await;
    execution
}

pub(crate) async fn ended(
    world: &mut World,
    script: Vec<Value>,
    max_iterations: Option<u32>,
) -> ExecutionId {
    let execution = world.start(script, max_iterations, false).await;
    world
        .until(execution, "the end", |now| {
            matches!(now.state, "completed" | "failed")
        })
        .await;
    world.maybe_restart().await;
    execution
}

/// W-7: completed after an approval answered for the session (a grant to revoke). The tool
/// it names is new each time: a grant of an earlier build would approve it without a wait.
pub(crate) async fn granted(world: &mut World) -> ExecutionId {
    let tool = format!("echo-{}", uuid::Uuid::new_v4());
    let script = vec![
        json!({"ask": "echo?", "tool": tool}),
        echo("a"),
        reply("done"),
    ];
    let execution = world.start(script, None, false).await;
    let waiting = world.until_state(execution, "waiting").await;
    let wait = waiting.waits[0].wait_id;
    world
        .send(
            execution,
            json!({"kind": "answer", "wait_id": wait, "answer": "", "scope": "session"}),
        )
        .await;
    world.until_state(execution, "completed").await;
    world.maybe_restart().await;
    execution
}

pub(crate) async fn cancelled(world: &mut World) -> ExecutionId {
    let execution = world
        .start(vec![echo("a"), reply("done")], None, true)
        .await;
    world.maybe_restart().await;
    world.send(execution, json!({"kind": "cancel"})).await;
    world.until_state(execution, "cancelled").await;
    world.maybe_restart().await;
    execution
}

pub(crate) async fn expired(world: &mut World) -> ExecutionId {
    let execution = world
        .start(vec![echo("a"), sleep_long(), reply("done")], None, false)
        .await;
    world
        .until_event(execution, "the sleep", is_sleep_dispatch_or_decision)
        .await;
    // Abandoned longer ago than the restart window: expired at the next start.
    if let Some(runtime) = world.runtime.take() {
        end_processes(&runtime);
        crash(runtime);
    }
    world.restarts.clock.advance(Duration::from_secs(2 * 3600));
    world.restart().await;
    world.until_state(execution, "expired").await;
    world.maybe_restart().await;
    execution
}

/// J-1: a Job waiting for `slot`, which the blocker holds, across a restart one time in
/// three. (Should the blocker expire at that restart — the `expired` state moves the clock
/// past the window of everything abandoned — the Job runs first: it is built again.)
pub(crate) async fn queued_job(world: &mut World) -> ExecutionId {
    loop {
        world.maybe_restart().await;
        let blocker = world.blocker().await;
        let job = json!({"resources": {"slot": 1}});
        let execution = world.start_job(vec![echo("a"), reply("done")], job).await;
        world.maybe_restart().await;
        if world.blocker().await != blocker {
            continue;
        }
        world
            .until(execution, "its place in line", |now| {
                now.state == "queued"
                    && now
                        .job
                        .as_ref()
                        .is_some_and(|job| job.queue_position.is_some())
            })
            .await;
        return execution;
    }
}

/// J-1: a Job paused `budget_exhausted`, its lease given back.
pub(crate) async fn budget_paused_job(world: &mut World) -> ExecutionId {
    let job = json!({"resources": {"pool": 1}, "budget": {"steps": 1}});
    let execution = world
        .start_job(vec![echo("a"), echo("b"), reply("done")], job)
        .await;
    world
        .until(execution, "its budget spent", |now| {
            now.pause_reason.as_deref() == Some("budget_exhausted")
        })
        .await;
    world.maybe_restart().await;
    execution
}

/// J-1: a Job whose queue deadline passed while the blocker held `slot`.
pub(crate) async fn expired_job(world: &mut World) -> ExecutionId {
    world.blocker().await;
    let job = json!({"resources": {"slot": 1}, "queue_deadline_ms": 1000});
    let execution = world.start_job(vec![reply("never")], job).await;
    world.restarts.clock.advance(Duration::from_secs(2));
    world.until_state(execution, "expired").await;
    world.maybe_restart().await;
    execution
}

pub(crate) async fn child(world: &mut World, kind: &'static str) -> ExecutionId {
    let execution = world
        .start(vec![echo("a"), echo("b"), reply("done")], None, false)
        .await;
    world.until_state(execution, "completed").await;
    world.maybe_restart().await;
    let reply = world.send(execution, json!({"kind": kind})).await;
    let child = reply
        .execution_id
        .unwrap_or_else(|| panic!("a {kind} child: {reply:?}"));
    world.maybe_restart().await;
    child
}

pub(crate) async fn function_paused_at_start(world: &mut World) -> ExecutionId {
    let execution = world.start_function(2, 0, true).await;
    world.maybe_restart().await;
    execution
}

pub(crate) async fn function_running(world: &mut World) -> ExecutionId {
    world.maybe_restart().await;
    let execution = world.start_function(2, 60_000, false).await;
    world
        .until_event(execution, "a step started", |event| {
            matches!(event, openprogram::storage::Event::StepStarted { .. })
        })
        .await;
    execution
}

pub(crate) async fn function_completed(world: &mut World) -> ExecutionId {
    let execution = world.start_function(1, 0, false).await;
    world.until_state(execution, "completed").await;
    world.maybe_restart().await;
    execution
}

pub(crate) async fn function_cancelled(world: &mut World) -> ExecutionId {
    let execution = world.start_function(2, 0, true).await;
    world.maybe_restart().await;
    world.send(execution, json!({"kind": "cancel"})).await;
    world.until_state(execution, "cancelled").await;
    world.maybe_restart().await;
    execution
}
