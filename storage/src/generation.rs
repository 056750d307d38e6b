//! sled in generations (S-9): sled 0.34.7 gives space back only as fast as its pages are
//! replaced (shared/GUIDE.md), so under the churn of this store's small records (heads,
//! indexes, records, tombstones) its file grows without bound, while a copy of the same keys
//! into a new sled is compact. So, once sled's files have doubled since the last copy (by
//! default) and grown by `Limits::sled_copy_min_growth_bytes` (the first copy after an open:
//! once they pass that), a thread copies every key into a new generation while the committer
//! goes on and forwards it each group's writes; between two groups, the committer applies
//! the last of them, makes the copy durable, marks it complete and makes it the store's sled;
//! the old one is removed. The copy costs what is live, once per doubling; nothing waits for
//! it but the few writes left at the switch. It costs the disk more: a sled made by a copy
//! writes 2–5× more bytes under the same updates than one that grew (benches/HISTORY.md).
//!
//! Files: generation 0 is sled's files in the store's directory (`db`, `conf`, `blobs/`,
//! `snap.*`); generation N ≥ 1 is `DIR/generations/{N:020}/`, complete once the file
//! `complete` in it is. An open uses the newest complete one and removes every other
//! (`current`): a switch cut short leaves the old one current.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use sled::IVec;

use crate::error::{Error, Result};
use crate::writes::batch_of;

/// A group's writes as sled took them.
pub(crate) type Ops = Vec<(IVec, Option<IVec>)>;

const DIR: &str = "generations";
const COMPLETE: &str = "complete";
/// sled's files of generation 0, in the store's directory.
const ROOT_FILES: [&str; 3] = ["db", "conf", "blobs"];
/// Bytes of keys and values a copy writes per sled batch.
const COPY_BATCH_BYTES: usize = 4 * 1024 * 1024;

/// The directory of generation `number` of the store in `store_dir`.
pub(crate) fn dir_of(store_dir: &Path, number: u64) -> PathBuf {
    match number {
        0 => store_dir.to_path_buf(),
        _ => store_dir.join(DIR).join(format!("{number:020}")),
    }
}

/// The newest complete generation of the store in `store_dir` (0 when there is none), after
/// removing every other one and any copy cut short.
pub(crate) fn current(store_dir: &Path) -> Result<u64> {
    let (current, others) = newest(store_dir)?;
    for number in others {
        remove(store_dir, number)?;
    }
    if current > 0 {
        remove(store_dir, 0)?;
    }
    Ok(current)
}

/// The newest complete generation of the store in `store_dir` (0 when there is none), and
/// the other generations' numbers, without removing anything.
pub(crate) fn newest(store_dir: &Path) -> Result<(u64, Vec<u64>)> {
    let parent = store_dir.join(DIR);
    let mut numbers: Vec<(u64, bool)> = match std::fs::read_dir(&parent) {
        Ok(entries) => entries
            .flatten()
            .filter_map(|entry| {
                let number = entry.file_name().to_str()?.parse().ok()?;
                Some((number, entry.path().join(COMPLETE).exists()))
            })
            .collect(),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok((0, Vec::new())),
        Err(error) => return Err(Error::io(&parent, error)),
    };
    numbers.sort();
    let current = numbers
        .iter()
        .rev()
        .find(|(_, complete)| *complete)
        .map_or(0, |(number, _)| *number);
    let others = numbers.into_iter().map(|(number, _)| number);
    Ok((
        current,
        others.filter(|number| *number != current).collect(),
    ))
}

/// Removes generation `number`'s files.
pub(crate) fn remove(store_dir: &Path, number: u64) -> Result<()> {
    let gone = |result: std::io::Result<()>, path: &Path| match result {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(Error::io(path, error)),
        _ => Ok(()),
    };
    if number > 0 {
        let dir = dir_of(store_dir, number);
        gone(std::fs::remove_dir_all(&dir), &dir)?;
        return sync_dir(&store_dir.join(DIR));
    }
    for name in ROOT_FILES {
        let path = store_dir.join(name);
        match path.is_dir() {
            true => gone(std::fs::remove_dir_all(&path), &path)?,
            false => gone(std::fs::remove_file(&path), &path)?,
        }
    }
    let entries = std::fs::read_dir(store_dir).map_err(|error| Error::io(store_dir, error))?;
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with("snap.") {
            let path = entry.path();
            gone(std::fs::remove_file(&path), &path)?;
        }
    }
    sync_dir(store_dir)
}

/// The bytes sled's files of generation `number` take on disk.
pub(crate) fn sled_bytes(store_dir: &Path, number: u64) -> u64 {
    let dir = dir_of(store_dir, number);
    if number > 0 {
        return crate::sled_db::disk_bytes(&dir);
    }
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return 0;
    };
    let sled_file = |name: &str| ROOT_FILES.contains(&name) || name.starts_with("snap.");
    entries
        .flatten()
        .filter(|entry| sled_file(&entry.file_name().to_string_lossy()))
        .map(|entry| crate::sled_db::disk_bytes_of(&entry.path()))
        .sum()
}

/// A copy under way: where the committer forwards each group's writes, where the copy says
/// it is done, and how to stop it.
pub(crate) struct Copying {
    pub forward: mpsc::Sender<Ops>,
    pub done: mpsc::Receiver<Result<Built>>,
    abort: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Copying {
    /// Stops the copy and waits for its thread (the store closes); what it wrote goes at
    /// the next open.
    pub fn abandon(mut self) {
        self.abort.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A generation copied, every forwarded write applied but those still in `rest`.
pub(crate) struct Built {
    pub number: u64,
    pub db: sled::Db,
    pub rest: mpsc::Receiver<Ops>,
}

/// Starts copying `from` into generation `number` on a thread of its own.
pub(crate) fn start(
    store_dir: &Path,
    from: sled::Db,
    number: u64,
    cache_bytes: u64,
) -> Result<Copying> {
    let (forward, forwarded) = mpsc::channel();
    let (finished, done) = mpsc::sync_channel(1);
    let dir = dir_of(store_dir, number);
    let abort = Arc::new(AtomicBool::new(false));
    let stop = Arc::clone(&abort);
    let thread = std::thread::Builder::new()
        .name("openprogram-copier".into())
        .spawn(move || {
            let built = copy(&from, &dir, cache_bytes, &forwarded, &stop);
            let built = built.map(|db| Built {
                number,
                db,
                rest: forwarded,
            });
            // Nobody waits any more (the store closed): the next open removes it.
            let _ = finished.send(built);
        })
        .map_err(|error| Error::io(store_dir, error))?;
    Ok(Copying {
        forward,
        done,
        abort,
        thread: Some(thread),
    })
}

/// Copies every key of `from` into a new sled in `dir`, then what was forwarded meanwhile,
/// and flushes it.
fn copy(
    from: &sled::Db,
    dir: &Path,
    cache_bytes: u64,
    forwarded: &mpsc::Receiver<Ops>,
    abort: &AtomicBool,
) -> Result<sled::Db> {
    // What a copy that failed before left: never complete, never read.
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|error| Error::io(dir, error))?;
    }
    std::fs::create_dir_all(dir).map_err(|error| Error::io(dir, error))?;
    let db = crate::sled_db::open_sled(dir, cache_bytes)?;
    let (mut batch, mut bytes) = (sled::Batch::default(), 0);
    for item in from.iter() {
        if abort.load(Ordering::Acquire) {
            return Err(Error::Io {
                path: dir.to_path_buf(),
                message: "the copy was abandoned: the store closed".into(),
            });
        }
        let (key, value) = item?;
        bytes += key.len() + value.len();
        batch.insert(key, value);
        if bytes >= COPY_BATCH_BYTES {
            db.apply_batch(std::mem::take(&mut batch))?;
            bytes = 0;
        }
    }
    db.apply_batch(batch)?;
    // What the committer wrote meanwhile, in order: each key ends as its newest write left
    // it, whatever the copy read of it. Twice: the flush lets more arrive.
    for _ in 0..2 {
        for ops in forwarded.try_iter() {
            db.apply_batch(batch_of(&ops))?;
        }
        db.flush()?;
    }
    // Most of the copy durable here, so that the switch, between two groups, fsyncs little.
    let data = dir.join("db");
    File::open(&data)
        .and_then(|file| file.sync_data())
        .map_err(|error| Error::io(&data, error))?;
    Ok(db)
}

/// Makes generation `built.number` of the store in `store_dir` durable and complete: the
/// writes left in `rest`, `last` (the newest writes, applied after them), a flush, an fsync
/// of its files, then its `complete` file. From then on an open uses it.
pub(crate) fn complete(store_dir: &Path, built: &Built, last: Ops) -> Result<File> {
    for ops in built.rest.try_iter().chain([last]) {
        built.db.apply_batch(batch_of(&ops))?;
    }
    built.db.flush()?;
    let dir = dir_of(store_dir, built.number);
    let data_file = File::open(dir.join("db")).map_err(|error| Error::io(&dir, error))?;
    data_file
        .sync_all()
        .map_err(|error| Error::io(&dir, error))?;
    crate::sled_db::sync_sled_blobs(&dir, &mut Default::default())?;
    let conf = dir.join("conf");
    if let Ok(file) = File::open(&conf) {
        file.sync_all().map_err(|error| Error::io(&conf, error))?;
    }
    sync_dir(&dir)?;
    let marker = dir.join(COMPLETE);
    File::create(&marker)
        .and_then(|file| file.sync_all())
        .map_err(|error| Error::io(&marker, error))?;
    sync_dir(&dir)?;
    sync_dir(&store_dir.join(DIR))?;
    sync_dir(store_dir)?;
    Ok(data_file)
}

fn sync_dir(dir: &Path) -> Result<()> {
    match File::open(dir).and_then(|dir| dir.sync_all()) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(Error::io(dir, error)),
        _ => Ok(()),
    }
}
