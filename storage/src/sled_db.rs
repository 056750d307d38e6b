//! sled as this store uses it: how it is opened (its configuration, its lock, a snapshot a
//! crash left unfinished), which of its files must be fsynced beside its own flush, and what
//! its files (and any directory's) take on disk.

use std::path::Path;

use crate::error::{Error, Result};

/// sled's segment size. Values or nodes above a quarter of it (512 KiB) go to separate files
/// (`blobs/`, fsynced by `sync_sled_blobs`). Part of the on-disk format: sled refuses to open
/// a store with another value.
pub const SEGMENT_BYTES: usize = 2 * 1024 * 1024;
/// How long `open` waits for the file lock. sled's background IO threads can hold the
/// database a few milliseconds after the last handle dropped, so a reopen in the same process
/// may briefly see it locked; a real second opener is refused after this wait.
pub(crate) const LOCK_WAIT_MS: u64 = 2_000;
pub(crate) const LOCK_RETRY_MS: u64 = 10;

pub(crate) fn open_sled(path: &Path, cache_bytes: u64) -> Result<sled::Db> {
    let mut waited_ms = 0;
    let mut cleared_snapshots = false;
    loop {
        let opened = sled::Config::new()
            .path(path)
            .segment_size(SEGMENT_BYTES)
            .cache_capacity(cache_bytes)
            .flush_every_ms(None)
            .open();
        match opened {
            Ok(db) => return Ok(db),
            Err(sled::Error::Io(io)) if io.to_string().contains("could not acquire lock") => {
                if waited_ms >= LOCK_WAIT_MS {
                    return Err(Error::Locked {
                        path: path.to_path_buf(),
                    });
                }
                std::thread::sleep(std::time::Duration::from_millis(LOCK_RETRY_MS));
                waited_ms += LOCK_RETRY_MS;
            }
            // sled 0.34.7 writes a snapshot to `snap.<lsn>.generating`, fsyncs it and renames
            // it, but its reader also picks `.generating` files: a crash while one is being
            // written leaves a store that refuses to open (sled issue #1527). Such a file is
            // incomplete by construction (a finished one is renamed), so it is removed and
            // the open retried once; sled rebuilds from the previous snapshot and its log.
            // The failed open held sled's lock, so no live process is writing that file.
            Err(sled::Error::Corruption { .. }) if !cleared_snapshots => {
                cleared_snapshots = true;
                if remove_unfinished_sled_snapshots(path)? == 0 {
                    return opened.map_err(Error::from);
                }
            }
            Err(other) => return Err(Error::from(other)),
        }
    }
}

/// Waits until nothing holds sled's lock on its data file `db` (sled's threads let it go a
/// few milliseconds after its last handle drops); then it is left free. A file that is not
/// there holds no lock.
pub(crate) fn wait_until_released(db: &Path) -> Result<()> {
    let file = match std::fs::File::open(db) {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(Error::io(db, error)),
    };
    take_lock(&file, db)?;
    file.unlock().map_err(|error| Error::io(db, error))
}

/// Takes an exclusive lock on `file` (the lock file or sled's data file at `path`), waiting
/// up to `LOCK_WAIT_MS` for a holder to let it go; `Locked` after that.
pub(crate) fn take_lock(file: &std::fs::File, path: &Path) -> Result<()> {
    let mut waited_ms = 0;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(()),
            Err(std::fs::TryLockError::WouldBlock) if waited_ms < LOCK_WAIT_MS => {
                std::thread::sleep(std::time::Duration::from_millis(LOCK_RETRY_MS));
                waited_ms += LOCK_RETRY_MS;
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(Error::Locked {
                    path: path.to_path_buf(),
                })
            }
            Err(std::fs::TryLockError::Error(error)) => return Err(Error::io(path, error)),
        }
    }
}

/// Removes sled's `snap.*.generating` files in `path`; returns how many.
fn remove_unfinished_sled_snapshots(path: &Path) -> Result<usize> {
    let io_error = |error| Error::io(path, error);
    let mut removed = 0;
    for entry in std::fs::read_dir(path).map_err(io_error)? {
        let entry = entry.map_err(io_error)?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            tracing::warn!(file = %name, "removing sled's unfinished snapshot left by a crash");
            std::fs::remove_file(entry.path()).map_err(io_error)?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// The bytes the files under `dir` take on disk (what `du` counts: allocated blocks, so a
/// preallocated journal segment counts what is written in it), recursively; a file that
/// vanishes meanwhile counts 0.
pub(crate) fn disk_bytes(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| disk_bytes_of(&entry.path()))
        .sum()
}

/// The bytes a file, or a directory and everything in it, takes on disk.
pub(crate) fn disk_bytes_of(path: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => disk_bytes(path),
        Ok(meta) => meta.blocks() * 512,
        Err(_) => 0,
    }
}

/// sled writes a value or node larger than a quarter segment to its own file under `blobs/`
/// and never fsyncs it. Our limits keep that rare; when it happens, fsync the new files and
/// the directory before the journal that covers them may go. `synced`: the files synced
/// already (sled removes files it no longer needs; they are forgotten).
pub(crate) fn sync_sled_blobs(
    path: &std::path::Path,
    synced: &mut std::collections::HashSet<std::ffi::OsString>,
) -> Result<()> {
    let dir = path.join("blobs");
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(Error::io(&dir, error)),
    };
    let mut synced_any = false;
    let mut present = std::collections::HashSet::new();
    for entry in entries {
        let entry = entry.map_err(|error| Error::io(&dir, error))?;
        let name = entry.file_name();
        present.insert(name.clone());
        if synced.contains(&name) {
            continue;
        }
        let path = entry.path();
        match std::fs::File::open(&path) {
            Ok(file) => file.sync_all().map_err(|error| Error::io(&path, error))?,
            // sled removed it meanwhile (blob garbage collection).
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => return Err(Error::io(&path, error)),
        }
        synced.insert(name);
        synced_any = true;
    }
    // Forget files sled has garbage-collected.
    synced.retain(|name| present.contains(name));
    if synced_any {
        std::fs::File::open(&dir)
            .and_then(|dir_file| dir_file.sync_all())
            .map_err(|error| Error::io(&dir, error))?;
    }
    Ok(())
}
