//! Commands at the execution (K-1..K-6): the `ApplyControl` message, and how the actor
//! accepts, decides and records a control command. Split from `actor.rs`, whose shell it
//! extends; the decisions themselves are the pure machine's (`machine.rs`).

use actix::prelude::*;
use openprogram_storage::{CommandRecord, CommandStatus, Control, Event, Outcome, Upsert};
use serde_json::json;

use crate::error::Error;
use crate::execution::actor::ExecutionActor;
use crate::execution::machine::Input;

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
    /// Decides a command and records `applied` or `rejected` with its effect; with
    /// `Saved::WithDecision`, in the same transition that saves it as accepted (K-1).
    pub(super) fn decide_command(
        &mut self,
        accepted: CommandRecord,
        control: Control,
        saved: Saved,
    ) -> ResponseActFuture<Self, Result<CommandRecord, Error>> {
        let command_id = accepted.command_id;
        let acceptance = (saved == Saved::WithDecision).then(|| Event::ControlAccepted {
            command_id,
            control: control.clone(),
        });
        let busy = self.in_flight.is_some();
        let (events, mut record) = match self.machine.decide(
            Input::Control {
                command_id,
                control,
            },
            busy,
        ) {
            Ok(events) => (
                events,
                CommandRecord {
                    status: CommandStatus::Applied,
                    ..accepted
                },
            ),
            Err(rejection) => {
                let reason = format!(
                    "{}; available: [{}]",
                    rejection.reason,
                    rejection.capabilities.join(", ")
                );
                let events = vec![Event::CommandRejected {
                    command_id,
                    reason: reason.clone(),
                }];
                (
                    events,
                    CommandRecord {
                        status: CommandStatus::Rejected,
                        reason: Some(reason),
                        ..accepted
                    },
                )
            }
        };
        // A control that changes the state of an execution with no running attempt (paused,
        // parked) starts one in the same transition: only an attempt may move the head.
        let mut events = events;
        let claims = self.epoch.is_none()
            && events
                .iter()
                .any(|event| matches!(event, Event::StateChanged { .. }));
        if claims {
            self.epoch = Some(self.lease.epoch);
            let started = Event::AttemptStarted {
                attempt_id: self.lease.attempt_id,
                owner_id: self.env.owner,
                epoch: self.lease.epoch,
            };
            events.insert(0, started);
        }
        if let Some(acceptance) = acceptance {
            events.insert(0, acceptance);
        }
        record.result_version = Some(self.head.version + 1);
        let upsert = Upsert::Command(record.clone());
        Box::pin(
            self.submit(events, vec![upsert])
                .map(move |outcome, act, ctx| {
                    let (decided, committed) = match outcome {
                        Ok(Outcome::Committed(_)) => (Ok(record), true),
                        // Decided meanwhile by a newer attempt (K-6): its stored outcome
                        // stands, and nothing of this transition (nor its claim) was written.
                        Ok(Outcome::DuplicateCommand { stored }) => (Ok(stored), false),
                        Ok(Outcome::CommandConflict { stored }) => (
                            Err(Error::CommandConflict {
                                stored: Box::new(stored),
                            }),
                            false,
                        ),
                        Ok(other) => (
                            Err(Error::Internal(format!("unexpected outcome {other:?}"))),
                            false,
                        ),
                        Err(error) => (Err(error), false),
                    };
                    if claims && !committed {
                        act.epoch = None;
                    } else if claims && act.lease_actor.is_none() {
                        act.hold_lease(ctx);
                    }
                    decided
                }),
        )
    }

    /// Records a command refused before it was accepted (a stale `expected_version`), so
    /// its status can be read back and a retry gets the same answer (K-1, K-4).
    fn refuse_command(
        &mut self,
        accepted: CommandRecord,
        reason: String,
    ) -> ResponseActFuture<Self, Result<CommandRecord, Error>> {
        let command_id = accepted.command_id;
        let mut record = CommandRecord {
            status: CommandStatus::Rejected,
            reason: Some(reason.clone()),
            ..accepted
        };
        record.result_version = Some(self.head.version + 1);
        let events = vec![
            Event::CommandAccepted {
                command_id,
                kind: record.kind.clone(),
            },
            Event::CommandRejected { command_id, reason },
        ];
        let upsert = Upsert::Command(record.clone());
        Box::pin(
            self.submit(events, vec![upsert])
                .map(move |outcome, _, _| match outcome? {
                    Outcome::Committed(_) => Ok(record),
                    Outcome::DuplicateCommand { stored } => Ok(stored),
                    Outcome::CommandConflict { stored } => Err(Error::CommandConflict {
                        stored: Box::new(stored),
                    }),
                    other => Err(Error::Internal(format!("unexpected outcome {other:?}"))),
                }),
        )
    }
}

/// The canonical payload of a command, hashed for K-4: the same id with another payload is
/// a conflict. Every field of the command body that changes its meaning is in it.
/// `fields`: the kind's own fields (`outcome`, `wait_id`, `answer`, ...), in the hash only
/// when present, so adding one never changes the hash of a command without it.
pub fn payload_hash_of(
    kind: &str,
    text: Option<&str>,
    expected_version: Option<u64>,
    fields: &[(&str, Option<String>)],
) -> [u8; 32] {
    let mut canonical = json!({
        "kind": kind,
        "text": text,
        "expected_version": expected_version,
    });
    for (name, value) in fields {
        if let Some(value) = value {
            canonical[*name] = json!(value);
        }
    }
    *blake3::hash(canonical.to_string().as_bytes()).as_bytes()
}

/// A control command from the command service (K-1): the execution saves it as accepted
/// (`ControlAccepted`) and records the decision, `applied` or `rejected` with its effect,
/// after it in the same transition: one durable commit, and no other write of this
/// execution between them.
#[derive(Debug, Message)]
#[rtype(result = "Result<CommandRecord, Error>")]
pub struct ApplyControl {
    pub accepted: CommandRecord,
    pub control: Control,
    /// The version the client saw (K-4); a stale one is refused and nothing is stored.
    pub expected_version: Option<u64>,
}

impl Handler<ApplyControl> for ExecutionActor {
    type Result = AtomicResponse<Self, Result<CommandRecord, Error>>;

    fn handle(&mut self, message: ApplyControl, _ctx: &mut Context<Self>) -> Self::Result {
        let _span = self.span.clone().entered();
        self.handled += 1;
        AtomicResponse::new(self.after_inherited(message))
    }
}

impl ExecutionActor {
    /// Commands an earlier attempt accepted and never decided come first (R-5, K-5: an
    /// inherited Cancel is not overtaken by a later Continue); then this one.
    pub(super) fn after_inherited(
        &mut self,
        message: ApplyControl,
    ) -> ResponseActFuture<Self, Result<CommandRecord, Error>> {
        match self.decide_pending() {
            Some(first) => Box::pin(first.then(move |(), act, _ctx| act.after_inherited(message))),
            None => self.apply_control(message),
        }
    }

    fn apply_control(
        &mut self,
        message: ApplyControl,
    ) -> ResponseActFuture<Self, Result<CommandRecord, Error>> {
        let ApplyControl {
            accepted,
            mut control,
            expected_version,
        } = message;
        if let Control::Reconcile { effect_id, .. } = &mut control {
            // An operator's reconcile names no effect: it resolves the one awaiting it.
            if effect_id.as_uuid().is_nil() {
                if let Some(unresolved) = &self.machine.unresolved {
                    *effect_id = unresolved.effect_id;
                }
            }
        }
        if let Control::Answer { wait_id, .. } | Control::Decline { wait_id } = &mut control {
            // No wait named: the execution's pending durable wait, if it has one.
            if wait_id.as_uuid().is_nil() {
                if let Some(pending) = self.machine.pending_wait() {
                    *wait_id = pending.wait_id;
                }
            }
        }
        let command_id = accepted.command_id;
        if self.machine.decided_commands.contains(&command_id) {
            // A redelivery: the stored outcome stands, or a conflict if the payload differs.
            let stored = self
                .env
                .store
                .command(command_id)
                .map_err(Error::Storage)
                .and_then(|stored| {
                    let stored = stored.ok_or_else(|| {
                        Error::Internal(format!("decided command {command_id} has no record"))
                    })?;
                    if stored.payload_hash == accepted.payload_hash {
                        Ok(stored)
                    } else {
                        Err(Error::CommandConflict {
                            stored: Box::new(stored),
                        })
                    }
                });
            return Box::pin(ActorFutureExt::map(fut::ready(stored), parked_after));
        }
        // A command accepted before and never decided (a log written when accepting and
        // deciding were two transitions, and a crash came between) was checked against the
        // version its client saw when it was accepted: decide it now.
        let accepted_before = matches!(
            self.env.store.command(command_id),
            Ok(Some(stored)) if stored.status == CommandStatus::Accepted
                && stored.payload_hash == accepted.payload_hash
                && stored.execution_id == accepted.execution_id
        );
        if accepted_before {
            return Box::pin(
                self.decide_command(accepted, control, Saved::Already)
                    .map(parked_after),
            );
        }
        if let Some(expected) = expected_version.filter(|expected| *expected != self.head.version) {
            let reason = format!(
                "stale expected_version {expected}: the current version is {}",
                self.head.version
            );
            return Box::pin(self.refuse_command(accepted, reason).map(parked_after));
        }
        Box::pin(
            self.decide_command(accepted, control, Saved::WithDecision)
                .map(parked_after),
        )
    }
}

/// A command refused outside the actor (a Fork or Retry that cannot be made): recorded on
/// this execution as accepted and rejected, like a stale `expected_version` (K-1, K-4).
#[derive(Debug, Message)]
#[rtype(result = "Result<CommandRecord, Error>")]
pub struct RecordRefusal(pub CommandRecord);

impl Handler<RecordRefusal> for ExecutionActor {
    type Result = AtomicResponse<Self, Result<CommandRecord, Error>>;

    fn handle(
        &mut self,
        RecordRefusal(record): RecordRefusal,
        _ctx: &mut Context<Self>,
    ) -> Self::Result {
        let _span = self.span.clone().entered();
        self.handled += 1;
        let reason = record.reason.clone().unwrap_or_default();
        AtomicResponse::new(Box::pin(
            self.refuse_command(record, reason).map(parked_after),
        ))
    }
}

/// After a command: an execution activated only for it (paused, finished) releases its
/// actor again.
fn parked_after<T>(result: T, act: &mut ExecutionActor, ctx: &mut Context<ExecutionActor>) -> T {
    act.park_if_idle(ctx);
    result
}
