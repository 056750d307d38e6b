//! The controls through the library (K-1..K-5).

use openprogram::storage::{CommandId, Event, EventReader, EventStore, ExecutionId};

use crate::support::*;

/// `sleep`, telling the test when it has started: a Pause sent then lands during the tool.
struct StartedSleep(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl openprogram::agent::Tool for StartedSleep {
    fn name(&self) -> &str {
        "sleep"
    }
    fn recovery(&self) -> openprogram::actors::machine::Recovery {
        openprogram::actors::machine::Recovery::Idempotent
    }
    fn call(
        &self,
        call: openprogram::agent::ToolCall,
    ) -> futures::future::BoxFuture<'static, openprogram::agent::ToolResult> {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        openprogram::agent::Sleep.call(call)
    }
}

/// Starts `script` (which begins with a `sleep`) and returns once the sleep has started: a
/// control sent then lands while the tool runs, not before it starts.
async fn started_in_sleep(
    script: Vec<serde_json::Value>,
) -> (Harness, ExecutionId, openprogram::storage::Store) {
    let started = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dir = tempfile::tempdir().expect("tempdir");
    // The test keeps a handle on the store, to write as another writer would.
    let store = openprogram::storage::Store::open(dir.path()).expect("open the store");
    let runtime = openprogram::Runtime::builder()
        .store(store.clone())
        .tool(std::sync::Arc::new(StartedSleep(started.clone())))
        .open()
        .expect("open");
    let harness = Harness::with_runtime(runtime, dir);
    let execution = harness.start(script, None).await;
    let waiting = std::time::Instant::now();
    while !started.load(std::sync::atomic::Ordering::SeqCst) {
        assert!(waiting.elapsed() < DEADLINE, "the tool never started");
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    (harness, execution, store)
}

#[tokio::test]
async fn k2_pause_during_a_tool_lets_it_finish_and_continue_does_not_repeat_it() {
    let (harness, execution, _store) =
        started_in_sleep(vec![sleep(300), echo("after"), reply("done")]).await;
    let paused = harness.command(execution, "pause", None).await;
    assert_eq!(paused.status, "applied", "{paused:?}");
    let snapshot = harness.wait_for_state(execution, "paused").await;
    let events = harness.events(execution);
    // The sleep finished; nothing started after it.
    assert_eq!(
        count(&events, |e| matches!(e, Event::ToolFinished { .. })),
        1
    );
    assert_eq!(
        count(&events, |e| matches!(e, Event::ModelDecided { .. })),
        1
    );
    assert!(
        snapshot.capabilities.contains(&"continue"),
        "{:?}",
        snapshot.capabilities
    );
    let continued = harness.command(execution, "continue", None).await;
    assert_eq!(continued.status, "applied", "{continued:?}");
    let snapshot = harness.wait_for_state(execution, "completed").await;
    let events = harness.events(execution);
    assert_eq!(
        count(
            &events,
            |e| matches!(e, Event::ToolFinished { output, .. } if output.starts_with("slept"))
        ),
        1
    );
    assert_eq!(snapshot.text, "done");
}

#[tokio::test]
async fn k2_a_paused_execution_continues_from_its_parked_state_without_a_replay() {
    let (harness, execution, _store) =
        started_in_sleep(vec![sleep(100), echo("after"), reply("done")]).await;
    parked(&harness, execution).await;
    let continued = harness.command(execution, "continue", None).await;
    assert_eq!(continued.status, "applied", "{continued:?}");
    let snapshot = harness.wait_for_state(execution, "completed").await;
    assert_eq!(snapshot.text, "done");
    let (parked, replayed) = harness.runtime.inspect().state_loads();
    let loads = |from: usize| [parked, replayed][from];
    // The Continue's activation (and every read of the parked execution) used the kept
    // state; nothing replayed the history (debug builds also check that the kept state is
    // the one a replay rebuilds, `Env::latest_state`).
    assert!(loads(0) >= 1, "no state came from the parked one");
    assert_eq!(loads(1), 0, "a replay ran");
}

/// Pauses the execution that `started_in_sleep` started and waits until its actor is gone.
async fn parked(harness: &Harness, execution: ExecutionId) {
    let paused = harness.command(execution, "pause", None).await;
    assert_eq!(paused.status, "applied", "{paused:?}");
    harness.wait_for_state(execution, "paused").await;
    let waiting = std::time::Instant::now();
    while harness.runtime.inspect().is_live(execution) {
        assert!(
            waiting.elapsed() < DEADLINE,
            "the paused actor was never released"
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

#[tokio::test]
async fn k2_a_parked_state_is_not_used_once_another_write_moved_the_execution_on() {
    let (harness, execution, store) = started_in_sleep(vec![sleep(100), reply("done")]).await;
    parked(&harness, execution).await;
    let version = store
        .head(execution)
        .expect("head")
        .expect("exists")
        .version;
    let written = store
        .submit(
            openprogram::storage::Transition::new(
                execution,
                vec![Event::Replied {
                    text: "by another writer".into(),
                }],
            )
            .expect_version(version),
        )
        .await
        .expect("submit");
    assert!(
        matches!(written, openprogram::storage::Outcome::Committed(_)),
        "{written:?}"
    );
    // The kept state predates that write: it is not used, the events are replayed.
    let snapshot = harness.snapshot(execution).await;
    assert_eq!(snapshot.text, "by another writer");
    assert_eq!(harness.runtime.inspect().state_loads().1, 1);
}

#[tokio::test]
async fn k2_step_runs_exactly_one_step_per_command() {
    let (harness, execution, _store) =
        started_in_sleep(vec![sleep(300), echo("a"), echo("b"), reply("done")]).await;
    harness.command(execution, "pause", None).await;
    harness.wait_for_state(execution, "paused").await;
    let steps = |events: &[openprogram::storage::EventEnvelope]| {
        count(events, |e| {
            matches!(e, Event::ModelDecided { .. } | Event::ToolFinished { .. })
        })
    };
    let mut taken = steps(&harness.events(execution));
    assert_eq!(taken, 2, "the sleep's decision and result");
    for _ in 0..3 {
        let stepped = harness.command(execution, "step", None).await;
        assert_eq!(stepped.status, "applied", "{stepped:?}");
        harness
            .wait_for(execution, "paused after one step", |s| {
                s.state == "paused" && s.version > stepped.version
            })
            .await;
        let now = steps(&harness.events(execution));
        assert_eq!(now, taken + 1, "one step per Step");
        taken = now;
    }
    harness.command(execution, "continue", None).await;
    assert_eq!(
        harness.wait_for_state(execution, "completed").await.text,
        "done"
    );
}

#[tokio::test]
async fn k2_steer_text_appears_in_the_reply() {
    let harness = Harness::new();
    let execution = harness.start(vec![sleep(200), reply("done")], None).await;
    harness.wait_for_sleep(execution).await;
    let steered = harness.command(execution, "steer", Some("be brief")).await;
    assert_eq!(steered.status, "applied", "{steered:?}");
    let snapshot = harness.wait_for_state(execution, "completed").await;
    assert_eq!(snapshot.text, "done\n[steer] be brief");
}

#[tokio::test]
async fn k5_cancel_during_sleep_ends_it_promptly_and_nothing_runs_after() {
    let (harness, execution, _store) = started_in_sleep(vec![sleep(600_000), reply("never")]).await;
    let cancelled = harness.command(execution, "cancel", None).await;
    assert_eq!(cancelled.status, "applied", "{cancelled:?}");
    let snapshot = harness.wait_for_state(execution, "cancelled").await;
    assert!(snapshot
        .receipts
        .iter()
        .any(|r| r.tool == "sleep" && r.status == "failed"));
    // Nothing restarts a cancelled execution; cancel precedence over controls that race it
    // is covered at the state machine (`k5_cancel_takes_precedence…`).
    let late = harness.command(execution, "continue", None).await;
    assert_eq!(late.status, "rejected", "{late:?}");
    let events = harness.events(execution);
    assert_eq!(
        count(&events, |e| matches!(e, Event::ModelDecided { .. })),
        1,
        "the reply never ran"
    );
}

#[tokio::test]
async fn k1_a_command_is_saved_accepted_then_decided_in_one_transition() {
    let harness = Harness::new();
    // A long sleep: no transition of the execution's own comes during the command.
    let execution = harness
        .start(vec![sleep(60_000), reply("done")], None)
        .await;
    harness.wait_for_sleep(execution).await;
    let before = harness.snapshot(execution).await.version;
    let steered = harness.command(execution, "steer", Some("later")).await;
    assert_eq!(steered.status, "applied");
    assert_eq!(steered.version, before + 1, "one transition: {steered:?}");
    assert_eq!(harness.snapshot(execution).await.version, before + 1);
    let events = harness.events(execution);
    let accepted = events
        .iter()
        .position(|e| matches!(&e.event, Event::ControlAccepted { command_id, .. } if *command_id == steered.command_id))
        .expect("saved as accepted");
    assert!(
        matches!(&events[accepted + 1].event, Event::ControlApplied { command_id, .. } if *command_id == steered.command_id),
        "the decision follows the acceptance: {:?}",
        events[accepted + 1].event
    );
    let cancelled = harness.command(execution, "cancel", None).await;
    assert_eq!(cancelled.status, "applied");
    harness.wait_for_state(execution, "cancelled").await;
}

#[tokio::test]
async fn k1_a_refused_command_and_a_claiming_continue_are_each_one_transition() {
    let harness = Harness::new();
    let execution = harness.start_paused(vec![echo("a"), reply("done")]).await;
    let before = harness.snapshot(execution).await.version;
    let kinds_after = |events: &[openprogram::storage::EventEnvelope], command_id| {
        let at = events
            .iter()
            .position(|e| matches!(&e.event, Event::ControlAccepted { command_id: id, .. } if *id == command_id))
            .expect("saved as accepted");
        events[at..]
            .iter()
            .map(|e| e.event.type_name())
            .collect::<Vec<_>>()
    };
    // Pause is not offered while paused: refused, and only its record says so (K-4).
    let events_before = harness.events(execution);
    let refused = harness.command(execution, "pause", None).await;
    assert_eq!(refused.status, "rejected");
    assert_eq!(refused.code.as_deref(), Some("not_available"));
    assert_eq!(refused.version, before);
    assert_eq!(
        harness.events(execution),
        events_before,
        "a refusal appends nothing"
    );
    let stored = harness
        .runtime
        .command_status(harness.session, refused.command_id)
        .expect("stored");
    assert_eq!(stored, refused);
    // Continue on a parked execution claims an attempt in the same transition, at the
    // version the client read before the refusal.
    let continued = harness
        .command_with(execution, CommandId::new(), "continue", None, Some(before))
        .await;
    assert_eq!(continued.status, "applied");
    assert_eq!(continued.version, before + 1);
    harness.wait_for_state(execution, "completed").await;
    assert_eq!(
        kinds_after(&harness.events(execution), continued.command_id)[..4],
        [
            "command_accepted",
            "attempt_started",
            "control_applied",
            "state_changed"
        ]
    );
}

#[tokio::test]
async fn k4_duplicate_command_id_applies_once_and_other_payload_conflicts() {
    let harness = Harness::new();
    let execution = harness.start(vec![sleep(300), reply("done")], None).await;
    harness.wait_for_sleep(execution).await;
    let command_id = CommandId::new();
    let first = harness
        .command_with(execution, command_id, "steer", Some("once"), None)
        .await;
    let again = harness
        .command_with(execution, command_id, "steer", Some("once"), None)
        .await;
    assert_eq!(first, again);
    let request = command_of(serde_json::json!({
        "command_id": command_id, "kind": "steer", "text": "other"
    }));
    let conflict = harness
        .runtime
        .command(harness.session, execution, request)
        .await
        .expect_err("conflict");
    assert_eq!(conflict.code(), "command_conflict");
    let snapshot = harness.wait_for_state(execution, "completed").await;
    assert_eq!(snapshot.text, "done\n[steer] once");
    let applied = count(&harness.events(execution), |e| {
        matches!(e, Event::ControlApplied { .. })
    });
    assert_eq!(applied, 1);
    assert_eq!(
        harness
            .runtime
            .command_status(harness.session, command_id)
            .expect("status"),
        first
    );
}

#[tokio::test]
async fn k4_stale_expected_version_is_rejected_with_the_current_version() {
    let harness = Harness::new();
    let execution = harness.start(vec![sleep(300), reply("done")], None).await;
    harness.wait_for_sleep(execution).await;
    let current = harness.snapshot(execution).await.version;
    let stale = harness
        .command_with(
            execution,
            CommandId::new(),
            "pause",
            None,
            Some(current - 1),
        )
        .await;
    assert_eq!(stale.status, "rejected");
    assert!(
        stale
            .reason
            .as_deref()
            .unwrap_or("")
            .contains("stale expected_version"),
        "{stale:?}"
    );
    assert!(stale.version >= current);
    assert_eq!(
        count(&harness.events(execution), |e| matches!(
            e,
            Event::ControlApplied { .. }
        )),
        0
    );
}

#[tokio::test]
async fn k3_a_control_outside_the_capabilities_is_rejected_with_the_list() {
    let harness = Harness::new();
    let execution = harness.start(vec![sleep(300), reply("done")], None).await;
    harness.wait_for_sleep(execution).await;
    let rejected = harness.command(execution, "continue", None).await;
    assert_eq!(rejected.status, "rejected");
    let reason = rejected.reason.unwrap_or_default();
    assert!(
        reason.contains("available: [pause, steer, cancel, set_policy, fork]"),
        "{reason}"
    );
}

#[tokio::test]
async fn k2_a_turn_admitted_paused_waits_for_step_or_continue() {
    let harness = Harness::new();
    let execution = harness.start_paused(vec![echo("a"), reply("done")]).await;
    let snapshot = harness.snapshot(execution).await;
    assert_eq!(
        (snapshot.state, snapshot.pause_reason.as_deref()),
        ("paused", Some("start_paused"))
    );
    assert_eq!(
        snapshot.capabilities,
        vec!["continue", "step", "steer", "cancel", "set_policy"]
    );
    assert_eq!(
        harness.runtime.live_executions(),
        0,
        "a paused admission costs no actor"
    );
    let stepped = harness.command(execution, "step", None).await;
    assert_eq!(stepped.status, "applied");
    let snapshot = harness
        .wait_for(execution, "paused after one step", |s| {
            s.state == "paused" && s.version > stepped.version
        })
        .await;
    assert_eq!(snapshot.pause_reason.as_deref(), Some("step"));
    assert_eq!(
        count(&harness.events(execution), |e| matches!(
            e,
            Event::ModelDecided { .. }
        )),
        1
    );
    harness.command(execution, "continue", None).await;
    assert_eq!(
        harness.wait_for_state(execution, "completed").await.text,
        "done"
    );
}

#[tokio::test]
async fn k4_expected_version_works_on_a_parked_execution_and_stale_rejections_are_stored() {
    let harness = Harness::new();
    let execution = harness.start(vec![sleep(200), reply("done")], None).await;
    harness.wait_for_sleep(execution).await;
    harness.command(execution, "pause", None).await;
    let paused = harness.wait_for_state(execution, "paused").await;
    // The actor is released; a command with the version the client saw still applies.
    let stale_id = CommandId::new();
    let stale = harness
        .command_with(
            execution,
            stale_id,
            "continue",
            None,
            Some(paused.version - 1),
        )
        .await;
    assert_eq!(stale.status, "rejected", "{stale:?}");
    assert_eq!(
        harness
            .runtime
            .command_status(harness.session, stale_id)
            .expect("stored"),
        stale
    );
    let current = harness.snapshot(execution).await.version;
    assert_eq!(
        stale.version, current,
        "the rejection reports the version to use next"
    );
    let continued = harness
        .command_with(execution, CommandId::new(), "continue", None, Some(current))
        .await;
    assert_eq!(continued.status, "applied", "{continued:?}");
    assert_eq!(
        harness.wait_for_state(execution, "completed").await.text,
        "done"
    );
}
