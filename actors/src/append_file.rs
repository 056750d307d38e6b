//! The `append` protocol's file (SPEC §6 `append`, R-8): records `LINE<TAB>EFFECT_ID\n`,
//! and fences beside it (`PATH.fence/EFFECT_ID`, holding an epoch) that make the file a
//! resource checking fencing tokens itself (RELIABILITY R06, Kleppmann's argument).
//!
//! Why the fence: a reconciliation that finds no record answers `NotApplied`, and the
//! effect runs again under the reconciling attempt. An older attempt of the same
//! execution may still be alive — a node stopped (SIGSTOP) or partitioned past its lease,
//! halfway into the same effect. Its late write must not land after that answer. So the
//! reconciler, holding the file's lock, records `(effect, its epoch)` in the fence before it
//! answers; a writer, holding the same lock, refuses an effect fenced at a newer epoch than
//! its own. The lock (`flock`, exclusive, held across check and write) makes "looked and
//! found nothing" and "wrote" never interleave. A writer stopped while it holds the lock
//! delays the reconciler until it runs again; it never lets both write.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use openprogram_storage::EffectId;

/// The fences kept beside the file at `path`: a directory, one file per fenced effect.
fn fence_dir(path: &str) -> PathBuf {
    PathBuf::from(format!("{path}.fence"))
}

/// [`append_record`] on the blocking pool: the caller's thread never waits for the lock or
/// the fsync. A call whose future is dropped (its attempt superseded, the runtime halted)
/// may still append afterwards — but never after a newer attempt looked and found nothing:
/// that look fenced the effect (R06).
pub async fn append(
    path: String,
    line: String,
    effect_id: EffectId,
    epoch: u64,
) -> Result<(), String> {
    tokio::task::spawn_blocking(move || append_record(&path, &line, effect_id, epoch))
        .await
        .map_err(|error| format!("append failed: {error}"))?
}

/// Appends `LINE<TAB>EFFECT_ID\n` to the file at `path` and fsyncs it, unless a
/// reconciliation of `effect_id` by an attempt newer than `epoch` fenced it.
fn append_record(path: &str, line: &str, effect_id: EffectId, epoch: u64) -> Result<(), String> {
    if line.contains('\n') || line.contains('\t') {
        return Err("line must not contain a newline or a tab".into());
    }
    let failed = |error: std::io::Error| format!("append failed: {error}");
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(failed)?;
    file.lock().map_err(failed)?;
    if let Some(newer) = fenced_at(path, effect_id)?.filter(|fenced| *fenced > epoch) {
        return Err(format!(
            "fenced: effect {effect_id} was reconciled by a newer attempt (epoch {newer} > {epoch})"
        ));
    }
    let record = format!("{line}\t{effect_id}\n");
    file.write_all(record.as_bytes()).map_err(failed)?;
    file.sync_data().map_err(failed)
    // The lock goes with the file.
}

/// The lookup of `effect_id` by the attempt at `epoch`: `Some(true)` if and only if
/// its record is in the file; otherwise the effect is fenced at `epoch` (durably) before the
/// answer is `Some(false)`, absent for good. A missing or unreadable file, or a relative
/// path (another process may have another working directory), proves nothing: `None`, a
/// person decides.
pub async fn look_up(path: String, effect_id: EffectId, epoch: u64) -> Option<bool> {
    tokio::task::spawn_blocking(move || look_and_fence(&path, effect_id, epoch))
        .await
        .ok()
        .flatten()
}

fn look_and_fence(path: &str, effect_id: EffectId, epoch: u64) -> Option<bool> {
    if Path::new(path).is_relative() {
        return None;
    }
    let mut file = File::open(path).ok()?;
    let mut bytes = Vec::new();
    file.lock().ok()?;
    file.read_to_end(&mut bytes).ok()?;
    let needle = format!("\t{effect_id}\n");
    if memchr::memmem::find(&bytes, needle.as_bytes()).is_some() {
        // A writer killed between its write and its fsync left the line in the page cache
        // only: durable before it is confirmed.
        file.sync_data().ok()?;
        return Some(true);
    }
    // Unfenced, a stalled writer could still land: not proven absent.
    fence(path, effect_id, epoch).ok()?;
    Some(false)
}

/// Records `effect_id` as fenced at `epoch` (or newer, if it was): the file
/// `PATH.fence/EFFECT_ID` holds the epoch, written aside, fsynced and renamed into place,
/// the directory fsynced. The caller holds the file's lock.
fn fence(path: &str, effect_id: EffectId, epoch: u64) -> std::io::Result<()> {
    let directory = fence_dir(path);
    // The parent is synced every time (fences are rare): a crash between creating the
    // directory and syncing its parent must not leave it unsynced for good.
    std::fs::create_dir_all(&directory)?;
    sync_dir(directory.parent())?;
    let newest = fenced_at(path, effect_id)
        .map_err(std::io::Error::other)?
        .map_or(epoch, |fenced| fenced.max(epoch));
    let aside = directory.join(format!("{effect_id}.new"));
    let mut file = File::create(&aside)?;
    file.write_all(newest.to_string().as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&aside, directory.join(effect_id.to_string()))?;
    sync_dir(Some(&directory))
}

fn sync_dir(directory: Option<&Path>) -> std::io::Result<()> {
    let directory = directory
        .filter(|directory| !directory.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    File::open(directory)?.sync_all()
}

/// The epoch `effect_id` is fenced at, if it is: one file to open, however many effects
/// were fenced. The caller holds the file's lock. A fence that does not read refuses the
/// write: it may be the one that forbids it.
fn fenced_at(path: &str, effect_id: EffectId) -> Result<Option<u64>, String> {
    let fence = fence_dir(path).join(effect_id.to_string());
    let text = match std::fs::read_to_string(&fence) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(format!("append failed: the fence does not read: {error}")),
    };
    match text.trim().parse::<u64>() {
        Ok(epoch) => Ok(Some(epoch)),
        Err(_) => Err(format!(
            "append failed: the fence {} is damaged",
            fence.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records(path: &str) -> usize {
        std::fs::read_to_string(path).map_or(0, |text| text.lines().count())
    }

    /// R06 at the resource: once an attempt at epoch 2 reconciled an effect as absent, the
    /// epoch-1 attempt's late write is refused, the epoch-2 rerun lands, once.
    #[tokio::test]
    async fn r06_a_reconciled_effect_refuses_an_older_attempts_late_write() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("sink").display().to_string();
        let effect = EffectId::new();
        append_record(&path, "other", EffectId::new(), 1).expect("another effect appends");
        assert_eq!(look_up(path.clone(), effect, 2).await, Some(false));
        let late = append_record(&path, "late", effect, 1);
        assert!(late.is_err_and(|error| error.contains("fenced")));
        append_record(&path, "rerun", effect, 2).expect("the reconciling attempt reruns it");
        assert_eq!(records(&path), 2);
        assert_eq!(look_up(path.clone(), effect, 3).await, Some(true));
    }

    /// A stalled reconciler of an older attempt never lowers a fence a newer one set.
    #[tokio::test]
    async fn r06_a_fence_only_rises() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("sink").display().to_string();
        std::fs::write(&path, "").expect("the sink");
        let effect = EffectId::new();
        assert_eq!(look_up(path.clone(), effect, 5).await, Some(false));
        assert_eq!(look_up(path.clone(), effect, 4).await, Some(false));
        assert!(append_record(&path, "stale", effect, 4).is_err());
        append_record(&path, "newest", effect, 5).expect("the newest attempt writes");
        assert_eq!(records(&path), 1);
    }

    #[tokio::test]
    async fn r08_a_found_record_confirms_and_a_missing_file_is_unknown() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("sink").display().to_string();
        let effect = EffectId::new();
        assert_eq!(look_up(path.clone(), effect, 1).await, None);
        append_record(&path, "line", effect, 1).expect("appends");
        assert_eq!(look_up(path.clone(), effect, 2).await, Some(true));
        assert!(!fence_dir(&path).exists(), "a confirmation fences nothing");
        // Another process may resolve a relative path elsewhere.
        assert_eq!(look_up("sink".into(), effect, 2).await, None);
    }

    #[test]
    fn a_damaged_fence_refuses_the_write() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("sink").display().to_string();
        let effect = EffectId::new();
        std::fs::create_dir(fence_dir(&path)).expect("creates");
        std::fs::write(fence_dir(&path).join(effect.to_string()), "x").expect("writes");
        assert!(append_record(&path, "line", effect, 1).is_err());
        assert_eq!(records(&path), 0);
    }
}
