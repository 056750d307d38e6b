//! R13 (RELIABILITY.md): the disk fills up. The store's directory is on a small tmpfs; the
//! writers go on until a write fails. From then on nothing more is acknowledged (fail-stop,
//! with a clear error), and once space returns the store reopens with everything it
//! acknowledged (I8) and takes new work.

use std::path::{Path, PathBuf};
use std::process::Command;

use openprogram_storage::{EventReader, EventStore, ExecutionId, Outcome, Store, Transition};

use crate::support::*;

/// A tmpfs mounted for the test, unmounted on drop (also when the test fails).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Self {
        std::fs::create_dir_all(at).expect("mount point");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .expect("run mount");
        assert!(status.success(), "mounting a tmpfs needs root");
        Self(at.to_path_buf())
    }

    fn resize(&self, size: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .expect("run mount");
        assert!(status.success());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[tokio::test]
#[ignore = "needs root to mount a tmpfs (beyond the Rust toolchain): `.ci/run` runs it as \
            root; or `sudo cargo test -p openprogram-storage -- --include-ignored r13`"]
async fn r13_a_full_disk_stops_acknowledging_and_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mount = Tmpfs::mount(&dir.path().join("mnt"), "3m");
    let data = dir.path().join("mnt/data");
    let mut acknowledged: Vec<(ExecutionId, u64)> = Vec::new();
    let failure = {
        let store = Store::open(&data).expect("open");
        let payload = "x".repeat(900);
        let mut failure = None;
        for _ in 0..100_000 {
            let execution_id = ExecutionId::new();
            let created = store
                .submit(Transition::create(
                    head(execution_id),
                    vec![decided(&payload)],
                ))
                .await;
            match created {
                Ok(Outcome::Committed(committed)) => {
                    acknowledged.push((execution_id, committed.version))
                }
                Ok(other) => panic!("unexpected {other:?}"),
                Err(error) => {
                    failure = Some(error);
                    break;
                }
            }
        }
        let failure = failure.expect("the disk filled up");
        // Fail-stop: nothing more is acknowledged, whatever is asked.
        for _ in 0..3 {
            let again = store
                .submit(Transition::create(
                    head(ExecutionId::new()),
                    vec![decided("more")],
                ))
                .await;
            assert!(
                again.is_err(),
                "acknowledged after a failed write: {again:?}"
            );
        }
        failure
    };
    eprintln!(
        "r13: {} acknowledged before the disk was full; then {failure} ({})",
        acknowledged.len(),
        failure.code()
    );
    assert!(
        matches!(failure.code(), "fail_stop" | "storage_io"),
        "a clear storage error: {failure}"
    );
    assert!(!acknowledged.is_empty());
    // Space returns: everything acknowledged is there, and new work is taken.
    mount.resize("64m");
    let store = Store::open(&data).expect("reopen after space returned");
    for (execution_id, version) in &acknowledged {
        let head = store.head(*execution_id).expect("read");
        assert_eq!(
            head.map(|head| head.version),
            Some(*version),
            "{execution_id}"
        );
    }
    create(&store).await;
}
