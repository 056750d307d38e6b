//! Managed processes as actors (P-1..P-3). A tool call (the built-in `shell`) asks its
//! execution to start an OS command; the execution records it (identity, owner execution
//! and attempt, pid and its start time) and starts a `ProcessActor` that owns it:
//!
//! - output goes into a bounded ring (the tail) with a count of every byte; the tail is
//!   persisted as a blob with the process record about once a second and at the end;
//! - `Stop` (the `stop_process` command of the owning execution) sends SIGTERM to the
//!   process group, then SIGKILL after the grace period — only through a pidfd or a
//!   verified identity, never to a bare pid (`os.rs`, P-3);
//! - at exit it records `exited` (or `stopped`) with the exit code, tells the call that
//!   started it, and stops.
//!
//! Every record change goes through the owning execution's actor (`ProcessProgress`), the
//! only writer of its version. Cancel of the execution does not stop a process (P-2).

pub mod os;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use actix::prelude::*;
use futures::channel::oneshot;
use openprogram_storage::{Blob, ProcessId, ProcessRecord, ProcessState};

use crate::call::ProcessExit;
use crate::mailbox::Mailbox;

/// The output tail kept in memory and persisted (P-1: bounded, whatever the process prints).
pub const OUTPUT_TAIL_BYTES: usize = 64 * 1024;

/// How often a running process's output count and tail are persisted. Each persist is a
/// transition of the owning execution (a parked one is activated for it), so it is rare;
/// readers of a live process get its current count and tail from this actor.
const PERSIST_EVERY: Duration = Duration::from_secs(10);

/// Tries to record a process's end before giving up (it is then recorded `lost` at the
/// next start), with a doubling pause from 50 ms.
const FINISH_ATTEMPTS_MAX: u32 = 10;

/// After the process exits, how long its output pipes may stay open (held by a child it
/// left behind) before the tail is taken as final.
const OUTPUT_DRAIN: Duration = Duration::from_secs(2);

/// Default time between SIGTERM and SIGKILL for `stop_process`.
pub const STOP_GRACE_DEFAULT: Duration = Duration::from_secs(5);

/// A process actor's report: its output so far, or its end (`state_changed`).
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<(), crate::error::Error>")]
pub struct ProcessProgress {
    pub record: ProcessRecord,
    pub blob: Blob,
    pub state_changed: bool,
    pub previous_bytes: u64,
}

/// The live process actors of a runtime, by process id.
#[derive(Debug, Default)]
pub struct Processes {
    live: Mutex<HashMap<ProcessId, Mailbox<ProcessActor>>>,
}

impl Processes {
    pub fn get(&self, process_id: ProcessId) -> Option<Mailbox<ProcessActor>> {
        self.lock().get(&process_id).cloned()
    }

    pub fn all(&self) -> Vec<(ProcessId, Mailbox<ProcessActor>)> {
        self.lock()
            .iter()
            .map(|(id, addr)| (*id, addr.clone()))
            .collect()
    }

    pub(crate) fn insert(&self, process_id: ProcessId, addr: Mailbox<ProcessActor>) {
        self.lock().insert(process_id, addr);
    }

    pub(crate) fn remove(&self, process_id: ProcessId) {
        self.lock().remove(&process_id);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ProcessId, Mailbox<ProcessActor>>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What a process actor needs of its runtime, given by the execution that starts it (so
/// this module imports no runtime type): where its progress goes, its registry, the grace
/// between SIGTERM and SIGKILL.
pub trait ProcessHost: Send + Sync {
    /// The live actor of the execution the process reports to, activated if parked.
    fn progress_to(
        &self,
        execution_id: openprogram_storage::ExecutionId,
    ) -> crate::Result<crate::mailbox::CountedRecipient<ProcessProgress>>;
    /// The process ended: it leaves the registry of live processes.
    fn ended(&self, process_id: ProcessId);
    fn stop_grace(&self) -> Duration;
}

/// The actor owning one running OS process.
pub struct ProcessActor {
    host: Arc<dyn ProcessHost>,
    /// The record as last sent for persistence.
    record: ProcessRecord,
    signaller: os::Signaller,
    child: Option<tokio::process::Child>,
    /// Filled by the output reader, read here: shared so no chunk waits in a mailbox.
    ring: Arc<Mutex<os::OutputRing>>,
    exit_code: Option<i32>,
    output_closed: bool,
    stop_requested: bool,
    /// A persist is in flight; the next tick skips.
    persisting: bool,
    finishing: bool,
    exit_watcher: Option<oneshot::Sender<ProcessExit>>,
    handled: u64,
    mailbox: crate::mailbox::Depth,
}

impl std::fmt::Debug for ProcessActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessActor")
            .field("process_id", &self.record.process_id)
            .field("state", &self.record.state)
            .finish()
    }
}

impl ProcessActor {
    pub(crate) fn new(
        host: Arc<dyn ProcessHost>,
        record: ProcessRecord,
        spawned: os::Spawned,
        exit_watcher: oneshot::Sender<ProcessExit>,
        mailbox: crate::mailbox::Depth,
    ) -> Self {
        Self {
            host,
            record,
            signaller: spawned.signaller,
            child: Some(spawned.child),
            ring: Arc::new(Mutex::new(os::OutputRing::new(OUTPUT_TAIL_BYTES))),
            exit_code: None,
            output_closed: false,
            stop_requested: false,
            persisting: false,
            finishing: false,
            exit_watcher: Some(exit_watcher),
            handled: 0,
            mailbox,
        }
    }

    fn totals(&self) -> (u64, Vec<u8>) {
        let ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        (ring.total(), ring.tail())
    }

    /// The record now, with the tail as a blob.
    fn current(&self, state: ProcessState) -> (ProcessRecord, Blob) {
        let (total, tail) = self.totals();
        let blob = Blob::new(tail);
        let mut record = self.record.clone();
        record.state = state;
        record.exit_code = self.exit_code;
        record.output_bytes = total;
        record.output_chunks = vec![blob.hash()];
        (record, blob)
    }

    /// Sends the record to the owning execution to commit, if anything changed.
    fn persist(&mut self, ctx: &mut Context<Self>) {
        if self.persisting || self.finishing {
            return;
        }
        let (record, blob) = self.current(ProcessState::Running);
        if record.output_bytes == self.record.output_bytes {
            return;
        }
        self.persisting = true;
        let sent = self.send_progress(record.clone(), blob, false);
        ctx.spawn(
            fut::wrap_future::<_, Self>(sent).map(move |result, act, _ctx| {
                act.persisting = false;
                match result {
                    Ok(()) => act.record = record,
                    Err(error) => {
                        tracing::warn!(process_id = %act.record.process_id, %error, "persisting process output failed")
                    }
                }
            }),
        );
    }

    fn send_progress(
        &self,
        record: ProcessRecord,
        blob: Blob,
        state_changed: bool,
    ) -> impl std::future::Future<Output = crate::Result<()>> + 'static {
        let host = Arc::clone(&self.host);
        let previous_bytes = self.record.output_bytes;
        async move {
            let progress = ProcessProgress {
                record,
                blob,
                state_changed,
                previous_bytes,
            };
            // A parked execution is activated for it; one that parks meanwhile, again.
            for _ in 0..4 {
                let to = host.progress_to(progress.record.execution_id)?;
                match to.send(progress.clone()).await {
                    Ok(result) => return result,
                    Err(actix::MailboxError::Closed) => continue,
                    Err(error) => return Err(crate::Error::Unavailable(error.to_string())),
                }
            }
            Err(crate::Error::Unavailable(
                "the owning execution kept stopping".into(),
            ))
        }
    }

    /// Once the process exited and its output ended: record the end, tell the call, stop.
    fn finish_if_done(&mut self, ctx: &mut Context<Self>) {
        if self.finishing || self.exit_code.is_none() || !self.output_closed {
            return;
        }
        self.finishing = true;
        let state = if self.stop_requested {
            ProcessState::Stopped
        } else {
            ProcessState::Exited
        };
        let (record, blob) = self.current(state);
        let exit = ProcessExit {
            process_id: record.process_id,
            state,
            exit_code: record.exit_code,
            output_bytes: record.output_bytes,
            output_tail: String::from_utf8_lossy(blob.bytes()).into_owned(),
        };
        self.record_end(record, blob, exit, 1, ctx);
    }

    /// Commits the end, retrying while the owning execution's actor is busy elsewhere
    /// (parked meanwhile, taken over, stopping); then tells the call and stops.
    fn record_end(
        &mut self,
        record: ProcessRecord,
        blob: Blob,
        exit: ProcessExit,
        attempt: u32,
        ctx: &mut Context<Self>,
    ) {
        let sent = self.send_progress(record.clone(), blob.clone(), true);
        ctx.wait(fut::wrap_future::<_, Self>(sent).map(move |result, act, ctx| {
            match result {
                Ok(()) => {}
                Err(error) if attempt < FINISH_ATTEMPTS_MAX => {
                    tracing::warn!(process_id = %act.record.process_id, %error, attempt, "recording the end of a process failed; retrying");
                    let pause = Duration::from_millis(50 << attempt.min(6));
                    ctx.run_later(pause, move |act, ctx| {
                        act.record_end(record, blob, exit, attempt + 1, ctx)
                    });
                    return;
                }
                Err(error) => {
                    // The next start records it lost: its end is not on record.
                    tracing::error!(process_id = %act.record.process_id, %error, "recording the end of a process failed");
                }
            }
            if let Some(watcher) = act.exit_watcher.take() {
                let _ = watcher.send(exit);
            }
            act.host.ended(act.record.process_id);
            ctx.stop();
        }));
    }

    fn signal(&self, signal: os::StopSignal) {
        match self.signaller.send(signal) {
            Ok(()) | Err(os::SignalError::Gone) => {}
            Err(error) => {
                tracing::error!(process_id = %self.record.process_id, %error, "not signalled")
            }
        }
    }
}

crate::mailbox::counted_mailbox!(ProcessActor);

impl Actor for ProcessActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        let ring = Arc::clone(&self.ring);
        let reading = os::read_output(stdout, stderr, move |chunk| {
            ring.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(chunk)
        });
        ctx.spawn(
            fut::wrap_future::<_, Self>(reading).map(|result, act, ctx| {
                if let Err(error) = result {
                    tracing::warn!(process_id = %act.record.process_id, %error, "reading process output failed");
                }
                act.output_closed = true;
                act.finish_if_done(ctx);
            }),
        );
        ctx.spawn(
            fut::wrap_future::<_, Self>(async move { child.wait().await }).map(
                |status, act, ctx| {
                    act.exit_code = Some(status.map_or(-1, os::exit_code));
                    if !act.output_closed {
                        ctx.run_later(OUTPUT_DRAIN, |act, ctx| {
                            act.output_closed = true;
                            act.finish_if_done(ctx);
                        });
                    }
                    act.finish_if_done(ctx);
                },
            ),
        );
        ctx.run_interval(PERSIST_EVERY, |act, ctx| act.persist(ctx));
    }
}

/// `stop_process` (P-1): SIGTERM now, SIGKILL after the grace period if still running.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Stop;

impl Handler<Stop> for ProcessActor {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Context<Self>) {
        self.handled += 1;
        if self.exit_code.is_some() {
            return;
        }
        self.stop_requested = true;
        self.signal(os::StopSignal::Terminate);
        ctx.run_later(self.host.stop_grace(), |act, _ctx| {
            if act.exit_code.is_none() {
                act.signal(os::StopSignal::Kill);
            }
        });
    }
}

impl Handler<crate::describe::Describe> for ProcessActor {
    type Result = MessageResult<crate::describe::Describe>;

    fn handle(&mut self, _: crate::describe::Describe, _ctx: &mut Context<Self>) -> Self::Result {
        self.handled += 1;
        MessageResult(crate::describe::ActorSummary {
            kind: "process",
            id: self.record.process_id.to_string(),
            arbiter: crate::describe::arbiter_name(),
            handled: self.handled,
            mailbox_len: self.mailbox.get(),
            state: format!(
                "pid {} of execution {}, {} output bytes{}",
                self.signaller.identity().pid,
                self.record.execution_id,
                self.totals().0,
                if self.stop_requested {
                    ", stop requested"
                } else {
                    ""
                }
            ),
        })
    }
}

/// What a live process actor knows now: for snapshots and the debug endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSummary {
    pub process_id: ProcessId,
    pub pid: u32,
    pub output_bytes: u64,
    /// The live tail (lossy UTF-8), newer than the persisted one.
    pub output_tail: String,
    pub stop_requested: bool,
    pub handled: u64,
}

#[derive(Debug, Message)]
#[rtype(result = "ProcessSummary")]
pub struct Summarize;

impl Handler<Summarize> for ProcessActor {
    type Result = MessageResult<Summarize>;

    fn handle(&mut self, _: Summarize, _ctx: &mut Context<Self>) -> Self::Result {
        self.handled += 1;
        let (output_bytes, tail) = self.totals();
        MessageResult(ProcessSummary {
            process_id: self.record.process_id,
            pid: self.signaller.identity().pid,
            output_bytes,
            output_tail: String::from_utf8_lossy(&tail).into_owned(),
            stop_requested: self.stop_requested,
            handled: self.handled,
        })
    }
}
