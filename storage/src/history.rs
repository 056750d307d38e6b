//! Where the log's history lives (S-8, S-9): in the journal's segments, not in sled. A log
//! record is written once, in its group's journal frame; sled keeps, at the record's key, a
//! `Location` of its bytes there (21 bytes instead of ~16 KiB). A segment is kept while any
//! record lives in it and removed whole once none does — sled 0.34.7 gives space back only
//! as fast as its pages are replaced (shared/GUIDE.md), files removed whole give it back at
//! once. Records that outlive most of their segment are copied forward into the newest one
//! (`log/purge.rs`), so a few long-lived executions do not pin whole segments.
//!
//! A record's value in sled is either a location (first byte `LOCATED`) or, in a store
//! written before schema 15 or compacted by such a build, the record itself (first byte its
//! log format, 1 to 3): both are read (`Shared::log_record`).

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{Duration, Instant};

use sled::IVec;

use crate::error::{Error, Result};
use crate::keys;

/// First byte of a log record's value in sled that is a location, not the record.
const LOCATED: u8 = 0xF1;
const LOCATION_BYTES: usize = 1 + 8 + 8 + 4;

/// Where a value written in a journal frame lies: the segment (named by its first seq), the
/// offset in it, and the length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Location {
    pub segment: u64,
    pub offset: u64,
    pub len: u32,
}

impl Location {
    pub fn encode(&self) -> [u8; LOCATION_BYTES] {
        let mut bytes = [0u8; LOCATION_BYTES];
        bytes[0] = LOCATED;
        bytes[1..9].copy_from_slice(&self.segment.to_be_bytes());
        bytes[9..17].copy_from_slice(&self.offset.to_be_bytes());
        bytes[17..21].copy_from_slice(&self.len.to_be_bytes());
        bytes
    }

    /// The location a log record's value in sled names; `Ok(None)`: the value is the record
    /// itself. A value that starts as a location and is not one is corrupt.
    pub fn decode(key: &[u8], value: &[u8]) -> Result<Option<Location>> {
        if value.first() != Some(&LOCATED) {
            return Ok(None);
        }
        let corrupted = || Error::corrupted(key);
        let bytes: &[u8; LOCATION_BYTES] = value.try_into().map_err(|_| corrupted())?;
        let u64_at = |at: usize| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[at..at + 8]);
            u64::from_be_bytes(word)
        };
        Ok(Some(Location {
            segment: u64_at(1),
            offset: u64_at(9),
            len: u32::from_be_bytes([bytes[17], bytes[18], bytes[19], bytes[20]]),
        }))
    }
}

/// Makes a group's writes what sled takes, in place: each log record's value becomes its
/// location in the journal frame that holds it (`locations`, one per write, from
/// `Journal::write`).
pub(crate) fn locate(ops: &mut [(IVec, Option<IVec>)], locations: &[Option<Location>]) {
    for ((key, value), location) in ops.iter_mut().zip(locations) {
        if let (Some(&keys::LOG), Some(value), Some(location)) = (key.first(), value, location) {
            *value = IVec::from(&location.encode()[..]);
        }
    }
}

/// The journal's segments, open for reading: shared by the journal (which adds and removes
/// them) and every reader of history.
#[derive(Debug)]
pub(crate) struct Segments {
    pub dir: PathBuf,
    files: RwLock<BTreeMap<u64, Arc<File>>>,
}

impl Segments {
    pub fn new(dir: PathBuf) -> Arc<Self> {
        Arc::new(Segments {
            dir,
            files: RwLock::new(BTreeMap::new()),
        })
    }

    /// The segments in `dir`, open to read only (a closed store's, for `compact`).
    pub fn open(dir: &Path) -> Result<Arc<Self>> {
        let segments = Segments::new(dir.to_path_buf());
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(segments),
            Err(error) => return Err(Error::io(dir, error)),
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let first = name.to_str().and_then(|name| name.strip_suffix(".wal"));
            if let Some(first) = first.and_then(|first| first.parse().ok()) {
                let path = entry.path();
                let file = File::open(&path).map_err(|error| Error::io(&path, error))?;
                segments.add(first, Arc::new(file));
            }
        }
        Ok(segments)
    }

    pub fn add(&self, first_seq: u64, file: Arc<File>) {
        let mut files = self.files.write().unwrap_or_else(PoisonError::into_inner);
        files.insert(first_seq, file);
    }

    pub fn remove(&self, first_seq: u64) {
        let mut files = self.files.write().unwrap_or_else(PoisonError::into_inner);
        files.remove(&first_seq);
    }

    /// The bytes at `location`; `Ok(None)` when its segment is gone (removed since the
    /// location was read: the record moved or was swept meanwhile).
    pub fn read(&self, location: Location) -> Result<Option<Vec<u8>>> {
        let file = {
            let files = self.files.read().unwrap_or_else(PoisonError::into_inner);
            files.get(&location.segment).cloned()
        };
        let Some(file) = file else {
            return Ok(None);
        };
        let io = |error| Error::io(&self.dir, error);
        let file_len = file.metadata().map_err(io)?.len();
        if location.offset.saturating_add(u64::from(location.len)) > file_len {
            return Err(Error::Corrupted {
                tree: "log",
                key: format!(
                    "a location past the end of segment {:020}",
                    location.segment
                ),
            });
        }
        let mut bytes = vec![0u8; location.len as usize];
        file.read_exact_at(&mut bytes, location.offset)
            .map_err(|error| Error::io(&self.dir, error))?;
        Ok(Some(bytes))
    }
}

impl Segments {
    /// The log record at `key`, whose value sled gave as `value`: read where it is located,
    /// or the value itself (a record kept in sled). A record whose segment is gone is looked
    /// up again in the store's sled now (`lookup`: it may have changed generation since), as
    /// it moved or went since `value` was read: `Ok(None)` if sled no longer has it; the same
    /// location again is history lost (`Error::Corrupted`).
    pub fn record(
        &self,
        lookup: &dyn Fn(&[u8]) -> Result<Option<IVec>>,
        key: &[u8],
        value: IVec,
    ) -> Result<Option<IVec>> {
        let mut value = value;
        loop {
            let Some(location) = Location::decode(key, &value)? else {
                return Ok(Some(value));
            };
            if let Some(bytes) = self.read(location)? {
                return Ok(Some(IVec::from(bytes)));
            }
            match lookup(key)? {
                None => return Ok(None),
                Some(now) if now != value => value = now,
                Some(_) => return Err(Error::corrupted(key)),
            }
        }
    }
}

/// The committer's count of what lives in each segment: every log record whose location
/// names it, by position. Built from sled's log keys at open, kept by each group's writes.
#[derive(Debug, Default)]
pub(crate) struct Liveness {
    records: HashMap<u64, Location>,
    segments: HashMap<u64, Live>,
    /// Records that could not be read to be copied forward: not tried again.
    unmovable: HashSet<u64>,
}

/// What lives in one segment.
#[derive(Debug)]
struct Live {
    bytes: u64,
    positions: BTreeSet<u64>,
    /// When a record in it last died (was removed, not copied forward).
    changed: Instant,
}

impl Liveness {
    /// Counts every log record sled locates in a segment.
    pub fn read(db: &sled::Db) -> Result<Self> {
        let mut liveness = Liveness::default();
        for item in db.range(keys::log(0)..=keys::log(u64::MAX)) {
            let (key, value) = item?;
            if let (Some(position), Some(location)) =
                (keys::log_position(&key), Location::decode(&key, &value)?)
            {
                liveness.located(position, Some(location));
            }
        }
        Ok(liveness)
    }

    /// The record at `position` now lives at `location` (`None`: removed, or kept in sled).
    pub fn located(&mut self, position: u64, location: Option<Location>) {
        let old = match location {
            Some(location) => self.records.insert(position, location),
            None => self.records.remove(&position),
        };
        if let Some(old) = old {
            if let Entry::Occupied(mut live) = self.segments.entry(old.segment) {
                let live_now = live.get_mut();
                live_now.bytes = live_now.bytes.saturating_sub(u64::from(old.len));
                live_now.positions.remove(&position);
                // A record that died; one copied forward says nothing of the others.
                if location.is_none() {
                    live_now.changed = Instant::now();
                }
                if live_now.positions.is_empty() {
                    live.remove();
                }
            }
        }
        if let Some(location) = location {
            let live = self
                .segments
                .entry(location.segment)
                .or_insert_with(|| Live {
                    bytes: 0,
                    positions: BTreeSet::new(),
                    changed: Instant::now(),
                });
            live.bytes += u64::from(location.len);
            live.positions.insert(position);
        }
    }

    /// Follows a group's writes as sled takes them (`locate`).
    pub fn apply(&mut self, ops: &[(IVec, Option<IVec>)]) -> Result<()> {
        for (key, value) in ops {
            let Some(position) = keys::log_position(key) else {
                continue;
            };
            let location = match value {
                Some(value) => Location::decode(key, value)?,
                None => None,
            };
            self.located(position, location);
        }
        Ok(())
    }

    /// The segments some record lives in.
    pub fn segments(&self) -> impl Iterator<Item = u64> + '_ {
        self.segments.keys().copied()
    }

    pub fn live_bytes(&self, segment: u64) -> u64 {
        self.segments.get(&segment).map_or(0, |live| live.bytes)
    }

    /// Whether the records living in `segment` are worth copying forward: they fill less
    /// than `share` of its `segment_bytes`, and none left it for `settled` (what is dying
    /// soon is left to die rather than copied).
    pub fn sparse(&self, segment: u64, segment_bytes: u64, share: f64, settled: Duration) -> bool {
        self.segments.get(&segment).is_some_and(|live| {
            (live.bytes as f64) < segment_bytes as f64 * share && live.changed.elapsed() >= settled
        })
    }

    /// The records living in `segment` that can be copied forward, oldest first, at most
    /// `max`.
    pub fn records_in(&self, segment: u64, max: usize) -> Vec<(u64, Location)> {
        let Some(live) = self.segments.get(&segment) else {
            return Vec::new();
        };
        let movable = live
            .positions
            .iter()
            .filter(|at| !self.unmovable.contains(at));
        let located = |position: &u64| Some((*position, *self.records.get(position)?));
        movable.take(max).filter_map(located).collect()
    }

    /// The record at `position` could not be read to be copied forward.
    pub fn unmovable(&mut self, position: u64) {
        self.unmovable.insert(position);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s9_a_location_reads_back_and_a_record_kept_in_sled_is_not_one() {
        let location = Location {
            segment: 7,
            offset: 1 << 33,
            len: 16_400,
        };
        let key = keys::log(5);
        assert_eq!(
            Location::decode(&key, &location.encode()).expect("decodes"),
            Some(location)
        );
        assert_eq!(Location::decode(&key, &[3, 0, 0]).expect("a record"), None);
        assert!(Location::decode(&key, &location.encode()[..20]).is_err());
    }

    #[test]
    fn s9_liveness_counts_each_record_once_where_it_lives_now() {
        let at = |segment, len| Location {
            segment,
            offset: 8,
            len,
        };
        let mut liveness = Liveness::default();
        liveness.located(1, Some(at(1, 100)));
        liveness.located(2, Some(at(1, 50)));
        assert_eq!(liveness.live_bytes(1), 150);
        // Copied forward: it counts in its new segment only.
        liveness.located(1, Some(at(9, 100)));
        assert_eq!((liveness.live_bytes(1), liveness.live_bytes(9)), (50, 100));
        liveness.located(2, None);
        assert_eq!(liveness.live_bytes(1), 0);
        assert_eq!(liveness.records_in(9, 10), vec![(1, at(9, 100))]);
        assert!(liveness.records_in(1, 10).is_empty());
    }
}
