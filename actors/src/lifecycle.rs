//! The lifecycle of one runtime: startup recovery over (commands wait for it), an orderly
//! shutdown begun, and the callers waiting for executions to end. Shared by every
//! actor through `Env::lifecycle`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use openprogram_storage::{EventStore, ExecutionId, RestartIntent};

use crate::error::{Error, Result};

/// Told once an execution ends (`Ok`), or stops without ending (`Err`).
pub type FinishedWaiter = tokio::sync::oneshot::Sender<Result<()>>;

#[derive(Debug, Default)]
pub struct Lifecycle {
    /// Orderly shutdown began: no new activation or dispatch; the intent running
    /// executions record as they pause.
    stopping: Mutex<Option<RestartIntent>>,
    stopping_flag: AtomicBool,
    /// The actors were stopped (`Runtime::halt`, also the end of an orderly shutdown):
    /// nothing of this runtime writes any more.
    halted: AtomicBool,
    /// Startup recovery finished (`true`); commands wait for it, so they never race its
    /// claims with an activation of their own.
    recovered: tokio::sync::watch::Sender<bool>,
    /// Callers waiting for executions to end (`wait_finished`).
    finished_waiters: Mutex<HashMap<ExecutionId, Vec<FinishedWaiter>>>,
    /// N-2: why this node lost its lease (it lapsed, or a later incarnation took its id):
    /// other nodes may run its executions now, so this process must stop.
    lease_lost: tokio::sync::watch::Sender<Option<String>>,
}

impl Lifecycle {
    /// Called by the supervisor once startup recovery is over (done or failed).
    pub fn mark_recovered(&self) {
        self.recovered.send_replace(true);
    }

    /// N-2: this node lost its lease (first reason kept).
    pub fn lose_lease(&self, reason: String) {
        self.lease_lost.send_if_modified(|lost| match lost {
            Some(_) => false,
            None => {
                *lost = Some(reason);
                true
            }
        });
    }

    /// N-2: resolves with the reason once this node lost its lease.
    pub async fn until_lease_lost(&self) -> String {
        let mut lost = self.lease_lost.subscribe();
        // The sender lives as long as `self`: it fails never while anyone waits.
        let reason = lost
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|r| r.clone());
        match reason {
            Some(reason) => reason,
            None => std::future::pending().await,
        }
    }

    /// Whether startup recovery is over.
    pub fn is_recovered(&self) -> bool {
        *self.recovered.borrow()
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

    /// The actors are stopped: the runtime writes nothing more.
    pub fn mark_halted(&self) {
        self.halted.store(true, Ordering::SeqCst);
    }

    pub fn is_halted(&self) -> bool {
        self.halted.load(Ordering::SeqCst)
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
    pub async fn wait_finished(
        &self,
        store: &dyn EventStore,
        execution_id: ExecutionId,
    ) -> Result<()> {
        let (sender, receiver) = tokio::sync::oneshot::channel();
        self.waiters_for(execution_id, |waiters| waiters.push(sender));
        let ended = match store.head(execution_id) {
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
}
