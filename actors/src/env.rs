//! What every actor of one runtime shares — what a step needs: the store, the provider, the
//! tools, this incarnation's owner id and contract; the states of executions that parked
//! last, and the registry of managed processes. The runtime's lifecycle (recovered,
//! stopping, callers waiting for executions to end) is `lifecycle.rs`'s. The live execution
//! actors and how they start are `directory.rs`'s, reached from here only through `Hooks`
//! (the actors hold this; that module starts them).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

use actix::prelude::*;
use futures::future::BoxFuture;
use futures::FutureExt as _;
use openprogram_storage::{
    EventStore, ExecutionHead, ExecutionId, ExecutionKind, OwnerId, ProcessId, RevisionId,
};

use crate::agent::{Provider, ToolRegistry};
use crate::error::{Error, Result};
use crate::function::FunctionRegistry;
use crate::lifecycle::Lifecycle;
use crate::machine::Contract;
use crate::machine::{Action, Machine, Present, Recovery};
use crate::process::{ProcessHost, ProcessProgress, Processes};
use crate::rebuild::{project, replay};
use crate::recovery::{Clock, RestartWindow};
use crate::resource_queue::ResourceQueue;
use crate::resources::Resources;

/// What the actors ask of the runtime's `Executions` (`directory.rs`), which starts them
/// and so cannot be imported by them.
pub trait Hooks: Send + Sync {
    /// An execution actor released itself (`token`: which start of it).
    fn released(&self, execution_id: ExecutionId, token: u64);
    /// The live actor of an execution a managed process reports to, activated if parked.
    fn progress_to(
        &self,
        execution_id: ExecutionId,
    ) -> Result<crate::mailbox::CountedRecipient<ProcessProgress>>;
    /// F-6: admits and starts `child` unless it exists already (a call asked again).
    fn start_child(self: Arc<Self>, child: ChildCall) -> BoxFuture<'static, Result<()>>;
    /// F-6: cancels the child execution of a cancelled agent's call (K-5: cancel wins),
    /// once: a repeat is the same command.
    fn cancel_child(self: Arc<Self>, child_id: ExecutionId) -> BoxFuture<'static, Result<()>>;
    /// C-2: the execution (a turn waiting for its session) looks again whether it may run:
    /// activated if parked (again, if the wake finds it parking).
    fn wake(&self, execution_id: ExecutionId);
    /// `wake`, once: no second try.
    fn wake_once(&self, execution_id: ExecutionId);
    /// C-2: `by`, an interrupting turn first in its session's line, asks the running turn
    /// `holder` (as it stood at `holder_version`) to pause at its next safe point: a Pause
    /// whose command id is derived from the three, so asking again at one version is the
    /// same command.
    fn interrupt(
        self: Arc<Self>,
        holder: ExecutionId,
        holder_version: u64,
        by: ExecutionId,
    ) -> BoxFuture<'static, Result<()>>;
}

/// F-6: a function an agent's call runs as a child execution.
#[derive(Debug, Clone)]
pub struct ChildCall {
    pub session_id: openprogram_storage::SessionId,
    pub parent: ExecutionId,
    /// Derived from the call's effect: the same call finds the same child.
    pub child_id: ExecutionId,
    pub function: String,
    pub input: serde_json::Value,
}

pub struct Env {
    pub store: Arc<dyn EventStore>,
    pub provider: Arc<dyn Provider>,
    pub tools: ToolRegistry,
    /// The durable functions' registered revisions (F-1).
    pub functions: Arc<FunctionRegistry>,
    /// F-3: the version policy of a function execution started without one.
    pub function_policy: openprogram_storage::VersionPolicy,
    /// C-2: one foreground turn per session (`RuntimeBuilder::one_turn_per_session`).
    pub one_turn_per_session: bool,
    /// The embedder's naming and compaction hooks.
    pub conversation_hooks: crate::conversation_hooks::ConversationHooks,
    /// W-4: who answers questions asked outside a managed execution (`None`: nobody).
    pub question_handler: Option<Arc<dyn crate::call::QuestionHandler>>,
    pub owner: OwnerId,
    /// How long an attempt keeps its lease without a heartbeat.
    pub lease_ttl: Duration,
    /// Wall clock for restart deadlines (injectable for tests, R12).
    pub clock: Arc<dyn Clock>,
    pub restart_window: RestartWindow,
    /// Recovered, stopping, and who waits for which execution to end.
    pub lifecycle: Lifecycle,
    /// This runtime's contract (K-2: provider, model, system text, tools); executions
    /// admitted under another one are not continued automatically.
    pub contract: Contract,
    /// Live managed processes (P-1).
    pub processes: Processes,
    /// The runtime's `Executions`, once they exist.
    hooks: OnceLock<Weak<dyn Hooks>>,
    /// Time between SIGTERM and SIGKILL when a process is stopped.
    pub process_stop_grace: Duration,
    /// Steps committed by this runtime's executions: model decisions and tool results.
    pub steps: std::sync::atomic::AtomicU64,
    /// E-6: tokens its executions' model calls used, as recorded: [input, output].
    pub model_tokens: [std::sync::atomic::AtomicU64; 2],
    /// E-3: streamed model output, to whoever watches an execution.
    pub deltas: Arc<crate::deltas::DeltaHub>,
    /// The events each actor commits, to whoever watches its execution.
    pub commits: Arc<crate::watchers::CommitHub>,
    /// Histograms of steps, activations and commands; rejections, reconciliations.
    pub telemetry: crate::telemetry::Telemetry,
    /// The states of the executions that parked last (`keep_parked`).
    parked: Mutex<std::collections::VecDeque<(ExecutionHead, Machine)>>,
    /// E-8: conversation branches read lately, for the next turn of each.
    pub branches: crate::context_read::BranchCache,
    /// States loaded by `latest_state`: [from a parked state, by a replay, from a projection].
    pub state_loads: [std::sync::atomic::AtomicU64; 3],
    /// J-1: the resources Jobs are admitted for, and the queue that leases them (once
    /// started).
    pub resources: Resources,
    queue: OnceLock<crate::mailbox::Mailbox<ResourceQueue>>,
    /// W-8: the actor that expires waits past their deadline (once started).
    deadlines: OnceLock<Addr<crate::wait_deadlines::WaitDeadlines>>,
    /// N-2: this runtime as a node of a shared store (`None`: the store's only runtime).
    pub node: Option<NodeIdentity>,
}

/// N-2: how a node is registered: its id (stable across its restarts) and the URL its HTTP
/// API listens on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeIdentity {
    pub node_id: String,
    pub url: String,
}

/// How many parked states `Env` keeps. An activation replays the execution's whole history,
/// one log record read per transition; a Continue soon after its Pause, or a command
/// reaching an execution that just finished, finds the state here instead. Few: a state
/// holds the execution's context, and parking exists to free memory.
const PARKED_STATES_MAX: usize = 64;

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Env")
            .field("owner", &self.owner)
            .field("tools", &self.tools)
            .finish()
    }
}

impl Env {
    /// The restart window recovery applies to `head`: unlimited for a turn waiting in its
    /// session's line (C-2: it ran nothing; resumed, it looks whether it may take its
    /// session), else its `own` (K-7), else the runtime's.
    pub fn restart_window_of(
        &self,
        head: &ExecutionHead,
        own: Option<RestartWindow>,
    ) -> RestartWindow {
        let in_line = head.state == openprogram_storage::ExecutionState::Queued
            && self
                .store
                .session(head.session_id)
                .ok()
                .flatten()
                .is_some_and(|session| session.waiting.contains(&head.execution_id));
        match in_line {
            true => RestartWindow::Unlimited,
            false => own.unwrap_or(self.restart_window),
        }
    }

    /// W-4: the handle of a call made outside its execution's attempt (a reconcile
    /// protocol): its questions go to the embedder's handler, if any.
    pub fn outside_call(
        &self,
        effect_id: openprogram_storage::EffectId,
    ) -> crate::call::CallHandle {
        crate::call::CallHandle::headless(effect_id, self.question_handler.clone())
    }

    /// C-2, F-6: whether an execution of `kind` is a foreground turn of its session: with
    /// one turn per session, an agent turn or a function a person started, never a Job nor
    /// a function an agent's call started (its caller holds the session).
    pub fn takes_session(&self, kind: ExecutionKind, job: bool, called_by_agent: bool) -> bool {
        let turn = match kind {
            ExecutionKind::AgentTurn => true,
            ExecutionKind::Function => !called_by_agent,
            ExecutionKind::Job => false,
        };
        self.one_turn_per_session && turn && !job
    }

    /// A runtime's shared state. Its contract is derived from the provider and the tools
    /// (`contract_of`).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Arc<dyn EventStore>,
        provider: Arc<dyn Provider>,
        tools: ToolRegistry,
        owner: OwnerId,
        lease_ttl: Duration,
        clock: Arc<dyn Clock>,
        restart_window: RestartWindow,
    ) -> Self {
        let contract = contract_of(provider.as_ref(), &tools);
        Self {
            store,
            provider,
            tools,
            functions: Arc::new(crate::function_builtin::builtin()),
            function_policy: openprogram_storage::VersionPolicy::KeepOriginal,
            one_turn_per_session: true,
            conversation_hooks: Default::default(),
            question_handler: None,
            owner,
            lease_ttl,
            clock,
            restart_window,
            lifecycle: Lifecycle::default(),
            contract,
            processes: Processes::default(),
            hooks: OnceLock::new(),
            process_stop_grace: crate::process::STOP_GRACE_DEFAULT,
            steps: std::sync::atomic::AtomicU64::new(0),
            model_tokens: Default::default(),
            deltas: Default::default(),
            commits: Default::default(),
            telemetry: Default::default(),
            parked: Mutex::default(),
            branches: Default::default(),
            state_loads: Default::default(),
            resources: Resources::default(),
            queue: OnceLock::new(),
            deadlines: OnceLock::new(),
            node: None,
        }
    }

    /// N-2: whether an attempt of `owner` may still be running: this incarnation's, or a
    /// node's whose lease holds in `nodes`. Any other owner's attempt is abandoned.
    pub fn owner_alive(&self, nodes: &openprogram_storage::Nodes, owner: OwnerId) -> bool {
        owner == self.owner || nodes.live_owner(owner).is_some()
    }

    /// J-1: the runtime's resource queue, once started (`set_queue`).
    pub fn queue(&self) -> Option<&crate::mailbox::Mailbox<ResourceQueue>> {
        self.queue.get()
    }

    /// J-1: tells the resource queue what a committed transition of `execution_id` changed
    /// (`actions` of its plan, `present` folded through it): the Job waits, left the queue,
    /// or released a lease. Every writer of a Job's transition calls this after the commit
    /// (the execution actor; a takeover of a lapsed attempt).
    pub fn tell_queue(&self, execution_id: ExecutionId, present: &Present, actions: &[Action]) {
        use crate::resource_queue::{Dequeue, Enqueue, Release};
        let Some(queue) = self.queue() else {
            return;
        };
        for action in actions {
            match action {
                Action::Enqueue => {
                    let Some(job) = present.queued_job() else {
                        continue;
                    };
                    let deadline_at_ms = job
                        .spec
                        .queue_deadline_ms
                        .filter(|_| job.admitted_at_ms.is_none())
                        .map(|deadline| job.spec.queued_at_ms.saturating_add(deadline));
                    queue.do_send(Enqueue {
                        job_id: execution_id,
                        resources: job.spec.resources.clone(),
                        deadline_at_ms,
                    });
                }
                Action::Dequeue => queue.do_send(Dequeue {
                    job_id: execution_id,
                }),
                Action::ReleaseLease { lease_id } => queue.do_send(Release {
                    job_id: execution_id,
                    lease_id: *lease_id,
                }),
                _ => {}
            }
        }
    }

    /// W-8: where the wait deadlines actor runs (once, at start).
    pub fn set_deadlines(&self, deadlines: Addr<crate::wait_deadlines::WaitDeadlines>) {
        let _ = self.deadlines.set(deadlines);
    }

    /// W-8: the deadlines actor, once started.
    pub fn deadlines(&self) -> Option<&Addr<crate::wait_deadlines::WaitDeadlines>> {
        self.deadlines.get()
    }

    /// W-8: the pending durable wait expires at its deadline, if it has one.
    pub fn watch_deadline(&self, execution_id: ExecutionId, present: &Present) {
        let open = present
            .waits
            .pending_wait()
            .filter(|wait| wait.status == openprogram_storage::WaitStatus::Open);
        let (Some(deadlines), Some(wait)) = (self.deadlines(), open) else {
            return;
        };
        if let Some(deadline_ms) = wait.deadline_ms {
            deadlines.do_send(crate::wait_deadlines::Watch {
                execution_id,
                wait_id: wait.wait_id,
                deadline_ms,
            });
        }
    }

    /// W-8: a wait with a deadline was resolved: its timer is not needed any more.
    pub fn unwatch_deadline(&self, wait_id: openprogram_storage::WaitId) {
        if let Some(deadlines) = self.deadlines() {
            deadlines.do_send(crate::wait_deadlines::Unwatch { wait_id });
        }
    }

    /// Tells the shared state where the resource queue runs (once, at start).
    pub fn set_queue(&self, queue: crate::mailbox::Mailbox<ResourceQueue>) {
        let _ = self.queue.set(queue);
    }

    /// Keeps the state of an execution whose actor parks (releases itself with nothing in
    /// flight): its head and machine as of its last committed transition.
    pub fn keep_parked(&self, head: ExecutionHead, machine: Machine) {
        let mut parked = self.parked.lock().unwrap_or_else(PoisonError::into_inner);
        parked.retain(|(kept, _)| kept.execution_id != head.execution_id);
        if parked.len() >= PARKED_STATES_MAX {
            parked.pop_front();
        }
        parked.push_back((head, machine));
    }

    /// An execution's latest state: its parked state if kept and nothing was committed for
    /// it since (the stored head has the same version), else a replay of its events.
    /// `take`: an activation takes the kept state; a read copies it.
    pub fn latest_state(
        &self,
        execution_id: ExecutionId,
        take: bool,
    ) -> Result<(ExecutionHead, Machine)> {
        let kept = {
            let mut parked = self.parked.lock().unwrap_or_else(PoisonError::into_inner);
            let at = parked
                .iter()
                .position(|(head, _)| head.execution_id == execution_id);
            match at {
                Some(at) if take => parked.remove(at),
                Some(at) => parked.get(at).cloned(),
                None => None,
            }
        };
        let stored = self.store.head(execution_id)?.ok_or(Error::NotFound)?;
        match kept {
            Some((head, machine))
                if (head.version, head.last_seq) == (stored.version, stored.last_seq) =>
            {
                self.state_loads[0].fetch_add(1, Ordering::Relaxed);
                debug_assert!(
                    replay(self.store.as_ref(), execution_id, u64::MAX)
                        .is_ok_and(|whole| machine.reads_as(&whole)
                            && (!machine.is_complete() || whole == machine)),
                    "a parked state is the state a replay rebuilds"
                );
                Ok((stored, machine))
            }
            _ => {
                let machine = project(self.store.as_ref(), execution_id, stored.last_seq)?;
                let from = if machine.is_complete() { 1 } else { 2 };
                self.state_loads[from].fetch_add(1, Ordering::Relaxed);
                Ok((stored, machine))
            }
        }
    }

    /// `latest_state` with the whole history (a Fork or Retry decides on it): a kept state
    /// if it is complete, else a replay.
    pub fn complete_state(&self, execution_id: ExecutionId) -> Result<(ExecutionHead, Machine)> {
        let (head, machine) = self.latest_state(execution_id, false)?;
        if machine.is_complete() {
            return Ok((head, machine));
        }
        let machine = replay(self.store.as_ref(), execution_id, head.last_seq)?;
        Ok((head, machine))
    }

    /// Tells the shared state how to reach the runtime's `Executions` (once, when they are
    /// made: `Executions::new`).
    pub fn set_hooks(&self, hooks: Weak<dyn Hooks>) {
        let _ = self.hooks.set(hooks);
    }

    /// How to reach the runtime's `Executions`, not upgraded.
    pub fn hooks_weak(&self) -> Option<Weak<dyn Hooks>> {
        self.hooks.get().cloned()
    }

    fn hooks(&self) -> Result<Arc<dyn Hooks>> {
        self.hooks
            .get()
            .and_then(Weak::upgrade)
            .ok_or_else(|| Error::Unavailable("the runtime's executions are gone".into()))
    }

    /// C-2: see `Hooks::wake`.
    pub fn wake(&self, execution_id: ExecutionId) {
        if let Ok(hooks) = self.hooks() {
            hooks.wake(execution_id);
        }
    }

    /// C-2: see `Hooks::interrupt`.
    pub fn interrupt(
        &self,
        holder: ExecutionId,
        holder_version: u64,
        by: ExecutionId,
    ) -> BoxFuture<'static, Result<()>> {
        self.ask_hooks(|hooks| hooks.interrupt(holder, holder_version, by))
    }

    /// F-6: cancels a called function's child execution (see `Hooks::cancel_child`).
    pub fn cancel_child(&self, child_id: ExecutionId) -> BoxFuture<'static, Result<()>> {
        self.ask_hooks(|hooks| hooks.cancel_child(child_id))
    }

    /// F-6: admits and starts a child execution (see `Hooks::start_child`).
    pub fn start_child(&self, child: ChildCall) -> BoxFuture<'static, Result<()>> {
        self.ask_hooks(|hooks| hooks.start_child(child))
    }

    /// What `ask` of the runtime's `Executions` answers, or that they are gone.
    fn ask_hooks(
        &self,
        ask: impl FnOnce(Arc<dyn Hooks>) -> BoxFuture<'static, Result<()>>,
    ) -> BoxFuture<'static, Result<()>> {
        match self.hooks() {
            Ok(hooks) => ask(hooks),
            Err(error) => futures::future::ready(Err(error)).boxed(),
        }
    }

    /// An execution actor released itself: its entry in the directory goes, unless a newer
    /// start of it took the place.
    pub fn released(&self, execution_id: ExecutionId, token: u64) {
        if let Ok(hooks) = self.hooks() {
            hooks.released(execution_id, token);
        }
    }
}

/// The contract a runtime runs (K-2, R-4): a name-based UUID over what decides what an
/// execution does — the provider's own account (`Provider::contract`: its API, model and
/// system text) and each tool's name, recovery, description and parameters, in name order —
/// and the revision builds before it derived from the tools' names and recovery alone. The
/// same contract gives the same revision on every start.
pub fn contract_of(provider: &dyn Provider, tools: &ToolRegistry) -> Contract {
    let revision = |text: &str| {
        RevisionId::from_uuid(uuid::Uuid::new_v5(
            &uuid::Uuid::NAMESPACE_OID,
            text.as_bytes(),
        ))
    };
    let mut legacy = String::from("openprogram-contract-v1");
    let mut current = format!("openprogram-contract-v2\nprovider:{}", provider.contract());
    for (spec, recovery) in tools.contract() {
        let recovery = match recovery {
            Recovery::Idempotent => "idempotent",
            Recovery::External => "external",
        };
        legacy.push_str(&format!("\n{}:{recovery}", spec.name));
        current.push_str(&format!(
            "\ntool:{}:{recovery}:{}:{}",
            spec.name, spec.description, spec.parameters
        ));
    }
    Contract {
        revision: revision(&current),
        legacy: revision(&legacy),
    }
}

/// A managed process's actor reaches its runtime through the shared state.
impl ProcessHost for Env {
    fn progress_to(
        &self,
        execution_id: ExecutionId,
    ) -> Result<crate::mailbox::CountedRecipient<ProcessProgress>> {
        self.hooks()?.progress_to(execution_id)
    }

    fn ended(&self, process_id: ProcessId) {
        self.processes.remove(process_id);
    }

    fn stop_grace(&self) -> Duration {
        self.process_stop_grace
    }
}
