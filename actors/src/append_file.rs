//! The `append` protocol's file (SPEC §6 `append`, R-8): records `LINE<TAB>EFFECT_ID\n`,
//! and a fence beside it (`PATH.fence`, lines `EFFECT_ID<TAB>EPOCH\n`) that makes the file
//! a resource checking fencing tokens itself (RELIABILITY R06, Kleppmann's argument).
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
use std::path::Path;

use openprogram_storage::EffectId;

/// The fence kept beside the file at `path`.
fn fence_path(path: &str) -> String {
    format!("{path}.fence")
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
pub fn append_record(
    path: &str,
    line: &str,
    effect_id: EffectId,
    epoch: u64,
) -> Result<(), String> {
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
/// answer is `Some(false)`, absent for good. A missing or unreadable file proves nothing (a
/// relative path, a moved file): `None`, a person decides.
pub async fn look_up(path: String, effect_id: EffectId, epoch: u64) -> Option<bool> {
    tokio::task::spawn_blocking(move || look_and_fence(&path, effect_id, epoch))
        .await
        .ok()
        .flatten()
}

fn look_and_fence(path: &str, effect_id: EffectId, epoch: u64) -> Option<bool> {
    let mut file = File::open(path).ok()?;
    let mut bytes = Vec::new();
    file.lock().ok()?;
    file.read_to_end(&mut bytes).ok()?;
    let needle = format!("\t{effect_id}\n");
    if memchr::memmem::find(&bytes, needle.as_bytes()).is_some() {
        return Some(true);
    }
    // Unfenced, a stalled writer could still land: not proven absent.
    fence(path, effect_id, epoch).ok()?;
    Some(false)
}

/// Records `effect_id` as fenced at `epoch`, fsynced (and, when the fence file is new, its
/// directory entry too). The caller holds the file's lock.
fn fence(path: &str, effect_id: EffectId, epoch: u64) -> std::io::Result<()> {
    let fence_path = fence_path(path);
    let created = !Path::new(&fence_path).exists();
    let mut fence = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&fence_path)?;
    fence.write_all(format!("{effect_id}\t{epoch}\n").as_bytes())?;
    fence.sync_data()?;
    if created {
        let parent = Path::new(&fence_path)
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        File::open(parent)?.sync_all()?;
    }
    Ok(())
}

/// The newest epoch `effect_id` is fenced at, if any. The caller holds the file's lock. A
/// fence that does not read refuses the write: it may hold the line that forbids it.
fn fenced_at(path: &str, effect_id: EffectId) -> Result<Option<u64>, String> {
    let text = match std::fs::read_to_string(fence_path(path)) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(format!("append failed: the fence does not read: {error}")),
    };
    let wanted = effect_id.to_string();
    let mut newest = None;
    for line in text.lines() {
        let parsed = line
            .split_once('\t')
            .and_then(|(id, epoch)| Some((id, epoch.parse::<u64>().ok()?)));
        let Some((id, epoch)) = parsed else {
            return Err(format!("append failed: damaged fence line {line:?}"));
        };
        if id == wanted {
            newest = newest.max(Some(epoch));
        }
    }
    Ok(newest)
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

    #[tokio::test]
    async fn r08_a_found_record_confirms_and_a_missing_file_is_unknown() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("sink").display().to_string();
        let effect = EffectId::new();
        assert_eq!(look_up(path.clone(), effect, 1).await, None);
        append_record(&path, "line", effect, 1).expect("appends");
        assert_eq!(look_up(path.clone(), effect, 2).await, Some(true));
        assert!(
            !Path::new(&fence_path(&path)).exists(),
            "a confirmation fences nothing"
        );
    }

    #[test]
    fn a_damaged_fence_refuses_the_write() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("sink").display().to_string();
        std::fs::write(fence_path(&path), "not a fence line\n").expect("writes");
        assert!(append_record(&path, "line", EffectId::new(), 1).is_err());
        assert_eq!(records(&path), 0);
    }
}
