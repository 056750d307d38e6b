//! W-8: the actor's side of a wait deadline: told it passed (`wait_deadlines.rs`), the
//! machine decides the expiry, which is committed (claiming an attempt if none runs) before
//! the execution parks, paused `wait_expired`.

use actix::prelude::*;
use openprogram_storage::WaitId;

use crate::error::Error;
use crate::execution::actor::{parked, ExecutionActor};

/// The deadline of `wait_id` passed. Answers whether the wait expired now.
#[derive(Debug, Message)]
#[rtype(result = "Result<bool, Error>")]
pub struct ExpireWait {
    pub wait_id: WaitId,
}

impl Handler<ExpireWait> for ExecutionActor {
    type Result = AtomicResponse<Self, Result<bool, Error>>;

    fn handle(&mut self, message: ExpireWait, _ctx: &mut Context<Self>) -> Self::Result {
        let _span = self.enter();
        let now_ms = self.env.clock.now_ms();
        let Some(mut events) = self.machine.decide_wait_expiry(message.wait_id, now_ms) else {
            return AtomicResponse::new(Box::pin(fut::ready(Ok(false)).map(parked)));
        };
        let claims = self.claim_in(&mut events);
        AtomicResponse::new(Box::pin(self.commit(events, Vec::new()).map(
            move |committed, act, ctx| {
                if claims && committed.is_err() {
                    act.epoch = None;
                }
                act.park_if_idle(ctx);
                committed.map(|_| true)
            },
        )))
    }
}
