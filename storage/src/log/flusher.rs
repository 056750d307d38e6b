//! sled made durable behind the journal: a thread flushes sled and fsyncs its files every
//! `FLUSH_INTERVAL` (sooner when the journal grew by `FLUSH_JOURNAL_BYTES`), then records
//! the acknowledged mark (S-7) and lets the committer drop the journal segments sled now
//! holds. None of this is on an acknowledgement's path: the journal's fdatasync is. A failed
//! flush or fsync stops the store (fail-stop), as on the committer.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::acknowledged::Acknowledged;
use crate::error::{Error, Result};
use crate::shared::{add_elapsed_micros, Shared};

/// Longest time sled's writes wait in memory for the flusher.
const FLUSH_INTERVAL: Duration = Duration::from_millis(200);
/// Journal bytes after which the committer asks for a flush at once.
pub(super) const FLUSH_JOURNAL_BYTES: u64 = 32 * 1024 * 1024;

/// What the committer and the flusher share.
pub(super) struct Flushing {
    /// What `sync_through` makes durable, one caller at a time.
    sled: Mutex<SledFiles>,
    /// The newest group applied to sled: its journal seq and last log position.
    applied: Mutex<(u64, u64)>,
    /// The newest journal seq sled holds durably.
    durable_seq: AtomicU64,
    /// Asks the flusher to flush now, or (`true` in the mutex) to stop.
    wake: Condvar,
    stop: Mutex<bool>,
}

/// sled's files, and the acknowledged mark recorded once they are durable.
struct SledFiles {
    data_file: File,
    acknowledged: Acknowledged,
    /// Files sled wrote under `blobs/` that are fsynced already.
    synced_blobs: HashSet<OsString>,
}

impl Flushing {
    /// sled durable through journal seq `durable_seq` (what the open replayed and synced).
    pub fn new(data_file: File, acknowledged: Acknowledged, durable_seq: u64) -> Arc<Self> {
        let position = acknowledged.position();
        Arc::new(Flushing {
            sled: Mutex::new(SledFiles {
                data_file,
                acknowledged,
                synced_blobs: HashSet::new(),
            }),
            applied: Mutex::new((durable_seq, position)),
            durable_seq: AtomicU64::new(durable_seq),
            wake: Condvar::new(),
            stop: Mutex::new(false),
        })
    }

    /// The group with journal seq `seq`, through log position `position`, is in sled.
    pub fn applied(&self, seq: u64, position: u64) {
        *lock(&self.applied) = (seq, position);
    }

    pub fn durable_seq(&self) -> u64 {
        self.durable_seq.load(Ordering::Acquire)
    }

    /// Asks for a flush now.
    pub fn nudge(&self) {
        self.wake.notify_one();
    }

    /// Stops the flusher thread (the store closes; the committer syncs last).
    pub fn stop(&self) {
        *lock(&self.stop) = true;
        self.wake.notify_one();
    }

    /// The newest group applied to sled: its journal seq and last log position.
    pub fn applied_now(&self) -> (u64, u64) {
        *lock(&self.applied)
    }

    /// Makes `db`, generation `number` — durable through journal seq `seq`, its data file
    /// `data_file` — the store's sled, between two flushes (`generation.rs`).
    pub fn switch(
        &self,
        shared: &Shared,
        (db, number): (sled::Db, u64),
        data_file: File,
        seq: u64,
    ) {
        let mut sled = lock(&self.sled);
        shared.switch_sled(db, number);
        sled.data_file = data_file;
        sled.synced_blobs.clear();
        self.durable_seq.fetch_max(seq, Ordering::AcqRel);
    }

    /// Makes everything applied to sled so far durable: sled's flush, an fsync of its data
    /// file and of new files under `blobs/`, then the acknowledged mark. Returns the journal
    /// seq sled now holds.
    pub fn sync(&self, shared: &Shared) -> Result<u64> {
        let mut sled = lock(&self.sled);
        let (seq, position) = *lock(&self.applied);
        // Written before the flush, so sled holds it only with every group before it.
        let key = crate::keys::meta(crate::keys::META_JOURNAL_SEQ);
        let db = shared.db()?;
        db.insert(key, crate::codec::encode(&seq))?;
        let started = Instant::now();
        db.flush()?;
        add_elapsed_micros(&shared.metrics.flush_micros_total, started);
        let (_, dir) = shared.generation_of_sled();
        sled.data_file
            .sync_data()
            .map_err(|error| Error::io(&dir.join("db"), error))?;
        crate::sled_db::sync_sled_blobs(&dir, &mut sled.synced_blobs)?;
        // B10: sled durable through the group, its acknowledged mark not yet recorded.
        crate::failpoint!("B10");
        if position > sled.acknowledged.position() {
            sled.acknowledged.write(position)?;
        }
        self.durable_seq.fetch_max(seq, Ordering::AcqRel);
        Ok(seq)
    }
}

/// The flusher's loop, until `stop`; a failed sync stops the store.
pub(super) fn spawn(
    shared: Arc<Shared>,
    flushing: Arc<Flushing>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("openprogram-flusher".into())
        .spawn(move || loop {
            {
                let stop = lock(&flushing.stop);
                if *stop {
                    return; // asked while it synced: no wait for a wake already sent
                }
                let (stop, _) = flushing
                    .wake
                    .wait_timeout(stop, FLUSH_INTERVAL)
                    .unwrap_or_else(PoisonError::into_inner);
                if *stop {
                    return;
                }
            }
            if shared.refusals.failure().is_some() {
                return;
            }
            let (seq, _) = *lock(&flushing.applied);
            if seq <= flushing.durable_seq() {
                continue;
            }
            if let Err(error) = flushing.sync(&shared) {
                let reason = error.to_string();
                tracing::error!(%reason, "store entered fail-stop: sled could not be made durable");
                shared.refusals.fail(reason);
                return;
            }
        })
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
