//! What happens when a store opens (`open`): taking sled's lock, replaying the journal's
//! frames sled does not hold (`journal.rs`), migrations, replaying the
//! log tail after the materialization mark into the overlay (S-6: bounded, never the whole
//! history), loading and persisting quarantines (S-4), checking the log against what was
//! acknowledged (S-7, with the salvage an operator may choose), and recording the new
//! incarnation. The committer it hands the store to is `log.rs`.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sled::IVec;

use crate::acknowledged::{self, Acknowledged};
use crate::codec::{self, DecodedFrame, HeadIdentity, StoredFrame};
use crate::error::{Error, Result};
use crate::head_record::HeadIndex;
use crate::history;
use crate::ids::{ExecutionId, OwnerId};
use crate::journal::Journal;
use crate::keys;
use crate::migrate;
use crate::overlay::{index_state, Overlay};
use crate::shared::{now_ms, Limits, Shared};
use crate::sled_db::open_sled;
use crate::writes::batch_of;

/// An opened store, for its committer to take over: its shared state with the log tail
/// replayed, sled's data file (the flusher fsyncs it), the acknowledged mark, the journal, the new
/// incarnation, and what a salvage found.
pub(crate) struct Opened {
    pub shared: Arc<Shared>,
    pub data_file: File,
    pub acknowledged: Acknowledged,
    pub journal: Journal,
    pub incarnation: Incarnation,
    pub report: Option<SalvageReport>,
}

/// Opens (or creates) the store in `path` (`Store::open_with`; `salvaging`:
/// `Store::open_salvaging`).
pub(crate) fn open(path: &Path, limits: Limits, salvaging: bool) -> Result<Opened> {
    limits.validate()?;
    let io_error = |error| Error::io(path, error);
    std::fs::create_dir_all(path).map_err(io_error)?;
    let lock = lock_store(path)?;
    // Under the store's lock: no other opener is writing it.
    let generation = crate::generation::current(path)?;
    let sled_dir = crate::generation::dir_of(path, generation);
    let db = open_sled(&sled_dir, limits.cache_bytes)?;
    let (acknowledged, mark_unreadable) = match Acknowledged::read(&acknowledged::in_store(path)) {
        Err(Error::AcknowledgedUnreadable { .. }) if salvaging => (None, true),
        read => (read?, false),
    };
    let data_path = sled_dir.join("db");
    let data_file = File::open(&data_path).map_err(io_error)?;
    let mut sync = || {
        let synced = data_file.sync_data();
        synced.map_err(|error| Error::io(&data_path, error))
    };
    // The directory entries of sled's files must survive a power loss too.
    File::open(path)
        .and_then(|dir| dir.sync_all())
        .map_err(io_error)?;
    let segment_bytes = limits.journal_segment_bytes;
    let dirs = (path, sled_dir.as_path());
    let (mut journal, acknowledged) =
        replay_journal(&db, dirs, segment_bytes, acknowledged, &mut sync)?;
    if !limits.journal_zero_ahead {
        journal.stop_zeros();
    }
    migrate::run(&db, &mut sync)?;
    let quarantine = load_quarantine(&db)?;
    let history = journal.readable();
    let shared = Arc::new(Shared::new(
        (db, generation, lock),
        path.to_path_buf(),
        limits,
        quarantine,
        history,
    ));
    replay(&shared, salvaging)?;
    let report = salvage(&shared, acknowledged, mark_unreadable, salvaging)?;
    let incarnation = record_incarnation(&shared.db()?)?;
    shared.db()?.flush()?;
    sync()?;
    // Written after the sync above, and never raised here: what this open found may
    // hold a tail that was written and never acknowledged (a crash before its fsync);
    // only the committer raises the mark, for groups it acknowledges. Lowered only to
    // what a salvage found.
    let present = shared.durable_position.load(Ordering::Acquire);
    let mark = acknowledged.unwrap_or(0).min(present);
    let acknowledged = Acknowledged::open(&acknowledged::in_store(path), mark)?;
    Ok(Opened {
        shared,
        data_file,
        acknowledged,
        journal,
        incarnation,
        report,
    })
}

/// Applies the journal's frames after the newest one sled holds (`keys::META_JOURNAL_SEQ`)
/// to sled, oldest first, each log record as its location (`history.rs`), makes sled
/// durable, records the newest frame there, and records the last frame's position as
/// acknowledged (S-7; `acknowledged`: the mark's file). sled never holds a group the journal
/// does not (the committer writes the journal first): whatever part of those groups sled
/// recovered, each key ends as the newest frame left it. Returns the journal and the
/// acknowledged mark.
fn replay_journal(
    db: &sled::Db,
    (path, sled_dir): (&Path, &Path),
    segment_bytes: u64,
    acknowledged: Option<u64>,
    sync: &mut dyn FnMut() -> Result<()>,
) -> Result<(Journal, Option<u64>)> {
    let key = keys::meta(keys::META_JOURNAL_SEQ);
    // None: a store of schema 14, whose journal holds only frames sled may lack.
    let held = match db.get(&key)? {
        Some(bytes) => Some(codec::decode::<u64>(&key, &bytes)?),
        None => None,
    };
    let (journal, frames) = Journal::open(&path.join("journal"), held, segment_bytes)?;
    let Some(last) = frames.last() else {
        return Ok((journal, acknowledged));
    };
    for frame in &frames {
        let mut ops: Vec<(IVec, Option<IVec>)> = frame
            .ops
            .iter()
            .map(|(key, value)| (IVec::from(&key[..]), value.as_deref().map(IVec::from)))
            .collect();
        history::locate(&mut ops, &frame.locations);
        db.apply_batch(batch_of(&ops))?;
    }
    db.insert(&key, codec::encode(&last.seq))?;
    db.flush()?;
    sync()?;
    // Values sled put in files of their own: durable too.
    crate::sled_db::sync_sled_blobs(sled_dir, &mut Default::default())?;
    let mark = acknowledged.map_or(last.last_position, |file| file.max(last.last_position));
    if Some(mark) != acknowledged {
        Acknowledged::open(&acknowledged::in_store(path), mark)?;
    }
    tracing::info!(frames = frames.len(), "replayed the journal into sled");
    Ok((journal, Some(mark)))
}

/// One start of a runtime on this store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Incarnation {
    pub number: u64,
    pub owner_id: OwnerId,
    pub started_at_ms: u64,
}

/// Takes the store's lock (`DIR/lock`): one opener at a time, whichever generation of sled
/// it holds (`generation.rs`). Held until the store is closed.
pub(crate) fn lock_store(path: &Path) -> Result<File> {
    let lock_path = path.join("lock");
    let file = File::options()
        .create(true)
        .write(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(|error| Error::io(&lock_path, error))?;
    // The store's directory is what a second opener is told is locked.
    crate::sled_db::take_lock(&file, path)?;
    Ok(file)
}

/// Rebuilds the overlay from the log records after the materialization mark. The tail is
/// bounded by `Limits::overlay_len_max` and the materialization interval of the last run.
fn replay(shared: &Shared, salvaging: bool) -> Result<()> {
    let db = &shared.db()?;
    let materialized_through = shared.materialized_through()?;
    let mut durable = materialized_through;
    let mut overlay = Overlay::new(shared.limits.head_frame_refs_max);
    let mut n_frames = 0usize;
    for item in db.range(keys::log(materialized_through.saturating_add(1))..=keys::log(u64::MAX)) {
        let (key, value) = item?;
        let value = shared.history.record(&|key| shared.get(key), &key, value)?;
        let value = value.ok_or_else(|| Error::corrupted(&key))?;
        // A record whose framing is broken cannot be attributed to any execution: refuse to
        // open rather than silently drop what it acknowledged.
        let record = codec::decode_log_record(&key, &value)?;
        let record_position = keys::log_position(&key).ok_or_else(|| Error::corrupted(&key))?;
        // Positions are gap-free (S-1): a record missing in the middle of the tail is
        // acknowledged history lost, refused like a shortened log (S-7).
        if record_position != durable.saturating_add(1) {
            if !salvaging {
                return Err(Error::AcknowledgedLost {
                    acknowledged_through: record_position.saturating_sub(1),
                    present_through: durable,
                });
            }
            tracing::error!(
                from = durable + 1,
                to = record_position - 1,
                "log positions missing; salvaging"
            );
        }
        durable = durable.max(record.last_position);
        for frame in record.frames {
            match frame {
                DecodedFrame::Ok(frame) => {
                    let merged = replay_frame(shared, &mut overlay, &key, record_position, *frame)?;
                    n_frames += usize::from(merged);
                }
                DecodedFrame::Corrupt { claimed } => {
                    shared.quarantine_frame(claimed, &key, "is corrupted")
                }
            }
        }
    }
    // A quarantined execution's replayed state is partial: never write it anywhere. Its
    // frames stay in the log, and the quarantine is persisted so that moving the mark past
    // them does not make the execution look healthy at the next open.
    for (execution_id, reason) in shared.refusals.quarantined() {
        overlay.forget(execution_id);
        db.insert(keys::quarantine(execution_id), codec::encode(&reason))?;
    }
    tracing::info!(
        materialized_through,
        durable,
        n_frames,
        "replayed the log tail"
    );
    *shared.overlay_write() = overlay;
    shared
        .metrics
        .replayed_frames
        .store(n_frames as u64, Ordering::Relaxed);
    shared.durable_position.store(durable, Ordering::Release);
    Ok(())
}

/// Merges one frame of the log record at `key` into the overlay, unless its execution is
/// quarantined or purged; whether it did.
fn replay_frame(
    shared: &Shared,
    overlay: &mut Overlay,
    key: &[u8],
    record_position: u64,
    frame: StoredFrame,
) -> Result<bool> {
    let execution_id = frame.execution_id;
    // S-8: a purged execution's frames are never replayed: a purge waits until nothing of
    // its execution is in memory, not for the materialization mark to pass its frames.
    if shared.refusals.check_quarantine(execution_id).is_err()
        || shared.db()?.contains_key(keys::purged(execution_id))?
    {
        return Ok(false);
    }
    // The head before this frame: its identity (with its attempt) completes a frame that
    // does not carry one; its index state and head record index are what is on disk (a
    // materialization cut short may have written this very frame already). A head on disk
    // may be ahead of the frame: an identity changed since is carried by a later frame of
    // this replay, which puts it right, so the last head replayed is the true one.
    let (previous, indexed_state, disk_index) = match overlay.current(execution_id) {
        // What is on disk is ignored by `merge` for an execution in the overlay.
        Some((head, _)) => (Some((HeadIdentity::of(head), head.last_seq)), None, None),
        None => match shared.head_record_on_disk(execution_id) {
            Ok(Some((head, index))) => {
                let previous = (HeadIdentity::of(&head), head.last_seq);
                (Some(previous), index_state(&head), Some(index))
            }
            Ok(None) => (None, None, Some(HeadIndex::default())),
            Err(Error::Corrupted { .. }) => return Ok(false),
            Err(error) => return Err(error),
        },
    };
    // Without its identity, a frame after a gap (frames lost, opened to salvage) would
    // take an attempt from before the gap that a lost frame may have changed.
    let first_seq = frame.events.first().map_or(0, |event| event.seq);
    let after_gap = previous.is_some_and(|(_, last_seq)| first_seq > last_seq.saturating_add(1));
    if frame.identity.is_none() && after_gap {
        shared.quarantine_frame(execution_id, key, "follows frames that are lost");
        return Ok(false);
    }
    let Some(frame) = frame.complete(previous.map(|(identity, _)| identity)) else {
        shared.quarantine_frame(execution_id, key, "continues a head that is not there");
        return Ok(false);
    };
    overlay.merge(frame, record_position, indexed_state, disk_index);
    Ok(true)
}

/// Executions quarantined by an earlier open (S-4).
fn load_quarantine(db: &sled::Db) -> Result<BTreeMap<ExecutionId, String>> {
    let mut quarantine = BTreeMap::new();
    for item in db.scan_prefix([keys::QUARANTINE]) {
        let (key, value) = item?;
        let execution_id = keys::execution_at(&key, 1).ok_or_else(|| Error::corrupted(&key))?;
        let reason = codec::decode::<String>(&key, &value)
            .unwrap_or_else(|_| String::from("quarantined (reason unreadable)"));
        quarantine.insert(execution_id, reason);
    }
    Ok(quarantine)
}

/// Records a new incarnation of the runtime on this store. Written before the committer
/// starts; the caller flushes and fsyncs.
fn record_incarnation(db: &sled::Db) -> Result<Incarnation> {
    let number = match db
        .range(keys::incarnation(0)..=keys::incarnation(u64::MAX))
        .next_back()
    {
        Some(item) => {
            let (key, value) = item?;
            codec::decode::<Incarnation>(&key, &value)?.number + 1
        }
        None => 1,
    };
    let incarnation = Incarnation {
        number,
        owner_id: OwnerId::new(),
        started_at_ms: now_ms(),
    };
    db.insert(keys::incarnation(number), codec::encode(&incarnation))?;
    Ok(incarnation)
}

/// S-7: what an open to salvage found (`Store::open_salvaging`): what was acknowledged, what
/// the store still holds, and the executions it can name that lost history. Executions
/// created within the lost positions are named by nothing that survived: they are counted
/// only through `lost_positions`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SalvageReport {
    /// The highest position acknowledged before, if the record of it was readable.
    pub acknowledged_through: Option<u64>,
    /// The highest position the store holds.
    pub present_through: u64,
    /// Acknowledged positions the store no longer holds: in sled each an event; in
    /// PostgreSQL, whose positions are counted from transaction ids, the span between the
    /// two positions above, not a count of events.
    pub lost_positions: u64,
    /// Executions the by-session index names whose head is gone or unreadable.
    pub lost_executions: Vec<ExecutionId>,
    /// Executions quarantined (S-4), with the reason: their history is kept, unread.
    pub quarantined: Vec<(ExecutionId, String)>,
}

/// S-7: the log must reach every position acknowledged before: an open refuses to serve
/// less, unless `salvaging`. Salvage only what was lost: a healthy store opened to salvage
/// is opened as usual, and its mark never lowered. A salvage reads what its report needs:
/// every execution the by-session index names (a full scan: an explicit operator's action,
/// never a normal open) and whether its head is there.
fn salvage(
    shared: &Shared,
    acknowledged_through: Option<u64>,
    mark_unreadable: bool,
    salvaging: bool,
) -> Result<Option<SalvageReport>> {
    let present_through = shared.durable_position.load(Ordering::Acquire);
    let lost = acknowledged::check(acknowledged_through, present_through, salvaging)?;
    if lost.is_none() && !mark_unreadable {
        return Ok(None);
    }
    tracing::error!(
        acknowledged = ?acknowledged_through,
        present = present_through,
        "the store lost acknowledged history; salvaging what remains"
    );
    let mut lost_executions = Vec::new();
    for item in shared.db()?.scan_prefix([keys::BY_SESSION]) {
        let (key, _) = item?;
        let Some(execution_id) = keys::execution_at(&key, 17) else {
            continue;
        };
        if shared.overlay_read().current(execution_id).is_some() {
            continue;
        }
        match shared.head_record_on_disk(execution_id) {
            Ok(Some(_)) => {}
            Ok(None) | Err(Error::Corrupted { .. }) => lost_executions.push(execution_id),
            Err(error) => return Err(error),
        }
    }
    let report = SalvageReport {
        acknowledged_through,
        present_through,
        lost_positions: acknowledged_through
            .map_or(0, |acked| acked.saturating_sub(present_through)),
        lost_executions,
        quarantined: shared.refusals.quarantined(),
    };
    tracing::warn!(?report, "opened to salvage");
    Ok(Some(report))
}
