//! Control commands (K-1..K-5): what a Pause, Continue, Step, Steer, Cancel or Reconcile
//! decides (`decide_control`) and how an applied one changes the state (`apply_control`).
//! Answers, declines and process stops are in `machine_waits.rs`. Part of the pure state
//! machine (`machine.rs`).

use openprogram_storage::{Control, Event, ExecutionState as Status};

use super::machine::{cancelled, Action, Machine, Rejection};

impl Machine {
    pub(super) fn decide_control(
        &self,
        command_id: openprogram_storage::CommandId,
        control: Control,
        busy: bool,
    ) -> Result<Vec<Event>, Rejection> {
        let kind = control.kind();
        match control {
            Control::Answer { .. } | Control::Decline { .. } => {
                return self.decide_wait_control(command_id, control)
            }
            Control::StopProcess { process_id } => {
                return self.decide_stop_process(command_id, process_id)
            }
            _ => {}
        }
        if self.cancel_requested {
            return match control {
                Control::Cancel => Err(self.reject("the execution is already being cancelled")),
                _ => Err(self.reject(format!("{kind} is refused: cancellation takes precedence"))),
            };
        }
        if !self.capabilities().contains(&kind) {
            return Err(self.reject(format!(
                "{kind} is not available while the execution is {}",
                self.status()
            )));
        }
        let applied = Event::ControlApplied {
            command_id,
            control: control.clone(),
        };
        let mut events = vec![applied];
        match control {
            Control::Pause if !busy || self.status() == Status::Queued => {
                events.push(Event::StateChanged {
                    state: Status::Paused,
                    reason: "pause".into(),
                });
            }
            Control::Pause | Control::Steer { .. } => {}
            Control::Continue if self.status() == Status::Running => {}
            Control::Continue | Control::Step => {
                events.push(Event::StateChanged {
                    state: Status::Running,
                    reason: kind.into(),
                });
            }
            Control::Cancel if busy => {
                events.extend(self.invalidate_waits(|_| true));
                events.push(Event::StateChanged {
                    state: Status::Cancelling,
                    reason: "cancel".into(),
                });
            }
            Control::Cancel => {
                events.extend(self.invalidate_waits(|_| true));
                events.push(cancelled());
            }
            Control::Reconcile {
                effect_id, status, ..
            } => events.extend(self.decide_reconcile(effect_id, status)?),
            Control::Answer { .. } | Control::Decline { .. } | Control::StopProcess { .. } => {}
        }
        Ok(events)
    }

    pub(super) fn apply_control(&mut self, control: &Control, actions: &mut Vec<Action>) {
        match control {
            Control::Pause => self.pause_requested = true,
            Control::Continue => {
                self.pause_requested = false;
                self.steps_left = None;
            }
            Control::Step => {
                self.pause_requested = false;
                self.steps_left = Some(1);
            }
            Control::Steer { text } => self.steers.push(text.clone()),
            Control::Cancel => {
                self.cancel_requested = true;
                actions.push(Action::AbortEffect);
            }
            Control::Reconcile {
                effect_id,
                status,
                output,
            } => self.apply_reconcile(*effect_id, *status, output),
            Control::Answer { .. } | Control::Decline { .. } => self.apply_wait_control(control),
            Control::StopProcess { process_id } => actions.push(Action::StopProcess {
                process_id: *process_id,
            }),
        }
    }
}
