//! What every actor of one runtime shares: the store, the provider, the tools, this
//! incarnation's owner id, and the directory of live execution actors.
//!
//! The directory activates an execution on demand (loading its head and replaying its
//! events through the pure machine with actions off) on the arbiter its id shards to, and
//! forgets it when the actor releases itself (passivation).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use actix::prelude::*;
use openprogram_storage::{EventStore, ExecutionHead, ExecutionId, OwnerId};

use crate::agent::{Provider, ToolRegistry};
use crate::error::{Error, Result};
use crate::execution::actor::{Activate, ExecutionActor};
use crate::execution::machine::Machine;

pub struct Env {
    pub store: Arc<dyn EventStore>,
    pub provider: Arc<dyn Provider>,
    pub tools: ToolRegistry,
    pub owner: OwnerId,
    pub directory: Directory,
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Env")
            .field("owner", &self.owner)
            .field("tools", &self.tools)
            .finish()
    }
}

/// Live execution actors by id, and the arbiters they run on.
#[derive(Debug)]
pub struct Directory {
    arbiters: Vec<ArbiterHandle>,
    live: Mutex<HashMap<ExecutionId, Addr<ExecutionActor>>>,
}

impl Directory {
    pub fn new(arbiters: Vec<ArbiterHandle>) -> Self {
        assert!(!arbiters.is_empty(), "a runtime needs at least one arbiter");
        Self {
            arbiters,
            live: Mutex::new(HashMap::new()),
        }
    }

    pub fn live(&self, execution_id: ExecutionId) -> Option<Addr<ExecutionActor>> {
        let live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        live.get(&execution_id)
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
        if live.get(&execution_id) == Some(addr) {
            live.remove(&execution_id);
        }
    }

    /// The arbiter an execution runs on: by the random bits of its id, so executions
    /// spread evenly and an execution's steps stay on one thread.
    fn arbiter_of(&self, execution_id: ExecutionId) -> &ArbiterHandle {
        let bytes = execution_id.as_bytes();
        let mut tail = [0u8; 8];
        tail.copy_from_slice(&bytes[8..]);
        &self.arbiters[(u64::from_be_bytes(tail) % self.arbiters.len() as u64) as usize]
    }
}

/// Rebuilds an execution's machine from its events (recovery: actions are dropped).
pub fn load(store: &dyn EventStore, execution_id: ExecutionId) -> Result<(ExecutionHead, Machine)> {
    let head = store.head(execution_id)?.ok_or(Error::NotFound)?;
    let mut machine = Machine::default();
    let mut ignored = Vec::new();
    for envelope in store.events_after(execution_id, 0, usize::MAX)? {
        machine.apply(&envelope.event, envelope.seq, &mut ignored);
        ignored.clear();
    }
    Ok((head, machine))
}

impl Env {
    /// The live actor of an execution, activating it if needed. A new actor first starts
    /// an attempt (`Activate`), before any message sent after this returns.
    pub fn activate(self: &Arc<Self>, execution_id: ExecutionId) -> Result<Addr<ExecutionActor>> {
        let mut live = self
            .directory
            .live
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(addr) = live.get(&execution_id).filter(|addr| addr.connected()) {
            return Ok(addr.clone());
        }
        let (head, machine) = load(self.store.as_ref(), execution_id)?;
        let env = Arc::clone(self);
        let arbiter = self.directory.arbiter_of(execution_id);
        let addr = ExecutionActor::start_in_arbiter(arbiter, move |_| {
            ExecutionActor::new(env, head, machine)
        });
        addr.do_send(Activate);
        live.insert(execution_id, addr.clone());
        Ok(addr)
    }
}
