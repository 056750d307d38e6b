//! What a running tool call can ask of its execution: a live question (W-4). The call gets
//! a `CallHandle` bound to its execution actor and its own effect; the actor records the
//! question as a wait of kind `live` bound to its attempt and the call, and hands the answer
//! back to exactly that call once an `answer` or `decline` command is applied.

use actix::prelude::*;
use futures::channel::oneshot;
use futures::future::BoxFuture;
use futures::FutureExt as _;
use openprogram_storage::{EffectId, LiveBinding, WaitId};

use crate::execution::actor::ExecutionActor;
use crate::execution::machine::{Input, LiveOutcome};
use crate::execution::processes::{StartProcess, StartedProcess};

/// Why a live question got no outcome. Never a silent "unanswered" or "declined" (W-4).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AskError {
    /// Asked outside a managed execution, with no handler of the embedder's.
    #[error("no_interaction: this call runs outside a managed execution")]
    NoInteraction,
    /// The execution refused the question (not its running call, not running, too long).
    #[error("the question was refused: {0}")]
    Refused(String),
    /// The runtime failed while asking or waiting (a storage error, the actor stopped).
    #[error("the question was interrupted: {0}")]
    Interrupted(String),
}

/// A running call's link to its execution.
#[derive(Clone)]
pub struct CallHandle {
    effect_id: EffectId,
    actor: Option<Recipient<AskLive>>,
    starts: Option<Recipient<StartProcess>>,
}

impl std::fmt::Debug for CallHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallHandle")
            .field("effect_id", &self.effect_id)
            .field("managed", &self.actor.is_some())
            .finish()
    }
}

impl CallHandle {
    pub(crate) fn new(effect_id: EffectId, actor: Addr<ExecutionActor>) -> Self {
        Self {
            effect_id,
            starts: Some(actor.clone().recipient()),
            actor: Some(actor.recipient()),
        }
    }

    /// A handle for code that runs outside a managed execution (a reconcile protocol, a
    /// test): every question gets `AskError::NoInteraction`.
    pub fn detached(effect_id: EffectId) -> Self {
        Self {
            effect_id,
            actor: None,
            starts: None,
        }
    }

    /// Starts `program args` as a managed process of this execution (P-1): recorded before
    /// this returns, owned by its own actor, stopped only by `stop_process`.
    pub fn start_process(
        &self,
        program: String,
        args: Vec<String>,
    ) -> BoxFuture<'static, Result<StartedProcess, String>> {
        let Some(starts) = self.starts.clone() else {
            let detached = Err(AskError::NoInteraction.to_string());
            return futures::future::ready(detached).boxed();
        };
        let message = StartProcess {
            effect_id: self.effect_id,
            program,
            args,
        };
        async move {
            starts
                .send(message)
                .await
                .map_err(|error| format!("the execution's actor is gone: {error}"))?
        }
        .boxed()
    }

    /// Asks the user a question and waits for the outcome: the answer, a decline, or
    /// `Invalidated` if the execution is cancelled, ends or loses its owner first. The
    /// question is not checkpointed: a restart does not ask it again.
    pub fn ask(
        &self,
        prompt: impl Into<String>,
    ) -> BoxFuture<'static, Result<LiveOutcome, AskError>> {
        let Some(actor) = self.actor.clone() else {
            return futures::future::ready(Err(AskError::NoInteraction)).boxed();
        };
        let message = AskLive {
            effect_id: self.effect_id,
            prompt: prompt.into(),
        };
        async move {
            let waiting = actor
                .send(message)
                .await
                .map_err(|error| AskError::Interrupted(error.to_string()))??;
            waiting.await.map_err(|_| {
                AskError::Interrupted("the execution's actor stopped before an outcome".into())
            })
        }
        .boxed()
    }
}

/// A running call asks a live question; the reply is where its outcome will arrive.
#[derive(Debug, Message)]
#[rtype(result = "Result<oneshot::Receiver<LiveOutcome>, AskError>")]
pub struct AskLive {
    effect_id: EffectId,
    prompt: String,
}

impl Handler<AskLive> for ExecutionActor {
    type Result = AtomicResponse<Self, Result<oneshot::Receiver<LiveOutcome>, AskError>>;

    fn handle(&mut self, message: AskLive, _ctx: &mut Context<Self>) -> Self::Result {
        let _span = self.span.clone().entered();
        self.handled += 1;
        if self.machine.cancel_requested {
            // Cancellation invalidates questions, including one asked while it lands (W-4).
            let (sender, receiver) = oneshot::channel();
            let _ = sender.send(LiveOutcome::Invalidated);
            return AtomicResponse::new(Box::pin(fut::ready(Ok(receiver))));
        }
        let Some(epoch) = self.epoch else {
            let refused = Err(AskError::Refused(
                "the execution has no live attempt".into(),
            ));
            return AtomicResponse::new(Box::pin(fut::ready(refused)));
        };
        let wait_id = WaitId::new();
        let input = Input::AskLive {
            wait_id,
            prompt: message.prompt,
            binding: LiveBinding {
                attempt_id: self.lease.attempt_id,
                epoch,
                effect_id: message.effect_id,
            },
        };
        let events = match self.machine.decide(input) {
            Ok(events) => events,
            Err(rejection) => {
                let refused = Err(AskError::Refused(rejection.reason()));
                return AtomicResponse::new(Box::pin(fut::ready(refused)));
            }
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
