//! S-4: a record that fails its checksum is reported with its tree and key, quarantines only
//! its execution, and the rest of the store keeps working.

use openprogram_storage::{
    keys, Error, EventReader, EventStore, ExecutionId, Limits, Store, Transition,
};

use crate::support::*;

/// Two executions with a few events each, written to their own keys (closing materializes).
async fn two_executions(dir: &std::path::Path) -> (ExecutionId, ExecutionId) {
    two_executions_with(dir, Limits::default()).await
}

async fn two_executions_with(dir: &std::path::Path, limits: Limits) -> (ExecutionId, ExecutionId) {
    let store = Store::open_with(dir, limits).expect("open");
    let a = create(&store).await;
    let b = create(&store).await;
    for version in 1..=3 {
        append(&store, a, version, "a").await;
        append(&store, b, version, "b").await;
    }
    (a, b)
}

fn flip_byte(dir: &std::path::Path, key: &[u8], at: impl Fn(usize) -> usize) {
    let db = raw_open(dir);
    let mut value = db.get(key).expect("get").expect("record exists").to_vec();
    let index = at(value.len());
    value[index] ^= 0x5a;
    db.insert(key, value).expect("insert");
    db.flush().expect("flush");
}

async fn assert_only_a_is_quarantined(store: &Store, a: ExecutionId, b: ExecutionId) {
    assert_eq!(
        store
            .quarantined()
            .iter()
            .map(|(id, _)| *id)
            .collect::<Vec<_>>(),
        vec![a]
    );
    assert!(
        matches!(store.head(a), Err(Error::Quarantined { execution_id, .. }) if execution_id == a)
    );
    let refused = store
        .submit(Transition::new(a, vec![decided("refused")]).expect_version(4))
        .await;
    assert!(
        matches!(refused, Err(Error::Quarantined { .. })),
        "{refused:?}"
    );
    assert_eq!(all_events(store, b).len(), 4);
    append(store, b, 4, "b keeps working").await;
    assert_eq!(store.head(b).expect("head").map(|h| h.version), Some(5));
}

#[tokio::test]
async fn s4_byte_flipped_head_quarantines_only_its_execution() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b) = two_executions(dir.path()).await;
    flip_byte(dir.path(), &keys::head(a), |len| len / 2);
    let store = Store::open(dir.path()).expect("reopen");
    match store.head(a) {
        Err(Error::Corrupted { tree: "heads", key }) => {
            assert_eq!(key, keys::display(&keys::head(a)))
        }
        other => panic!("expected Corrupted, got {other:?}"),
    }
    assert_only_a_is_quarantined(&store, a, b).await;
}

#[tokio::test]
async fn s4_byte_flipped_event_chunk_quarantines_only_its_execution() {
    let dir = tempfile::tempdir().expect("tempdir");
    // With no frame refs kept in head records, every materialization writes an index chunk.
    let no_refs_in_heads = Limits {
        head_frame_refs_max: 0,
        ..Limits::default()
    };
    let (a, b) = two_executions_with(dir.path(), no_refs_in_heads).await;
    flip_byte(dir.path(), &keys::events(a, 1), |len| len - 1);
    let store = Store::open(dir.path()).expect("reopen");
    assert!(matches!(
        store.events_after(a, 0, 10),
        Err(Error::Corrupted { tree: "events", .. })
    ));
    assert_only_a_is_quarantined(&store, a, b).await;
}

#[tokio::test]
async fn s4_corrupt_log_frame_in_the_replayed_tail_quarantines_only_its_execution() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b) = two_executions(dir.path()).await;
    {
        // Make the whole log the unmaterialized tail, then damage one of a's frames.
        let db = raw_open(dir.path());
        replay_everything(&db);
        let record = db
            .scan_prefix([keys::LOG])
            .map(|item| LocatedRecord::read(dir.path(), &item.expect("log record").1))
            .find(|record| {
                record
                    .bytes
                    .windows(16)
                    .any(|window| window == a.as_bytes())
            })
            .expect("a log record with a frame of a");
        let at = record
            .bytes
            .windows(16)
            .position(|window| window == a.as_bytes())
            .expect("frame")
            + 16
            + 10;
        record.write_byte(at, record.bytes[at] ^ 0x5a);
        db.flush().expect("flush");
    }
    {
        let store = Store::open(dir.path()).expect("reopen");
        assert!(store.metrics().replayed_frames > 0);
        assert_only_a_is_quarantined(&store, a, b).await;
    }
    // Closing materialized the tail and moved the mark past the damaged frame: the
    // quarantine must survive that, and b's data must be whole.
    let store = Store::open(dir.path()).expect("open again");
    assert_eq!(store.metrics().replayed_frames, 0);
    assert!(matches!(store.head(a), Err(Error::Quarantined { .. })));
    assert_eq!(all_events(&store, b).len(), 5);
    append(&store, b, 5, "b after the second open").await;
}

#[tokio::test]
async fn s4_broken_log_framing_refuses_to_open_instead_of_dropping_acknowledged_data() {
    let dir = tempfile::tempdir().expect("tempdir");
    two_executions(dir.path()).await;
    {
        let db = raw_open(dir.path());
        replay_everything(&db);
        let (_, value) = db
            .scan_prefix([keys::LOG])
            .next()
            .expect("a log record")
            .expect("read");
        // The first frame's length (after the record's 13-byte header) runs past the end.
        let record = LocatedRecord::read(dir.path(), &value);
        record.write_byte(13, 0x7f);
        db.flush().expect("flush");
    }
    match Store::open_with(dir.path(), Limits::default()) {
        Err(error @ Error::Corrupted { tree: "log", .. }) => assert_eq!(error.code(), "corrupted"),
        other => panic!("expected Corrupted in the log, got {other:?}"),
    }
}
