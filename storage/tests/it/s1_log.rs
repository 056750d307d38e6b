//! S-1: events get a per-execution seq and a global position; reopening never renumbers.

use openprogram_storage::{EventReader, Store};

use crate::support::*;

#[tokio::test]
async fn s1_seqs_are_gap_free_per_execution_and_positions_global() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let a = create(&store).await;
    let b = create(&store).await;
    let mut handed_back = Vec::new();
    for version in 1..=5 {
        handed_back.extend(append(&store, a, version, "a").await.events);
        handed_back.extend(append(&store, b, version, "b").await.events);
    }
    // A commit hands back its events as stored: the writer folds exactly what a read returns.
    let stored = store.log_after(2, usize::MAX).expect("log");
    assert_eq!(handed_back, stored);
    for execution_id in [a, b] {
        let seqs: Vec<u64> = all_events(&store, execution_id)
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(seqs, (1..=6).collect::<Vec<_>>());
    }
    let positions: Vec<u64> = whole_log(&store).iter().map(|e| e.position).collect();
    assert_eq!(positions, (1..=12).collect::<Vec<_>>());
    assert_eq!(store.durable_position(), 12);
    // A cursor in the middle returns exactly the rest.
    let rest = store.log_after(7, usize::MAX).expect("log");
    assert_eq!(rest.first().map(|e| e.position), Some(8));
    assert_eq!(store.log_after(7, 2).expect("log").len(), 2);
    assert_eq!(
        store.events_after(a, 4, usize::MAX).expect("events").len(),
        2
    );
}

#[tokio::test]
async fn s1_reopen_keeps_seqs_and_positions() {
    for limits in [openprogram_storage::Limits::default(), eager_limits()] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (a, before_log, before_a) = {
            let store = Store::open_with(dir.path(), limits.clone()).expect("open");
            let a = create(&store).await;
            let b = create(&store).await;
            for version in 1..=3 {
                append(&store, a, version, "a").await;
                append(&store, b, version, "b").await;
            }
            (a, whole_log(&store), all_events(&store, a))
        };
        let store = Store::open_with(dir.path(), limits).expect("reopen");
        assert_eq!(whole_log(&store), before_log);
        assert_eq!(all_events(&store, a), before_a);
        // A page of the history: exactly the next two events.
        let page: Vec<u64> = store
            .events_after(a, 1, 2)
            .expect("page")
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(page, vec![2, 3]);
        let next = append(&store, a, 4, "after reopen").await;
        assert_eq!(next.seqs, 5..=5);
        assert_eq!(next.positions, 9..=9);
    }
}

#[tokio::test]
async fn s1_schema_version_is_stored_and_a_newer_one_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    drop(Store::open(dir.path()).expect("open"));
    {
        let db = raw_open(dir.path());
        let key = openprogram_storage::keys::meta("schema_version");
        let stored = db.get(&key).expect("get").expect("schema version stored");
        let version: u32 = openprogram_storage::codec::decode(&key, &stored).expect("decode");
        assert_eq!(version, openprogram_storage::migrate::SCHEMA_VERSION);
        db.insert(&key, openprogram_storage::codec::encode(&99u32))
            .expect("insert");
        db.flush().expect("flush");
    }
    match Store::open(dir.path()) {
        Err(openprogram_storage::Error::UnsupportedSchema { found: 99, .. }) => {}
        other => panic!("expected UnsupportedSchema, got {other:?}"),
    }
}

#[tokio::test]
async fn s1_each_open_is_a_new_incarnation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = Store::open(dir.path()).expect("open").incarnation().clone();
    let store = Store::open(dir.path()).expect("reopen");
    let second = store.incarnation().clone();
    assert_eq!(second.number, first.number + 1);
    assert_ne!(second.owner_id, first.owner_id);
    assert_eq!(
        store.incarnations().expect("incarnations"),
        vec![first, second]
    );
}
