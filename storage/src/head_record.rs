//! What an execution's head key (`0x03`) holds: its head and, since head record format 2,
//! where its newest events are in the log (`HeadIndex`).
//!
//! An execution's event index is a list of `FrameRef`s. Format 1 heads kept none of it: every
//! materialization wrote the refs committed since as a new index chunk (`0x04`, keyed by
//! its first seq) beside the head, two sled inserts per execution, and a read listed the
//! chunks with a range scan. Format 2 keeps the newest refs in the head record, up to
//! `Limits::head_frame_refs_max`; only when they outgrow it do they move to one chunk. A
//! materialization then writes one key per execution, and reading a short execution's
//! events needs no scan.
//!
//! Format changelog: version 1 — `bincode(ExecutionHead)`, fixed-length integers (record
//! format 1); its refs are all in chunks, through the head's `last_seq` (the chunk and the
//! head were written in one batch). Version 2 — `bincode((ExecutionHead, HeadIndex))` in
//! variable-length integers. Both are read; version 2 is written (schema 5).

use serde::{Deserialize, Serialize};

use crate::codec::{self, FrameRef};
use crate::error::{Error, Result};
use crate::records::ExecutionHead;

/// The format written: 2.
pub(crate) const HEAD_RECORD_VERSION: u8 = 2;
const HEAD_RECORD_V1: u8 = codec::RECORD_FORMAT_VERSION;

/// Where an execution's events are, as its head record says.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HeadIndex {
    /// Index chunks hold the refs of every seq up to this one (0: there is no chunk).
    pub chunked_through: u64,
    /// The refs after `chunked_through`, oldest first.
    pub tail: Vec<FrameRef>,
}

impl HeadIndex {
    /// The last seq whose ref is on disk, in a chunk or in the tail.
    pub fn covered_through(&self) -> u64 {
        self.tail
            .last()
            .map_or(self.chunked_through, |newest| newest.last_seq)
    }

    /// The index once `refs` (newer frames, oldest first) are added, and the chunk to write
    /// if the tail would outgrow `refs_max`: then the whole tail moves to that chunk.
    pub fn extended(
        &self,
        refs: &[FrameRef],
        refs_max: usize,
    ) -> (HeadIndex, Option<Vec<FrameRef>>) {
        let mut tail = Vec::with_capacity(self.tail.len() + refs.len());
        tail.extend_from_slice(&self.tail);
        tail.extend_from_slice(refs);
        if tail.len() <= refs_max {
            let chunked_through = self.chunked_through;
            return (
                HeadIndex {
                    chunked_through,
                    tail,
                },
                None,
            );
        }
        let chunked_through = tail
            .last()
            .map_or(self.chunked_through, |newest| newest.last_seq);
        let index = HeadIndex {
            chunked_through,
            tail: Vec::new(),
        };
        (index, Some(tail))
    }
}

#[derive(Serialize)]
struct HeadRecordRef<'a> {
    head: &'a ExecutionHead,
    index: &'a HeadIndex,
}

#[derive(Deserialize)]
struct HeadRecord {
    head: ExecutionHead,
    index: HeadIndex,
}

/// Encodes a head record in the current format.
pub(crate) fn encode(head: &ExecutionHead, index: &HeadIndex) -> Vec<u8> {
    let record = HeadRecordRef { head, index };
    codec::encode_with(HEAD_RECORD_VERSION, &record, codec::frame_options())
}

/// Decodes a head record of either format read at `key`, validating its checksum.
pub(crate) fn decode(key: &[u8], bytes: &[u8]) -> Result<(ExecutionHead, HeadIndex)> {
    match codec::checked_record(key, bytes)? {
        (HEAD_RECORD_VERSION, payload) => {
            let record: HeadRecord = codec::decode_payload(key, payload, codec::frame_options())?;
            Ok((record.head, record.index))
        }
        (HEAD_RECORD_V1, payload) => {
            let head: ExecutionHead =
                codec::decode_payload(key, payload, codec::bincode_options())?;
            let index = HeadIndex {
                chunked_through: head.last_seq,
                tail: Vec::new(),
            };
            Ok((head, index))
        }
        _ => Err(Error::corrupted(key)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_ref(first_seq: u64, last_seq: u64) -> FrameRef {
        FrameRef {
            first_seq,
            last_seq,
            record: first_seq * 10,
        }
    }

    fn head() -> ExecutionHead {
        let mut head = ExecutionHead::new(
            crate::ids::ExecutionId::new(),
            crate::ids::SessionId::new(),
            crate::ids::RunId::new(),
            crate::records::ExecutionKind::AgentTurn,
        );
        head.last_seq = 7;
        head.last_activity_ms = 1_796_305_252_790;
        head
    }

    #[test]
    fn s1_a_head_record_round_trips_and_a_format_1_head_reads_with_its_chunks() {
        let key = crate::keys::head(crate::ids::ExecutionId::new());
        let head = head();
        let index = HeadIndex {
            chunked_through: 4,
            tail: vec![frame_ref(5, 6), frame_ref(7, 7)],
        };
        let bytes = encode(&head, &index);
        assert_eq!(bytes[0], HEAD_RECORD_VERSION);
        assert_eq!(decode(&key, &bytes).expect("decode"), (head.clone(), index));
        // Format 1: the bare head; its refs are in chunks through its last seq.
        let (read, index) = decode(&key, &codec::encode(&head)).expect("format 1");
        assert_eq!(read, head);
        assert_eq!(
            index,
            HeadIndex {
                chunked_through: 7,
                tail: Vec::new()
            }
        );
        // An unknown version, a flipped byte: corrupted, never a panic.
        let mut unknown = encode(&head, &HeadIndex::default());
        unknown[0] = 9;
        let body = unknown.len() - 4;
        let crc = crc32fast::hash(&unknown[..body]).to_be_bytes();
        unknown[body..].copy_from_slice(&crc);
        assert!(matches!(
            decode(&key, &unknown),
            Err(Error::Corrupted { tree: "heads", .. })
        ));
        let mut flipped = encode(&head, &HeadIndex::default());
        flipped[5] ^= 0x5a;
        assert!(matches!(
            decode(&key, &flipped),
            Err(Error::Corrupted { .. })
        ));
    }

    #[test]
    fn s1_refs_stay_in_the_head_until_they_outgrow_it_then_move_to_one_chunk() {
        let index = HeadIndex::default();
        let (index, chunk) = index.extended(&[frame_ref(1, 2), frame_ref(3, 4)], 3);
        assert_eq!(chunk, None);
        assert_eq!((index.chunked_through, index.tail.len()), (0, 2));
        assert_eq!(index.covered_through(), 4);
        let (index, chunk) = index.extended(&[frame_ref(5, 5), frame_ref(6, 8)], 3);
        assert_eq!(
            chunk,
            Some(vec![
                frame_ref(1, 2),
                frame_ref(3, 4),
                frame_ref(5, 5),
                frame_ref(6, 8)
            ])
        );
        assert_eq!(
            index,
            HeadIndex {
                chunked_through: 8,
                tail: Vec::new()
            }
        );
        assert_eq!(index.covered_through(), 8);
        let (index, chunk) = index.extended(&[frame_ref(9, 9)], 3);
        assert_eq!(chunk, None);
        assert_eq!(index.covered_through(), 9);
        // With no room in the head, every materialization writes a chunk (format 1's way).
        let (index, chunk) = HeadIndex::default().extended(&[frame_ref(1, 3)], 0);
        assert_eq!(chunk, Some(vec![frame_ref(1, 3)]));
        assert_eq!(index.chunked_through, 3);
    }
}
