//! The execution actor: a thin shell around the pure `Machine`. Every handler that commits
//! is an `AtomicResponse`, so the next message waits for the commit; it submits the
//! machine's plan as it is and, only after `Committed`, folds the events and performs the
//! plan's actions. Invariant: machine and head change only by events storage acknowledged;
//! a `Fenced` or `VersionConflict` answer stops the actor untouched.

use std::collections::HashMap;
use std::sync::Arc;

use actix::prelude::*;
use futures::channel::oneshot;
use futures::future::AbortHandle;
use openprogram_storage::{
    EffectId, ExecutionHead, ExecutionId, ExecutionState as Status, Outcome, WaitId,
};

use crate::attempt_lease::{AttemptLeaseActor, LeaseState, Release, Renew};
use crate::env::Env;
use crate::error::Error;
use crate::machine::{LiveOutcome, Machine, Next};
use crate::mailbox::Mailbox;
use crate::snapshot::Snapshot;
use openprogram_storage::planted::{planted, Bug};

pub struct ExecutionActor {
    pub(super) env: Arc<Env>,
    pub(super) execution_id: ExecutionId,
    /// The head as last committed.
    pub(super) head: ExecutionHead,
    pub(super) machine: Machine,
    /// The epoch this actor writes with, once its attempt has started.
    pub(super) epoch: Option<u64>,
    /// Aborts the effect the actor is waiting for.
    pub(super) in_flight: Option<AbortHandle>,
    /// The step in flight: when its effect started, which, and its span (a child
    /// of the attempt's); it ends at the commit of the effect's result.
    pub(super) effect_started: Option<Step>,
    /// The model call in flight and where its provider reports the tokens it used (E-6).
    pub(super) usage_meter: Option<(EffectId, crate::agent::UsageMeter)>,
    /// The lease of this actor's attempt, and the actor holding it once the attempt started.
    pub(super) lease: Arc<LeaseState>,
    pub(super) lease_actor: Option<Mailbox<AttemptLeaseActor>>,
    /// Messages handled, and those waiting in its mailbox, for the debug endpoint.
    pub(super) handled: u64,
    pub(super) mailbox: crate::mailbox::Depth,
    /// Every log line of this actor carries the execution and attempt (I-5).
    pub(super) span: tracing::Span,
    /// A progress write failed: waiters for this execution's end are told it stopped.
    pub(super) failed_write: bool,
    /// A tool's reconcile protocol is being asked about the unknown effect.
    pub(super) reconciling: bool,
    /// Commands an earlier attempt accepted and never decided, as found when this actor was
    /// loaded; decided before the next step. Commands this actor accepts itself are
    /// decided in the same mailbox turn and never appear here.
    pub(super) inherited_pending: Vec<openprogram_storage::CommandId>,
    /// Calls waiting for the outcome of their live question (W-4), by wait id.
    pub(super) live_askers: HashMap<WaitId, oneshot::Sender<LiveOutcome>>,
    /// Processes to record `lost` (a `stop_process` found no actor): the actor stays until
    /// they are recorded.
    pub(super) recording_lost: usize,
    /// C-2: a turn waiting for its session looked whether it may take it, and may not: it
    /// parks (the holder's end wakes it).
    pub(super) session_looked: bool,
    /// C-2 on a node of a shared store: the one timer of a turn waiting for its session
    /// that makes it look again (`take_session`).
    pub(super) session_poll: Option<SpawnHandle>,
    /// Which start of this execution's actor this is: its entry in the directory.
    token: u64,
    /// Runs of a durable function's body this actor started; the newest is the one in
    /// flight, if any (`function_run.rs`).
    pub(super) function_runs: u64,
    /// The run in flight stops at its boundaries (a Pause, a wait opened): once the body
    /// returns, its result is none.
    pub(super) suspending: bool,
    /// F-5: the steps the run in flight was told to run, and those it started.
    pub(super) run_steps: super::run_steps::RunSteps,
    /// E-8: the earlier turns of its branch, read at its first model request of this
    /// activation and kept within the context budget.
    pub(super) context: crate::context_read::TurnContext,
}

impl std::fmt::Debug for ExecutionActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecutionActor")
            .field("execution_id", &self.execution_id)
            .field("version", &self.head.version)
            .field("status", &self.machine.status())
            .finish()
    }
}

crate::mailbox::counted_mailbox!(ExecutionActor);

impl Actor for ExecutionActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        if self.epoch.is_some() {
            // Started for an attempt claimed already (a takeover): run.
            self.hold_lease(ctx);
            if planted(Bug::RerunConfirmed) {
                self.planted_rerun(ctx);
            }
            ctx.notify(Advance);
        }
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        if let Some(lease_actor) = self.lease_actor.take() {
            lease_actor.do_send(Release);
        }
        // E-7: its attempt ended (completed, failed, parked while paused or waiting, or
        // superseded): what the tools bound to it goes.
        if self.epoch.is_some() {
            self.env
                .tools
                .release(self.execution_id, self.lease.attempt_id);
        }
    }
}

/// A step in flight: its model call or tool call, then the commit of its result.
#[derive(Debug)]
pub(super) struct Step {
    pub(super) started: std::time::Instant,
    pub(super) kind: crate::telemetry::StepKind,
    pub(super) span: tracing::Span,
}

impl ExecutionActor {
    /// `claimed`: the lease's attempt is committed already; otherwise `Activate` claims it.
    pub fn new(
        env: Arc<Env>,
        head: ExecutionHead,
        machine: Machine,
        lease: Arc<LeaseState>,
        claimed: bool,
        token: u64,
        mailbox: crate::mailbox::Depth,
    ) -> Self {
        // I-5: the execution, then this actor's attempt of it; steps, calls and commits are
        // the attempt's children, and every span carries both ids.
        // An execution left out of the span sample makes none (`Span::none`), nor do its
        // steps and commits, whose parent it is.
        let span = match crate::telemetry::spans_sampled(head.execution_id) {
            true => {
                let execution = tracing::info_span!(
                    parent: None,
                    "execution",
                    execution_id = %head.execution_id,
                    attempt_id = %lease.attempt_id,
                );
                tracing::info_span!(
                    parent: &execution,
                    "attempt",
                    execution_id = %head.execution_id,
                    attempt_id = %lease.attempt_id,
                    epoch = lease.epoch,
                )
            }
            false => tracing::Span::none(),
        };
        let pending = machine.present.run.pending_commands.iter();
        let inherited_pending = pending.map(|(command_id, _)| *command_id).collect();
        Self {
            env,
            execution_id: head.execution_id,
            span,
            failed_write: false,
            reconciling: false,
            inherited_pending,
            head,
            machine,
            epoch: claimed.then_some(lease.epoch),
            in_flight: None,
            usage_meter: None,
            effect_started: None,
            lease,
            lease_actor: None,
            handled: 0,
            mailbox,
            live_askers: HashMap::new(),
            recording_lost: 0,
            session_looked: false,
            session_poll: None,
            token,
            function_runs: 0,
            suspending: false,
            run_steps: Default::default(),
            context: Default::default(),
        }
    }

    /// This actor's address, counting what it sends itself in its mailbox's depth.
    pub(super) fn own_mailbox(&self, ctx: &Context<Self>) -> Mailbox<Self> {
        Mailbox::new(ctx.address(), self.mailbox.clone())
    }

    /// Starts the lease actor of this attempt and renews it every third of its ttl while
    /// this actor's thread makes progress.
    pub(super) fn hold_lease(&mut self, ctx: &mut Context<Self>) {
        self.lease.renew();
        let lease = Arc::clone(&self.lease);
        let lease_actor = Mailbox::start_with(|mailbox| AttemptLeaseActor::new(lease, mailbox));
        self.lease_actor = Some(lease_actor);
        ctx.run_interval(self.lease.ttl / 3, |act, _ctx| {
            if let Some(lease_actor) = &act.lease_actor {
                lease_actor.do_send(Renew);
            }
        });
    }

    /// A finished or paused execution with nothing in flight releases its actor: its state
    /// is in storage, and a command or read reactivates it.
    pub(super) fn park_if_idle(&mut self, ctx: &mut Context<Self>) {
        let runs = self.runs()
            // C-2: a turn waiting for its session parks once it looked, but on a node of a
            // shared store it stays and looks again (`take_session`), unless stopping.
            && !(self.machine.present.waits_for_session()
                && self.session_looked
                && (self.env.node.is_none() || self.env.lifecycle.is_stopping()));
        // Commands inherited from a dead attempt are decided first (`DecideInherited`).
        let inherited = !self.inherited_pending.is_empty();
        let recording = self.recording_lost > 0;
        if self.in_flight.is_none() && !self.reconciling && !inherited && !runs && !recording {
            if !self.failed_write {
                self.env
                    .keep_parked(self.head.clone(), self.machine.clone());
            }
            self.release(ctx);
        }
    }

    /// Whether the execution has work for an attempt: it runs, or is being cancelled, and
    /// is no Job waiting for its lease.
    fn runs(&self) -> bool {
        matches!(
            self.machine.status(),
            Status::Queued | Status::Running | Status::Cancelling
        ) && !self.machine.present.in_queue()
    }

    pub(super) fn release(&mut self, ctx: &mut Context<Self>) {
        if self.failed_write {
            self.env.lifecycle.notify_stopped(self.execution_id);
        }
        self.env.released(self.execution_id, self.token);
        ctx.stop();
    }

    /// S-8: an actor activated from a projection (a partial machine) replays the whole
    /// history before its first step: a model request needs the context, a function's run
    /// its committed steps. False if the replay failed: the actor released itself.
    pub(super) fn complete_history(&mut self, ctx: &mut Context<Self>) -> bool {
        if self.machine.is_complete() {
            return true;
        }
        match crate::rebuild::replay(
            self.env.store.as_ref(),
            self.execution_id,
            self.head.last_seq,
        ) {
            Ok(whole) => {
                debug_assert!(
                    self.machine.reads_as(&whole),
                    "a partial machine reads as its history"
                );
                self.machine = whole;
                true
            }
            Err(error) => {
                log_failure(Err(error), self, ctx);
                false
            }
        }
    }

    /// A message handled: counted, and its work inside the attempt's span (I-5).
    pub(super) fn enter(&mut self) -> tracing::span::EnteredSpan {
        self.handled += 1;
        self.span.clone().entered()
    }
}

/// Start a new attempt and run. Sent once when the actor is activated.
#[derive(Debug, Message)]
#[rtype(result = "Result<u64, Error>")]
pub struct Activate;

impl Handler<Activate> for ExecutionActor {
    type Result = AtomicResponse<Self, Result<u64, Error>>;

    fn handle(&mut self, _: Activate, ctx: &mut Context<Self>) -> Self::Result {
        let _span = self.enter();
        if !self.inherited_pending.is_empty() {
            // After this, before any command sent after the activation.
            ctx.notify(DecideInherited);
        }
        if !self.runs() {
            // Nothing to run (paused, waiting, finished, a Job waiting for its lease): no
            // attempt until a control or a lease needs one.
            return answer(Ok(self.head.version));
        }
        let started = self.claim();
        let committed = self.commit(vec![started], Vec::new());
        AtomicResponse::new(Box::pin(committed.map(|committed, act, ctx| {
            if committed.is_ok() {
                act.hold_lease(ctx);
            }
            committed
        })))
    }
}

/// Decide the next command an earlier attempt accepted and never decided, or let the
/// actor go if there is none and nothing runs. Sent when an actor is activated; handled in
/// `restart.rs`.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(super) struct DecideInherited;

/// Take the next step, if the execution is running and idle.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub(crate) struct Advance;

impl Handler<Advance> for ExecutionActor {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, _: Advance, ctx: &mut Context<Self>) -> Self::Result {
        if after_commit(ctx, Advance).is_none() {
            return answer(());
        }
        let _span = self.enter();
        if self.in_flight.is_some() || self.epoch.is_none() || !self.complete_history(ctx) {
            return answer(());
        }
        if let Some(deciding) = self.decide_pending() {
            // A command accepted before a crash is decided before anything else.
            return AtomicResponse::new(deciding);
        }
        if let Some(paused) = self.restart_pause() {
            // Orderly shutdown: no new dispatch; pause here under the restart intent.
            return AtomicResponse::new(Box::pin(paused));
        }
        if self.machine.present.waits_for_session() {
            // C-2: a turn waiting for its session runs nothing until it takes it.
            return AtomicResponse::new(self.take_session());
        }
        // F-5: the steps a run ended before starting get their receipts first.
        let never_started = self.run_steps.take_never_started();
        if let Some(receipts) = self.machine.not_started(&never_started) {
            return AtomicResponse::new(self.progress(receipts));
        }
        let env = Arc::clone(&self.env);
        match self.machine.next(
            EffectId::new,
            |name| env.tools.recovery(name),
            env.clock.now_ms(),
        ) {
            Next::Persist(events) => return AtomicResponse::new(self.progress(events)),
            Next::CallModel { effect_id } => {
                if let Some(first) = self.before_model_call(ctx) {
                    return AtomicResponse::new(first);
                }
                if let Some(done) = self.start_model(effect_id, ctx) {
                    return AtomicResponse::new(self.effect_done(done));
                }
            }
            Next::RunTool(pending) => {
                if let Some(done) = self.start_tool(pending, ctx) {
                    return AtomicResponse::new(self.effect_done(done));
                }
            }
            Next::RunFunction => return AtomicResponse::new(self.start_function(ctx)),
            Next::Idle => {}
        }
        answer(())
    }
}

/// The version a submission that carries no command committed: anything but a commit is
/// an error.
pub(super) fn committed_version(outcome: Result<Outcome, Error>) -> Result<u64, Error> {
    match outcome? {
        Outcome::Committed(committed) => Ok(committed.version),
        other => Err(Error::Internal(format!("unexpected outcome {other:?}"))),
    }
}

/// A handler's answer that commits nothing.
pub(super) fn answer<T: 'static>(value: T) -> AtomicResponse<ExecutionActor, T> {
    AtomicResponse::new(Box::pin(fut::ready(value)))
}

/// actix may run a notified item right after a mailbox message started an atomic commit
/// (before that wait is merged): such a message is sent again, to be handled after the
/// commit, and `None` returned; never decide while another commit is pending.
pub(super) fn after_commit<M>(ctx: &mut Context<ExecutionActor>, message: M) -> Option<M>
where
    M: Message + Send + 'static,
    M::Result: Send,
    ExecutionActor: Handler<M>,
{
    if !ctx.waiting() {
        return Some(message);
    }
    ctx.notify(message);
    None
}

/// After a message that activated a parked execution (a command, a Job's offer, a
/// deadline), its actor is released again if nothing else keeps it.
pub(super) fn parked<T>(
    result: T,
    act: &mut ExecutionActor,
    ctx: &mut Context<ExecutionActor>,
) -> T {
    act.park_if_idle(ctx);
    result
}

/// A transition of the execution's own progress failed: the actor cannot tell what is on
/// disk any more, so it releases itself; the next activation starts from storage with a
/// new attempt (where a dispatched External effect reads as unknown, never re-run).
pub(super) fn log_failure(
    result: Result<u64, Error>,
    act: &mut ExecutionActor,
    ctx: &mut Context<ExecutionActor>,
) {
    if let Err(error) = result {
        tracing::error!(execution_id = %act.execution_id, %error, "a transition failed; releasing the actor");
        act.failed_write = true;
        act.release(ctx);
    }
}

/// What the execution actor says about itself, with its attempt-lease actor (if it holds a
/// running attempt) for the debug endpoint to ask in turn.
#[derive(Debug, Message)]
#[rtype(result = "(crate::describe::ActorSummary, Option<Mailbox<AttemptLeaseActor>>)")]
pub struct DescribeExecution;

impl Handler<DescribeExecution> for ExecutionActor {
    type Result = MessageResult<DescribeExecution>;

    fn handle(&mut self, _: DescribeExecution, _ctx: &mut Context<Self>) -> Self::Result {
        self.handled += 1;
        let summary = crate::describe::ActorSummary {
            kind: "execution",
            id: self.execution_id.to_string(),
            arbiter: crate::describe::arbiter_name(),
            handled: self.handled,
            mailbox_len: self.mailbox.get(),
            state: format!(
                "{} (version {}, epoch {}, {}{} live questions)",
                self.machine.status(),
                self.head.version,
                self.epoch
                    .map_or("no attempt".to_owned(), |epoch| epoch.to_string()),
                if self.in_flight.is_some() {
                    "an effect in flight, "
                } else {
                    ""
                },
                self.live_askers.len(),
            ),
        };
        MessageResult((summary, self.lease_actor.clone()))
    }
}

/// A newer attempt took over this one (its lease lapsed): stop, ending what waits on it.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Superseded;

impl Handler<Superseded> for ExecutionActor {
    type Result = ();

    fn handle(&mut self, _: Superseded, ctx: &mut Context<Self>) {
        self.handled += 1;
        if let Some(in_flight) = self.in_flight.take() {
            in_flight.abort();
        }
        for (_, asker) in std::mem::take(&mut self.live_askers) {
            let _ = asker.send(LiveOutcome::Invalidated);
        }
        self.release(ctx);
    }
}

/// The execution's current snapshot.
#[derive(Debug, Message)]
#[rtype(result = "Snapshot")]
pub struct GetSnapshot;

impl Handler<GetSnapshot> for ExecutionActor {
    type Result = MessageResult<GetSnapshot>;

    fn handle(&mut self, _: GetSnapshot, _ctx: &mut Context<Self>) -> Self::Result {
        self.handled += 1;
        MessageResult(Snapshot::of(&self.head, &self.machine, self.env.contract))
    }
}
