//! The execution's side of its managed processes (P-1, P-2): starting one for a running
//! call, committing what its process actor reports, and forwarding `stop_process`. Every
//! process record change is a transition of the execution, the only writer of its version.

use actix::prelude::*;
use futures::channel::oneshot;
use openprogram_storage::{Event, ProcessId, ProcessRecord, ProcessState, Upsert};

use crate::call::{StartProcess, StartedProcess};
use crate::error::Error;
use crate::execution::actor::{after_commit, answer, ExecutionActor};
use crate::machine::process_changed;
use crate::process::{os, ProcessActor, ProcessProgress, Stop};

impl Handler<StartProcess> for ExecutionActor {
    type Result = AtomicResponse<Self, Result<StartedProcess, String>>;

    fn handle(&mut self, message: StartProcess, _ctx: &mut Context<Self>) -> Self::Result {
        let _span = self.enter();
        let running_call = self.machine.present.calls.pending_effect() == Some(message.effect_id);
        let live = self.epoch.is_some() && !self.machine.present.run.cancel_requested;
        if !live || !running_call || self.env.lifecycle.is_stopping() {
            return answer(Err(
                "only a running call of a live attempt may start a process".into(),
            ));
        }
        let spawned = match os::spawn(&message.program, &message.args) {
            Ok(spawned) => spawned,
            Err(error) => {
                return answer(Err(format!("cannot start `{}`: {error}", message.program)))
            }
        };
        // B14: an OS process spawned, its identity not yet persisted.
        openprogram_storage::failpoint!("B14");
        let identity = spawned.signaller.identity();
        let process_id = ProcessId::new();
        let record = ProcessRecord {
            process_id,
            execution_id: self.execution_id,
            attempt_id: self.lease.attempt_id,
            owner_id: self.env.owner,
            program: message.program,
            args: message.args,
            os_pid: Some(identity.pid),
            os_start_time: Some(identity.start_time),
            state: ProcessState::Running,
            exit_code: None,
            output_bytes: 0,
            output_chunks: Vec::new(),
        };
        let events = vec![process_changed(process_id, ProcessState::Running)];
        let committed = self.commit(events, vec![Upsert::Process(record.clone())]);
        AtomicResponse::new(Box::pin(committed.map(move |committed, act, _ctx| {
            if let Err(error) = committed {
                // Unrecorded, it could never be stopped or listed: end it now.
                let _ = spawned.signaller.send(os::StopSignal::Kill);
                return Err(format!("recording the process failed: {error}"));
            }
            let (sender, exit) = oneshot::channel();
            let host = std::sync::Arc::clone(&act.env);
            let addr = crate::mailbox::Mailbox::start_with(|mailbox| {
                ProcessActor::new(host, record, spawned, sender, mailbox)
            });
            act.env.processes.insert(process_id, addr);
            Ok(StartedProcess { process_id, exit })
        })))
    }
}

impl Handler<ProcessProgress> for ExecutionActor {
    type Result = AtomicResponse<Self, Result<(), Error>>;

    fn handle(&mut self, progress: ProcessProgress, ctx: &mut Context<Self>) -> Self::Result {
        let _span = self.enter();
        let process_id = progress.record.process_id;
        let running = self.machine.present.processes.iter().any(|process| {
            process.process_id == process_id && process.state == ProcessState::Running
        });
        let mut events = Vec::new();
        if progress.record.output_bytes != progress.previous_bytes {
            events.push(Event::ProcessOutput {
                process_id,
                output_bytes: progress.record.output_bytes,
            });
        }
        if progress.state_changed {
            events.push(process_changed(process_id, progress.record.state));
        }
        if !running || events.is_empty() {
            // Its end is recorded already: a late report of its output changes nothing. An
            // execution activated only for it releases again.
            self.park_if_idle(ctx);
            return answer(Ok(()));
        }
        let upserts = vec![
            Upsert::Blob(progress.blob),
            Upsert::Process(progress.record),
        ];
        AtomicResponse::new(Box::pin(self.commit(events, upserts).map(
            |committed, act, ctx| {
                // An execution activated only for this (parked, finished) releases again.
                act.park_if_idle(ctx);
                committed.map(|_| ())
            },
        )))
    }
}

impl ExecutionActor {
    /// An applied `stop_process`: the process actor stops it (SIGTERM, then SIGKILL). With
    /// no actor (its end could not be recorded), it is recorded `lost`: nothing is
    /// signalled that this runtime does not hold.
    pub(super) fn stop_process(&mut self, process_id: ProcessId, ctx: &mut Context<Self>) {
        match self.env.processes.get(process_id) {
            Some(addr) => addr.do_send(Stop),
            None => {
                self.recording_lost += 1;
                ctx.notify(RecordLost(process_id));
            }
        }
    }
}

/// A process of this execution has no actor any more: record it `lost`.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct RecordLost(ProcessId);

impl Handler<RecordLost> for ExecutionActor {
    type Result = AtomicResponse<Self, ()>;

    fn handle(
        &mut self,
        RecordLost(process_id): RecordLost,
        ctx: &mut Context<Self>,
    ) -> Self::Result {
        if after_commit(ctx, RecordLost(process_id)).is_none() {
            return answer(());
        }
        self.recording_lost = self.recording_lost.saturating_sub(1);
        let record = match self.env.store.process(process_id) {
            Ok(Some(record)) if record.state == ProcessState::Running => record,
            _ => {
                self.park_if_idle(ctx);
                return answer(());
            }
        };
        tracing::warn!(execution_id = %self.execution_id, %process_id, "a running process has no actor; recorded lost");
        let events = vec![process_changed(process_id, ProcessState::Lost)];
        let upsert = Upsert::Process(ProcessRecord {
            state: ProcessState::Lost,
            ..record
        });
        AtomicResponse::new(Box::pin(self.commit(events, vec![upsert]).map(
            |committed, act, ctx| {
                if let Err(error) = committed {
                    tracing::error!(execution_id = %act.execution_id, %error, "recording a lost process failed");
                }
                act.park_if_idle(ctx);
            },
        )))
    }
}
