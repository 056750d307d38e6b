//! How the execution actor runs an effect (a model or tool call) and records its result.
//! An effect ready when first polled is recorded at once, by the handler that started it
//! (an External tool's before anything else leaves the mailbox, `ctx.wait`); any other runs
//! as a spawned, abortable future whose result comes back as `EffectDone`.

use actix::prelude::*;
use futures::future::{AbortHandle, Abortable, BoxFuture};
use futures::FutureExt as _;
use openprogram_storage::{EffectId, Outcome, ReceiptStatus};
use tracing::Instrument as _;

use super::actor::{
    after_commit, answer, committed_version, log_failure, Advance, ExecutionActor, Step,
};
use crate::agent::{ModelRequest, ToolCall, ToolError, ToolResult, UsageMeter};
use crate::call::CallHandle;
use crate::deltas::DeltaSink;
use crate::machine::waits::truncate;
use crate::machine::{Decision, Input, Machine, PendingTool, Recovery};
use crate::telemetry::StepKind;

/// A provider or tool finished.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(super) struct EffectDone(pub(super) Input);

impl Handler<EffectDone> for ExecutionActor {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, done: EffectDone, ctx: &mut Context<Self>) -> Self::Result {
        let Some(EffectDone(input)) = after_commit(ctx, done) else {
            return answer(());
        };
        let _span = self.enter();
        AtomicResponse::new(self.effect_done(input))
    }
}

impl ExecutionActor {
    /// Records an effect's result: decides what it leads to and commits that. The caller
    /// returns the commit as its `AtomicResponse`.
    pub(super) fn effect_done(&mut self, input: Input) -> ResponseActFuture<Self, ()> {
        self.in_flight = None;
        let decided = match input {
            Input::ModelDecided {
                effect_id,
                decision,
            } => {
                let usage = self.model_usage(effect_id);
                return self.decided_model(effect_id, decision, usage);
            }
            input @ Input::ModelFailed { effect_id, .. } => {
                let usage = self.model_usage(effect_id);
                let decided = self.machine.decide(input);
                decided.map(|events| events.into_iter().chain(usage).collect())
            }
            input => self.machine.decide(input),
        };
        match decided {
            Ok(events) => Box::pin(
                self.submit_planned(events, Vec::new(), None, None)
                    .map(|outcome, act, ctx| log_failure(committed_version(outcome), act, ctx)),
            ),
            Err(rejection) => {
                self.effect_started = None;
                tracing::error!(execution_id = %self.execution_id, ?rejection, "an effect result was refused");
                Box::pin(fut::ready(()))
            }
        }
    }

    /// Records a model's decision (with the call's usage). W-7: an `Ask` for a tool reads the
    /// session's grants first; should the session record move before the commit (a grant
    /// revoked, given), the transition writes nothing and the decision is decided again on
    /// the record as it is then.
    fn decided_model(
        &mut self,
        effect_id: EffectId,
        decision: Decision,
        usage: Option<openprogram_storage::Event>,
    ) -> ResponseActFuture<Self, ()> {
        let now_ms = self.env.clock.now_ms();
        let wants_grant = matches!(decision.wait_spec(), Some(Ok(spec)) if spec.tool().is_some());
        let session = match wants_grant {
            true => match self.env.store.session(self.head.session_id) {
                Ok(session) => session,
                Err(error) => {
                    tracing::warn!(execution_id = %self.execution_id, %error, "the session's grants could not be read: none relied on");
                    None
                }
            },
            false => None,
        };
        let again = session.as_ref().map(|_| (decision.clone(), usage.clone()));
        let (mut events, decision) =
            self.machine
                .decide_decision(effect_id, decision, now_ms, session.as_ref());
        events.extend(usage);
        let submitted = self.submit_planned(events, Vec::new(), decision, None);
        Box::pin(
            submitted.then(move |outcome, act, ctx| match (outcome, again) {
                // The session record moved since it was read (a revoke, a turn admitted):
                // decided again on the record as it is now. Never given up, or the decision
                // would be lost; each conflict is another write to the session committed.
                (Ok(Outcome::SessionConflict { .. }), Some((decision, usage))) => {
                    act.decided_model(effect_id, decision, usage)
                }
                (outcome, _) => {
                    log_failure(committed_version(outcome), act, ctx);
                    Box::pin(fut::ready(()))
                }
            }),
        )
    }

    /// The call of a tool by this attempt: its effect, fencing epoch and handle.
    pub(super) fn tool_call(
        &self,
        effect_id: EffectId,
        args: serde_json::Value,
        handle: CallHandle,
    ) -> ToolCall {
        ToolCall {
            execution_id: self.execution_id,
            effect_id,
            attempt_id: self.lease.attempt_id,
            owner_id: self.env.owner,
            epoch: self.lease.epoch,
            args,
            handle,
        }
    }

    /// Starts a step's clock and span (I-5); the span of its call, a child of the step's.
    fn start_step(&mut self, kind: StepKind, effect_id: EffectId, name: &str) -> tracing::Span {
        let started = std::time::Instant::now();
        if self.span.is_none() {
            // Not in the span sample (or no subscriber wants spans).
            let span = tracing::Span::none();
            self.effect_started = Some(Step {
                started,
                kind,
                span,
            });
            return tracing::Span::none();
        }
        let step = tracing::info_span!(
            parent: &self.span,
            "step",
            execution_id = %self.execution_id,
            attempt_id = %self.lease.attempt_id,
            %effect_id,
        );
        let call = match kind {
            StepKind::Model => tracing::info_span!(
                parent: &step,
                "model_call",
                execution_id = %self.execution_id,
                attempt_id = %self.lease.attempt_id,
                %effect_id,
            ),
            StepKind::Tool => tracing::info_span!(
                parent: &step,
                "tool_call",
                execution_id = %self.execution_id,
                attempt_id = %self.lease.attempt_id,
                %effect_id,
                tool = name,
            ),
        };
        let span = step;
        self.effect_started = Some(Step {
            started,
            kind,
            span,
        });
        call
    }

    /// E-6: the event recording what the model call `effect_id` used, if its provider said.
    fn model_usage(&mut self, effect_id: EffectId) -> Option<openprogram_storage::Event> {
        let (metered, meter) = self.usage_meter.take()?;
        (metered == effect_id)
            .then(|| Machine::usage_recorded(effect_id, meter.take()))
            .flatten()
    }

    /// Starts the model call. Returns its result if the provider had it at once.
    pub(super) fn start_model(
        &mut self,
        effect_id: EffectId,
        ctx: &mut Context<Self>,
    ) -> Option<Input> {
        let usage = UsageMeter::default();
        self.usage_meter = Some((effect_id, usage.clone()));
        let call = self.start_step(StepKind::Model, effect_id, "model");
        let (earlier, left_out) = self.context.earlier();
        let request = ModelRequest {
            execution_id: self.execution_id,
            effect_id,
            input: self.machine.present.turn.input.clone(),
            context: self.machine.context.clone(),
            earlier,
            left_out,
            iterations: self.machine.present.turn.iterations,
            used: self.machine.present.turn.usage,
            usage,
            deltas: DeltaSink::new(self.env.deltas.clone(), self.execution_id, effect_id),
        };
        let mut deciding = self.env.provider.decide(request).instrument(call);
        if let Some(result) = (&mut deciding).now_or_never() {
            return Some(model_result(effect_id, result));
        }
        let (abort, registration) = AbortHandle::new_pair();
        self.in_flight = Some(abort);
        let decided = Abortable::new(deciding, registration);
        ctx.spawn(
            fut::wrap_future::<_, Self>(decided).map(move |result, act, ctx| match result {
                Ok(result) => ctx.notify(EffectDone(model_result(effect_id, result))),
                Err(_aborted) => {
                    // A cancelled model request leaves nothing to record: it is regenerated from
                    // committed context if the execution ever runs again.
                    act.in_flight = None;
                    act.effect_started = None;
                    act.usage_meter = None;
                    ctx.notify(Advance);
                }
            }),
        );
        None
    }

    /// Starts the pending tool call. Returns its result if the tool had it at once.
    pub(super) fn start_tool(
        &mut self,
        pending: PendingTool,
        ctx: &mut Context<Self>,
    ) -> Option<Input> {
        if pending.dispatched && self.lease.lapsed() {
            // Stopped past its lease (SIGSTOP, a frozen thread) with the call's intent
            // durable and the call not started: a new attempt may hold the execution now,
            // and a stale attempt starts no effect (R06). Asked again after half a lease:
            // by then it was taken over (this actor is told and stops), or the supervisor
            // found it idle and started its lease afresh (no one else holds it: it runs).
            tracing::warn!(execution_id = %self.execution_id, "lease lapsed before the dispatched call started; not starting it yet");
            ctx.run_later(self.lease.ttl / 2, |_, ctx| ctx.notify(Advance));
            return None;
        }
        let effect_id = pending.effect_id;
        let span = self.start_step(StepKind::Tool, effect_id, &pending.tool);
        let refused = |error: String| -> (Recovery, BoxFuture<'static, ToolResult>) {
            (
                Recovery::Idempotent,
                futures::future::ready(Err(error.into())).boxed(),
            )
        };
        let (recovery, running) = match (self.env.tools.get(&pending.tool), pending.args.parse()) {
            (Some(tool), Ok(args)) => {
                let mailbox = self.own_mailbox(ctx);
                let handle = CallHandle::new(
                    effect_id,
                    mailbox.recipient(),
                    mailbox.recipient(),
                    mailbox.recipient(),
                );
                (
                    tool.recovery(),
                    tool.call(self.tool_call(effect_id, args, handle)),
                )
            }
            (None, _) => refused(format!("unknown tool `{}`", pending.tool)),
            // Not run: text serde_json holds as raw JSON but will not parse into a value
            // (a lone surrogate, a number past f64); the call is recorded as failed.
            (Some(_), Err(error)) => refused(format!("the tool arguments do not parse: {error}")),
        };
        let mut running = running.instrument(span);
        if let Some(result) = (&mut running).now_or_never() {
            return Some(tool_result(effect_id, recovery, Ok(result)));
        }
        let (abort, registration) = AbortHandle::new_pair();
        self.in_flight = Some(abort);
        let ran = Abortable::new(running, registration);
        ctx.spawn(
            fut::wrap_future::<_, Self>(ran).map(move |result, _act, ctx| {
                // B07: a response in hand, its receipt not yet decided or persisted.
                openprogram_storage::failpoint!("B07");
                let aborted = result.map_err(|_aborted| ());
                ctx.notify(EffectDone(tool_result(effect_id, recovery, aborted)));
            }),
        );
        None
    }
}

fn model_result(effect_id: EffectId, result: Result<Decision, String>) -> Input {
    match result {
        Ok(decision) => Input::ModelDecided {
            effect_id,
            decision,
        },
        Err(error) => Input::ModelFailed { effect_id, error },
    }
}

/// A tool call's result; `Err(())` if it was aborted.
fn tool_result(effect_id: EffectId, recovery: Recovery, result: Result<ToolResult, ()>) -> Input {
    let (status, output) = match result {
        Ok(Ok(output)) => (ReceiptStatus::Confirmed, bounded(output)),
        Ok(Err(ToolError::Failed(error))) => (ReceiptStatus::Failed, bounded(error)),
        // Only an external effect awaits reconciliation; any other may run again.
        Ok(Err(ToolError::Unknown(error))) if recovery == Recovery::External => {
            (ReceiptStatus::Unknown, bounded(error))
        }
        Ok(Err(ToolError::Unknown(error))) => (ReceiptStatus::Failed, bounded(error)),
        // An aborted external call may or may not have taken effect.
        Err(()) if recovery == Recovery::External => {
            (ReceiptStatus::Unknown, "aborted by cancel".to_owned())
        }
        Err(()) => (ReceiptStatus::Failed, "aborted by cancel".to_owned()),
    };
    Input::ToolFinished {
        effect_id,
        status,
        output,
    }
}

/// Tool outputs above this are cut, so a chatty tool cannot make its own result too large
/// to record (the transition size limit is 1 MiB by default).
const TOOL_OUTPUT_BYTES_MAX: usize = 64 * 1024;

fn bounded(mut output: String) -> String {
    if truncate(&mut output, TOOL_OUTPUT_BYTES_MAX) {
        output.push_str("…[truncated]");
    }
    output
}
