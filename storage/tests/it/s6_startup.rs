//! S-6: startup reads the by-state index and the unmaterialized log tail, never the whole
//! history; the index stays right across the overlay/disk boundary and reopening.

use std::collections::BTreeSet;

use openprogram_storage::{EventReader, ExecutionId, ExecutionState, Limits, Store};

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
    // Slices of 2 over 6 executions: frozen and active layers coexist for several groups.
    let limits = Limits {
        materialize_interval_ms: 0,
        materialize_slice_len: 2,
        ..Default::default()
    };
    let store = Store::open_with(dir.path(), limits).expect("open");
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(create(&store).await);
    }
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // A reader racing the commits and materializations: heads never go backwards, events
    // are never behind the head read before them and never have gaps.
    let reader = {
        let (store, ids, done) = (store.clone(), ids.clone(), done.clone());
        tokio::spawn(async move {
            let mut last_versions = vec![0; ids.len()];
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                for (index, id) in ids.iter().enumerate() {
                    let head = store.head(*id).expect("head").expect("exists");
                    assert!(head.version >= last_versions[index], "head went backwards");
                    last_versions[index] = head.version;
                    let events = all_events(&store, *id);
                    assert!(
                        events.len() as u64 >= head.version,
                        "events behind the head"
                    );
                    for (seq, event) in events.iter().enumerate() {
                        assert_eq!(event.seq, seq as u64 + 1, "gap or duplicate");
                    }
                }
                tokio::task::yield_now().await;
            }
        })
    };
    for version in 1..=40u64 {
        let state = if version % 2 == 1 {
            ExecutionState::Running
        } else {
            ExecutionState::Paused
        };
        let round = ids.iter().map(|&id| set_state(&store, id, version, state));
        futures::future::join_all(round).await;
        // Quiescent: the by-state index must list every execution exactly under its state.
        assert_eq!(
            in_state(&store, state),
            ids.iter().copied().collect(),
            "round {version}"
        );
        for other in [
            ExecutionState::Queued,
            ExecutionState::Running,
            ExecutionState::Paused,
        ] {
            if other != state {
                assert!(
                    in_state(&store, other).is_empty(),
                    "round {version}: stale {other}"
                );
            }
        }
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    reader.await.expect("reader");
    assert!(store.metrics().materializations > 1);
}

/// Commits a new attempt of `execution_id` at `version`, by epoch `epoch`: the head carries
/// its lease, as an activation writes it.
async fn start_attempt(
    store: &Store,
    execution_id: ExecutionId,
    version: u64,
    epoch: u64,
) -> openprogram_storage::transition::Committed {
    use openprogram_storage::{AttemptId, AttemptLease, Event, EventStore, OwnerId, Transition};
    let lease = AttemptLease {
        attempt_id: AttemptId::new(),
        owner_id: OwnerId::new(),
        epoch,
    };
    let mut head = store.head(execution_id).expect("head").expect("exists");
    head.attempt = Some(lease);
    let event = Event::AttemptStarted {
        attempt_id: lease.attempt_id,
        owner_id: lease.owner_id,
        epoch,
    };
    let transition = Transition::new(execution_id, vec![event])
        .expect_version(version)
        .by_epoch(epoch)
        .with_head(head);
    committed(store.submit(transition).await.expect("attempt"))
}

/// The head record of `execution_id` in the closed store in `dir`.
fn head_on_disk(dir: &std::path::Path, execution_id: ExecutionId) -> sled::IVec {
    raw_open(dir)
        .get(openprogram_storage::keys::head(execution_id))
        .expect("get")
        .expect("head record")
}

/// The closed store in `dir` with `head` as `execution_id`'s head record on disk and the log
/// record at `lost` gone, so that its next open replays every frame left over that head.
fn replay_over(
    dir: &std::path::Path,
    execution_id: ExecutionId,
    head: sled::IVec,
    lost: Option<u64>,
) {
    let db = raw_open(dir);
    db.insert(openprogram_storage::keys::head(execution_id), head)
        .expect("restore");
    if let Some(position) = lost {
        db.remove(openprogram_storage::keys::log(position))
            .expect("remove")
            .expect("the log record to lose");
    }
    replay_everything(&db);
    db.flush().expect("flush");
}

#[tokio::test]
async fn s6_a_replayed_log_rebuilds_each_attempt_of_the_head() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let a = create(&store).await;
    start_attempt(&store, a, 1, 1).await;
    drop(store);
    let first_session = head_on_disk(dir.path(), a);
    let store = Store::open(dir.path()).expect("reopen");
    start_attempt(&store, a, 2, 2).await;
    append(&store, a, 3, "by the second attempt").await;
    let before = store.head(a).expect("head").expect("exists");
    drop(store);
    // As after a crash in the second session's materialization: the head on disk is the
    // first session's, and the replay brings every frame.
    replay_over(dir.path(), a, first_session, None);
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(store.metrics().replayed_frames, 4);
    let after = store.head(a).expect("head").expect("exists");
    assert_eq!(after.attempt.map(|lease| lease.epoch), Some(2));
    assert_eq!(after, before, "the head the frames lead to");
}

#[tokio::test]
async fn s4_a_frame_after_lost_frames_quarantines_its_execution_not_a_stale_attempt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let a = create(&store).await;
    start_attempt(&store, a, 1, 1).await;
    append(&store, a, 2, "by the first attempt").await;
    drop(store);
    let first_session = head_on_disk(dir.path(), a);
    let store = Store::open(dir.path()).expect("reopen");
    let second = start_attempt(&store, a, 3, 2).await;
    append(&store, a, 4, "by the second attempt").await;
    drop(store);
    // The frame of the second attempt is lost (its log record gone), the head on disk is
    // the first session's, and the replay brings every frame left.
    replay_over(
        dir.path(),
        a,
        first_session,
        Some(*second.positions.start()),
    );
    // A hole in the log: refused, then opened to salvage. The last frame carries no
    // identity: completed from before the gap, it would name the first attempt. Its
    // execution is quarantined instead.
    assert!(
        Store::open(dir.path()).is_err(),
        "a lost frame refuses the open"
    );
    let (store, _) = Store::open_salvaging(dir.path(), Limits::default()).expect("salvage");
    let quarantined = store.quarantined();
    assert!(
        quarantined
            .iter()
            .any(|(id, reason)| *id == a && reason.contains("lost")),
        "{quarantined:?}"
    );
}
