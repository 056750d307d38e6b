//! S-1: an execution's events are read back in seq order, each once, wherever its event
//! index lives: the newest frame refs in its head record (head record format 2), older ones
//! in index chunks, or all in chunks under a format 1 head written by an earlier build.

use std::path::Path;

use openprogram_storage::{keys, EventReader, ExecutionId, Limits, Store};

use crate::support::*;

fn limits(head_frame_refs_max: usize) -> Limits {
    Limits {
        head_frame_refs_max,
        ..Limits::default()
    }
}

/// Opens the store, appends `n` events to `execution_id` (created first if `None`) and
/// closes it, which writes everything to its own keys: one materialization.
async fn session(
    dir: &Path,
    limits: Limits,
    execution_id: Option<ExecutionId>,
    n: u64,
) -> ExecutionId {
    let store = Store::open_with(dir, limits).expect("open");
    let execution_id = match execution_id {
        Some(execution_id) => execution_id,
        None => create(&store).await,
    };
    let version = store
        .head(execution_id)
        .expect("head")
        .expect("exists")
        .version;
    for step in 0..n {
        append(&store, execution_id, version + step, "step").await;
    }
    execution_id
}

fn chunk_keys(dir: &Path, execution_id: ExecutionId) -> Vec<Vec<u8>> {
    let db = raw_open(dir);
    db.scan_prefix(keys::events_prefix(execution_id))
        .keys()
        .map(|key| key.expect("key").to_vec())
        .collect()
}

/// Every read from every point, whole and a page of one event at a time, gives exactly the
/// seqs after it.
fn assert_reads_back(store: &Store, execution_id: ExecutionId, last_seq: u64) {
    for after in 0..=last_seq {
        let seqs: Vec<u64> = store
            .events_after(execution_id, after, usize::MAX)
            .expect("events")
            .iter()
            .map(|event| event.seq)
            .collect();
        assert_eq!(
            seqs,
            (after + 1..=last_seq).collect::<Vec<_>>(),
            "after {after}"
        );
        let page = store.events_after(execution_id, after, 1).expect("page");
        let expected: Vec<u64> = (after + 1..=last_seq).take(1).collect();
        assert_eq!(page.iter().map(|e| e.seq).collect::<Vec<_>>(), expected);
    }
}

#[tokio::test]
async fn s1_a_short_execution_is_written_as_one_head_record_without_an_index_chunk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = session(dir.path(), Limits::default(), None, 3).await;
    let a = session(dir.path(), Limits::default(), Some(a), 2).await;
    assert_eq!(chunk_keys(dir.path(), a), Vec::<Vec<u8>>::new());
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(store.metrics().replayed_frames, 0);
    assert_reads_back(&store, a, 6);
}

#[tokio::test]
async fn s1_frame_refs_move_to_one_chunk_when_they_outgrow_the_head_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Three refs fit in the head; each session adds one (one transition, one frame).
    let a = session(dir.path(), limits(3), None, 0).await;
    for _ in 0..2 {
        session(dir.path(), limits(3), Some(a), 1).await;
    }
    assert_eq!(chunk_keys(dir.path(), a), Vec::<Vec<u8>>::new());
    // The fourth ref moves all four to one chunk, keyed by the first seq.
    session(dir.path(), limits(3), Some(a), 1).await;
    assert_eq!(chunk_keys(dir.path(), a), vec![keys::events(a, 1).to_vec()]);
    // Then the head fills again, and the next chunk starts where the first ended.
    for _ in 0..4 {
        session(dir.path(), limits(3), Some(a), 1).await;
    }
    assert_eq!(
        chunk_keys(dir.path(), a),
        vec![keys::events(a, 1).to_vec(), keys::events(a, 5).to_vec()]
    );
    session(dir.path(), limits(3), Some(a), 1).await;
    let store = Store::open_with(dir.path(), limits(3)).expect("reopen");
    assert_reads_back(&store, a, 9);
}

#[tokio::test]
async fn s1_a_format_1_head_record_still_reads_with_its_chunks_and_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    // With no refs kept in heads, every materialization writes a chunk: the layout of the
    // schema 4 builds. Their head record was the bare head in record format 1.
    let a = session(dir.path(), limits(0), None, 2).await;
    let a = session(dir.path(), limits(0), Some(a), 2).await;
    assert_eq!(chunk_keys(dir.path(), a).len(), 2);
    {
        let store = Store::open(dir.path()).expect("open");
        let head = store.head(a).expect("head").expect("exists");
        drop(store);
        let db = raw_open(dir.path());
        db.insert(keys::head(a), openprogram_storage::codec::encode(&head))
            .expect("write a format 1 head");
        db.flush().expect("flush");
    }
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(
        store.head(a).expect("head").map(|head| head.last_seq),
        Some(5)
    );
    assert_reads_back(&store, a, 5);
    drop(store);
    // New refs go to the head record after the chunks of the format 1 head.
    session(dir.path(), Limits::default(), Some(a), 3).await;
    assert_eq!(chunk_keys(dir.path(), a).len(), 2);
    let store = Store::open(dir.path()).expect("reopen");
    assert_reads_back(&store, a, 8);
}

#[tokio::test]
async fn s1_a_replay_over_head_records_already_written_lists_no_frame_twice() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = session(dir.path(), limits(2), None, 4).await;
    let b = session(dir.path(), limits(2), None, 1).await;
    assert_eq!(chunk_keys(dir.path(), a), vec![keys::events(a, 1).to_vec()]);
    // As after a crash in a materialization that had written these heads: the next open
    // replays frames that the heads and chunks on disk already list.
    replay_everything(&raw_open(dir.path()));
    let store = Store::open_with(dir.path(), limits(2)).expect("reopen");
    assert_eq!(store.metrics().replayed_frames, 7);
    assert_reads_back(&store, a, 5);
    assert_reads_back(&store, b, 2);
    for version in 5..=7 {
        append(&store, a, version, "after the replay").await;
    }
    drop(store);
    // The replayed refs were not added again: b's two still fit in its head (listed twice,
    // four would have moved to a chunk).
    assert_eq!(chunk_keys(dir.path(), b), Vec::<Vec<u8>>::new());
    assert_eq!(
        chunk_keys(dir.path(), a),
        vec![keys::events(a, 1).to_vec(), keys::events(a, 6).to_vec()]
    );
    let store = Store::open_with(dir.path(), limits(2)).expect("reopen");
    assert_reads_back(&store, a, 8);
    assert_reads_back(&store, b, 2);
}

#[tokio::test]
async fn s1_a_replay_over_a_head_record_that_covers_part_of_it_adds_only_the_rest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = session(dir.path(), limits(3), None, 1).await;
    let written_first = raw_open(dir.path())
        .get(keys::head(a))
        .expect("get")
        .expect("head record");
    session(dir.path(), limits(3), Some(a), 1).await;
    {
        // As after a crash in the materialization of the second session's frame: the head
        // record on disk covers the first two frames, the replay brings all three.
        let db = raw_open(dir.path());
        db.insert(keys::head(a), written_first).expect("restore");
        replay_everything(&db);
        db.flush().expect("flush");
    }
    let store = Store::open_with(dir.path(), limits(3)).expect("reopen");
    assert_eq!(store.metrics().replayed_frames, 3);
    assert_reads_back(&store, a, 3);
    drop(store);
    // Three refs, each once: they still fit in the head record (listed twice, five would
    // have moved to a chunk). The fourth moves them to one chunk.
    assert_eq!(chunk_keys(dir.path(), a), Vec::<Vec<u8>>::new());
    session(dir.path(), limits(3), Some(a), 1).await;
    assert_eq!(chunk_keys(dir.path(), a), vec![keys::events(a, 1).to_vec()]);
    let store = Store::open_with(dir.path(), limits(3)).expect("reopen");
    assert_reads_back(&store, a, 4);
}
