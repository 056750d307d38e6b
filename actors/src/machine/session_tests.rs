//! C-2 and W-7 in the pure machine: the session record's writes it plans — taking the
//! session, a turn queued again, a grant given beside a resume, and none at all.

use openprogram_storage::{
    AnswerScope, Control, Event, ExecutionId, ExecutionState as Status, SessionId, SessionRecord,
    WaitId,
};

use super::session::SESSION_QUEUED;
use super::tests::{admitted, attempt, commit};
use super::*;

/// A turn admitted behind `ahead` in its session's line, its attempt started.
fn queued_behind(ahead: ExecutionId) -> Machine {
    let mut machine = Machine::default();
    let turn = Event::SessionTurn {
        strategy: "queue".into(),
        behind: Some(ahead),
    };
    commit(&mut machine, &[admitted(4), turn, attempt()]);
    assert!(machine.present.waits_for_session());
    machine
}

fn record(version: u64, foreground: ExecutionId, waiting: Vec<ExecutionId>) -> SessionRecord {
    SessionRecord {
        session_id: SessionId::new(),
        version,
        foreground: Some(foreground),
        waiting,
        ..SessionRecord::default()
    }
}

#[test]
fn c2_taking_the_session_holds_it_leaves_the_line_and_fences_on_the_version_read() {
    let (holder, me, next) = (ExecutionId::new(), ExecutionId::new(), ExecutionId::new());
    let machine = queued_behind(holder);
    let read = record(7, holder, vec![me, next]);
    let (events, write) = machine
        .decide_take_session(me, &read, read.waiting.clone(), Some(holder))
        .expect("a queued turn takes its session");
    assert_eq!(
        events,
        vec![
            Event::SessionTurnStarted {
                interrupted: Some(holder)
            },
            state_changed(Status::Running, SESSION_QUEUED),
        ]
    );
    assert_eq!(write.session_id, read.session_id);
    assert_eq!(write.expected_version, 7);
    let after = write.record.expect("the record as it leaves it");
    assert_eq!(after.foreground, Some(me));
    assert_eq!(after.waiting, vec![next]);
    // A turn that is not waiting for its session takes nothing.
    let mut running = machine.clone();
    commit(&mut running, &events);
    assert!(running
        .decide_take_session(me, &read, read.waiting.clone(), None)
        .is_none());
}

#[test]
fn c2_a_turn_queued_again_takes_its_place_in_line_once() {
    let (holder, me) = (ExecutionId::new(), ExecutionId::new());
    let machine = queued_behind(holder);
    let requeue = [state_changed(Status::Queued, SESSION_QUEUED)];
    let session_id = SessionId::new();
    // No record stored yet: one is written from version 0.
    let write = machine
        .session_write(&Control::Continue, &requeue, me, session_id, None)
        .expect("a requeue writes the line");
    assert_eq!((write.session_id, write.expected_version), (session_id, 0));
    assert_eq!(write.record.expect("record").waiting, vec![me]);
    // Already in line: not twice.
    let stored = record(3, holder, vec![me]);
    let write = machine
        .session_write(&Control::Continue, &requeue, me, session_id, Some(stored))
        .expect("a requeue writes the line");
    assert_eq!(write.expected_version, 3);
    assert_eq!(write.record.expect("record").waiting, vec![me]);
}

#[test]
fn w7_c2_a_control_that_changes_nothing_of_the_session_writes_nothing() {
    let machine = tests::running(4);
    let me = ExecutionId::new();
    let stored = record(2, me, Vec::new());
    let pause = [state_changed(Status::Paused, "pause")];
    assert!(!machine.touches_session(&Control::Pause, &pause));
    assert!(machine
        .session_write(
            &Control::Pause,
            &pause,
            me,
            stored.session_id,
            Some(stored.clone())
        )
        .is_none());
    // An answer for the session to a wait this execution does not have grants nothing.
    let answer = Control::Answer {
        wait_id: WaitId::new(),
        answer: serde_json::json!(true).to_string(),
        scope: AnswerScope::Session,
    };
    assert!(machine.touches_session(&answer, &[]));
    assert!(machine
        .session_write(&answer, &[], me, stored.session_id, Some(stored))
        .is_none());
}
