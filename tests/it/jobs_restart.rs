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

/// The scripted provider, except that its first call freezes the calling thread.
struct FreezeOnce {
    frozen: std::sync::atomic::AtomicBool,
    freeze: std::time::Duration,
}

impl openprogram::agent::Provider for FreezeOnce {
    fn decide(
        &self,
        request: openprogram::agent::ModelRequest,
    ) -> futures::future::BoxFuture<'static, Result<openprogram::agent::Decision, String>> {
        use futures::FutureExt as _;
        if !self.frozen.swap(true, std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(self.freeze);
        }
        openprogram::agent::Scripted.decide(request).boxed()
    }

    /// The built-in script's decisions: the same contract as `Scripted` (K-2).
    fn contract(&self) -> String {
        openprogram::agent::Provider::contract(&openprogram::agent::Scripted)
    }
}

/// J-2, A-1: a Job whose attempt stalls past its lease is taken over in process: the claim
/// releases the stalled attempt's lease (`new_attempt`) and the queue is told, so the Job
/// behind it runs and the Job itself runs again under a new lease; nothing is held at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn j2_a_takeover_of_a_stalled_job_gives_its_lease_back_to_the_queue() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ttl = std::time::Duration::from_millis(150);
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .provider(std::sync::Arc::new(FreezeOnce {
            frozen: Default::default(),
            freeze: ttl * 8,
        }))
        .lease_ttl(ttl)
        .resource("model", 1)
        .open()
        .expect("open");
    let harness = Harness::with_runtime(runtime, dir);
    let body = json!({"resources": {"model": 1}});
    let stalled =
        crate::jobs::start_job(&harness, vec![echo("a"), reply("done")], body.clone()).await;
    let behind = crate::jobs::start_job(&harness, vec![reply("behind")], body).await;
    // The takeover, asked from here: the supervisor that asks it every half ttl may share
    // the stalled thread.
    let started = std::time::Instant::now();
    while !harness
        .events(stalled)
        .iter()
        .any(|envelope| matches!(envelope.event, Event::AttemptStarted { epoch, .. } if epoch >= 2))
    {
        harness
            .runtime
            .reclaim_lapsed_attempts()
            .await
            .expect("reclaim");
        assert!(started.elapsed() < DEADLINE, "never taken over");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    harness.wait_for_state(stalled, "completed").await;
    harness.wait_for_state(behind, "completed").await;
    let report = harness.runtime.resources().await.expect("the queue");
    assert_eq!(report.resources[0].in_use, 0, "{report:?}");
    let audit = crate::jobs::audit_all_released(&harness, &MODEL_1);
    assert!(
        audit
            .released
            .iter()
            .any(|(_, reason)| reason == "new_attempt"),
        "{audit:#?}"
    );
}
