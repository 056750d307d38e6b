//! The PostgreSQL committer: threads that each take queued requests as a group and commit
//! them in one SQL transaction (S-2, S-3). A store runs `COMMITTERS` of them, each on its
//! own connection; an execution's requests always go to the same one (by its id), so they
//! commit in the order they were submitted.
//!
//! A group (`group.rs`): take its transaction id and number its events from it; read
//! the heads it names `FOR UPDATE` (a writer on another connection or node waits, then sees
//! the new version), their tombstones and the command records its transitions carry; decide
//! every transition in memory exactly as the sled committer does (K-4, fencing, version,
//! shape); write heads, records, blobs and events with one statement per table (arrays,
//! `UNNEST`); commit. No row is shared by every group, so groups of every committer and
//! node commit side by side and PostgreSQL flushes their commits together. Locks are taken
//! in one order (heads by id, then commands' advisory locks by key, records by kind and id,
//! blobs by hash), so two groups of transitions do not deadlock; a purge's deletes are not
//! ordered, and PostgreSQL ends a deadlock it finds by failing one whole group.
//!
//! A row of `op_events` holds one transition's events (`seq..=last_seq`), encoded together;
//! its `position` column is the first event's position, the others follow it.
//!
//! Nothing is answered before the commit returns, and PostgreSQL returns from a commit once
//! its WAL is flushed (`synchronous_commit`, on by default: an operator who turns it off
//! trades this guarantee away).
//!
//! A group that fails before its commit is rolled back whole: every request in it gets the
//! error and the store goes on. A commit whose outcome is unknown (the connection broke
//! while committing) stops the store (`FailStop`), as a failed fsync stops the sled store:
//! what it acknowledges from then on would rest on a guess.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use postgres::{Client, Transaction as SqlTransaction};
use tokio::sync::{mpsc, oneshot};

use super::group::Group;
use super::statements::{Statements, GROUP_EVENTS_MAX};
use super::{database, Shared};
use crate::error::{Error, Result};
use crate::event_store::PurgeStep;
use crate::ids::ExecutionId;
use crate::shared::add_elapsed_micros;
use crate::transition::{Outcome, Transition};

/// What the committer is asked. Nearly every request is a transition: boxing it would cost
/// an allocation each to make the rare purge smaller.
#[allow(clippy::large_enum_variant)]
pub(super) enum Request {
    Transition {
        transition: Transition,
        reply: oneshot::Sender<Result<Outcome>>,
    },
    Purge {
        execution_id: ExecutionId,
        ended_before: Option<u64>,
        reply: oneshot::Sender<Result<PurgeStep>>,
    },
}

/// A decided request, answered once its group committed (or failed).
enum Answer {
    Transition(oneshot::Sender<Result<Outcome>>, Result<Outcome>),
    Purge(oneshot::Sender<Result<PurgeStep>>, Result<PurgeStep>),
}

impl Answer {
    fn send(self) {
        // A waiter that went away needs no answer.
        match self {
            Answer::Transition(reply, outcome) => drop(reply.send(outcome)),
            Answer::Purge(reply, step) => drop(reply.send(step)),
        }
    }

    fn fail(self, error: Error) {
        match self {
            Answer::Transition(reply, _) => drop(reply.send(Err(error))),
            Answer::Purge(reply, _) => drop(reply.send(Err(error))),
        }
    }
}

impl Request {
    /// The execution it is about: its committer is chosen by it.
    pub(super) fn execution_id(&self) -> ExecutionId {
        match self {
            Request::Transition { transition, .. } => transition.execution_id,
            Request::Purge { execution_id, .. } => *execution_id,
        }
    }

    /// The events it writes at most (`PgStore::submit` refuses more than `GROUP_EVENTS_MAX`).
    fn events_len(&self) -> usize {
        match self {
            Request::Transition { transition, .. } => transition.events.len(),
            Request::Purge { .. } => 0,
        }
    }

    fn fail(self, error: Error) {
        match self {
            Request::Transition { reply, .. } => drop(reply.send(Err(error))),
            Request::Purge { reply, .. } => drop(reply.send(Err(error))),
        }
    }
}

/// What a committer's queue carries: a request, or the store's close, after which the queue
/// takes nothing more and the committer stops once it has answered what is in it.
// Nearly every item is a request; boxing it would cost an allocation per transition to make
// the one close smaller (as the sled committer's `Request::Close`).
#[allow(clippy::large_enum_variant)]
pub(super) enum Queued {
    Request(Request),
    Close,
}

/// A request taken from `queue`, or `None` for the close (the queue is closed then).
fn taken(queue: &mut mpsc::Receiver<Queued>, item: Queued) -> Option<Request> {
    match item {
        Queued::Request(request) => Some(request),
        Queued::Close => {
            queue.close();
            None
        }
    }
}

/// The committer's loop: a group per turn, until the store closes or every handle is gone.
pub(super) fn run(shared: Arc<Shared>, client: Option<Client>, mut queue: mpsc::Receiver<Queued>) {
    let mut connection = client.and_then(|client| match Statements::prepare(client) {
        Ok(prepared) => Some(prepared),
        Err(error) => {
            tracing::warn!(%error, "preparing the committer's statements; connecting again");
            None
        }
    });
    // A request that would have taken its group past `GROUP_EVENTS_MAX`: the next one's first.
    let mut carried = None;
    loop {
        let first = match carried.take() {
            Some(request) => request,
            None => match queue.blocking_recv() {
                Some(item) => match taken(&mut queue, item) {
                    Some(request) => request,
                    None => continue,
                },
                None => break,
            },
        };
        let mut events = first.events_len();
        let mut requests = vec![first];
        while requests.len() < shared.limits.batch_len_max.max(1) {
            let Some(request) = queue
                .try_recv()
                .ok()
                .and_then(|item| taken(&mut queue, item))
            else {
                break;
            };
            events += request.events_len();
            if events > GROUP_EVENTS_MAX {
                carried = Some(request);
                break;
            }
            requests.push(request);
        }
        if let Some(reason) = shared.refusals.failure() {
            for request in requests {
                request.fail(Error::FailStop(reason.clone()));
            }
            continue;
        }
        // A connection that broke is opened again for the next group.
        let open = match connection.take().filter(|(client, _)| !client.is_closed()) {
            Some(open) => Ok(open),
            None => super::connect(&shared.url).and_then(Statements::prepare),
        };
        let (mut client, statements) = match open {
            Ok(open) => open,
            Err(error) => {
                for request in requests {
                    request.fail(error.clone());
                }
                continue;
            }
        };
        let started = Instant::now();
        commit_group(&shared, &mut client, &statements, requests);
        add_elapsed_micros(&shared.metrics.group_micros_total, started);
        connection = Some((client, statements));
    }
}

/// Decides and commits one group, then answers it.
fn commit_group(
    shared: &Shared,
    client: &mut Client,
    statements: &Statements,
    requests: Vec<Request>,
) {
    let started_group = Instant::now();
    let transitions = requests
        .iter()
        .filter(|request| matches!(request, Request::Transition { .. }))
        .count() as u64;
    let mut answers = Vec::with_capacity(requests.len());
    let mut remaining = requests.into_iter();
    let decided = decide(shared, client, statements, &mut remaining, &mut answers);
    let error = match decided {
        Ok((transaction, last_position)) => {
            let started = Instant::now();
            match transaction.commit() {
                Ok(()) => {
                    if let Some(position) = last_position {
                        shared.acknowledged.fetch_max(position, Ordering::Relaxed);
                    }
                    add_elapsed_micros(&shared.metrics.fsync_micros_total, started);
                    let metrics = &shared.metrics;
                    // Only a committed group, as `groups` counts: its time to the COMMIT.
                    metrics.fsync_seconds.observe_duration(started.elapsed());
                    metrics
                        .group_seconds
                        .observe_duration(started_group.elapsed());
                    metrics.group_transitions.observe(transitions as f64);
                    metrics.groups.fetch_add(1, Ordering::Relaxed);
                    metrics.fsyncs.fetch_add(1, Ordering::Relaxed);
                    metrics
                        .transitions
                        .fetch_add(transitions, Ordering::Relaxed);
                    answers.into_iter().for_each(Answer::send);
                    return;
                }
                // The server answered: the transaction was rolled back.
                Err(error) if error.as_db_error().is_some() => database(error),
                Err(error) => {
                    let reason = format!("a commit's outcome is unknown: {error}");
                    tracing::error!(%reason, "the PostgreSQL store stops acknowledging");
                    shared.refusals.fail(reason.clone());
                    Error::FailStop(reason)
                }
            }
        }
        Err(error) => error,
    };
    tracing::error!(%error, "a PostgreSQL group commit failed; every request in it is refused");
    for answer in answers {
        answer.fail(error.clone());
    }
    for request in remaining {
        request.fail(error.clone());
    }
}

/// Opens the group's transaction, decides every request (taken from `requests` one by one,
/// its answer pushed to `answers`) and writes what committed; the caller commits. Returns
/// the transaction and the last position it writes, if it writes events.
fn decide<'a>(
    shared: &Shared,
    client: &'a mut Client,
    statements: &Statements,
    requests: &mut std::vec::IntoIter<Request>,
    answers: &mut Vec<Answer>,
) -> Result<(SqlTransaction<'a>, Option<u64>)> {
    let mut transaction = client.transaction().map_err(database)?;
    let (mut transitions, mut purges) = (Vec::new(), Vec::new());
    for request in requests.as_slice() {
        match request {
            Request::Transition { transition, .. } => transitions.push(transition),
            Request::Purge { execution_id, .. } => purges.push(*execution_id),
        }
    }
    let mut group = Group::load(shared, &mut transaction, statements, &transitions, &purges)?;
    for request in requests.by_ref() {
        match request {
            Request::Transition { transition, reply } => {
                let outcome = group.apply(shared, transition);
                answers.push(Answer::Transition(reply, outcome));
            }
            Request::Purge {
                execution_id,
                ended_before,
                reply,
            } => {
                let step = group.purge(shared, &mut transaction, execution_id, ended_before);
                if let Err(Error::Database(_)) = &step {
                    // A statement failed: the transaction is aborted; so is the group.
                    return Err(step.err().unwrap_or(Error::Closed));
                }
                answers.push(Answer::Purge(reply, step));
            }
        }
    }
    let last_position = group.last_position();
    group.write(&mut transaction, statements)?;
    Ok((transaction, last_position))
}
