//! Table-driven tests of the pure state machine: every control in every state, cancel
//! precedence (K-5), Step = exactly one step, Steer touching only unrun work, the iteration
//! limit (E-5), External tools dispatched before they run (E-4), and replay.

use openprogram_storage::{
    AttemptId, CommandId, Control, EffectId, Event, ExecutionKind, ExecutionState as Status,
    MessageId, OwnerId, ReceiptStatus, RevisionId, RunId, SessionId, TurnId,
};

use super::*;

/// An admission with an empty script; shared with the simulation (`sim.rs`).
pub(crate) fn admitted(max_iterations: u32) -> Event {
    let input =
        serde_json::json!({"message": "hi", "script": [], "max_iterations": max_iterations});
    admitted_as(ExecutionKind::AgentTurn, input.to_string())
}

/// An admission of `kind` with `input` (its JSON text), in a new session.
pub(crate) fn admitted_as(kind: ExecutionKind, input: String) -> Event {
    Event::Admitted {
        kind,
        session_id: SessionId::new(),
        run_id: RunId::new(),
        parent_execution_id: None,
        revision_id: RevisionId::new(),
        turn_id: TurnId::new(),
        user_message_id: MessageId::new(),
        reply_message_id: MessageId::new(),
        parent_message_id: None,
        input,
    }
}

pub(crate) fn attempt() -> Event {
    Event::AttemptStarted {
        attempt_id: AttemptId::new(),
        owner_id: OwnerId::new(),
        epoch: 1,
    }
}

/// Applies events as the shell does after a commit; returns the actions.
pub(crate) fn commit(machine: &mut Machine, events: &[Event]) -> Vec<Action> {
    let mut actions = Vec::new();
    for event in events {
        let seq = machine.present.run.checkpoint_seq + 1;
        machine.apply(event, seq, &mut actions);
    }
    actions
}

pub(crate) fn running(max_iterations: u32) -> Machine {
    let mut machine = Machine::default();
    commit(&mut machine, &[admitted(max_iterations), attempt()]);
    assert_eq!(machine.status(), Status::Running);
    machine
}

/// What the shell decides a command against: the machine's own revision (so Fork and
/// Retry are loadable), `busy` as given, and no version check.
pub(crate) fn at(machine: &Machine, busy: bool) -> CommandContext {
    CommandContext {
        version: 0,
        contract: crate::machine::Contract::of(
            machine.present.turn.revision_id.unwrap_or_default(),
        ),
        busy,
        now_ms: 0,
        session: None,
        holds_session: true,
    }
}

/// The controls the machine offers now (K-3), as the shell asks.
pub(crate) fn offered(machine: &Machine) -> Vec<CommandKind> {
    machine.capabilities(&at(machine, false))
}

/// Decides a control of this execution as the shell does (`decide_command`).
pub(crate) fn control(
    machine: &Machine,
    control: Control,
    busy: bool,
) -> Result<Vec<Event>, Rejection> {
    match machine.decide_command(CommandId::new(), control.into(), None, &at(machine, busy))? {
        Accepted::Control { events, .. } => Ok(events),
        other => panic!("a control decided as {other:?}"),
    }
}

/// Decides a control and commits it, as the shell does.
pub(crate) fn ctl(machine: &mut Machine, c: Control, busy: bool) -> Vec<Action> {
    let events = control(machine, c, busy).expect("control accepted");
    commit(machine, &events)
}

/// Decides an input and commits it, as the shell does.
pub(crate) fn run(machine: &mut Machine, input: Input, _busy: bool) -> Vec<Action> {
    let events = machine.decide(input).expect("input accepted");
    commit(machine, &events)
}

fn idempotent(_: &str) -> Recovery {
    Recovery::Idempotent
}

pub(crate) fn tool_decision(tool: &str) -> Decision {
    Decision::tool(tool.into(), serde_json::json!({"text": "x"}).into())
}

/// The machine in a given situation, for the control table.
fn in_situation(situation: &str) -> (Machine, bool) {
    let mut machine = running(50);
    let busy = match situation {
        "queued" => {
            machine = Machine::default();
            commit(&mut machine, &[admitted(50)]);
            false
        }
        "running idle" => false,
        "running busy" => true,
        "paused" => {
            let events = control(&machine, Control::Pause, false).expect("pause");
            commit(&mut machine, &events);
            false
        }
        "cancelling" => {
            let events = control(&machine, Control::Cancel, true).expect("cancel");
            commit(&mut machine, &events);
            true
        }
        "completed" | "failed" | "cancelled" => {
            let state = match situation {
                "completed" => Status::Completed,
                "failed" => Status::Failed,
                _ => Status::Cancelled,
            };
            commit(
                &mut machine,
                &[Event::StateChanged {
                    state,
                    reason: "test".into(),
                }],
            );
            false
        }
        other => panic!("unknown situation {other}"),
    };
    (machine, busy)
}

pub(crate) fn steer() -> Control {
    Control::Steer {
        text: "be brief".into(),
    }
}

#[test]
fn k2_k3_every_control_in_every_state() {
    use Status::*;
    // (situation, control, expected status after the commit, or None for a rejection)
    let table: Vec<(&str, Control, Option<Status>)> = vec![
        ("queued", Control::Pause, Some(Paused)),
        ("queued", Control::Continue, None),
        ("queued", Control::Step, None),
        ("queued", steer(), Some(Queued)),
        ("queued", Control::Cancel, Some(Cancelled)),
        ("running idle", Control::Pause, Some(Paused)),
        ("running idle", Control::Continue, None),
        ("running idle", Control::Step, None),
        ("running idle", steer(), Some(Running)),
        ("running idle", Control::Cancel, Some(Cancelled)),
        // Pause during an effect: the effect may finish; the pause lands at the next safe point.
        ("running busy", Control::Pause, Some(Running)),
        ("running busy", Control::Continue, None),
        ("running busy", Control::Step, None),
        ("running busy", steer(), Some(Running)),
        ("running busy", Control::Cancel, Some(Cancelling)),
        ("paused", Control::Pause, None),
        ("paused", Control::Continue, Some(Running)),
        ("paused", Control::Step, Some(Running)),
        ("paused", steer(), Some(Paused)),
        ("paused", Control::Cancel, Some(Cancelled)),
        ("cancelling", Control::Pause, None),
        ("cancelling", Control::Continue, None),
        ("cancelling", Control::Step, None),
        ("cancelling", steer(), None),
        ("cancelling", Control::Cancel, None),
    ];
    let mut rows = table;
    for terminal in ["completed", "failed", "cancelled"] {
        for c in [
            Control::Pause,
            Control::Continue,
            Control::Step,
            steer(),
            Control::Cancel,
        ] {
            rows.push((terminal, c, None));
        }
    }
    for (situation, c, expected) in rows {
        let (mut machine, busy) = in_situation(situation);
        let kind = c.kind();
        match (control(&machine, c, busy), expected) {
            (Ok(events), Some(status)) => {
                assert!(
                    matches!(events[0], Event::ControlApplied { .. }),
                    "{situation}/{kind}"
                );
                commit(&mut machine, &events);
                assert_eq!(machine.status(), status, "{situation}/{kind}");
            }
            (Err(rejection), None) => {
                assert!(
                    !rejection
                        .capabilities
                        .iter()
                        .any(|offered| offered.as_str() == kind),
                    "{situation}/{kind}: {rejection:?}"
                );
            }
            (other, expected) => panic!("{situation}/{kind}: got {other:?}, expected {expected:?}"),
        }
    }
}

#[test]
fn k5_cancel_takes_precedence_and_late_results_are_recorded_not_acted_on() {
    let mut machine = running(50);
    let decision = EffectId::new();
    let events = machine
        .decide(Input::ModelDecided {
            effect_id: decision,
            decision: tool_decision("sleep"),
        })
        .expect("decided");
    commit(&mut machine, &events);
    let events = control(&machine, Control::Cancel, true).expect("cancel");
    let actions = commit(&mut machine, &events);
    assert!(actions.contains(&Action::AbortEffect));
    assert_eq!(machine.status(), Status::Cancelling);
    for c in [Control::Pause, Control::Continue, Control::Step, steer()] {
        let rejection = control(&machine, c, true).expect_err("refused while cancelling");
        assert!(
            rejection.reason().contains("cancellation takes precedence"),
            "{rejection:?}"
        );
    }
    let tool = tool_effect(decision);
    let late = machine
        .decide(Input::ToolFinished {
            effect_id: tool,
            status: ReceiptStatus::Confirmed,
            output: "done".into(),
        })
        .expect("late result");
    commit(&mut machine, &late);
    assert_eq!(machine.status(), Status::Cancelled);
    assert_eq!(
        machine.receipts.get(tool).map(|r| r.status),
        Some(ReceiptStatus::Confirmed)
    );
}

#[test]
fn k2_step_runs_exactly_one_step_then_pauses() {
    let mut machine = running(50);
    ctl(&mut machine, Control::Pause, false);
    ctl(&mut machine, Control::Step, false);
    assert_eq!(machine.status(), Status::Running);
    let fresh = EffectId::new();
    assert_eq!(
        machine.next(|| fresh, idempotent, 0),
        Next::CallModel { effect_id: fresh }
    );
    let decided = machine
        .decide(Input::ModelDecided {
            effect_id: fresh,
            decision: tool_decision("echo"),
        })
        .expect("decided");
    commit(&mut machine, &decided);
    // One step (the decision) is done: the next thing is to pause, not to run the tool.
    match machine.next(EffectId::new, idempotent, 0) {
        Next::Persist(events) => {
            commit(&mut machine, &events);
        }
        other => panic!("expected the pause, got {other:?}"),
    }
    assert_eq!(machine.status(), Status::Paused);
    assert_eq!(machine.present.run.pause_reason.as_deref(), Some("step"));
    // A second Step runs the tool and nothing more.
    ctl(&mut machine, Control::Step, false);
    let Next::RunTool(pending) = machine.next(EffectId::new, idempotent, 0) else {
        panic!("tool expected")
    };
    let finished = machine
        .decide(Input::ToolFinished {
            effect_id: pending.effect_id,
            status: ReceiptStatus::Confirmed,
            output: "x".into(),
        })
        .expect("finished");
    commit(&mut machine, &finished);
    match machine.next(EffectId::new, idempotent, 0) {
        Next::Persist(events) => assert!(matches!(
            events.as_slice(),
            [Event::StateChanged { state: Status::Paused, reason }] if reason == "step"
        )),
        other => panic!("expected the pause after the second step, got {other:?}"),
    }
}

#[test]
fn k2_steer_reaches_only_the_reply_not_yet_written() {
    let mut machine = running(50);
    ctl(&mut machine, steer(), true);
    let reply = machine
        .decide(Input::ModelDecided {
            effect_id: EffectId::new(),
            decision: Decision::reply("done".into()),
        })
        .expect("reply");
    commit(&mut machine, &reply);
    assert_eq!(machine.status(), Status::Completed);
    assert_eq!(machine.text, "done\n[steer] be brief");
    assert!(
        control(&machine, steer(), false).is_err(),
        "no steering after the reply"
    );
}

#[test]
fn e5_iteration_limit_fails_with_text_and_history_kept() {
    let mut machine = running(2);
    for _ in 0..2 {
        let fresh = EffectId::new();
        assert_eq!(
            machine.next(|| fresh, idempotent, 0),
            Next::CallModel { effect_id: fresh }
        );
        run(
            &mut machine,
            Input::ModelDecided {
                effect_id: fresh,
                decision: tool_decision("echo"),
            },
            true,
        );
        let Next::RunTool(pending) = machine.next(EffectId::new, idempotent, 0) else {
            panic!("tool expected")
        };
        run(
            &mut machine,
            Input::ToolFinished {
                effect_id: pending.effect_id,
                status: ReceiptStatus::Confirmed,
                output: "x".into(),
            },
            true,
        );
    }
    let Next::Persist(events) = machine.next(EffectId::new, idempotent, 0) else {
        panic!("limit expected")
    };
    commit(&mut machine, &events);
    assert_eq!(machine.status(), Status::Failed);
    assert!(
        machine.text.contains("iteration limit of 2"),
        "{}",
        machine.text
    );
    assert_eq!(
        machine.context.len(),
        4,
        "decisions and tool results are kept"
    );
}

#[test]
fn e4_external_tool_is_dispatched_before_it_runs() {
    let mut machine = running(50);
    let fresh = EffectId::new();
    run(
        &mut machine,
        Input::ModelDecided {
            effect_id: fresh,
            decision: tool_decision("append"),
        },
        true,
    );
    let external = |_: &str| Recovery::External;
    let Next::Persist(events) = machine.next(EffectId::new, external, 0) else {
        panic!("dispatch first")
    };
    assert!(matches!(events[0], Event::ToolDispatched { .. }));
    commit(&mut machine, &events);
    assert_eq!(
        machine.receipts.get(tool_effect(fresh)).map(|r| r.status),
        Some(ReceiptStatus::Dispatched)
    );
    assert!(matches!(
        machine.next(EffectId::new, external, 0),
        Next::RunTool(_)
    ));
}

#[test]
fn replay_without_actions_rebuilds_the_same_state() {
    let mut log = vec![admitted(50), attempt()];
    let mut live = Machine::default();
    commit(&mut live, &log);
    let fresh = EffectId::new();
    let decided = live
        .decide(Input::ModelDecided {
            effect_id: fresh,
            decision: tool_decision("echo"),
        })
        .expect("decided");
    commit(&mut live, &decided);
    log.extend(decided);
    let steered = control(&live, steer(), false).expect("steer");
    commit(&mut live, &steered);
    log.extend(steered);
    let mut replayed = Machine::default();
    commit(&mut replayed, &log);
    assert_eq!(replayed, live);
}

#[test]
fn e4_a_dispatched_external_tool_is_never_rerun_by_a_later_attempt() {
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
    let actions = commit(&mut machine, &dispatch);
    assert!(
        actions.contains(&Action::RunDispatched),
        "run at once, in the same turn: {actions:?}"
    );
    // The worker dies before the result is recorded; a new attempt starts.
    let actions = commit(&mut machine, &[attempt()]);
    assert!(actions.contains(&Action::Advance));
    match machine.next(EffectId::new, external, 0) {
        Next::Persist(events) => {
            assert!(
                matches!(
                    events[0],
                    Event::ToolFinished {
                        status: ReceiptStatus::Unknown,
                        ..
                    }
                ),
                "{events:?}"
            );
            commit(&mut machine, &events);
        }
        other => panic!("expected the unknown receipt, got {other:?}"),
    }
    assert_eq!(machine.status(), Status::ReconciliationRequired);
    assert_eq!(
        machine
            .receipts
            .get(tool_effect(decision))
            .map(|r| r.status),
        Some(ReceiptStatus::Unknown)
    );
    assert_eq!(
        machine.next(EffectId::new, external, 0),
        Next::Idle,
        "nothing runs again"
    );
}

#[test]
fn k5_a_reply_arriving_after_cancel_does_not_complete() {
    let mut machine = running(50);
    ctl(&mut machine, Control::Cancel, true);
    let reply = Decision::reply("late".into());
    run(
        &mut machine,
        Input::ModelDecided {
            effect_id: EffectId::new(),
            decision: reply,
        },
        false,
    );
    assert_eq!(machine.status(), Status::Cancelled);
    assert!(
        machine.text.is_empty(),
        "no reply was delivered: {}",
        machine.text
    );
    let mut failed = running(50);
    ctl(&mut failed, Control::Cancel, true);
    run(
        &mut failed,
        Input::ModelFailed {
            effect_id: EffectId::new(),
            error: "late".into(),
        },
        false,
    );
    assert_eq!(failed.status(), Status::Cancelled);
}

#[test]
fn k5_a_cancelling_execution_finishes_cancelling_in_its_next_attempt() {
    let mut machine = running(50);
    ctl(&mut machine, Control::Cancel, true);
    assert_eq!(machine.status(), Status::Cancelling);
    let actions = commit(&mut machine, &[attempt()]);
    assert!(actions.contains(&Action::Advance));
    let Next::Persist(events) = machine.next(EffectId::new, idempotent, 0) else {
        panic!("cancel expected")
    };
    commit(&mut machine, &events);
    assert_eq!(machine.status(), Status::Cancelled);
}

#[test]
fn a_tool_result_for_another_effect_is_refused() {
    let mut machine = running(50);
    run(
        &mut machine,
        Input::ModelDecided {
            effect_id: EffectId::new(),
            decision: tool_decision("echo"),
        },
        true,
    );
    let stray = Input::ToolFinished {
        effect_id: EffectId::new(),
        status: ReceiptStatus::Confirmed,
        output: "x".into(),
    };
    assert!(machine.decide(stray).is_err());
}

/// A tool decision whose arguments are arrays nested `depth` levels deep.
fn nested_decision(depth: usize) -> Decision {
    let mut args = serde_json::json!("leaf");
    for _ in 0..depth {
        args = serde_json::json!([args]);
    }
    Decision::tool("echo".into(), args.into())
}

#[test]
fn e3_a_decision_that_could_not_be_read_back_fails_the_model_call() {
    let machine = running(50);
    let decide = |decision| {
        machine.decide(Input::ModelDecided {
            effect_id: EffectId::new(),
            decision,
        })
    };
    // As deep as allowed: recorded, and its text reads back as the same decision.
    let events = decide(nested_decision(super::types::DECISION_ARGS_DEPTH_MAX)).expect("decided");
    let Some(Event::ModelDecided { decision, .. }) = events.first() else {
        panic!("no decision recorded: {events:?}");
    };
    let read_back: Decision = serde_json::from_str(decision).expect("reads back");
    assert_eq!(
        read_back,
        nested_decision(super::types::DECISION_ARGS_DEPTH_MAX)
    );
    // One level deeper: the model call fails with the reason, nothing is recorded as decided.
    let events =
        decide(nested_decision(super::types::DECISION_ARGS_DEPTH_MAX + 1)).expect("decided");
    assert!(
        matches!(&events[..], [Event::ModelFailed { error, .. }, Event::StateChanged { state: Status::Failed, .. }]
            if error.contains("nest deeper")),
        "{events:?}"
    );
}

#[test]
fn e3_a_tool_gets_the_numbers_the_provider_decided() {
    // Finite f64s of every magnitude and precision, from a fixed xorshift sequence.
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let mut checked = 0;
    while checked < 20_000 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let number = f64::from_bits(state);
        if !number.is_finite() {
            continue;
        }
        checked += 1;
        let decided = serde_json::json!({"n": number});
        let args = ToolArgs::from(decided.clone());
        assert_eq!(
            args.parse().ok(),
            Some(decided),
            "{number:e} as {}",
            args.get()
        );
    }
}

#[test]
fn e3_nesting_is_counted_outside_strings_only() {
    use super::types::nesting;
    let deep = "[".repeat(super::types::DECISION_ARGS_DEPTH_MAX + 1);
    let cases = [
        (r#""text""#.to_owned(), 0),
        ("[]".to_owned(), 1),
        (r#"{"a":[{"b":[]}],"c":{}}"#.to_owned(), 4),
        (format!(r#"{{"text":"{deep}","list":[]}}"#), 2),
        (r#"{"q":"\"[[{{","b":"\\","c":[[]]}"#.to_owned(), 3),
        (r#"["]\"]"]"#.to_owned(), 1),
    ];
    for (text, depth) in cases {
        assert!(
            serde_json::from_str::<serde_json::Value>(&text).is_ok(),
            "{text}"
        );
        assert_eq!(nesting(&text), depth, "{text}");
    }
    // Not JSON, but read without a panic: a string cut short, an escape at the very end.
    assert_eq!((nesting(r#"[{"a":"[["#), nesting(r#"[["x\"#)), (2, 2));
    // Brackets inside a string are text: such a decision is recorded, not refused.
    let events = running(50)
        .decide(Input::ModelDecided {
            effect_id: EffectId::new(),
            decision: Decision::tool("echo".into(), serde_json::json!({"text": deep}).into()),
        })
        .expect("decided");
    assert!(
        matches!(events.first(), Some(Event::ModelDecided { .. })),
        "{events:?}"
    );
}

#[test]
fn k1_a_pause_reason_says_why_a_paused_execution_is_paused_and_goes_with_the_pause() {
    let mut machine = running(10);
    let changed = |state, reason: &str| Event::StateChanged {
        state,
        reason: reason.into(),
    };
    commit(&mut machine, &[changed(Status::Paused, "pause")]);
    assert_eq!(machine.present.run.pause_reason.as_deref(), Some("pause"));
    // A restart-recovery pause that expires, or is cancelled, is not paused any more.
    commit(
        &mut machine,
        &[changed(Status::Expired, "restart window expired")],
    );
    assert_eq!(machine.present.run.pause_reason, None);
}

/// R-8: a tool that reports its outcome unknown while it runs (a request sent, no answer)
/// stops the execution for reconciliation in the transition that records it: Reconcile is
/// offered and nothing runs the call again.
#[test]
fn r8_a_live_unknown_result_requires_reconciliation_at_once() {
    let mut machine = running(50);
    let decision = EffectId::new();
    let events = machine
        .decide(Input::ModelDecided {
            effect_id: decision,
            decision: tool_decision("http"),
        })
        .expect("decided");
    commit(&mut machine, &events);
    let tool = tool_effect(decision);
    let events = machine
        .decide(Input::ToolFinished {
            effect_id: tool,
            status: ReceiptStatus::Unknown,
            output: "no answer".into(),
        })
        .expect("recorded");
    let actions = commit(&mut machine, &events);
    assert_eq!(machine.status(), Status::ReconciliationRequired);
    assert!(offered(&machine).contains(&CommandKind::Reconcile));
    assert!(!actions.contains(&Action::RunDispatched), "{actions:?}");
    assert_eq!(
        machine.receipts.get(tool).map(|r| r.status),
        Some(ReceiptStatus::Unknown)
    );
}
