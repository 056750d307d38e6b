//! Table tests of the pure machine's rules for durable functions: a step whose run ended
//! before it started (F-5). Shares the helpers of `tests.rs`.

use openprogram_storage::{
    Control, EffectId, Event, ExecutionKind, ExecutionState as Status, ReceiptStatus,
};

use super::tests::{admitted_as, attempt, commit, ctl};
use super::*;

/// A function execution running, its step `s` intent committed (External).
fn at_a_step(effect_id: EffectId) -> Machine {
    let input = FunctionInput {
        function: "f".into(),
        revision: 1,
        input: serde_json::Value::Null,
        policy: Default::default(),
        identity: String::new(),
        called_by: None,
    };
    let input = serde_json::to_string(&input).expect("input");
    let admitted = admitted_as(ExecutionKind::Function, input);
    let mut machine = Machine::default();
    let started = Event::StepStarted {
        step_id: "s".into(),
        effect_id,
    };
    commit(&mut machine, &[admitted, attempt(), started]);
    assert_eq!(machine.status(), Status::Running);
    machine
}

fn next(machine: &Machine) -> Vec<Event> {
    match machine.next(EffectId::new, |_| Recovery::External, 0) {
        Next::Persist(events) => events,
        other => panic!("expected events to persist, got {other:?}"),
    }
}

fn receipt(events: &[Event]) -> Option<ReceiptStatus> {
    events.iter().find_map(|event| match event {
        Event::StepFinished { status, .. } => Some(*status),
        _ => None,
    })
}

fn state(events: &[Event]) -> Option<Status> {
    events.iter().find_map(|event| match event {
        Event::StateChanged { state, .. } => Some(*state),
        _ => None,
    })
}

#[test]
fn f5_a_step_its_attempt_saw_end_before_it_started_is_not_started_and_cancel_wins() {
    let effect_id = EffectId::new();
    let mut machine = at_a_step(effect_id);
    ctl(&mut machine, Control::Cancel, true);
    // The receipt first, alone: it needs no reconciliation.
    let events = machine.not_started(&[effect_id].into()).expect("receipts");
    assert_eq!(receipt(&events), Some(ReceiptStatus::NotStarted));
    assert_eq!(state(&events), None);
    let actions = commit(&mut machine, &events);
    assert!(machine.present.calls.pending_steps.is_empty());
    assert_eq!(
        actions,
        [Action::Advance],
        "what stopped the run is decided next"
    );
    assert_eq!(state(&next(&machine)), Some(Status::Cancelled));
    // Another effect id, or none pending: no receipt.
    assert_eq!(machine.not_started(&[effect_id].into()), None);
}

#[test]
fn f5_a_step_that_may_have_run_stays_unknown() {
    // Nobody saw it not start (its run ended mid-step, or a crash): unknown, reconciled.
    let effect_id = EffectId::new();
    let machine = at_a_step(effect_id);
    assert_eq!(machine.not_started(&[EffectId::new()].into()), None);
    let events = next(&machine);
    assert_eq!(receipt(&events), Some(ReceiptStatus::Unknown));
    assert_eq!(state(&events), Some(Status::ReconciliationRequired));
}

#[test]
fn f5_a_body_that_returned_past_a_step_that_never_started_completes() {
    let effect_id = EffectId::new();
    let machine = at_a_step(effect_id);
    let events = machine.decide_returned(Ok("\"done\"".into()), &[effect_id].into());
    assert_eq!(receipt(&events), Some(ReceiptStatus::NotStarted));
    assert_eq!(state(&events), Some(Status::Completed));
    // Nothing seen: the step is in doubt, the return no result.
    let events = machine.decide_returned(Ok("\"done\"".into()), &Default::default());
    assert_eq!(receipt(&events), Some(ReceiptStatus::Unknown));
    assert_eq!(state(&events), Some(Status::ReconciliationRequired));
}
