//! Table tests of waits, live questions and processes in the pure machine (W-1..W-4, P-2).

use openprogram_storage::{
    AnswerScope, AttemptId, CommandId, Control, EffectId, Event, ExecutionState as Status,
    LiveBinding, OwnerId, ProcessId, WaitId, WaitKind, WaitStatus,
};

use super::tests::{commit, control, ctl, offered, run, running, tool_decision};
use super::wait_types::{wait_of, WaitSpec};
use super::*;

/// A running machine that asked for approval: `waiting`, with one open wait.
fn asking(prompt: &str) -> (Machine, WaitId) {
    let mut machine = running(50);
    let effect_id = EffectId::new();
    run(
        &mut machine,
        Input::ModelDecided {
            effect_id,
            decision: Decision::Ask {
                prompt: prompt.into(),
                wait: None,
            },
        },
        false,
    );
    (machine, wait_of(effect_id))
}

fn answer(wait_id: WaitId, text: &str) -> Control {
    Control::Answer {
        wait_id,
        answer: text.into(),
        scope: AnswerScope::Operation,
    }
}

fn wait(machine: &Machine, wait_id: WaitId) -> &WaitState {
    machine.wait(wait_id).expect("the wait")
}

#[test]
fn w1_an_ask_opens_a_wait_at_the_checkpoint_published_with_it() {
    let (machine, wait_id) = asking("deploy?");
    assert_eq!(machine.status(), Status::Waiting);
    let opened = wait(&machine, wait_id);
    assert_eq!(opened.kind, WaitKind::Approval);
    assert_eq!(opened.status, WaitStatus::Open);
    assert_eq!(opened.checkpoint_seq, machine.present.run.checkpoint_seq);
    // No fork (K-3): the only saved point is the approval itself.
    assert_eq!(
        offered(&machine),
        vec!["answer", "decline", "steer", "cancel", "set_policy"]
    );
    assert!(machine.present.next_action().contains("\"wait\""));
}

#[test]
fn w2_answer_and_decline_resolve_the_wait_and_resume_with_the_outcome_in_context() {
    for (control, status) in [
        (answer(WaitId::new(), "yes"), WaitStatus::Answered),
        (
            Control::Decline {
                wait_id: WaitId::new(),
            },
            WaitStatus::Declined,
        ),
    ] {
        let (mut machine, wait_id) = asking("deploy?");
        let control = match control {
            Control::Answer { answer, scope, .. } => Control::Answer {
                wait_id,
                answer,
                scope,
            },
            _ => Control::Decline { wait_id },
        };
        let actions = ctl(&mut machine, control, false);
        assert_eq!(machine.status(), Status::Running);
        assert!(actions.contains(&Action::Advance));
        assert_eq!(wait(&machine, wait_id).status, status);
        assert!(matches!(
            machine.context.last(),
            Some(Turn::WaitResolved { status: found, .. }) if *found == status
        ));
        // Resolved: a late answer or decline is refused and approves nothing.
        assert!(control_refused(&machine, answer(wait_id, "yes")));
        assert!(control_refused(&machine, Control::Decline { wait_id }));
    }
}

fn control_refused(machine: &Machine, c: Control) -> bool {
    control(machine, c, false).is_err()
}

#[test]
fn w2_an_accepted_answer_reads_submitted_until_decided_and_open_again_if_rejected() {
    let (mut machine, wait_id) = asking("deploy?");
    let command_id = CommandId::new();
    let accepted = Event::ControlAccepted {
        command_id,
        control: answer(wait_id, "yes"),
    };
    commit(&mut machine, &[accepted]);
    assert_eq!(wait(&machine, wait_id).status, WaitStatus::Submitted);
    assert_eq!(wait(&machine, wait_id).answer.as_deref(), Some("yes"));
    commit(
        &mut machine,
        &[Event::CommandRejected {
            command_id,
            reason: "test".into(),
        }],
    );
    assert_eq!(wait(&machine, wait_id).status, WaitStatus::Open);
    assert_eq!(wait(&machine, wait_id).answer, None);
}

#[test]
fn w2_a_discussion_reply_approves_nothing_and_an_unknown_wait_is_refused() {
    let (mut machine, wait_id) = asking("deploy?");
    assert!(control_refused(&machine, answer(WaitId::new(), "yes")));
    let discussion = Control::Answer {
        wait_id,
        answer: "why?".into(),
        scope: AnswerScope::Discussion,
    };
    ctl(&mut machine, discussion, false);
    assert!(matches!(
        machine.context.last(),
        Some(Turn::WaitResolved {
            discussion: true,
            ..
        })
    ));
}

/// W-3 regression: an answered first wait followed by an open second wait, then an answered
/// second wait. The first wait's outcome never moves the second.
#[test]
fn w3_an_earlier_waits_outcome_never_moves_a_newer_wait() {
    let (mut machine, first) = asking("first?");
    ctl(&mut machine, answer(first, "yes"), false);
    let second_decision = EffectId::new();
    run(
        &mut machine,
        Input::ModelDecided {
            effect_id: second_decision,
            decision: Decision::Ask {
                prompt: "second?".into(),
                wait: None,
            },
        },
        false,
    );
    let second = wait_of(second_decision);
    assert_eq!(machine.status(), Status::Waiting);
    // A redelivered or inherited answer to the first wait: refused, the second stays open.
    assert!(control_refused(&machine, answer(first, "yes")));
    assert!(control_refused(
        &machine,
        Control::Decline { wait_id: first }
    ));
    assert_eq!(wait(&machine, second).status, WaitStatus::Open);
    // Replaying everything gives the same answer (recovery is idempotent).
    ctl(&mut machine, answer(second, "yes too"), false);
    assert!(control_refused(&machine, answer(first, "yes")));
    assert_eq!(machine.status(), Status::Running);
}

#[test]
fn w1_cancel_while_waiting_invalidates_the_wait() {
    let (mut machine, wait_id) = asking("deploy?");
    ctl(&mut machine, Control::Cancel, false);
    assert_eq!(machine.status(), Status::Cancelled);
    assert_eq!(wait(&machine, wait_id).status, WaitStatus::Invalidated);
}

/// A running machine with a tool call in flight, and the binding of a question it asks.
fn calling() -> (Machine, LiveBinding) {
    let mut machine = running(50);
    let decision = EffectId::new();
    run(
        &mut machine,
        Input::ModelDecided {
            effect_id: decision,
            decision: tool_decision("echo"),
        },
        false,
    );
    let binding = LiveBinding {
        attempt_id: machine.present.attempt.id.expect("an attempt"),
        epoch: 1,
        effect_id: tool_effect(decision),
    };
    (machine, binding)
}

fn ask_live(machine: &mut Machine, binding: LiveBinding) -> WaitId {
    let wait_id = WaitId::new();
    let input = Input::AskLive {
        wait_id,
        prompt: "which branch?".into(),
        request: None,
        binding,
    };
    run(machine, input, true);
    wait_id
}

#[test]
fn w4_a_live_question_returns_its_answer_and_a_different_second_answer_is_refused() {
    let (mut machine, binding) = calling();
    let wait_id = ask_live(&mut machine, binding);
    assert_eq!(machine.status(), Status::Running);
    assert!(offered(&machine).contains(&CommandKind::Answer));
    let actions = ctl(&mut machine, answer(wait_id, "main"), true);
    assert_eq!(
        actions,
        vec![Action::LiveResolved {
            wait_id,
            outcome: LiveOutcome::Answered("main".into()),
        }]
    );
    // Answered, the question is no longer offered (K-3): a new command answering it again
    // is refused, with the same answer or another (a retried command id gets its stored
    // outcome from the command record, K-4).
    assert!(!offered(&machine).contains(&CommandKind::Answer));
    for text in ["main", "dev"] {
        let refused = control(&machine, answer(wait_id, text), true).expect_err(text);
        assert_eq!(refused.code(), "not_available");
    }
}

#[test]
fn w4_only_the_running_call_of_the_live_attempt_may_ask() {
    let (machine, binding) = calling();
    for stranger in [
        LiveBinding {
            effect_id: EffectId::new(),
            ..binding
        },
        LiveBinding {
            attempt_id: AttemptId::new(),
            ..binding
        },
    ] {
        let input = Input::AskLive {
            wait_id: WaitId::new(),
            prompt: "?".into(),
            request: None,
            binding: stranger,
        };
        assert!(machine.decide(input).is_err());
    }
}

#[test]
fn w4_cancel_the_call_ending_and_a_new_attempt_invalidate_live_questions() {
    // Cancel.
    let (mut machine, binding) = calling();
    let wait_id = ask_live(&mut machine, binding);
    let actions = ctl(&mut machine, Control::Cancel, true);
    assert!(actions.contains(&Action::LiveResolved {
        wait_id,
        outcome: LiveOutcome::Invalidated
    }));
    // The asking call ends.
    let (mut machine, binding) = calling();
    let wait_id = ask_live(&mut machine, binding);
    let finished = Input::ToolFinished {
        effect_id: binding.effect_id,
        status: openprogram_storage::ReceiptStatus::Confirmed,
        output: "done".into(),
    };
    run(&mut machine, finished, false);
    assert_eq!(wait(&machine, wait_id).status, WaitStatus::Invalidated);
    // Owner loss: a new attempt; a late answer is refused.
    let (mut machine, binding) = calling();
    let wait_id = ask_live(&mut machine, binding);
    let next_attempt = Event::AttemptStarted {
        attempt_id: AttemptId::new(),
        owner_id: OwnerId::new(),
        epoch: 2,
    };
    commit(&mut machine, &[next_attempt]);
    assert_eq!(wait(&machine, wait_id).status, WaitStatus::Invalidated);
    assert!(control(&machine, answer(wait_id, "main"), true).is_err());
}

#[test]
fn p2_stop_process_is_its_own_control_in_any_state_and_cancel_leaves_processes_alone() {
    let mut machine = running(50);
    let process_id = ProcessId::new();
    commit(
        &mut machine,
        &[
            Event::ProcessChanged {
                process_id,
                state: "running".into(),
            },
            Event::StateChanged {
                state: Status::Completed,
                reason: "replied".into(),
            },
        ],
    );
    assert_eq!(offered(&machine), vec!["stop_process", "retry"]);
    let actions = ctl(&mut machine, Control::StopProcess { process_id }, false);
    assert_eq!(actions, vec![Action::StopProcess { process_id }]);
    // A process of another execution, or one that ended, is refused.
    let other = Control::StopProcess {
        process_id: ProcessId::new(),
    };
    assert!(control(&machine, other, false).is_err());
    commit(
        &mut machine,
        &[Event::ProcessChanged {
            process_id,
            state: "stopped".into(),
        }],
    );
    assert!(control(&machine, Control::StopProcess { process_id }, false).is_err());
    assert_eq!(offered(&machine), vec!["retry"]);

    // Cancel ends the execution, never the process (P-2).
    let mut machine = running(50);
    commit(
        &mut machine,
        &[Event::ProcessChanged {
            process_id,
            state: "running".into(),
        }],
    );
    ctl(&mut machine, Control::Cancel, false);
    assert_eq!(machine.status(), Status::Cancelled);
    assert_eq!(
        machine.present.processes[0].state,
        openprogram_storage::ProcessState::Running
    );
    assert_eq!(offered(&machine), vec!["stop_process", "retry"]);
}

/// A running machine that asked a structured question with a timeout at `now_ms`.
fn asking_structured(now_ms: u64, timeout_ms: u64) -> (Machine, WaitId) {
    let mut machine = running(50);
    let effect_id = EffectId::new();
    let decision = Decision::Ask {
        prompt: "Where to?".into(),
        wait: Some(AskDetails {
            kind: AskKind::Question,
            request: Some(serde_json::json!({"items": [
                {"id": "env", "type": "choice", "options": ["staging", "prod"]},
                {"id": "replicas", "type": "integer", "min": 1, "max": 5, "required": false}
            ]})),
            timeout_ms: Some(timeout_ms),
        }),
    };
    let (events, _) = machine.decide_decision(effect_id, decision, now_ms, None);
    commit(&mut machine, &events);
    (machine, wait_of(effect_id))
}

/// Decides a control at `now_ms` and commits it.
fn ctl_at(machine: &mut Machine, control: Control, now_ms: u64) -> Result<Vec<Action>, Rejection> {
    let mut at = super::tests::at(machine, false);
    at.now_ms = now_ms;
    match machine.decide_command(CommandId::new(), control.into(), None, &at)? {
        Accepted::Control { events, .. } => Ok(commit(machine, &events)),
        other => panic!("a control decided as {other:?}"),
    }
}

#[test]
fn w6_a_structured_question_keeps_its_request_and_checks_each_answer() {
    let (mut machine, wait_id) = asking_structured(1_000, 60_000);
    let opened = wait(&machine, wait_id);
    assert_eq!(opened.kind, WaitKind::Question);
    assert!(opened
        .request
        .as_deref()
        .is_some_and(|r| r.contains("replicas")));
    for (given, field) in [
        (r#"{"env": "dev"}"#, "env"),
        (r#"{"env": "prod", "replicas": 9}"#, "replicas"),
        (r#"{"replicas": 2}"#, "env"),
        (r#"{"env": "prod", "colour": 1}"#, "colour"),
        ("prod", "answer"),
    ] {
        let refused = control(&machine, answer(wait_id, given), false).expect_err("refused");
        match refused.refusal.clone() {
            Refusal::InvalidAnswer { field: named, .. } => assert_eq!(named, field, "{given}"),
            other => panic!("{given}: {other:?}"),
        }
        assert_eq!(refused.code(), "invalid_answer");
    }
    assert_eq!(
        wait(&machine, wait_id).status,
        WaitStatus::Open,
        "nothing changed"
    );
    ctl(
        &mut machine,
        answer(wait_id, r#"{"env": "prod", "replicas": 2}"#),
        false,
    );
    assert_eq!(wait(&machine, wait_id).status, WaitStatus::Answered);
    assert_eq!(machine.status(), Status::Running);
    // A decline takes no payload and declines the whole request.
    let (mut declined, wait_id) = asking_structured(1_000, 60_000);
    ctl(&mut declined, Control::Decline { wait_id }, false);
    assert_eq!(wait(&declined, wait_id).status, WaitStatus::Declined);
}

#[test]
fn w6_a_model_decision_with_a_request_that_breaks_its_rules_fails_the_call() {
    let machine = running(50);
    let decision = Decision::Ask {
        prompt: "?".into(),
        wait: Some(AskDetails {
            kind: AskKind::Form,
            request: Some(serde_json::json!({"items": [{"id": "a", "type": "choice"}]})),
            timeout_ms: None,
        }),
    };
    let (events, kept) = machine.decide_decision(EffectId::new(), decision, 0, None);
    assert!(kept.is_none());
    assert!(
        matches!(&events[0], Event::ModelFailed { error, .. } if error.contains("a choice needs options")),
        "{events:?}"
    );
}

#[test]
fn w8_a_deadline_runs_from_the_decision_and_expiry_never_approves() {
    let (mut machine, wait_id) = asking_structured(1_000, 5_000);
    assert_eq!(wait(&machine, wait_id).deadline_ms, Some(6_000));
    assert_eq!(
        machine.decide_wait_expiry(wait_id, 5_999),
        None,
        "not yet due"
    );
    assert_eq!(
        machine.decide_wait_expiry(WaitId::new(), 9_000),
        None,
        "another wait"
    );
    let events = machine.decide_wait_expiry(wait_id, 6_000).expect("due");
    let actions = commit(&mut machine, &events);
    assert!(actions.contains(&Action::Park));
    assert_eq!(wait(&machine, wait_id).status, WaitStatus::Expired);
    assert_eq!(machine.status(), Status::Paused);
    assert_eq!(
        machine.present.run.pause_reason.as_deref(),
        Some("wait_expired")
    );
    assert!(
        !machine
            .context
            .iter()
            .any(|turn| matches!(turn, Turn::WaitResolved { .. })),
        "the model is told nothing: no answer, no decline"
    );
    // A late answer approves nothing.
    let late = control(&machine, answer(wait_id, r#"{"env": "prod"}"#), false);
    assert!(late.is_err(), "{late:?}");
    assert_eq!(
        machine.decide_wait_expiry(wait_id, 99_000),
        None,
        "expires once"
    );
}

#[test]
fn w8_an_answer_past_the_deadline_approves_nothing_even_before_the_expiry_is_written() {
    let (machine, wait_id) = asking_structured(1_000, 5_000);
    let mut late = machine.clone();
    let refused =
        ctl_at(&mut late, answer(wait_id, r#"{"env": "prod"}"#), 6_000).expect_err("late");
    assert_eq!(refused.code(), "wait_closed");
    assert_eq!(late, machine, "nothing changed");
    let mut early = machine.clone();
    ctl_at(&mut early, answer(wait_id, r#"{"env": "prod"}"#), 5_999).expect("in time");
    assert_eq!(early.status(), Status::Running);
    // A discussion reply is no answer to the request: not checked against it.
    let mut discussed = machine;
    let reply = Control::Answer {
        wait_id,
        answer: "what does prod mean here?".into(),
        scope: AnswerScope::Discussion,
    };
    ctl_at(&mut discussed, reply, 2_000).expect("a discussion reply");
}

#[test]
fn w8_continue_reopens_a_fresh_wait_with_a_new_deadline_that_an_answer_resolves() {
    let (mut machine, first) = asking_structured(1_000, 5_000);
    let events = machine.decide_wait_expiry(first, 7_000).expect("due");
    commit(&mut machine, &events);
    ctl_at(&mut machine, Control::Continue, 20_000).expect("continue");
    assert_eq!(machine.status(), Status::Waiting);
    let fresh = machine
        .present
        .waits
        .pending_wait()
        .expect("a fresh wait")
        .clone();
    assert_ne!(fresh.wait_id, first);
    assert_eq!(fresh.reopens, Some(first));
    assert_eq!(
        fresh.deadline_ms,
        Some(25_000),
        "from the Continue, with the same timeout"
    );
    assert_eq!(fresh.request, wait(&machine, first).request);
    assert_eq!(fresh.checkpoint_seq, machine.present.run.checkpoint_seq);
    assert!(control(&machine, answer(first, r#"{"env": "prod"}"#), false).is_err());
    ctl(
        &mut machine,
        answer(fresh.wait_id, r#"{"env": "prod"}"#),
        false,
    );
    assert_eq!(machine.status(), Status::Running);
    // An ordinary pause is continued as always: no wait is opened.
    let mut paused = running(50);
    ctl(&mut paused, Control::Pause, false);
    ctl_at(&mut paused, Control::Continue, 1).expect("continue");
    assert_eq!(paused.status(), Status::Running);
    assert!(paused.present.waits.pending_wait().is_none());
}

#[test]
fn w8_an_answer_before_the_deadline_leaves_nothing_to_expire() {
    let (mut machine, wait_id) = asking_structured(1_000, 5_000);
    ctl(
        &mut machine,
        answer(wait_id, r#"{"env": "staging"}"#),
        false,
    );
    assert_eq!(machine.decide_wait_expiry(wait_id, 10_000), None);
    // A function's ask finds the newest wait that re-opens the one it asked.
    let (mut asked, first) = asking_structured(0, 10);
    let events = asked.decide_wait_expiry(first, 10).expect("due");
    commit(&mut asked, &events);
    ctl_at(&mut asked, Control::Continue, 100).expect("continue");
    let fresh = asked.present.waits.pending_wait().expect("fresh").wait_id;
    let spec = WaitSpec::approval("again?");
    let found = asked
        .decide_ask(first, &spec, 200)
        .expect_err("asked before");
    assert_eq!(found.wait_id, fresh);
}
