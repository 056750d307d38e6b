//! Jobs across restarts (J-2, R-2..R-5): queued Jobs keep their order; running Jobs of a
//! dead owner lose their lease and go through the queue again; the dead attempt's late
//! release is fenced and frees nothing of the new attempt's lease; a queued Job cancelled
//! after a restart holds nothing. Crash tests with real processes (kill -9 of `serve`) are
//! in `jobs_crash.rs`.

use openprogram::storage::{
    Event, EventReader, EventStore, ExecutionId, Outcome, Store, Transition,
};
use openprogram::{RestartWindow, Runtime, StartRequest};
use serde_json::{json, Value};

use crate::jobs::{audit, job, Audit};
use crate::support::*;

const MODEL_1: [(&str, u32); 1] = [("model", 1)];

fn open(restarts: &Restarts) -> Runtime {
    restarts.open_with(|builder| {
        builder
            .resource("model", 1)
            .restart_window(RestartWindow::Unlimited)
    })
}

async fn start_job(restarts: &Restarts, runtime: &Runtime, script: Vec<Value>) -> ExecutionId {
    runtime
        .start_execution(
            restarts.session,
            StartRequest {
                message: "a job".into(),
                script: elements(script),
                job: job(json!({"resources": {"model": 1}})),
                ..Default::default()
            },
        )
        .await
        .expect("start a job")
        .execution_id
}

fn audit_of(restarts: &Restarts) -> Audit {
    let store = Store::open(restarts.dir.path()).expect("reopen");
    let audit = audit(&store, &MODEL_1);
    assert_eq!(audit.granted.len(), audit.released.len(), "{audit:#?}");
    assert_eq!(audit.steps_without_lease, 0);
    audit
}

/// J-2, R-2..R-5: a crash while one Job holds the only lease and two wait: after the
/// restart the running Job's lease is released (`new_attempt`) and it goes back to the
/// queue at its place (admission order), the waiting ones keep theirs; all finish, one at
/// a time, each lease released exactly once; the resumed Job keeps its turn and message ids.
#[tokio::test]
async fn j2_a_restart_keeps_the_queue_order_and_the_dead_owners_lease_is_released() {
    let restarts = Restarts::new();
    let runtime = open(&restarts);
    let first = start_job(&restarts, &runtime, vec![sleep(400), reply("first")]).await;
    restarts.wait_state(&runtime, first, "running").await;
    let second = start_job(&restarts, &runtime, vec![echo("2"), reply("second")]).await;
    let third = start_job(&restarts, &runtime, vec![echo("3"), reply("third")]).await;
    let ids = |snapshot: &openprogram::Snapshot| {
        (
            snapshot.turn_id,
            snapshot.user_message_id,
            snapshot.reply_message_id,
        )
    };
    let before = ids(&restarts.snapshot(&runtime, first).await);
    crash(runtime);
    let runtime = open(&restarts);
    for execution in [first, second, third] {
        restarts.wait_state(&runtime, execution, "completed").await;
    }
    // J-2: the turn it resumed is the one it was admitted for.
    let after = restarts.snapshot(&runtime, first).await;
    assert_eq!(ids(&after), before);
    assert_eq!(after.text, "first");
    crash(runtime);
    let audit = audit_of(&restarts);
    let order: Vec<ExecutionId> = audit.granted.iter().map(|(_, job, _)| *job).collect();
    assert_eq!(order, vec![first, first, second, third], "{audit:#?}");
    assert_eq!(audit.released[0].1, "new_attempt", "{audit:#?}");
}

/// J-2: a Job still queued at a restart and cancelled after it never holds anything; the
/// Job behind it runs.
#[tokio::test]
async fn j2_a_queued_job_cancelled_after_a_restart_holds_nothing() {
    let restarts = Restarts::new();
    let runtime = open(&restarts);
    let running = start_job(&restarts, &runtime, vec![sleep(300), reply("r")]).await;
    restarts.wait_state(&runtime, running, "running").await;
    let cancelled = start_job(&restarts, &runtime, vec![reply("never")]).await;
    let after = start_job(&restarts, &runtime, vec![reply("after")]).await;
    crash(runtime);
    let runtime = open(&restarts);
    assert_eq!(
        restarts.snapshot(&runtime, cancelled).await.state,
        "queued",
        "still in line after the restart"
    );
    let command = command_of(json!({"kind": "cancel"}));
    let reply = runtime
        .command(restarts.session, cancelled, command)
        .await
        .expect("cancel");
    assert_eq!(reply.status, "applied", "{reply:?}");
    restarts.wait_state(&runtime, running, "completed").await;
    restarts.wait_state(&runtime, after, "completed").await;
    let report = runtime.resources().await.expect("the queue");
    assert_eq!(report.resources[0].in_use, 0, "{report:?}");
    let events = restarts.events(&runtime, cancelled);
    assert!(
        !events
            .iter()
            .any(|envelope| matches!(envelope.event, Event::LeaseGranted { .. })),
        "never leased"
    );
    crash(runtime);
    audit_of(&restarts);
}

/// J-2, A-1: the dead attempt's pause completion — its `LeaseReleased`, of its own lease or
/// the new attempt's — is fenced: nothing is written, the new attempt keeps its lease and
/// the queue still counts it; the Job finishes and releases it once.
#[tokio::test]
async fn j2_a_stale_attempts_pause_completion_never_releases_the_new_attempts_lease() {
    let restarts = Restarts::new();
    let runtime = open(&restarts);
    let execution = start_job(
        &restarts,
        &runtime,
        vec![sleep(300), sleep(300), reply("j")],
    )
    .await;
    restarts.wait_state(&runtime, execution, "running").await;
    crash(runtime);
    let (old_epoch, old_lease, version) = {
        let store = Store::open(restarts.dir.path()).expect("reopen");
        let head = store.head(execution).expect("read").expect("head");
        let lease = store
            .job(execution)
            .expect("read")
            .expect("job")
            .lease
            .expect("leased");
        (head.fencing_epoch, lease.lease_id, head.version)
    };
    let store = Store::open(restarts.dir.path()).expect("reopen");
    let runtime = Runtime::builder()
        .store(store.clone())
        .clock(restarts.clock.clone())
        .resource("model", 1)
        .open()
        .expect("open");
    let leased = wait_until(
        &runtime,
        restarts.session,
        execution,
        "a new lease",
        |snapshot| {
            snapshot.state == "running"
                && snapshot
                    .job
                    .as_ref()
                    .is_some_and(|job| job.lease_id.is_some_and(|lease| lease != old_lease))
        },
    )
    .await;
    let new_lease = leased
        .job
        .as_ref()
        .and_then(|job| job.lease_id)
        .expect("leased");
    assert!(leased.attempt > old_epoch);
    for lease_id in [old_lease, new_lease] {
        let stale = Transition::new(
            execution,
            vec![
                Event::StateChanged {
                    state: openprogram::storage::ExecutionState::Paused,
                    reason: "pause".into(),
                },
                Event::LeaseReleased {
                    lease_id,
                    reason: "paused".into(),
                    held_ms: 0,
                },
            ],
        )
        .expect_version(version)
        .by_epoch(old_epoch);
        let outcome = store.submit(stale).await.expect("submit");
        // Fencing is checked before the version (log/apply.rs): the epoch alone refuses it.
        assert!(matches!(outcome, Outcome::Fenced { .. }), "{outcome:?}");
    }
    let record = store.job(execution).expect("read").expect("job");
    assert_eq!(record.lease.map(|lease| lease.lease_id), Some(new_lease));
    let report = runtime.resources().await.expect("the queue");
    let model = &report.resources[0];
    assert_eq!(model.in_use, 1, "{report:?}");
    assert_eq!(model.leases[0].0.lease_id, new_lease, "{report:?}");
    restarts.wait_state(&runtime, execution, "completed").await;
    crash(runtime);
    drop(store);
    let audit = audit_of(&restarts);
    assert_eq!(
        audit
            .released
            .iter()
            .map(|(lease, _)| *lease)
            .collect::<Vec<_>>(),
        vec![old_lease, new_lease]
    );
}
