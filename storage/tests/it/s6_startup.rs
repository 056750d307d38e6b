//! S-6: startup reads the by-state index and the unmaterialized log tail, never the whole
//! history; the index stays right across the overlay/disk boundary and reopening.

use std::collections::BTreeSet;

use openprogram_storage::{EventStore, ExecutionId, ExecutionState, Limits, Store};

use crate::support::*;

fn in_state(store: &Store, state: ExecutionState) -> BTreeSet<ExecutionId> {
    store
        .executions_in_state(state)
        .expect("by state")
        .into_iter()
        .collect()
}

#[tokio::test]
async fn s6_by_state_index_tracks_non_terminal_executions() {
    for limits in [Limits::default(), eager_limits()] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (running, paused, done) = {
            let store = Store::open_with(dir.path(), limits.clone()).expect("open");
            let running = create(&store).await;
            let paused = create(&store).await;
            let done = create(&store).await;
            for id in [running, paused, done] {
                set_state(&store, id, 1, ExecutionState::Running).await;
            }
            set_state(&store, paused, 2, ExecutionState::Paused).await;
            set_state(&store, done, 2, ExecutionState::Paused).await;
            set_state(&store, done, 3, ExecutionState::Completed).await;
            assert_eq!(
                in_state(&store, ExecutionState::Running),
                BTreeSet::from([running])
            );
            assert_eq!(
                in_state(&store, ExecutionState::Paused),
                BTreeSet::from([paused])
            );
            assert!(
                in_state(&store, ExecutionState::Completed).is_empty(),
                "terminal states are not indexed"
            );
            (running, paused, done)
        };
        let store = Store::open_with(dir.path(), limits).expect("reopen");
        assert_eq!(
            in_state(&store, ExecutionState::Running),
            BTreeSet::from([running])
        );
        assert_eq!(
            in_state(&store, ExecutionState::Paused),
            BTreeSet::from([paused])
        );
        assert!(in_state(&store, ExecutionState::Queued).is_empty());
        assert_eq!(
            store.head(done).expect("head").map(|h| h.state),
            Some(ExecutionState::Completed)
        );
    }
}

#[tokio::test]
async fn s6_reopen_after_a_clean_close_replays_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let store = Store::open(dir.path()).expect("open");
        let a = create(&store).await;
        for version in 1..=200 {
            append(&store, a, version, "step").await;
        }
    }
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(store.metrics().replayed_frames, 0);
    assert_eq!(store.durable_position(), 201);
}

#[tokio::test]
async fn s6_reads_stay_consistent_while_materializations_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_with(dir.path(), eager_limits()).expect("open");
    let a = create(&store).await;
    let writer = {
        let store = store.clone();
        tokio::spawn(async move {
            for version in 1..=300 {
                append(&store, a, version, "step").await;
            }
        })
    };
    let mut last_version = 0;
    while !writer.is_finished() {
        let head = store.head(a).expect("head").expect("exists");
        assert!(head.version >= last_version, "head went backwards");
        last_version = head.version;
        let events = all_events(&store, a);
        assert!(
            events.len() as u64 >= head.version,
            "events behind the head read before them"
        );
        for (index, event) in events.iter().enumerate() {
            assert_eq!(event.seq, index as u64 + 1, "gap or duplicate");
        }
        assert_eq!(
            in_state(&store, ExecutionState::Queued),
            BTreeSet::from([a])
        );
        tokio::task::yield_now().await;
    }
    writer.await.expect("writer");
    assert_eq!(all_events(&store, a).len(), 301);
}
