//! Channels to whoever watches an execution on this node (the HTTP event stream): one per
//! watched execution, gone with its last watcher. `Hub<Delta>` carries a model's streamed
//! output (E-3, `deltas.rs`); `Hub<Vec<EventEnvelope>>` the events its actor committed, so a
//! stream of an execution running here follows it without reading the store.
//!
//! Cost when nobody watches: one atomic load per publish.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use openprogram_storage::{EventEnvelope, ExecutionId};
use tokio::sync::broadcast;

/// How many messages a slow watcher may fall behind before it misses some (the channel's
/// buffer is allocated whole when the first watcher arrives).
const CHANNEL_LEN: usize = 256;

/// The events an execution's actor committed, in order, as each transition committed.
pub type CommitHub = Hub<Vec<EventEnvelope>>;

/// A watcher of one execution's committed events. It sees only what its actor on this node
/// commits, from when it subscribed: the store has the rest (other writers, other nodes).
pub type CommitWatch = Watch<Vec<EventEnvelope>>;

/// The executions being watched, and their channels.
#[derive(Debug)]
pub struct Hub<T: ?Sized> {
    channels: Mutex<HashMap<ExecutionId, broadcast::Sender<Arc<T>>>>,
    /// `channels.len()`, read without the lock.
    watched: AtomicUsize,
}

impl<T: ?Sized> Default for Hub<T> {
    fn default() -> Self {
        Self {
            channels: Mutex::default(),
            watched: AtomicUsize::new(0),
        }
    }
}

/// A hub's map, locked; its count follows it when dropped.
struct Locked<'a, T: ?Sized> {
    channels: MutexGuard<'a, HashMap<ExecutionId, broadcast::Sender<Arc<T>>>>,
    watched: &'a AtomicUsize,
}

impl<T: ?Sized> Drop for Locked<'_, T> {
    fn drop(&mut self) {
        self.watched.store(self.channels.len(), Ordering::Relaxed);
    }
}

impl<T: ?Sized + Send + Sync> Hub<T> {
    /// The messages of `execution_id` from now on, until the watch is dropped.
    pub fn subscribe(self: &Arc<Self>, execution_id: ExecutionId) -> Watch<T> {
        let mut locked = self.lock();
        // Channels whose watchers left at the same moment (each saw the other) go here.
        locked
            .channels
            .retain(|_, sender| sender.receiver_count() > 0);
        let receiver = locked
            .channels
            .entry(execution_id)
            .or_insert_with(|| broadcast::channel(CHANNEL_LEN).0)
            .subscribe();
        Watch {
            receiver,
            hub: Arc::clone(self),
            execution_id,
        }
    }

    /// How many executions are watched now.
    pub fn watched(&self) -> usize {
        self.watched.load(Ordering::Relaxed)
    }

    fn lock(&self) -> Locked<'_, T> {
        Locked {
            channels: self.channels.lock().unwrap_or_else(PoisonError::into_inner),
            watched: &self.watched,
        }
    }

    /// Sends `message()` to the watchers of `execution_id`, if it has any (made only then).
    pub(crate) fn publish(&self, execution_id: ExecutionId, message: impl FnOnce() -> Arc<T>) {
        if self.watched() == 0 {
            return;
        }
        let mut locked = self.lock();
        let Some(sender) = locked.channels.get(&execution_id) else {
            return;
        };
        if sender.receiver_count() == 0 {
            locked.channels.remove(&execution_id);
            return;
        }
        let _ = sender.send(message());
    }
}

/// A watcher of one execution; its channel goes when its last watcher does.
#[derive(Debug)]
pub struct Watch<T: ?Sized + Send + Sync> {
    receiver: broadcast::Receiver<Arc<T>>,
    hub: Arc<Hub<T>>,
    execution_id: ExecutionId,
}

impl<T: ?Sized + Send + Sync> Watch<T> {
    /// The next message; `Err(Lagged(n))` if this watcher fell `n` messages behind.
    pub async fn recv(&mut self) -> Result<Arc<T>, broadcast::error::RecvError> {
        self.receiver.recv().await
    }

    /// The next message if one is waiting.
    pub fn try_recv(&mut self) -> Result<Arc<T>, broadcast::error::TryRecvError> {
        self.receiver.try_recv()
    }
}

impl<T: ?Sized + Send + Sync> Drop for Watch<T> {
    fn drop(&mut self) {
        let mut locked = self.hub.lock();
        // This watch's receiver is still counted: it is dropped after this.
        if locked
            .channels
            .get(&self.execution_id)
            .is_some_and(|sender| sender.receiver_count() <= 1)
        {
            locked.channels.remove(&self.execution_id);
        }
    }
}
