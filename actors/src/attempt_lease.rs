//! Attempt leases: one actor per active attempt holds its owner, fencing epoch and
//! monotonic expiry, renewed on a heartbeat; a lapsed attempt may be replaced by one with a
//! higher epoch (`Executions::reclaim_lapsed`). A lease is never permission to write
//! (storage fences every write by epoch): it only says when a takeover is allowed.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use actix::prelude::*;
use openprogram_storage::{AttemptId, Event, ExecutionId, OwnerId};

/// The lease of one attempt, readable without messaging its actor (whose thread may be the
/// one that is stuck).
#[derive(Debug)]
pub struct LeaseState {
    pub execution_id: ExecutionId,
    pub attempt_id: AttemptId,
    pub owner_id: OwnerId,
    pub epoch: u64,
    pub ttl: Duration,
    expires_at: Mutex<Instant>,
}

impl LeaseState {
    pub fn new(
        execution_id: ExecutionId,
        owner_id: OwnerId,
        epoch: u64,
        ttl: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            execution_id,
            attempt_id: AttemptId::new(),
            owner_id,
            epoch,
            ttl,
            expires_at: Mutex::new(Instant::now() + ttl),
        })
    }

    /// The event that claims the execution for this lease's attempt: the one way an
    /// attempt starts, whoever starts it (an activation, a control, a Job's lease, recovery,
    /// a takeover).
    pub fn claim(&self) -> Event {
        Event::AttemptStarted {
            attempt_id: self.attempt_id,
            owner_id: self.owner_id,
            epoch: self.epoch,
        }
    }

    /// Starts the lease afresh from now: when its attempt starts running.
    pub fn renew(&self) {
        *self.expires_at() = Instant::now() + self.ttl;
    }

    /// Extends a lease that has not lapsed (the attempt's heartbeat). A lapsed lease stays
    /// lapsed: an attempt whose process was stopped past its lease (SIGSTOP, a frozen VM)
    /// may be replaced however soon its heartbeat runs again (R06).
    pub fn extend(&self) -> bool {
        let mut expires_at = self.expires_at();
        let now = Instant::now();
        if now >= *expires_at {
            return false;
        }
        *expires_at = now + self.ttl;
        true
    }

    pub fn lapsed(&self) -> bool {
        self.remaining().is_zero()
    }

    /// Time left on the lease, zero once lapsed.
    pub fn remaining(&self) -> Duration {
        let expires_at = *self.expires_at();
        expires_at.saturating_duration_since(Instant::now())
    }

    /// The expiry (a panic while it was held cannot leave it half-written: it is used on).
    fn expires_at(&self) -> MutexGuard<'_, Instant> {
        self.expires_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The actor that owns a lease for the life of its attempt.
#[derive(Debug)]
pub struct AttemptLeaseActor {
    state: Arc<LeaseState>,
    handled: u64,
    mailbox: crate::mailbox::Depth,
}

impl AttemptLeaseActor {
    pub fn new(state: Arc<LeaseState>, mailbox: crate::mailbox::Depth) -> Self {
        Self {
            state,
            handled: 0,
            mailbox,
        }
    }
}

crate::mailbox::counted_mailbox!(AttemptLeaseActor);

impl Actor for AttemptLeaseActor {
    type Context = Context<Self>;
}

/// Extend the lease, unless it lapsed: the attempt is alive.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Renew;

impl Handler<Renew> for AttemptLeaseActor {
    type Result = ();

    fn handle(&mut self, _: Renew, _ctx: &mut Context<Self>) {
        self.handled += 1;
        self.state.extend();
    }
}

impl Handler<crate::describe::Describe> for AttemptLeaseActor {
    type Result = MessageResult<crate::describe::Describe>;

    fn handle(&mut self, _: crate::describe::Describe, _ctx: &mut Context<Self>) -> Self::Result {
        self.handled += 1;
        let remaining = self.state.remaining();
        MessageResult(crate::describe::ActorSummary {
            kind: "attempt_lease",
            id: self.state.attempt_id.to_string(),
            arbiter: crate::describe::arbiter_name(),
            handled: self.handled,
            mailbox_len: self.mailbox.get(),
            state: format!(
                "execution {}, epoch {}, {}",
                self.state.execution_id,
                self.state.epoch,
                if remaining.is_zero() {
                    "lapsed".to_owned()
                } else {
                    format!("expires in {} ms", remaining.as_millis())
                }
            ),
        })
    }
}

/// The attempt ended: stop holding the lease.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Release;

impl Handler<Release> for AttemptLeaseActor {
    type Result = ();

    fn handle(&mut self, _: Release, ctx: &mut Context<Self>) {
        self.handled += 1;
        ctx.stop();
    }
}
