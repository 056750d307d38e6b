//! The supervisor actor (R-1..R-8, A-1..A-3): at startup it classifies every non-terminal
//! execution (the index, never the whole log, S-6) and acts on each with one claim
//! (`execution/recovery_claim.rs`); it takes over lapsed attempts and runs the shutdown. A
//! resumed attempt is an ordinary execution actor: no second scheduler or path.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures::StreamExt;
use openprogram_storage::{
    ExecutionHead, ExecutionId, ExecutionState, Outcome, ProcessId, ProcessState, RestartIntent,
    Transition, Upsert,
};

use crate::directory::Executions;
use crate::env::Env;
use crate::error::{Error, Result};
use crate::execution::recovery_claim::{act_on, Done, Resumed};
use crate::execution::restart::{ReconcileUnknown, RestartPause};
use crate::machine::process_changed;
use crate::recovery::{classify, Plan};

/// Claims in flight at once during startup: enough to fill the committer's groups.
const CLAIMS_IN_FLIGHT: usize = 512;

/// Rounds of restart-pause requests during an orderly shutdown (R-7: a racing version is
/// retried at most 3 times).
const PAUSE_ROUNDS: usize = 3;

/// What startup recovery found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Executions read from the non-terminal index.
    pub classified: usize,
    pub resumed: Vec<ExecutionId>,
    pub expired: Vec<ExecutionId>,
    pub held: Vec<(ExecutionId, &'static str)>,
    /// Executions whose unknown effect was handed to its tool's reconcile protocol.
    pub reconciling: Vec<ExecutionId>,
    /// Claimed meanwhile by someone else (a command's activation): nothing to do.
    pub skipped: usize,
    /// Processes a dead incarnation left running, now recorded `lost` (P-3). Never
    /// signalled: a saved pid is not proof of identity.
    pub lost_processes: Vec<ProcessId>,
    pub elapsed: Duration,
}

/// What an orderly shutdown did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Live executions when it began.
    pub live: usize,
    /// Still live at the deadline (an effect that did not finish): left running in storage,
    /// so the next start treats them as abandoned.
    pub left_running: usize,
    pub elapsed: Duration,
    /// The store the runtime opened could not be closed cleanly (why); it was let go anyway.
    pub store_close_error: Option<String>,
}

/// The supervisor actor. One per runtime.
#[derive(Debug)]
pub struct Supervisor {
    env: Arc<Executions>,
    handled: u64,
    mailbox: crate::mailbox::Depth,
    /// N-2: a takeover round is running (rounds never overlap).
    taking_over: bool,
}

impl Supervisor {
    pub fn new(env: Arc<Executions>, mailbox: crate::mailbox::Depth) -> Self {
        Self {
            env,
            handled: 0,
            mailbox,
            taking_over: false,
        }
    }
}

/// N-2: registers this node or renews its lease (blocks for one round trip): the lease as
/// renewed, `None` for a runtime that is no node.
pub fn renew_node(env: &Env) -> Result<Option<openprogram_storage::NodeRecord>> {
    let renewed = env.node.as_ref().map(|node| {
        env.store
            .renew_node(&node.node_id, &node.url, env.lease_ttl)
    });
    Ok(renewed.transpose()?)
}

/// N-2: renews this node's lease three times a ttl on a thread of its own (never starved by
/// the actors' work or a takeover round) until the runtime is gone or halted. A renewal after
/// the previous lease ran out (by the database's clock) means the others may have taken its
/// executions over while its old attempts' effects may still be in flight: the node has lost
/// its lease and must stop. So has a node whose id a later incarnation registered.
pub fn keep_node_lease(env: std::sync::Weak<Env>) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("openprogram-node-lease".into())
        .spawn(move || {
            let mut expires_at_ms: Option<u64> = None;
            loop {
                let Some(env) = env.upgrade() else { return };
                let every = (env.lease_ttl / 3).max(Duration::from_millis(10));
                // Renewed through an orderly shutdown too: its pauses are this node's
                // writes, and a survivor taking over meanwhile would fence them.
                if env.lifecycle.is_halted() {
                    return;
                }
                // Every third of a ttl from the start of one renewal to the next: a slow
                // renewal shortens the wait, it does not add to the period.
                let started = std::time::Instant::now();
                match renew_node(&env) {
                    Ok(Some(node)) => {
                        let renewed_at = node
                            .lease_expires_at_ms
                            .saturating_sub(env.lease_ttl.as_millis() as u64);
                        if let Some(expired) =
                            expires_at_ms.filter(|expired| renewed_at >= *expired)
                        {
                            env.lifecycle.lose_lease(format!(
                                "this node's lease lapsed {} ms before it was renewed",
                                renewed_at - expired
                            ));
                        }
                        expires_at_ms = Some(node.lease_expires_at_ms);
                    }
                    Ok(None) => return,
                    Err(Error::Storage(openprogram_storage::Error::NodeSuperseded(id))) => env
                        .lifecycle
                        .lose_lease(format!("a later incarnation registered as node {id}")),
                    Err(error) => tracing::error!(%error, "renewing this node's lease failed"),
                }
                drop(env);
                std::thread::sleep(every.saturating_sub(started.elapsed()));
            }
        })
        .map(|_| ())
}

crate::mailbox::counted_mailbox!(Supervisor);

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Attempts whose worker stopped making progress are taken over.
        let every = (self.env.lease_ttl / 2).max(Duration::from_millis(10));
        ctx.run_interval(every, |act, ctx| {
            if act.env.lifecycle.is_stopping() {
                return;
            }
            let env = Arc::clone(&act.env);
            ctx.spawn(fut::wrap_future(async move {
                if let Err(error) = env.reclaim_lapsed().await {
                    tracing::error!(%error, "reclaiming lapsed attempts failed");
                }
            }));
        });
        // N-2: a node takes over the executions of nodes whose lease lapsed, three times a
        // ttl (its own lease is renewed by `keep_node_lease`'s thread).
        if self.env.node.is_some() {
            let every = (self.env.lease_ttl / 3).max(Duration::from_millis(10));
            ctx.run_interval(every, |act, ctx| {
                let lifecycle = &act.env.lifecycle;
                if lifecycle.is_stopping() || act.taking_over || !lifecycle.is_recovered() {
                    return;
                }
                act.taking_over = true;
                let env = Arc::clone(&act.env);
                let round = async move { recover_where(&env, Scope::LapsedOwners).await };
                ctx.spawn(
                    fut::wrap_future(round).map(|report, act: &mut Supervisor, _| {
                        act.taking_over = false;
                        match report {
                            Ok(report) if report.classified > 0 => {
                                tracing::warn!(?report, "took over executions of lapsed nodes")
                            }
                            Ok(_) => {}
                            Err(error) => {
                                tracing::error!(%error, "taking over lapsed nodes failed")
                            }
                        }
                    }),
                );
            });
        }
    }
}

impl Handler<crate::describe::Describe> for Supervisor {
    type Result = MessageResult<crate::describe::Describe>;

    fn handle(&mut self, _: crate::describe::Describe, _ctx: &mut Context<Self>) -> Self::Result {
        self.handled += 1;
        let state = if self.env.lifecycle.is_stopping() {
            "stopping: no recovery claims or takeovers"
        } else {
            "running: startup recovery, lapsed-lease takeover every half ttl, orderly shutdown"
        };
        MessageResult(crate::describe::ActorSummary {
            kind: "supervisor",
            id: "supervisor".into(),
            arbiter: crate::describe::arbiter_name(),
            handled: self.handled,
            mailbox_len: self.mailbox.get(),
            state: state.into(),
        })
    }
}

/// Run startup recovery once.
#[derive(Debug, Message)]
#[rtype(result = "Result<RecoveryReport>")]
pub struct Recover;

impl Handler<Recover> for Supervisor {
    type Result = AtomicResponse<Self, Result<RecoveryReport>>;

    fn handle(&mut self, _: Recover, _ctx: &mut Context<Self>) -> Self::Result {
        self.handled += 1;
        let env = Arc::clone(&self.env);
        AtomicResponse::new(Box::pin(fut::wrap_future(recover(env))))
    }
}

/// Orderly shutdown: stop dispatch and recovery, pause every running execution under
/// a restart intent, wait for them until `timeout`.
#[derive(Debug, Message)]
#[rtype(result = "ShutdownReport")]
pub struct Shutdown {
    pub timeout: Duration,
}

impl Handler<Shutdown> for Supervisor {
    type Result = AtomicResponse<Self, ShutdownReport>;

    fn handle(&mut self, message: Shutdown, _ctx: &mut Context<Self>) -> Self::Result {
        self.handled += 1;
        let env = Arc::clone(&self.env);
        AtomicResponse::new(Box::pin(fut::wrap_future(shutdown(env, message.timeout))))
    }
}

/// classify every non-terminal execution, then act on each. Commands wait until
/// this is over (`Env::until_recovered`).
pub async fn recover(env: Arc<Executions>) -> Result<RecoveryReport> {
    let recovered = recover_where(&env, Scope::Startup).await;
    env.lifecycle.mark_recovered();
    recovered
}

/// What a recovery looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// Every execution no live owner runs (at startup).
    Startup,
    /// N-2: a takeover round: only executions whose attempt belongs to an owner no live node
    /// runs as (a node killed, or stopped past its lease), recovered under the rules of a
    /// local restart (R-2..R-8). Two survivors racing claim each once: a claim is a
    /// transition with a fixed command identity at the version found.
    LapsedOwners,
}

async fn recover_where(env: &Arc<Executions>, scope: Scope) -> Result<RecoveryReport> {
    let started = Instant::now();
    // N-2: attempts of live nodes are theirs; a store of one process lists none.
    let nodes = env.store.nodes()?;
    let mut report = RecoveryReport {
        lost_processes: mark_lost_processes(env).await,
        ..RecoveryReport::default()
    };
    let plans = plans(env, scope, &nodes)?;
    report.classified = plans.len();
    let mut acting = futures::stream::iter(plans.into_iter().map(|(head, plan)| {
        let env = Arc::clone(env);
        async move {
            let execution_id = head.execution_id;
            (execution_id, act_on(&env, head, plan).await)
        }
    }))
    .buffer_unordered(CLAIMS_IN_FLIGHT);
    let mut claimed = Vec::new();
    while let Some((execution_id, done)) = acting.next().await {
        claimed.extend(report.count(execution_id, done));
    }
    drop(acting);
    // Every claim is durable before any resumed execution takes a step: the claims have the
    // committer to themselves, and a crash in between leaves only claimed executions, which
    // the next start resumes again.
    for resumed in claimed {
        let (head, machine, lease) = *resumed;
        env.start_claimed(head, machine, lease);
    }
    for execution_id in &report.reconciling {
        match env.activate(*execution_id) {
            Ok(addr) => addr.do_send(ReconcileUnknown),
            Err(error) => {
                tracing::error!(%execution_id, %error, "asking the reconcile protocol failed")
            }
        }
    }
    report.elapsed = started.elapsed();
    tracing::info!(
        classified = report.classified,
        resumed = report.resumed.len(),
        expired = report.expired.len(),
        held = report.held.len(),
        elapsed_ms = report.elapsed.as_millis() as u64,
        "startup recovery done"
    );
    Ok(report)
}

/// Every non-terminal execution in `scope` (`nodes`: the live nodes as first read), with
/// what recovery does with it (`classify`).
fn plans(
    env: &Executions,
    scope: Scope,
    nodes: &openprogram_storage::Nodes,
) -> Result<Vec<(ExecutionHead, Plan)>> {
    let now_ms = env.clock.now_ms();
    let mut candidates = Vec::new();
    for state in ExecutionState::ALL
        .into_iter()
        .filter(|state| !state.is_terminal())
    {
        for execution_id in env.store.executions_in_state(state)? {
            let head = match env.store.head(execution_id) {
                Ok(Some(head)) => head,
                Ok(None) => continue,
                // S-4: a head that fails its checksum quarantines its execution (the read
                // did), and only that one: the others are still recovered.
                Err(
                    error @ (openprogram_storage::Error::Corrupted { .. }
                    | openprogram_storage::Error::Quarantined { .. }),
                ) => {
                    tracing::error!(%execution_id, %error, "restart recovery leaves a quarantined execution alone");
                    continue;
                }
                Err(error) => return Err(error.into()),
            };
            let owner = head.attempt.as_ref().map(|attempt| attempt.owner_id);
            let lapsed = owner.is_some_and(|owner| !env.owner_alive(nodes, owner));
            let skip = match scope {
                Scope::Startup => owner.is_some_and(|owner| owner != env.owner) && !lapsed,
                Scope::LapsedOwners => !lapsed,
            };
            if skip {
                continue;
            }
            // J-1: a Job waiting for its lease ran nothing: it stays in the queue, in its place.
            let waits_in_queue = state == ExecutionState::Queued
                && match env.store.job(execution_id) {
                    Ok(job) => job.is_some_and(|job| job.lease.is_none()),
                    Err(error) => {
                        tracing::error!(%execution_id, %error, "a Job's record cannot be read: recovered as any execution");
                        false
                    }
                };
            candidates.push((head, waits_in_queue));
        }
    }
    let mut plans = Vec::with_capacity(candidates.len());
    // K-7: the executions with a restart window of their own, in one read, when there is
    // anything to classify. One whose record is damaged is left alone, not guessed (S-4).
    let policies = match candidates.is_empty() {
        true => openprogram_storage::Policies::default(),
        false => env.store.policies()?,
    };
    for (execution_id, error) in &policies.damaged {
        tracing::error!(%execution_id, %error, "restart recovery leaves alone an execution whose restart window cannot be read");
    }
    for (head, waits_in_queue) in candidates {
        let damaged = (policies.damaged.iter()).any(|(id, _)| *id == head.execution_id);
        // C-2: a turn waiting in its session's line ran nothing either.
        let own = policies.windows.get(&head.execution_id).copied();
        let window = env.restart_window_of(&head, own);
        // J-1, K-2: a Job waiting for its lease stays in its place, unless it ran under
        // another contract: then it is held for a person like any execution.
        let plan = if damaged || (waits_in_queue && env.contract.runs(head.kind, head.revision_id))
        {
            Plan::Stay
        } else {
            classify(&head, env.owner, env.contract, window, now_ms)
        };
        plans.push((head, plan));
    }
    // N-2: a node that registered after the first read (a restart under the same id) wrote
    // its claims after registering: read again, every owner in a head read above is listed
    // now if it is live, and its executions are left alone.
    if scope == Scope::LapsedOwners || !nodes.nodes.is_empty() {
        let nodes = env.store.nodes()?;
        plans.retain(|(head, _)| {
            head.attempt.as_ref().is_none_or(|attempt| {
                attempt.owner_id == env.owner || !env.owner_alive(&nodes, attempt.owner_id)
            })
        });
    }
    Ok(plans)
}

impl RecoveryReport {
    /// Counts what recovery did with one execution; a resumed one is returned, to start once
    /// every claim is durable.
    fn count(&mut self, execution_id: ExecutionId, done: Result<Done>) -> Option<Resumed> {
        match done {
            Ok(Done::Resumed(resumed)) => {
                // B13: inside the startup recovery scan, a claim durable, others not made.
                openprogram_storage::failpoint!("B13");
                self.resumed.push(execution_id);
                return Some(resumed);
            }
            Ok(Done::Expired) => self.expired.push(execution_id),
            Ok(Done::Held(reason)) => self.held.push((execution_id, reason)),
            Ok(Done::Reconciling) => self.reconciling.push(execution_id),
            Ok(Done::Nothing) => {}
            Ok(Done::Skipped) => self.skipped += 1,
            Err(error) => {
                // One execution's failure (a quarantined record) never stops the others.
                tracing::error!(%execution_id, %error, "restart recovery failed for an execution");
            }
        }
        None
    }
}

/// P-3: every process record still `running` under another incarnation is marked `lost`,
/// in a transition of its execution (before any claim, so no actor writes meanwhile). One
/// record's failure (a quarantined execution) never stops the others, or the recovery.
async fn mark_lost_processes(env: &Arc<Executions>) -> Vec<ProcessId> {
    let mut lost = Vec::new();
    let records = match env.store.processes() {
        Ok(records) => records,
        Err(error) => {
            tracing::error!(%error, "reading process records failed; none marked lost");
            return lost;
        }
    };
    // N-2: read after the records: a record's owner registered before writing it, so a live
    // owner is listed here.
    let nodes = match env.store.nodes() {
        Ok(nodes) => nodes,
        Err(error) => {
            tracing::error!(%error, "reading the nodes failed; no process marked lost");
            return lost;
        }
    };
    for mut record in records {
        if record.state != ProcessState::Running || env.owner_alive(&nodes, record.owner_id) {
            continue;
        }
        let head = match env.store.head(record.execution_id) {
            Ok(Some(head)) => head,
            Ok(None) => continue,
            Err(error) => {
                tracing::error!(process_id = %record.process_id, %error, "not marked lost: its execution cannot be read");
                continue;
            }
        };
        let process_id = record.process_id;
        record.state = ProcessState::Lost;
        let transition = Transition::new(
            record.execution_id,
            vec![process_changed(process_id, ProcessState::Lost)],
        )
        .expect_version(head.version)
        .with(Upsert::Process(record));
        match env.store.submit(transition).await {
            Ok(Outcome::Committed(_)) => {
                tracing::warn!(%process_id, execution_id = %head.execution_id, "a process of a dead incarnation is recorded lost; it is never signalled");
                lost.push(process_id);
            }
            other => tracing::error!(%process_id, ?other, "recording a lost process failed"),
        }
    }
    lost
}

/// R-7's first step, at once (not behind a startup recovery in the supervisor's mailbox):
/// no new activation, admission or recovery claim; running executions pause under the
/// intent at their next safe point. Idempotent: the first intent stands.
pub fn begin_shutdown(env: &Env) {
    if env.lifecycle.is_stopping() {
        return;
    }
    let now_ms = env.clock.now_ms();
    env.lifecycle.begin_stopping(RestartIntent {
        deadline_ms: env.restart_window.deadline_from(now_ms),
        recorded_at_ms: now_ms,
        reason: "orderly shutdown".into(),
    });
}

/// no new activation, then a restart-recovery pause for every running execution at
/// its next safe point, in up to `PAUSE_ROUNDS` rounds within `timeout`.
pub async fn shutdown(env: Arc<Executions>, timeout: Duration) -> ShutdownReport {
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + timeout;
    begin_shutdown(&env);
    let live = env.directory.live_len();
    let mut left = live;
    for round in 0..PAUSE_ROUNDS {
        for addr in env.directory.all() {
            addr.do_send(RestartPause);
        }
        let round_deadline = tokio::time::Instant::now()
            + deadline.saturating_duration_since(tokio::time::Instant::now())
                / (PAUSE_ROUNDS - round) as u32;
        left = env.directory.drained(round_deadline).await;
        if left == 0 {
            break;
        }
    }
    if left > 0 {
        left = env.directory.drained(deadline).await;
    }
    if left > 0 {
        tracing::warn!(
            left,
            "orderly shutdown: executions still busy at the deadline stay running in storage"
        );
    }
    ShutdownReport {
        live,
        left_running: left,
        elapsed: started.elapsed(),
        store_close_error: None,
    }
}
