//! The execution actor's side of a durable function (F-1, F-4, F-5): one abortable run of
//! the body, its boundaries answered in mailbox order. At a step a committed result is
//! handed back without running; a Pause, used-up Step or Cancel ends the run; else the step
//! runs (an External one once `StepStarted` is durable) and its result is committed with
//! the checkpoint after it. A later run starts the body afresh and reads the steps back.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use actix::prelude::*;
use futures::future::{AbortHandle, Abortable};
use futures::FutureExt as _;
use openprogram_storage::{EffectId, Event, ExecutionState, WaitId, WaitStatus};

use super::actor::{after_commit, answer, Advance, ExecutionActor};
use crate::call::CallFunction;
use crate::env::ChildCall;
use crate::error::Error;
use crate::function::{
    AskBoundary, Asked, Boundary, CallStarted, FunctionContext, RevisionMissing, StepBoundary,
    StepDone,
};
use crate::machine::{state_changed, Recovery, Registered, RunDecision};

/// A run of the body ended with its result (or error), or it panicked.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(super) struct FunctionReturned {
    run: u64,
    result: Result<String, String>,
}

impl ExecutionActor {
    /// Starts a run of the function's body, unless its revision is not registered here:
    /// then the execution pauses `revision_missing` (F-3), never running other code.
    pub(super) fn start_function(
        &mut self,
        ctx: &mut Context<Self>,
    ) -> ResponseActFuture<Self, ()> {
        let Some(function_run) = self.machine.present.function.clone() else {
            return Box::pin(fut::ready(()));
        };
        let called = &function_run.input;
        let functions = &self.env.functions;
        let active = function_run.active_revision;
        let latest = functions.latest(&called.function);
        // F-7: the active revision is registered only with the code it ran (an execution
        // admitted before identities were recorded has none to compare).
        let recorded = &function_run.active_identity;
        let registered = Registered {
            active: functions
                .get(&called.function, active)
                .is_some_and(|function| recorded.is_empty() || function.identity == *recorded),
            latest: latest.map(|function| (function.revision, function.identity.clone())),
        };
        let correspond = latest.and_then(|function| function.correspondence(active));
        let convert = latest.and_then(|function| function.conversion(active));
        let revision = match self.machine.decide_run(
            &function_run,
            &registered,
            correspond.map(|map| map.as_ref() as _),
            convert.map(|convert| convert.as_ref() as _),
        ) {
            RunDecision::Run(revision) => revision,
            RunDecision::Persist(events) => {
                tracing::info!(execution_id = %self.execution_id, function = %called.function, active, ?events, "the function's revision decided");
                return self.progress(events);
            }
        };
        let Some(function) = self.env.functions.get(&called.function, revision) else {
            // Decided runnable from this very registry: not reached; never run other code.
            return self.progress(vec![revision_missing()]);
        };
        self.function_runs += 1;
        self.suspending = false;
        let run = self.function_runs;
        let context = FunctionContext::new(
            self.execution_id,
            run,
            &self.own_mailbox(ctx),
            Arc::clone(&self.env.functions),
        );
        self.run_steps.begin(context.started_steps());
        let body = AssertUnwindSafe(function.run(context, called.input.clone())).catch_unwind();
        let (abort, registration) = AbortHandle::new_pair();
        self.in_flight = Some(abort);
        ctx.spawn(
            fut::wrap_future::<_, Self>(Abortable::new(body, registration)).map(
                move |outcome, act, ctx| match outcome {
                    Ok(returned) => ctx.notify(FunctionReturned {
                        run,
                        result: returned
                            .unwrap_or_else(|_panic| Err("the function panicked".into()))
                            .map(|value| value.to_string()),
                    }),
                    // Aborted by a cancel: `next` records what it stopped and ends it.
                    Err(_aborted) => {
                        if act.function_run() == Some(run) {
                            act.in_flight = None;
                            act.suspending = false;
                            act.run_steps.end();
                        }
                        ctx.notify(Advance);
                        act.park_if_idle(ctx);
                    }
                },
            ),
        );
        Box::pin(fut::ready(()))
    }

    /// The run in progress, if the body is running.
    fn function_run(&self) -> Option<u64> {
        self.in_flight.as_ref().map(|_| self.function_runs)
    }

    /// F-5: the run stops at its boundaries from now on: each gets `Suspend` and the body
    /// returns; steps already running (other branches) finish and are committed. Once it
    /// returned, `Advance` commits the pause, the step's pause or the restart pause.
    fn suspend_run(&mut self) -> Boundary {
        self.suspending = true;
        Boundary::Suspend
    }
}

impl Handler<StepBoundary> for ExecutionActor {
    type Result = AtomicResponse<Self, Boundary>;

    fn handle(&mut self, asked: StepBoundary, _ctx: &mut Context<Self>) -> Self::Result {
        let _span = self.enter();
        if self.function_run() != Some(asked.run) {
            return answer(Boundary::Suspend);
        }
        if let Some((step, output)) = self.machine.completed_step(&asked.step_id) {
            // F-4: committed already, read back, never run again.
            return answer(Boundary::Committed {
                status: step.status,
                output: output.to_owned(),
            });
        }
        let stopping = self.env.lifecycle.is_stopping();
        // A step of this id still running: the body asks for one step twice at once.
        let running = &self.machine.present.calls.pending_steps;
        let twice = running.iter().any(|pending| pending.tool == asked.step_id);
        if self.suspending
            || self.machine.suspends_at_boundary(self.env.clock.now_ms())
            || stopping
            || twice
        {
            // F-5: the run stops here (a Pause, a used-up Step, a Cancel, an orderly
            // shutdown, R-7).
            return answer(self.suspend_run());
        }
        let effect_id = EffectId::new();
        let epoch = self.lease.epoch;
        if asked.recovery == Recovery::Idempotent {
            return answer(Boundary::Run { effect_id, epoch });
        }
        // E-4: an External step's intent is durable before it runs.
        let started = Event::StepStarted {
            step_id: asked.step_id,
            effect_id,
        };
        AtomicResponse::new(Box::pin(self.progressed(vec![started]).map(
            move |committed, act, _| {
                if !committed {
                    return Boundary::Suspend;
                }
                // B05: the step's intent is durable, the step not started.
                openprogram_storage::failpoint!("B05");
                act.run_steps.told(effect_id);
                Boundary::Run { effect_id, epoch }
            },
        )))
    }
}

impl Handler<StepDone> for ExecutionActor {
    type Result = AtomicResponse<Self, bool>;

    fn handle(&mut self, done: StepDone, _ctx: &mut Context<Self>) -> Self::Result {
        let _span = self.enter();
        // B07: a step's result in hand, its receipt not yet decided or persisted.
        openprogram_storage::failpoint!("B07");
        if self.function_run() != Some(done.run) {
            return answer(false);
        }
        let events =
            self.machine
                .decide_step_done(done.step_id, done.effect_id, done.status, done.output);
        AtomicResponse::new(self.progressed(events))
    }
}

impl Handler<FunctionReturned> for ExecutionActor {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, returned: FunctionReturned, ctx: &mut Context<Self>) -> Self::Result {
        let Some(returned) = after_commit(ctx, returned) else {
            return answer(());
        };
        let _span = self.enter();
        if self.function_run() != Some(returned.run) {
            // A run this actor ended already: its return says nothing.
            return answer(());
        }
        self.in_flight = None;
        self.run_steps.end();
        if std::mem::take(&mut self.suspending) {
            // Suspended at a boundary: what it returned is no result. `Advance` commits the
            // pause; a waiting execution parks.
            ctx.notify(Advance);
            self.park_if_idle(ctx);
            return answer(());
        }
        let never_started = self.run_steps.take_never_started();
        let events = self
            .machine
            .decide_returned(returned.result, &never_started);
        AtomicResponse::new(self.progress(events))
    }
}

/// The wait id of a function's `ask`: derived from the execution and the ask's id, so every
/// run of the body finds the same wait.
fn ask_wait(execution_id: openprogram_storage::ExecutionId, ask_id: &str) -> WaitId {
    let name = format!("ask:{ask_id}");
    WaitId::from_uuid(uuid::Uuid::new_v5(execution_id.as_uuid(), name.as_bytes()))
}

impl Handler<AskBoundary> for ExecutionActor {
    type Result = AtomicResponse<Self, Asked>;

    fn handle(&mut self, asked: AskBoundary, _ctx: &mut Context<Self>) -> Self::Result {
        let _span = self.enter();
        if self.function_run() != Some(asked.run) {
            return answer(Asked::Suspend);
        }
        let wait_id = ask_wait(self.execution_id, &asked.ask_id);
        let now_ms = self.env.clock.now_ms();
        let events = match self.machine.decide_ask(wait_id, &asked.spec, now_ms) {
            // Asked and resolved before: its outcome, on every run (W-2).
            Err(wait) if wait.status == WaitStatus::Answered => {
                return answer(Asked::Answered(wait.answer.clone().unwrap_or_default()))
            }
            Err(wait) if wait.status == WaitStatus::Declined => return answer(Asked::Declined),
            // Open (asked by another branch of this run), expired or invalidated.
            Err(_) => {
                self.suspend_run();
                return answer(Asked::Suspend);
            }
            Ok(events) => events,
        };
        let stops = self.suspending
            || self.machine.suspends_at_boundary(self.env.clock.now_ms())
            || self.env.lifecycle.is_stopping();
        // The run stops at the wait in any case: else the execution waits for a person, and
        // parks once the body returned.
        self.suspend_run();
        if stops {
            return answer(Asked::Suspend);
        }
        AtomicResponse::new(Box::pin(
            self.progressed(events).map(|_, _, _| Asked::Suspend),
        ))
    }
}

impl Handler<RevisionMissing> for ExecutionActor {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, missing: RevisionMissing, _ctx: &mut Context<Self>) -> Self::Result {
        let _span = self.enter();
        if self.function_run() != Some(missing.run) || self.suspending {
            return answer(());
        }
        // A Cancel or Pause pending wins: the run only stops here. Else F-3: a nested
        // call's revision is gone: the execution pauses, running no other code; the run
        // stops at its boundaries.
        let pending = self.machine.suspends_at_boundary(self.env.clock.now_ms());
        self.suspend_run();
        if pending {
            return answer(());
        }
        AtomicResponse::new(self.progress(vec![revision_missing()]))
    }
}

impl Handler<CallStarted> for ExecutionActor {
    type Result = AtomicResponse<Self, bool>;

    fn handle(&mut self, call: CallStarted, _ctx: &mut Context<Self>) -> Self::Result {
        let _span = self.enter();
        if self.function_run() != Some(call.run) || self.suspending {
            return answer(false);
        }
        if self.machine.nested_calls.contains_key(&call.call_id) {
            // Recorded by an earlier run: the same call again.
            return answer(true);
        }
        let recorded = Event::WorkflowCalled {
            call_id: call.call_id,
            function: call.function,
            revision: call.revision,
            input: call.input.to_string(),
        };
        AtomicResponse::new(self.progressed(vec![recorded]))
    }
}

/// F-3: the execution pauses, its function's revision missing.
fn revision_missing() -> Event {
    state_changed(ExecutionState::Paused, "revision_missing")
}

/// F-6: the child execution of a call is this call's: its id derived from the call's effect.
fn child_of(effect_id: EffectId) -> openprogram_storage::ExecutionId {
    openprogram_storage::ExecutionId::from_uuid(uuid::Uuid::new_v5(effect_id.as_uuid(), b"call"))
}

impl Handler<CallFunction> for ExecutionActor {
    type Result = ResponseFuture<Result<String, String>>;

    /// F-6: an agent's call of a function: the child is admitted and started (or found, for
    /// a call asked again after a crash), and the call waits for its end. Not atomic: the
    /// agent takes its commands (a Pause, a Cancel) meanwhile. When the runtime stops first
    /// the call never answers, so nothing is recorded and the call is asked again on the
    /// next start.
    fn handle(&mut self, call: CallFunction, _ctx: &mut Context<Self>) -> Self::Result {
        self.handled += 1;
        let env = Arc::clone(&self.env);
        let child_id = child_of(call.effect_id);
        let child = ChildCall {
            session_id: self.head.session_id,
            parent: self.execution_id,
            child_id,
            function: call.function,
            input: call.input,
        };
        Box::pin(async move {
            if let Err(error) = env.start_child(child).await {
                return match error {
                    Error::Unavailable(_) => futures::future::pending().await,
                    error => Err(format!("{} ({})", error, error.code())),
                };
            }
            let store = env.store.as_ref();
            while env.lifecycle.wait_finished(store, child_id).await.is_err() {
                if env.lifecycle.is_stopping() {
                    // No outcome now: nothing is recorded, the call is asked again next start.
                    return futures::future::pending().await;
                }
                // The child's actor stopped after a failed write: it is activated again or
                // taken over; wait for its end again.
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            let (head, machine) = crate::rebuild::load(store, child_id)
                .map_err(|error| format!("reading the call's result: {error}"))?;
            match head.state {
                ExecutionState::Completed => Ok(machine.text.clone()),
                state => Err(format!(
                    "the function's execution {child_id} ended {state}: {}",
                    machine.text
                )),
            }
        })
    }
}

impl ExecutionActor {
    /// F-6, K-5: a Cancel of an agent whose call of a function runs cancels that function's
    /// execution too (cancel wins); a Pause lets the call finish, as any tool call.
    pub(super) fn cancel_called_function(&mut self, ctx: &mut Context<Self>) {
        let Some(call) = self.machine.present.calls.function_call() else {
            return;
        };
        let child_id = child_of(call.effect_id);
        let cancelling = self.env.cancel_child(child_id);
        ctx.spawn(fut::wrap_future::<_, Self>(cancelling).map(move |result, act, _| {
            if let Err(error) = result {
                tracing::warn!(execution_id = %act.execution_id, %child_id, %error, "the called function was not cancelled");
            }
        }));
    }
}
