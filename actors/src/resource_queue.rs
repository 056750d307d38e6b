//! J-1: the resource queue actor. It owns the pure `Queue` (`resources.rs`) and applies its
//! messages in mailbox order: a Job waits (`Enqueue`), leaves (`Dequeue`), gives a lease back
//! (`Release`, sent only once the release is committed). It offers leases to the Jobs
//! first in line; a Job takes one by committing `LeaseGranted` in its own transition
//! (`JobHost::offer`), so a lease is durable only as part of its Job's state.
//!
//! Startup: the queue grants nothing until `Load`, sent once restart recovery is over: it
//! reads every lease still recorded and every Job still queued from the store, so the first
//! offer after a restart already counts every lease held (never more than the capacity, R-2).
//! Messages that arrive before `Load` are dropped: what they tell is in the store it reads.
//!
//! The execution actors reach it through `Env::queue`; it reaches them through `JobHost`
//! (implemented by `Executions`, which starts the execution actors).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures::future::BoxFuture;
use openprogram_storage::{EventReader, ExecutionId, ExecutionState, JobRecord, LeaseId};

use crate::error::Result;
use crate::recovery::Clock;
use crate::resources::{Lease, Offer, Queue, ResourceView, Resources};

/// How the queue reaches the Jobs it leases to (`Executions`).
pub trait JobHost: Send + Sync {
    /// Offers `offer` to its Job: `Some(epoch)` once the Job's attempt of `epoch` committed
    /// it, `None` if the Job refused it (it waits no more).
    fn offer(self: Arc<Self>, offer: Offer) -> BoxFuture<'static, Result<Option<u64>>>;
    /// The queue deadline of a waiting Job passed: `true` once it ended `expired`.
    fn expire(self: Arc<Self>, job_id: ExecutionId) -> BoxFuture<'static, Result<bool>>;
}

/// Upper bounds, in milliseconds, of the queue-wait histogram's buckets.
pub const WAIT_BUCKETS_MS: [u64; 12] =
    [1, 5, 10, 25, 50, 100, 250, 500, 1000, 5000, 30_000, 300_000];

/// What the queue has done since it started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueStats {
    /// Leases committed by their Jobs.
    pub admissions: u64,
    /// Queue waits of those admissions: counts per `WAIT_BUCKETS_MS` bucket (the last one:
    /// above every bound), and their sum.
    pub wait_buckets: Vec<u64>,
    pub wait_sum: Duration,
    /// Over the time at least one Job waited: units in use × time, and units declared ×
    /// time (their ratio is the utilisation while the queue is not empty).
    pub busy_in_use: Duration,
    pub busy_capacity: Duration,
    /// Offers refused by their Job (it left the queue meanwhile) or not answered.
    pub refused: u64,
    pub expired: u64,
}

/// The queue now: each resource, and the stats.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueReport {
    pub resources: Vec<ResourceView>,
    pub stats: QueueStats,
    /// Loaded from the store: it leases.
    pub loaded: bool,
}

pub struct ResourceQueue {
    queue: Queue,
    host: Weak<dyn JobHost>,
    store: Arc<dyn EventReader>,
    clock: Arc<dyn Clock>,
    loaded: bool,
    /// The monotonic origin of queue waits.
    started: Instant,
    stats: QueueStats,
    /// When `stats`' busy time was last brought up to date.
    busy_since: Duration,
    deadlines: HashMap<ExecutionId, SpawnHandle>,
    handled: u64,
    mailbox: crate::mailbox::Depth,
}

impl std::fmt::Debug for ResourceQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourceQueue")
            .field("loaded", &self.loaded)
            .field("waiting", &self.queue.waiting_len())
            .finish()
    }
}

impl ResourceQueue {
    pub fn new(
        resources: Resources,
        host: Weak<dyn JobHost>,
        store: Arc<dyn EventReader>,
        clock: Arc<dyn Clock>,
        mailbox: crate::mailbox::Depth,
    ) -> Self {
        Self {
            queue: Queue::new(resources),
            host,
            store,
            clock,
            loaded: false,
            started: Instant::now(),
            stats: QueueStats {
                wait_buckets: vec![0; WAIT_BUCKETS_MS.len() + 1],
                ..QueueStats::default()
            },
            busy_since: Duration::ZERO,
            deadlines: HashMap::new(),
            handled: 0,
            mailbox,
        }
    }

    /// Microseconds since the queue started: the unit of queue waits.
    fn now(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    /// Adds the time since the last change to the busy totals (before the queue changes).
    fn account(&mut self) {
        let now = self.started.elapsed();
        let span = now.saturating_sub(self.busy_since);
        self.busy_since = now;
        if self.queue.waiting_len() > 0 {
            let (used, capacity) = self.queue.in_use_total();
            self.stats.busy_in_use += span * used as u32;
            self.stats.busy_capacity += span * capacity as u32;
        }
    }

    /// Offers every lease that fits now.
    fn pump(&mut self, ctx: &mut Context<Self>) {
        if !self.loaded {
            return;
        }
        self.account();
        let offers = self.queue.offers(self.now(), LeaseId::new);
        for offer in offers {
            if let Some(deadline) = self.deadlines.remove(&offer.job_id) {
                ctx.cancel_future(deadline);
            }
            let Some(host) = self.host.upgrade() else {
                return;
            };
            let answer = Answer {
                job_id: offer.job_id,
                lease_id: offer.lease_id,
                waited: offer.waited,
            };
            ctx.spawn(fut::wrap_future::<_, Self>(host.offer(offer)).map(
                move |outcome, act, ctx| {
                    act.answered(answer, outcome, ctx);
                },
            ));
        }
    }

    fn answered(&mut self, answer: Answer, outcome: Result<Option<u64>>, ctx: &mut Context<Self>) {
        self.account();
        // Anything but an acceptance leaves a question the Job's record answers: read once.
        let record = match &outcome {
            Ok(Some(_)) => None,
            _ => self.store.job(answer.job_id).ok().flatten(),
        };
        let epoch = match outcome {
            Ok(epoch) => epoch,
            Err(error) => {
                // No answer: the Job's record says whether it committed the lease.
                tracing::warn!(job_id = %answer.job_id, %error, "a lease offer was not answered");
                let lease = record.as_ref().and_then(|job| job.lease.as_ref());
                let lease = lease.filter(|lease| lease.lease_id == answer.lease_id);
                lease.map(|lease| lease.epoch)
            }
        };
        if epoch.is_some() {
            self.stats.admissions += 1;
            let waited_ms = answer.waited / 1000;
            let bucket = WAIT_BUCKETS_MS
                .iter()
                .position(|bound| waited_ms <= *bound)
                .unwrap_or(WAIT_BUCKETS_MS.len());
            self.stats.wait_buckets[bucket] += 1;
            self.stats.wait_sum += Duration::from_micros(answer.waited);
        } else {
            self.stats.refused += 1;
        }
        // Refused because it left the queue, or not answered at all: the store says whether
        // it still waits (then it is offered again a little later).
        let still_waits = epoch.is_none() && self.queued(answer.job_id, record).is_some();
        let now = self.now();
        self.queue
            .answered(answer.job_id, answer.lease_id, epoch, false, now);
        if still_waits {
            let again = Duration::from_millis(50);
            ctx.run_later(again, move |act, ctx| act.requeue(answer.job_id, ctx));
        }
        self.pump(ctx);
    }

    /// `record` (the Job's record as read) if the store has `job_id` queued with no lease.
    fn queued(&self, job_id: ExecutionId, record: Option<JobRecord>) -> Option<JobRecord> {
        let head = self.store.head(job_id).ok().flatten();
        let queued = head.is_some_and(|head| head.state == ExecutionState::Queued);
        record.filter(|job| queued && job.lease.is_none())
    }

    /// Puts a Job back in line if the store still has it queued with no lease, from its
    /// record, and offers what fits.
    fn requeue(&mut self, job_id: ExecutionId, ctx: &mut Context<Self>) {
        let record = self.store.job(job_id).ok().flatten();
        if let Some(job) = self.queued(job_id, record) {
            self.wait(job_id, job, ctx);
            self.pump(ctx);
        }
    }

    /// Puts a Job in line from its record: its queue deadline holds while it never ran.
    fn wait(&mut self, job_id: ExecutionId, job: JobRecord, ctx: &mut Context<Self>) {
        let deadline = job
            .queue_deadline_ms
            .filter(|_| job.admitted_at_ms.is_none())
            .map(|deadline| job.queued_at_ms.saturating_add(deadline));
        self.enqueue(job_id, job.resources, deadline, ctx);
    }

    fn enqueue(
        &mut self,
        job_id: ExecutionId,
        resources: Vec<(String, u32)>,
        deadline_at_ms: Option<u64>,
        ctx: &mut Context<Self>,
    ) {
        self.account();
        if let Some(held) = self.queue.enqueue(job_id, resources.clone(), self.now()) {
            // It asks to wait while the queue counts a lease for it: if its record holds
            // no such lease, the release was never told (a writer that did not say); the
            // store is the truth.
            let recorded = self
                .store
                .job(job_id)
                .ok()
                .flatten()
                .and_then(|job| job.lease);
            if recorded.map(|lease| lease.lease_id) == Some(held) {
                return;
            }
            tracing::warn!(%job_id, lease_id = %held, "a lease the queue held was released without a word: freed");
            self.queue.release(job_id, held);
            let _ = self.queue.enqueue(job_id, resources, self.now());
        }
        if let Some(deadline_at_ms) = deadline_at_ms {
            if self.queue.is_waiting(job_id) && !self.deadlines.contains_key(&job_id) {
                let after = deadline_at_ms.saturating_sub(self.clock.now_ms());
                let handle = ctx.run_later(Duration::from_millis(after), move |act, ctx| {
                    act.deadline_passed(job_id, ctx)
                });
                self.deadlines.insert(job_id, handle);
            }
        }
    }

    /// J-1: a Job's queue deadline passed while it waited: it leaves the queue and ends
    /// `expired`. Should it not end so (granted meanwhile, paused), the store decides.
    fn deadline_passed(&mut self, job_id: ExecutionId, ctx: &mut Context<Self>) {
        self.deadlines.remove(&job_id);
        self.account();
        if !self.queue.dequeue(job_id) {
            return;
        }
        self.pump(ctx);
        let Some(host) = self.host.upgrade() else {
            return;
        };
        ctx.spawn(fut::wrap_future::<_, Self>(host.expire(job_id)).map(
            move |outcome, act, ctx| match outcome {
                Ok(true) => act.stats.expired += 1,
                outcome => {
                    if let Err(error) = outcome {
                        tracing::warn!(%job_id, %error, "a queue deadline could not end its Job");
                    }
                    act.requeue(job_id, ctx);
                }
            },
        ));
    }

    /// Reads every recorded lease and every queued Job (non-terminal executions only). What
    /// cannot be read is said and passed over: the queue leases the rest. A queued Job that
    /// asks for what the runtime no longer declares (a restart with other `--resource`s)
    /// cannot be leased: it stays queued, out of line, for a person to cancel.
    fn load(&mut self, ctx: &mut Context<Self>) -> Result<()> {
        let mut unread = None;
        for state in ExecutionState::ALL
            .into_iter()
            .filter(|state| !state.is_terminal())
        {
            let ids = match self.store.executions_in_state(state) {
                Ok(ids) => ids,
                Err(error) => {
                    tracing::error!(%state, %error, "the queue cannot list these executions");
                    unread = Some(error);
                    continue;
                }
            };
            for job_id in ids {
                let job = match self.store.job(job_id) {
                    Ok(Some(job)) => job,
                    Ok(None) => continue,
                    Err(error) => {
                        tracing::error!(%job_id, %error, "a Job's record cannot be read: not leased");
                        continue;
                    }
                };
                match job.lease {
                    Some(lease) => self.queue.held(Lease {
                        lease_id: lease.lease_id,
                        job_id,
                        epoch: Some(lease.epoch),
                        resources: lease.resources,
                    }),
                    None if state == ExecutionState::Queued
                        && self
                            .queue
                            .resources()
                            .check(&job.resources.iter().cloned().collect())
                            .is_err() =>
                    {
                        tracing::warn!(%job_id, resources = ?job.resources, "a queued Job asks for what is no longer declared: out of line");
                    }
                    None if state == ExecutionState::Queued => self.wait(job_id, job, ctx),
                    None => {}
                }
            }
        }
        self.loaded = true;
        unread.map_or(Ok(()), |error| Err(error.into()))
    }
}

/// What an offer's answer is matched to.
#[derive(Debug, Clone, Copy)]
struct Answer {
    job_id: ExecutionId,
    lease_id: LeaseId,
    waited: u64,
}

crate::mailbox::counted_mailbox!(ResourceQueue);

impl Actor for ResourceQueue {
    type Context = Context<Self>;
}

/// Read the store's leases and queued Jobs and start leasing. Sent once, after restart
/// recovery.
#[derive(Debug, Message)]
#[rtype(result = "Result<()>")]
pub struct Load;

impl Handler<Load> for ResourceQueue {
    type Result = Result<()>;

    fn handle(&mut self, _: Load, ctx: &mut Context<Self>) -> Result<()> {
        self.handled += 1;
        if self.loaded {
            return Ok(());
        }
        let loaded = self.load(ctx);
        self.pump(ctx);
        loaded
    }
}

/// A Job waits for its resources (again). `deadline_at_ms`: its queue deadline, while it
/// never ran.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Enqueue {
    pub job_id: ExecutionId,
    pub resources: Vec<(String, u32)>,
    pub deadline_at_ms: Option<u64>,
}

impl Handler<Enqueue> for ResourceQueue {
    type Result = ();

    fn handle(&mut self, message: Enqueue, ctx: &mut Context<Self>) {
        self.handled += 1;
        if !self.loaded {
            return;
        }
        self.enqueue(
            message.job_id,
            message.resources,
            message.deadline_at_ms,
            ctx,
        );
        self.pump(ctx);
    }
}

/// A Job left the queue without a lease (paused, cancelled, expired).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Dequeue {
    pub job_id: ExecutionId,
}

impl Handler<Dequeue> for ResourceQueue {
    type Result = ();

    fn handle(&mut self, message: Dequeue, ctx: &mut Context<Self>) {
        self.handled += 1;
        self.account();
        if let Some(deadline) = self.deadlines.remove(&message.job_id) {
            ctx.cancel_future(deadline);
        }
        // The Jobs behind it may go on now.
        if self.queue.dequeue(message.job_id) {
            self.pump(ctx);
        }
    }
}

/// J-2: a Job committed the release of `lease_id`.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Release {
    pub job_id: ExecutionId,
    pub lease_id: LeaseId,
}

impl Handler<Release> for ResourceQueue {
    type Result = ();

    fn handle(&mut self, message: Release, ctx: &mut Context<Self>) {
        self.handled += 1;
        self.account();
        if self.queue.release(message.job_id, message.lease_id) {
            self.pump(ctx);
        }
    }
}

/// The queue now (`GET /v1/resources`, `/metrics`, the page).
#[derive(Debug, Message)]
#[rtype(result = "QueueReport")]
pub struct Report;

impl Handler<Report> for ResourceQueue {
    type Result = MessageResult<Report>;

    fn handle(&mut self, _: Report, _ctx: &mut Context<Self>) -> Self::Result {
        self.handled += 1;
        self.account();
        MessageResult(QueueReport {
            resources: self.queue.view(),
            stats: self.stats.clone(),
            loaded: self.loaded,
        })
    }
}

/// A waiting Job's place in line (J-1).
#[derive(Debug, Message)]
#[rtype(result = "Option<usize>")]
pub struct Position {
    pub job_id: ExecutionId,
}

impl Handler<Position> for ResourceQueue {
    type Result = Option<usize>;

    fn handle(&mut self, message: Position, _ctx: &mut Context<Self>) -> Option<usize> {
        self.handled += 1;
        self.queue.position(message.job_id)
    }
}

impl Handler<crate::describe::Describe> for ResourceQueue {
    type Result = MessageResult<crate::describe::Describe>;

    fn handle(&mut self, _: crate::describe::Describe, _ctx: &mut Context<Self>) -> Self::Result {
        self.handled += 1;
        let (used, capacity) = self.queue.in_use_total();
        MessageResult(crate::describe::ActorSummary {
            kind: "resource_queue",
            id: "resource_queue".into(),
            arbiter: crate::describe::arbiter_name(),
            handled: self.handled,
            mailbox_len: self.mailbox.get(),
            state: format!(
                "{}{} waiting, {used} of {capacity} units in use, {} admitted",
                if self.loaded { "" } else { "loading: " },
                self.queue.waiting_len(),
                self.stats.admissions
            ),
        })
    }
}
