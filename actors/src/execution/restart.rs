//! The execution actor's part in restart recovery: the cooperative pause of an orderly
//! shutdown, deciding commands a dead attempt accepted, and asking a tool's
//! reconcile protocol about an unknown effect. The decisions are the pure machine's.

use actix::prelude::*;
use futures::FutureExt;
use openprogram_storage::planted::{planted, Bug};
use openprogram_storage::{CommandStatus, Event, ReceiptStatus};

use crate::agent::Reconciliation;
use crate::command::{Command, CommandBody, EffectRef, ReconcileOutcome};
use crate::execution::actor::{after_commit, answer, Advance, DecideInherited, ExecutionActor};
use crate::execution::commands::{ApplyCommand, Saved};
use crate::function::{DurableFunction, StepRef};
use crate::machine::{derived_command_id, PendingTool};

impl ExecutionActor {
    /// While the runtime stops: the restart-recovery pause of a running execution with
    /// nothing in flight, committed. `None` if the runtime is not stopping or nothing runs.
    pub(super) fn restart_pause(&mut self) -> Option<ResponseActFuture<Self, ()>> {
        // Commands the dead attempt accepted come first: an inherited Pause stays the user's.
        if self.in_flight.is_some() || self.epoch.is_none() || !self.inherited_pending.is_empty() {
            return None;
        }
        let stopping = self.env.lifecycle.stopping_intent()?;
        // An interruption not yet over keeps its deadline: restarts never extend it.
        let intent =
            (self.head.restart_intent.clone()).unwrap_or_else(|| self.machine.own_intent(stopping));
        let events = self.machine.restart_pause(intent)?;
        Some(Box::pin(self.commit(events, Vec::new()).map(
            |committed, act, ctx| {
                if let Err(error) = committed {
                    tracing::warn!(execution_id = %act.execution_id, %error, "restart pause failed; releasing");
                    act.release(ctx);
                }
            },
        )))
    }

    /// The first command accepted before a crash and still undecided, decided now; then the
    /// execution goes on. `None` if there is none.
    pub(super) fn decide_pending(&mut self) -> Option<ResponseActFuture<Self, ()>> {
        let (accepted, control) = loop {
            let command_id = *self.inherited_pending.first()?;
            self.inherited_pending.remove(0);
            let control = self.machine.present.run.pending(command_id).cloned();
            match (control, self.env.store.command(command_id)) {
                (Some(control), Ok(Some(record))) if record.status == CommandStatus::Accepted => {
                    break (record, control)
                }
                _ => continue, // decided meanwhile, or unreadable: nothing to decide here
            }
        };
        let command = Command::new(control.into()).with_id(accepted.command_id);
        Some(Box::pin(self.decide_command(accepted, command, Saved::Already, 0).map(
            |decided, act, ctx| match decided {
                Ok(_) => {
                    ctx.notify(DecideInherited);
                    ctx.notify(Advance);
                }
                Err(error) => {
                    tracing::warn!(execution_id = %act.execution_id, %error, "deciding a pending command failed; releasing");
                    act.release(ctx);
                }
            },
        )))
    }

    /// Asks the unresolved effect's tool whether it took effect; a definite answer becomes a
    /// `reconcile` command with a fixed identity (one per effect), applied like any other.
    pub(super) fn start_reconcile(&mut self, ctx: &mut Context<Self>) {
        if self.reconciling {
            return;
        }
        let Some(unresolved) = self.machine.present.calls.unresolved.clone() else {
            return;
        };
        // S-8: a nested call's step is judged with that call's input (the whole history).
        if !self.complete_history(ctx) {
            return;
        }
        // A fence refuses writes of epochs older than the asking attempt's: it covers an
        // earlier attempt, never the asking one.
        let fenced_off = self.protocol_fences(&unresolved)
            && unresolved
                .dispatched_in
                .is_some_and(|attempt| attempt != self.lease.attempt_id);
        if unresolved.dispatched_by == Some(self.env.owner) && !fenced_off {
            // Dispatched by an attempt of this incarnation that was taken over (or by this
            // attempt, a step it gave up on): it may still be running, so the external
            // system's answer is not final, unless an earlier attempt dispatched it and the
            // protocol fences the effect at the resource. An operator decides.
            tracing::warn!(execution_id = %self.execution_id, effect_id = %unresolved.effect_id, "unknown effect of a taken-over attempt; awaiting an operator's reconcile");
            self.park_if_idle(ctx);
            return;
        }
        let Some(asking) = self.reconcile_protocol(&unresolved) else {
            self.park_if_idle(ctx);
            return;
        };
        self.reconciling = true;
        let effect_id = unresolved.effect_id;
        let round = self.machine.present.calls.unresolved_seq;
        let asked = match planted(Bug::FabricateReceipt) {
            true => futures::future::ready(Reconciliation::Confirmed("appended".into())).boxed(),
            false => asking,
        };
        ctx.spawn(
            fut::wrap_future::<_, Self>(asked).map(move |answer, act, ctx| {
                let (status, output) = match answer {
                    Reconciliation::Confirmed(output) => (ReceiptStatus::Confirmed, output),
                    Reconciliation::NotApplied => (ReceiptStatus::NotApplied, String::new()),
                    Reconciliation::Unknown => {
                        act.reconciling = false;
                        tracing::info!(execution_id = %act.execution_id, %effect_id, "the reconcile protocol cannot tell; an operator's reconcile decides");
                        if !ctx.waiting() {
                            // A command in progress parks the actor itself when done.
                            act.park_if_idle(ctx);
                        }
                        return;
                    }
                };
                tracing::info!(execution_id = %act.execution_id, %effect_id, ?status, "reconciled by the tool's protocol");
                // Through the mailbox, like any command: never beside one in progress. The
                // actor stays (`reconciling`) until the answer is applied.
                act.own_mailbox(ctx).do_send(ReconcileAnswer(reconcile_command(
                    act, effect_id, round, status, output,
                )));
            }),
        );
    }
}

impl ExecutionActor {
    /// The question a protocol asks about the effect in doubt: its tool's reconcile, or for
    /// a durable function's step, the function's reconciler. `None`: no protocol (or
    /// arguments that never parsed, so the call never ran): an operator decides.
    fn reconcile_protocol(
        &self,
        unresolved: &PendingTool,
    ) -> Option<futures::future::BoxFuture<'static, Reconciliation>> {
        if self.machine.present.function.is_some() {
            let (function, input, step_id) = self.step_judge(unresolved)?;
            let step = StepRef {
                step_id: step_id.to_owned(),
                effect_id: unresolved.effect_id,
                epoch: self.lease.epoch,
            };
            return Some((function.reconciler()?)(step, input.clone()));
        }
        let tool = self.env.tools.get(&unresolved.tool)?;
        let args = unresolved.args.parse().ok()?;
        let handle = self.env.outside_call(unresolved.effect_id);
        Some(tool.reconcile(self.tool_call(unresolved.effect_id, args, handle)))
    }

    /// Whether the protocol `reconcile_protocol` would ask fences the effect at the
    /// resource, so that its answer stands while an older attempt of this process may still
    /// run the effect (`Tool::reconcile_fences`).
    fn protocol_fences(&self, unresolved: &PendingTool) -> bool {
        match self.machine.present.function {
            Some(_) => self
                .step_judge(unresolved)
                .is_some_and(|(function, _, _)| function.reconciler_fences()),
            None => self
                .env
                .tools
                .get(&unresolved.tool)
                .is_some_and(|tool| tool.reconcile_fences()),
        }
    }

    /// For a durable function's step in doubt: the function that judges it, with its input
    /// and the step's id in it. A step of a nested call is its own function's to judge.
    fn step_judge<'a>(
        &'a self,
        unresolved: &'a PendingTool,
    ) -> Option<(&'a DurableFunction, &'a serde_json::Value, &'a str)> {
        let run = self.machine.present.function.as_ref()?;
        let called = &run.input;
        let (function, revision, input, step_id) = match self
            .machine
            .nested_call_of(&unresolved.tool)
        {
            Some((nested, step_id)) => (&nested.function, nested.revision, &nested.input, step_id),
            None => (
                &called.function,
                run.active_revision,
                &called.input,
                unresolved.tool.as_str(),
            ),
        };
        let function = self.env.functions.get(function, revision)?;
        Some((function, input, step_id))
    }

    /// The planted bug `rerun_confirmed` (storage's `planted.rs`): a claimed attempt runs the
    /// newest confirmed tool effect once more, as a recovery that trusts no receipt would.
    pub(super) fn planted_rerun(&mut self, ctx: &mut Context<Self>) {
        let Ok(events) = self
            .env
            .store
            .events_after(self.execution_id, 0, usize::MAX)
        else {
            return;
        };
        let confirmed = events
            .iter()
            .rev()
            .find_map(|envelope| match &envelope.event {
                Event::ToolFinished {
                    effect_id,
                    status: ReceiptStatus::Confirmed,
                    ..
                } => Some(*effect_id),
                _ => None,
            });
        let dispatched = events.iter().find_map(|envelope| match &envelope.event {
            Event::ToolDispatched {
                effect_id,
                tool,
                args,
            } if Some(*effect_id) == confirmed => Some((*effect_id, tool.clone(), args.clone())),
            _ => None,
        });
        let Some((effect_id, tool, args)) = dispatched else {
            return;
        };
        let (Some(tool), Ok(args)) = (self.env.tools.get(&tool), args.parse()) else {
            return;
        };
        let call = self.tool_call(
            effect_id,
            args,
            crate::call::CallHandle::detached(effect_id),
        );
        ctx.spawn(fut::wrap_future::<_, Self>(tool.call(call)).map(|_, _, _| ()));
    }
}

/// The command a reconcile protocol's answer becomes: the same path an operator's
/// `reconcile` takes (K-1), under a fixed id per effect and round (the seq of its `Unknown`
/// receipt), so each round is decided once however often the protocol is asked.
fn reconcile_command(
    act: &ExecutionActor,
    effect_id: openprogram_storage::EffectId,
    round: u64,
    status: ReceiptStatus,
    output: String,
) -> ApplyCommand {
    let command_id = derived_command_id(effect_id.as_uuid(), b"reconcile:", round);
    let command = Command::new(CommandBody::Reconcile {
        effect: EffectRef::Id(effect_id),
        outcome: match status {
            ReceiptStatus::Confirmed => ReconcileOutcome::Confirmed,
            _ => ReconcileOutcome::NotApplied,
        },
        text: output,
    })
    .with_id(command_id);
    ApplyCommand {
        accepted: command.accepted_record(act.execution_id),
        command,
    }
}

impl Handler<DecideInherited> for ExecutionActor {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, _: DecideInherited, ctx: &mut Context<Self>) -> Self::Result {
        if after_commit(ctx, DecideInherited).is_none() {
            return answer(());
        }
        self.handled += 1;
        if let Some(deciding) = self.decide_pending() {
            return AtomicResponse::new(deciding);
        }
        self.park_if_idle(ctx);
        answer(())
    }
}

/// Ask the tool's reconcile protocol about the unknown effect, if any. Sent by
/// startup recovery to executions found `reconciliation_required`: the attempt that
/// dispatched the effect is gone.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct ReconcileUnknown;

impl Handler<ReconcileUnknown> for ExecutionActor {
    type Result = ();

    fn handle(&mut self, _: ReconcileUnknown, ctx: &mut Context<Self>) {
        self.handled += 1;
        self.start_reconcile(ctx);
        self.park_if_idle(ctx);
    }
}

/// A reconcile protocol's definite answer, as the command it becomes.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct ReconcileAnswer(ApplyCommand);

impl Handler<ReconcileAnswer> for ExecutionActor {
    type Result = AtomicResponse<Self, ()>;

    fn handle(
        &mut self,
        ReconcileAnswer(command): ReconcileAnswer,
        _ctx: &mut Context<Self>,
    ) -> Self::Result {
        self.handled += 1;
        self.reconciling = false;
        AtomicResponse::new(Box::pin(self.after_inherited(command).map(
            |decided, act, ctx| {
                if let Err(error) = decided {
                    tracing::warn!(execution_id = %act.execution_id, %error, "the reconcile protocol's answer was not applied");
                }
                act.park_if_idle(ctx);
            },
        )))
    }
}

/// Orderly shutdown asks a running execution to pause at its next safe point. With an
/// effect in flight, the pause comes once the effect's result is committed.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct RestartPause;

impl Handler<RestartPause> for ExecutionActor {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, _: RestartPause, ctx: &mut Context<Self>) -> Self::Result {
        if after_commit(ctx, RestartPause).is_none() {
            return answer(());
        }
        let _span = self.enter();
        if let Some(paused) = self.restart_pause() {
            return AtomicResponse::new(paused);
        }
        // Not running (paused, waiting, finished): nothing to pause; let it go.
        self.park_if_idle(ctx);
        answer(())
    }
}
