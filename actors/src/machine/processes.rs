//! The pure machine's rules for managed processes (P-1, P-2): each is tracked by its id,
//! state and output so far, and `stop_process` is its own control, offered whatever the
//! execution's state. The shell's side (starting them, forwarding a stop) is `processes.rs`.

use openprogram_storage::{CommandId, Control, Event, ProcessId, ProcessState as ProcState};

use crate::machine::{Machine, ManagedProcess, Present, Refusal};

impl Machine {
    /// P-2: a running process of this execution can be stopped in any execution state.
    pub(crate) fn decide_stop_process(
        &self,
        command_id: CommandId,
        process_id: ProcessId,
    ) -> Result<Vec<Event>, Refusal> {
        match self.present.process(process_id) {
            Some(process) if process.state == ProcState::Running => {
                Ok(vec![Event::ControlApplied {
                    command_id,
                    control: Control::StopProcess { process_id },
                }])
            }
            Some(process) => Err(Refusal::ProcessEnded {
                process_id,
                state: process.state.as_str(),
            }),
            None => Err(Refusal::UnknownProcess { process_id }),
        }
    }
}

impl Present {
    /// Its managed processes still running.
    pub fn running_processes(&self) -> impl Iterator<Item = &ManagedProcess> {
        let running = |process: &&ManagedProcess| process.state == ProcState::Running;
        self.processes.iter().filter(running)
    }

    /// A process's events: its state changed (the first change lists it), or its output grew.
    pub(crate) fn fold_process(&mut self, event: &Event) {
        match event {
            Event::ProcessChanged { process_id, state } => {
                let state = ProcState::parse(state).unwrap_or(ProcState::Lost);
                match self.process_mut(*process_id) {
                    Some(process) => process.state = state,
                    None => self.processes.push(ManagedProcess {
                        process_id: *process_id,
                        state,
                        output_bytes: 0,
                    }),
                }
            }
            Event::ProcessOutput {
                process_id,
                output_bytes,
            } => {
                if let Some(process) = self.process_mut(*process_id) {
                    process.output_bytes = *output_bytes;
                }
            }
            _ => {}
        }
    }

    /// The managed process `process_id` of this execution.
    pub fn process(&self, process_id: ProcessId) -> Option<&ManagedProcess> {
        self.processes
            .iter()
            .find(|process| process.process_id == process_id)
    }

    fn process_mut(&mut self, process_id: ProcessId) -> Option<&mut ManagedProcess> {
        let mut processes = self.processes.iter_mut();
        processes.find(|process| process.process_id == process_id)
    }
}
