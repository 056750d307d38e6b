//! The runtime's recent figures, which the page draws as charts (`GET /debug/figures`): every
//! `EVERY`, the steps committed so far on this node, the executions in each unfinished state
//! (the store's index: on a shared store, every node's) and the Jobs waiting for resources;
//! the last `KEPT` samples, oldest first. It stops with the actor system.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use actix::prelude::*;
use openprogram_storage::ExecutionState;
use serde::Serialize;

use crate::env::Env;

/// How often a sample is taken.
pub const EVERY: Duration = Duration::from_secs(10);
/// How many samples are kept: ten minutes.
pub const KEPT: usize = 60;

/// One sample of the figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FigureSample {
    pub at_ms: u64,
    /// Steps committed on this node since it started.
    pub steps: u64,
    /// Executions in each unfinished state; empty when the index could not be read.
    pub by_state: BTreeMap<&'static str, usize>,
    /// Jobs waiting for resources, every resource's (a Job waiting for two counts twice).
    pub jobs_waiting: usize,
}

/// The samples taken so far: shared by the sampler and its readers.
#[derive(Debug, Clone, Default)]
pub struct FigureSamples(Arc<Mutex<VecDeque<FigureSample>>>);

impl FigureSamples {
    /// Every kept sample, oldest first.
    pub fn all(&self) -> Vec<FigureSample> {
        self.lock().iter().cloned().collect()
    }

    fn push(&self, sample: FigureSample) {
        let mut samples = self.lock();
        if samples.len() == KEPT {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<FigureSample>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The sampler: an actor beside the supervisor, sampling at start and every `EVERY`.
pub struct Figures {
    env: Arc<Env>,
    samples: FigureSamples,
}

impl std::fmt::Debug for Figures {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Figures").finish_non_exhaustive()
    }
}

impl Figures {
    pub fn new(env: Arc<Env>, samples: FigureSamples) -> Self {
        Self { env, samples }
    }

    /// Takes a sample: the steps now, the index's counts on a blocking thread (a scan on sled,
    /// a query on PostgreSQL: not on the arbiter other actors share), the queue's depth.
    fn sample(&mut self, ctx: &mut Context<Self>) {
        let (at_ms, steps) = (
            self.env.clock.now_ms(),
            self.env.steps.load(Ordering::Relaxed),
        );
        let store = Arc::clone(&self.env.store);
        let counted = tokio::task::spawn_blocking(move || counts(store.as_ref()));
        let asked = self
            .env
            .queue()
            .map(|queue| queue.send(crate::resource_queue::Report));
        let samples = self.samples.clone();
        let sampled = async move {
            let jobs_waiting = match asked {
                Some(asked) => asked.await.map_or(0, |report| {
                    report
                        .resources
                        .iter()
                        .map(|resource| resource.queued)
                        .sum()
                }),
                None => 0,
            };
            samples.push(FigureSample {
                at_ms,
                steps,
                by_state: counted.await.unwrap_or_default(),
                jobs_waiting,
            });
        };
        ctx.spawn(sampled.into_actor(self));
    }
}

/// Executions in each unfinished state; empty when the index could not be read.
fn counts(store: &dyn openprogram_storage::EventStore) -> BTreeMap<&'static str, usize> {
    let mut by_state = BTreeMap::new();
    for state in ExecutionState::ALL.into_iter().filter(|s| !s.is_terminal()) {
        match store.count_in_state(state) {
            Ok(count) => by_state.insert(state.as_str(), count),
            Err(error) => {
                tracing::debug!(%error, "figures: the state index could not be read");
                return BTreeMap::new();
            }
        };
    }
    by_state
}

impl Actor for Figures {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.sample(ctx);
        ctx.run_interval(EVERY, |figures, ctx| figures.sample(ctx));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn i3_the_figures_keep_the_last_ten_minutes_oldest_first() {
        let samples = FigureSamples::default();
        for at_ms in 0..(KEPT as u64 + 5) {
            samples.push(FigureSample {
                at_ms,
                steps: at_ms * 10,
                by_state: BTreeMap::new(),
                jobs_waiting: 0,
            });
        }
        let kept = samples.all();
        assert_eq!(kept.len(), KEPT);
        assert_eq!(kept[0].at_ms, 5, "the oldest dropped first");
        assert_eq!(kept[KEPT - 1].at_ms, KEPT as u64 + 4);
    }
}
