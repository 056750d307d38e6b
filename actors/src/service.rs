//! The command service and the reads (K-1, I-1): one entry point for every transport.
//!
//! A command goes to its execution's mailbox, which saves it as `accepted` (with its payload
//! hash, K-4) and then records `applied` or `rejected` in the same transition as its effect;
//! the execution is the only writer of its version while it is live, so a command never
//! moves the version under a running step. Reads and commands check the session first: another
//! session's execution answers as not found.

use std::sync::Arc;

use openprogram_storage::{
    CommandId, CommandRecord, CommandStatus, EventEnvelope, ExecutionHead, ExecutionId,
    ExecutionKind, MessageId, RunId, SessionId,
};
use serde::{Deserialize, Serialize};

use crate::admission::Admission;
pub use crate::admission::StartRequest;
pub use crate::command::{Command, CommandBody, CommandKind, EffectRef, ReconcileOutcome, WaitRef};
use crate::directory::Executions;
use crate::env::Env;
use crate::error::{Error, Result};
use crate::execution::actor::GetSnapshot;
use crate::execution::commands::ApplyCommand;
use crate::machine::Machine;
pub use crate::machine::ScriptElement;
use crate::process::Summarize;
use crate::snapshot::Snapshot;

/// A durable function to start (F-1): the function's name and its input. It runs the newest
/// registered revision.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct FunctionStart {
    pub function: String,
    #[serde(default)]
    pub input: serde_json::Value,
    /// F-3: its version policy; the runtime's default if none.
    pub policy: Option<openprogram_storage::VersionPolicy>,
    /// A registered revision to run instead of the newest.
    pub revision: Option<u32>,
    /// Admit it paused: it waits for Continue or Step.
    #[serde(default)]
    pub start_paused: bool,
    /// J-1: admit it as a background Job, through the resource queue.
    pub job: Option<crate::admission::JobRequest>,
    /// K-7: its own restart window, in place of the runtime's.
    #[serde(default, deserialize_with = "crate::admission::restart_window_field")]
    pub restart_window: Option<openprogram_storage::RestartWindow>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StartReply {
    pub execution_id: ExecutionId,
    pub run_id: RunId,
    pub turn_id: openprogram_storage::TurnId,
    pub user_message_id: MessageId,
    pub reply_message_id: MessageId,
    pub version: u64,
    /// J-1: a Job's id, which is its execution id; absent for an execution that is no Job.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_id: Option<ExecutionId>,
    /// C-2: the message became steering text of the turn that runs (`execution_id` is that
    /// turn's): nothing was admitted. The steer command's reply.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steered: Option<CommandReply>,
    /// C-2: how a foreground turn was admitted: `immediate`, `queue` or `interrupt`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_turn: Option<&'static str>,
}

impl StartReply {
    /// The reply naming the execution of `head`, at version 1 (its admission).
    pub(crate) fn of(head: &ExecutionHead) -> Self {
        Self {
            execution_id: head.execution_id,
            run_id: head.run_id,
            turn_id: head.turn_id,
            user_message_id: head.user_message_id,
            reply_message_id: head.reply_message_id,
            version: 1,
            job_id: None,
            steered: None,
            session_turn: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CommandReply {
    pub command_id: CommandId,
    /// `accepted`, `applied` or `rejected`.
    pub status: &'static str,
    pub reason: Option<String>,
    /// The stable code of a rejection (`version_conflict`, `not_available`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    pub version: u64,
    pub execution_id: Option<ExecutionId>,
}

impl CommandReply {
    pub(crate) fn of(record: &CommandRecord) -> Self {
        Self {
            command_id: record.command_id,
            status: match record.status {
                CommandStatus::Accepted => "accepted",
                CommandStatus::Applied => "applied",
                CommandStatus::Rejected => "rejected",
            },
            reason: record.reason.clone(),
            // Rejected before reasons were typed (schema 5): the one code there was.
            code: (record.status == CommandStatus::Rejected).then(|| {
                let code = record.reason_code.clone();
                code.unwrap_or_else(|| "command_rejected".into())
            }),
            version: record.result_version.unwrap_or(0),
            execution_id: record.child_execution_id,
        }
    }
}

/// Deliveries of one command to an execution whose actor stops meanwhile (it parked).
const DELIVERY_ATTEMPTS_MAX: usize = 4;

/// The runtime's operations, shared by every transport.
#[derive(Debug, Clone)]
pub struct Service {
    env: Arc<Executions>,
}

impl Service {
    pub fn new(env: Arc<Executions>) -> Self {
        Self { env }
    }

    pub fn env(&self) -> &Arc<Env> {
        self.env.env()
    }

    /// The runtime's execution actors: the directory, activation, takeover.
    pub fn actors(&self) -> &Arc<Executions> {
        &self.env
    }

    /// Whether the execution belongs to the session: `NotFound` otherwise.
    pub fn check_session(&self, session_id: SessionId, execution_id: ExecutionId) -> Result<()> {
        self.head_in(session_id, execution_id).map(|_| ())
    }

    /// The newest seq of an execution of this session, as `check_session` checks it.
    pub fn last_seq(&self, session_id: SessionId, execution_id: ExecutionId) -> Result<u64> {
        self.head_in(session_id, execution_id)
            .map(|head| head.last_seq)
    }

    /// The head of an execution of this session.
    pub(crate) fn head_in(
        &self,
        session_id: SessionId,
        execution_id: ExecutionId,
    ) -> Result<ExecutionHead> {
        match self.env.store.head(execution_id)? {
            Some(head) if head.session_id == session_id => Ok(head),
            Some(_) => Err(Error::NotFound),
            // S-8: purged answers `purged`, never `not found` — to its own session only.
            None => match self.env.store.purged(execution_id)? {
                Some(purged) if purged.session_id == session_id => Err(Error::Purged(execution_id)),
                _ => Err(Error::NotFound),
            },
        }
    }

    /// Admits a new agent turn and starts it (or leaves it paused, parked in storage).
    pub async fn start_execution(
        &self,
        session_id: SessionId,
        request: StartRequest,
    ) -> Result<StartReply> {
        self.admit(session_id, request, ExecutionKind::AgentTurn)
            .await
    }

    /// Admits a new execution of `kind` and starts it (or leaves it paused). A function's
    /// `request.message` is its `FunctionInput`, as JSON.
    async fn admit(
        &self,
        session_id: SessionId,
        request: StartRequest,
        kind: ExecutionKind,
    ) -> Result<StartReply> {
        let execution_id = ExecutionId::new();
        if self.env.lifecycle.is_stopping() {
            return Err(Error::Unavailable("the runtime is shutting down".into()));
        }
        // Startup recovery treats every execution without a live attempt as abandoned:
        // admit new ones once it has read what it recovers.
        self.env.lifecycle.until_recovered().await;
        if self.env.lifecycle.is_stopping() {
            return Err(Error::Unavailable("the runtime is shutting down".into()));
        }
        // J-1: what a Job asks for is checked before anything is stored.
        let job = match &request.job {
            Some(job) => Some((self.env.resources.check(&job.resources)?, job.clone())),
            None => None,
        };
        // C-2, F-6: an agent turn or a function a person starts is its session's foreground
        // turn (an agent's call of a function is admitted as its child, not here).
        let foreground = self.env.takes_session(kind, job.is_some(), false);
        if foreground && !request.start_paused {
            return self
                .admit_turn(session_id, execution_id, request, kind)
                .await;
        }
        if request.when_busy.is_some() {
            return Err(Error::InvalidRequest(
                "`when_busy` is for a turn a person starts, with one turn per session (not `serve --parallel-turns`), not a Job or a paused start".into(),
            ));
        }
        let mut admission = Admission::new(
            execution_id,
            session_id,
            self.env.contract.revision,
            request,
            kind,
        )?;
        let now_ms = self.env.clock.now_ms();
        if let Some((resources, job)) = &job {
            admission = admission.into_job(resources.clone(), job, now_ms);
        }
        let reply = StartReply {
            job_id: job.is_some().then_some(execution_id),
            ..StartReply::of(&admission.head)
        };
        let start_paused = admission.start_paused;
        // C-2: a turn admitted paused is a foreground turn too: it holds nothing
        // now, and once continued it waits in its session's line like any message.
        if start_paused && foreground {
            admission = admission.into_session_turn(crate::machine::session::paused_turn());
        }
        let (head, machine, version) = admission.commit(self.env.store.as_ref()).await?;
        if let Some((resources, job)) = job.filter(|_| !start_paused) {
            // A Job runs once the queue leases its resources: nothing starts here.
            if let Some(queue) = self.env.queue() {
                queue.do_send(crate::resource_queue::Enqueue {
                    job_id: execution_id,
                    resources,
                    deadline_at_ms: job
                        .queue_deadline_ms
                        .map(|deadline| now_ms.saturating_add(deadline)),
                });
            }
        } else if !start_paused {
            self.start_admitted(head, machine)?;
        }
        Ok(StartReply { version, ..reply })
    }

    /// Starts the actor of an execution just admitted. Shutdown began meanwhile: the next
    /// start runs it (a failure here would make a client retry admit it twice).
    pub(crate) fn start_admitted(&self, head: ExecutionHead, machine: Machine) -> Result<()> {
        match self.env.activate_admitted(head, machine) {
            Err(Error::Unavailable(_)) if self.env.lifecycle.is_stopping() => Ok(()),
            started => started.map(|_| ()),
        }
    }

    /// F-1: admits an execution of the newest registered revision of a durable function (or
    /// the registered `revision` asked for) and starts it. Returns the reply and the revision
    /// it runs.
    pub async fn start_function(
        &self,
        session_id: SessionId,
        request: FunctionStart,
    ) -> Result<(StartReply, u32)> {
        let functions = &self.env.functions;
        let function = match request.revision {
            Some(revision) => functions.get(&request.function, revision),
            None => functions.latest(&request.function),
        }
        .ok_or_else(|| Error::UnknownFunction(request.function.clone()))?;
        function
            .check_input(&request.input)
            .map_err(Error::InvalidInput)?;
        let revision = function.revision;
        let called = crate::machine::FunctionInput {
            function: request.function,
            revision,
            input: request.input,
            policy: request.policy.unwrap_or(self.env.function_policy),
            identity: function.identity.clone(),
            called_by: None,
        };
        let encoded = serde_json::to_string(&called)
            .map_err(|error| Error::InvalidInput(error.to_string()))?;
        let start = StartRequest {
            message: encoded,
            start_paused: request.start_paused,
            job: request.job,
            restart_window: request.restart_window,
            ..StartRequest::default()
        };
        let reply = self
            .admit(session_id, start, ExecutionKind::Function)
            .await?;
        Ok((reply, revision))
    }

    /// J-1: a Job's snapshot at the time it is read, with its place in the queue.
    async fn complete_job(&self, snapshot: &mut Snapshot) {
        let Some(job) = &mut snapshot.job else {
            return;
        };
        let position = match self.env.queue() {
            Some(queue) if snapshot.state == "queued" => queue
                .send(crate::resource_queue::Position {
                    job_id: snapshot.execution_id,
                })
                .await
                .ok()
                .flatten(),
            _ => None,
        };
        job.at(self.env.clock.now_ms(), position);
    }

    /// J-1: the resource queue now.
    pub async fn resources(&self) -> Result<crate::resource_queue::QueueReport> {
        self.ask_queue(crate::resource_queue::Report).await
    }

    /// The resource queue's own account of itself (debug endpoint, J-1).
    pub async fn describe_queue(&self) -> Result<crate::describe::ActorSummary> {
        self.ask_queue(crate::describe::Describe).await
    }

    /// Asks the resource queue `message`; `unavailable` if it is not running.
    async fn ask_queue<M>(&self, message: M) -> Result<M::Result>
    where
        M: actix::Message + Send + 'static,
        M::Result: Send,
        crate::resource_queue::ResourceQueue: actix::Handler<M>,
    {
        let queue = self
            .env
            .queue()
            .ok_or_else(|| Error::Unavailable("the resource queue is not running".into()))?;
        queue
            .send(message)
            .await
            .map_err(|error| Error::Unavailable(error.to_string()))
    }

    /// K-1: routes a command to its execution, which decides it (K-3, K-4) and records the
    /// outcome; Fork and Retry make a child (`branches.rs`).
    pub async fn command(
        &self,
        session_id: SessionId,
        execution_id: ExecutionId,
        command: Command,
    ) -> Result<CommandReply> {
        command.check()?;
        let started = std::time::Instant::now();
        let reply = match command.kind() {
            CommandKind::Fork | CommandKind::Retry => {
                self.fork(session_id, execution_id, command).await
            }
            _ => self.control(session_id, execution_id, command).await,
        };
        if let Ok(reply) = &reply {
            let rejected =
                (reply.status == "rejected").then(|| reply.code.as_deref().unwrap_or("rejected"));
            self.env.telemetry.command(rejected, started.elapsed());
        }
        reply
    }

    /// A control command, through the execution's mailbox (K-1, K-6).
    pub(crate) async fn control(
        &self,
        session_id: SessionId,
        execution_id: ExecutionId,
        command: Command,
    ) -> Result<CommandReply> {
        self.head_in(session_id, execution_id)?;
        // Startup recovery may be claiming this very execution: let it finish first.
        self.env.lifecycle.until_recovered().await;
        // B01: a command received, nothing of it persisted.
        openprogram_storage::failpoint!("B01");
        let accepted = command.accepted_record(execution_id);
        let command_id = command.command_id;
        // The actor may release itself between activation and delivery; a few retries.
        for _ in 0..DELIVERY_ATTEMPTS_MAX {
            let addr = self.env.activate(execution_id)?;
            let message = ApplyCommand {
                accepted: accepted.clone(),
                command: command.clone(),
            };
            match addr.send(message).await {
                Ok(Ok(record)) => return Ok(CommandReply::of(&record)),
                // K-6: the attempt reached lost a race to a newer one. The command stands only
                // if it was already applied to this execution (its stored receipt is kept);
                // undecided, it goes to the current owner; anything else propagates.
                Ok(Err(error @ (Error::Fenced { .. } | Error::VersionConflict { .. }))) => {
                    match self.env.store.command(command_id)? {
                        Some(stored) if stored.execution_id != execution_id => return Err(error),
                        Some(stored) if stored.status == CommandStatus::Applied => {
                            return Ok(CommandReply::of(&stored))
                        }
                        Some(stored) if stored.status == CommandStatus::Rejected => {
                            return Err(error)
                        }
                        _ => continue,
                    }
                }
                Ok(Err(error)) => return Err(error),
                Err(actix::MailboxError::Closed) => continue,
                Err(error) => return Err(Error::Unavailable(error.to_string())),
            }
        }
        Err(Error::Unavailable(
            "the execution's actor kept stopping while taking a command".into(),
        ))
    }

    /// S-8: purges every execution of the session, once all of them ended (else
    /// `active_executions`, nothing purged). Returns how many it purged.
    pub async fn purge_session(&self, session_id: SessionId) -> Result<usize> {
        let executions = self.env.store.executions_in_session(session_id)?;
        crate::retention::purge_session(
            self.env.store.as_ref(),
            executions,
            std::time::Duration::from_secs(10),
        )
        .await
    }

    /// The current status of a command of this session.
    pub fn command_status(
        &self,
        session_id: SessionId,
        command_id: CommandId,
    ) -> Result<CommandReply> {
        let record = self.env.store.command(command_id)?.ok_or(Error::NotFound)?;
        self.head_in(session_id, record.execution_id)?;
        Ok(CommandReply::of(&record))
    }

    /// The snapshot of an execution: from its live actor, or rebuilt from storage.
    pub async fn snapshot(
        &self,
        session_id: SessionId,
        execution_id: ExecutionId,
    ) -> Result<Snapshot> {
        self.head_in(session_id, execution_id)?;
        let store = self.env.store.as_ref();
        let live = match self.env.directory.live(execution_id) {
            Some(addr) => addr.send(GetSnapshot).await.ok(),
            None => None,
        };
        let snapshot = match live {
            Some(snapshot) => snapshot,
            None => {
                let (head, machine) = self.env.latest_state(execution_id, false)?;
                Snapshot::of(&head, &machine, self.env.contract)
            }
        };
        let session = crate::snapshot::session_of(store, session_id);
        let mut snapshot = snapshot
            .with_process_records(store)
            .with_session(session.as_deref());
        self.complete_job(&mut snapshot).await;
        // A running process's output is persisted now and then; its actor knows it now.
        for view in &mut snapshot.processes {
            let Some(addr) = self.env.processes.get(view.process_id) else {
                continue;
            };
            if let Ok(now) = addr.send(Summarize).await {
                view.output_bytes = now.output_bytes;
                view.output_tail = now.output_tail;
            }
        }
        Ok(snapshot)
    }

    /// W-5: the pending waits (durable waits and live questions) to show with the assistant
    /// message `message_id` of this session. Only the execution whose own record names that
    /// message as its reply, in this session, contributes; nothing is attached on weaker
    /// evidence. Reads the session's heads (its executions, by the session index).
    pub async fn pending_waits(
        &self,
        session_id: SessionId,
        message_id: MessageId,
    ) -> Result<Vec<crate::snapshot::WaitView>> {
        for execution_id in self.env.store.executions_in_session(session_id)? {
            match self.env.store.head(execution_id)? {
                Some(head)
                    if head.session_id == session_id && head.reply_message_id == message_id => {}
                _ => continue,
            }
            let snapshot = self.snapshot(session_id, execution_id).await?;
            return Ok(snapshot
                .waits
                .into_iter()
                .filter(|wait| matches!(wait.status, "open" | "submitted"))
                .collect());
        }
        Ok(Vec::new())
    }

    /// The snapshots of a session's executions, oldest first.
    pub async fn executions(&self, session_id: SessionId) -> Result<Vec<Snapshot>> {
        let mut snapshots = Vec::new();
        for execution_id in self.env.store.executions_in_session(session_id)? {
            match self.snapshot(session_id, execution_id).await {
                Ok(snapshot) => snapshots.push(snapshot),
                Err(Error::NotFound) => {}
                Err(error) => return Err(error),
            }
        }
        Ok(snapshots)
    }

    /// Events of an execution with `seq > after`, at most `limit`.
    pub fn events(
        &self,
        session_id: SessionId,
        execution_id: ExecutionId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<EventEnvelope>> {
        // Nothing after the newest seq: no read of the events (an idle stream's poll).
        if self.head_in(session_id, execution_id)?.last_seq <= after {
            return Ok(Vec::new());
        }
        Ok(self.env.store.events_after(execution_id, after, limit)?)
    }
}

#[cfg(test)]
#[path = "service_tests.rs"]
mod tests;
