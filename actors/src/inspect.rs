//! A read-only view of a running runtime: what the HTTP layer, the debug endpoint
//! and the CLI may read — the store's reads (snapshots, events, the log, metrics), the live
//! actors' own accounts, and the shared counters. It hands out no store that can submit,
//! no actor address and no `Env`: nothing reached through it can write.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use openprogram_storage::{EventReader, ExecutionId};

use crate::describe::{ActorSummary, Describe};
use crate::directory::Executions;
use crate::execution::actor::DescribeExecution;

/// What an actor said about itself, or why it did not answer in time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Described {
    Answered(ActorSummary),
    /// `kind` and `id` as far as they are known, and the reason.
    Unanswered {
        kind: &'static str,
        id: String,
        error: String,
    },
}

/// The read-only view. Cheap to clone.
#[derive(Clone)]
pub struct Inspector {
    actors: Arc<Executions>,
    reader: Arc<dyn EventReader>,
}

impl std::fmt::Debug for Inspector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inspector").finish_non_exhaustive()
    }
}

impl Inspector {
    /// `reader`: the same store as `env`'s, as reads only.
    pub fn new(env: Arc<Executions>, reader: Arc<dyn EventReader>) -> Self {
        Self {
            actors: env,
            reader,
        }
    }

    /// The store's reads.
    pub fn store(&self) -> &Arc<dyn EventReader> {
        &self.reader
    }

    /// Execution actors alive now (the rest are parked in storage).
    pub fn live_executions(&self) -> usize {
        self.actors.directory.live_len()
    }

    /// Whether an execution has a live actor.
    /// Messages waiting in the live execution actors' mailboxes (I-3).
    pub fn execution_mailbox_messages(&self) -> u64 {
        self.actors.directory.mailbox_messages()
    }

    pub fn is_live(&self, execution_id: ExecutionId) -> bool {
        self.actors.directory.live(execution_id).is_some()
    }

    /// Managed processes with a live actor.
    pub fn live_processes(&self) -> usize {
        self.actors.processes.all().len()
    }

    /// Steps committed since the runtime opened: model decisions and tool results.
    pub fn steps(&self) -> u64 {
        self.actors.steps.load(Ordering::Relaxed)
    }

    /// E-3: the pieces of `execution_id`'s model responses as they stream in on this node,
    /// from now on.
    pub fn deltas(&self, execution_id: ExecutionId) -> crate::deltas::DeltaWatch {
        self.actors.deltas.subscribe(execution_id)
    }

    /// The events `execution_id`'s actor on this node commits, from now on.
    pub fn commits(&self, execution_id: ExecutionId) -> crate::watchers::CommitWatch {
        self.actors.commits.subscribe(execution_id)
    }

    /// The runtime's histograms and counters (steps, activations, commands).
    pub fn telemetry(&self) -> &crate::telemetry::Telemetry {
        &self.actors.telemetry
    }

    /// E-6: tokens model calls used since the runtime opened, as recorded: (input, output).
    pub fn model_tokens(&self) -> (u64, u64) {
        let [input, output] = &self.actors.model_tokens;
        (
            input.load(Ordering::Relaxed),
            output.load(Ordering::Relaxed),
        )
    }

    /// Execution states loaded for an activation or a read since the runtime opened: from
    /// a parked state kept in memory, and by replaying events.
    pub fn state_loads(&self) -> (u64, u64) {
        let loads = |from: usize| self.actors.state_loads[from].load(Ordering::Relaxed);
        (loads(0), loads(1))
    }

    /// S-8: execution states loaded from a projection and the events after it (not
    /// counted in `state_loads`).
    pub fn projected_loads(&self) -> u64 {
        self.actors.state_loads[2].load(Ordering::Relaxed)
    }

    /// Every live execution, its attempt lease and every managed process, each asked for
    /// its own account at once; an actor busy past `timeout` (or stopped meanwhile) is
    /// listed as unanswered.
    pub async fn describe_actors(&self, timeout: Duration) -> Vec<Described> {
        let asked = futures::future::join_all(self.actors.directory.all().into_iter().map(
            |addr| async move {
                let described = addr.send(DescribeExecution).timeout(timeout).await;
                let lease = match &described {
                    Ok((_, Some(lease))) => Some(lease.send(Describe).timeout(timeout).await),
                    _ => None,
                };
                (described, lease)
            },
        ))
        .await;
        let mut actors = Vec::new();
        for (described, lease) in asked {
            match described {
                Ok((summary, _)) => {
                    let execution = summary.id.clone();
                    actors.push(Described::Answered(summary));
                    match lease {
                        Some(Ok(summary)) => actors.push(Described::Answered(summary)),
                        Some(Err(error)) => actors.push(Described::Unanswered {
                            kind: "attempt_lease",
                            id: format!("lease of {execution}"),
                            error: error.to_string(),
                        }),
                        None => {}
                    }
                }
                Err(error) => actors.push(Described::Unanswered {
                    kind: "execution",
                    id: "unknown".into(),
                    error: error.to_string(),
                }),
            }
        }
        for (process_id, addr) in self.actors.processes.all() {
            actors.push(match addr.send(Describe).timeout(timeout).await {
                Ok(summary) => Described::Answered(summary),
                Err(error) => Described::Unanswered {
                    kind: "process",
                    id: process_id.to_string(),
                    error: error.to_string(),
                },
            });
        }
        actors
    }
}
