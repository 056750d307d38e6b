//! The execution actors a runtime runs: the directory of live actors (with their lease),
//! activation on demand (the head and its events replayed, actions off) on the arbiter the
//! id shards to, and the takeover of lapsed attempts. Apart from `env.rs`: this starts
//! the actors, which reach it only through `env::Hooks`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use actix::prelude::*;
use openprogram_storage::{ExecutionHead, ExecutionId, ExecutionKind, ExecutionState, Outcome};

use crate::admission::{Admission, StartRequest};
use crate::attempt_lease::LeaseState;
use crate::command::{Command, CommandBody};
use crate::env::{ChildCall, Env, Hooks};
use crate::error::{Error, Result};
use crate::execution::actor::{Activate, ExecutionActor, Superseded};
use crate::execution::commands::ApplyCommand;
use crate::machine::plan::{Plan, Writer};
use crate::machine::{derived_command_id, FunctionInput, Machine};
use crate::mailbox::Mailbox;
use crate::process::ProcessProgress;
use crate::rebuild::project;
use futures::future::BoxFuture;
use futures::FutureExt as _;

/// Live execution actors by id, with their attempt's lease, and the arbiters they run on.
#[derive(Debug)]
pub struct Directory {
    arbiters: Vec<ArbiterHandle>,
    live: Mutex<HashMap<ExecutionId, Live>>,
    /// Notified whenever an actor leaves the directory (orderly shutdown waits on it).
    released: tokio::sync::Notify,
}

#[derive(Debug, Clone)]
struct Live {
    addr: Mailbox<ExecutionActor>,
    lease: Arc<LeaseState>,
    /// Which start of the execution's actor this is (`Executions::start_actor`).
    token: u64,
}

impl Directory {
    pub fn new(arbiters: Vec<ArbiterHandle>) -> Self {
        assert!(!arbiters.is_empty(), "a runtime needs at least one arbiter");
        Self {
            arbiters,
            live: Mutex::new(HashMap::new()),
            released: tokio::sync::Notify::new(),
        }
    }

    /// The live actors by id (a panic while held leaves the map as it was: it is used on).
    fn entries(&self) -> MutexGuard<'_, HashMap<ExecutionId, Live>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn live(&self, execution_id: ExecutionId) -> Option<Mailbox<ExecutionActor>> {
        let live = self.entries();
        live.get(&execution_id)
            .map(|entry| &entry.addr)
            .filter(|addr| addr.connected())
            .cloned()
    }

    pub fn live_len(&self) -> usize {
        self.entries().len()
    }

    /// Forgets an actor that released itself, unless a newer one took its place.
    pub fn forget(&self, execution_id: ExecutionId, token: u64) {
        let mut live = self.entries();
        if live.get(&execution_id).map(|live| live.token) == Some(token) {
            live.remove(&execution_id);
        }
        drop(live);
        self.released.notify_waiters();
    }

    /// Messages waiting in every live actor's mailbox.
    pub fn mailbox_messages(&self) -> u64 {
        self.entries()
            .values()
            .map(|entry| entry.addr.waiting())
            .sum()
    }

    /// Every live actor now.
    pub fn all(&self) -> Vec<Mailbox<ExecutionActor>> {
        let live = self.entries();
        live.values().map(|entry| entry.addr.clone()).collect()
    }

    /// Resolves once no actor is live, or at `deadline`; returns how many are still live.
    pub async fn drained(&self, deadline: tokio::time::Instant) -> usize {
        loop {
            let released = self.released.notified();
            let live = self.live_len();
            if live == 0 || tokio::time::Instant::now() >= deadline {
                return live;
            }
            // A release between the count and here is not missed: `notified()` was created
            // first, and `notify_waiters` wakes every future created before it.
            let _ = tokio::time::timeout_at(deadline, released).await;
        }
    }

    /// The arbiter an execution runs on: by the random bits of its id, so executions
    /// spread evenly and an execution's steps stay on one thread.
    /// `shift` moves a takeover to the next arbiter: the lapsed attempt's thread may be the
    /// one that is stuck.
    fn arbiter_of(&self, execution_id: ExecutionId, shift: usize) -> &ArbiterHandle {
        let bytes = execution_id.as_bytes();
        let mut tail = [0u8; 8];
        tail.copy_from_slice(&bytes[8..]);
        let shard = (u64::from_be_bytes(tail) % self.arbiters.len() as u64) as usize;
        &self.arbiters[(shard + shift) % self.arbiters.len()]
    }
}

/// The runtime's execution actors: the directory of live ones and how they start. Derefs
/// to the shared `Env` it runs them over.
#[derive(Debug)]
pub struct Executions {
    env: Arc<Env>,
    pub directory: Directory,
    /// Numbers each start of an actor, so a released actor forgets only its own entry.
    next_token: AtomicU64,
}

impl std::ops::Deref for Executions {
    type Target = Env;

    fn deref(&self) -> &Env {
        &self.env
    }
}

impl Hooks for Executions {
    fn released(&self, execution_id: ExecutionId, token: u64) {
        self.directory.forget(execution_id, token);
    }

    fn progress_to(
        &self,
        execution_id: ExecutionId,
    ) -> Result<crate::mailbox::CountedRecipient<ProcessProgress>> {
        Ok(self.activate(execution_id)?.recipient())
    }

    fn start_child(self: Arc<Self>, child: ChildCall) -> BoxFuture<'static, Result<()>> {
        async move { self.admit_child(child).await }.boxed()
    }

    fn cancel_child(self: Arc<Self>, child_id: ExecutionId) -> BoxFuture<'static, Result<()>> {
        async move { self.cancel_child_now(child_id).await }.boxed()
    }

    fn interrupt(
        self: Arc<Self>,
        holder: ExecutionId,
        holder_version: u64,
        by: ExecutionId,
    ) -> BoxFuture<'static, Result<()>> {
        async move {
            // After startup recovery has classified what it resumes, as for any command.
            self.lifecycle.until_recovered().await;
            let command_id = derived_command_id(by.as_uuid(), b"interrupts at ", holder_version);
            let command = Command::new(CommandBody::Pause).with_id(command_id);
            self.apply_here(holder, command).await
        }
        .boxed()
    }

    fn wake(&self, execution_id: ExecutionId) {
        let Some(addr) = self.woken(execution_id) else {
            return;
        };
        // The actor may be parking as the wake arrives (it looked a moment ago): if the
        // wake never reached it, a new activation looks again.
        let again = self.env.hooks_weak().and_then(|hooks| hooks.upgrade());
        actix::spawn(async move {
            if addr.send(crate::execution::actor::Advance).await.is_err() {
                if let Some(hooks) = again {
                    hooks.wake_once(execution_id);
                }
            }
        });
    }

    fn wake_once(&self, execution_id: ExecutionId) {
        if let Some(addr) = self.woken(execution_id) {
            addr.do_send(crate::execution::actor::Advance);
        }
    }
}

/// J-1: the resource queue offers leases and ends expired Jobs through their actors.
impl crate::resource_queue::JobHost for Executions {
    fn offer(
        self: Arc<Self>,
        offer: crate::resources::Offer,
    ) -> BoxFuture<'static, Result<Option<u64>>> {
        let grant = crate::execution::job_run::Grant {
            lease_id: offer.lease_id,
        };
        async move { self.ask(offer.job_id, grant).await }.boxed()
    }

    fn expire(self: Arc<Self>, job_id: ExecutionId) -> BoxFuture<'static, Result<bool>> {
        let expire = crate::execution::job_run::ExpireQueued;
        async move { self.ask(job_id, expire).await }.boxed()
    }
}

/// W-8: the deadlines actor expires waits through their actors, and reads every pending
/// deadline at startup.
impl crate::wait_deadlines::DeadlineHost for Executions {
    fn expire_wait(
        self: Arc<Self>,
        execution_id: ExecutionId,
        wait_id: openprogram_storage::WaitId,
    ) -> BoxFuture<'static, Result<bool>> {
        let expire = crate::execution::wait_expiry::ExpireWait { wait_id };
        async move { self.ask(execution_id, expire).await }.boxed()
    }

    fn pending_deadlines(
        self: Arc<Self>,
    ) -> BoxFuture<'static, Result<Vec<crate::wait_deadlines::Watch>>> {
        async move {
            let mut found = Vec::new();
            for execution_id in self.store.executions_in_state(ExecutionState::Waiting)? {
                let (_, machine) = match self.latest_state(execution_id, false) {
                    Ok(state) => state,
                    Err(error) => {
                        tracing::warn!(%execution_id, %error, "a waiting execution could not be read for its deadline");
                        continue;
                    }
                };
                let deadline = machine
                    .present.waits.pending_wait()
                    .and_then(|wait| Some((wait.wait_id, wait.deadline_ms?)));
                if let Some((wait_id, deadline_ms)) = deadline {
                    found.push(crate::wait_deadlines::Watch {
                        execution_id,
                        wait_id,
                        deadline_ms,
                    });
                }
            }
            Ok(found)
        }
        .boxed()
    }
}

impl Executions {
    /// F-6, K-5: a Cancel of the child of a cancelled caller's call, under one derived
    /// command id (asked again: the stored outcome, K-4).
    async fn cancel_child_now(&self, child_id: ExecutionId) -> Result<()> {
        let command_id = openprogram_storage::CommandId::from_uuid(uuid::Uuid::new_v5(
            child_id.as_uuid(),
            b"cancelled with its caller",
        ));
        let command = Command::new(CommandBody::Cancel).with_id(command_id);
        self.apply_here(child_id, command).await
    }

    /// A command the runtime itself sends to `execution_id`, applied by its actor here.
    async fn apply_here(&self, execution_id: ExecutionId, command: Command) -> Result<()> {
        let accepted = command.accepted_record(execution_id);
        let applied = self.ask(execution_id, ApplyCommand { accepted, command });
        applied.await.map(|_| ())
    }

    /// What the actor of `execution_id`, activated if need be, answers `message`.
    async fn ask<M, T>(&self, execution_id: ExecutionId, message: M) -> Result<T>
    where
        M: Message<Result = Result<T>> + Send + 'static,
        T: Send + 'static,
        ExecutionActor: Handler<M>,
    {
        let addr = self.activate(execution_id)?;
        addr.send(message)
            .await
            .map_err(|error| Error::Unavailable(error.to_string()))?
    }

    /// The actor of a turn waiting for its session, to wake; `None` (logged) if it cannot
    /// be activated.
    fn woken(&self, execution_id: ExecutionId) -> Option<Mailbox<ExecutionActor>> {
        self.activate(execution_id)
            .map_err(|error| tracing::warn!(%execution_id, %error, "a turn waiting for its session could not be woken"))
            .ok()
    }

    /// Whether the caller `parent` ended or is being cancelled (K-5).
    fn caller_cancelled(&self, parent: ExecutionId) -> Result<bool> {
        Ok(self.store.head(parent)?.is_some_and(|caller| {
            caller.state.is_terminal() || caller.state == ExecutionState::Cancelling
        }))
    }

    /// F-6: the child execution of an agent's call of a function: admitted (the newest
    /// registered revision, the runtime's policy) and started, unless the call made it
    /// before.
    async fn admit_child(&self, child: ChildCall) -> Result<()> {
        if self.store.head(child.child_id)?.is_some() {
            return Ok(());
        }
        // A caller cancelled meanwhile starts no function (K-5).
        if self.caller_cancelled(child.parent)? {
            return Err(Error::InvalidRequest(
                "the calling execution is cancelled".into(),
            ));
        }
        let function = self
            .functions
            .latest(&child.function)
            .ok_or_else(|| Error::UnknownFunction(child.function.clone()))?;
        function
            .check_input(&child.input)
            .map_err(Error::InvalidInput)?;
        let called = FunctionInput {
            function: child.function,
            revision: function.revision,
            input: child.input,
            policy: self.function_policy,
            identity: function.identity.clone(),
            called_by: Some(child.parent),
        };
        let request = StartRequest {
            message: serde_json::to_string(&called)
                .map_err(|error| Error::InvalidInput(error.to_string()))?,
            ..StartRequest::default()
        };
        let admission = Admission::new(
            child.child_id,
            child.session_id,
            self.contract.revision,
            request,
            ExecutionKind::Function,
        )?
        .with_parent(child.parent);
        match admission.commit(self.store.as_ref()).await {
            Ok((head, machine, _)) => {
                self.activate_admitted(head, machine)?;
                // The caller was cancelled while the child was admitted: its Cancel found
                // no child, so the child is cancelled now (K-5).
                if self.caller_cancelled(child.parent)? {
                    self.cancel_child_now(child.child_id).await?;
                }
                Ok(())
            }
            // Made meanwhile by the same call asked twice: the same child.
            Err(_) if self.store.head(child.child_id)?.is_some() => Ok(()),
            Err(error) => Err(error),
        }
    }
}

impl Executions {
    /// The executions of a runtime whose actors share `env` and run on `directory`'s
    /// arbiters; `env` is told how to reach them (`Env::set_hooks`).
    pub fn new(env: Arc<Env>, directory: Directory) -> Arc<Self> {
        let executions = Arc::new(Self {
            env,
            directory,
            next_token: AtomicU64::new(1),
        });
        let hooks: Weak<dyn Hooks> = Arc::downgrade(&executions) as Weak<Executions>;
        executions.env.set_hooks(hooks);
        executions
    }

    /// The shared state the actors hold.
    pub fn env(&self) -> &Arc<Env> {
        &self.env
    }

    /// The live actor of an execution, activating it if needed. A new actor first starts
    /// an attempt (`Activate`), before any message sent after this returns.
    pub fn activate(&self, execution_id: ExecutionId) -> Result<Mailbox<ExecutionActor>> {
        self.activate_from(execution_id, || self.latest_state(execution_id, true))
    }

    /// `activate` for an execution just admitted, from the head and machine its admission
    /// committed: nothing is read back. Should another activation have run it and released it
    /// in between, the new actor's first write meets a version conflict and it stops.
    pub fn activate_admitted(
        &self,
        head: ExecutionHead,
        machine: Machine,
    ) -> Result<Mailbox<ExecutionActor>> {
        self.activate_from(head.execution_id, move || Ok((head, machine)))
    }

    fn activate_from(
        &self,
        execution_id: ExecutionId,
        state: impl FnOnce() -> Result<(ExecutionHead, Machine)>,
    ) -> Result<Mailbox<ExecutionActor>> {
        if let Some(addr) = self.directory.live(execution_id) {
            return Ok(addr);
        }
        if self.lifecycle.is_stopping() {
            return Err(Error::Unavailable("the runtime is shutting down".into()));
        }
        // Replay outside the directory's lock; the lock is taken again to insert, and a
        // concurrent activation that won meanwhile is used instead.
        let started = std::time::Instant::now();
        let (head, machine) = state()?;
        // W-8: a pending deadline is watched whenever its execution wakes.
        self.watch_deadline(execution_id, &machine.present);
        let mut live = self.directory.entries();
        if let Some(entry) = live
            .get(&execution_id)
            .filter(|entry| entry.addr.connected())
        {
            return Ok(entry.addr.clone());
        }
        let lease = LeaseState::new(
            execution_id,
            self.owner,
            head.fencing_epoch + 1,
            self.lease_ttl,
        );
        let addr = self.start_actor(&mut live, head, machine, lease, false);
        addr.do_send(Activate);
        self.telemetry.activation(started.elapsed());
        Ok(addr)
    }

    /// Starts an execution's actor and enters it in the directory `live`, in place of any
    /// actor of an older attempt.
    fn start_actor(
        &self,
        live: &mut HashMap<ExecutionId, Live>,
        head: ExecutionHead,
        machine: Machine,
        lease: Arc<LeaseState>,
        claimed: bool,
    ) -> Mailbox<ExecutionActor> {
        let env = Arc::clone(&self.env);
        let execution_id = head.execution_id;
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        let arbiter = self
            .directory
            .arbiter_of(execution_id, usize::from(claimed));
        let actor_lease = Arc::clone(&lease);
        let addr = Mailbox::start_in(arbiter, move |mailbox| {
            ExecutionActor::new(env, head, machine, actor_lease, claimed, token, mailbox)
        });
        let entry = Live {
            addr: addr.clone(),
            lease,
            token,
        };
        live.insert(execution_id, entry);
        addr
    }

    /// Replaces every running attempt whose lease lapsed with a new attempt: the claim
    /// (a higher epoch) is committed first, so the old attempt's next write is fenced and its
    /// actor stops. Returns the executions taken over.
    pub async fn reclaim_lapsed(&self) -> Result<Vec<ExecutionId>> {
        let lapsed: Vec<(ExecutionId, Live)> = {
            let live = self.directory.entries();
            live.iter()
                .filter(|(_, entry)| entry.lease.lapsed())
                .map(|(id, entry)| (*id, entry.clone()))
                .collect()
        };
        let mut reclaimed = Vec::new();
        for (execution_id, old) in lapsed {
            let Some(head) = self.store.head(execution_id)? else {
                continue;
            };
            let runs = matches!(
                head.state,
                ExecutionState::Queued | ExecutionState::Running | ExecutionState::Cancelling
            );
            if head.fencing_epoch != old.lease.epoch || !old.lease.lapsed() {
                // The lapsed attempt never claimed, was taken over already, or started
                // afresh since the list was made.
                continue;
            }
            if !runs {
                // Idle (waiting, paused): nothing in flight to fence. Its heartbeat cannot
                // extend a lapsed lease, so it starts afresh here, and is not listed again.
                old.lease.renew();
                continue;
            }
            let epoch = head.fencing_epoch + 1;
            let lease = LeaseState::new(execution_id, self.owner, epoch, self.lease_ttl);
            // Live questions of the old attempt end with the claim (W-4): their records too.
            let mut machine = project(self.store.as_ref(), execution_id, head.last_seq)?;
            let Plan { transition, after } = machine.plan(
                &head,
                vec![lease.claim()],
                Vec::new(),
                None,
                Writer::Attempt { epoch },
                self.clock.now_ms(),
                |tool| self.tools.recovery(tool),
            );
            let mut committed = match self.store.submit(transition).await? {
                Outcome::Committed(committed) => committed,
                // The old attempt moved on, or another claim won: not lapsed after all.
                _ => continue,
            };
            machine.apply_committed(&std::mem::take(&mut committed.events), None);
            // J-2: a Job's old lease was released in the claim; it waits in line again.
            self.tell_queue(execution_id, &machine.present, &after.actions);
            let head = after.committed_head(&committed);
            tracing::warn!(%execution_id, epoch, "lapsed attempt replaced by a new one");
            self.start_claimed(head, machine, lease);
            // Once its thread runs again, the old actor stops: its calls waiting for an
            // answer are told, instead of waiting for a write that would be fenced. After
            // the new actor is in the directory, so the old one's release removes nothing.
            old.addr.do_send(Superseded);
            reclaimed.push(execution_id);
        }
        Ok(reclaimed)
    }

    /// Starts the actor of an attempt whose claim is committed (a takeover or a restart
    /// recovery): it runs at once. Replaces any actor of an older attempt in the directory,
    /// never a newer one: recovery claims everything before it starts any actor, and a wake
    /// may activate (and claim) one of them in between. That newer attempt keeps the
    /// execution; an actor of the older claim would run a stale state beside it, outside
    /// the directory, where no takeover reaches it once its lease lapses.
    pub fn start_claimed(&self, head: ExecutionHead, machine: Machine, lease: Arc<LeaseState>) {
        let mut live = self.directory.entries();
        let newer = live
            .get(&head.execution_id)
            .filter(|entry| entry.lease.epoch > lease.epoch && entry.addr.connected());
        if newer.is_none() {
            // The lease runs from now, not from its claim (recovery claims everything first).
            lease.renew();
            self.start_actor(&mut live, head, machine, lease, true);
        }
    }
}
