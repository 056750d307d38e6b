//! Commands (K-1..K-5, W-2, P-2, R-8, K-2): where a command is accepted or refused
//! (`decide_command`), the controls offered now (`capabilities`), and how an applied control
//! changes the state (`apply_control`). Invariant (K-3, K-4): a stale version is refused
//! first, then every kind outside `capabilities`; a kind inside them at the current version
//! is refused only for its arguments (tests/it/k3_property.rs and the simulation check it).

use openprogram_storage::{CommandId, Control, Event, ExecutionState as Status};

use super::{
    cancelled, state_changed, Accepted, Action, CommandContext, CommandKind, Machine, Present,
    Refusal, Rejection, Turn, WaitState,
};
use crate::command::{CommandBody, EffectRef, WaitRef};

impl Machine {
    /// The controls this execution offers now (K-3): exactly the kinds `decide_command`
    /// accepts with valid arguments and the current version.
    pub fn capabilities(&self, at: &CommandContext) -> Vec<CommandKind> {
        let (run, waits) = (&self.present.run, &self.present.waits);
        let mut kinds = self.present.control_capabilities();
        if self.present.function.is_some() {
            kinds.retain(|kind| !for_agents_only(*kind));
        }
        let live = |wait: &WaitState| wait.live.is_some() && wait.status.is_pending();
        // K-7: its restart window (and a function's version policy), while it runs or a
        // control can make it run again.
        let runs_again = kinds.iter().any(|kind| {
            use CommandKind::*;
            matches!(kind, Pause | Continue | Step | Answer | Decline | Reconcile)
        });
        let asks = waits.active.iter().any(live);
        if (runs_again || asks) && !self.status().is_terminal() && !run.cancel_requested {
            kinds.push(CommandKind::SetPolicy);
        }
        if waits.active.iter().any(live) && !run.cancel_requested {
            for kind in [CommandKind::Answer, CommandKind::Decline] {
                if !kinds.contains(&kind) {
                    kinds.push(kind);
                }
            }
        }
        // W-7: a grant it gave can be revoked whatever the execution's state.
        if waits.has_grant(at.session.as_deref()) {
            kinds.push(CommandKind::Revoke);
        }
        // A process has its own control, whatever the execution's state (P-2).
        if self.present.running_processes().next().is_some() {
            kinds.push(CommandKind::StopProcess);
        }
        // K-2: new child executions of the same program; the original is untouched. Not of
        // a spawned child (K-3): its result belongs to its caller's call.
        if self.revision_loadable(at) && self.spawned_by().is_none() {
            if self.has_fork_point() {
                kinds.push(CommandKind::Fork);
            }
            if self.status().is_terminal() {
                kinds.push(CommandKind::Retry);
            }
        }
        kinds
    }

    /// K-3: the agent whose call started this function execution, if one did.
    fn spawned_by(&self) -> Option<openprogram_storage::ExecutionId> {
        self.present.function.as_ref()?.input.called_by
    }

    /// Whether a child of this execution would run the program it ran (K-2). An execution
    /// with no recorded revision (a machine built in a test) is taken as current.
    fn revision_loadable(&self, at: &CommandContext) -> bool {
        let revision = self.present.turn.revision_id;
        revision.is_none_or(|revision| at.contract.runs(self.present.kind(), revision))
    }

    /// The one decision on a command: the version it was sent against, whether its kind is
    /// offered now (K-3), and its arguments. Nothing is written for a refusal.
    pub fn decide_command(
        &self,
        command_id: CommandId,
        body: CommandBody,
        expected_version: Option<u64>,
        at: &CommandContext,
    ) -> Result<Accepted, Rejection> {
        self.accept(command_id, body, expected_version, at)
            .map_err(|refusal| Rejection {
                refusal,
                capabilities: self.capabilities(at),
            })
    }

    /// `decide_command` but for the controls a refusal offers.
    fn accept(
        &self,
        command_id: CommandId,
        body: CommandBody,
        expected_version: Option<u64>,
        at: &CommandContext,
    ) -> Result<Accepted, Refusal> {
        if let Some(expected) = expected_version.filter(|expected| *expected != at.version) {
            return Err(Refusal::StaleVersion {
                expected,
                current: at.version,
            });
        }
        let kind = body.kind();
        if !self.capabilities(at).contains(&kind) {
            return Err(self.why_not(kind, at));
        }
        let control = match body {
            CommandBody::Fork { checkpoint } => {
                let checkpoint_seq = self.fork_point(checkpoint)?;
                return Ok(Accepted::Fork { checkpoint_seq });
            }
            CommandBody::Retry => return Ok(Accepted::Retry),
            CommandBody::Pause => Control::Pause,
            CommandBody::Continue { policy, budget } => {
                let mut events = Vec::new();
                if let Some(policy) = policy {
                    // F-3, K-7: the policy first, in the same transition; a policy is a
                    // function's.
                    if self.present.function.is_none() {
                        let kind = CommandKind::SetPolicy;
                        return Err(Refusal::FunctionsOnly { kind });
                    }
                    let control = Control::SetPolicy { policy };
                    events.push(Event::ControlApplied {
                        command_id,
                        control,
                    });
                }
                // J-1: a Job continues only with budget left (raised here, if need be).
                events.extend(self.decide_budget(budget, at.now_ms)?);
                events.extend(self.decide_control(command_id, Control::Continue, at)?);
                let control = Control::Continue;
                return Ok(Accepted::Control { control, events });
            }
            CommandBody::Step => {
                self.decide_budget(None, at.now_ms)?;
                Control::Step
            }
            CommandBody::Steer { text } => Control::Steer { text },
            CommandBody::Cancel => Control::Cancel,
            CommandBody::Answer {
                wait,
                answer,
                scope,
            } => Control::Answer {
                wait_id: self.wait_named(wait)?,
                answer,
                scope,
            },
            CommandBody::Decline { wait } => Control::Decline {
                wait_id: self.wait_named(wait)?,
            },
            CommandBody::Reconcile {
                effect,
                outcome,
                text,
            } => Control::Reconcile {
                effect_id: match (effect, &self.present.calls.unresolved) {
                    (EffectRef::Id(effect_id), _) => effect_id,
                    (EffectRef::Unresolved, Some(unresolved)) => unresolved.effect_id,
                    // Offered only while an effect awaits reconciliation (K-3).
                    (EffectRef::Unresolved, None) => return Err(self.why_not(kind, at)),
                },
                status: outcome.status(),
                output: text,
            },
            CommandBody::StopProcess { process_id } => Control::StopProcess { process_id },
            CommandBody::SetPolicy {
                policy,
                restart_window,
            } => match (policy, restart_window) {
                // F-3: a version policy is a function's.
                (Some(_), _) if self.present.function.is_none() => {
                    return Err(Refusal::FunctionsOnly { kind });
                }
                (Some(policy), None) => Control::SetPolicy { policy },
                (version_policy, Some(restart_window)) => Control::SetExecutionPolicy {
                    version_policy,
                    restart_window,
                },
                // The body is read with one of them at least (`command.rs`).
                (None, None) => return Err(self.why_not(kind, at)),
            },
            CommandBody::Revoke { grant_id } => Control::Revoke { grant_id },
        };
        let events = self.decide_control(command_id, control.clone(), at)?;
        Ok(Accepted::Control { control, events })
    }

    /// A command of a kind the execution does not offer now: the most specific reason.
    fn why_not(&self, kind: CommandKind, at: &CommandContext) -> Refusal {
        if let (CommandKind::Fork | CommandKind::Retry, Some(caller)) = (kind, self.spawned_by()) {
            return Refusal::SpawnedChild { kind, caller };
        }
        match kind {
            _ if self.present.function.is_some() && for_agents_only(kind) => {
                Refusal::NotForFunctions { kind }
            }
            CommandKind::Fork | CommandKind::Retry if !self.revision_loadable(at) => {
                Refusal::RevisionChanged { kind }
            }
            CommandKind::Fork => Refusal::NoForkPoint,
            CommandKind::Step
                if self.present.budget_spent() && !self.present.run.cancel_requested =>
            {
                let job = self.present.job.as_ref().expect("a Job's budget");
                Refusal::BudgetExhausted {
                    steps_used: job.steps_used,
                    wall_used_ms: job.wall_used_ms,
                }
            }
            CommandKind::StopProcess | CommandKind::Retry | CommandKind::Revoke => {
                Refusal::NotAvailable {
                    kind,
                    state: self.status(),
                }
            }
            _ if self.present.run.cancel_requested => Refusal::Cancelling { kind },
            _ => Refusal::NotAvailable {
                kind,
                state: self.status(),
            },
        }
    }

    /// The wait an answer or decline names.
    fn wait_named(&self, wait: WaitRef) -> Result<openprogram_storage::WaitId, Refusal> {
        match wait {
            WaitRef::Id(wait_id) => Ok(wait_id),
            WaitRef::Pending => {
                let pending = self.present.waits.pending_wait();
                pending
                    .map(|wait| wait.wait_id)
                    .ok_or(Refusal::NoPendingWait)
            }
        }
    }

    /// The events of a control whose kind is offered now (checked by `decide_command`).
    fn decide_control(
        &self,
        command_id: CommandId,
        control: Control,
        at: &CommandContext,
    ) -> Result<Vec<Event>, Refusal> {
        let (busy, kind) = (at.busy, control.kind());
        // K-2: a person who makes it run again (a Continue, a Step, an answer, a reconcile)
        // under another contract than it ran under approves this one: it runs under it from
        // here, and a later restart does not hold it again.
        let execution_kind = self.present.kind();
        let adopted = (self.present.turn.revision_id)
            .filter(|revision| !at.contract.runs(execution_kind, *revision))
            .map(|_| Event::ContractAdopted {
                revision_id: at.contract.revision,
            });
        match control {
            Control::Answer { .. } | Control::Decline { .. } => {
                let mut events = self.decide_wait_control(command_id, control, at.now_ms)?;
                events.extend(adopted);
                return Ok(events);
            }
            Control::StopProcess { process_id } => {
                return self.decide_stop_process(command_id, process_id)
            }
            Control::Revoke { grant_id } => {
                return self.present.waits.decide_revoke(
                    command_id,
                    grant_id,
                    at.session.as_deref(),
                )
            }
            _ => {}
        }
        let applied = Event::ControlApplied {
            command_id,
            control: control.clone(),
        };
        let mut events = vec![applied];
        if matches!(
            control,
            Control::Continue | Control::Step | Control::Reconcile { .. }
        ) {
            events.extend(adopted);
        }
        match control {
            Control::Pause if !busy || self.status() == Status::Queued => {
                events.push(state_changed(Status::Paused, "pause"));
            }
            Control::Pause | Control::Steer { .. } => {}
            Control::Continue if self.status() == Status::Running => {}
            // W-8: a wait that expired is opened again, as a fresh wait.
            // C-2: a foreground turn that no longer holds its session waits for it again.
            Control::Continue | Control::Step => match self.reopened_wait(command_id, at.now_ms) {
                Some(reopened) => events.extend(reopened),
                None => events.push(
                    self.requeued_for_session(at.holds_session)
                        .unwrap_or(state_changed(self.present.run_state(), kind)),
                ),
            },
            Control::Cancel if busy => {
                events.extend(self.invalidate_waits(|_| true));
                events.push(state_changed(Status::Cancelling, "cancel"));
            }
            Control::Cancel => {
                events.extend(self.invalidate_waits(|_| true));
                events.push(cancelled());
            }
            Control::Reconcile {
                effect_id,
                status,
                ref output,
            } => events.extend(self.decide_reconcile(effect_id, status, output)?),
            // A policy change starts nothing (K-7): the next run of the body reads it.
            Control::Answer { .. }
            | Control::Decline { .. }
            | Control::StopProcess { .. }
            | Control::SetPolicy { .. }
            | Control::SetExecutionPolicy { .. }
            | Control::Revoke { .. } => {}
        }
        Ok(events)
    }

    /// The history an applied control adds: a reconciled effect's receipt and result, a
    /// durable wait's outcome. Read before the present folds it.
    pub(crate) fn record_control(&mut self, control: &Control) {
        match control {
            Control::Reconcile {
                effect_id,
                status,
                output,
            } => self.record_reconcile(*effect_id, *status, output),
            Control::Answer { .. } | Control::Decline { .. } => self.record_wait_control(control),
            // E-8: a steer stands where it arrived among the turns the model is shown.
            Control::Steer { text } => {
                std::sync::Arc::make_mut(&mut self.context).push(Turn::Steer { text: text.clone() })
            }
            _ => {}
        }
    }
}

impl Present {
    /// The controls its state offers, before what its waits, grants, processes and saved
    /// points add.
    fn control_capabilities(&self) -> Vec<CommandKind> {
        use CommandKind::*;
        if self.run.cancel_requested {
            return Vec::new();
        }
        match self.status() {
            Status::Queued => vec![Pause, Steer, Cancel],
            Status::Running if self.run.pause_requested => vec![Continue, Steer, Cancel],
            Status::Running => vec![Pause, Steer, Cancel],
            // A Job whose queue deadline passed ended there: it never ran (J-1).
            Status::Expired if self.job.as_ref().is_some_and(|job| job.expired_in_queue) => {
                vec![Cancel]
            }
            // A Job whose budget is spent continues only with more (Continue's `budget`):
            // a Step has none to give (J-1).
            Status::Paused | Status::Expired if self.budget_spent() => {
                vec![Continue, Steer, Cancel]
            }
            // Expiry keeps everything for a manual Continue.
            Status::Paused | Status::Expired => vec![Continue, Step, Steer, Cancel],
            // Reconcile resolves the effect awaiting it: none, nothing to reconcile.
            Status::ReconciliationRequired if self.calls.unresolved.is_some() => {
                vec![Reconcile, Cancel]
            }
            Status::ReconciliationRequired => vec![Cancel],
            Status::Waiting => vec![Answer, Decline, Steer, Cancel],
            Status::Cancelling | Status::Cancelled | Status::Completed | Status::Failed => {
                Vec::new()
            }
        }
    }

    /// A command's events: accepted (its decision pending), rejected, or applied.
    pub(crate) fn fold_command(&mut self, event: &Event, seq: u64, actions: &mut Vec<Action>) {
        match event {
            Event::ControlAccepted {
                command_id,
                control,
            } => {
                self.waits.answer_submitted(control);
                self.run.accepted(*command_id, control.clone());
            }
            // Written before `ControlAccepted` existed: the payload-free controls can still
            // be decided from their kind.
            Event::CommandAccepted { command_id, kind } => {
                let control = match kind.as_str() {
                    "pause" => Control::Pause,
                    "continue" => Control::Continue,
                    "step" => Control::Step,
                    "cancel" => Control::Cancel,
                    _ => return,
                };
                self.run.accepted(*command_id, control);
            }
            Event::CommandRejected { command_id, .. } => {
                self.answer_rejected(*command_id);
                self.run.decided(*command_id);
            }
            Event::ControlApplied {
                command_id,
                control,
            } => {
                self.run.decided(*command_id);
                self.apply_control(control, seq, actions);
            }
            _ => {}
        }
    }

    fn apply_control(&mut self, control: &Control, seq: u64, actions: &mut Vec<Action>) {
        match control {
            Control::Pause => self.run.pause_requested = true,
            Control::Continue => {
                self.run.pause_requested = false;
                self.run.steps_left = None;
            }
            Control::Step => {
                self.run.pause_requested = false;
                self.run.steps_left = Some(1);
            }
            Control::Steer { text } => self.run.steers.push(text.clone()),
            Control::Cancel => {
                self.run.cancel_requested = true;
                actions.push(Action::AbortEffect);
            }
            Control::Reconcile {
                effect_id, status, ..
            } => self.apply_reconcile(*effect_id, *status, seq, actions),
            Control::Answer { .. } | Control::Decline { .. } => {
                self.waits.note_approval(control);
                self.waits.apply_wait_control(control);
            }
            Control::Revoke { grant_id } => self.waits.apply_revoke(*grant_id),
            Control::StopProcess { process_id } => actions.push(Action::StopProcess {
                process_id: *process_id,
            }),
            Control::SetPolicy { policy } => {
                if let Some(function) = &mut self.function {
                    function.policy = *policy;
                }
            }
            Control::SetExecutionPolicy {
                version_policy,
                restart_window,
            } => {
                if let (Some(function), Some(policy)) = (&mut self.function, version_policy) {
                    function.policy = *policy;
                }
                self.run.restart_window = Some(*restart_window);
            }
        }
    }
}

/// The kinds a durable function's execution never takes (yet): see `Refusal::NotForFunctions`.
fn for_agents_only(kind: CommandKind) -> bool {
    kind == CommandKind::Steer
}
