//! What a running tool call can ask of its execution — the plug-in side of a call, apart
//! from the actors: a `CallHandle` bound to the call's execution and effect asks
//! live questions (W-4) and starts managed processes (P-1) through the messages here, which
//! the execution actor handles (`execution/live.rs`, `execution/processes.rs`). Imports no
//! actor: a `Tool` sees only this module and `agent.rs`.

use std::sync::Arc;

use actix::prelude::*;
use futures::channel::oneshot;
use futures::future::BoxFuture;
use futures::FutureExt as _;
use openprogram_storage::{EffectId, ProcessId, ProcessState};

use crate::machine::LiveOutcome;
use crate::mailbox::CountedRecipient;

/// W-4: answers the live questions of code that runs outside a managed execution — a tool
/// called by the embedder itself, a reconcile protocol at startup — where no person watches
/// an execution (a headless service: a policy, a terminal prompt, another system). Registered
/// with `RuntimeBuilder::question_handler`; without one such a question gets
/// `AskError::NoInteraction`. A closure `Fn(EffectId, WaitSpec) -> BoxFuture<…>` is one.
pub trait QuestionHandler: Send + Sync + 'static {
    /// The outcome of the question the call `effect_id` asks: an answer (JSON text for a
    /// structured request), a decline, or an error of the handler's own.
    fn ask(
        &self,
        effect_id: EffectId,
        spec: crate::wait_request::WaitSpec,
    ) -> BoxFuture<'static, Result<LiveOutcome, AskError>>;
}

impl<F> QuestionHandler for F
where
    F: Fn(
            EffectId,
            crate::wait_request::WaitSpec,
        ) -> BoxFuture<'static, Result<LiveOutcome, AskError>>
        + Send
        + Sync
        + 'static,
{
    fn ask(
        &self,
        effect_id: EffectId,
        spec: crate::wait_request::WaitSpec,
    ) -> BoxFuture<'static, Result<LiveOutcome, AskError>> {
        self(effect_id, spec)
    }
}

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
    actor: Option<CountedRecipient<AskLive>>,
    starts: Option<CountedRecipient<StartProcess>>,
    calls: Option<CountedRecipient<CallFunction>>,
    /// Outside a managed execution: who answers its questions (W-4).
    headless: Option<Arc<dyn QuestionHandler>>,
}

impl std::fmt::Debug for CallHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallHandle")
            .field("effect_id", &self.effect_id)
            .field("managed", &self.actor.is_some())
            .field("headless", &self.headless.is_some())
            .finish()
    }
}

impl CallHandle {
    /// A handle bound to its execution: where its questions and its processes go.
    pub fn new(
        effect_id: EffectId,
        asks: CountedRecipient<AskLive>,
        starts: CountedRecipient<StartProcess>,
        calls: CountedRecipient<CallFunction>,
    ) -> Self {
        Self {
            effect_id,
            actor: Some(asks),
            starts: Some(starts),
            calls: Some(calls),
            headless: None,
        }
    }

    /// F-6: runs the registered function `function` with `input` as a child execution of
    /// this one (kind `function`, its own revision and checkpoints) and waits for its end:
    /// its result (JSON text), or why it did not complete. The child's id is derived from
    /// this call's effect, so the call asked again (after a crash) finds the same child and
    /// never starts a second.
    pub fn call_function(
        &self,
        function: String,
        input: serde_json::Value,
    ) -> BoxFuture<'static, Result<String, String>> {
        let message = CallFunction {
            effect_id: self.effect_id,
            function,
            input,
        };
        send(self.calls.clone(), message)
    }

    /// A handle for code that runs outside a managed execution (a reconcile protocol, a
    /// test): every question gets `AskError::NoInteraction`.
    pub fn detached(effect_id: EffectId) -> Self {
        Self {
            effect_id,
            actor: None,
            starts: None,
            calls: None,
            headless: None,
        }
    }

    /// W-4: a handle for code that runs outside a managed execution, whose questions
    /// `handler` answers (`None`: `AskError::NoInteraction`, as `detached`). It starts no
    /// process and calls no function: those belong to an execution.
    pub fn headless(effect_id: EffectId, handler: Option<Arc<dyn QuestionHandler>>) -> Self {
        Self {
            headless: handler,
            ..Self::detached(effect_id)
        }
    }

    /// Starts `program args` as a managed process of this execution (P-1): recorded before
    /// this returns, owned by its own actor, stopped only by `stop_process`.
    pub fn start_process(
        &self,
        program: String,
        args: Vec<String>,
    ) -> BoxFuture<'static, Result<StartedProcess, String>> {
        let message = StartProcess {
            effect_id: self.effect_id,
            program,
            args,
        };
        send(self.starts.clone(), message)
    }

    /// Asks the user a question and waits for the outcome: the answer, a decline, or
    /// `Invalidated` if the execution is cancelled, ends or loses its owner first. The
    /// question is not checkpointed: a restart does not ask it again.
    pub fn ask(
        &self,
        prompt: impl Into<String>,
    ) -> BoxFuture<'static, Result<LiveOutcome, AskError>> {
        self.ask_with(crate::wait_request::WaitSpec {
            prompt: prompt.into(),
            ..Default::default()
        })
    }

    /// `ask` with a structured request (W-6: a question's items, a form's fields, a
    /// permission; built with `WaitSpec::question` and the like): an answer is checked
    /// against it before it reaches this call, as its JSON text. A live question has no
    /// deadline (the call can stop waiting itself): `timeout_ms` is not used here.
    pub fn ask_with(
        &self,
        spec: crate::wait_request::WaitSpec,
    ) -> BoxFuture<'static, Result<LiveOutcome, AskError>> {
        let Some(actor) = self.actor.clone() else {
            return match &self.headless {
                Some(handler) => ask_headless(handler.as_ref(), self.effect_id, spec),
                None => futures::future::ready(Err(AskError::NoInteraction)).boxed(),
            };
        };
        let message = AskLive {
            effect_id: self.effect_id,
            prompt: spec.prompt,
            request: spec.request,
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

/// W-4, W-6: a question outside an execution, to the embedder's handler: a request that is
/// no question is refused before it is asked, and an answer must fit it, as an answer to a
/// question inside an execution must (`WaitRequest::validate`).
fn ask_headless(
    handler: &dyn QuestionHandler,
    effect_id: EffectId,
    spec: crate::wait_request::WaitSpec,
) -> BoxFuture<'static, Result<LiveOutcome, AskError>> {
    let request = spec
        .request
        .as_deref()
        .map(crate::wait_request::WaitRequest::from_text);
    let request = match request.transpose() {
        Ok(request) => request.flatten(),
        Err(error) => return futures::future::ready(Err(AskError::Refused(error))).boxed(),
    };
    let asked = handler.ask(effect_id, spec);
    async move {
        match (asked.await?, request) {
            (LiveOutcome::Answered(answer), Some(request)) => match request.validate(&answer) {
                Ok(canonical) => Ok(LiveOutcome::Answered(canonical)),
                Err(invalid) => Err(AskError::Refused(format!(
                    "the handler's answer does not fit the question: {}: {}",
                    invalid.field, invalid.message
                ))),
            },
            (outcome, _) => Ok(outcome),
        }
    }
    .boxed()
}

/// Sends `message` to the execution through `to` and waits for its answer; a detached
/// handle (no `to`) has nobody to ask (`NoInteraction`).
fn send<M, R>(to: Option<CountedRecipient<M>>, message: M) -> BoxFuture<'static, Result<R, String>>
where
    M: Message<Result = Result<R, String>> + Send + 'static,
    R: Send + 'static,
{
    let Some(to) = to else {
        return futures::future::ready(Err(AskError::NoInteraction.to_string())).boxed();
    };
    async move {
        (to.send(message).await)
            .map_err(|error| format!("the execution's actor is gone: {error}"))?
    }
    .boxed()
}

/// A running call asks a live question; the reply is where its outcome will arrive.
#[derive(Debug, Message)]
#[rtype(result = "Result<oneshot::Receiver<LiveOutcome>, AskError>")]
pub struct AskLive {
    pub effect_id: EffectId,
    pub prompt: String,
    /// W-6: a structured request (a `WaitRequest`'s canonical JSON text).
    pub request: Option<String>,
}

/// A process the call started, and where its end will be told.
#[derive(Debug)]
pub struct StartedProcess {
    pub process_id: ProcessId,
    pub exit: oneshot::Receiver<ProcessExit>,
}

/// A running call starts an OS command as a managed process.
#[derive(Debug, Message)]
#[rtype(result = "Result<StartedProcess, String>")]
pub struct StartProcess {
    pub effect_id: EffectId,
    pub program: String,
    pub args: Vec<String>,
}

/// How a managed process ended, for the call that started it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessExit {
    pub process_id: ProcessId,
    pub state: ProcessState,
    pub exit_code: Option<i32>,
    pub output_bytes: u64,
    pub output_tail: String,
}

/// F-6: a running call runs a durable function as a child execution and waits for its end.
#[derive(Debug, Message)]
#[rtype(result = "Result<String, String>")]
pub struct CallFunction {
    pub effect_id: EffectId,
    pub function: String,
    pub input: serde_json::Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn w4_a_question_outside_an_execution_goes_to_the_embedders_handler_or_gets_no_interaction() {
        let effect_id = EffectId::new();
        let handler: Arc<dyn QuestionHandler> = Arc::new(
            move |asker: EffectId, spec: crate::wait_request::WaitSpec| {
                let answer = format!("{} for {}", spec.prompt, asker == effect_id);
                futures::future::ready(Ok(LiveOutcome::Answered(answer))).boxed()
            },
        );
        let headless = CallHandle::headless(effect_id, Some(handler));
        let answered = futures::executor::block_on(headless.ask("proceed?"));
        assert_eq!(
            answered,
            Ok(LiveOutcome::Answered("proceed? for true".into()))
        );
        for nobody in [
            CallHandle::detached(effect_id),
            CallHandle::headless(effect_id, None),
        ] {
            let unanswered = futures::executor::block_on(nobody.ask("proceed?"));
            assert_eq!(unanswered, Err(AskError::NoInteraction));
        }
        // An answer must fit a structured question, as inside an execution.
        let items =
            serde_json::json!({"items": [{"id": "n", "type": "choice", "options": ["a", "b"]}]});
        let spec = crate::wait_request::WaitSpec::question("which?", &items).expect("a question");
        let refused = futures::executor::block_on(headless.ask_with(spec));
        assert!(matches!(refused, Err(AskError::Refused(_))), "{refused:?}");
        // A headless handle belongs to no execution: it starts no process.
        let started = futures::executor::block_on(headless.start_process("true".into(), vec![]));
        assert!(started.is_err_and(|error| error.contains("no_interaction")));
    }
}
