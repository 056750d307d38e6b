//! S-9: sled in generations. Once sled's files have grown enough since the last copy, the
//! store copies every key into a new generation while it keeps committing, switches to it
//! between two groups and removes the old one; everything committed before, during and
//! after the copy reads back, before and after a reopen. (Kills during copies and switches:
//! `s3_crash.rs`, whose children copy whenever sled grew.) And history in the journal: a
//! segment that a few long-lived records keep alive is copied forward and goes.

use std::time::{Duration, Instant};

use openprogram_storage::{
    EventReader, EventStore, ExecutionId, ExecutionState, Limits, PurgeStep, Store,
};

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

/// S-9: a journal segment that only a few long-lived records keep alive goes: once the others
/// in it are purged and swept, what still lives there is copied forward (without the purged
/// executions' frames) and the segment is removed; the long-lived execution reads on, across
/// a reopen.
#[tokio::test]
async fn s9_a_segment_kept_alive_by_a_few_records_is_copied_forward_and_goes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let limits = Limits {
        journal_segment_bytes: 256 * 1024,
        relocate_settled_ms: 0,
        ..eager_limits()
    };
    let journal = dir.path().join("journal");
    let first_segment = journal.join(format!("{:020}.wal", 1));
    let store = Store::open_with(dir.path(), limits.clone()).expect("open");
    let kept = create(&store).await;
    append(&store, kept, 1, "kept").await;
    // Enough short-lived executions to fill several segments after the first.
    let mut gone = Vec::new();
    let payload = "x".repeat(2_000);
    while std::fs::read_dir(&journal).expect("journal").count() < 4 {
        let execution_id = create(&store).await;
        append(&store, execution_id, 1, &payload).await;
        set_state(&store, execution_id, 2, ExecutionState::Completed).await;
        gone.push(execution_id);
    }
    drop(store);
    // Reopened: everything written to its own keys, so the purges are settled.
    let store = Store::open_with(dir.path(), limits).expect("reopen");
    for execution_id in &gone {
        while store.purge(*execution_id, None, None).await.expect("purge") == PurgeStep::More {}
    }
    let mut from = 0;
    loop {
        let step = store.sweep_log(from, 256).await.expect("sweep");
        match step.next_position {
            Some(next) => from = next,
            None => break,
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while first_segment.exists() {
        assert!(Instant::now() < deadline, "the first segment stayed");
        // Groups go on (the copy rides on them) and the flusher makes sled hold them.
        append(
            &store,
            kept,
            store.head(kept).unwrap().unwrap().version,
            "on",
        )
        .await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let version = store.head(kept).unwrap().unwrap().version;
    assert_eq!(all_events(&store, kept).len() as u64, version);
    drop(store);
    let store = Store::open(dir.path()).expect("reopen");
    let events = all_events(&store, kept);
    assert_eq!(events.len() as u64, version);
    assert!(
        matches!(&events[1].event, openprogram_storage::Event::ModelDecided { decision, .. } if decision == "kept")
    );
}
