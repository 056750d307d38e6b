//! Table tests of the pure machine's part in restart recovery: reconciliation of unknown
//! effects, the restart pause, expiry and commands pending across a crash
//! . Shares the helpers of `tests.rs`.

use openprogram_storage::{
    CommandId, Control, EffectId, Event, ExecutionState as Status, ReceiptStatus,
};

use super::tests::{attempt, commit, control, ctl, offered, run, running, steer, tool_decision};
use super::*;

/// A machine left `reconciliation_required` by an External tool whose dispatch an earlier
/// attempt never finished; returns it and the unknown effect.
fn unknown_effect() -> (Machine, EffectId) {
    let mut machine = running(50);
    let external = |_: &str| Recovery::External;
    let decision = EffectId::new();
    run(
        &mut machine,
        Input::ModelDecided {
            effect_id: decision,
            decision: tool_decision("append"),
        },
        true,
    );
    let Next::Persist(dispatch) = machine.next(EffectId::new, external, 0) else {
        panic!("dispatch")
    };
    commit(&mut machine, &dispatch);
    commit(&mut machine, &[attempt()]);
    let Next::Persist(unknown) = machine.next(EffectId::new, external, 0) else {
        panic!("unknown receipt")
    };
    let actions = commit(&mut machine, &unknown);
    assert!(actions.contains(&Action::Reconcile), "{actions:?}");
    assert_eq!(machine.status(), Status::ReconciliationRequired);
    (machine, tool_effect(decision))
}

fn reconcile(effect_id: EffectId, status: ReceiptStatus) -> Control {
    Control::Reconcile {
        effect_id,
        status,
        output: "checked".into(),
    }
}

#[test]
fn r8_only_reconcile_or_cancel_moves_an_unknown_effect() {
    let (machine, _) = unknown_effect();
    // No fork (K-3): the only saved point's next step is the unknown effect itself.
    assert_eq!(offered(&machine), vec!["reconcile", "cancel", "set_policy"]);
    for c in [Control::Pause, Control::Continue, Control::Step, steer()] {
        assert!(control(&machine, c, false).is_err());
    }
    // A reconcile resolves as `confirmed` or `not_applied` only: the typed command
    // (`ReconcileOutcome`) has no other outcome to send.
    assert!(
        control(
            &machine,
            reconcile(EffectId::new(), ReceiptStatus::Confirmed),
            false
        )
        .is_err(),
        "another effect"
    );
}

#[test]
fn r8_confirmed_continues_with_the_result_and_not_applied_runs_the_effect_again() {
    let (mut confirmed, effect) = unknown_effect();
    let actions = ctl(
        &mut confirmed,
        reconcile(effect, ReceiptStatus::Confirmed),
        false,
    );
    assert!(actions.contains(&Action::Advance));
    assert_eq!(confirmed.status(), Status::Running);
    assert_eq!(
        confirmed.receipts.get(effect).map(|r| r.status),
        Some(ReceiptStatus::Confirmed)
    );
    assert!(
        confirmed.present.calls.unresolved.is_none()
            && confirmed.present.calls.pending_tool.is_none()
    );
    assert!(matches!(
        confirmed.next(EffectId::new, |_| Recovery::External, 0),
        Next::CallModel { .. }
    ));

    let (mut not_applied, effect) = unknown_effect();
    ctl(
        &mut not_applied,
        reconcile(effect, ReceiptStatus::NotApplied),
        false,
    );
    assert_eq!(
        not_applied.receipts.get(effect).map(|r| r.status),
        Some(ReceiptStatus::NotApplied)
    );
    match not_applied.next(EffectId::new, |_| Recovery::External, 0) {
        Next::Persist(events) => assert!(
            matches!(&events[0], Event::ToolDispatched { effect_id, .. } if *effect_id == effect),
            "dispatched again under the same effect id: {events:?}"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn r7_the_restart_pause_records_its_intent_and_applies_only_to_running_work() {
    let intent = openprogram_storage::RestartIntent {
        deadline_ms: None,
        recorded_at_ms: 1,
        reason: "orderly shutdown".into(),
    };
    let mut machine = running(50);
    let events = machine
        .restart_pause(intent.clone())
        .expect("running pauses");
    assert!(matches!(events[0], Event::RestartIntentRecorded { .. }));
    let actions = commit(&mut machine, &events);
    assert!(actions.contains(&Action::Park));
    assert_eq!(
        machine.present.run.pause_reason.as_deref(),
        Some(RESTART_PAUSE_REASON)
    );
    assert!(
        machine.restart_pause(intent.clone()).is_none(),
        "paused already"
    );
    // A user's Pause applied while an effect ran wins over the restart pause: it stays the
    // user's (explicit after a restart), with no restart intent.
    let mut user_paused = running(50);
    ctl(&mut user_paused, Control::Pause, true);
    let events = user_paused.restart_pause(intent.clone()).expect("pauses");
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::RestartIntentRecorded { .. })),
        "{events:?}"
    );
    commit(&mut user_paused, &events);
    assert_eq!(
        user_paused.present.run.pause_reason.as_deref(),
        Some("pause")
    );
    let mut stepping = running(50);
    commit(
        &mut stepping,
        &[Event::StateChanged {
            state: Status::Paused,
            reason: "pause".into(),
        }],
    );
    ctl(&mut stepping, Control::Step, false);
    let events = stepping.restart_pause(intent.clone()).expect("pauses");
    commit(&mut stepping, &events);
    assert_eq!(
        stepping.present.run.pause_reason.as_deref(),
        Some("step"),
        "a Step never becomes a free run"
    );
    let mut cancelling = running(50);
    ctl(&mut cancelling, Control::Cancel, true);
    assert!(
        cancelling.restart_pause(intent).is_none(),
        "a cancel is finished, not paused"
    );
}

#[test]
fn r6_an_expired_execution_continues_by_hand() {
    let mut machine = running(50);
    commit(
        &mut machine,
        &[Event::StateChanged {
            state: Status::Expired,
            reason: "restart window expired".into(),
        }],
    );
    assert!(offered(&machine).contains(&CommandKind::Continue));
    ctl(&mut machine, Control::Continue, false);
    assert_eq!(machine.status(), Status::Running);
}

#[test]
fn r5_commands_accepted_and_never_decided_are_pending_until_decided() {
    let mut machine = running(50);
    let command_id = CommandId::new();
    commit(
        &mut machine,
        &[Event::ControlAccepted {
            command_id,
            control: Control::Pause,
        }],
    );
    assert_eq!(
        machine.present.run.pending_commands,
        vec![(command_id, Control::Pause)]
    );
    commit(
        &mut machine,
        &[Event::ControlApplied {
            command_id,
            control: Control::Pause,
        }],
    );
    assert!(machine.present.run.pending_commands.is_empty());
}
