//! Branches, Fork and Retry through the command service (B-1..B-6, K-2): the session's
//! Activity, new child executions that keep the original history (independent of it, as
//! the product document says: Cancel of the original does not reach them), refused forks
//! recorded on the original, and the session feed with `session_reload`.

use openprogram_storage::{
    CommandRecord, CommandStatus, EffectId, Event, EventEnvelope, ExecutionHead, ExecutionId,
    ExecutionState, MessageId, Outcome, SessionId, Transition, TurnId, Upsert,
};
use std::ops::ControlFlow;

use crate::activity::{self, Activity, ExecutionFacts};
use crate::command::Command;
use crate::error::{Error, Result};
use crate::machine::fork::fork_state;
use crate::machine::{Accepted, Contract, Machine, Rejection};
use crate::rebuild::load_projected;
use crate::service::{CommandReply, Service};
use crate::snapshot::{capabilities, idle_context};

/// Decisions of one Fork or Retry while its parent keeps moving (each a fresh read).
const FORK_DECISIONS_MAX: usize = 4;

impl Service {
    /// B-2..B-5: the session's branches in three sections.
    pub fn activity(&self, session_id: SessionId) -> Result<Activity> {
        let store = self.env().store.as_ref();
        let mut facts = Vec::new();
        for execution_id in store.executions_in_session(session_id)? {
            match load_projected(store, execution_id) {
                Ok((head, machine)) if head.session_id == session_id => {
                    facts.push(facts_of(&head, &machine, self.env().contract));
                }
                Ok(_) => {}
                // A quarantined execution is left out, never guessed into a branch (B-1).
                Err(error) => {
                    tracing::warn!(%execution_id, %error, "left out of the activity");
                }
            }
        }
        Ok(activity::project(&facts))
    }

    /// K-2 Fork (from the command's checkpoint or the latest saved point) or Retry (from
    /// the admission input): a new paused child in the same run. The parent's machine
    /// decides whether it is accepted (K-3, K-4) and from which point; nothing of the
    /// original changes, a refusal included (its record alone). A retried command id
    /// returns the stored outcome (K-4).
    pub(crate) async fn fork(
        &self,
        session_id: SessionId,
        parent_id: ExecutionId,
        command: Command,
    ) -> Result<CommandReply> {
        let store = self.env().store.as_ref();
        self.head_in(session_id, parent_id)?;
        self.env().lifecycle.until_recovered().await;
        // The record lives with the child it created (a transition writes only its own
        // execution's commands), so the parent is part of what the id stands for.
        let with_parent = |payload_hash: [u8; 32]| {
            let mut hasher = blake3::Hasher::new();
            hasher.update(&payload_hash);
            hasher.update(parent_id.as_bytes());
            *hasher.finalize().as_bytes()
        };
        let hash = with_parent(command.payload_hash());
        if let Some(stored) = store.command(command.command_id)? {
            // Stored by a build before schema 6, its hash is one of that build's (K-4).
            let same = command.matches_payload_with(&stored.payload_hash, with_parent);
            return same_command(same, stored);
        }
        let record = CommandRecord {
            payload_hash: hash,
            ..command.accepted_record(parent_id)
        };
        let (parent, checkpoint) = match self.decide_fork(session_id, &command, &record).await? {
            ControlFlow::Continue(decided) => decided,
            ControlFlow::Break(refused) => return Ok(refused),
        };
        let (transition, record, queued) = self.child(&parent, checkpoint, record)?;
        let child_id = transition.execution_id;
        match store.submit(transition).await? {
            Outcome::Committed(_) => {
                self.schedule_child(session_id, child_id, parent.kind, queued)
                    .await?;
                Ok(CommandReply::of(&record))
            }
            Outcome::DuplicateCommand { stored } => Ok(CommandReply::of(&stored)),
            // The same fork, committed by a concurrent delivery of this command id first.
            Outcome::CommandConflict { stored } => {
                same_command(stored.payload_hash == hash, stored)
            }
            other => Err(Error::Internal(format!("creating a child: {other:?}"))),
        }
    }

    /// K-2, K-3: a Job's or a function's child follows its scheduler: a Job's waits in the
    /// resource queue; a function's (written paused) is continued at once, under a command id
    /// derived from it, so it runs, or waits in its session's line if it is a person's
    /// foreground turn (F-6). Should the runtime stop in between, it stays paused, for a
    /// Continue. An agent's child stays paused for a person.
    async fn schedule_child(
        &self,
        session_id: SessionId,
        child_id: ExecutionId,
        kind: openprogram_storage::ExecutionKind,
        queued: Option<Event>,
    ) -> Result<()> {
        if let Some(queued) = queued {
            let queued = crate::machine::job::queued_job(&queued);
            let enqueue = [crate::machine::Action::Enqueue];
            self.env().tell_queue(child_id, &queued, &enqueue);
        } else if kind == openprogram_storage::ExecutionKind::Function {
            let id = crate::machine::derived_command_id(child_id.as_uuid(), b"scheduled", 0);
            let body = crate::command::CommandBody::Continue {
                policy: None,
                budget: None,
            };
            let command = Command::new(body).with_id(id);
            self.control(session_id, child_id, command).await?;
        }
        Ok(())
    }

    /// The parent's machine decides a Fork or Retry (K-3, K-4) on the parent as it stands:
    /// accepted, it continues with the parent's head and the checkpoint to fork from (none
    /// for a retry); refused, it breaks with the reply of the stored refusal.
    async fn decide_fork(
        &self,
        session_id: SessionId,
        command: &Command,
        record: &CommandRecord,
    ) -> Result<ControlFlow<CommandReply, (ExecutionHead, Option<u64>)>> {
        // Read after recovery: its claims may have moved the original. The state decided on
        // is the one at this head's version: a live parent may move on, its child does not;
        // a refusal is stored only if the parent is still at that version, else decided again.
        for _ in 0..FORK_DECISIONS_MAX {
            let (parent, machine) = self.env().complete_state(record.execution_id)?;
            if parent.session_id != session_id {
                return Err(Error::NotFound);
            }
            let now_ms = self.env().clock.now_ms();
            let context = idle_context(parent.version, self.env().contract, now_ms);
            let (command_id, body) = (command.command_id, command.body.clone());
            match machine.decide_command(command_id, body, command.expected_version, &context) {
                Ok(Accepted::Fork { checkpoint_seq }) => {
                    return Ok(ControlFlow::Continue((parent, Some(checkpoint_seq))))
                }
                Ok(Accepted::Retry) => return Ok(ControlFlow::Continue((parent, None))),
                Ok(Accepted::Control { .. }) => {
                    return Err(Error::Internal("a fork decided as a control".into()))
                }
                Err(rejection) => {
                    let refused = self.refuse_fork(record.clone(), &rejection, parent.version);
                    match refused.await {
                        Err(Error::VersionConflict { .. }) => continue,
                        refused => return refused.map(ControlFlow::Break),
                    }
                }
            }
        }
        Err(Error::Unavailable(
            "the execution kept moving while a fork or retry was decided".into(),
        ))
    }

    /// The child of a decided Fork (`checkpoint`) or Retry and its command's record, as one
    /// transition: a new execution of the parent's run and message. An agent's child, or a
    /// person's function (a foreground turn too), starts paused and needs Continue (K-2); a
    /// Job's follows its scheduler (K-3): queued, its `JobQueued` returned for the queue.
    fn child(
        &self,
        parent: &ExecutionHead,
        checkpoint: Option<u64>,
        record: CommandRecord,
    ) -> Result<(Transition, CommandRecord, Option<Event>)> {
        let ChildStart {
            input,
            parent_message_id,
            forked,
            job,
            restart_window,
        } = self.child_start(parent, checkpoint)?;
        let child_id = ExecutionId::new();
        let session_id = parent.session_id;
        let mut head = ExecutionHead::new(child_id, session_id, parent.run_id, parent.kind);
        head.parent_execution_id = Some(parent.execution_id);
        head.revision_id = parent.revision_id;
        head.turn_id = TurnId::new();
        head.user_message_id = parent.user_message_id;
        head.reply_message_id = MessageId::new();
        let reason = checkpoint.map_or("retry", |_| "fork");
        let called_by_agent = serde_json::from_str::<crate::machine::FunctionInput>(&input)
            .is_ok_and(|called| called.called_by.is_some());
        let paused = job.is_none();
        if paused {
            head.state = ExecutionState::Paused;
            head.pause_reason = Some(reason.into());
        }
        let mut child_events = vec![Event::Admitted {
            kind: head.kind,
            session_id,
            run_id: head.run_id,
            parent_execution_id: head.parent_execution_id,
            revision_id: head.revision_id,
            turn_id: head.turn_id,
            user_message_id: head.user_message_id,
            reply_message_id: head.reply_message_id,
            parent_message_id,
            input,
        }];
        // C-2: a turn's child is a foreground turn of the session once continued (F-6: not
        // the child of a function an agent's call started).
        if self
            .env()
            .takes_session(head.kind, job.is_some(), called_by_agent)
        {
            child_events.push(crate::machine::session::paused_turn());
        }
        // J-1: a Job's child is a new Job, with what the original asked for (its budget
        // unspent): it goes through the queue once continued.
        let job_record = job
            .as_ref()
            .and_then(|queued| crate::machine::job::queued_record(&head, queued));
        child_events.extend(job.clone());
        child_events.extend(forked);
        let window =
            restart_window.map(|window| crate::machine::restart::window_at_start(child_id, window));
        child_events.extend(window);
        let policy = crate::machine::restart::policy_record(child_id, child_events.iter());
        if paused {
            child_events.push(Event::StateChanged {
                state: ExecutionState::Paused,
                reason: reason.into(),
            });
        }
        let record = CommandRecord {
            execution_id: child_id,
            status: CommandStatus::Applied,
            result_version: Some(parent.version),
            child_execution_id: Some(child_id),
            ..record
        };
        let mut transition =
            Transition::create(head, child_events).with(Upsert::Command(record.clone()));
        if let Some(job_record) = job_record {
            transition = transition.with(Upsert::Job(job_record));
        }
        if let Some(policy) = policy {
            transition = transition.with(Upsert::Policy(policy));
        }
        Ok((transition, record, job))
    }

    /// What the child starts from: the parent's admission input, and for a fork
    /// (`checkpoint`) a copy of the state at that saved point.
    fn child_start(&self, parent: &ExecutionHead, checkpoint: Option<u64>) -> Result<ChildStart> {
        let store = self.env().store.as_ref();
        // Only what the version decided on holds: a live parent may have moved on.
        let parent_id = parent.execution_id;
        let mut events = store.events_after(parent_id, 0, usize::MAX)?;
        events.retain(|envelope| envelope.seq <= parent.last_seq);
        let Some((input, parent_message_id)) = admission(&events) else {
            return Err(Error::Internal(format!("{parent_id} has no admission")));
        };
        let mut forked = Vec::new();
        if let Some(checkpoint_seq) = checkpoint {
            let state = fork_state(&events, checkpoint_seq, EffectId::new());
            let state = serde_json::to_string(&state)
                .map_err(|error| Error::Internal(format!("encoding a fork: {error}")))?;
            forked.push(Event::Forked {
                from_execution_id: parent_id,
                checkpoint_seq,
                state,
            });
        }
        let now_ms = self.env().clock.now_ms();
        let job = events.iter().find_map(|envelope| match &envelope.event {
            Event::JobQueued {
                resources,
                queue_deadline_ms,
                budget,
                ..
            } => Some(Event::JobQueued {
                resources: resources.clone(),
                queued_at_ms: now_ms,
                queue_deadline_ms: *queue_deadline_ms,
                budget: *budget,
            }),
            _ => None,
        });
        // K-7: the child keeps the original's own restart window.
        let parent_events = events.iter().map(|envelope| &envelope.event);
        let restart_window = crate::machine::restart::policy_record(parent_id, parent_events)
            .map(|policy| policy.restart_window);
        Ok(ChildStart {
            input,
            parent_message_id,
            forked,
            job,
            restart_window,
        })
    }

    /// A refused Fork or Retry is recorded on the original as its command record alone
    /// (K-1, K-4): its status reads back and a retry of the same command id gets the same
    /// answer; nothing of the original changes, so no actor needs to take it.
    async fn refuse_fork(
        &self,
        record: CommandRecord,
        rejection: &Rejection,
        version: u64,
    ) -> Result<CommandReply> {
        let record = CommandRecord {
            status: CommandStatus::Rejected,
            reason: Some(rejection.reason()),
            reason_code: Some(rejection.code().to_owned()),
            result_version: Some(version),
            ..record
        };
        let hash = record.payload_hash;
        let rejection_write = Transition::rejection(record.clone(), version, None);
        match self.env().store.submit(rejection_write).await? {
            Outcome::Recorded { .. } => Ok(CommandReply::of(&record)),
            Outcome::DuplicateCommand { stored } => Ok(CommandReply::of(&stored)),
            // A concurrent delivery of the same command made the child first (its record
            // lives with the child): that outcome stands (K-4).
            Outcome::CommandConflict { stored } => {
                same_command(stored.payload_hash == hash, stored)
            }
            Outcome::VersionConflict { current } => Err(Error::VersionConflict { current }),
            other => Err(Error::Internal(format!("recording a refusal: {other:?}"))),
        }
    }

    /// B-6: the session's entries after `after_position`, `limit` of them or one more: an
    /// event and its `session_reload` are never split, so a cursor never skips a reload. A
    /// terminal outcome is followed by `session_reload` only once it is committed: the log
    /// holds nothing else. It reads the global log from the cursor (every session's events),
    /// at most `PAGES_MAX` pages a call: the caller goes on from `scanned_through`.
    pub fn session_feed(
        &self,
        session_id: SessionId,
        after_position: u64,
        limit: usize,
    ) -> Result<SessionFeed> {
        const PAGE: usize = 1024;
        // One call reads at most this many pages of the global log: a quiet session's
        // reader goes on from `scanned_through` at its next call.
        const PAGES_MAX: usize = 8;
        let store = self.env().store.as_ref();
        let mut sessions = std::collections::HashMap::<ExecutionId, bool>::new();
        let mut entries = Vec::new();
        let mut after = after_position;
        let mut pages = 0;
        while entries.len() < limit && pages < PAGES_MAX {
            pages += 1;
            let page = store.log_after(after, PAGE)?;
            if page.is_empty() {
                break;
            }
            for envelope in page {
                if entries.len() >= limit {
                    break;
                }
                after = envelope.position;
                let execution_id = envelope.execution_id;
                // A quarantined execution is nobody's: it must not stop the stream.
                let mine = *sessions.entry(execution_id).or_insert_with(|| {
                    store.head(execution_id).map_or_else(
                        |error| {
                            tracing::warn!(%execution_id, %error, "left out of the session feed");
                            false
                        },
                        |head| head.is_some_and(|head| head.session_id == session_id),
                    )
                });
                if !mine {
                    continue;
                }
                let ended = matches!(&envelope.event, Event::StateChanged { state, .. } if state.is_terminal());
                let entry = SessionEntry {
                    position: envelope.position,
                    execution_id,
                    seq: envelope.seq,
                    kind: envelope.event.type_name(),
                };
                entries.push(entry.clone());
                if ended {
                    entries.push(SessionEntry {
                        kind: "session_reload",
                        ..entry
                    });
                }
            }
        }
        Ok(SessionFeed {
            entries,
            scanned_through: after,
        })
    }
}

/// One entry of a session's stream (B-6): an event of one of its executions, or, right after
/// an event that ended an execution, a `session_reload` marker at the same position.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SessionEntry {
    /// The global log position: the stream's resumable cursor.
    pub position: u64,
    pub execution_id: ExecutionId,
    pub seq: u64,
    /// The event's type, or `session_reload`.
    #[serde(rename = "type")]
    pub kind: &'static str,
}

/// A page of a session's stream, and how far the global log was read for it: a reader
/// resumes from `scanned_through`, so a quiet session's cursor still moves past what other
/// sessions wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionFeed {
    pub entries: Vec<SessionEntry>,
    pub scanned_through: u64,
}

/// What a child starts from: the original's input and parent message, and for a fork its
/// `Forked` event.
struct ChildStart {
    input: String,
    parent_message_id: Option<MessageId>,
    forked: Vec<Event>,
    /// J-1: the original's `JobQueued`, anew for the child, if the original is a Job.
    job: Option<Event>,
    /// K-7: the original's own restart window, if it has one.
    restart_window: Option<openprogram_storage::RestartWindow>,
}

/// The admission input (JSON text) and parent message of an execution's events.
fn admission(events: &[EventEnvelope]) -> Option<(String, Option<MessageId>)> {
    events.iter().find_map(|envelope| match &envelope.event {
        Event::Admitted {
            input,
            parent_message_id,
            ..
        } => Some((input.clone(), *parent_message_id)),
        _ => None,
    })
}

/// K-4: a record of this command id stored already answers for it if it is the same
/// command; another command under the same id is a conflict.
fn same_command(same: bool, stored: CommandRecord) -> Result<CommandReply> {
    match same {
        true => Ok(CommandReply::of(&stored)),
        false => Err(Error::CommandConflict {
            stored: Box::new(stored),
        }),
    }
}

fn facts_of(head: &ExecutionHead, machine: &Machine, contract: Contract) -> ExecutionFacts {
    let pending_wait = machine.present.waits.pending_wait().is_some();
    let declined_wait = machine
        .waits()
        .into_iter()
        .rev()
        .find(|wait| wait.live.is_none())
        .is_some_and(|wait| wait.status == openprogram_storage::WaitStatus::Declined);
    let pending = machine.present.run.pending_commands.iter();
    let pending_controls = pending.map(|(_, control)| control.kind()).collect();
    // B-4: the owner ended (the execution is not running and will not by itself) and all
    // that is missing is the model's response: no tool call, effect, wait or reply pending.
    let response_record_incomplete = head.state == ExecutionState::Expired
        && machine.present.calls.pending_tool.is_none()
        && machine.present.calls.pending_steps.is_empty()
        && machine.present.calls.unresolved.is_none()
        && !pending_wait;
    ExecutionFacts {
        execution_id: head.execution_id,
        parent_execution_id: head.parent_execution_id,
        // Fork and Retry children are independent; a function an agent's call started is
        // that agent's child task (F-6).
        child_task: machine.present.function.as_ref().is_some_and(|run| {
            run.input.called_by.is_some() && run.input.called_by == head.parent_execution_id
        }),
        user_message_id: head.user_message_id,
        reply_message_id: head.reply_message_id,
        parent_message_id: machine.present.turn.parent_message_id,
        // A durable function's request is its call: the function and its input.
        request: match &machine.present.function {
            Some(run) => format!("{} {}", run.input.function, run.input.input),
            None => machine.present.turn.input.message.clone(),
        },
        state: head.state,
        // The row's controls are the execution's own (a session grant's revoke is in its
        // snapshot).
        capabilities: capabilities(machine, head.version, contract),
        pending_wait,
        declined_wait,
        running_processes: machine.present.running_processes().count(),
        response_record_incomplete,
        pending_controls,
    }
}
