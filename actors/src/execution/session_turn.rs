//! C-2, the execution actor's side of a session's foreground turn: a turn waiting for its
//! session takes it when it may (`take_session`, the record changed in the same
//! transition); a holder that ends or pauses wakes the first in line.

use actix::prelude::*;
use openprogram_storage::{ExecutionId, ExecutionState as Status, Outcome, SessionRecord};

use crate::execution::actor::{log_failure, ExecutionActor};
use crate::machine::session::line_of;

impl ExecutionActor {
    /// The session's record and the state of each execution it names, as read now.
    fn session_now(&self) -> Option<(SessionRecord, impl Fn(ExecutionId) -> Option<Status>)> {
        let session_id = self.head.session_id;
        let record = match self.env.store.session(session_id) {
            Ok(record) => record.unwrap_or(SessionRecord {
                session_id,
                ..SessionRecord::default()
            }),
            Err(error) => {
                tracing::warn!(execution_id = %self.execution_id, %error, "the session's record could not be read");
                return None;
            }
        };
        let store = std::sync::Arc::clone(&self.env.store);
        // Unreadable (quarantined): it holds nothing up.
        let state = move |execution_id: ExecutionId| Some(store.head(execution_id).ok()??.state);
        Some((record, state))
    }

    /// Whether the stored head moved past the one this actor holds: only another writer moves
    /// it while this actor waits. Unreadable: not known to have moved.
    fn moved_elsewhere(&self) -> bool {
        let stored = self.env.store.head(self.execution_id).ok().flatten();
        stored.is_some_and(|stored| stored.version != self.head.version)
    }

    /// C-2: takes the session if this turn is the first in line and the holder has ended
    /// (or, for an interrupt, paused). Else it stays `queued` and parks: the holder's end
    /// wakes it.
    pub(super) fn take_session(&mut self) -> ResponseActFuture<Self, ()> {
        let me = self.execution_id;
        self.session_looked = false;
        if self.moved_elsewhere() {
            // Looking writes nothing, so no fence would ever stop this actor: a head another
            // writer moved (a newer attempt, here or on another node) makes it stale.
            tracing::info!(execution_id = %me, "its execution moved on without it; stopping");
            return Box::pin(fut::ready(()).map(|(), act: &mut Self, ctx| act.release(ctx)));
        }
        let Some((record, state)) = self.session_now() else {
            return Box::pin(fut::ready(()));
        };
        let waiting = line_of(&record.waiting, Some(me), &state);
        let holder = record.foreground.filter(|holder| *holder != me);
        let holder_state = holder.and_then(&state);
        let free = match holder_state {
            None => true,
            Some(state) if state.is_terminal() => true,
            Some(Status::Paused) => self.machine.interrupts(),
            Some(_) => false,
        };
        let first = waiting.first() == Some(&me);
        let interrupted = holder.filter(|_| holder_state == Some(Status::Paused));
        let (events, write) = match (free && first)
            .then(|| {
                self.machine
                    .decide_take_session(me, &record, waiting, interrupted)
            })
            .flatten()
        {
            Some(taken) => taken,
            None => {
                // An interrupt first in line asks the running holder to pause at its next
                // safe point (again after a restart, or once a holder that was waiting for a
                // person runs again: each version of the holder is asked once).
                if first && self.machine.interrupts() {
                    if let Some(holder) = holder.filter(|_| {
                        holder_state
                            .is_some_and(|state| !state.is_terminal() && state != Status::Paused)
                    }) {
                        self.interrupt(holder);
                    }
                }
                return Box::pin(fut::ready(()).map(|(), act: &mut Self, ctx| {
                    // One timer at a time, whatever woke this look.
                    if let Some(poll) = act.session_poll.take() {
                        ctx.cancel_future(poll);
                    }
                    act.wait_for_session(ctx)
                }));
            }
        };
        Box::pin(
            self.submit_planned(events, Vec::new(), None, Some(write))
                .then(move |outcome, act, _ctx| match outcome {
                    // The record moved (another turn admitted, a grant given): read it again.
                    // Never given up, or nobody would wake this turn: each conflict is
                    // another write to the session committed, so the session makes progress.
                    Ok(Outcome::SessionConflict { .. }) => act.take_session(),
                    outcome => {
                        let result = outcome.and_then(|outcome| match outcome {
                            Outcome::Committed(committed) => Ok(committed.version),
                            other => Err(crate::Error::Internal(format!(
                                "taking the session: {other:?}"
                            ))),
                        });
                        Box::pin(ActorFutureExt::map(fut::ready(result), log_failure))
                    }
                }),
        )
    }

    /// Not its turn yet: it parks until the holder's end wakes it. On a node of a shared
    /// store the holder may end on another node, whose wake cannot reach an actor parked
    /// here: it stays, its attempt leased, and looks again each lease ttl (one timer; if
    /// this node stops, the takeover's new owner looks).
    fn wait_for_session(&mut self, ctx: &mut Context<Self>) {
        self.session_looked = true;
        if self.env.node.is_some() && !self.env.lifecycle.is_stopping() {
            let poll = ctx.run_later(self.env.lease_ttl, |act, ctx| {
                act.session_poll = None;
                ctx.notify(crate::execution::actor::Advance);
            });
            self.session_poll = Some(poll);
            return;
        }
        self.park_if_idle(ctx);
    }

    /// C-2, an interrupt: asks `holder`, as it stands now, to pause (`Hooks::interrupt`).
    fn interrupt(&self, holder: ExecutionId) {
        // Only the turn it was admitted to interrupt: requeued later, or behind another
        // interrupt, it waits like any turn.
        let behind = match self.env.store.events_after(self.execution_id, 0, 4) {
            Ok(events) => events.iter().find_map(|envelope| match &envelope.event {
                openprogram_storage::Event::SessionTurn { behind, .. } => *behind,
                _ => None,
            }),
            Err(error) => {
                tracing::warn!(execution_id = %self.execution_id, %error, "an interrupt's admission could not be read");
                None
            }
        };
        if behind != Some(holder) {
            return;
        }
        let version = match self.env.store.head(holder) {
            Ok(Some(head)) => head.version,
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(%holder, %error, "the running turn could not be read to interrupt it");
                return;
            }
        };
        let asked = self.env.interrupt(holder, version, self.execution_id);
        actix::spawn(async move {
            if let Err(error) = asked.await {
                tracing::warn!(%holder, %error, "an interrupt could not ask the running turn to pause");
            }
        });
    }

    /// C-2: this turn held its session, or stood in its line, and ended or paused: the first
    /// turn still queued may take it now. (A wake lost to a crash: startup recovery resumes
    /// queued turns, which look again.)
    pub(super) fn wake_next_in_session(&self) {
        if self.machine.present.turn.session_turn.is_some() {
            self.wake_line(true);
        }
    }

    /// Wakes the first turn but this one in its session's line (when this turn runs again,
    /// an interrupt so asks it to pause); `if_in_it`: only if this turn holds the session or
    /// stands in the line.
    pub(super) fn wake_line(&self, if_in_it: bool) {
        let Some((record, state)) = self.session_now() else {
            return;
        };
        let me = self.execution_id;
        if if_in_it && record.foreground != Some(me) && !record.waiting.contains(&me) {
            return;
        }
        let first = line_of(&record.waiting, None, state)
            .into_iter()
            .find(|id| *id != me);
        if let Some(first) = first {
            self.env.wake(first);
        }
    }

    /// After a turn a person started completed (its session already free), the
    /// embedder's naming and compaction run beside it, never holding anything up.
    pub(super) fn follow_up(&self) {
        let hooks = &self.env.conversation_hooks;
        let person_started = self.machine.present.turn.session_turn.is_some()
            || (self.head.parent_execution_id.is_none() && self.machine.present.job.is_none());
        if self.machine.status() != Status::Completed
            || !person_started
            || (hooks.namer.is_none() && hooks.policy.is_none())
        {
            return;
        }
        actix::spawn(crate::conversation_follow_up::follow_up(
            std::sync::Arc::clone(&self.env),
            self.head.session_id,
            self.execution_id,
        ));
    }
}
