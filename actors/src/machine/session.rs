//! C-2, one foreground turn per session, in the pure machine. While another turn holds the
//! session, a new message follows its strategy (decided at admission, in the service):
//! `queue` admits it queued behind, `interrupt` first in line, pausing the holder. A queued
//! turn runs nothing until it takes the session (`SessionTurnStarted`, with the session
//! record's change); an interrupted one is queued again by Continue or Step.

use openprogram_storage::{
    AnswerScope, Control, Event, ExecutionId, ExecutionState as Status, SessionId, SessionRecord,
    SessionWrite,
};

use super::{state_changed, Machine, Present};

/// The reason of the `queued` state of a turn waiting for its session.
pub const SESSION_QUEUED: &str = "session";

/// C-2: the `SessionTurn` of an agent turn admitted paused (a paused start, a fork, a
/// retry): a foreground turn that holds nothing; Continue or Step queues it for its session.
pub fn paused_turn() -> Event {
    Event::SessionTurn {
        strategy: "paused".into(),
        behind: None,
    }
}

/// C-2: a session's line as it stands: the turns of `waiting` still queued (one that ended
/// or was paused holds no place; a paused one queues again when continued), and `me`,
/// wherever it stands. `state`: each execution's state as read (`None`: unreadable).
pub fn line_of(
    waiting: &[ExecutionId],
    me: Option<ExecutionId>,
    state: impl Fn(ExecutionId) -> Option<Status>,
) -> Vec<ExecutionId> {
    waiting
        .iter()
        .copied()
        .filter(|id| Some(*id) == me || state(*id) == Some(Status::Queued))
        .collect()
}

pub use super::types::SessionTurn;

/// The write of `after` over the session's record as it was read (`read`): a
/// compare-and-swap at that version, in the transition that changes it.
fn replacing(read: &SessionRecord, after: SessionRecord) -> SessionWrite {
    SessionWrite {
        session_id: read.session_id,
        expected_version: read.version,
        record: Some(after),
    }
}

/// C-2: a turn admitted into its session's line (`line`: the turns waiting, itself among
/// them if it waits), behind the turn `behind`, or holding the session (`None`).
pub fn admitted(
    read: &SessionRecord,
    me: ExecutionId,
    behind: Option<ExecutionId>,
    line: Vec<ExecutionId>,
) -> SessionWrite {
    let after = SessionRecord {
        foreground: behind.map_or(Some(me), |_| read.foreground),
        waiting: line,
        ..read.clone()
    };
    replacing(read, after)
}

impl Present {
    /// A foreground turn waiting for its session (C-2).
    pub fn waits_for_session(&self) -> bool {
        self.turn.queued_for_session()
            && self.status() == Status::Queued
            && !self.run.cancel_requested
    }

    pub(crate) fn apply_session_turn(&mut self, strategy: &str, behind: Option<ExecutionId>) {
        self.turn.session_turn = Some(SessionTurn {
            strategy: strategy.to_owned(),
            queued: behind.is_some(),
        });
    }

    /// It took its session: it may run.
    pub(crate) fn apply_session_turn_started(&mut self) {
        if let Some(turn) = &mut self.turn.session_turn {
            turn.queued = false;
        }
    }

    /// `queued` for its session again (a Continue of a turn that no longer holds it): the
    /// shell looks whether it may take it.
    pub(crate) fn session_queued_again(
        &mut self,
        state: Status,
        reason: &str,
        actions: &mut Vec<super::Action>,
    ) {
        if state == Status::Queued && reason == SESSION_QUEUED {
            if let Some(turn) = &mut self.turn.session_turn {
                turn.queued = true;
                actions.push(super::Action::Advance);
            }
        }
    }
}

impl Machine {
    /// C-2: the events of taking the session, and the session's record as it leaves it
    /// (`me` holds it, out of the line `waiting`): it runs from here. `interrupted`: the turn
    /// it interrupted, paused. `None` if it is not a turn waiting for its session.
    pub fn decide_take_session(
        &self,
        me: ExecutionId,
        read: &SessionRecord,
        waiting: Vec<ExecutionId>,
        interrupted: Option<ExecutionId>,
    ) -> Option<(Vec<Event>, SessionWrite)> {
        if !self.present.waits_for_session() {
            return None;
        }
        let events = vec![
            Event::SessionTurnStarted { interrupted },
            state_changed(Status::Running, SESSION_QUEUED),
        ];
        let after = SessionRecord {
            foreground: Some(me),
            waiting: waiting.into_iter().filter(|id| *id != me).collect(),
            ..read.clone()
        };
        Some((events, replacing(read, after)))
    }

    /// C-2: whether `events` run this execution again as its session's foreground turn.
    pub fn resumes_turn(&self, events: &[Event]) -> bool {
        self.present.turn.session_turn.is_some() && moves_to(events, Status::Running, None)
    }

    /// W-7, C-2: whether applying `control` (its `events`) changes the session's record:
    /// a session grant given or revoked, a turn queued again, a foreground turn run again.
    pub fn touches_session(&self, control: &Control, events: &[Event]) -> bool {
        moves_to(events, Status::Queued, Some(SESSION_QUEUED))
            || self.resumes_turn(events)
            || matches!(
                control,
                Control::Answer {
                    scope: AnswerScope::Session,
                    ..
                } | Control::Revoke { .. }
            )
    }

    /// W-7, C-2: the write of the session's record that applying `control` (its `events`)
    /// makes in the same transition, from the record as read (`stored`; `None`: none yet):
    /// what it grants or revokes, then the turn's place, in one write. A foreground turn
    /// that runs again moves the record, so a turn that read it paused (an interrupt about
    /// to take the session) reads again. `None`: it changes nothing.
    pub fn session_write(
        &self,
        control: &Control,
        events: &[Event],
        me: ExecutionId,
        session_id: SessionId,
        stored: Option<SessionRecord>,
    ) -> Option<SessionWrite> {
        if !self.touches_session(control, events) {
            return None;
        }
        let read = stored.unwrap_or(SessionRecord {
            session_id,
            ..SessionRecord::default()
        });
        let requeued = moves_to(events, Status::Queued, Some(SESSION_QUEUED));
        let granted = self.session_after(control, me, read.clone());
        if granted.is_none() && !(requeued || self.resumes_turn(events)) {
            return None;
        }
        let mut after = granted.unwrap_or_else(|| read.clone());
        if requeued && !after.waiting.contains(&me) {
            after.waiting.push(me);
        }
        Some(replacing(&read, after))
    }

    /// Whether it was admitted to interrupt the turn ahead of it.
    pub fn interrupts(&self) -> bool {
        let turn = self.present.turn.session_turn.as_ref();
        turn.is_some_and(|turn| turn.strategy == "interrupt")
    }

    /// C-2: a Continue or Step of a foreground turn that does not hold its session (`holds`,
    /// read by the shell) queues it for the session instead of running it.
    pub(crate) fn requeued_for_session(&self, holds: bool) -> Option<Event> {
        (self.present.turn.session_turn.is_some() && !holds)
            .then(|| state_changed(Status::Queued, SESSION_QUEUED))
    }
}

/// Whether `events` move the execution to `to` (for the reason `why`, if one is given).
fn moves_to(events: &[Event], to: Status, why: Option<&str>) -> bool {
    let moves = |event: &Event| match event {
        Event::StateChanged { state, reason } => {
            *state == to && why.is_none_or(|why| why == reason)
        }
        _ => false,
    };
    events.iter().any(moves)
}
