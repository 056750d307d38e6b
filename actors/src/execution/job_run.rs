//! The execution actor's side of a Job (J-1, J-2): taking a lease the queue offers (with
//! the claim of an attempt, if none runs, in one transition), ending `expired` past the
//! queue deadline, and telling the queue what committed transitions changed.

use std::time::Duration;

use actix::prelude::*;
use openprogram_storage::{ExecutionState as Status, LeaseId};

use crate::error::Error;
use crate::execution::actor::{log_failure, parked, Advance, ExecutionActor};
use crate::machine::Action;

impl ExecutionActor {
    /// Tells the queue what a committed transition changed for this Job.
    pub(super) fn perform_job(&mut self, action: &Action, ctx: &mut Context<Self>) {
        match action {
            Action::LeaseHeld => {
                // The wall budget runs out while the Job holds its lease: it pauses at the
                // next step boundary (`Machine::next`).
                let now_ms = self.env.clock.now_ms();
                let job = self.machine.present.job.as_ref();
                if let Some(left) = job.and_then(|job| job.wall_left(now_ms)) {
                    ctx.run_later(Duration::from_millis(left), |_act, ctx| ctx.notify(Advance));
                }
            }
            other => {
                let other = std::slice::from_ref(other);
                self.env
                    .tell_queue(self.execution_id, &self.machine.present, other)
            }
        }
    }
}

/// J-1: the queue offers this Job the lease `lease_id`. Answers the epoch of the attempt
/// that committed it, or `None` if the Job takes no lease now (it left the queue).
#[derive(Debug, Message)]
#[rtype(result = "Result<Option<u64>, Error>")]
pub struct Grant {
    pub lease_id: LeaseId,
}

impl Handler<Grant> for ExecutionActor {
    type Result = AtomicResponse<Self, Result<Option<u64>, Error>>;

    fn handle(&mut self, message: Grant, _ctx: &mut Context<Self>) -> Self::Result {
        let _span = self.enter();
        let now_ms = self.env.clock.now_ms();
        let claims = self.epoch.is_none();
        let epoch = self.epoch.unwrap_or(self.lease.epoch);
        let Ok(granted) = self.machine.decide_grant(message.lease_id, epoch, now_ms) else {
            return AtomicResponse::new(Box::pin(fut::ready(Ok(None)).map(parked)));
        };
        let mut events = Vec::with_capacity(2);
        if claims {
            // A parked Job starts an attempt to run under its lease, in the same transition.
            events.push(self.claim());
        }
        events.extend(granted);
        AtomicResponse::new(Box::pin(self.commit(events, Vec::new()).map(
            move |committed, act, ctx| match committed {
                Ok(_) => {
                    if claims && act.lease_actor.is_none() {
                        act.hold_lease(ctx);
                    }
                    Ok(Some(epoch))
                }
                Err(error) => {
                    if claims {
                        act.epoch = None;
                    }
                    log_failure(Err(error.clone()), act, ctx);
                    Err(error)
                }
            },
        )))
    }
}

/// J-1: the queue deadline of this Job passed while it waited. Answers whether it ended
/// `expired` (it did not if it left the queue or got a lease meanwhile).
#[derive(Debug, Message)]
#[rtype(result = "Result<bool, Error>")]
pub struct ExpireQueued;

impl Handler<ExpireQueued> for ExecutionActor {
    type Result = AtomicResponse<Self, Result<bool, Error>>;

    fn handle(&mut self, _: ExpireQueued, _ctx: &mut Context<Self>) -> Self::Result {
        let _span = self.enter();
        let Some(mut events) = self.machine.decide_queue_expiry(self.env.clock.now_ms()) else {
            return AtomicResponse::new(Box::pin(fut::ready(Ok(false)).map(parked)));
        };
        // Only an attempt moves the head: the expiry claims one, in the same transition.
        self.claim_in(&mut events);
        AtomicResponse::new(Box::pin(self.commit(events, Vec::new()).map(
            |committed, act, ctx| {
                let expired = committed.map(|_| act.machine.status() == Status::Expired);
                act.park_if_idle(ctx);
                expired
            },
        )))
    }
}
