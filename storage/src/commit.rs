//! The commit rule, once for both stores (S-2, A-1, K-4, and the session write): the
//! shape a transition must have, a retried command's stored outcome, fencing, the expected
//! version, the session record's compare-and-swap, and which head a transition may bring.
//! Pure: it reads what it needs through `View` — each backend answers from its group's
//! view, then its store — and returns a `Verdict`. The sled committer (`log/apply.rs`) and
//! PostgreSQL's group (`pg/group.rs`) write what the verdict says; nothing else decides.
//!
//! What a committing verdict turns into is one shape for both stores too (`Next::frame`:
//! the head as the committer sets it, the events placed, the records; `Written::fit`: S-8's
//! size rule). How a frame is encoded, sized and stored is each backend's own; this reads
//! no clock.

use crate::error::{Error, Result};
use crate::event::EventEnvelope;
use crate::frame::Frame;
use crate::ids::{CommandId, SessionId};
use crate::record_value::RecordValue;
use crate::records::{Blob, CommandRecord, CommandStatus, ExecutionHead, SessionRecord};
use crate::transition::{Committed, Outcome, Transition, Upsert};

/// What a store holds of the execution a transition names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    pub version: u64,
    pub fencing_epoch: u64,
    pub last_seq: u64,
}

impl Held {
    pub fn of(head: &ExecutionHead) -> Self {
        Self {
            version: head.version,
            fencing_epoch: head.fencing_epoch,
            last_seq: head.last_seq,
        }
    }
}

/// What the rule reads, as the backend's view holds it (what its group wrote, then what is
/// stored). A read that fails (a record that does not decode) fails the transition.
pub trait View {
    /// Whether the execution may be written at all: an error for one quarantined (its
    /// records do not decode) or purged. Asked after the transition's shape is checked.
    fn writable(&self) -> Result<()>;
    /// The execution's head as it stands, read once and only when the rule needs it: after a
    /// retried command's stored outcome, which answers even an execution that moved on.
    fn head(&mut self) -> Result<Option<Held>>;
    fn command(&self, command_id: CommandId) -> Result<Option<CommandRecord>>;
    fn session(&self, session_id: SessionId) -> Result<Option<SessionRecord>>;
}

/// What the rule decides of one transition.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Nothing is written; this answers the transition: a retried command's stored outcome,
    /// `Fenced`, `VersionConflict`, `SessionConflict`.
    Answer(Outcome),
    /// A rejection alone: its command record (new: checked) is written, the execution stays
    /// at `version`.
    Rejection { version: u64 },
    /// The transition commits.
    Commit(Next),
}

/// How a committing transition changes its execution.
#[derive(Debug, Clone, PartialEq)]
pub struct Next {
    pub version: u64,
    pub fencing_epoch: u64,
    /// The seqs of its events.
    pub first_seq: u64,
    pub last_seq: u64,
    /// It creates the execution (the head it brings is the first).
    pub creates: bool,
    /// The session record it writes, if its session write brings one.
    pub session: Option<SessionRecord>,
}

/// What a committing transition writes (`Next::frame`).
pub struct Written {
    /// The head it leads to, its events and its records.
    pub frame: Frame,
    /// The blobs it stores by content.
    pub blobs: Vec<Blob>,
    /// Its answer, but for its events, which the backend hands back.
    pub committed: Committed,
}

impl Next {
    /// The frame `transition` becomes: the head it brings, else the one it keeps (`current`,
    /// asked only then), with what the committer sets on it; its events at their seqs and
    /// from `first_position`; its records, with the session record the rule decided.
    pub fn frame(
        self,
        transition: Transition,
        current: impl FnOnce() -> Option<ExecutionHead>,
        at_ms: u64,
        first_position: u64,
    ) -> Result<Written> {
        let Transition {
            execution_id,
            writer_epoch,
            head,
            events,
            upserts,
            ..
        } = transition;
        // Refused by the rule already: a transition that keeps a head of none.
        let mut head = head
            .or_else(current)
            .ok_or(Error::UnknownExecution(execution_id))?;
        head.version = self.version;
        head.fencing_epoch = self.fencing_epoch;
        head.last_activity_ms = at_ms;
        head.last_seq = self.last_seq;
        let events: Vec<EventEnvelope> = events
            .into_iter()
            .enumerate()
            .map(|(index, event)| EventEnvelope {
                execution_id,
                seq: self.first_seq + index as u64,
                position: first_position + index as u64,
                at_ms,
                writer_epoch: writer_epoch.unwrap_or(0),
                event,
            })
            .collect();
        let (mut records, mut blobs) = (Vec::new(), Vec::new());
        for upsert in upserts {
            match upsert {
                Upsert::Blob(blob) => blobs.push(blob),
                upsert => records.extend(upsert.into_record()),
            }
        }
        records.extend(self.session.map(RecordValue::Session));
        let committed = Committed {
            version: self.version,
            seqs: self.first_seq..=self.last_seq,
            positions: first_position..=first_position + events.len() as u64 - 1,
            at_ms,
            events: Vec::new(),
        };
        let frame = Frame {
            head,
            events,
            records,
        };
        Ok(Written {
            frame,
            blobs,
            committed,
        })
    }
}

impl Written {
    /// S-8: a projection is a cache: one that makes its transition larger than
    /// `transition_bytes_max` (at most 4 GiB: a frame carries a u32 length) is left out
    /// (readers replay), never the reason the transition fails. `size` measures the frame
    /// as the backend stores it.
    pub fn fit(
        &mut self,
        transition_bytes_max: usize,
        mut size: impl FnMut(&Frame) -> u64,
    ) -> Result<()> {
        let max = transition_bytes_max.min(u32::MAX as usize);
        let projected = |record: &RecordValue| matches!(record, RecordValue::Projection(_));
        let mut len = size(&self.frame);
        if len > max as u64 && self.frame.records.iter().any(projected) {
            self.frame.records.retain(|record| !projected(record));
            len = size(&self.frame);
        }
        if len > max as u64 {
            return Err(Error::PayloadTooLarge {
                what: "transition",
                len: usize::try_from(len).unwrap_or(usize::MAX),
                max,
            });
        }
        Ok(())
    }
}

/// The rule: what `transition` does against what `view` holds.
pub fn decide(transition: &Transition, view: &mut impl View) -> Result<Verdict> {
    let rejection = transition.is_rejection();
    check_shape(transition, rejection)?;
    view.writable()?;
    // K-4 before the version check: a retried command gets its stored outcome even when the
    // execution has moved on since.
    if let Some(outcome) = stored_outcome(transition, view)? {
        return Ok(Verdict::Answer(outcome));
    }
    let held = view.head()?;
    let current = held.unwrap_or(Held {
        version: 0,
        fencing_epoch: 0,
        last_seq: 0,
    });
    let stale = transition
        .writer_epoch
        .is_some_and(|epoch| epoch < current.fencing_epoch);
    // The planted bug `skip_fencing` checks no epoch (but a rejection's).
    if stale && (rejection || !crate::planted::planted(crate::planted::Bug::SkipFencing)) {
        return Ok(Verdict::Answer(Outcome::Fenced {
            current_epoch: current.fencing_epoch,
        }));
    }
    if rejection && held.is_none() {
        return Err(Error::UnknownExecution(transition.execution_id));
    }
    if let Some(expected) = transition.expected_version {
        if expected != current.version {
            return Ok(Verdict::Answer(Outcome::VersionConflict {
                current: current.version,
            }));
        }
    }
    if rejection {
        return rejection_of(transition, view, current.version);
    }
    // The session record is where the transition read it, in this same write.
    let session = match &transition.session {
        Some(write) => match write.decide(view.session(write.session_id)?.as_ref()) {
            Ok(record) => record,
            Err(current) => return Ok(Verdict::Answer(Outcome::SessionConflict { current })),
        },
        None => None,
    };
    check_head(transition, held.is_some())?;
    let first_seq = current.last_seq + 1;
    let last_seq = first_seq + transition.events.len() as u64 - 1;
    let beyond = transition.upserts.iter().any(|upsert| {
        matches!(upsert, Upsert::Projection(projection) if projection.through_seq > last_seq)
    });
    if beyond {
        return Err(Error::InvalidTransition(
            "a projection is of a seq past the transition's last event".into(),
        ));
    }
    Ok(Verdict::Commit(Next {
        version: current.version + 1,
        fencing_epoch: transition
            .writer_epoch
            .map_or(current.fencing_epoch, |epoch| {
                epoch.max(current.fencing_epoch)
            }),
        first_seq,
        last_seq,
        creates: held.is_none(),
        session,
    }))
}

/// What any transition must be, whatever the store holds.
fn check_shape(transition: &Transition, rejection: bool) -> Result<()> {
    let invalid = |why: &str| Err(Error::InvalidTransition(why.into()));
    if rejection && transition.session.is_some() {
        return invalid("a rejection alone carries no session write");
    }
    if transition.events.is_empty() && !rejection {
        return invalid("a transition carries at least one event");
    }
    if transition
        .head
        .as_ref()
        .is_some_and(|head| head.execution_id != transition.execution_id)
    {
        return invalid("the head names another execution");
    }
    let foreign_projection = transition.upserts.iter().any(|upsert| {
        matches!(upsert, Upsert::Projection(projection)
            if projection.execution_id != transition.execution_id)
    });
    if foreign_projection {
        return invalid("a projection goes with an event of its own execution");
    }
    Ok(())
}

/// K-4: the outcome stored for a command the transition carries again, if any — a conflict
/// for another payload, the stored record for a duplicate.
fn stored_outcome(transition: &Transition, view: &impl View) -> Result<Option<Outcome>> {
    for upsert in &transition.upserts {
        let Upsert::Command(command) = upsert else {
            continue;
        };
        if command.execution_id != transition.execution_id {
            return Err(Error::InvalidTransition(
                "a command names another execution".into(),
            ));
        }
        let Some(stored) = view.command(command.command_id)? else {
            continue;
        };
        if stored.payload_hash != command.payload_hash
            || stored.execution_id != command.execution_id
        {
            return Ok(Some(Outcome::CommandConflict { stored }));
        }
        // A new submission, or an outcome for a command already decided: the stored record
        // stands and nothing is written. Only an accepted command can move on to applied or
        // rejected.
        if command.status == CommandStatus::Accepted || stored.status != CommandStatus::Accepted {
            return Ok(Some(Outcome::DuplicateCommand { stored }));
        }
    }
    Ok(None)
}

/// A rejection alone is for a new command: one saved before (accepted, its decision
/// pending) is decided by an event of its execution, like its acceptance was.
fn rejection_of(transition: &Transition, view: &impl View, version: u64) -> Result<Verdict> {
    for upsert in &transition.upserts {
        if let Upsert::Command(record) = upsert {
            if let Some(stored) = view.command(record.command_id)? {
                return Err(Error::InvalidTransition(format!(
                    "command {} was saved {:?}: a rejection alone is for a new command",
                    stored.command_id, stored.status
                )));
            }
        }
    }
    Ok(Verdict::Rejection { version })
}

/// Which head a transition may bring: one to create its execution (at version 0), or, from
/// an attempt only, one to replace it.
fn check_head(transition: &Transition, exists: bool) -> Result<()> {
    match (exists, transition.head.is_some()) {
        (false, false) => Err(Error::UnknownExecution(transition.execution_id)),
        (false, true) if transition.expected_version != Some(0) => Err(Error::InvalidTransition(
            "creating an execution needs expected_version Some(0)".into(),
        )),
        (true, true) if transition.writer_epoch.is_none() => Err(Error::InvalidTransition(
            "only an attempt (a writer epoch) may replace an existing head".into(),
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
#[path = "commit_tests.rs"]
mod tests;
