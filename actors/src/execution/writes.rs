//! How the execution actor writes: every transition is the machine's plan, submitted as it
//! is; once acknowledged, its events are folded, counted, and its actions performed. A
//! transition that moves a parked execution claims an attempt in the same write.

use std::sync::atomic::Ordering;

use actix::prelude::*;
use openprogram_storage::{Event, EventEnvelope, ExecutionState as Status, Outcome, Upsert};

use crate::error::Error;
use crate::execution::actor::{committed_version, log_failure, Advance, ExecutionActor};
use crate::machine::plan::{Plan, Writer};
use crate::machine::{Action, Decision};

impl ExecutionActor {
    /// Submits the plan of the transition appending `events` and, once committed, applies
    /// them and performs the actions. Resolves to the storage outcome: `Committed`, or a
    /// command duplicate or conflict (nothing applied); a fenced or conflicting write stops
    /// the actor. `decision`: the model's decision they were decided from, folded with
    /// them; `session`: a write of the session's record in the same transition (W-7).
    pub(super) fn submit_planned(
        &mut self,
        events: Vec<Event>,
        upserts: Vec<Upsert>,
        decision: Option<Decision>,
        session: Option<openprogram_storage::SessionWrite>,
    ) -> ResponseActFuture<Self, Result<Outcome, Error>> {
        let writer = self
            .epoch
            .map_or(Writer::Unclaimed, |epoch| Writer::Attempt { epoch });
        let (tools, now_ms) = (&self.env.tools, self.env.clock.now_ms());
        let recovery = |tool: &str| tools.recovery(tool);
        let Plan {
            mut transition,
            after,
        } = self.machine.plan(
            &self.head, events, upserts, decision, writer, now_ms, recovery,
        );
        if session.is_some() {
            transition.session = session;
        }
        let parent = self
            .effect_started
            .as_ref()
            .map_or(&self.span, |step| &step.span);
        let commit = match parent.is_none() {
            true => tracing::Span::none(),
            false => tracing::info_span!(
                parent: parent,
                "commit",
                execution_id = %self.execution_id,
                attempt_id = %self.lease.attempt_id,
                events = transition.events.len(),
            ),
        };
        let submitted = tracing::Instrument::instrument(self.env.store.submit(transition), commit);
        Box::pin(fut::wrap_future::<_, Self>(submitted).map(
            move |outcome, act, ctx| match outcome {
                Ok(Outcome::Committed(mut committed)) => {
                    act.head = after.committed_head(&committed);
                    let events = std::mem::take(&mut committed.events);
                    let steps = act.count_steps(&events);
                    act.machine.apply_committed(&events, after.decision);
                    act.env.steps.fetch_add(steps, Ordering::Relaxed);
                    act.env
                        .commits
                        .publish(act.execution_id, || std::sync::Arc::new(events));
                    act.perform(after.actions, ctx);
                    Ok(Outcome::Committed(committed))
                }
                Ok(other) => act.outdated(other, ctx),
                Err(error) => Err(Error::Storage(error)),
            },
        ))
    }

    /// What a committed transition tells the runtime's counters: the steps it ends (a model
    /// decision or a tool result; a failed model call ends its step too, uncounted), the
    /// reconciliations, and the tokens its model calls used (E-6).
    fn count_steps(&mut self, events: &[EventEnvelope]) -> u64 {
        let mut steps = 0;
        for envelope in events {
            match envelope.event {
                Event::ModelDecided { .. }
                | Event::ToolFinished { .. }
                | Event::ModelFailed { .. } => {
                    steps += u64::from(!matches!(envelope.event, Event::ModelFailed { .. }));
                    if let Some(step) = self.effect_started.take() {
                        self.env.telemetry.step(step.kind, step.started.elapsed());
                    }
                }
                Event::ControlApplied {
                    control: openprogram_storage::Control::Reconcile { .. },
                    ..
                } => self.env.telemetry.reconciled(),
                Event::ModelUsage {
                    input_tokens,
                    output_tokens,
                    ..
                } => {
                    let [input, output] = &self.env.model_tokens;
                    input.fetch_add(input_tokens, Ordering::Relaxed);
                    output.fetch_add(output_tokens, Ordering::Relaxed);
                }
                _ => {}
            }
        }
        steps
    }

    /// A write refused because a newer attempt fenced this one or another writer moved the
    /// execution: this actor stops, and its caller gets the error. Any other outcome
    /// is the caller's.
    pub(super) fn outdated(
        &mut self,
        outcome: Outcome,
        ctx: &mut Context<Self>,
    ) -> Result<Outcome, Error> {
        let error = match outcome {
            Outcome::Fenced { current_epoch } => Error::Fenced { current_epoch },
            Outcome::VersionConflict { current } => Error::VersionConflict { current },
            other => return Ok(other),
        };
        tracing::warn!(execution_id = %self.execution_id, %error, "outdated; stopping");
        self.release(ctx);
        Err(error)
    }

    /// Claims this actor's attempt: from now on it writes with its lease's epoch (a
    /// failed commit of the claim must undo `epoch`). The event starts the attempt.
    pub(super) fn claim(&mut self) -> Event {
        self.epoch = Some(self.lease.epoch);
        self.lease.claim()
    }

    /// A transition that moves the head of an execution with no running attempt (parked,
    /// paused) claims one in the same transition: its `AttemptStarted` first. Only an attempt
    /// may move the head. Whether it claimed.
    pub(super) fn claim_in(&mut self, events: &mut Vec<Event>) -> bool {
        if self.epoch.is_some() {
            return false;
        }
        events.insert(0, self.claim());
        true
    }

    /// `submit_planned` for transitions that carry no command: anything but a commit is an
    /// error.
    pub(super) fn commit(
        &mut self,
        events: Vec<Event>,
        upserts: Vec<Upsert>,
    ) -> ResponseActFuture<Self, Result<u64, Error>> {
        Box::pin(
            self.submit_planned(events, upserts, None, None)
                .map(|outcome, _, _| committed_version(outcome)),
        )
    }

    /// Commits the execution's own progress; a failed write releases the actor.
    pub(super) fn progress(&mut self, events: Vec<Event>) -> ResponseActFuture<Self, ()> {
        Box::pin(self.commit(events, Vec::new()).map(log_failure))
    }

    /// `progress`, answering whether it committed.
    pub(super) fn progressed(&mut self, events: Vec<Event>) -> ResponseActFuture<Self, bool> {
        Box::pin(self.commit(events, Vec::new()).map(|result, act, ctx| {
            let committed = result.is_ok();
            log_failure(result, act, ctx);
            committed
        }))
    }

    /// Performs a committed plan's actions, in order.
    fn perform(&mut self, actions: Vec<Action>, ctx: &mut Context<Self>) {
        for action in actions {
            match action {
                Action::Advance => ctx.notify(Advance),
                Action::AbortEffect => {
                    // B12: the cancel is recorded, the effect in flight not yet told.
                    openprogram_storage::failpoint!("B12");
                    if let Some(in_flight) = &self.in_flight {
                        in_flight.abort();
                    }
                    self.cancel_called_function(ctx);
                }
                Action::Finished => {
                    // E-8: before the next turn of the branch can start.
                    self.remember_branch();
                    // C-2: the session is free before any optional work follows the turn.
                    self.wake_next_in_session();
                    self.follow_up();
                    if self.machine.status() == Status::Cancelled {
                        // F-6, K-5: also when the Cancel was decided by a later attempt.
                        self.cancel_called_function(ctx);
                    }
                    self.env.lifecycle.notify_finished(self.execution_id);
                    self.park_if_idle(ctx);
                }
                Action::Park => {
                    self.wake_next_in_session();
                    self.park_if_idle(ctx);
                }
                Action::Reconcile => self.start_reconcile(ctx),
                Action::LiveResolved { wait_id, outcome } => self.live_resolved(wait_id, outcome),
                Action::WatchDeadline { .. } => self
                    .env
                    .watch_deadline(self.execution_id, &self.machine.present),
                Action::UnwatchDeadline { wait_id } => self.env.unwatch_deadline(wait_id),
                Action::StopProcess { process_id } => self.stop_process(process_id, ctx),
                Action::Enqueue
                | Action::Dequeue
                | Action::ReleaseLease { .. }
                | Action::LeaseHeld => self.perform_job(&action, ctx),
                Action::RunDispatched => {
                    // B05: the intent (`ToolDispatched`) is durable, the tool not started.
                    openprogram_storage::failpoint!("B05");
                    let idle = self.in_flight.is_none();
                    let pending = self.machine.present.calls.pending_tool.clone();
                    if let Some(pending) = pending.filter(|_| idle) {
                        if let Some(done) = self.start_tool(pending, ctx) {
                            // Recorded before anything else is taken from the mailbox: a
                            // command that arrived during the dispatch's commit must not
                            // find the execution idle and drop a finished result.
                            ctx.wait(self.effect_done(done));
                        }
                    }
                }
            }
        }
    }
}
