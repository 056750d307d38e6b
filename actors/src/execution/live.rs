//! What a running tool call can ask of its execution: a live question (W-4). The call gets
//! a `CallHandle` bound to its execution actor and its own effect; the actor records the
//! question as a wait of kind `live` bound to its attempt and the call, and hands the answer
//! back to exactly that call once an `answer` or `decline` command is applied.

use actix::prelude::*;
use futures::channel::oneshot;

use openprogram_storage::{LiveBinding, WaitId};

use crate::call::{AskError, AskLive};
use crate::execution::actor::{answer, ExecutionActor};
use crate::machine::{Input, LiveOutcome};

impl Handler<AskLive> for ExecutionActor {
    type Result = AtomicResponse<Self, Result<oneshot::Receiver<LiveOutcome>, AskError>>;

    fn handle(&mut self, message: AskLive, _ctx: &mut Context<Self>) -> Self::Result {
        let _span = self.enter();
        if self.machine.present.run.cancel_requested {
            // Cancellation invalidates questions, including one asked while it lands (W-4).
            let (sender, receiver) = oneshot::channel();
            let _ = sender.send(LiveOutcome::Invalidated);
            return answer(Ok(receiver));
        }
        let Some(epoch) = self.epoch else {
            return answer(Err(AskError::Refused(
                "the execution has no live attempt".into(),
            )));
        };
        let wait_id = WaitId::new();
        let input = Input::AskLive {
            wait_id,
            prompt: message.prompt,
            request: message.request,
            binding: LiveBinding {
                attempt_id: self.lease.attempt_id,
                epoch,
                effect_id: message.effect_id,
            },
        };
        let events = match self.machine.decide(input) {
            Ok(events) => events,
            Err(rejection) => return answer(Err(AskError::Refused(rejection.reason()))),
        };
        AtomicResponse::new(Box::pin(self.commit(events, Vec::new()).map(
            move |committed, act, _ctx| match committed {
                Ok(_) => {
                    let (sender, receiver) = oneshot::channel();
                    act.live_askers.insert(wait_id, sender);
                    Ok(receiver)
                }
                Err(error) => Err(AskError::Interrupted(error.to_string())),
            },
        )))
    }
}

impl ExecutionActor {
    /// Hands a resolved live question's outcome to the call that asked, if it still waits.
    pub(super) fn live_resolved(&mut self, wait_id: WaitId, outcome: LiveOutcome) {
        if let Some(sender) = self.live_askers.remove(&wait_id) {
            // The call may have ended meanwhile; then nobody needs the outcome.
            let _ = sender.send(outcome);
        }
    }
}
