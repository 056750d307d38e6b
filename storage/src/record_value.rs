//! A record upsert as a transition carries it and the log stores it (`RecordValue`), with
//! its stored form by variant index: its own file, so that the frame and the codec both use
//! it without importing each other.

use serde::{Deserialize, Serialize};

use crate::ids::ExecutionId;
use crate::policy::PolicyRecord;
use crate::records::{
    CommandRecord, JobRecord, ProcessRecord, ProjectionRecord, ReceiptRecord, SessionRecord,
    WaitRecord,
};

/// A record upsert carried by a transition and replayed from the log.
///
/// Stored by variant index (`WireRecord`): a command record is written as index 4 since
/// schema 6 (it gained `reason_code`); index 0, the command record before that, is still
/// read. Append new indexes, never reuse one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RecordValue {
    Command(CommandRecord),
    Receipt(ReceiptRecord),
    Wait(WaitRecord),
    Process(ProcessRecord),
    /// Since schema 7 (stored variant 5).
    Job(JobRecord),
    /// Since schema 8 (stored variant 6).
    Projection(ProjectionRecord),
    /// Since schema 11 (stored variant 7): written by the committer from a transition's
    /// `SessionWrite`, never carried as an upsert.
    Session(SessionRecord),
    /// K-7, since schema 17 (stored variant 8): an execution's own restart window.
    Policy(PolicyRecord),
}

impl RecordValue {
    /// The execution that owns the record (`keys::owned`), whose purge removes it. A Job's
    /// record and a projection are removed by their own keys, a session's never.
    pub(crate) fn owner(&self) -> Option<ExecutionId> {
        match self {
            RecordValue::Command(record) => Some(record.execution_id),
            RecordValue::Receipt(record) => Some(record.execution_id),
            RecordValue::Wait(record) => Some(record.execution_id),
            RecordValue::Process(record) => Some(record.execution_id),
            RecordValue::Policy(record) => Some(record.execution_id),
            RecordValue::Job(_) | RecordValue::Projection(_) | RecordValue::Session(_) => None,
        }
    }

    /// The execution whose purge removes the record: its owner, or the execution a Job's
    /// record or a projection is of.
    pub(crate) fn purged_with(&self) -> Option<ExecutionId> {
        match self {
            RecordValue::Job(record) => Some(record.job_id),
            RecordValue::Projection(record) => Some(record.execution_id),
            _ => self.owner(),
        }
    }

    /// The record's id: its row's in PostgreSQL.
    #[cfg(feature = "postgres")]
    pub(crate) fn id(&self) -> uuid::Uuid {
        *match self {
            RecordValue::Command(record) => record.command_id.as_uuid(),
            RecordValue::Receipt(record) => record.effect_id.as_uuid(),
            RecordValue::Wait(record) => record.wait_id.as_uuid(),
            RecordValue::Process(record) => record.process_id.as_uuid(),
            RecordValue::Job(record) => record.job_id.as_uuid(),
            RecordValue::Projection(record) => record.execution_id.as_uuid(),
            RecordValue::Session(record) => record.session_id.as_uuid(),
            RecordValue::Policy(record) => record.execution_id.as_uuid(),
        }
    }
}

/// The command record as schemas 1..=5 wrote it (no `reason_code`).
#[derive(Deserialize)]
struct CommandRecordV1 {
    command_id: crate::ids::CommandId,
    execution_id: ExecutionId,
    kind: String,
    payload_hash: [u8; 32],
    status: crate::records::CommandStatus,
    reason: Option<String>,
    result_version: Option<u64>,
    child_execution_id: Option<ExecutionId>,
    accepted_at_ms: u64,
}

/// What `RecordValue` is stored as, read back (indexes are the stored variant numbers).
#[derive(Deserialize)]
enum WireRecord {
    CommandV1(CommandRecordV1),
    Receipt(ReceiptRecord),
    Wait(WaitRecord),
    Process(ProcessRecord),
    Command(CommandRecord),
    Job(JobRecord),
    Projection(ProjectionRecord),
    Session(SessionRecord),
    Policy(PolicyRecord),
}

/// What `RecordValue` is stored as, written (the same indexes; index 0 is never written).
#[derive(Serialize)]
enum WireRecordRef<'a> {
    #[allow(dead_code)]
    CommandV1(()),
    Receipt(&'a ReceiptRecord),
    Wait(&'a WaitRecord),
    Process(&'a ProcessRecord),
    Command(&'a CommandRecord),
    Job(&'a JobRecord),
    Projection(&'a ProjectionRecord),
    Session(&'a SessionRecord),
    Policy(&'a PolicyRecord),
}

impl Serialize for RecordValue {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        match self {
            RecordValue::Command(record) => WireRecordRef::Command(record),
            RecordValue::Receipt(record) => WireRecordRef::Receipt(record),
            RecordValue::Wait(record) => WireRecordRef::Wait(record),
            RecordValue::Process(record) => WireRecordRef::Process(record),
            RecordValue::Job(record) => WireRecordRef::Job(record),
            RecordValue::Projection(record) => WireRecordRef::Projection(record),
            RecordValue::Session(record) => WireRecordRef::Session(record),
            RecordValue::Policy(record) => WireRecordRef::Policy(record),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RecordValue {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        Ok(match WireRecord::deserialize(deserializer)? {
            WireRecord::CommandV1(old) => RecordValue::Command(CommandRecord {
                command_id: old.command_id,
                execution_id: old.execution_id,
                kind: old.kind,
                payload_hash: old.payload_hash,
                status: old.status,
                reason: old.reason,
                reason_code: None,
                result_version: old.result_version,
                child_execution_id: old.child_execution_id,
                accepted_at_ms: old.accepted_at_ms,
            }),
            WireRecord::Receipt(record) => RecordValue::Receipt(record),
            WireRecord::Wait(record) => RecordValue::Wait(record),
            WireRecord::Process(record) => RecordValue::Process(record),
            WireRecord::Command(record) => RecordValue::Command(record),
            WireRecord::Job(record) => RecordValue::Job(record),
            WireRecord::Projection(record) => RecordValue::Projection(record),
            WireRecord::Session(record) => RecordValue::Session(record),
            WireRecord::Policy(record) => RecordValue::Policy(record),
        })
    }
}
