//! C-2, one foreground turn per session, in the pure machine. While another turn holds the
//! session, a new message follows its strategy (decided at admission, in the service):
//! `queue` admits it queued behind, `interrupt` first in line, pausing the holder. A queued
//! turn runs nothing until it takes the session (`SessionTurnStarted`, with the session
//! record's change); an interrupted one is queued again by Continue or Step.

use openprogram_storage::{Event, ExecutionId, ExecutionState as Status};

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

impl Present {
    /// A foreground turn waiting for its session (C-2).
    pub fn waits_for_session(&self) -> bool {
        self.session_turn.as_ref().is_some_and(|turn| turn.queued)
            && self.status() == Status::Queued
            && !self.cancel_requested
    }

    pub(crate) fn apply_session_turn(&mut self, strategy: &str, behind: Option<ExecutionId>) {
        self.session_turn = Some(SessionTurn {
            strategy: strategy.to_owned(),
            queued: behind.is_some(),
        });
    }

    /// It took its session: it may run.
    pub(crate) fn apply_session_turn_started(&mut self) {
        if let Some(turn) = &mut self.session_turn {
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
            if let Some(turn) = &mut self.session_turn {
                turn.queued = true;
                actions.push(super::Action::Advance);
            }
        }
    }
}

impl Machine {
    /// C-2: the events of taking the session: it runs from here. `interrupted`: the turn it
    /// interrupted, paused. `None` if it is not a turn waiting for its session.
    pub fn decide_take_session(&self, interrupted: Option<ExecutionId>) -> Option<Vec<Event>> {
        if !self.waits_for_session() {
            return None;
        }
        Some(vec![
            Event::SessionTurnStarted { interrupted },
            state_changed(Status::Running, SESSION_QUEUED),
        ])
    }

    /// Whether it was admitted to interrupt the turn ahead of it.
    pub fn interrupts(&self) -> bool {
        self.session_turn
            .as_ref()
            .is_some_and(|turn| turn.strategy == "interrupt")
    }

    /// C-2: a Continue or Step of a foreground turn that does not hold its session (`holds`,
    /// read by the shell) queues it for the session instead of running it.
    pub(crate) fn requeued_for_session(&self, holds: bool) -> Option<Event> {
        (self.session_turn.is_some() && !holds)
            .then(|| state_changed(Status::Queued, SESSION_QUEUED))
    }
}
