//! What the seeded simulation (`sim.rs`, R10) checks after each commit, apart from
//! the simulation itself: what the run has seen so far (`Seen`: K-5, terminal states, a
//! Step's one step, one outcome per effect), a transition's plan against the machine's fold,
//! K-3 in the state reached, the waits and grants (W-2, W-7, W-8); and the answers and
//! controls it sends.

use std::collections::HashMap;

use openprogram_storage::{
    CommandId, Control, EffectId, Event, ExecutionState as Status, ReceiptStatus, WaitId,
    WaitStatus,
};

use super::*;

pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// A finite f64 of any magnitude and precision.
    pub(crate) fn float(&mut self) -> f64 {
        loop {
            let float = f64::from_bits(self.next());
            if float.is_finite() {
                return float;
            }
        }
    }
}

/// What the invariants of one run remember across its commits.
#[derive(Default)]
pub(crate) struct Seen {
    cancel_applied: bool,
    pub(crate) terminal: Option<Status>,
    /// Outcomes committed per effect: one each.
    results: HashMap<EffectId, usize>,
    /// Step events committed since the last applied Step, while it runs.
    steps_since_step: Option<usize>,
    /// The attempt (epoch) that dispatched each External effect.
    pub(crate) dispatched_at: HashMap<EffectId, u64>,
    /// Waits once resolved, with their outcome: it never changes again.
    resolved: HashMap<WaitId, WaitStatus>,
}

impl Seen {
    /// What one committed event tells the invariants: a Cancel applied, the steps of a
    /// Step, the attempt an effect was dispatched by, one outcome per effect.
    pub(crate) fn track(&mut self, event: &Event, epoch: u64, context: &str) {
        match event {
            Event::ControlApplied {
                control: Control::Cancel,
                ..
            } => self.cancel_applied = true,
            Event::ControlApplied {
                control: Control::Step,
                ..
            } => self.steps_since_step = Some(0),
            // A call whose outcome is `Unknown` is no step taken (R-8: reconciled
            // `NotApplied`, it runs again as the same step), and no outcome (the same
            // effect finishes once more).
            Event::ToolFinished {
                status: ReceiptStatus::Unknown,
                ..
            } => {}
            Event::ModelDecided { .. } | Event::ToolFinished { .. } => {
                if let Some(steps) = &mut self.steps_since_step {
                    *steps += 1;
                }
            }
            Event::ControlApplied {
                control: Control::Continue,
                ..
            }
            | Event::StateChanged {
                state: Status::Paused,
                ..
            } => self.steps_since_step = None,
            Event::ToolDispatched { effect_id, .. } => {
                self.dispatched_at.insert(*effect_id, epoch);
            }
            _ => {}
        }
        if let Event::ToolFinished {
            effect_id, status, ..
        } = event
        {
            if *status != ReceiptStatus::Unknown {
                *self.results.entry(*effect_id).or_default() += 1;
                assert_eq!(
                    self.results[effect_id], 1,
                    "{context}: two results for {effect_id}"
                );
            }
        }
    }

    /// K-5, terminal states, a Step's one step, resolved waits and one receipt per effect,
    /// in the state a commit reached from `before`.
    pub(crate) fn check_state(&mut self, machine: &Machine, before: Status, context: &str) {
        let status = machine.status();
        if let Some(terminal) = self.terminal {
            assert_eq!(
                status, terminal,
                "{context}: left terminal {terminal} from {before}"
            );
        }
        if status.is_terminal() {
            self.terminal = Some(status);
            if self.cancel_applied {
                assert_eq!(status, Status::Cancelled, "{context}: cancel did not win");
            }
        }
        if let Some(steps) = self.steps_since_step {
            assert!(steps <= 1, "{context}: a Step ran {steps} steps");
        }
        for wait in machine.waits() {
            if let Some(was) = self.resolved.get(&wait.wait_id) {
                assert_eq!(*was, wait.status, "{context}: a resolved wait changed");
            } else if !wait.status.is_pending() {
                self.resolved.insert(wait.wait_id, wait.status);
            }
        }
        let mut effects = std::collections::HashSet::new();
        for receipt in machine.receipts.iter() {
            assert!(
                effects.insert(receipt.effect_id),
                "{context}: two receipts for effect {}",
                receipt.effect_id
            );
        }
    }
}

pub(crate) fn recovery(tool: &str) -> Recovery {
    if tool == "append" {
        Recovery::External
    } else {
        Recovery::Idempotent
    }
}

/// The plan of a transition, once the machine folded its events: its head, wait records
/// and actions are what the machine itself reached.
pub(crate) fn check_plan(
    machine: &Machine,
    plan: &crate::machine::plan::Plan,
    head: &openprogram_storage::ExecutionHead,
    before_waits: &[WaitState],
    actions: &[Action],
    context: &str,
) {
    let diverged = format!("{context}: the plan diverged");
    let planned = &plan.after.head;
    assert_eq!(planned.state, machine.status(), "{diverged}");
    assert_eq!(
        planned.pause_reason, machine.present.run.pause_reason,
        "{diverged}"
    );
    if machine.present.run.checkpoint_seq > head.last_seq {
        let checkpoint = planned.checkpoint.as_ref().expect("a planned checkpoint");
        assert_eq!(
            checkpoint.seq, machine.present.run.checkpoint_seq,
            "{diverged}"
        );
        assert_eq!(
            checkpoint.next_action,
            machine.present.next_action(),
            "{diverged}"
        );
    } else {
        assert_eq!(planned.checkpoint, head.checkpoint, "{diverged}");
    }
    assert_eq!(plan.after.actions, actions, "{diverged}");
    assert_eq!(plan.transition.head.as_ref(), Some(planned), "{diverged}");
    let written: Vec<_> = plan
        .transition
        .upserts
        .iter()
        .filter_map(|upsert| match upsert {
            openprogram_storage::Upsert::Wait(record) => {
                Some((record.wait_id, record.status, record.answer.clone()))
            }
            _ => None,
        })
        .collect();
    let changed: Vec<_> = machine
        .waits()
        .into_iter()
        .filter(|wait| !before_waits.contains(wait))
        .map(|wait| (wait.wait_id, wait.status, wait.answer.clone()))
        .collect();
    assert_eq!(written, changed, "{diverged}: wait records");
}

/// W-2, W-7, W-8 after a commit of `events`: a grant approves only while it stands (never once
/// revoked; a session's only at the version its record is at), and every outcome the provider
/// was told of is a wait a person resolved or a grant used (an expired wait tells it nothing).
pub(crate) fn check_waits_and_grants(
    machine: &Machine,
    log: &[Event],
    events: &[Event],
    session: &openprogram_storage::SessionRecord,
    revoked: &mut std::collections::HashSet<openprogram_storage::WaitId>,
    context: &str,
) {
    // W-7: a grant approves only while it stands: never once revoked, a session's only
    // at the version the session record is at.
    for event in events {
        match event {
            Event::GrantUsed {
                grant_id,
                session_version,
                ..
            } => {
                assert!(
                    !revoked.contains(grant_id),
                    "{context}: a revoked grant approved"
                );
                if let Some(version) = session_version {
                    assert_eq!(*version, session.version, "{context}: a stale session read");
                }
            }
            Event::ControlApplied {
                control: Control::Revoke { grant_id },
                ..
            } => {
                revoked.insert(*grant_id);
            }
            _ => {}
        }
    }
    // W-2, W-8: every answer the provider was told of is a wait answered by a person;
    // an expired wait never tells it anything.
    let told = machine
        .context
        .iter()
        .filter(|turn| matches!(turn, Turn::WaitResolved { .. }))
        .count();
    let resolved_by_people = machine
        .waits()
        .iter()
        .filter(|wait| {
            wait.live.is_none()
                && matches!(
                    wait.status,
                    openprogram_storage::WaitStatus::Answered
                        | openprogram_storage::WaitStatus::Declined
                )
        })
        .count();
    let granted = log
        .iter()
        .filter(|event| matches!(event, Event::GrantUsed { .. }))
        .count();
    if machine.is_complete() {
        assert_eq!(
            told,
            resolved_by_people + granted,
            "{context}: an outcome no person or grant gave"
        );
    }
}

/// The control a command's transition applied (its `ControlAccepted`, first).
pub(crate) fn control_of(events: &[Event]) -> Control {
    events
        .iter()
        .find_map(|event| match event {
            Event::ControlAccepted { control, .. } => Some(control.clone()),
            _ => None,
        })
        .unwrap_or(Control::Pause)
}

/// An answer that fits the request of `wait_id` (the simulation asks only `ok`, a boolean).
pub(crate) fn fitting_answer(machine: &Machine, wait_id: openprogram_storage::WaitId) -> String {
    match machine.wait(wait_id).and_then(|wait| wait.request.as_ref()) {
        Some(_) => r#"{"ok": true}"#.into(),
        None => "yes".into(),
    }
}

/// K-3 in every state the simulation reaches: a kind is offered exactly when
/// `decide_command` accepts it with valid arguments and the current version; any kind with
/// a stale version is refused as such. (Deciding is pure: a refusal changes nothing.)
pub(crate) fn check_capabilities(machine: &Machine, busy: bool, context: &str) {
    use crate::command::{CommandBody, CommandKind, EffectRef, ReconcileOutcome, WaitRef};
    let at = super::tests::at(machine, busy);
    let offered = machine.capabilities(&at);
    let wait = machine
        .present
        .waits
        .active
        .iter()
        .find(|wait| wait.status.is_pending())
        .map_or(WaitRef::Pending, |wait| WaitRef::Id(wait.wait_id));
    let process_id = machine
        .present
        .processes
        .iter()
        .find(|process| process.state == openprogram_storage::ProcessState::Running)
        .map_or_else(openprogram_storage::ProcessId::new, |process| {
            process.process_id
        });
    for kind in CommandKind::ALL {
        let body = match kind {
            CommandKind::Pause => CommandBody::Pause,
            CommandKind::Continue => CommandBody::Continue {
                policy: None,
                budget: None,
            },
            CommandKind::Step => CommandBody::Step,
            CommandKind::Steer => CommandBody::Steer { text: "s".into() },
            CommandKind::Cancel => CommandBody::Cancel,
            CommandKind::Fork => CommandBody::Fork { checkpoint: None },
            CommandKind::Retry => CommandBody::Retry,
            CommandKind::Answer => CommandBody::Answer {
                answer: match wait {
                    WaitRef::Id(wait_id) => fitting_answer(machine, wait_id),
                    WaitRef::Pending => "yes".into(),
                },
                wait,
                scope: openprogram_storage::AnswerScope::Operation,
            },
            CommandKind::Decline => CommandBody::Decline { wait },
            CommandKind::Reconcile => CommandBody::Reconcile {
                effect: EffectRef::Unresolved,
                outcome: ReconcileOutcome::Confirmed,
                text: "ok".into(),
            },
            CommandKind::StopProcess => CommandBody::StopProcess { process_id },
            CommandKind::SetPolicy => CommandBody::SetPolicy {
                policy: None,
                restart_window: Some(openprogram_storage::RestartWindow::Disabled),
            },
            CommandKind::Revoke => CommandBody::Revoke {
                grant_id: machine
                    .present
                    .waits
                    .grants
                    .iter()
                    .find(|grant| !grant.revoked)
                    .map_or_else(openprogram_storage::WaitId::new, |grant| grant.grant_id),
            },
        };
        let stale =
            machine.decide_command(CommandId::new(), body.clone(), Some(at.version + 1), &at);
        assert_eq!(
            stale.err().map(|rejection| rejection.code()),
            Some("version_conflict"),
            "{context}: a stale {kind}"
        );
        let decided = machine.decide_command(CommandId::new(), body, Some(at.version), &at);
        assert_eq!(
            decided.is_ok(),
            offered.contains(&kind),
            "{context}: {kind} offered {offered:?} but decided {decided:?} in {:?}",
            machine.status()
        );
    }
}
