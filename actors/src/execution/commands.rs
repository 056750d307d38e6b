//! Commands at the execution (K-1..K-6): the `ApplyCommand` message, and how the actor
//! records what `Machine::decide_command` decides: an applied command with its effect in
//! one transition, a rejected one as its record alone.

use actix::prelude::*;
use openprogram_storage::{CommandRecord, CommandStatus, Event, Outcome, Transition, Upsert};

use crate::command::{Command, CommandBody, WaitRef};
use crate::error::Error;
use crate::execution::actor::{answer, parked, ExecutionActor};
use crate::machine::{Accepted, CommandContext, Refusal, Rejection};

/// Whether the transition that decides a command also saves it as accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Saved {
    /// An earlier transition saved it (`ControlAccepted`): an inherited command, or one
    /// accepted just before a crash.
    Already,
    /// A new command: `ControlAccepted` and the decision are one transition, so a command is
    /// never durably applied without being saved first in the log, and costs one commit.
    WithDecision,
}

impl ExecutionActor {
    /// The machine's context for a command now (K-3, K-4).
    pub(crate) fn command_context(&self) -> CommandContext {
        // Read once: the record a decision may rely on, and whether this turn holds it.
        // C-2: a foreground turn holds its session only where the record names it: one
        // admitted paused (a paused start, a fork, a retry) takes it when continued, so a
        // message sent meanwhile waits behind it instead of running beside it. (A record that
        // cannot be read: it runs, as it would have, rather than queue behind a line it
        // cannot see.)
        let (session, holds_session) = match self.env.store.session(self.head.session_id) {
            Ok(record) => {
                let foreground = record.as_ref().and_then(|record| record.foreground);
                let holds = foreground == Some(self.execution_id);
                (record.map(std::sync::Arc::new), holds)
            }
            Err(error) => {
                tracing::warn!(session_id = %self.head.session_id, %error, "the session's record could not be read");
                (None, true)
            }
        };
        CommandContext {
            version: self.head.version,
            contract: self.env.contract,
            busy: self.in_flight.is_some(),
            now_ms: self.env.clock.now_ms(),
            session,
            holds_session,
        }
    }

    /// Decides a command and records `applied` with its effect (with `Saved::WithDecision`,
    /// in the same transition that saves it as accepted, K-1), or `rejected`: the command
    /// record alone, so a refusal changes nothing of the execution (K-4). Decided again
    /// (`tries` counts how often) after the session record moved under a control that
    /// writes it (W-7: a session grant given or revoked): read and decided anew.
    pub(super) fn decide_command(
        &mut self,
        accepted: CommandRecord,
        command: Command,
        saved: Saved,
        tries: u32,
    ) -> ResponseActFuture<Self, Result<CommandRecord, Error>> {
        const SESSION_TRIES_MAX: u32 = 8;
        let again = (accepted.clone(), command.clone());
        let Command {
            command_id,
            expected_version,
            body,
        } = command;
        let context = self.command_context();
        let (control, mut events) =
            match self
                .machine
                .decide_command(command_id, body, expected_version, &context)
            {
                Ok(Accepted::Control { control, events }) => (control, events),
                Ok(Accepted::Fork { .. } | Accepted::Retry) => {
                    return Box::pin(fut::ready(Err(Error::Internal(
                        "fork and retry are made by the command service, not the execution".into(),
                    ))))
                }
                // W-6: an answer that does not fit is refused like a malformed body: nothing
                // recorded, so the same command id can carry a corrected answer.
                Err(Rejection {
                    refusal: Refusal::InvalidAnswer { field, message, .. },
                    ..
                }) if saved == Saved::WithDecision => {
                    return Box::pin(fut::ready(Err(Error::InvalidAnswer { field, message })))
                }
                Err(rejection) => return self.record_rejection(accepted, &rejection, saved),
            };
        // W-7: a session grant given or revoked changes the session's record, in this
        // transition, at the version read here.
        let session = match self.session_write(&control, &events) {
            Ok(session) => session,
            Err(error) => return Box::pin(fut::ready(Err(error))),
        };
        let record = CommandRecord {
            status: CommandStatus::Applied,
            result_version: Some(self.head.version + 1),
            ..accepted
        };
        // A control that changes the state of an execution with no running attempt (paused,
        // parked) starts one in the same transition: only an attempt may move the head.
        let moves = events
            .iter()
            .any(|event| matches!(event, Event::StateChanged { .. }));
        let claims = moves && self.claim_in(&mut events);
        if saved == Saved::WithDecision {
            events.insert(
                0,
                Event::ControlAccepted {
                    command_id,
                    control,
                },
            );
        }
        // C-2: a foreground turn that runs again (an answer, a Continue) lets the first turn
        // in its line look again: an interrupt asks it to pause now that it can.
        let runs_again = self.machine.resumes_turn(&events);
        let upsert = Upsert::Command(record.clone());
        Box::pin(
            self.submit_planned(events, vec![upsert], None, session)
                .then(move |outcome, act, ctx| {
                    if runs_again && matches!(outcome, Ok(Outcome::Committed(_))) {
                        act.wake_line(false);
                    }
                    if let Ok(Outcome::SessionConflict { .. }) = outcome {
                        if claims {
                            act.epoch = None;
                        }
                        if tries < SESSION_TRIES_MAX {
                            let (accepted, command) = again;
                            return act.decide_command(accepted, command, saved, tries + 1);
                        }
                        // Nothing was written: the same command id may be sent again.
                        return Box::pin(fut::ready(Err(Error::Unavailable(
                            "the session's record kept changing; send the command again".into(),
                        ))));
                    }
                    let decided = act.command_outcome(outcome, record, claims, ctx);
                    Box::pin(fut::ready(decided))
                }),
        )
    }

    /// What a command's transition came to, for its sender.
    fn command_outcome(
        &mut self,
        outcome: Result<Outcome, Error>,
        record: CommandRecord,
        claims: bool,
        ctx: &mut Context<Self>,
    ) -> Result<CommandRecord, Error> {
        // Anything but a commit (a duplicate: decided meanwhile by a newer attempt, K-6,
        // whose stored outcome stands) wrote nothing of this transition, nor its claim.
        let committed = matches!(outcome, Ok(Outcome::Committed(_)));
        let decided = stored_outcome(outcome, record);
        if claims && !committed {
            self.epoch = None;
        } else if claims && self.lease_actor.is_none() {
            // B04: the attempt's claim is durable, its lease actor not started.
            openprogram_storage::failpoint!("B04");
            self.hold_lease(ctx);
        }
        decided
    }

    /// W-7, C-2: the session write an applied control makes, if any, from the session's
    /// record as read now (`Machine::session_write`).
    fn session_write(
        &self,
        control: &openprogram_storage::Control,
        events: &[Event],
    ) -> Result<Option<openprogram_storage::SessionWrite>, Error> {
        if !self.machine.touches_session(control, events) {
            return Ok(None);
        }
        let stored = self.env.store.session(self.head.session_id)?;
        Ok(self.machine.session_write(
            control,
            events,
            self.execution_id,
            self.head.session_id,
            stored,
        ))
    }

    /// A refused command: its record alone (`Transition::rejection`), at the version it was
    /// refused at. An inherited command (`Saved::Already`: its `ControlAccepted` is in the
    /// log, from a log written when accepting and deciding were two transitions) is decided
    /// by a `CommandRejected` event instead, which ends it in every replay.
    fn record_rejection(
        &mut self,
        accepted: CommandRecord,
        rejection: &Rejection,
        saved: Saved,
    ) -> ResponseActFuture<Self, Result<CommandRecord, Error>> {
        let command_id = accepted.command_id;
        let record = CommandRecord {
            status: CommandStatus::Rejected,
            reason: Some(rejection.reason()),
            reason_code: Some(rejection.code().to_owned()),
            result_version: Some(self.head.version),
            ..accepted
        };
        if saved == Saved::Already {
            let events = vec![Event::CommandRejected {
                command_id,
                reason: rejection.reason(),
            }];
            let record = CommandRecord {
                result_version: Some(self.head.version + 1),
                ..record
            };
            let upsert = Upsert::Command(record.clone());
            return Box::pin(
                self.submit_planned(events, vec![upsert], None, None)
                    .map(move |outcome, _, _| stored_outcome(outcome, record)),
            );
        }
        // Checked against what it was decided on: a stale owner stores no refusal (A-1, K-6).
        let rejection = Transition::rejection(record.clone(), self.head.version, self.epoch);
        let submitted = self.env.store.submit(rejection);
        Box::pin(fut::wrap_future::<_, Self>(submitted).map(
            move |outcome, act, ctx| match outcome {
                // As for any write: the service delivers the command to the current owner.
                Ok(outcome) => stored_outcome(act.outdated(outcome, ctx), record),
                Err(error) => stored_outcome(Err(Error::from(error)), record),
            },
        ))
    }
}

/// The record a command's write leaves: this one, or the one stored before (K-4); a
/// commit of anything else is an error.
fn stored_outcome(
    outcome: Result<Outcome, Error>,
    record: CommandRecord,
) -> Result<CommandRecord, Error> {
    match outcome? {
        Outcome::Committed(_) | Outcome::Recorded { .. } => Ok(record),
        Outcome::DuplicateCommand { stored } => Ok(stored),
        Outcome::CommandConflict { stored } => Err(Error::CommandConflict {
            stored: Box::new(stored),
        }),
        other => Err(Error::Internal(format!("unexpected outcome {other:?}"))),
    }
}

/// A command from the command service (K-1), decided and recorded by `decide_command`.
#[derive(Debug, Message)]
#[rtype(result = "Result<CommandRecord, Error>")]
pub struct ApplyCommand {
    /// The record as the service saves it: id, execution, kind, payload hash.
    pub accepted: CommandRecord,
    pub command: Command,
}

impl Handler<ApplyCommand> for ExecutionActor {
    type Result = AtomicResponse<Self, Result<CommandRecord, Error>>;

    fn handle(&mut self, message: ApplyCommand, ctx: &mut Context<Self>) -> Self::Result {
        let _span = self.enter();
        // S-8: a wait older than a projection keeps is decided on the whole history (its
        // refusal says it closed, not that it is unknown).
        let named = match &message.command.body {
            CommandBody::Answer {
                wait: WaitRef::Id(wait_id),
                ..
            }
            | CommandBody::Decline {
                wait: WaitRef::Id(wait_id),
            } => Some(*wait_id),
            _ => None,
        };
        if named.is_some_and(|wait_id| self.machine.wait(wait_id).is_none())
            && !self.complete_history(ctx)
        {
            return answer(Err(Error::Unavailable(
                "the execution's history is unreadable".into(),
            )));
        }
        AtomicResponse::new(self.after_inherited(message))
    }
}

impl ExecutionActor {
    /// Commands an earlier attempt accepted and never decided come first (R-5, K-5: an
    /// inherited Cancel is not overtaken by a later Continue); then this one.
    pub(super) fn after_inherited(
        &mut self,
        message: ApplyCommand,
    ) -> ResponseActFuture<Self, Result<CommandRecord, Error>> {
        match self.decide_pending() {
            Some(first) => Box::pin(first.then(move |(), act, _ctx| act.after_inherited(message))),
            None => self.apply_command(message),
        }
    }

    fn apply_command(
        &mut self,
        ApplyCommand { accepted, command }: ApplyCommand,
    ) -> ResponseActFuture<Self, Result<CommandRecord, Error>> {
        let stored = match self.env.store.command(accepted.command_id) {
            Ok(stored) => stored,
            Err(error) => return Box::pin(fut::ready(Err(Error::Storage(error)))),
        };
        match stored {
            None => Box::pin(
                self.decide_command(accepted, command, Saved::WithDecision, 0)
                    .map(parked),
            ),
            Some(stored)
                if !command.matches_payload(&stored.payload_hash)
                    || stored.execution_id != accepted.execution_id =>
            {
                let conflict = Err(Error::CommandConflict {
                    stored: Box::new(stored),
                });
                Box::pin(ActorFutureExt::map(fut::ready(conflict), parked))
            }
            // Accepted before and never decided (a log written when accepting and deciding
            // were two transitions, and a crash came between): it was checked against the
            // version its client saw when it was accepted. Decide it now.
            Some(stored) if stored.status == CommandStatus::Accepted => {
                let command = Command {
                    expected_version: None,
                    ..command
                };
                // Saved by an earlier build, its hash may be that build's: keep it.
                let accepted = CommandRecord {
                    payload_hash: stored.payload_hash,
                    ..accepted
                };
                Box::pin(
                    self.decide_command(accepted, command, Saved::Already, 0)
                        .map(parked),
                )
            }
            // A redelivery: the stored outcome stands (K-4).
            Some(stored) => Box::pin(ActorFutureExt::map(fut::ready(Ok(stored)), parked)),
        }
    }
}
