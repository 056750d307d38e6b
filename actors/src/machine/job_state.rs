//! J-1, J-2, pure data: a Job's standing as the machine keeps it (`Present::job`) — what it
//! asked for, the lease it holds, what it spent — and the budget arithmetic on it. The rules
//! that change it on each event are `job.rs`.

use std::sync::Arc;

use openprogram_storage::{ExecutionHead, JobBudget, JobRecord, LeaseId, LeaseRecord};

/// What a Job asked for at admission. Never changes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct JobSpec {
    pub resources: Vec<(String, u32)>,
    pub queued_at_ms: u64,
    pub queue_deadline_ms: Option<u64>,
}

/// The lease a Job's attempt holds now.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HeldLease {
    pub lease_id: LeaseId,
    /// The fencing epoch of the attempt it was granted to.
    pub epoch: u64,
    pub granted_at_ms: u64,
}

/// A Job's standing, folded from its events.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct JobState {
    pub spec: Arc<JobSpec>,
    pub budget: JobBudget,
    pub lease: Option<HeldLease>,
    /// When it first got a lease: from then on no queue deadline applies.
    pub admitted_at_ms: Option<u64>,
    /// Steps taken while holding a lease.
    pub steps_used: u32,
    /// Milliseconds the leases released so far were held.
    pub wall_used_ms: u64,
    /// Its queue deadline passed before it ever ran: it ended `expired`.
    pub expired_in_queue: bool,
}

impl JobState {
    /// Milliseconds of holding a lease up to `now_ms`.
    pub fn wall_used(&self, now_ms: u64) -> u64 {
        self.wall_used_ms + self.lease.as_ref().map_or(0, |lease| held(lease, now_ms))
    }

    /// Whether `budget` is spent at `now_ms`.
    pub fn spends(&self, budget: &JobBudget, now_ms: u64) -> bool {
        budget.steps.is_some_and(|steps| self.steps_used >= steps)
            || budget
                .wall_ms
                .is_some_and(|wall_ms| self.wall_used(now_ms) >= wall_ms)
    }

    /// Whether its own budget is spent at `now_ms`.
    pub fn spent(&self, now_ms: u64) -> bool {
        self.spends(&self.budget, now_ms)
    }

    /// Milliseconds of holding left before the wall budget is spent, while it holds a lease.
    pub fn wall_left(&self, now_ms: u64) -> Option<u64> {
        self.lease.as_ref()?;
        let budget = self.budget.wall_ms?;
        Some(budget.saturating_sub(self.wall_used(now_ms)))
    }

    /// The record of this standing (the lease with the attempt holding it).
    pub fn record(&self, head: &ExecutionHead) -> JobRecord {
        JobRecord {
            job_id: head.execution_id,
            session_id: head.session_id,
            resources: self.spec.resources.clone(),
            queued_at_ms: self.spec.queued_at_ms,
            queue_deadline_ms: self.spec.queue_deadline_ms,
            admitted_at_ms: self.admitted_at_ms,
            lease: self.lease.as_ref().map(|lease| LeaseRecord {
                lease_id: lease.lease_id,
                job_id: head.execution_id,
                epoch: lease.epoch,
                resources: self.spec.resources.clone(),
                granted_at_ms: lease.granted_at_ms,
            }),
        }
    }

    /// What the record says, compared: a transition writes the record when this changes.
    pub fn recorded(&self) -> (Option<&HeldLease>, Option<u64>) {
        (self.lease.as_ref(), self.admitted_at_ms)
    }
}

/// Milliseconds `lease` has been held at `now_ms`.
pub(crate) fn held(lease: &HeldLease, now_ms: u64) -> u64 {
    now_ms.saturating_sub(lease.granted_at_ms)
}
