//! Restart recovery's policy, pure: the restart window, the clock it is measured
//! with, and how startup classifies an execution left behind by an earlier incarnation.
//! No actix, no sled: the supervisor (`supervisor.rs`) reads heads, asks `classify`, and
//! performs the plan.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

pub use openprogram_storage::RestartWindow;
use openprogram_storage::{ExecutionHead, ExecutionState, OwnerId, RestartIntent};

use crate::machine::{Contract, RESTART_PAUSE_REASON};

/// Wall-clock time in milliseconds since the Unix epoch. Restart deadlines are wall-clock
/// facts that outlive the process; leases never use this (they use `Instant`, R21).
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    fn now_ms(&self) -> u64;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as u64)
    }
}

/// A clock the caller moves (tests of the restart window, R12). Starts at the system time.
#[derive(Debug)]
pub struct ManualClock {
    now_ms: AtomicU64,
}

impl ManualClock {
    pub fn new() -> Self {
        Self {
            now_ms: AtomicU64::new(SystemClock.now_ms()),
        }
    }

    pub fn advance(&self, by: Duration) {
        self.now_ms
            .fetch_add(by.as_millis() as u64, Ordering::SeqCst);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

/// Why an execution stays where it is until someone acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Its revision (the runtime contract: provider, model, system text, tools) differs from this
    /// runtime's. It is paused for an explicit Continue.
    IncompatibleRevision,
    /// Its head's checkpoint is not the one its log leads to. Paused for an explicit Continue.
    StaleCheckpoint,
}

impl Hold {
    /// The pause reason recorded for it.
    pub fn reason(self) -> &'static str {
        match self {
            Hold::IncompatibleRevision => "incompatible_revision",
            Hold::StaleCheckpoint => "stale_checkpoint",
        }
    }
}

/// What startup does with one execution in the non-terminal index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Claim it with a new attempt and continue it with its original ids, under this intent
    /// (kept if one was recorded, so restarts never extend a deadline). Also finishes an
    /// accepted cancellation (`cancelling`): that records the outcome, it runs no more work.
    Resume { intent: RestartIntent },
    /// The restart window closed: mark it `expired`, keeping everything for a manual
    /// Continue.
    Expire { intent: RestartIntent },
    /// Pause it as an explicit recovery state.
    Hold(Hold),
    /// Ask the tool's reconcile protocol about its unknown effect.
    Reconcile,
    /// Nothing to do: owned by this incarnation, or an explicit state already (user pause,
    /// waiting for an answer, expired, a legacy pause without a restart intent).
    Stay,
}

/// classifies one execution found at startup. `owner` is this incarnation: an attempt
/// of any other owner is abandoned by definition. `contract` is this runtime's (K-2).
pub fn classify(
    head: &ExecutionHead,
    owner: OwnerId,
    contract: Contract,
    window: RestartWindow,
    now_ms: u64,
) -> Plan {
    let owned_here = head
        .attempt
        .as_ref()
        .is_some_and(|attempt| attempt.owner_id == owner);
    if owned_here {
        return Plan::Stay;
    }
    let restart_paused = head.state == ExecutionState::Paused
        && head.pause_reason.as_deref() == Some(RESTART_PAUSE_REASON)
        && head.restart_intent.is_some();
    // The interruption's deadline: recorded, or running from the last durable activity.
    let deadline_ms = match &head.restart_intent {
        Some(intent) => intent.deadline_ms,
        None => window.deadline_from(head.last_activity_ms),
    };
    let expired_intent = deadline_ms.is_some_and(|deadline| now_ms >= deadline);
    match head.state {
        // Resolving the effect continues the execution: only where a restart may continue it.
        ExecutionState::ReconciliationRequired
            if contract.runs(head.kind, head.revision_id)
                && window != RestartWindow::Disabled
                && !expired_intent =>
        {
            return Plan::Reconcile
        }
        ExecutionState::Queued | ExecutionState::Running | ExecutionState::Cancelling => {}
        _ if restart_paused => {}
        _ => return Plan::Stay,
    }
    // An intent recorded at shutdown (or by an earlier recovery) keeps its deadline; a crash
    // left none, so the window runs from the last durable activity.
    let intent = head
        .restart_intent
        .clone()
        .unwrap_or_else(|| RestartIntent {
            deadline_ms,
            recorded_at_ms: now_ms,
            reason: "abandoned by an earlier owner".into(),
        });
    if head.state == ExecutionState::Cancelling {
        return Plan::Resume { intent };
    }
    if !contract.runs(head.kind, head.revision_id) {
        return Plan::Hold(Hold::IncompatibleRevision);
    }
    // A disabled window stops even an unlimited intent: the operator said no automatic
    // restarts. Otherwise the recorded deadline rules.
    if window == RestartWindow::Disabled || expired_intent {
        Plan::Expire { intent }
    } else {
        Plan::Resume { intent }
    }
}

#[cfg(test)]
mod tests {
    //! the classification table, one row per case.

    use openprogram_storage::{
        AttemptId, AttemptLease, ExecutionId, ExecutionKind, RevisionId, RunId, SessionId,
    };

    use super::*;

    const HOUR_MS: u64 = 3_600_000;
    const NOW: u64 = 100 * HOUR_MS;

    fn head(state: ExecutionState, owner: OwnerId, revision: RevisionId) -> ExecutionHead {
        let mut head = ExecutionHead::new(
            ExecutionId::new(),
            SessionId::new(),
            RunId::new(),
            ExecutionKind::AgentTurn,
        );
        head.state = state;
        head.revision_id = revision;
        head.attempt = Some(AttemptLease {
            attempt_id: AttemptId::new(),
            owner_id: owner,
            epoch: 1,
        });
        head.last_activity_ms = NOW - HOUR_MS;
        head
    }

    fn intent(deadline_ms: Option<u64>) -> RestartIntent {
        RestartIntent {
            deadline_ms,
            recorded_at_ms: NOW - HOUR_MS,
            reason: "orderly shutdown".into(),
        }
    }

    #[test]
    fn r4_classification_table() {
        let me = OwnerId::new();
        let dead = OwnerId::new();
        let revision = RevisionId::new();
        let two_hours = RestartWindow::Within(Duration::from_millis(2 * HOUR_MS));
        let half_hour = RestartWindow::Within(Duration::from_millis(HOUR_MS / 2));
        let resumes = |plan: Plan| matches!(plan, Plan::Resume { .. });
        let expires = |plan: Plan| matches!(plan, Plan::Expire { .. });
        let classify_in =
            |head: &ExecutionHead, window| classify(head, me, Contract::of(revision), window, NOW);

        let running = head(ExecutionState::Running, dead, revision);
        assert!(
            resumes(classify_in(&running, two_hours)),
            "abandoned running, inside"
        );
        assert!(
            expires(classify_in(&running, half_hour)),
            "abandoned running, beyond"
        );
        assert!(resumes(classify_in(&running, RestartWindow::Unlimited)));
        assert!(
            expires(classify_in(&running, RestartWindow::Disabled)),
            "0 disables"
        );
        let queued = head(ExecutionState::Queued, dead, revision);
        assert!(resumes(classify_in(&queued, two_hours)), "never activated");
        let mine = head(ExecutionState::Running, me, revision);
        assert_eq!(
            classify_in(&mine, two_hours),
            Plan::Stay,
            "owned by this incarnation"
        );
        let other = head(ExecutionState::Running, dead, RevisionId::new());
        assert_eq!(
            classify_in(&other, two_hours),
            Plan::Hold(Hold::IncompatibleRevision)
        );
        let cancelling = head(ExecutionState::Cancelling, dead, RevisionId::new());
        assert!(
            resumes(classify_in(&cancelling, RestartWindow::Disabled)),
            "an accepted cancel is finished whatever the window or revision"
        );
        for state in [
            ExecutionState::Paused,
            ExecutionState::Waiting,
            ExecutionState::Expired,
        ] {
            let explicit = head(state, dead, revision);
            assert_eq!(classify_in(&explicit, two_hours), Plan::Stay, "{state}");
        }
        let unknown = head(ExecutionState::ReconciliationRequired, dead, revision);
        assert_eq!(classify_in(&unknown, two_hours), Plan::Reconcile);

        let mut restart_paused = head(ExecutionState::Paused, dead, revision);
        restart_paused.pause_reason = Some(RESTART_PAUSE_REASON.into());
        assert_eq!(
            classify_in(&restart_paused, two_hours),
            Plan::Stay,
            "legacy: no intent"
        );
        restart_paused.restart_intent = Some(intent(Some(NOW + HOUR_MS)));
        assert!(
            resumes(classify_in(&restart_paused, half_hour)),
            "the recorded deadline rules"
        );
        restart_paused.restart_intent = Some(intent(Some(NOW - 1)));
        assert!(
            expires(classify_in(&restart_paused, RestartWindow::Unlimited)),
            "finite stays finite"
        );
    }

    #[test]
    fn r2_the_deadline_runs_from_the_last_durable_activity_never_from_startup() {
        let dead = OwnerId::new();
        let revision = RevisionId::new();
        let running = head(ExecutionState::Running, dead, revision);
        let window = RestartWindow::Within(Duration::from_millis(2 * HOUR_MS));
        match classify(
            &running,
            OwnerId::new(),
            Contract::of(revision),
            window,
            NOW,
        ) {
            Plan::Resume { intent } => {
                assert_eq!(
                    intent.deadline_ms,
                    Some(running.last_activity_ms + 2 * HOUR_MS)
                );
            }
            other => panic!("{other:?}"),
        }
        match classify(
            &running,
            OwnerId::new(),
            Contract::of(revision),
            RestartWindow::Unlimited,
            NOW,
        ) {
            Plan::Resume { intent } => assert_eq!(intent.deadline_ms, None, "a null deadline"),
            other => panic!("{other:?}"),
        }
    }
}
