//! Startup recovery's policy (R-2, R-4, R-6, E-6): which executions an earlier incarnation
//! left behind continue by themselves, and which stay explicit. Each test stops a runtime
//! the way a crash does (`halt`: no pause, no intent) and opens the next one on the same
//! store with a wall clock it moves.

use std::sync::Arc;
use std::time::Duration;

use openprogram::storage::{Checkpoint, Event, ExecutionState, Transition};
use openprogram::RestartWindow;

use crate::support::*;

const TWO_HOURS: RestartWindow = RestartWindow::Within(Duration::from_secs(2 * 3600));

fn is_decision(event: &Event) -> bool {
    matches!(event, Event::ModelDecided { .. })
}

fn is_attempt(event: &Event) -> bool {
    matches!(event, Event::AttemptStarted { .. })
}

/// A running execution whose worker died with a model request in flight, after `decided`
/// decisions: the store as a crash leaves it.
async fn abandoned(
    restarts: &Restarts,
    script: Vec<serde_json::Value>,
    decided: u32,
) -> openprogram::StartReply {
    let runtime = restarts.open_freezing(decided, RestartWindow::Unlimited);
    let started = restarts.start(&runtime, script).await;
    restarts
        .wait_events(&runtime, started.execution_id, "the attempt", 1, is_attempt)
        .await;
    restarts
        .wait_events(
            &runtime,
            started.execution_id,
            "the decisions",
            decided as usize,
            is_decision,
        )
        .await;
    crash(runtime);
    started
}

#[tokio::test]
async fn r2_a_restart_inside_the_window_continues_with_the_original_ids_and_e6_adds_no_text() {
    r2_a_restart_inside_the_window_continues_with_the_original_ids_and_e6_adds_no_text_on(
        Restarts::new(),
    )
    .await
}

/// The body of `r2_a_restart_inside_the_window_continues_with_the_original_ids_and_e6_adds_no_text`, on either store (N-1: `postgres.rs` runs it on PostgreSQL).
pub(crate) async fn r2_a_restart_inside_the_window_continues_with_the_original_ids_and_e6_adds_no_text_on(
    restarts: Restarts,
) {
    let started = abandoned(&restarts, vec![echo("a"), reply("done")], 1).await;
    let execution = started.execution_id;
    restarts.clock.advance(Duration::from_secs(3600));
    let runtime = restarts.open(TWO_HOURS);
    let report = runtime.recovery().await.expect("recovery");
    assert_eq!(report.resumed, vec![execution], "{report:?}");
    runtime
        .wait_finished(restarts.session, execution)
        .await
        .expect("finished");
    let snapshot = restarts.snapshot(&runtime, execution).await;
    assert_eq!(snapshot.state, "completed");
    assert_eq!(snapshot.turn_id, started.turn_id);
    assert_eq!(snapshot.reply_message_id, started.reply_message_id);
    assert_eq!(snapshot.user_message_id, started.user_message_id);
    assert_eq!(snapshot.run_id, started.run_id);
    // E-6: the restart shows only as events and a new attempt; the transcript is the reply.
    assert_eq!(snapshot.text, "done");
    let events = restarts.events(&runtime, execution);
    assert_eq!(count(&events, |e| matches!(e, Event::Replied { .. })), 1);
    assert_eq!(
        count(&events, |e| matches!(e, Event::ModelFailed { .. })),
        0
    );
    assert_eq!(count(&events, |e| matches!(e, Event::Resumed { .. })), 1);
    assert_eq!(count(&events, is_attempt), 2);
    assert_eq!(
        count(&events, is_decision),
        2,
        "the echo decision is not made twice"
    );
    runtime.halt();
}

#[tokio::test]
async fn r2_a_restart_beyond_the_window_expires_and_r6_keeps_everything_for_a_manual_continue() {
    r2_a_restart_beyond_the_window_expires_and_r6_keeps_everything_for_a_manual_continue_on(
        Restarts::new(),
    )
    .await
}

/// The body of `r2_a_restart_beyond_the_window_expires_and_r6_keeps_everything_for_a_manual_continue`, on either store (N-1: `postgres.rs` runs it on PostgreSQL).
pub(crate) async fn r2_a_restart_beyond_the_window_expires_and_r6_keeps_everything_for_a_manual_continue_on(
    restarts: Restarts,
) {
    let started = abandoned(&restarts, vec![echo("a"), reply("done")], 1).await;
    let execution = started.execution_id;
    restarts.clock.advance(Duration::from_secs(3 * 3600));
    let runtime = restarts.open(TWO_HOURS);
    let before = restarts.events(&runtime, execution);
    let report = runtime.recovery().await.expect("recovery");
    assert_eq!(report.expired, vec![execution], "{report:?}");
    let snapshot = restarts.snapshot(&runtime, execution).await;
    assert_eq!(snapshot.state, "expired");
    assert!(snapshot.capabilities.contains(&"continue"), "{snapshot:?}");
    let after = restarts.events(&runtime, execution);
    assert_eq!(
        &after[..before.len()],
        &before[..],
        "expiry deletes or rewrites nothing"
    );
    assert_eq!(count(&after, is_attempt), 1, "no new attempt ran");
    // a manual Continue takes it from its checkpoint to the end, same ids.
    let request = command_of(serde_json::json!({"kind": "continue"}));
    let reply = runtime
        .command(restarts.session, execution, request)
        .await
        .expect("continue");
    assert_eq!(reply.status, "applied", "{reply:?}");
    runtime
        .wait_finished(restarts.session, execution)
        .await
        .expect("finished");
    let snapshot = restarts.snapshot(&runtime, execution).await;
    assert_eq!(
        (snapshot.state, snapshot.text.as_str()),
        ("completed", "done")
    );
    assert_eq!(snapshot.reply_message_id, started.reply_message_id);
    runtime.halt();
}

/// The deadline is measured from the interruption, recorded once, and kept: a later start
/// with a longer (or unlimited) window does not extend it.
#[tokio::test]
async fn r2_restarts_never_extend_a_finite_deadline() {
    let restarts = Restarts::new();
    let started = abandoned(&restarts, vec![echo("a"), reply("done")], 1).await;
    let execution = started.execution_id;
    // One hour later, inside two hours: resumed, and interrupted again before any new effect.
    restarts.clock.advance(Duration::from_secs(3600));
    let runtime = restarts.open_freezing(1, TWO_HOURS);
    let report = runtime.recovery().await.expect("recovery");
    assert_eq!(report.resumed, vec![execution]);
    let deadline = restarts
        .snapshot(&runtime, execution)
        .await
        .restart_deadline_ms
        .expect("a finite deadline");
    crash(runtime);
    // Three hours after the first interruption, under an unlimited window: finite stays
    // finite, so it expires.
    restarts.clock.advance(Duration::from_secs(2 * 3600));
    let runtime = restarts.open(RestartWindow::Unlimited);
    let report = runtime.recovery().await.expect("recovery");
    assert_eq!(report.expired, vec![execution], "{report:?}");
    let snapshot = restarts.snapshot(&runtime, execution).await;
    assert_eq!(snapshot.state, "expired");
    assert_eq!(snapshot.restart_deadline_ms, Some(deadline));
    runtime.halt();
}

#[tokio::test]
async fn r2_a_zero_window_disables_automatic_restart() {
    let restarts = Restarts::new();
    let started = abandoned(&restarts, vec![reply("done")], 0).await;
    let runtime = restarts.open(RestartWindow::Disabled);
    let report = runtime.recovery().await.expect("recovery");
    assert_eq!(report.expired, vec![started.execution_id], "{report:?}");
    assert!(report.resumed.is_empty());
    runtime.halt();
}

#[tokio::test]
async fn r2_the_restart_window_parses_the_contract_values() {
    assert_eq!("-1".parse(), Ok(RestartWindow::Unlimited));
    assert_eq!("0".parse(), Ok(RestartWindow::Disabled));
    assert_eq!(
        "2h".parse(),
        Ok(RestartWindow::Within(Duration::from_secs(7200)))
    );
    assert_eq!(
        "90".parse(),
        Ok(RestartWindow::Within(Duration::from_secs(90)))
    );
    for window in ["-1", "0", "90s", "15m", "2h", "1d", "1500ms"] {
        let parsed: RestartWindow = window.parse().expect("parses");
        assert_eq!(parsed.to_string(), window, "prints as it is written");
    }
    for bad in ["", "-2", "2x", "h", "99999999999999999999d"] {
        assert!(bad.parse::<RestartWindow>().is_err(), "{bad:?}");
    }
}

#[tokio::test]
async fn r4_a_user_pause_stays_paused() {
    r4_a_user_pause_stays_paused_on(Restarts::new()).await
}

/// The body of `r4_a_user_pause_stays_paused`, on either store (N-1: `postgres.rs` runs it on PostgreSQL).
pub(crate) async fn r4_a_user_pause_stays_paused_on(restarts: Restarts) {
    let runtime = restarts.open(RestartWindow::Unlimited);
    let execution = restarts.start_paused(&runtime, vec![reply("done")]).await;
    crash(runtime);
    let runtime = restarts.open(RestartWindow::Unlimited);
    let report = runtime.recovery().await.expect("recovery");
    assert!(report.resumed.is_empty(), "{report:?}");
    let snapshot = restarts.snapshot(&runtime, execution).await;
    assert_eq!(snapshot.state, "paused");
    assert_eq!(count(&restarts.events(&runtime, execution), is_attempt), 0);
    runtime.halt();
}

/// Completed and cancelled executions are not in the non-terminal index at all: startup
/// never reads them, and their events stay as they were.
#[tokio::test]
async fn r4_completed_and_cancelled_executions_are_left_alone() {
    let restarts = Restarts::new();
    let runtime = restarts.open(RestartWindow::Unlimited);
    let completed = restarts
        .start(&runtime, vec![reply("done")])
        .await
        .execution_id;
    runtime
        .wait_finished(restarts.session, completed)
        .await
        .expect("completed");
    let cancelled = restarts
        .start(&runtime, vec![sleep(60_000), reply("never")])
        .await
        .execution_id;
    let request = command_of(serde_json::json!({"kind": "cancel"}));
    runtime
        .command(restarts.session, cancelled, request)
        .await
        .expect("cancel");
    runtime
        .wait_finished(restarts.session, cancelled)
        .await
        .expect("cancelled");
    let before = [
        restarts.events(&runtime, completed),
        restarts.events(&runtime, cancelled),
    ];
    crash(runtime);
    let runtime = restarts.open(RestartWindow::Unlimited);
    let report = runtime.recovery().await.expect("recovery");
    assert_eq!(report.classified, 0, "{report:?}");
    assert_eq!(restarts.events(&runtime, completed), before[0]);
    assert_eq!(restarts.events(&runtime, cancelled), before[1]);
    runtime.halt();
}

/// A pause with the restart-recovery reason but no restart intent (written before intents
/// existed) needs an explicit Continue.
#[tokio::test]
async fn r4_a_legacy_restart_pause_without_an_intent_stays_paused() {
    let restarts = Restarts::new();
    let execution = abandoned(&restarts, vec![reply("done")], 0)
        .await
        .execution_id;
    rewrite_head(&restarts, execution, |head| {
        head.state = ExecutionState::Paused;
        head.pause_reason = Some("restart_recovery".into());
        head.restart_intent = None;
        vec![Event::StateChanged {
            state: ExecutionState::Paused,
            reason: "restart_recovery".into(),
        }]
    })
    .await;
    let runtime = restarts.open(RestartWindow::Unlimited);
    let report = runtime.recovery().await.expect("recovery");
    assert!(report.resumed.is_empty(), "{report:?}");
    assert_eq!(restarts.snapshot(&runtime, execution).await.state, "paused");
    runtime.halt();
}

/// A head whose checkpoint is not the one its log leads to is never resumed from.
#[tokio::test]
async fn r4_a_stale_checkpoint_is_held_for_an_explicit_continue() {
    let restarts = Restarts::new();
    let execution = abandoned(&restarts, vec![echo("a"), reply("done")], 1)
        .await
        .execution_id;
    rewrite_head(&restarts, execution, |head| {
        head.checkpoint = Some(Checkpoint {
            seq: 1,
            next_action: "{}".into(),
        });
        vec![Event::StateChanged {
            state: ExecutionState::Running,
            reason: "test: a head behind its log".into(),
        }]
    })
    .await;
    let runtime = restarts.open(RestartWindow::Unlimited);
    let report = runtime.recovery().await.expect("recovery");
    assert_eq!(
        report.held,
        vec![(execution, "stale_checkpoint")],
        "{report:?}"
    );
    let snapshot = restarts.snapshot(&runtime, execution).await;
    assert_eq!(
        (snapshot.state, snapshot.pause_reason.as_deref()),
        ("paused", Some("stale_checkpoint"))
    );
    runtime.halt();
}

/// Admitted under another contract (here: a tool this runtime lacks): held paused, not run
/// against tools it was not admitted with.
#[tokio::test]
async fn r4_an_incompatible_revision_is_held_for_an_explicit_continue() {
    let restarts = Restarts::new();
    let runtime = restarts.open_with(|builder| {
        builder
            .provider(Arc::new(FreezeAfter(0)))
            .tool(Arc::new(Extra))
    });
    let execution = restarts
        .start(&runtime, vec![reply("done")])
        .await
        .execution_id;
    restarts
        .wait_events(&runtime, execution, "the attempt", 1, is_attempt)
        .await;
    crash(runtime);
    let runtime = restarts.open(RestartWindow::Unlimited);
    let report = runtime.recovery().await.expect("recovery");
    assert_eq!(
        report.held,
        vec![(execution, "incompatible_revision")],
        "{report:?}"
    );
    assert_eq!(restarts.snapshot(&runtime, execution).await.state, "paused");
    runtime.halt();
}

/// A cancellation accepted while an effect ran, then the worker died before the effect
/// ended (written here as that crash leaves it): recovery records the outcome — cancelled —
/// and runs nothing more (I6).
#[tokio::test]
async fn r4_an_abandoned_cancellation_ends_cancelled_and_runs_nothing_more() {
    r4_an_abandoned_cancellation_ends_cancelled_and_runs_nothing_more_on(Restarts::new()).await
}

/// The body of `r4_an_abandoned_cancellation_ends_cancelled_and_runs_nothing_more`, on either store (N-1: `postgres.rs` runs it on PostgreSQL).
pub(crate) async fn r4_an_abandoned_cancellation_ends_cancelled_and_runs_nothing_more_on(
    restarts: Restarts,
) {
    let execution = abandoned(&restarts, vec![reply("never")], 0)
        .await
        .execution_id;
    rewrite_head(&restarts, execution, |head| {
        head.state = ExecutionState::Cancelling;
        vec![
            Event::ControlApplied {
                command_id: openprogram::storage::CommandId::new(),
                control: openprogram::storage::Control::Cancel,
            },
            Event::StateChanged {
                state: ExecutionState::Cancelling,
                reason: "cancel".into(),
            },
        ]
    })
    .await;
    let runtime = restarts.open(RestartWindow::Unlimited);
    runtime.recovery().await.expect("recovery");
    runtime
        .wait_finished(restarts.session, execution)
        .await
        .expect("finished");
    let snapshot = restarts.snapshot(&runtime, execution).await;
    assert_eq!(snapshot.state, "cancelled");
    let events = restarts.events(&runtime, execution);
    assert_eq!(
        count(&events, is_decision),
        0,
        "no model decision after the cancel"
    );
    runtime.halt();
}

/// Rewrites an execution's head the way no runtime would (a legacy or damaged record), with
/// `change` returning the events of that write.
async fn rewrite_head(
    restarts: &Restarts,
    execution: openprogram::storage::ExecutionId,
    change: impl FnOnce(&mut openprogram::storage::ExecutionHead) -> Vec<Event>,
) {
    let store = restarts.open_store();
    let mut head = store.head(execution).expect("head").expect("exists");
    let events = change(&mut head);
    let transition = Transition::new(execution, events)
        .expect_version(head.version)
        .by_epoch(head.fencing_epoch)
        .with_head(head);
    let outcome = store.submit(transition).await.expect("submit");
    assert!(
        matches!(outcome, openprogram::storage::Outcome::Committed(_)),
        "{outcome:?}"
    );
}

/// A tool the later runtime does not have.
struct Extra;

impl openprogram::agent::Tool for Extra {
    fn name(&self) -> &str {
        "extra"
    }
    fn recovery(&self) -> openprogram::actors::machine::Recovery {
        openprogram::actors::machine::Recovery::Idempotent
    }
    fn call(
        &self,
        _call: openprogram::agent::ToolCall,
    ) -> futures::future::BoxFuture<'static, openprogram::agent::ToolResult> {
        use futures::FutureExt;
        futures::future::ready(Ok(String::new())).boxed()
    }
}

/// R21 and SPEC §5: a wall-clock jump of a day, with a one-second restart window, neither
/// lapses the running attempt's lease (leases use the monotonic clock) nor stops running
/// work (the window bounds only automatic continuation after an interruption).
#[tokio::test]
async fn r21_a_wall_clock_jump_neither_lapses_a_lease_nor_stops_running_work() {
    let restarts = Restarts::new();
    let runtime = restarts.open(RestartWindow::Within(Duration::from_secs(1)));
    let execution = restarts
        .start(&runtime, vec![sleep(200), echo("a"), reply("done")])
        .await
        .execution_id;
    restarts
        .wait_events(&runtime, execution, "the sleep decision", 1, is_decision)
        .await;
    restarts.clock.advance(Duration::from_secs(24 * 3600));
    assert!(runtime
        .reclaim_lapsed_attempts()
        .await
        .expect("reclaim")
        .is_empty());
    runtime
        .wait_finished(restarts.session, execution)
        .await
        .expect("finished");
    let snapshot = restarts.snapshot(&runtime, execution).await;
    assert_eq!(
        (snapshot.state, snapshot.text.as_str()),
        ("completed", "done")
    );
    assert_eq!(count(&restarts.events(&runtime, execution), is_attempt), 1);
    runtime.halt();
}

/// S-4 with R-3: an abandoned execution whose head record fails its checksum is quarantined
/// and left alone; startup recovery still resumes every other one.
#[tokio::test]
async fn r3_a_corrupted_head_is_quarantined_and_the_others_are_still_recovered() {
    let restarts = Restarts::new();
    let runtime = restarts.open_freezing(0, RestartWindow::Unlimited);
    let mut abandoned = Vec::new();
    for _ in 0..2 {
        let started = restarts.start(&runtime, vec![reply("done")]).await;
        restarts
            .wait_events(&runtime, started.execution_id, "the attempt", 1, is_attempt)
            .await;
        abandoned.push(started.execution_id);
    }
    crash(runtime);
    let (damaged, healthy) = (abandoned[0], abandoned[1]);
    {
        let db = raw_sled(restarts.dir.path());
        let key = openprogram::storage::keys::head(damaged);
        let mut value = db.get(key).expect("get").expect("a head record").to_vec();
        let middle = value.len() / 2;
        value[middle] ^= 0x5a;
        db.insert(key, value).expect("insert");
        db.flush().expect("flush");
    }
    let runtime = restarts.open(RestartWindow::Unlimited);
    let report = runtime.recovery().await.expect("recovery");
    assert_eq!(report.resumed, vec![healthy], "{report:?}");
    runtime
        .wait_finished(restarts.session, healthy)
        .await
        .expect("finished");
    let quarantined: Vec<_> = runtime
        .store()
        .quarantined()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(quarantined, vec![damaged]);
    runtime.halt();
}

/// The store's sled database, opened directly (the runtime that held it is gone; sled's IO
/// threads may hold its lock a few milliseconds longer).
fn raw_sled(dir: &std::path::Path) -> sled::Db {
    for _ in 0..200 {
        let opened = sled::Config::new()
            .path(dir)
            .segment_size(openprogram::storage::store::SEGMENT_BYTES)
            .open();
        match opened {
            Ok(db) => return db,
            Err(sled::Error::Io(error)) if error.to_string().contains("could not acquire lock") => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(error) => panic!("raw open: {error}"),
        }
    }
    panic!("raw open: the store stayed locked");
}
