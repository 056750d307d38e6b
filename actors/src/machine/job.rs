//! J-1, J-2: what the pure machine knows of a Job (an execution admitted through the
//! resource queue): it runs only while it holds a lease, gives the lease back in the very
//! transition that stops it running, and is charged budget only while holding one.

use std::sync::Arc;

use openprogram_storage::{
    Event, ExecutionHead, ExecutionState as Status, JobBudget, JobRecord, LeaseId,
};

use super::{state_changed, Action, Machine, Present, Refusal, Rejection};

/// The pause reason of a Job whose budget is spent.
pub const BUDGET_EXHAUSTED: &str = "budget_exhausted";
/// The reason a Job ends `expired`: its queue deadline passed before it got a lease.
pub const QUEUE_DEADLINE: &str = "queue_deadline";

use super::job_state::held;
pub use super::job_state::{HeldLease, JobSpec, JobState};

/// States a Job holds its lease in: it runs, or finishes a cancellation.
fn holds_lease(status: Status) -> bool {
    matches!(status, Status::Running | Status::Cancelling)
}

/// The record of a Job just queued by `queued` (its `JobQueued` event), for the execution
/// `head` describes: what admission and a Job's Fork or Retry write with it.
pub fn queued_record(head: &ExecutionHead, queued: &Event) -> Option<JobRecord> {
    queued_job(queued).job.map(|job| job.record(head))
}

/// A new Job's standing from its `JobQueued` alone: what the resource queue is told.
pub fn queued_job(queued: &Event) -> Present {
    let mut present = Present::default();
    present.fold_job(queued, &mut Vec::new());
    present
}

impl Present {
    /// A Job whose budget is spent by `now_ms`: it pauses at its next step boundary.
    pub fn job_spent(&self, now_ms: u64) -> bool {
        self.job.as_ref().is_some_and(|job| job.spent(now_ms))
    }

    /// A Job without a lease: it may not run.
    pub fn needs_lease(&self) -> bool {
        self.job.as_ref().is_some_and(|job| job.lease.is_none())
    }

    /// The state an execution goes to when it may run again: `running`, or, for a Job
    /// without a lease, `queued` (it runs once the queue leases it its resources).
    pub fn run_state(&self) -> Status {
        // C-2: a foreground turn waiting for its session is `queued` too.
        if self.needs_lease() || self.turn.queued_for_session() {
            Status::Queued
        } else {
            Status::Running
        }
    }

    /// A Job holding no lease whose budget is spent: it runs again only with more. (Without a
    /// lease its wall time does not run: this needs no clock.)
    pub fn budget_spent(&self) -> bool {
        self.job
            .as_ref()
            .is_some_and(|job| job.lease.is_none() && job.spent(0))
    }

    /// A Job waiting in the resource queue now.
    pub fn in_queue(&self) -> bool {
        self.queued_job().is_some()
    }

    /// The Job, while it waits in the resource queue.
    pub fn queued_job(&self) -> Option<&JobState> {
        let waiting = self.status() == Status::Queued && !self.run.cancel_requested;
        self.job
            .as_ref()
            .filter(|job| job.lease.is_none() && waiting)
    }

    /// The release of the lease this present holds, if it holds one it may not keep: a
    /// state it does not run in, or (`claim_epoch`) a new attempt claiming the execution.
    pub fn lease_to_release(&self, claim_epoch: Option<u64>, now_ms: u64) -> Option<Event> {
        let lease = self.job.as_ref()?.lease.as_ref()?;
        let reason = match claim_epoch {
            Some(epoch) if epoch > lease.epoch => "new_attempt".to_owned(),
            Some(_) => return None,
            None if holds_lease(self.status()) => return None,
            None => self.status().as_str().to_owned(),
        };
        Some(Event::LeaseReleased {
            lease_id: lease.lease_id,
            reason,
            held_ms: held(lease, now_ms),
        })
    }

    /// Folds a Job's own events; counts a step taken under a lease.
    pub(crate) fn fold_job(&mut self, event: &Event, actions: &mut Vec<Action>) {
        match event {
            Event::JobQueued {
                resources,
                queued_at_ms,
                queue_deadline_ms,
                budget,
            } => {
                self.job = Some(JobState {
                    spec: Arc::new(JobSpec {
                        resources: resources.clone(),
                        queued_at_ms: *queued_at_ms,
                        queue_deadline_ms: *queue_deadline_ms,
                    }),
                    budget: *budget,
                    lease: None,
                    admitted_at_ms: None,
                    steps_used: 0,
                    wall_used_ms: 0,
                    expired_in_queue: false,
                });
                actions.push(Action::Enqueue);
            }
            Event::LeaseGranted {
                lease_id,
                epoch,
                granted_at_ms,
                ..
            } => {
                let Some(job) = &mut self.job else { return };
                job.lease = Some(HeldLease {
                    lease_id: *lease_id,
                    epoch: *epoch,
                    granted_at_ms: *granted_at_ms,
                });
                job.admitted_at_ms.get_or_insert(*granted_at_ms);
                self.run.status = Some(Status::Running);
                actions.push(Action::LeaseHeld);
                actions.push(Action::Advance);
            }
            Event::LeaseReleased {
                lease_id, held_ms, ..
            } => {
                let Some(job) = &mut self.job else { return };
                if job.lease.as_ref().map(|lease| lease.lease_id) != Some(*lease_id) {
                    return;
                }
                job.lease = None;
                job.wall_used_ms += held_ms;
                actions.push(Action::ReleaseLease {
                    lease_id: *lease_id,
                });
                if self.status() == Status::Running {
                    self.run.status = Some(Status::Queued);
                    actions.retain(|action| *action != Action::Advance);
                    actions.push(Action::Enqueue);
                }
            }
            Event::BudgetRaised { budget } => {
                if let Some(job) = &mut self.job {
                    job.budget = *budget;
                }
            }
            Event::ModelDecided { .. }
            | Event::ToolFinished { .. }
            | Event::StepFinished { .. } => {
                if let Some(job) = self.job.as_mut().filter(|job| job.lease.is_some()) {
                    job.steps_used += 1;
                }
            }
            _ => {}
        }
    }

    /// A Job's side of a state change from `before`: it leaves or joins the queue; a queue
    /// deadline that passed ends it for good.
    pub(crate) fn job_state_changed(
        &mut self,
        before: Status,
        reason: &str,
        actions: &mut Vec<Action>,
    ) {
        let Some(job) = &mut self.job else { return };
        let now = self.run.status.unwrap_or(Status::Queued);
        if job.lease.is_none() && before == Status::Queued && now != Status::Queued {
            actions.push(Action::Dequeue);
            if now == Status::Expired && reason == QUEUE_DEADLINE {
                job.expired_in_queue = true;
            }
        }
        if job.lease.is_none() && now == Status::Queued && before != Status::Queued {
            actions.push(Action::Enqueue);
        }
    }
}

impl Machine {
    /// J-1: whether this execution takes the lease `lease_id` the queue offers its attempt
    /// of `epoch`: only a Job waiting in the queue does.
    pub fn decide_grant(
        &self,
        lease_id: LeaseId,
        epoch: u64,
        now_ms: u64,
    ) -> Result<Vec<Event>, Rejection> {
        // Only a Job is in the queue.
        let Some(job) = self.present.queued_job() else {
            return Err(self.reject(Refusal::Invalid(format!(
                "no lease is taken while the execution is {}",
                self.status()
            ))));
        };
        Ok(vec![Event::LeaseGranted {
            lease_id,
            epoch,
            resources: job.spec.resources.clone(),
            granted_at_ms: now_ms,
        }])
    }

    /// J-1: a Job still in the queue, never run, whose queue deadline passed by `now_ms`
    /// ends `expired`.
    pub fn decide_queue_expiry(&self, now_ms: u64) -> Option<Vec<Event>> {
        let job = self.present.queued_job()?;
        let deadline = job.spec.queue_deadline_ms?;
        let passed = now_ms >= job.spec.queued_at_ms.saturating_add(deadline);
        (job.admitted_at_ms.is_none() && passed)
            .then(|| vec![state_changed(Status::Expired, QUEUE_DEADLINE)])
    }

    /// J-1: a Continue's new budget: refused if it is no Job's, or leaves the budget spent.
    pub(crate) fn decide_budget(
        &self,
        budget: Option<JobBudget>,
        now_ms: u64,
    ) -> Result<Vec<Event>, Refusal> {
        let Some(job) = &self.present.job else {
            return match budget {
                Some(_) => Err(Refusal::JobsOnly),
                None => Ok(Vec::new()),
            };
        };
        // The limits given replace the Job's; one not given stays as it was.
        let budget = budget.map_or(job.budget, |given| JobBudget {
            steps: given.steps.or(job.budget.steps),
            wall_ms: given.wall_ms.or(job.budget.wall_ms),
        });
        if job.spends(&budget, now_ms) {
            return Err(Refusal::BudgetExhausted {
                steps_used: job.steps_used,
                wall_used_ms: job.wall_used(now_ms),
            });
        }
        Ok((budget != job.budget)
            .then_some(Event::BudgetRaised { budget })
            .into_iter()
            .collect())
    }
}
