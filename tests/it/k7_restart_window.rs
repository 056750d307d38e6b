//! K-7: an execution's own restart window. A start body (agent or function) may carry one,
//! `set_policy` changes it (version-fenced, starting nothing), and startup recovery applies
//! each execution's own window, the runtime's only to those without one. Each test stops a
//! runtime the way a crash does and opens the next one on the same store with a wall clock
//! it moves, as `restart_window.rs` does.

use std::time::Duration;

use openprogram::storage::{Event, ExecutionId};
use openprogram::{RestartWindow, StartRequest};
use serde_json::json;

use crate::support::*;

/// Admits a turn of `script` with its own `window` into a session of its own, and waits for
/// its first event that `reached` takes.
async fn started_with(
    restarts: &Restarts,
    runtime: &openprogram::Runtime,
    window: Option<&str>,
    script: Vec<serde_json::Value>,
    reached: fn(&Event) -> bool,
) -> (openprogram::storage::SessionId, ExecutionId) {
    let session = openprogram::storage::SessionId::new();
    let body = json!({"message": "test", "script": script, "restart_window": window});
    let request: StartRequest = serde_json::from_value(body).expect("a start body");
    let started = runtime
        .start_execution(session, request)
        .await
        .expect("start");
    let execution = started.execution_id;
    restarts.admitted_apart(execution, session);
    restarts
        .wait_events(runtime, execution, "the step", 1, reached)
        .await;
    (session, execution)
}

/// A turn of the freezing provider, abandoned with its second model request in flight.
async fn frozen_with(
    restarts: &Restarts,
    runtime: &openprogram::Runtime,
    window: Option<&str>,
) -> (openprogram::storage::SessionId, ExecutionId) {
    let decided = |event: &Event| matches!(event, Event::ModelDecided { .. });
    let script = vec![echo("a"), reply("done")];
    started_with(restarts, runtime, window, script, decided).await
}

#[tokio::test]
async fn k7_recovery_applies_each_executions_own_window_and_the_runtimes_to_the_others() {
    k7_recovery_applies_each_executions_own_window_on(Restarts::new()).await
}

/// The body of `k7_recovery_applies_each_executions_own_window_and_the_runtimes_to_the_others`,
/// on either store (N-1: `postgres.rs` runs it on PostgreSQL).
pub(crate) async fn k7_recovery_applies_each_executions_own_window_on(restarts: Restarts) {
    let runtime = restarts.open_freezing(1, RestartWindow::Unlimited);
    let (_, own_two_hours) = frozen_with(&restarts, &runtime, Some("2h")).await;
    let (_, own_unlimited) = frozen_with(&restarts, &runtime, Some("-1")).await;
    let (_, the_runtimes) = frozen_with(&restarts, &runtime, None).await;
    crash(runtime);
    // Three hours later, under a runtime window of one hour: the execution whose own window
    // is two hours expires, the unlimited one continues, the one without follows the runtime.
    restarts.clock.advance(Duration::from_secs(3 * 3600));
    let runtime = restarts.open(RestartWindow::Within(Duration::from_secs(3600)));
    let report = runtime.recovery().await.expect("recovery");
    let mut expired = report.expired.clone();
    expired.sort();
    let mut expected = vec![own_two_hours, the_runtimes];
    expected.sort();
    assert_eq!(expired, expected, "{report:?}");
    assert_eq!(report.resumed, vec![own_unlimited], "{report:?}");
    runtime.halt();
}

#[tokio::test]
async fn k7_set_policy_changes_an_agents_window_version_fenced_and_recovery_follows_it() {
    let restarts = Restarts::new();
    let runtime = restarts.open_freezing(1, RestartWindow::Unlimited);
    let (session, execution) = frozen_with(&restarts, &runtime, None).await;
    let own_window = || async {
        let snapshot = runtime.snapshot(session, execution).await;
        snapshot.expect("snapshot").restart_window
    };
    let before = runtime
        .snapshot(session, execution)
        .await
        .expect("snapshot");
    assert!(before.capabilities.contains(&"set_policy"), "{before:?}");
    assert_eq!(before.restart_window, None, "the runtime's applies");
    // A stale version is refused, and changes nothing.
    let stale = command_of(json!({
        "kind": "set_policy", "restart_window": "-1", "expected_version": before.version - 1,
    }));
    let refused = runtime.command(session, execution, stale).await;
    assert!(
        refused.is_err()
            || refused
                .as_ref()
                .is_ok_and(|reply| reply.status == "rejected"),
        "{refused:?}"
    );
    assert_eq!(own_window().await, None);
    // A version policy is a function's: refused whole, nothing changes.
    let both =
        command_of(json!({"kind": "set_policy", "policy": "use_latest", "restart_window": "-1"}));
    let reply = runtime
        .command(session, execution, both)
        .await
        .expect("answered");
    assert_eq!(reply.status, "rejected", "{reply:?}");
    assert_eq!(own_window().await, None);
    let set = command_of(json!({
        "kind": "set_policy", "restart_window": -1, "expected_version": before.version,
    }));
    let reply = runtime
        .command(session, execution, set)
        .await
        .expect("applied");
    assert_eq!(reply.status, "applied", "{reply:?}");
    let after = runtime
        .snapshot(session, execution)
        .await
        .expect("snapshot");
    assert_eq!(after.restart_window.as_deref(), Some("-1"));
    assert_eq!(
        after.state, before.state,
        "a policy change starts and stops nothing"
    );
    crash(runtime);
    // Under a runtime that restarts nothing by itself, its own unlimited window continues it.
    restarts.clock.advance(Duration::from_secs(3600));
    let runtime = restarts.open(RestartWindow::Disabled);
    let report = runtime.recovery().await.expect("recovery");
    assert_eq!(report.resumed, vec![execution], "{report:?}");
    runtime
        .wait_finished(session, execution)
        .await
        .expect("finished");
    let done = runtime
        .snapshot(session, execution)
        .await
        .expect("snapshot");
    assert_eq!((done.state, done.text.as_str()), ("completed", "done"));
    runtime.halt();
}

/// An orderly shutdown records each running execution's deadline from its own window.
#[tokio::test]
async fn k7_an_orderly_shutdown_takes_each_executions_own_window_for_its_deadline() {
    let restarts = Restarts::new();
    let runtime = restarts.open(RestartWindow::Unlimited);
    let script = || vec![sleep(200), sleep(200), reply("done")];
    let sleeping = is_sleep_dispatch_or_decision;
    let (_, own) = started_with(&restarts, &runtime, Some("2h"), script(), sleeping).await;
    let (_, other) = started_with(&restarts, &runtime, None, script(), sleeping).await;
    let now_ms = openprogram::Clock::now_ms(restarts.clock.as_ref());
    let report = runtime.shutdown().await;
    assert_eq!((report.live, report.left_running), (2, 0), "{report:?}");
    drop(runtime);
    let store = restarts.open_store();
    let intent = |execution| {
        let head = store.head(execution).expect("head").expect("exists");
        head.restart_intent.expect("a restart intent")
    };
    assert_eq!(intent(own).deadline_ms, Some(now_ms + 2 * 3600 * 1000));
    assert_eq!(
        intent(other).deadline_ms,
        None,
        "the runtime's window: unlimited"
    );
}

#[tokio::test]
async fn k7_a_malformed_window_is_refused_and_nothing_is_stored() {
    let bad = json!({"message": "x", "restart_window": "two hours"});
    let parsed = serde_json::from_value::<StartRequest>(bad);
    assert!(parsed.is_err_and(|error| error.to_string().contains("restart window")));
    let command = serde_json::from_value::<serde_json::Value>(json!({
        "command_id": openprogram::storage::CommandId::new(), "kind": "set_policy", "restart_window": true,
    }))
    .expect("json");
    let refused = openprogram::Command::from_json(&command);
    assert!(refused.is_err(), "{refused:?}");
    let none = json!({"command_id": openprogram::storage::CommandId::new(), "kind": "set_policy"});
    assert!(openprogram::Command::from_json(&none).is_err());
}
