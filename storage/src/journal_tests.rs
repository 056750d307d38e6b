//! Tests of the journal: frames read back, cuts and damage, held segments, dropping.

use std::os::unix::fs::MetadataExt;

use super::*;

fn ops(n: u8) -> Vec<(IVec, Option<IVec>)> {
    vec![
        (IVec::from(&[n][..]), Some(IVec::from(vec![n; 40]))),
        (IVec::from(&[n, 1][..]), None),
    ]
}

#[test]
fn s3_frames_read_back_in_order_across_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut journal, frames) = Journal::open(dir.path(), Some(0), SEGMENT_BYTES).expect("open");
    assert!(frames.is_empty());
    for n in 1..=3 {
        let seq = journal.append(u64::from(n) * 10, &ops(n)).expect("append");
        assert_eq!(seq, u64::from(n));
    }
    drop(journal);
    let (journal, frames) = Journal::open(dir.path(), Some(0), SEGMENT_BYTES).expect("reopen");
    assert_eq!(frames.len(), 3);
    assert_eq!(frames[2].seq, 3);
    assert_eq!(frames[2].last_position, 30);
    assert_eq!(frames[2].ops[0], (vec![3], Some(vec![3; 40])));
    assert_eq!(frames[2].ops[1], (vec![3, 1], None));
    assert_eq!(journal.next_seq(), 4);
}

#[test]
fn s3_zeros_go_ahead_of_the_frames_and_never_over_them() {
    // 4 MiB segments: the zeros run to each segment's end while frames of many sizes are
    // written into it, across rolls.
    let dir = tempfile::tempdir().expect("tempdir");
    let segment_bytes = 4 << 20;
    let (mut journal, _) = Journal::open(dir.path(), Some(0), segment_bytes).expect("open");
    let frame = |n: u16| {
        let value = vec![n as u8; usize::from(n) * 397 % 30_000];
        vec![(IVec::from(&n.to_be_bytes()[..]), Some(IVec::from(value)))]
    };
    for n in 1..=400u16 {
        journal.append(u64::from(n), &frame(n)).expect("append");
    }
    assert!(
        journal.segments.len() > 1,
        "{} segments",
        journal.segments.len()
    );
    journal.zero.as_ref().expect("zeros ahead").settle();
    // Every block from the zeros' lead on is allocated: a frame's fdatasync there writes
    // no block map. (The frames so far and their lead hold less than the segment.)
    let lead_end = (journal.offset + crate::zero_ahead::LEAD_BYTES).next_multiple_of(4096);
    assert!(
        lead_end < segment_bytes,
        "the test's frames fill the segment"
    );
    let allocated = journal.file.metadata().expect("metadata").blocks() * 512;
    let zeroed = segment_bytes - lead_end;
    assert!(
        allocated >= journal.offset + zeroed,
        "{allocated} bytes allocated"
    );
    drop(journal);
    let (_, frames) = Journal::open(dir.path(), Some(0), segment_bytes).expect("reopen");
    assert_eq!(frames.len(), 400);
    for (frame_read, n) in frames.iter().zip(1..) {
        let written: Vec<_> = frame(n)
            .into_iter()
            .map(|(key, value)| (key.to_vec(), value.map(|v| v.to_vec())))
            .collect();
        assert_eq!((frame_read.seq, &frame_read.ops), (u64::from(n), &written));
    }
}

#[test]
fn s3_a_cut_last_frame_ends_the_journal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut journal, _) = Journal::open(dir.path(), Some(0), SEGMENT_BYTES).expect("open");
    journal.append(1, &ops(1)).expect("append");
    journal.append(2, &ops(2)).expect("append");
    let path = journal.segments[0].1.clone();
    drop(journal);
    // The second frame's last byte flipped: a write the crash cut.
    let bytes = std::fs::read(&path).expect("read");
    let end = bytes.iter().rposition(|byte| *byte != 0).expect("written");
    let file = open_rw(&path).expect("open");
    file.write_all_at(&[bytes[end] ^ 0xFF], end as u64)
        .expect("flip");
    let (mut journal, frames) = Journal::open(dir.path(), Some(0), SEGMENT_BYTES).expect("reopen");
    assert_eq!(frames.len(), 1);
    // Appended after: the cut frame is overwritten.
    journal.append(3, &ops(3)).expect("append");
    let (_, frames) = Journal::open(dir.path(), Some(0), SEGMENT_BYTES).expect("reopen");
    assert_eq!(
        frames.iter().map(|frame| frame.seq).collect::<Vec<_>>(),
        [1, 2]
    );
}

#[test]
fn s3_damage_in_an_older_segment_refuses_unless_sled_holds_its_frames() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut journal, _) = Journal::open(dir.path(), Some(0), SEGMENT_BYTES).expect("open");
    let big = vec![(IVec::from(&b"k"[..]), Some(IVec::from(vec![7u8; 20 << 20])))];
    for position in 1..=5 {
        journal.append(position, &big).expect("append");
    }
    let (older, newest) = (journal.segments[0].clone(), journal.segments[1].0);
    drop(journal);
    let at = HEADER_BYTES + FRAME_HEADER_BYTES + 40;
    let file = open_rw(&older.1).expect("open");
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, at).expect("read");
    file.write_all_at(&[byte[0] ^ 0xFF], at).expect("flip");
    assert!(matches!(
        Journal::open(dir.path(), Some(0), SEGMENT_BYTES),
        Err(Error::Corrupted { .. })
    ));
    // Held by sled, the segment is not replayed, so not read: its records are checked
    // where they are read (their own checksums).
    let (_, frames) = Journal::open(dir.path(), Some(newest - 1), SEGMENT_BYTES).expect("held");
    assert_eq!(frames.first().map(|frame| frame.seq), Some(newest));
    assert!(older.1.exists());
}

#[test]
fn s7_a_damaged_frame_followed_by_a_whole_one_refuses_even_in_the_newest_segment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut journal, _) = Journal::open(dir.path(), Some(0), SEGMENT_BYTES).expect("open");
    for n in 1..=3 {
        journal.append(u64::from(n), &ops(n)).expect("append");
    }
    let path = journal.segments[0].1.clone();
    drop(journal);
    // A byte of the first frame's payload: frames 2 and 3 are whole after it, so it was
    // not cut by a crash (only the last written can be); acknowledged frames would be lost.
    let at = (HEADER_BYTES + FRAME_HEADER_BYTES + 2) as usize;
    let bytes = std::fs::read(&path).expect("read");
    open_rw(&path)
        .expect("open")
        .write_all_at(&[bytes[at] ^ 0xFF], at as u64)
        .expect("flip");
    assert!(matches!(
        Journal::open(dir.path(), Some(0), SEGMENT_BYTES),
        Err(Error::Corrupted { .. })
    ));
    // A frame sled holds is skipped: only the records in it are damaged, and their own
    // checksums find that where they are read (S-4).
    let (mut journal, frames) = Journal::open(dir.path(), Some(1), SEGMENT_BYTES).expect("held");
    assert_eq!(
        frames.iter().map(|frame| frame.seq).collect::<Vec<_>>(),
        [2, 3]
    );
    assert_eq!(journal.append(4, &ops(4)).expect("append"), 4);
}

#[test]
fn s9_segments_go_once_sled_holds_them_and_nothing_lives_in_them_never_the_newest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut journal, _) = Journal::open(dir.path(), Some(0), SEGMENT_BYTES).expect("open");
    let big = vec![(IVec::from(&b"k"[..]), Some(IVec::from(vec![7u8; 20 << 20])))];
    for position in 1..=8 {
        journal.append(position, &big).expect("append");
    }
    let segments = journal.segments.clone();
    assert!(segments.len() >= 3, "{segments:?}");
    let (first, second) = (segments[0].0, segments[1].0);
    // Not yet held by sled: nothing goes.
    journal.drop_dead(first, |_| false).expect("drop");
    assert_eq!(journal.segments, segments);
    // Held: the dead ones go, the one a record lives in stays, the newest stays.
    journal
        .drop_dead(u64::MAX, |segment| segment == second)
        .expect("drop");
    let newest = segments.last().cloned().expect("newest");
    assert_eq!(journal.segments, vec![segments[1].clone(), newest.clone()]);
    assert!(!segments[0].1.exists() && newest.1.exists());
    assert!(journal
        .readable
        .read(Location {
            segment: first,
            offset: 8,
            len: 1
        })
        .expect("read")
        .is_none());
    // Reopened after what sled holds: only the frames after it.
    let (_, frames) = Journal::open(dir.path(), Some(newest.0 - 1), SEGMENT_BYTES).expect("reopen");
    assert!(frames.iter().all(|frame| frame.seq >= newest.0));
    assert_eq!(frames.last().map(|frame| frame.seq), Some(8));
    // sled holds frames the journal has lost: refused.
    assert!(matches!(
        Journal::open(dir.path(), Some(20), SEGMENT_BYTES),
        Err(Error::Corrupted { .. })
    ));
}

#[test]
fn s9_a_value_is_read_where_its_write_and_its_reopen_locate_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut journal, _) = Journal::open(dir.path(), Some(0), SEGMENT_BYTES).expect("open");
    journal.append(1, &ops(1)).expect("append");
    let written = journal.write(2, &ops(2)).expect("write");
    journal.sync().expect("sync");
    let location = written.locations[0].expect("an insert");
    assert_eq!(written.locations[1], None);
    let readable = journal.readable();
    assert_eq!(readable.read(location).expect("read"), Some(vec![2u8; 40]));
    drop(journal);
    let (_, frames) = Journal::open(dir.path(), Some(0), SEGMENT_BYTES).expect("reopen");
    assert_eq!(frames[1].locations, written.locations);
}

#[test]
fn s7_a_length_damaged_to_look_like_the_end_does_not_hide_the_frames_after_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (mut journal, _) = Journal::open(dir.path(), Some(0), SEGMENT_BYTES).expect("open");
    let mut at = Vec::new();
    for n in 1..=3 {
        at.push(journal.offset);
        journal.append(u64::from(n), &ops(n)).expect("append");
    }
    let path = journal.segments[0].1.clone();
    drop(journal);
    // Frame 2's length now runs into the zeros after the last frame: it looks cut, and
    // the journal would end before it, losing frame 3, which was acknowledged.
    let len = (SEGMENT_BYTES / 2) as u32;
    open_rw(&path)
        .expect("open")
        .write_all_at(&len.to_le_bytes(), at[1])
        .expect("damage");
    assert!(matches!(
        Journal::open(dir.path(), Some(0), SEGMENT_BYTES),
        Err(Error::Corrupted { .. })
    ));
}

#[test]
fn s9_a_journal_from_before_schema_15_replays_every_frame_it_kept_and_gaps_refuse() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Schema 14 dropped the segments sled held: what is left starts at 5.
    let readable = Segments::new(dir.path().to_path_buf());
    let mut journal = Journal::create(dir.path(), (5, SEGMENT_BYTES), Vec::new(), readable, None)
        .expect("create");
    journal.append(5, &ops(5)).expect("append");
    journal.append(6, &ops(6)).expect("append");
    drop(journal);
    let (journal, frames) = Journal::open(dir.path(), None, SEGMENT_BYTES).expect("open");
    assert_eq!(
        frames.iter().map(|frame| frame.seq).collect::<Vec<_>>(),
        [5, 6]
    );
    assert_eq!(journal.next_seq(), 7);
    drop(journal);
    // sled holds through 2: frames 3 and 4 are gone.
    assert!(matches!(
        Journal::open(dir.path(), Some(2), SEGMENT_BYTES),
        Err(Error::Corrupted { .. })
    ));
    // A newest segment after a gap: frames 7 to 9 are gone.
    let readable = Segments::new(dir.path().to_path_buf());
    let segments = list(dir.path()).expect("list");
    drop(
        Journal::create(dir.path(), (10, SEGMENT_BYTES), segments, readable, None).expect("create"),
    );
    assert!(matches!(
        Journal::open(dir.path(), Some(6), SEGMENT_BYTES),
        Err(Error::Corrupted { .. })
    ));
}
