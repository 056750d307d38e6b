//! W-8: the actor that ends durable waits whose deadline passed. It keeps one timer per
//! watched wait; when one fires, the wait's execution decides (`Machine::decide_wait_expiry`,
//! through `DeadlineHost::expire_wait`): `expired`, and the execution paused `wait_expired`,
//! unless the wait was resolved meanwhile. Nothing is lost if a timer is: the deadline is in
//! the wait's own event, and
//! - a committed `WaitDetails` with a deadline is watched (`Action::WatchDeadline`);
//! - an activated execution with a pending deadline is watched again;
//! - at startup, once recovery is over, `Load` watches every waiting execution's deadline,
//!   so one that passed while the runtime was down fires at once (deadlines run from the
//!   wait's creation, never from startup).
//!
//! The execution actors reach it through `Env::watch_deadline`; it reaches them through
//! `DeadlineHost` (implemented by `Executions`).

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use actix::prelude::*;
use futures::future::BoxFuture;
use openprogram_storage::{ExecutionId, WaitId};

use crate::error::Result;
use crate::recovery::Clock;

/// How the deadlines reach the executions (`Executions`).
pub trait DeadlineHost: Send + Sync {
    /// The deadline of `wait_id` passed: `true` once its execution committed the expiry.
    fn expire_wait(
        self: Arc<Self>,
        execution_id: ExecutionId,
        wait_id: WaitId,
    ) -> BoxFuture<'static, Result<bool>>;
    /// Every pending durable wait with a deadline: (execution, wait, deadline in wall ms).
    fn pending_deadlines(self: Arc<Self>) -> BoxFuture<'static, Result<Vec<Watch>>>;
}

/// How often a failed expiry is tried again before the wait is left to its next activation.
const TRIES_MAX: u32 = 3;
const RETRY_AFTER: Duration = Duration::from_secs(2);

/// Watch `wait_id` of `execution_id`: expire it at `deadline_ms` (wall clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub struct Watch {
    pub execution_id: ExecutionId,
    pub wait_id: WaitId,
    pub deadline_ms: u64,
}

/// `wait_id` was resolved before its deadline: its timer is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub struct Unwatch {
    pub wait_id: WaitId,
}

/// Reads every pending deadline from the store (once, after startup recovery).
#[derive(Debug, Message)]
#[rtype(result = "Result<usize>")]
pub struct Load;

/// What the deadlines actor has done since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, MessageResponse)]
pub struct DeadlineStats {
    /// Waits watched now.
    pub watched: usize,
    /// Waits it expired.
    pub expired: u64,
}

#[derive(Debug, Message)]
#[rtype(result = "DeadlineStats")]
pub struct Stats;

pub struct WaitDeadlines {
    host: Weak<dyn DeadlineHost>,
    clock: Arc<dyn Clock>,
    watched: HashMap<WaitId, SpawnHandle>,
    /// Waits whose expiry is being asked now: the activation it causes watches them again,
    /// which must not set a second timer.
    firing: std::collections::HashSet<WaitId>,
    expired: u64,
}

impl std::fmt::Debug for WaitDeadlines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WaitDeadlines")
            .field("watched", &self.watched.len())
            .field("expired", &self.expired)
            .finish()
    }
}

impl WaitDeadlines {
    pub fn new(host: Weak<dyn DeadlineHost>, clock: Arc<dyn Clock>) -> Self {
        Self {
            host,
            clock,
            watched: HashMap::new(),
            firing: std::collections::HashSet::new(),
            expired: 0,
        }
    }

    fn watch(&mut self, watch: Watch, tries: u32, ctx: &mut Context<Self>) {
        if self.watched.contains_key(&watch.wait_id) || self.firing.contains(&watch.wait_id) {
            return;
        }
        let after = Duration::from_millis(watch.deadline_ms.saturating_sub(self.clock.now_ms()));
        let handle = ctx.run_later(after, move |act, ctx| act.fire(watch, tries, ctx));
        self.watched.insert(watch.wait_id, handle);
    }

    fn fire(&mut self, watch: Watch, tries: u32, ctx: &mut Context<Self>) {
        self.watched.remove(&watch.wait_id);
        let Some(host) = self.host.upgrade() else {
            return;
        };
        self.firing.insert(watch.wait_id);
        let expiry = host.expire_wait(watch.execution_id, watch.wait_id);
        ctx.spawn(fut::wrap_future::<_, Self>(expiry).map(move |outcome, act, ctx| {
            act.firing.remove(&watch.wait_id);
            match outcome {
                Ok(true) => act.expired += 1,
                // Not yet due by the runtime's clock (a timer is not the clock): again.
                Ok(false) if act.clock.now_ms() < watch.deadline_ms => act.watch(watch, tries, ctx),
                // Resolved meanwhile: nothing to expire.
                Ok(false) => {}
                Err(crate::Error::Unavailable(_)) => {}
                Err(error) if tries + 1 < TRIES_MAX => {
                    tracing::warn!(execution_id = %watch.execution_id, wait_id = %watch.wait_id, %error, "a wait deadline could not expire its wait: trying again");
                    let handle = ctx.run_later(RETRY_AFTER, move |act, ctx| {
                        act.fire(watch, tries + 1, ctx)
                    });
                    act.watched.insert(watch.wait_id, handle);
                }
                Err(error) => {
                    tracing::error!(execution_id = %watch.execution_id, wait_id = %watch.wait_id, %error, "a wait deadline could not expire its wait");
                }
            }
        }));
    }
}

impl Actor for WaitDeadlines {
    type Context = Context<Self>;
}

impl Handler<Watch> for WaitDeadlines {
    type Result = ();

    fn handle(&mut self, watch: Watch, ctx: &mut Context<Self>) {
        self.watch(watch, 0, ctx);
    }
}

impl Handler<Unwatch> for WaitDeadlines {
    type Result = ();

    fn handle(&mut self, unwatch: Unwatch, ctx: &mut Context<Self>) {
        if let Some(handle) = self.watched.remove(&unwatch.wait_id) {
            ctx.cancel_future(handle);
        }
    }
}

impl Handler<Load> for WaitDeadlines {
    type Result = ResponseActFuture<Self, Result<usize>>;

    fn handle(&mut self, _: Load, _ctx: &mut Context<Self>) -> Self::Result {
        let Some(host) = self.host.upgrade() else {
            return Box::pin(fut::ready(Ok(0)));
        };
        Box::pin(
            fut::wrap_future::<_, Self>(host.pending_deadlines()).map(|found, act, ctx| {
                let found = found?;
                let count = found.len();
                for watch in found {
                    act.watch(watch, 0, ctx);
                }
                Ok(count)
            }),
        )
    }
}

impl Handler<Stats> for WaitDeadlines {
    type Result = DeadlineStats;

    fn handle(&mut self, _: Stats, _ctx: &mut Context<Self>) -> DeadlineStats {
        DeadlineStats {
            watched: self.watched.len(),
            expired: self.expired,
        }
    }
}
