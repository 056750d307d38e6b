//! E-8, the execution actor's side of its conversation: before each model request, the
//! earlier turns of its branch read once per activation and kept within the context budget
//! (`context_read::TurnContext` decides), a compaction the budget asks for run as the effect
//! in flight, and, when the turn ends, its branch put in the cache for the next turn.

use std::sync::Arc;

use actix::prelude::*;
use futures::future::AbortHandle;
use openprogram_storage::ExecutionId;

use super::actor::{Advance, ExecutionActor};
use crate::context_read::{Prepared, Reading};
use crate::error::Error;

impl ExecutionActor {
    /// E-8: what comes before the model request the `Advance` handler is about to make, as
    /// its response: fixing the branch (the commit asks for the request again), a compaction
    /// for the budget, or a read tried again later. `None`: make the request now.
    pub(super) fn before_model_call(
        &mut self,
        ctx: &mut Context<Self>,
    ) -> Option<ResponseActFuture<Self, ()>> {
        match self.prepare_request() {
            Ok(Prepared::Ready) => None,
            Ok(Prepared::Pin(pin)) => Some(self.progress(vec![pin])),
            Ok(Prepared::Compact(through)) => {
                self.compact_for_budget(through, ctx);
                Some(Box::pin(fut::ready(())))
            }
            Err(error) => {
                // A read that failed (a database gone for a moment) is tried again, never
                // guessed around: the request must be the one a restart makes.
                tracing::warn!(execution_id = %self.execution_id, %error, "the conversation's earlier turns could not be read; trying again");
                ctx.run_later(self.lease.ttl / 2, |_, ctx| ctx.notify(Advance));
                Some(Box::pin(fut::ready(())))
            }
        }
    }

    /// E-8: what its next model request needs first: its branch read (once per
    /// activation), kept within the context budget, and fixed (`Prepared::Pin`).
    fn prepare_request(&mut self) -> Result<Prepared, Error> {
        let hooks = &self.env.conversation_hooks;
        let reading = Reading {
            store: self.env.store.as_ref(),
            cache: &self.env.branches,
            budget: hooks.context_budget,
            compact_keep: hooks
                .compactor
                .as_ref()
                .map(|_| hooks.policy.map_or(0, |policy| policy.keep)),
        };
        self.context
            .prepare(reading, self.head.session_id, &self.machine)
    }

    /// E-8: the compactor summarizes the branch through `through` before the next request,
    /// which is over the context budget. It runs as the effect in flight: a Cancel aborts it.
    fn compact_for_budget(&mut self, through: ExecutionId, ctx: &mut Context<Self>) {
        let env = Arc::clone(&self.env);
        let session_id = self.head.session_id;
        let (abort, registration) = AbortHandle::new_pair();
        self.in_flight = Some(abort);
        let compacting = futures::future::Abortable::new(
            async move { crate::conversation_follow_up::compact(&env, session_id, through).await },
            registration,
        );
        ctx.spawn(
            fut::wrap_future::<_, Self>(compacting).map(|compacted, act, ctx| {
                act.in_flight = None;
                match compacted {
                    Ok(Ok(compaction)) => act.context.compacted(Some(&compaction)),
                    Ok(Err(error)) => {
                        tracing::warn!(execution_id = %act.execution_id, %error, "the conversation was not compacted for the context budget; its oldest turns are left out");
                        act.context.compacted(None);
                    }
                    Err(_aborted) => {}
                }
                ctx.notify(Advance);
            }),
        );
    }

    /// E-8: an ended turn's branch, itself last, for the next turn of the conversation: it
    /// reads nothing more of the store. Only a whole history read from ended turns is kept.
    pub(super) fn remember_branch(&self) {
        let Some(whole) = self.context.whole() else {
            return;
        };
        if !self.machine.is_complete() {
            return;
        }
        let turn = crate::context_read::earlier_turn(
            &self.machine,
            self.execution_id,
            self.head.reply_message_id,
        );
        if let Some(turn) = turn {
            let branch = whole.then(crate::context::Earlier::Turn(Arc::new(turn)));
            self.env.branches.put(self.head.reply_message_id, branch);
        }
    }
}
