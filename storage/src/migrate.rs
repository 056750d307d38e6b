//! Schema versions and migrations (S-1). Explicit and run once: each step runs inside the
//! open, before the committer starts, and the new version is written with the step's
//! changes in one batch, so a crash during a migration leaves the old version and reruns it.
//!
//! Changelog. A step marked "a mark" rewrites nothing (what came before is still read): it
//! makes an older build refuse the store (`unsupported_schema`) instead of reading what is
//! new as corrupted.
//! - 1: the initial layout (`keys.rs`, record format 1, log format 1).
//! - 2: the executions-by-session index (`0x0D`), backfilled from the heads on disk;
//!   executions created in the unmaterialized log tail get theirs when it is replayed.
//! - 3: log format 2 (`codec.rs`). A mark.
//! - 4: log format 3 (varint frames). A mark.
//! - 5: head record format 2 (`head_record.rs`: the head keeps its newest frame refs, so a
//!   materialization writes one key per execution; format 1 heads and their chunks are
//!   still read). A mark.
//! - 6: command records carry `reason_code` (record variant 4; variant 0 is still read); a
//!   rejected command may be stored as its record alone (no event, K-4). A mark.
//! - 7: Jobs (J-1): job records (`0x0E`, record variant 5) and the events `JobQueued`,
//!   `LeaseGranted`, `LeaseReleased`, `BudgetRaised`. A mark.
//! - 8: projections and retention (S-8): one projection per execution (`0x0F`, record
//!   variant 6), what a reader needs of its state as of a seq (executions without one are
//!   read by replaying their events); tombstones of purged executions (`0x10`); the records
//!   each execution owns (`0x11`) and ended executions by time (`0x12`), both backfilled.
//! - 9: the event `ModelUsage` (E-6). A mark.
//! - 10: the event `WaitDetails` (W-6, W-8). A mark.
//! - 11: session records (`0x13`, record variant 7): approval grants (W-7) and the
//!   foreground turn (C-2), changed by a transition's `SessionWrite`; the event `GrantUsed`,
//!   the control `Revoke`, the answer scopes `Tool` and `Session`, the events `SessionTurn`
//!   and `SessionTurnStarted`. A mark.
//! - 12: conversation records (`0x14`): a session's name (C-2) and compactions (C-3),
//!   written by their own compare-and-swap. A mark.
//! - 13: the event `ContextPinned` (E-8). A mark.
//! - 14: the journal (`DIR/journal/`): sled may lag the acknowledged
//!   groups, which only an open that replays the journal finds. A mark, so that an older
//!   build refuses the store instead of serving without them.
//! - 15: history in the journal (`history.rs`): a log record's value in sled may be its
//!   location in a journal segment (format 2), which segments are kept for (records kept in
//!   sled are still read); the users of each blob (`0x15`, `0x16`), so that a blob goes with
//!   the last one's purge: every blob stored before is pinned (`0x17`), its users unknown.
//! - 16: log format 4 (`codec.rs`: a frame carries the attempt only when it changes, and no
//!   longer the head's last seq and last activity, which its events give). A mark.
//! - 17: an execution's own restart window (K-7): policy records (`0x18`) and the control
//!   `SetExecutionPolicy`; the event `ContractAdopted` (K-2). A mark.

use crate::codec;
use crate::error::{Error, Result};
use crate::keys;
use crate::record_value::RecordValue;

/// The schema version this build writes and reads.
pub const SCHEMA_VERSION: u32 = 17;

/// One migration: from `from` to `from + 1`, adding its changes to the batch.
type Step = fn(&sled::Db, &mut sled::Batch) -> Result<()>;

/// The step from `from`: most versions only mark the store (see the changelog).
fn step(from: u32) -> Step {
    match from {
        1 => index_by_session,
        7 => projections,
        14 => pin_blobs,
        _ => |_, _| Ok(()),
    }
}

/// 7 → 8: the retention index of every ended execution on disk and the ownership key of
/// every command, receipt, wait and process record (projections need nothing: see the
/// changelog). A record that does not decode is left out, as its execution's reads will
/// quarantine it. Executions in the unmaterialized tail get theirs when it is replayed.
fn projections(db: &sled::Db, batch: &mut sled::Batch) -> Result<()> {
    for item in db.scan_prefix([keys::HEAD]) {
        let (key, bytes) = item?;
        let Some(execution_id) = keys::execution_at(&key, 1) else {
            continue;
        };
        if let Ok((head, _)) = crate::head_record::decode(&key, &bytes) {
            if head.state.is_terminal() {
                batch.insert(&keys::ended(head.last_activity_ms, execution_id)[..], &[]);
            }
        }
    }
    for prefix in [keys::COMMAND, keys::RECEIPT, keys::WAIT, keys::PROCESS] {
        for item in db.scan_prefix([prefix]) {
            let (key, bytes) = item?;
            let (Ok(record), Ok(key)) = (
                codec::decode::<RecordValue>(&key, &bytes),
                <[u8; 17]>::try_from(&key[..]),
            ) else {
                continue;
            };
            let Some(owner) = record.owner() else {
                continue;
            };
            batch.insert(&keys::owned(owner, &key)[..], &[]);
        }
    }
    Ok(())
}

/// 14 → 15: every blob stored so far is kept for good: which executions use it is not
/// known, so no purge may take it.
fn pin_blobs(db: &sled::Db, batch: &mut sled::Batch) -> Result<()> {
    for item in db.scan_prefix([keys::BLOB]).keys() {
        let key = item?;
        if let Some(hash) = key
            .get(1..)
            .and_then(|hash| <[u8; 32]>::try_from(hash).ok())
        {
            batch.insert(&keys::pinned_blob(crate::records::BlobHash(hash))[..], &[]);
        }
    }
    Ok(())
}

/// 1 → 2: one empty key per execution under its session. A head that does not decode is
/// left out (its execution is quarantined at its first read, as before).
fn index_by_session(db: &sled::Db, batch: &mut sled::Batch) -> Result<()> {
    for item in db.scan_prefix([keys::HEAD]) {
        let (key, bytes) = item?;
        let Some(execution_id) = keys::execution_at(&key, 1) else {
            continue;
        };
        match crate::head_record::decode(&key, &bytes) {
            Ok((head, _)) => {
                batch.insert(&keys::by_session(head.session_id, execution_id)[..], &[])
            }
            Err(error) => {
                tracing::warn!(%execution_id, %error, "not indexed by session: its head does not decode")
            }
        }
    }
    Ok(())
}

/// Brings the store to `SCHEMA_VERSION`. Returns the version found before migrating.
/// Each step is durable (flushed; fsynced by the caller's `sync`) before the next runs.
pub(crate) fn run(db: &sled::Db, sync: &mut dyn FnMut() -> Result<()>) -> Result<u32> {
    let key = keys::meta(keys::META_SCHEMA_VERSION);
    let found = match db.get(&key)? {
        Some(bytes) => codec::decode::<u32>(&key, &bytes)?,
        None => 0,
    };
    if found > SCHEMA_VERSION {
        return Err(Error::UnsupportedSchema {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    let mut version = found;
    while version < SCHEMA_VERSION {
        let mut batch = sled::Batch::default();
        step(version)(db, &mut batch)?;
        batch.insert(key.clone(), codec::encode(&(version + 1)));
        db.apply_batch(batch)?;
        db.flush()?;
        sync()?;
        tracing::info!(
            from = version,
            to = version + 1,
            "migrated the store schema"
        );
        version += 1;
    }
    Ok(found)
}
