//! S-8, disk given back: offline compaction (sled reuses the space of removed keys but never
//! shrinks its file). Copies every key of a closed store into a new directory in bounded
//! batches (its log records into the new journal, `history.rs`), fsyncs it, records there the position the old store acknowledged (S-7), and
//! renames `NEW.compacting` to `NEW` only once all is durable, so a compaction cut short
//! leaves nothing that opens as a store. The old directory is never written.

use std::path::Path;

use sled::IVec;

use crate::acknowledged::{self, Acknowledged};
use crate::codec;
use crate::error::{Error, Result};
use crate::generation;
use crate::history::{self, Segments};
use crate::journal::{Journal, SEGMENT_BYTES};
use crate::keys;
use crate::open::lock_store;
use crate::sled_db::disk_bytes;
use crate::sled_db::open_sled;
use crate::store::Store;
use crate::writes::batch_of;

/// Bytes of keys and values copied per batch.
const BATCH_BYTES: usize = 8 * 1024 * 1024;
/// sled's page cache for each side of the copy.
const CACHE_BYTES: u64 = 64 * 1024 * 1024;

/// What a compaction did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CompactReport {
    pub keys: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// Copies the store in `from` (closed: its lock is taken) into the empty or missing
/// directory `to`. `progress` is told the keys copied so far after each batch.
pub fn compact(from: &Path, to: &Path, mut progress: impl FnMut(u64)) -> Result<CompactReport> {
    let occupied = std::fs::read_dir(to).is_ok_and(|mut entries| entries.next().is_some());
    if occupied {
        return Err(Error::Io {
            path: to.to_path_buf(),
            message: "the compaction's target must be a new or empty directory".into(),
        });
    }
    // A healthy store at the current schema, its log tail written to its own keys (an open
    // does all of that, and refuses a store that lost acknowledged history).
    drop(Store::open(from)?);
    let acknowledged = Acknowledged::read(&acknowledged::in_store(from))?;
    let bytes_before = disk_bytes(from);
    let target = to.to_path_buf();
    let mut name = to.file_name().unwrap_or_default().to_os_string();
    name.push(".compacting");
    let to = &to.with_file_name(name);
    if to.exists() {
        // What a compaction cut short left: never opened, so never a store.
        std::fs::remove_dir_all(to).map_err(|error| Error::io(to, error))?;
    }
    std::fs::create_dir_all(to).map_err(|error| Error::io(to, error))?;
    let keys = copy(from, to, &mut progress)?;
    // sled's flush ends in sync_file_range (see `log.rs`): the file itself is fsynced.
    let blobs = std::fs::read_dir(to.join("blobs"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path());
    for path in [to.join("db"), to.join("conf")].into_iter().chain(blobs) {
        if let Ok(handle) = std::fs::File::open(&path) {
            handle.sync_all().map_err(|error| Error::io(&path, error))?;
        }
    }
    if let Ok(dir) = std::fs::File::open(to.join("blobs")) {
        dir.sync_all().map_err(|error| Error::io(to, error))?;
    }
    if let Some(position) = acknowledged {
        Acknowledged::open(&acknowledged::in_store(to), position)?;
    }
    std::fs::File::open(to)
        .and_then(|dir| dir.sync_all())
        .map_err(|error| Error::io(to, error))?;
    let _ = std::fs::remove_dir(&target); // empty if it exists (checked above)
    std::fs::rename(to, &target).map_err(|error| Error::io(&target, error))?;
    if let Some(parent) = target
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        std::fs::File::open(parent)
            .and_then(|dir| dir.sync_all())
            .map_err(|error| Error::io(parent, error))?;
    }
    Ok(CompactReport {
        keys,
        bytes_before,
        bytes_after: disk_bytes(&target),
    })
}

/// Copies every key of the sled store in `from` into `to`, in batches of `BATCH_BYTES`:
/// each log record into `to`'s journal (sled there keeps its location, `history.rs`), the
/// rest into `to`'s sled. Returns how many keys.
fn copy(from: &Path, to: &Path, progress: &mut impl FnMut(u64)) -> Result<u64> {
    let _lock = lock_store(from)?;
    let (generation, _) = generation::newest(from)?;
    let source = open_sled(&generation::dir_of(from, generation), CACHE_BYTES)?;
    let history = Segments::open(&from.join("journal"))?;
    let target = open_sled(to, CACHE_BYTES)?;
    let (mut journal, _) = Journal::open(&to.join("journal"), Some(0), SEGMENT_BYTES)?;
    let mut batch: Vec<(IVec, Option<IVec>)> = Vec::new();
    let (mut keys, mut bytes) = (0u64, 0usize);
    for item in source.iter() {
        let (key, value) = item?;
        let value = match key.first() {
            Some(&keys::LOG) => match history.record(&|key| Ok(source.get(key)?), &key, value)? {
                Some(record) => record,
                None => continue,
            },
            // The target's own is written below.
            _ if key == keys::meta(keys::META_JOURNAL_SEQ) => continue,
            _ => value,
        };
        bytes += key.len() + value.len();
        batch.push((key, Some(value)));
        keys += 1;
        if bytes >= BATCH_BYTES {
            write(&target, &mut journal, std::mem::take(&mut batch))?;
            bytes = 0;
            progress(keys);
        }
    }
    write(&target, &mut journal, batch)?;
    let held = journal.next_seq() - 1;
    let key = keys::meta(keys::META_JOURNAL_SEQ);
    target.insert(key, codec::encode(&held))?;
    target.flush()?;
    progress(keys);
    Ok(keys)
}

/// Writes a batch of copied keys: its log records to the journal (fdatasynced), then all
/// of it to sled.
fn write(target: &sled::Db, journal: &mut Journal, batch: Vec<(IVec, Option<IVec>)>) -> Result<()> {
    let (mut records, rest): (Vec<_>, Vec<_>) = batch
        .into_iter()
        .partition(|(key, _)| key.first() == Some(&keys::LOG));
    if !records.is_empty() {
        let written = journal.write(0, &records)?;
        journal.sync()?;
        history::locate(&mut records, &written.locations);
        target.apply_batch(batch_of(&records))?;
    }
    target.apply_batch(batch_of(&rest))?;
    Ok(())
}
