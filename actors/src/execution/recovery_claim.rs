//! Restart recovery's claim of one execution (R-3..R-8, A-3), as `recovery::classify`
//! planned it: one transition under a fixed command identity (the execution and its found
//! version), fenced with a higher epoch, so no startup claims anything twice. It pauses,
//! expires, marks an effect unknown, or claims for a new attempt (started once durable).

use std::sync::Arc;

use openprogram_storage::{
    Event, EventEnvelope, ExecutionHead, ExecutionState, Outcome, RestartIntent,
};

use crate::attempt_lease::LeaseState;
use crate::env::Env;
use crate::error::{Error, Result};
use crate::machine::plan;
use crate::machine::{derived_command_id, state_changed, Machine, RESTART_PAUSE_REASON};
use crate::rebuild::project;
use crate::recovery::{Hold, Plan};

/// An execution claimed for a new attempt: its actor starts from these.
pub(crate) type Resumed = Box<(ExecutionHead, Machine, Arc<LeaseState>)>;

pub(crate) enum Done {
    Resumed(Resumed),
    Expired,
    Held(&'static str),
    Reconciling,
    Nothing,
    Skipped,
}

/// Acts on one execution as `plan` says. Held or expired, it will not run again by itself;
/// one that left an effect dispatched without an outcome says so: `unknown`,
/// `reconciliation_required` (I2), never a plain pause.
pub(crate) async fn act_on(env: &Env, head: ExecutionHead, plan: Plan) -> Result<Done> {
    if env.lifecycle.is_stopping() {
        return Ok(Done::Skipped);
    }
    let intent = match plan {
        Plan::Stay => return Ok(Done::Nothing),
        // Asked once every claim is durable: a protocol's `not_applied` runs the effect again,
        // and nothing runs before the claims.
        Plan::Reconcile => return Ok(Done::Reconciling),
        Plan::Resume { intent } => return resume(env, head, intent).await,
        Plan::Hold(_) => None,
        // Kept even when in doubt, so the window stays closed for it.
        Plan::Expire { ref intent } => Some(intent.clone()),
    };
    let machine = project(env.store.as_ref(), head.execution_id, head.last_seq)?;
    let mut events = intent_recorded(&head, intent);
    // Dispatched by the dead attempt: in doubt for this claim as for any new attempt.
    let done = if let Some(unknown) = machine.in_doubt(true) {
        events.extend(unknown);
        let reason = "unknown external effect";
        events.push(state_changed(
            ExecutionState::ReconciliationRequired,
            reason,
        ));
        Done::Held("reconciliation_required")
    } else if let Plan::Hold(hold) = plan {
        events.push(state_changed(ExecutionState::Paused, hold.reason()));
        Done::Held(hold.reason())
    } else {
        let reason = "restart window expired";
        events.push(state_changed(ExecutionState::Expired, reason));
        Done::Expired
    };
    claimed_as(env, &head, &machine, events, done).await
}

/// The restart intent, recorded unless the head holds one already: an interruption not yet
/// over keeps its deadline.
fn intent_recorded(head: &ExecutionHead, intent: Option<RestartIntent>) -> Vec<Event> {
    let intent = intent.filter(|_| head.restart_intent.is_none());
    Vec::from_iter(intent.map(|intent| Event::RestartIntentRecorded { intent }))
}

/// `claim`: `done` once made, `Skipped` if someone else moved the execution first.
async fn claimed_as(
    env: &Env,
    head: &ExecutionHead,
    machine: &Machine,
    events: Vec<Event>,
    done: Done,
) -> Result<Done> {
    let claimed = claim(env, head, machine, events).await?;
    Ok(claimed.map_or(Done::Skipped, |_| done))
}

/// Claims the execution for a new attempt and starts its actor with the original ids.
async fn resume(env: &Env, head: ExecutionHead, intent: RestartIntent) -> Result<Done> {
    let execution_id = head.execution_id;
    let machine = project(env.store.as_ref(), execution_id, head.last_seq)?;
    let found_checkpoint = head
        .checkpoint
        .as_ref()
        .map_or(0, |checkpoint| checkpoint.seq);
    // A cancel is finished whatever its checkpoint says: finishing runs no work.
    if found_checkpoint != machine.present.run.checkpoint_seq
        && head.state != ExecutionState::Cancelling
    {
        // The head and the log disagree about where to continue from: never guess.
        let hold = Hold::StaleCheckpoint;
        let events = vec![state_changed(ExecutionState::Paused, hold.reason())];
        return claimed_as(env, &head, &machine, events, Done::Held(hold.reason())).await;
    }
    let lease = LeaseState::new(
        execution_id,
        env.owner,
        head.fencing_epoch + 1,
        env.lease_ttl,
    );
    let mut events = vec![Event::Resumed {
        // the fixed identity of recovery's write for the execution at its version.
        command_id: derived_command_id(execution_id.as_uuid(), b"restart-claim:", head.version),
        abandoned_epoch: head.fencing_epoch,
        // exactly the checkpoint it continues from; a second interruption before a new
        // effect finds the same one.
        inherited_checkpoint_seq: head.checkpoint.as_ref().map(|checkpoint| checkpoint.seq),
    }];
    events.extend(intent_recorded(&head, Some(intent)));
    if head.state == ExecutionState::Paused {
        // A Job goes back to the queue (J-2).
        events.push(state_changed(
            machine.present.run_state(),
            RESTART_PAUSE_REASON,
        ));
    }
    events.push(lease.claim());
    let Some((head, committed)) = claim(env, &head, &machine, events).await? else {
        return Ok(Done::Skipped);
    };
    let mut machine = machine;
    machine.apply_committed(&committed, None);
    Ok(Done::Resumed(Box::new((head, machine, lease))))
}

/// Commits recovery's transition for an execution as found in `head` (with `machine`, its
/// state at that head): version-checked, fenced with a higher epoch, under the fixed command
/// identity. The head as committed and the events to fold, or `None` if someone else moved
/// the execution first, or this very claim was made already.
async fn claim(
    env: &Env,
    head: &ExecutionHead,
    machine: &Machine,
    events: Vec<Event>,
) -> Result<Option<(ExecutionHead, Vec<EventEnvelope>)>> {
    let writer = plan::Writer::Recovery {
        epoch: head.fencing_epoch + 1,
    };
    let plan::Plan { transition, after } = machine.plan(
        head,
        events,
        Vec::new(),
        None,
        writer,
        env.clock.now_ms(),
        |tool| env.tools.recovery(tool),
    );
    match env.store.submit(transition).await? {
        Outcome::Committed(mut committed) => {
            let events = std::mem::take(&mut committed.events);
            Ok(Some((after.committed_head(&committed), events)))
        }
        Outcome::VersionConflict { .. }
        | Outcome::Fenced { .. }
        | Outcome::DuplicateCommand { .. } => Ok(None),
        other => Err(Error::Internal(format!("recovery claim: {other:?}"))),
    }
}
