//! The key layout of the store. Everything lives in one sled tree, so that one `Batch` is
//! one atomic write; the first byte of a key says what the record is.
//!
//! Invariant: these layouts never change once written. Integers are big-endian so that key
//! order is numeric order; ids are their 16 UUID bytes.
//!
//! ```text
//! byte  key                                  value
//! 0x01  meta name (ASCII)                    codec(u32 / u64)
//! 0x02  position u64 (first in the record)   the log record's location in the journal
//!                                            (`history.rs`), or the record (`codec.rs`)
//! 0x03  execution id                         head record (`head_record.rs`)
//! 0x04  execution id, first seq u64          codec(Vec<FrameRef>): an index chunk (refs older than
//!                                            the head record keeps)
//! 0x05  command id                           codec(CommandRecord)
//! 0x06  effect id                            codec(ReceiptRecord)
//! 0x07  wait id                              codec(WaitRecord)
//! 0x08  process id                           codec(ProcessRecord)
//! 0x09  blob hash (32 bytes)                 raw bytes (content-checked)
//! 0x0A  state code u8, execution id          empty: non-terminal index
//! 0x0B  incarnation number u64               codec(Incarnation)
//! 0x0C  execution id                         codec(String): quarantined
//! 0x0D  session id, execution id             empty: executions by session
//! 0x0E  job id (an execution id)             codec(JobRecord), schema 7
//! 0x0F  execution id                         codec(ProjectionRecord), schema 8
//! 0x10  execution id                         codec(PurgedRecord): purged (S-8), schema 8
//! 0x11  execution id, record key (17 bytes)  empty: records it owns (commands, receipts, waits,
//!                                            processes), schema 8
//! 0x12  ended at ms u64, execution id        empty: ended executions by time (retention), schema 8
//! 0x13  session id                           codec(SessionRecord), schema 11
//! 0x14  session id                           codec(ConversationRecord), schema 12
//! 0x15  blob hash (32 bytes), execution id     empty: an execution that uses the blob, schema 15
//! 0x16  execution id, blob hash (32 bytes)     empty: a blob the execution uses, schema 15
//! 0x17  blob hash (32 bytes)                   empty: a blob kept for good (stored before
//!                                            schema 15, its users unknown)
//! 0x18  execution id                         codec(PolicyRecord): its own restart window, schema 17
//! ```

use crate::ids::{CommandId, EffectId, ExecutionId, ProcessId, SessionId, WaitId};
use crate::records::{BlobHash, ExecutionState};

pub const META: u8 = 0x01;
pub const LOG: u8 = 0x02;
pub const HEAD: u8 = 0x03;
pub const EVENTS: u8 = 0x04;
pub const COMMAND: u8 = 0x05;
pub const RECEIPT: u8 = 0x06;
pub const WAIT: u8 = 0x07;
pub const PROCESS: u8 = 0x08;
pub const BLOB: u8 = 0x09;
pub const BY_STATE: u8 = 0x0A;
pub const INCARNATION: u8 = 0x0B;
pub const QUARANTINE: u8 = 0x0C;
pub const BY_SESSION: u8 = 0x0D;
pub const JOB: u8 = 0x0E;
pub const PROJECTION: u8 = 0x0F;
pub const PURGED: u8 = 0x10;
pub const OWNED: u8 = 0x11;
pub const ENDED: u8 = 0x12;
pub const SESSION: u8 = 0x13;
pub const CONVERSATION: u8 = 0x14;
pub const BLOB_USER: u8 = 0x15;
pub const USED_BLOB: u8 = 0x16;
pub const PINNED_BLOB: u8 = 0x17;
pub const POLICY: u8 = 0x18;

pub const META_SCHEMA_VERSION: &str = "schema_version";
/// Position of the last event whose head, events and records are written to their own keys.
/// Log records after it are replayed at open.
pub const META_MATERIALIZED_THROUGH: &str = "materialized_through";

/// The newest journal frame sled holds durably (written by the flusher before it syncs
/// sled): an open replays the frames after it.
pub const META_JOURNAL_SEQ: &str = "journal_seq";

pub fn meta(name: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + name.len());
    key.push(META);
    key.extend_from_slice(name.as_bytes());
    key
}

pub fn log(first_position: u64) -> [u8; 9] {
    prefixed_u64(LOG, first_position)
}

/// The first position a log record key names.
pub fn log_position(key: &[u8]) -> Option<u64> {
    match key {
        [LOG, rest @ ..] => Some(u64::from_be_bytes(rest.try_into().ok()?)),
        _ => None,
    }
}

pub fn head(execution_id: ExecutionId) -> [u8; 17] {
    prefixed_id(HEAD, execution_id.as_bytes())
}

pub fn events_prefix(execution_id: ExecutionId) -> [u8; 17] {
    prefixed_id(EVENTS, execution_id.as_bytes())
}

pub fn events(execution_id: ExecutionId, first_seq: u64) -> [u8; 25] {
    join(&[&events_prefix(execution_id), &first_seq.to_be_bytes()])
}

pub fn command(command_id: CommandId) -> [u8; 17] {
    prefixed_id(COMMAND, command_id.as_bytes())
}

pub fn receipt(effect_id: EffectId) -> [u8; 17] {
    prefixed_id(RECEIPT, effect_id.as_bytes())
}

pub fn wait(wait_id: WaitId) -> [u8; 17] {
    prefixed_id(WAIT, wait_id.as_bytes())
}

pub fn session(session_id: SessionId) -> [u8; 17] {
    prefixed_id(SESSION, session_id.as_bytes())
}

pub fn conversation(session_id: SessionId) -> [u8; 17] {
    prefixed_id(CONVERSATION, session_id.as_bytes())
}

pub fn job(job_id: ExecutionId) -> [u8; 17] {
    prefixed_id(JOB, job_id.as_bytes())
}

pub fn projection(execution_id: ExecutionId) -> [u8; 17] {
    prefixed_id(PROJECTION, execution_id.as_bytes())
}

pub fn policy(execution_id: ExecutionId) -> [u8; 17] {
    prefixed_id(POLICY, execution_id.as_bytes())
}

pub fn purged(execution_id: ExecutionId) -> [u8; 17] {
    prefixed_id(PURGED, execution_id.as_bytes())
}

pub fn owned_prefix(execution_id: ExecutionId) -> [u8; 17] {
    prefixed_id(OWNED, execution_id.as_bytes())
}

/// A record `record_key` (a command, receipt, wait or process key) owned by `execution_id`.
pub fn owned(execution_id: ExecutionId, record_key: &[u8; 17]) -> [u8; 34] {
    join(&[&owned_prefix(execution_id), record_key])
}

pub fn ended(ended_at_ms: u64, execution_id: ExecutionId) -> [u8; 25] {
    join(&[&prefixed_u64(ENDED, ended_at_ms), execution_id.as_bytes()])
}

/// The time and execution of an `ended` key.
pub fn ended_parts(key: &[u8]) -> Option<(u64, ExecutionId)> {
    if key.len() != 25 || key[0] != ENDED {
        return None;
    }
    let at = u64::from_be_bytes(key[1..9].try_into().ok()?);
    Some((at, execution_at(key, 9)?))
}

pub fn process(process_id: ProcessId) -> [u8; 17] {
    prefixed_id(PROCESS, process_id.as_bytes())
}

pub fn blob(hash: BlobHash) -> [u8; 33] {
    join(&[&[BLOB], &hash.0])
}

pub fn blob_users_prefix(hash: BlobHash) -> [u8; 33] {
    join(&[&[BLOB_USER], &hash.0])
}

/// Execution `execution_id` uses blob `hash` (S-9: a blob goes with its last user's purge).
pub fn blob_user(hash: BlobHash, execution_id: ExecutionId) -> [u8; 49] {
    join(&[&blob_users_prefix(hash), execution_id.as_bytes()])
}

pub fn pinned_blob(hash: BlobHash) -> [u8; 33] {
    join(&[&[PINNED_BLOB], &hash.0])
}

pub fn used_blobs_prefix(execution_id: ExecutionId) -> [u8; 17] {
    prefixed_id(USED_BLOB, execution_id.as_bytes())
}

pub fn used_blob(execution_id: ExecutionId, hash: BlobHash) -> [u8; 49] {
    join(&[&used_blobs_prefix(execution_id), &hash.0])
}

pub fn by_state_prefix(state: ExecutionState) -> [u8; 2] {
    [BY_STATE, state.code()]
}

pub fn by_state(state: ExecutionState, execution_id: ExecutionId) -> [u8; 18] {
    join(&[&by_state_prefix(state), execution_id.as_bytes()])
}

pub fn by_session_prefix(session_id: SessionId) -> [u8; 17] {
    prefixed_id(BY_SESSION, session_id.as_bytes())
}

pub fn by_session(session_id: SessionId, execution_id: ExecutionId) -> [u8; 33] {
    join(&[&by_session_prefix(session_id), execution_id.as_bytes()])
}

pub fn quarantine(execution_id: ExecutionId) -> [u8; 17] {
    prefixed_id(QUARANTINE, execution_id.as_bytes())
}

pub fn incarnation(number: u64) -> [u8; 9] {
    prefixed_u64(INCARNATION, number)
}

/// The execution id in bytes 1..17 (head, events) or 2..18 (by-state index) of a key.
pub fn execution_at(key: &[u8], offset: usize) -> Option<ExecutionId> {
    let bytes: [u8; 16] = key.get(offset..offset + 16)?.try_into().ok()?;
    Some(ExecutionId::from_bytes(bytes))
}

/// The session id in bytes `offset..offset + 16` of a key (the by-session index).
pub fn session_at(key: &[u8], offset: usize) -> Option<SessionId> {
    let bytes: [u8; 16] = key.get(offset..offset + 16)?.try_into().ok()?;
    Some(SessionId::from_bytes(bytes))
}

/// The name of the logical tree a key belongs to, for error messages.
pub fn tree_name(key: &[u8]) -> &'static str {
    match key.first() {
        Some(&META) => "meta",
        Some(&LOG) => "log",
        Some(&HEAD) => "heads",
        Some(&EVENTS) => "events",
        Some(&COMMAND) => "commands",
        Some(&RECEIPT) => "receipts",
        Some(&WAIT) => "waits",
        Some(&PROCESS) => "processes",
        Some(&BLOB) => "blobs",
        Some(&BY_STATE) => "by_state",
        Some(&INCARNATION) => "incarnations",
        Some(&QUARANTINE) => "quarantine",
        Some(&BY_SESSION) => "by_session",
        Some(&JOB) => "jobs",
        Some(&PROJECTION) => "projections",
        Some(&PURGED) => "purged",
        Some(&OWNED) => "owned",
        Some(&ENDED) => "ended",
        Some(&SESSION) => "sessions",
        Some(&CONVERSATION) => "conversations",
        Some(&BLOB_USER) | Some(&USED_BLOB) | Some(&PINNED_BLOB) => "blob users",
        Some(&POLICY) => "policies",
        _ => "unknown",
    }
}

/// A key as lowercase hex, for error messages.
pub fn display(key: &[u8]) -> String {
    key.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn prefixed_u64(prefix: u8, value: u64) -> [u8; 9] {
    join(&[&[prefix], &value.to_be_bytes()])
}

fn prefixed_id(prefix: u8, id: &[u8; 16]) -> [u8; 17] {
    join(&[&[prefix], id])
}

/// `parts` one after the other; their lengths add up to `N` (every caller's do).
#[inline]
fn join<const N: usize>(parts: &[&[u8]]) -> [u8; N] {
    let mut key = [0u8; N];
    let mut at = 0;
    for part in parts {
        key[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
    debug_assert_eq!(at, N);
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_keys_sort_numerically() {
        assert!(log(255) < log(256));
        let ex = ExecutionId::new();
        assert!(events(ex, 9) < events(ex, 10));
        assert_eq!(execution_at(&events(ex, 1), 1), Some(ex));
        assert_eq!(
            execution_at(&by_state(ExecutionState::Paused, ex), 2),
            Some(ex)
        );
    }
}
