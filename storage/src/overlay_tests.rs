//! Unit tests of the overlay (`overlay.rs`): what a materialization writes.

use super::*;
use crate::event::Event;
use crate::ids::{RunId, SessionId};
use crate::records::ExecutionKind;

/// A frame of an execution: its event `seq`, logged at position 1.
fn frame_of(execution_id: ExecutionId, seq: u64) -> Frame {
    let mut head = ExecutionHead::new(
        execution_id,
        SessionId::new(),
        RunId::new(),
        ExecutionKind::AgentTurn,
    );
    head.last_seq = seq;
    let event = EventEnvelope {
        execution_id,
        seq,
        position: 1,
        at_ms: 0,
        writer_epoch: 0,
        event: Event::StateChanged {
            state: ExecutionState::Running,
            reason: "test".into(),
        },
    };
    Frame {
        head,
        events: vec![event],
        records: Vec::new(),
    }
}

/// An execution's frame (`frame_of`), merged as the committer merges one whose head record
/// index it did not read (`disk_index: None`): the index is read when it is written.
fn overlay_with_one_unread_entry(seq: u64) -> (Overlay, ExecutionId) {
    let execution_id = ExecutionId::new();
    let mut overlay = Overlay::new(16);
    overlay.merge(frame_of(execution_id, seq), 1, None, None);
    overlay.freeze(1);
    (overlay, execution_id)
}

/// `batch` applied to a new sled database (kept alive by the returned directory).
fn applied(batch: sled::Batch) -> (tempfile::TempDir, sled::Db) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = sled::open(dir.path()).expect("sled");
    db.apply_batch(batch).expect("apply");
    (dir, db)
}

#[test]
fn s4_a_head_record_a_materialization_finds_corrupted_is_left_and_its_quarantine_written() {
    let (overlay, execution_id) = overlay_with_one_unread_entry(1);
    let corrupted = |_| {
        Err(Error::Corrupted {
            tree: "heads",
            key: "03…".into(),
        })
    };
    let mut slice = overlay.slice(usize::MAX);
    let mut batch = sled::Batch::default();
    overlay
        .write_slice(&mut slice, &mut batch, &corrupted)
        .expect("the slice is written without it");
    let (_dir, db) = applied(batch);
    assert_eq!(db.get(keys::head(execution_id)).expect("get"), None);
    let quarantine = db
        .get(keys::quarantine(execution_id))
        .expect("get")
        .expect("the quarantine is written with the slice");
    let reason: String =
        codec::decode(&keys::quarantine(execution_id), &quarantine).expect("decode");
    assert!(reason.contains("heads"), "{reason}");
    // The slice still finishes the materialization: the mark moves.
    let mark = keys::meta(keys::META_MATERIALIZED_THROUGH);
    let mark = db
        .get(&mark)
        .expect("get")
        .map(|bytes| codec::decode::<u64>(&mark, &bytes));
    assert_eq!(mark.map(|decoded| decoded.expect("mark")), Some(1));
}

#[test]
fn r13_a_head_record_a_materialization_cannot_read_fails_the_slice() {
    let (overlay, _) = overlay_with_one_unread_entry(1);
    let unreadable = |_| {
        Err(Error::Io {
            path: "db".into(),
            message: "test: read failed".into(),
        })
    };
    let mut slice = overlay.slice(usize::MAX);
    let mut batch = sled::Batch::default();
    let written = overlay.write_slice(&mut slice, &mut batch, &unreadable);
    assert!(matches!(written, Err(Error::Io { .. })), "{written:?}");
}

#[test]
fn s1_an_entry_whose_index_was_not_read_is_written_over_the_one_on_disk() {
    // Disk lists the execution's first frame; the entry brings its second.
    let (overlay, execution_id) = overlay_with_one_unread_entry(2);
    let first = FrameRef {
        first_seq: 1,
        last_seq: 1,
        record: 0,
    };
    let on_disk = |_| {
        Ok(Some(HeadIndex {
            chunked_through: 0,
            tail: vec![first],
        }))
    };
    let mut slice = overlay.slice(usize::MAX);
    let mut batch = sled::Batch::default();
    overlay
        .write_slice(&mut slice, &mut batch, &on_disk)
        .expect("written");
    let (_dir, db) = applied(batch);
    let key = keys::head(execution_id);
    let bytes = db.get(key).expect("get").expect("the head record");
    let (_, index) = head_record::decode(&key, &bytes).expect("decode");
    let second = FrameRef {
        first_seq: 2,
        last_seq: 2,
        record: 1,
    };
    assert_eq!(index.tail, vec![first, second]);
}

/// S-6: a materialization's slices take the frozen entries in key order (so one group's
/// writes sit together in sled's leaves), every entry once, and only the slice that
/// finishes the materialization writes the mark, also when an entry was dropped meanwhile
/// (a quarantine, `forget`).
#[test]
fn s6_slices_take_the_frozen_entries_in_key_order_and_the_last_one_writes_the_mark() {
    let mut overlay = Overlay::new(16);
    // Random ids, so that the map's order is not the key order.
    let ids: Vec<ExecutionId> = (0..40)
        .map(|_| ExecutionId::from_uuid(uuid::Uuid::new_v4()))
        .collect();
    for execution_id in &ids {
        overlay.merge(frame_of(*execution_id, 1), 1, None, None);
    }
    overlay.freeze(1);
    // Forgotten after the first slice: the last entry in key order, which a slice must skip.
    let forgotten = ids.iter().copied().max().expect("ids");
    let no_disk = |_| Ok(None);
    let mark = keys::meta(keys::META_MATERIALIZED_THROUGH);
    let mut written = Vec::new();
    let mut slices = 0;
    while overlay.is_materializing() {
        let mut slice = overlay.slice(7);
        assert!(
            !slice.is_empty(),
            "a materialization always has a next slice"
        );
        assert!(
            slice.execs.windows(2).all(|pair| pair[0] < pair[1]),
            "{:?}",
            slice.execs
        );
        if let (Some(last), Some(first)) = (written.last(), slice.execs.first()) {
            assert!(last < first, "slices follow each other in key order");
        }
        let mut batch = sled::Batch::default();
        overlay
            .write_slice(&mut slice, &mut batch, &no_disk)
            .expect("written");
        let (_dir, db) = applied(batch);
        written.extend(slice.execs.iter().copied());
        overlay.finish_slice(slice);
        if slices == 0 {
            overlay.forget(forgotten);
        }
        slices += 1;
        let marked = db.get(&mark).expect("get").is_some();
        assert_eq!(marked, !overlay.is_materializing(), "slice {slices}");
    }
    let mut expected: Vec<ExecutionId> =
        ids.iter().copied().filter(|id| *id != forgotten).collect();
    expected.sort_unstable();
    assert_eq!(written, expected);
    assert_eq!(slices, 6, "39 entries by 7");
    // Every group asks for a slice, materializing or not.
    assert!(overlay.slice(7).is_empty());
    overlay.merge(frame_of(forgotten, 2), 2, None, None);
    overlay.freeze(2);
    assert_eq!(
        overlay.slice(7).execs,
        vec![forgotten],
        "the next materialization"
    );
}
