//! S-9: sled in generations. Once sled's files have grown enough since the last copy, the
//! store copies every key into a new generation while it keeps committing, switches to it
//! between two groups and removes the old one; everything committed before, during and
//! after the copy reads back, before and after a reopen. (Kills during copies and switches:
//! `s3_crash.rs`, whose children copy whenever sled grew.)

use std::time::{Duration, Instant};

use openprogram_storage::{EventReader, ExecutionId, Limits, Store};

use crate::support::*;

/// Limits that copy sled whenever it grew at all, looking every 10 ms.
fn copying_limits() -> Limits {
    Limits {
        sled_copy_check_ms: 10,
        sled_copy_growth_percent: 1,
        sled_copy_min_growth_bytes: 0,
        ..eager_limits()
    }
}

fn generation_dirs(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join("generations"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn s9_sled_is_copied_into_a_new_generation_while_commits_go_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_with(dir.path(), copying_limits()).expect("open");
    let mut executions: Vec<(ExecutionId, u64)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    // Commits go on until two switches happened: the second copied a store that had
    // switched once already, while these commits went on.
    while store.metrics().sled_generations < 2 {
        assert!(
            Instant::now() < deadline,
            "no two switches in 60 s: {:?}",
            store.metrics()
        );
        let execution_id = create(&store).await;
        for version in 1..=4 {
            append(&store, execution_id, version, "step").await;
        }
        executions.push((execution_id, 5));
    }
    let check = |store: &Store| {
        for (execution_id, version) in &executions {
            let head = store.head(*execution_id).expect("head").expect("there");
            assert_eq!(head.version, *version);
            assert_eq!(all_events(store, *execution_id).len() as u64, *version);
        }
        let log = whole_log(store);
        assert_eq!(log.len(), executions.len() * 5);
        assert!(log
            .iter()
            .enumerate()
            .all(|(index, event)| event.position == index as u64 + 1));
    };
    check(&store);
    // The old generations are gone: sled's files at the root (generation 0) and older ones.
    assert!(!dir.path().join("db").exists(), "generation 0 was removed");
    let generations = generation_dirs(dir.path());
    assert!(generations.len() <= 2, "{generations:?}");
    drop(store);
    let store = Store::open(dir.path()).expect("reopen");
    check(&store);
    // Only the newest complete generation is kept by an open.
    assert_eq!(generation_dirs(dir.path()).len(), 1);
    let (execution_id, version) = executions[0];
    append(&store, execution_id, version, "after the reopen").await;
    assert_eq!(all_events(&store, execution_id).len() as u64, version + 1);
}

/// A copy cut short (a directory of a newer generation without its `complete` file) is not
/// used by an open, and is removed; the store opens as it was.
#[tokio::test]
async fn s9_a_copy_cut_short_is_removed_and_the_store_opens_as_it_was() {
    let dir = tempfile::tempdir().expect("tempdir");
    let execution_id = {
        let store = Store::open(dir.path()).expect("open");
        let execution_id = create(&store).await;
        append(&store, execution_id, 1, "kept").await;
        execution_id
    };
    let cut = dir.path().join("generations").join(format!("{:020}", 1));
    std::fs::create_dir_all(&cut).expect("mkdir");
    std::fs::write(cut.join("db"), b"half a copy").expect("write");
    let store = Store::open(dir.path()).expect("reopen");
    assert!(!cut.exists(), "the copy cut short is removed");
    assert_eq!(all_events(&store, execution_id).len(), 2);
}
