//! The commit rule's every branch, without a store: a `View` of maps.

use std::collections::HashMap;

use super::*;
use crate::event::Event;
use crate::ids::{ExecutionId, RunId};
use crate::records::{ExecutionHead, ExecutionKind};
use crate::transition::SessionWrite;

#[derive(Default)]
struct Maps {
    /// Quarantined or purged: `writable` refuses.
    closed: bool,
    head: Option<Held>,
    heads_read: usize,
    commands: HashMap<CommandId, CommandRecord>,
    sessions: HashMap<SessionId, SessionRecord>,
}

impl View for Maps {
    fn writable(&self) -> Result<()> {
        match self.closed {
            true => Err(Error::Quarantined {
                execution_id: ExecutionId::new(),
                reason: "planted".into(),
            }),
            false => Ok(()),
        }
    }
    fn head(&mut self) -> Result<Option<Held>> {
        self.heads_read += 1;
        Ok(self.head)
    }
    fn command(&self, command_id: CommandId) -> Result<Option<CommandRecord>> {
        Ok(self.commands.get(&command_id).cloned())
    }
    fn session(&self, session_id: SessionId) -> Result<Option<SessionRecord>> {
        Ok(self.sessions.get(&session_id).cloned())
    }
}

fn held(version: u64, fencing_epoch: u64, last_seq: u64) -> Maps {
    Maps {
        head: Some(Held {
            version,
            fencing_epoch,
            last_seq,
        }),
        ..Maps::default()
    }
}

fn event() -> Event {
    Event::CheckpointPublished { checkpoint_seq: 0 }
}

fn command(execution_id: ExecutionId, status: CommandStatus, payload: u8) -> CommandRecord {
    CommandRecord {
        command_id: CommandId::new(),
        execution_id,
        kind: "pause".into(),
        payload_hash: [payload; 32],
        status,
        reason: None,
        reason_code: None,
        result_version: None,
        child_execution_id: None,
        accepted_at_ms: 0,
    }
}

fn committed(verdict: Result<Verdict>) -> Next {
    match verdict {
        Ok(Verdict::Commit(next)) => next,
        other => panic!("not a commit: {other:?}"),
    }
}

#[test]
fn s2_a_transition_commits_as_the_next_version_after_the_last_seq() {
    let execution = ExecutionId::new();
    let transition = Transition::new(execution, vec![event(), event()])
        .expect_version(3)
        .by_epoch(5);
    let next = committed(decide(&transition, &mut held(3, 4, 10)));
    assert_eq!(
        next,
        Next {
            version: 4,
            fencing_epoch: 5,
            first_seq: 11,
            last_seq: 12,
            creates: false,
            session: None,
        }
    );
    // No epoch keeps the current one; no expected version skips the check.
    let next = committed(decide(
        &Transition::new(execution, vec![event()]),
        &mut held(9, 4, 1),
    ));
    assert_eq!((next.version, next.fencing_epoch), (10, 4));
}

#[test]
fn a1_a_stale_epoch_is_fenced_and_k4_a_version_moved_is_a_conflict() {
    let execution = ExecutionId::new();
    let stale = Transition::new(execution, vec![event()]).by_epoch(3);
    assert_eq!(
        decide(&stale, &mut held(1, 4, 1)).ok(),
        Some(Verdict::Answer(Outcome::Fenced { current_epoch: 4 }))
    );
    let moved = Transition::new(execution, vec![event()]).expect_version(1);
    assert_eq!(
        decide(&moved, &mut held(2, 0, 1)).ok(),
        Some(Verdict::Answer(Outcome::VersionConflict { current: 2 }))
    );
}

#[test]
fn k4_a_retried_command_gets_its_stored_outcome_before_any_other_check() {
    let execution = ExecutionId::new();
    let stored = command(execution, CommandStatus::Applied, 1);
    let mut view = held(7, 9, 1);
    view.commands.insert(stored.command_id, stored.clone());
    let again = CommandRecord {
        status: CommandStatus::Accepted,
        ..stored.clone()
    };
    // Stale epoch and version: the stored outcome answers anyway, and the head is not read.
    let transition = Transition::new(execution, vec![event()])
        .expect_version(1)
        .by_epoch(1)
        .with(Upsert::Command(again.clone()));
    assert_eq!(
        decide(&transition, &mut view).ok(),
        Some(Verdict::Answer(Outcome::DuplicateCommand {
            stored: stored.clone()
        }))
    );
    assert_eq!(view.heads_read, 0);
    let other_payload = CommandRecord {
        payload_hash: [2; 32],
        ..again
    };
    let transition = Transition::new(execution, vec![event()]).with(Upsert::Command(other_payload));
    assert_eq!(
        decide(&transition, &mut view).ok(),
        Some(Verdict::Answer(Outcome::CommandConflict { stored }))
    );
    // An accepted command moves on to applied: that commits.
    let accepted = command(execution, CommandStatus::Accepted, 3);
    view.commands.insert(accepted.command_id, accepted.clone());
    let applied = CommandRecord {
        status: CommandStatus::Applied,
        ..accepted
    };
    let transition = Transition::new(execution, vec![event()]).with(Upsert::Command(applied));
    committed(decide(&transition, &mut view));
    // A command of another execution is no upsert of this one.
    let foreign = command(ExecutionId::new(), CommandStatus::Accepted, 4);
    let transition = Transition::new(execution, vec![event()]).with(Upsert::Command(foreign));
    assert!(matches!(
        decide(&transition, &mut view),
        Err(Error::InvalidTransition(_))
    ));
}

#[test]
fn k1_a_rejection_alone_is_checked_like_a_transition_and_only_for_a_new_command() {
    let execution = ExecutionId::new();
    let rejected = command(execution, CommandStatus::Rejected, 1);
    let rejection = Transition::rejection(rejected.clone(), 2, Some(3));
    assert_eq!(
        decide(&rejection, &mut held(2, 3, 5)).ok(),
        Some(Verdict::Rejection { version: 2 })
    );
    assert_eq!(
        decide(&rejection, &mut held(3, 3, 5)).ok(),
        Some(Verdict::Answer(Outcome::VersionConflict { current: 3 }))
    );
    assert_eq!(
        decide(&rejection, &mut held(2, 4, 5)).ok(),
        Some(Verdict::Answer(Outcome::Fenced { current_epoch: 4 }))
    );
    assert!(matches!(
        decide(&rejection, &mut Maps::default()),
        Err(Error::UnknownExecution(_))
    ));
    // Saved accepted before: decided by an event of its execution, not by a rejection alone.
    let mut view = held(2, 3, 5);
    let accepted = CommandRecord {
        status: CommandStatus::Accepted,
        ..rejected
    };
    view.commands.insert(accepted.command_id, accepted);
    assert!(matches!(
        decide(&rejection, &mut view),
        Err(Error::InvalidTransition(_))
    ));
}

#[test]
fn s2_a_head_creates_only_at_version_zero_and_replaces_only_from_an_attempt() {
    let execution = ExecutionId::new();
    let head = ExecutionHead::new(
        execution,
        SessionId::new(),
        RunId::new(),
        ExecutionKind::AgentTurn,
    );
    let create = Transition::new(execution, vec![event()]).with_head(head.clone());
    assert!(matches!(
        decide(&create, &mut Maps::default()),
        Err(Error::InvalidTransition(_))
    ));
    let next = committed(decide(
        &create.clone().expect_version(0),
        &mut Maps::default(),
    ));
    assert_eq!((next.version, next.first_seq, next.creates), (1, 1, true));
    assert!(matches!(
        decide(&create, &mut held(1, 0, 1)),
        Err(Error::InvalidTransition(_))
    ));
    committed(decide(&create.clone().by_epoch(1), &mut held(1, 0, 1)));
    assert!(matches!(
        decide(
            &Transition::new(execution, vec![event()]),
            &mut Maps::default()
        ),
        Err(Error::UnknownExecution(_))
    ));
    let other = Transition::new(ExecutionId::new(), vec![event()]).with_head(head);
    assert!(matches!(
        decide(&other, &mut held(1, 0, 1)),
        Err(Error::InvalidTransition(_))
    ));
    assert!(matches!(
        decide(&Transition::new(execution, Vec::new()), &mut held(1, 0, 1)),
        Err(Error::InvalidTransition(_))
    ));
}

#[test]
fn c2_a_session_write_commits_only_at_the_version_read() {
    let execution = ExecutionId::new();
    let session_id = SessionId::new();
    let record = SessionRecord {
        session_id,
        version: 4,
        foreground: None,
        waiting: Vec::new(),
        grants: Vec::new(),
    };
    let mut view = held(1, 0, 1);
    view.sessions.insert(session_id, record.clone());
    let write = |expected_version| SessionWrite {
        session_id,
        expected_version,
        record: Some(SessionRecord {
            foreground: Some(execution),
            ..record.clone()
        }),
    };
    let stale = Transition::new(execution, vec![event()]).with_session(write(3));
    assert_eq!(
        decide(&stale, &mut view).ok(),
        Some(Verdict::Answer(Outcome::SessionConflict { current: 4 }))
    );
    let next = committed(decide(
        &Transition::new(execution, vec![event()]).with_session(write(4)),
        &mut view,
    ));
    let written = next.session.expect("the record");
    assert_eq!((written.version, written.foreground), (5, Some(execution)));
}

#[test]
fn s2_which_check_answers_first_when_several_would() {
    let execution = ExecutionId::new();
    // The shape first, then whether it may be written at all.
    let mut closed = held(1, 0, 1);
    closed.closed = true;
    assert!(matches!(
        decide(&Transition::new(execution, Vec::new()), &mut closed),
        Err(Error::InvalidTransition(_))
    ));
    assert!(matches!(
        decide(&Transition::new(execution, vec![event()]), &mut closed),
        Err(Error::Quarantined { .. })
    ));
    // A stored outcome answers before a later command naming another execution is seen.
    let stored = command(execution, CommandStatus::Applied, 1);
    let mut view = held(1, 0, 1);
    view.commands.insert(stored.command_id, stored.clone());
    let transition = Transition::new(execution, vec![event()])
        .with(Upsert::Command(stored.clone()))
        .with(Upsert::Command(command(
            ExecutionId::new(),
            CommandStatus::Accepted,
            2,
        )));
    assert_eq!(
        decide(&transition, &mut view).ok(),
        Some(Verdict::Answer(Outcome::DuplicateCommand { stored }))
    );
    // Fencing before the version, the version before the session, the session before the
    // head rules.
    let session_id = SessionId::new();
    let stale_write = SessionWrite {
        session_id,
        expected_version: 9,
        record: None,
    };
    let all_wrong = Transition::new(execution, vec![event()])
        .expect_version(7)
        .by_epoch(1)
        .with_session(stale_write.clone());
    assert_eq!(
        decide(&all_wrong, &mut held(1, 2, 1)).ok(),
        Some(Verdict::Answer(Outcome::Fenced { current_epoch: 2 }))
    );
    assert_eq!(
        decide(&all_wrong.clone().by_epoch(2), &mut held(1, 2, 1)).ok(),
        Some(Verdict::Answer(Outcome::VersionConflict { current: 1 }))
    );
    let head = ExecutionHead::new(
        execution,
        SessionId::new(),
        RunId::new(),
        ExecutionKind::AgentTurn,
    );
    let replaced_without_epoch = Transition::new(execution, vec![event()])
        .with_head(head)
        .with_session(stale_write);
    assert_eq!(
        decide(&replaced_without_epoch, &mut held(1, 0, 1)).ok(),
        Some(Verdict::Answer(Outcome::SessionConflict { current: 0 }))
    );
}

#[test]
fn k4_a_stored_command_of_another_execution_or_already_decided_is_answered() {
    let execution = ExecutionId::new();
    let stored = command(execution, CommandStatus::Applied, 1);
    let mut view = held(1, 0, 1);
    view.commands.insert(stored.command_id, stored.clone());
    // The same id stored for another execution: a conflict.
    let mut elsewhere = stored.clone();
    elsewhere.execution_id = ExecutionId::new();
    view.commands
        .insert(elsewhere.command_id, elsewhere.clone());
    let transition =
        Transition::new(execution, vec![event()]).with(Upsert::Command(stored.clone()));
    assert_eq!(
        decide(&transition, &mut view).ok(),
        Some(Verdict::Answer(Outcome::CommandConflict {
            stored: elsewhere
        }))
    );
    // An outcome for a command decided already: the stored record stands.
    view.commands.insert(stored.command_id, stored.clone());
    let rejected = CommandRecord {
        status: CommandStatus::Rejected,
        ..stored.clone()
    };
    let transition = Transition::new(execution, vec![event()]).with(Upsert::Command(rejected));
    assert_eq!(
        decide(&transition, &mut view).ok(),
        Some(Verdict::Answer(Outcome::DuplicateCommand {
            stored: stored.clone()
        }))
    );
    // A rejection alone retried: its stored outcome, not a second record.
    let refused = command(execution, CommandStatus::Rejected, 3);
    view.commands.insert(refused.command_id, refused.clone());
    assert_eq!(
        decide(&Transition::rejection(refused.clone(), 1, None), &mut view).ok(),
        Some(Verdict::Answer(Outcome::DuplicateCommand {
            stored: refused
        }))
    );
}

#[test]
fn s8_a_projection_goes_with_its_own_execution_and_no_later_than_its_events() {
    use crate::records::ProjectionRecord;
    let execution = ExecutionId::new();
    let projection = |execution_id, through_seq| {
        Upsert::Projection(ProjectionRecord {
            execution_id,
            through_seq,
            format: 1,
            state: Vec::new(),
        })
    };
    let fine = Transition::new(execution, vec![event()]).with(projection(execution, 2));
    committed(decide(&fine, &mut held(1, 0, 1)));
    let beyond = Transition::new(execution, vec![event()]).with(projection(execution, 3));
    assert!(matches!(
        decide(&beyond, &mut held(1, 0, 1)),
        Err(Error::InvalidTransition(_))
    ));
    let foreign = Transition::new(execution, vec![event()]).with(projection(ExecutionId::new(), 2));
    assert!(matches!(
        decide(&foreign, &mut held(1, 0, 1)),
        Err(Error::InvalidTransition(_))
    ));
    // A rejection alone carries no session write.
    let mut rejection =
        Transition::rejection(command(execution, CommandStatus::Rejected, 1), 1, None);
    rejection.session = Some(SessionWrite {
        session_id: SessionId::new(),
        expected_version: 0,
        record: None,
    });
    assert!(matches!(
        decide(&rejection, &mut held(1, 0, 1)),
        Err(Error::InvalidTransition(_))
    ));
}
