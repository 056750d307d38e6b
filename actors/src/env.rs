//! What every actor of one runtime shares: the store, the provider, the tools, this
//! incarnation's owner id, and the directory of live execution actors.
//!
//! The directory activates an execution on demand (loading its head and replaying its
//! events through the pure machine with actions off) on the arbiter its id shards to, and
//! forgets it when the actor releases itself (passivation).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use actix::prelude::*;
use openprogram_storage::{
    AttemptLease, Event, EventStore, ExecutionHead, ExecutionId, ExecutionState, Outcome, OwnerId,
    RestartIntent, RevisionId, Transition,
};

use crate::agent::{Provider, ToolRegistry};
use crate::attempt_lease::LeaseState;
use crate::error::{Error, Result};
use crate::execution::actor::{Activate, ExecutionActor, Superseded};
use crate::execution::machine::{Machine, Recovery};
use crate::execution::machine_waits::changed_wait_records;
use crate::recovery::{Clock, RestartWindow};

/// Told once an execution ends (`Ok`), or stops without ending (`Err`).
pub type FinishedWaiter = tokio::sync::oneshot::Sender<Result<()>>;

pub struct Env {
    pub store: Arc<dyn EventStore>,
    pub provider: Arc<dyn Provider>,
    pub tools: ToolRegistry,
    pub owner: OwnerId,
    pub directory: Directory,
    /// How long an attempt keeps its lease without a heartbeat.
    pub lease_ttl: Duration,
    /// Callers waiting for executions to end (`Env::wait_finished`).
    pub finished_waiters: Mutex<HashMap<ExecutionId, Vec<FinishedWaiter>>>,
    /// Wall clock for restart deadlines (injectable for tests, R12).
    pub clock: Arc<dyn Clock>,
    pub restart_window: RestartWindow,
    /// This runtime's contract (tools and their recovery); executions admitted under another
    /// one are not continued automatically.
    pub revision: RevisionId,
    /// Orderly shutdown began: no new activation or dispatch; the intent running
    /// executions record as they pause.
    stopping: Mutex<Option<RestartIntent>>,
    stopping_flag: AtomicBool,
    /// Startup recovery finished (`true`); commands wait for it, so they never race its
    /// claims with an activation of their own.
    recovered: tokio::sync::watch::Sender<bool>,
    /// Live managed processes (P-1).
    pub processes: crate::process::Processes,
    /// Time between SIGTERM and SIGKILL when a process is stopped.
    pub process_stop_grace: Duration,
    /// Steps committed by this runtime's executions: model decisions and tool results.
    pub steps: std::sync::atomic::AtomicU64,
    /// The states of the executions that parked last (`keep_parked`).
    parked: Mutex<std::collections::VecDeque<(ExecutionHead, Machine)>>,
    /// States loaded by `latest_state`: [from a parked state, by a replay].
    pub state_loads: [std::sync::atomic::AtomicU64; 2],
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
    addr: Addr<ExecutionActor>,
    lease: Arc<LeaseState>,
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

    pub fn live(&self, execution_id: ExecutionId) -> Option<Addr<ExecutionActor>> {
        let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        live.get(&execution_id)
            .map(|entry| &entry.addr)
            .filter(|addr| addr.connected())
            .cloned()
    }

    pub fn live_len(&self) -> usize {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Forgets an actor that released itself, unless a newer one took its place.
    pub fn forget(&self, execution_id: ExecutionId, addr: &Addr<ExecutionActor>) {
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        if live.get(&execution_id).map(|live| &live.addr) == Some(addr) {
            live.remove(&execution_id);
        }
        drop(live);
        self.released.notify_waiters();
    }

    /// Every live actor now.
    pub fn all(&self) -> Vec<Addr<ExecutionActor>> {
        let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
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

/// Rebuilds an execution's machine from its events (recovery: actions are dropped).
pub fn load(store: &dyn EventStore, execution_id: ExecutionId) -> Result<(ExecutionHead, Machine)> {
    let head = store.head(execution_id)?.ok_or(Error::NotFound)?;
    let machine = replay(store, execution_id, u64::MAX)?;
    Ok((head, machine))
}

/// Rebuilds an execution's machine from its events up to `through_seq` (a head's
/// `last_seq`: exactly the state that head describes), without reading the head again.
/// Seqs run gap-free from 1, so those are the first `through_seq` events.
pub fn replay(
    store: &dyn EventStore,
    execution_id: ExecutionId,
    through_seq: u64,
) -> Result<Machine> {
    let mut machine = Machine::default();
    let mut ignored = Vec::new();
    let limit = usize::try_from(through_seq).unwrap_or(usize::MAX);
    for envelope in store.events_after(execution_id, 0, limit)? {
        machine.apply(&envelope.event, envelope.seq, &mut ignored);
        ignored.clear();
    }
    Ok(machine)
}

impl Env {
    /// A runtime's shared state. `revision` is derived from the tools (`contract_revision`).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Arc<dyn EventStore>,
        provider: Arc<dyn Provider>,
        tools: ToolRegistry,
        owner: OwnerId,
        directory: Directory,
        lease_ttl: Duration,
        clock: Arc<dyn Clock>,
        restart_window: RestartWindow,
    ) -> Self {
        let revision = contract_revision(&tools);
        Self {
            store,
            provider,
            tools,
            owner,
            directory,
            lease_ttl,
            finished_waiters: Mutex::new(HashMap::new()),
            clock,
            restart_window,
            revision,
            stopping: Mutex::new(None),
            stopping_flag: AtomicBool::new(false),
            recovered: tokio::sync::watch::Sender::new(false),
            processes: crate::process::Processes::default(),
            process_stop_grace: crate::process::STOP_GRACE_DEFAULT,
            steps: std::sync::atomic::AtomicU64::new(0),
            parked: Mutex::default(),
            state_loads: Default::default(),
        }
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
                debug_assert_eq!(
                    replay(self.store.as_ref(), execution_id, u64::MAX).ok(),
                    Some(machine.clone()),
                    "a parked state is the state a replay rebuilds"
                );
                Ok((stored, machine))
            }
            _ => {
                self.state_loads[1].fetch_add(1, Ordering::Relaxed);
                Ok((stored, replay(self.store.as_ref(), execution_id, u64::MAX)?))
            }
        }
    }

    /// Called by the supervisor once startup recovery is over (done or failed).
    pub fn mark_recovered(&self) {
        self.recovered.send_replace(true);
    }

    /// Resolves once startup recovery is over.
    pub async fn until_recovered(&self) {
        let mut recovered = self.recovered.subscribe();
        // Fails only if the sender is gone, which it never is while `self` lives.
        let _ = recovered.wait_for(|done| *done).await;
    }

    /// Orderly shutdown began: no new activation, and running executions pause under
    /// `intent` at their next safe point.
    pub fn begin_stopping(&self, intent: RestartIntent) {
        *self.stopping.lock().unwrap_or_else(PoisonError::into_inner) = Some(intent);
        self.stopping_flag.store(true, Ordering::SeqCst);
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping_flag.load(Ordering::SeqCst)
    }

    /// The restart intent of an orderly shutdown in progress.
    pub fn stopping_intent(&self) -> Option<RestartIntent> {
        if !self.is_stopping() {
            return None;
        }
        self.stopping
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Resolves once the execution is in a terminal state (completed, failed, cancelled).
    /// Registers before it looks, so an execution ending in between is not missed. Fails if
    /// the execution's actor stopped after a failed write, or the runtime stops.
    pub async fn wait_finished(&self, execution_id: ExecutionId) -> Result<()> {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        self.waiters_for(execution_id, |waiters| waiters.push(sender));
        let ended = match self.store.head(execution_id) {
            Ok(Some(head)) if head.state.is_terminal() => Some(Ok(())),
            Ok(Some(_)) => None,
            Ok(None) => Some(Err(Error::NotFound)),
            Err(error) => Some(Err(error.into())),
        };
        if let Some(ended) = ended {
            drop(receiver);
            self.waiters_for(execution_id, |_| {});
            return ended;
        }
        receiver
            .await
            .map_err(|_| Error::Unavailable("the runtime stopped".into()))?
    }

    /// Runs `change` on the waiters of an execution, dropping those nobody waits on any more.
    fn waiters_for(
        &self,
        execution_id: ExecutionId,
        change: impl FnOnce(&mut Vec<FinishedWaiter>),
    ) {
        let mut all = self
            .finished_waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let waiters = all.entry(execution_id).or_default();
        change(waiters);
        waiters.retain(|waiter| !waiter.is_closed());
        if waiters.is_empty() {
            all.remove(&execution_id);
        }
    }

    /// Called by an execution actor once its terminal state is committed.
    pub fn notify_finished(&self, execution_id: ExecutionId) {
        self.notify_waiters(execution_id, || Ok(()));
    }

    /// Called by an execution actor that stopped after a failed write: it will not end by
    /// itself.
    pub fn notify_stopped(&self, execution_id: ExecutionId) {
        self.notify_waiters(execution_id, || {
            Err(Error::Unavailable(
                "the execution stopped after a failed write".into(),
            ))
        });
    }

    fn notify_waiters(&self, execution_id: ExecutionId, outcome: impl Fn() -> Result<()>) {
        let waiters = self
            .finished_waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&execution_id);
        for waiter in waiters.into_iter().flatten() {
            let _ = waiter.send(outcome());
        }
    }

    /// Fails every waiter: the runtime is stopping.
    pub fn drop_waiters(&self) {
        self.finished_waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// The live actor of an execution, activating it if needed. A new actor first starts
    /// an attempt (`Activate`), before any message sent after this returns.
    pub fn activate(self: &Arc<Self>, execution_id: ExecutionId) -> Result<Addr<ExecutionActor>> {
        self.activate_from(execution_id, || self.latest_state(execution_id, true))
    }

    /// `activate` for an execution just admitted, from the head and machine its admission
    /// committed: nothing is read back. Should another activation have run it and released it
    /// in between, the new actor's first write meets a version conflict and it stops.
    pub fn activate_admitted(
        self: &Arc<Self>,
        head: ExecutionHead,
        machine: Machine,
    ) -> Result<Addr<ExecutionActor>> {
        self.activate_from(head.execution_id, move || Ok((head, machine)))
    }

    fn activate_from(
        self: &Arc<Self>,
        execution_id: ExecutionId,
        state: impl FnOnce() -> Result<(ExecutionHead, Machine)>,
    ) -> Result<Addr<ExecutionActor>> {
        if let Some(addr) = self.directory.live(execution_id) {
            return Ok(addr);
        }
        if self.is_stopping() {
            return Err(Error::Unavailable("the runtime is shutting down".into()));
        }
        // Replay outside the directory's lock; the lock is taken again to insert, and a
        // concurrent activation that won meanwhile is used instead.
        let (head, machine) = state()?;
        let mut live = self
            .directory
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
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
        let addr = self.start_actor(head, machine, Arc::clone(&lease), false);
        addr.do_send(Activate);
        live.insert(
            execution_id,
            Live {
                addr: addr.clone(),
                lease,
            },
        );
        Ok(addr)
    }

    fn start_actor(
        self: &Arc<Self>,
        head: ExecutionHead,
        machine: Machine,
        lease: Arc<LeaseState>,
        claimed: bool,
    ) -> Addr<ExecutionActor> {
        let env = Arc::clone(self);
        let arbiter = self
            .directory
            .arbiter_of(head.execution_id, usize::from(claimed));
        ExecutionActor::start_in_arbiter(arbiter, move |_| {
            ExecutionActor::new(env, head, machine, lease, claimed)
        })
    }

    /// Replaces every running attempt whose lease lapsed with a new attempt: the claim
    /// (a higher epoch) is committed first, so the old attempt's next write is fenced and its
    /// actor stops. Returns the executions taken over.
    pub async fn reclaim_lapsed(self: &Arc<Self>) -> Result<Vec<ExecutionId>> {
        let lapsed: Vec<(ExecutionId, Live)> = {
            let live = self
                .directory
                .live
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            live.iter()
                .filter(|(_, entry)| entry.lease.lapsed())
                .map(|(id, entry)| (*id, entry.clone()))
                .collect()
        };
        let mut reclaimed = Vec::new();
        for (execution_id, old) in lapsed {
            let Some(mut head) = self.store.head(execution_id)? else {
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
            let claim = Event::AttemptStarted {
                attempt_id: lease.attempt_id,
                owner_id: self.owner,
                epoch,
            };
            head.attempt = Some(AttemptLease {
                attempt_id: lease.attempt_id,
                owner_id: self.owner,
                epoch,
            });
            // Live questions of the old attempt end with the claim (W-4): their records too.
            let (_, before) = load(self.store.as_ref(), execution_id)?;
            let (before, mut after) = (before.preview(), before.preview());
            after.apply(&claim, head.last_seq + 1, &mut Vec::new());
            let mut transition = Transition::new(execution_id, vec![claim])
                .expect_version(head.version)
                .by_epoch(epoch)
                .with_head(head);
            transition.upserts.extend(
                changed_wait_records(&before, &after, execution_id)
                    .into_iter()
                    .map(openprogram_storage::Upsert::Wait),
            );
            match self.store.submit(transition).await? {
                Outcome::Committed(_) => {}
                // The old attempt moved on, or another claim won: not lapsed after all.
                _ => continue,
            }
            tracing::warn!(%execution_id, epoch, "lapsed attempt replaced by a new one");
            let (head, machine) = load(self.store.as_ref(), execution_id)?;
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
    /// recovery): it runs at once. Replaces any actor of an older attempt in the directory.
    pub fn start_claimed(
        self: &Arc<Self>,
        head: ExecutionHead,
        machine: Machine,
        lease: Arc<LeaseState>,
    ) -> Addr<ExecutionActor> {
        let execution_id = head.execution_id;
        // The lease runs from now, not from its claim (recovery claims everything first).
        lease.renew();
        let addr = self.start_actor(head, machine, Arc::clone(&lease), true);
        let mut live = self
            .directory
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        live.insert(
            execution_id,
            Live {
                addr: addr.clone(),
                lease,
            },
        );
        addr
    }
}

/// The revision of a runtime contract (R-4, E-7): a name-based UUID over its tools and how
/// each recovers, in name order. The same tools give the same revision on every start.
pub fn contract_revision(tools: &ToolRegistry) -> RevisionId {
    let mut contract = String::from("openprogram-contract-v1");
    for (name, recovery) in tools.contract() {
        let recovery = match recovery {
            Recovery::Idempotent => "idempotent",
            Recovery::External => "external",
        };
        contract.push_str(&format!("\n{name}:{recovery}"));
    }
    RevisionId::from_uuid(uuid::Uuid::new_v5(
        &uuid::Uuid::NAMESPACE_OID,
        contract.as_bytes(),
    ))
}
