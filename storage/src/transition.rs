//! What a caller asks the log to commit, and what it gets back (S-2).
//!
//! A transition is all or nothing: the version check, the fencing check, the events, the
//! head and every record upsert commit together in one group write, or none of them does.

use std::ops::RangeInclusive;

use crate::codec::{self, RecordValue};
use crate::error::{Error, Result};
use crate::event::{Event, EventEnvelope};
use crate::ids::{ExecutionId, SessionId};
use crate::records::{
    Blob, CommandRecord, ExecutionHead, JobRecord, ProcessRecord, ProjectionRecord, ReceiptRecord,
    SessionRecord, WaitRecord,
};

/// One atomic state change of one execution.
#[derive(Debug, Clone)]
pub struct Transition {
    pub execution_id: ExecutionId,
    /// Compare-and-swap on the execution's version: `Some(0)` creates the execution (it must
    /// not exist yet); `None` skips the check (a command being accepted, which changes
    /// nothing the writer read).
    pub expected_version: Option<u64>,
    /// The fencing epoch of the writing attempt; `None` for writes made by no attempt
    /// (which may create an execution or append events, never replace an existing head).
    /// A write whose epoch is lower than the highest epoch accepted so far is `Fenced`; a
    /// higher one raises it (a new attempt claims the execution, with a CAS on the version so
    /// that two claimers of the same epoch cannot both win).
    pub writer_epoch: Option<u64>,
    /// The new head; `None` keeps the current one. Required when creating. The committer
    /// sets its `version`, `last_seq`, `fencing_epoch` and `last_activity_ms`.
    pub head: Option<ExecutionHead>,
    /// At least one: every state change is a canonical event. None only for a command's
    /// rejection (`Transition::rejection`), which changes nothing of the execution.
    pub events: Vec<Event>,
    pub upserts: Vec<Upsert>,
    /// A compare-and-swap on the execution's session record, in the same atomic write
    /// (approval grants, the foreground turn).
    pub session: Option<SessionWrite>,
}

/// A transition's condition on its session's record (`SessionRecord`): the record is at
/// `expected_version` (0: it has none yet), else the transition is `SessionConflict` and
/// nothing is written. With `record`, the record becomes it, at `expected_version + 1`;
/// without, it is only checked (a grant relied on, still as it was read).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionWrite {
    pub session_id: SessionId,
    pub expected_version: u64,
    pub record: Option<SessionRecord>,
}

impl SessionWrite {
    /// Every store's rule: the record must be at the version the writer read (`current`,
    /// `None`: none yet), else the version it is at (a `SessionConflict`); then the record
    /// to write, if any, at the next version.
    pub(crate) fn decide(
        &self,
        current: Option<&SessionRecord>,
    ) -> std::result::Result<Option<SessionRecord>, u64> {
        let version = current.map_or(0, |record| record.version);
        if version != self.expected_version {
            return Err(version);
        }
        Ok(self.record.clone().map(|mut record| {
            record.session_id = self.session_id;
            record.version = self.expected_version + 1;
            record
        }))
    }
}

impl Transition {
    /// A transition of `execution_id` with the given events and nothing else.
    pub fn new(execution_id: ExecutionId, events: Vec<Event>) -> Self {
        Self {
            execution_id,
            expected_version: None,
            writer_epoch: None,
            head: None,
            events,
            upserts: Vec::new(),
            session: None,
        }
    }

    /// Creates the execution described by `head`.
    pub fn create(head: ExecutionHead, events: Vec<Event>) -> Self {
        Self::new(head.execution_id, events)
            .expect_version(0)
            .with_head(head)
    }

    /// K-1, K-4: saves a command `Rejected` and nothing else. The execution's head, version,
    /// events and capabilities stay exactly as they were; only the command record is written
    /// (checked for K-4 like any command upsert), so a retried id gets the same answer and a
    /// stale client changes nothing for the others. Answered `Recorded`. Only for a command
    /// with no record yet. The refusal was decided against the execution at `version` (and
    /// by the attempt of `epoch`, if any): decided against anything older, it is
    /// `VersionConflict` or `Fenced` and nothing is written, so a stale owner never stores a
    /// refusal the current one would not make.
    pub fn rejection(record: CommandRecord, version: u64, epoch: Option<u64>) -> Self {
        let transition = Self::new(record.execution_id, Vec::new());
        Self {
            writer_epoch: epoch,
            ..transition
                .expect_version(version)
                .with(Upsert::Command(record))
        }
    }

    /// Whether this is a rejection alone (`Transition::rejection`).
    pub(crate) fn is_rejection(&self) -> bool {
        self.events.is_empty()
            && self.head.is_none()
            && self.expected_version.is_some()
            && matches!(
                self.upserts.as_slice(),
                [Upsert::Command(record)] if record.status == crate::records::CommandStatus::Rejected
            )
    }

    pub fn expect_version(mut self, version: u64) -> Self {
        self.expected_version = Some(version);
        self
    }

    pub fn by_epoch(mut self, epoch: u64) -> Self {
        self.writer_epoch = Some(epoch);
        self
    }

    pub fn with_head(mut self, head: ExecutionHead) -> Self {
        self.head = Some(head);
        self
    }

    pub fn with(mut self, upsert: Upsert) -> Self {
        self.upserts.push(upsert);
        self
    }

    /// With a condition on (and maybe a new) session record, in the same atomic write.
    pub fn with_session(mut self, session: SessionWrite) -> Self {
        self.session = Some(session);
        self
    }
}

/// A record written with a transition.
#[derive(Debug, Clone)]
pub enum Upsert {
    /// A new command (`Accepted`, or decided at once) or its outcome. A command id that
    /// exists already makes the transition a `CommandConflict` (another payload hash or
    /// execution) or a `DuplicateCommand` (a new submission, or an outcome for a command
    /// already decided: the stored record stands). Only `Accepted` moves on.
    Command(CommandRecord),
    Receipt(ReceiptRecord),
    Wait(WaitRecord),
    Process(ProcessRecord),
    /// J-1: a Job's standing with the resource queue and its lease.
    Job(JobRecord),
    /// K-7: the execution's own restart window, with the transition that set it.
    Policy(crate::policy::PolicyRecord),
    /// S-8: the execution's projection as of a seq (replaces the one before).
    Projection(ProjectionRecord),
    /// Stored once by content; written in the same group as the transition.
    Blob(Blob),
}

impl Upsert {
    pub(crate) fn into_record(self) -> Option<RecordValue> {
        match self {
            Upsert::Command(record) => Some(RecordValue::Command(record)),
            Upsert::Receipt(record) => Some(RecordValue::Receipt(record)),
            Upsert::Wait(record) => Some(RecordValue::Wait(record)),
            Upsert::Process(record) => Some(RecordValue::Process(record)),
            Upsert::Job(record) => Some(RecordValue::Job(record)),
            Upsert::Policy(record) => Some(RecordValue::Policy(record)),
            Upsert::Projection(record) => Some(RecordValue::Projection(record)),
            Upsert::Blob(_) => None,
        }
    }
}

/// The answer to a submitted transition. Only `Committed` changed anything.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Durable on disk (flushed and fsynced) before this was sent.
    Committed(Committed),
    /// `expected_version` did not match; nothing was written.
    VersionConflict { current: u64 },
    /// The writer's epoch is older than the execution's; nothing was written.
    Fenced { current_epoch: u64 },
    /// The command id exists with the same payload: its stored record (K-4).
    DuplicateCommand { stored: CommandRecord },
    /// The command id exists with another payload; nothing was written (K-4).
    CommandConflict { stored: CommandRecord },
    /// A rejection (`Transition::rejection`) is durable: its command record alone was
    /// written; the execution is unchanged at `version`.
    Recorded { version: u64 },
    /// The session record is not at the `SessionWrite`'s expected version (it is at
    /// `current`); nothing was written.
    SessionConflict { current: u64 },
}

impl Outcome {
    /// The commit, if there was one.
    pub fn committed(self) -> Option<Committed> {
        match self {
            Outcome::Committed(committed) => Some(committed),
            _ => None,
        }
    }
}

impl Transition {
    /// Refuses, before it is queued, a transition whose frame or blobs exceed the limits
    /// (S-5). The frame limit is at most 4 GiB: frames carry a u32 length.
    pub(crate) fn check_sizes(
        &self,
        blob_bytes_max: usize,
        transition_bytes_max: usize,
    ) -> Result<()> {
        let mut blob_bytes = 0usize;
        for upsert in &self.upserts {
            if let Upsert::Blob(blob) = upsert {
                blob_bytes = blob_bytes.saturating_add(blob.bytes().len());
            }
        }
        if blob_bytes > blob_bytes_max {
            return Err(Error::PayloadTooLarge {
                what: "blob",
                len: blob_bytes,
                max: blob_bytes_max,
            });
        }
        let max = transition_bytes_max.min(u32::MAX as usize);
        let mut len = codec::encoded_size(&(&self.head, &self.events));
        for upsert in &self.upserts {
            len = len.saturating_add(match upsert {
                Upsert::Command(record) => codec::encoded_size(record),
                Upsert::Receipt(record) => codec::encoded_size(record),
                Upsert::Wait(record) => codec::encoded_size(record),
                Upsert::Process(record) => codec::encoded_size(record),
                Upsert::Job(record) => codec::encoded_size(record),
                Upsert::Policy(record) => codec::encoded_size(record),
                // A projection too large for its transition is left out at commit (S-8).
                Upsert::Projection(_) => 0,
                Upsert::Blob(_) => 0,
            });
        }
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len > max {
            return Err(Error::PayloadTooLarge {
                what: "transition",
                len,
                max,
            });
        }
        Ok(())
    }
}

/// Where a committed transition landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// The execution's version after this transition.
    pub version: u64,
    /// The seqs of the transition's events.
    pub seqs: RangeInclusive<u64>,
    /// The global positions of the transition's events.
    pub positions: RangeInclusive<u64>,
    /// The time the committer stamped on the events and the head (`last_activity_ms`).
    pub at_ms: u64,
    /// The transition's events as committed, handed back so the writer can fold them
    /// without keeping a copy while they were written.
    pub events: Vec<EventEnvelope>,
}
