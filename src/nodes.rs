//! N-2, N-3: a runtime as one node of a shared store — where another node's execution is
//! run, the nodes and their leases (`/debug/nodes`), and the lease lost.

use std::collections::{HashMap, HashSet};

use openprogram_storage::{ExecutionId, ExecutionState, OwnerId};

use crate::{NodeIdentity, Result, Runtime};

/// N-2: `/debug/nodes`: the nodes of a shared store.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NodesReport {
    /// The database's clock when read (leases are measured on it).
    pub now_ms: u64,
    pub nodes: Vec<NodeReport>,
    /// Running executions whose owner is no live node: a takeover is due.
    pub executions_of_lapsed_owners: usize,
}

/// N-2: one node of `NodesReport`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NodeReport {
    pub node_id: String,
    pub url: String,
    pub incarnation: u64,
    pub owner_id: String,
    pub live: bool,
    /// Negative once lapsed.
    pub lease_expires_in_ms: i64,
    pub started_at_ms: u64,
    pub executions_running: usize,
    /// The node answering.
    pub this_node: bool,
}

impl Runtime {
    /// N-3: the URL of the live node whose attempt runs `execution_id`, if that is another
    /// node: a command for it is forwarded there, so that this node never claims an
    /// execution another live node runs. `None`: this node decides (it runs it, nobody
    /// does, or its owner's lease lapsed and a takeover is due).
    pub fn owner_elsewhere(&self, execution_id: ExecutionId) -> Result<Option<String>> {
        if self.inner.node.is_none() {
            return Ok(None);
        }
        let head = self.store().head(execution_id)?;
        let here = self.store().incarnation().owner_id;
        let owner = head
            .and_then(|head| head.attempt)
            .map(|attempt| attempt.owner_id);
        let Some(owner) = owner.filter(|owner| *owner != here) else {
            return Ok(None);
        };
        let nodes = self.store().nodes()?;
        Ok(nodes.live_owner(owner).map(|node| node.url.clone()))
    }

    /// N-2: resolves once this node lost its lease — it lapsed before a renewal (the
    /// process stalled or was cut off past `lease_ttl`), or a later incarnation registered
    /// under its id. Other nodes may run its executions by then, and effects of its old
    /// attempts may still be in flight here: the embedder must stop this runtime and start a
    /// new one (`serve` exits with status 75). Never resolves for a runtime that is no node.
    pub async fn lease_lost(&self) -> String {
        self.inner.service.env().lifecycle.until_lease_lost().await
    }

    /// N-2: this runtime's node identity, if it runs as one.
    pub fn node(&self) -> Option<&NodeIdentity> {
        self.inner.node.as_ref()
    }

    /// N-2: the nodes of the shared store with their leases, and how many running
    /// executions each owns (`/debug/nodes`). Reads the non-terminal index's running
    /// executions: an operator's read.
    pub fn nodes(&self) -> Result<NodesReport> {
        let view = self.store().nodes()?;
        let mut owned: HashMap<OwnerId, usize> = HashMap::new();
        for state in [
            ExecutionState::Queued,
            ExecutionState::Running,
            ExecutionState::Cancelling,
        ] {
            for execution_id in self.store().executions_in_state(state)? {
                let attempt = self
                    .store()
                    .head(execution_id)?
                    .and_then(|head| head.attempt);
                if let Some(attempt) = attempt {
                    *owned.entry(attempt.owner_id).or_default() += 1;
                }
            }
        }
        let nodes = view
            .nodes
            .iter()
            .map(|node| NodeReport {
                node_id: node.node_id.clone(),
                url: node.url.clone(),
                incarnation: node.incarnation,
                owner_id: node.owner_id.to_string(),
                live: node.lease_expires_at_ms > view.now_ms,
                lease_expires_in_ms: node.lease_expires_at_ms as i64 - view.now_ms as i64,
                started_at_ms: node.started_at_ms,
                executions_running: owned.get(&node.owner_id).copied().unwrap_or(0),
                this_node: node.owner_id == self.store().incarnation().owner_id,
            })
            .collect();
        let listed: HashSet<_> = view.nodes.iter().map(|node| node.owner_id).collect();
        Ok(NodesReport {
            now_ms: view.now_ms,
            nodes,
            executions_of_lapsed_owners: owned
                .iter()
                .filter(|(owner, _)| !listed.contains(owner) || view.live_owner(**owner).is_none())
                .map(|(_, count)| count)
                .sum(),
        })
    }
}
