//! What the runtime measures of itself for `/metrics`: histograms of steps,
//! activations and commands, and counters of rejections by code and of reconciliations.
//! Written by the actors and the command service with relaxed atomics; read by the server.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use openprogram_storage::{Histogram, NamedHistogram};

/// The share of executions whose spans are made, as f64 bits (default 1: all). Process-wide,
/// like the `tracing` subscriber that wants them: set by whoever installs it (`serve
/// --otlp-sample`). An execution left out makes none of its spans, not even disabled ones,
/// so a small share costs a small share.
static SPAN_SAMPLE: AtomicU64 = AtomicU64::new(0x3FF0_0000_0000_0000); // 1.0

/// Sets the share of executions whose spans are made (0 to 1; outside, clamped).
pub fn set_span_sample(share: f64) {
    let share = if share.is_nan() {
        1.0
    } else {
        share.clamp(0.0, 1.0)
    };
    SPAN_SAMPLE.store(share.to_bits(), Ordering::Relaxed);
}

/// Whether `execution_id`'s spans are made: decided by its id's random bits, so every attempt
/// of an execution, in any process with the same share, decides alike.
pub fn spans_sampled(execution_id: openprogram_storage::ExecutionId) -> bool {
    in_share(
        execution_id,
        f64::from_bits(SPAN_SAMPLE.load(Ordering::Relaxed)),
    )
}

fn in_share(execution_id: openprogram_storage::ExecutionId, share: f64) -> bool {
    if share >= 1.0 {
        return true;
    }
    // UUID v7 as the uuid crate makes it: the top of the random part is a counter that keeps
    // ids in order within a millisecond; its last 32 bits are random.
    let bytes = execution_id.as_bytes();
    let random = u32::from_be_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
    f64::from(random) < share * f64::from(u32::MAX)
}

#[derive(Debug)]
pub struct Telemetry {
    /// From a model call's start to the commit of its decision or error.
    model_steps: Histogram,
    /// From a tool call's start to the commit of its receipt.
    tool_steps: Histogram,
    /// Loading an execution's state and starting its actor.
    activations: Histogram,
    /// A command from its arrival at the command service to its reply, by outcome.
    commands_applied: Histogram,
    commands_rejected: Histogram,
    rejections: Mutex<BTreeMap<String, u64>>,
    reconciliations: AtomicU64,
}

impl Default for Telemetry {
    fn default() -> Self {
        Self {
            model_steps: Histogram::latency(),
            tool_steps: Histogram::latency(),
            activations: Histogram::latency(),
            commands_applied: Histogram::latency(),
            commands_rejected: Histogram::latency(),
            rejections: Mutex::default(),
            reconciliations: AtomicU64::new(0),
        }
    }
}

/// Which effect a step ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepKind {
    Model,
    Tool,
}

impl Telemetry {
    pub fn step(&self, kind: StepKind, took: Duration) {
        match kind {
            StepKind::Model => &self.model_steps,
            StepKind::Tool => &self.tool_steps,
        }
        .observe_duration(took);
    }

    pub fn activation(&self, took: Duration) {
        self.activations.observe_duration(took);
    }

    /// A command answered: applied (or accepted) after `took`, or rejected with `code`.
    pub fn command(&self, rejected: Option<&str>, took: Duration) {
        match rejected {
            None => self.commands_applied.observe_duration(took),
            Some(code) => {
                self.commands_rejected.observe_duration(took);
                let mut rejections = self
                    .rejections
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                *rejections.entry(code.to_owned()).or_default() += 1;
            }
        }
    }

    /// An unknown effect resolved (R-8): by an operator's `reconcile` or a tool's protocol.
    pub fn reconciled(&self) {
        self.reconciliations.fetch_add(1, Ordering::Relaxed);
    }

    pub fn reconciliations(&self) -> u64 {
        self.reconciliations.load(Ordering::Relaxed)
    }

    /// Rejected commands by their stable code, in code order.
    pub fn rejections(&self) -> Vec<(String, u64)> {
        self.rejections
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(code, count)| (code.clone(), *count))
            .collect()
    }

    pub fn histograms(&self) -> Vec<NamedHistogram> {
        let named = |name, help, labels: &str, histogram: &Histogram| NamedHistogram {
            name,
            help,
            labels: labels.to_owned(),
            snapshot: histogram.snapshot(),
        };
        let step = "A step's time: from the start of its model call or tool call to the commit of its decision or receipt.";
        let command = "A command's time in the command service, from its arrival to its answer (applied, or rejected without a change).";
        vec![
            named("step_seconds", step, r#"kind="model""#, &self.model_steps),
            named("step_seconds", step, r#"kind="tool""#, &self.tool_steps),
            named(
                "activation_seconds",
                "Activating an execution: loading its state (parked, projection or replay) and starting its actor.",
                "",
                &self.activations,
            ),
            named("command_seconds", command, r#"outcome="applied""#, &self.commands_applied),
            named("command_seconds", command, r#"outcome="rejected""#, &self.commands_rejected),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openprogram_storage::ExecutionId;

    #[test]
    fn i5_a_share_of_executions_is_sampled_alike_for_every_attempt() {
        let ids: Vec<ExecutionId> = (0..10_000).map(|_| ExecutionId::new()).collect();
        let count = |share| ids.iter().filter(|id| in_share(**id, share)).count();
        assert_eq!(count(1.0), 10_000);
        assert_eq!(count(0.0), 0);
        let half = count(0.5);
        assert!(
            (4_000..6_000).contains(&half),
            "{half} of 10,000 at one half"
        );
        let tenth = count(0.1);
        assert!(
            (600..1_400).contains(&tenth),
            "{tenth} of 10,000 at a tenth"
        );
        // The same execution decides the same, whenever asked.
        assert!(ids
            .iter()
            .all(|id| in_share(*id, 0.3) == in_share(*id, 0.3)));
    }
}
