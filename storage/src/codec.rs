//! Bytes on disk: the record codec and the log record format. Bytes read from disk are
//! input: every decode validates a checksum first, and a failure is `Error::Corrupted`.
//!
//! Record (every value but blobs):
//! ```text
//! +---------+-------------------+---------------------------------+
//! | version | bincode payload   | crc32 (big-endian) of the bytes |
//! | 1 byte  | n bytes           | before it: 4 bytes              |
//! +---------+-------------------+---------------------------------+
//! ```
//! Log record (one sled value holding the frames of one or more transitions of one group;
//! its key holds the first event position, its header the last, so positions are known even
//! when a frame is unreadable):
//! ```text
//! | version: 1 byte | last position: u64 BE | crc32 of the 9 bytes before: u32 BE |
//! | frame | frame | ...
//! frame := | len: u32 BE | crc32 of the next 16 + len bytes: u32 BE |
//!          | execution id: 16 bytes | bincode(Frame): len bytes |
//! ```
//! Format changelog: version 1 — the initial format.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::event::EventEnvelope;
use crate::ids::ExecutionId;
use crate::keys;
use crate::records::{CommandRecord, ExecutionHead, ProcessRecord, ReceiptRecord, WaitRecord};

/// The format version written in front of every record.
pub const RECORD_FORMAT_VERSION: u8 = 1;
/// The format version written in front of every log record.
pub const LOG_FORMAT_VERSION: u8 = 1;

const CRC_LEN: usize = 4;
const FRAME_HEADER_LEN: usize = 4 + 4 + 16;
const LOG_HEADER_LEN: usize = 1 + 8 + 4;

fn bincode_options() -> impl bincode::Options {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .reject_trailing_bytes()
}

/// Encodes a record. Serializing our own types into memory cannot fail; if it ever did, it
/// would be a programming error worth stopping for.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    use bincode::Options;
    let mut bytes = vec![RECORD_FORMAT_VERSION];
    bincode_options()
        .serialize_into(&mut bytes, value)
        .expect("invariant: our record types serialize into memory");
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_be_bytes());
    bytes
}

/// Decodes a record read at `key`, validating its checksum and version.
pub fn decode<T: DeserializeOwned>(key: &[u8], bytes: &[u8]) -> Result<T> {
    use bincode::Options;
    let corrupted = || Error::Corrupted {
        tree: keys::tree_name(key),
        key: keys::display(key),
    };
    if bytes.len() < 1 + CRC_LEN {
        return Err(corrupted());
    }
    let (body, crc) = bytes.split_at(bytes.len() - CRC_LEN);
    let stored_crc = u32::from_be_bytes(crc.try_into().map_err(|_| corrupted())?);
    if crc32fast::hash(body) != stored_crc || body[0] != RECORD_FORMAT_VERSION {
        return Err(corrupted());
    }
    // The limit bounds what a hostile length prefix can make the decoder read.
    bincode_options()
        .with_limit(body.len() as u64)
        .deserialize(&body[1..])
        .map_err(|_| corrupted())
}

/// A record upsert carried by a transition and replayed from the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum RecordValue {
    Command(CommandRecord),
    Receipt(ReceiptRecord),
    Wait(WaitRecord),
    Process(ProcessRecord),
}

/// What the log keeps of one committed transition: enough to rebuild the head, the events
/// and the records without reading anything else.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Frame {
    pub head: ExecutionHead,
    pub events: Vec<EventEnvelope>,
    pub records: Vec<RecordValue>,
}

/// Builds one log record frame by frame.
#[derive(Debug)]
pub(crate) struct LogRecordWriter {
    bytes: Vec<u8>,
}

impl LogRecordWriter {
    pub fn new() -> Self {
        let mut bytes = Vec::with_capacity(LOG_HEADER_LEN + 4096);
        bytes.push(LOG_FORMAT_VERSION);
        bytes.extend_from_slice(&[0u8; LOG_HEADER_LEN - 1]);
        Self { bytes }
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Appends an already encoded frame (see `encode_frame`).
    pub fn push(&mut self, frame: &[u8]) {
        self.bytes.extend_from_slice(frame);
    }

    /// The record, stamped with the position of its last event.
    pub fn finish(mut self, last_position: u64) -> Vec<u8> {
        self.bytes[1..9].copy_from_slice(&last_position.to_be_bytes());
        let crc = crc32fast::hash(&self.bytes[..9]);
        self.bytes[9..LOG_HEADER_LEN].copy_from_slice(&crc.to_be_bytes());
        self.bytes
    }
}

/// The encoded size of a value, without encoding it: checked when a transition is
/// submitted, so an oversized one never reaches the queue.
pub(crate) fn encoded_size<T: Serialize>(value: &T) -> u64 {
    use bincode::Options;
    bincode_options().serialized_size(value).unwrap_or(u64::MAX)
}

/// Encodes a frame with its header.
pub(crate) fn encode_frame(frame: &Frame) -> Vec<u8> {
    use bincode::Options;
    let mut bytes = vec![0u8; FRAME_HEADER_LEN];
    bytes[8..24].copy_from_slice(frame.head.execution_id.as_bytes());
    bincode_options()
        .serialize_into(&mut bytes, frame)
        .expect("invariant: frames serialize into memory");
    // A frame over 4 GiB gets a wrong length here, and the size limit (at most 4 GiB,
    // `log.rs`) refuses it before it is written.
    let len = u32::try_from(bytes.len() - FRAME_HEADER_LEN).unwrap_or(u32::MAX);
    let crc = crc32fast::hash(&bytes[8..]);
    bytes[0..4].copy_from_slice(&len.to_be_bytes());
    bytes[4..8].copy_from_slice(&crc.to_be_bytes());
    bytes
}

/// One frame read back from a log record.
#[derive(Debug)]
pub(crate) enum DecodedFrame {
    Ok(Box<Frame>),
    /// The frame's checksum or decode failed. The execution id is the one its header
    /// claims: the best attribution there is, and it is quarantined.
    Corrupt {
        claimed: ExecutionId,
    },
}

/// A log record read back: the position of its last event and its frames.
#[derive(Debug)]
pub(crate) struct DecodedLogRecord {
    pub last_position: u64,
    pub frames: Vec<DecodedFrame>,
}

/// Where one transition's events live: the event index of an execution is a list of these,
/// so events are stored once, in the log, and an execution's history is read by decoding
/// only its own frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrameRef {
    pub first_seq: u64,
    pub last_seq: u64,
    /// The key (first position) of the log record holding the frame.
    pub record: u64,
}

/// Splits a log record into frames. A broken framing (a length running past the end, an
/// unknown version) cannot be attributed to any execution and is an error for the record.
pub(crate) fn decode_log_record(key: &[u8], bytes: &[u8]) -> Result<DecodedLogRecord> {
    decode_frames(key, bytes, None)
}

/// Like `decode_log_record`, but decodes only the frames whose header names `only`; the
/// others are skipped by their length without being decoded.
pub(crate) fn decode_frames(
    key: &[u8],
    bytes: &[u8],
    only: Option<ExecutionId>,
) -> Result<DecodedLogRecord> {
    use bincode::Options;
    let corrupted = || Error::Corrupted {
        tree: keys::tree_name(key),
        key: keys::display(key),
    };
    if bytes.len() < LOG_HEADER_LEN || bytes[0] != LOG_FORMAT_VERSION {
        return Err(corrupted());
    }
    let mut last = [0u8; 8];
    last.copy_from_slice(&bytes[1..9]);
    let last_position = u64::from_be_bytes(last);
    let mut crc = [0u8; 4];
    crc.copy_from_slice(&bytes[9..LOG_HEADER_LEN]);
    let first_position = keys::log_position(key).ok_or_else(corrupted)?;
    if crc32fast::hash(&bytes[..9]) != u32::from_be_bytes(crc) || last_position < first_position {
        return Err(corrupted());
    }
    let mut frames = Vec::new();
    let mut rest = &bytes[LOG_HEADER_LEN..];
    while !rest.is_empty() {
        if rest.len() < FRAME_HEADER_LEN {
            return Err(corrupted());
        }
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let crc = u32::from_be_bytes([rest[4], rest[5], rest[6], rest[7]]);
        let end = FRAME_HEADER_LEN
            .checked_add(len)
            .filter(|end| *end <= rest.len());
        let Some(end) = end else {
            return Err(corrupted());
        };
        let mut id = [0u8; 16];
        id.copy_from_slice(&rest[8..24]);
        let claimed = ExecutionId::from_bytes(id);
        if only.is_some_and(|only| only != claimed) {
            rest = &rest[end..];
            continue;
        }
        let payload = &rest[FRAME_HEADER_LEN..end];
        let decoded = if crc32fast::hash(&rest[8..end]) == crc {
            bincode_options()
                .with_limit(len as u64)
                .deserialize::<Frame>(payload)
                .ok()
                .filter(|frame| {
                    frame.head.execution_id == claimed
                        && frame
                            .events
                            .iter()
                            .all(|event| (first_position..=last_position).contains(&event.position))
                })
        } else {
            None
        };
        frames.push(match decoded {
            Some(frame) => DecodedFrame::Ok(Box::new(frame)),
            None => DecodedFrame::Corrupt { claimed },
        });
        rest = &rest[end..];
    }
    Ok(DecodedLogRecord {
        last_position,
        frames,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{RunId, SessionId};
    use crate::records::ExecutionKind;

    #[test]
    fn record_round_trips_and_any_flipped_byte_is_corruption() {
        let value = (42u64, String::from("hello"));
        let bytes = encode(&value);
        assert_eq!(decode::<(u64, String)>(b"\x05k", &bytes).ok(), Some(value));
        for index in 0..bytes.len() {
            let mut flipped = bytes.clone();
            flipped[index] ^= 0x40;
            match decode::<(u64, String)>(b"\x05k", &flipped) {
                Err(Error::Corrupted {
                    tree: "commands", ..
                }) => {}
                other => panic!("flip at {index} decoded as {other:?}"),
            }
        }
        assert!(decode::<u64>(b"\x05", &[]).is_err());
    }

    #[test]
    fn log_record_frames_fail_one_at_a_time() {
        let frame = |n: u64| Frame {
            head: {
                let mut head = ExecutionHead::new(
                    ExecutionId::new(),
                    SessionId::new(),
                    RunId::new(),
                    ExecutionKind::Job,
                );
                head.version = n;
                head
            },
            events: vec![],
            records: vec![],
        };
        let (first, second) = (frame(1), frame(2));
        let mut writer = LogRecordWriter::new();
        writer.push(&encode_frame(&first));
        let first_len = writer.len();
        writer.push(&encode_frame(&second));
        let mut bytes = writer.finish(7);
        let header_flipped = {
            let mut bytes = bytes.clone();
            bytes[8] ^= 0x01;
            bytes
        };
        assert!(decode_log_record(&keys::log(1), &header_flipped).is_err());
        // Flip a byte in the first frame's payload: only that frame is corrupt.
        bytes[first_len - 3] ^= 0xff;
        let record = decode_log_record(&keys::log(1), &bytes).expect("framing intact");
        assert_eq!(record.last_position, 7);
        let frames = record.frames;
        assert!(
            matches!(&frames[0], DecodedFrame::Corrupt { claimed } if *claimed == first.head.execution_id)
        );
        assert!(matches!(&frames[1], DecodedFrame::Ok(frame) if **frame == second));
        // A length running past the end is a broken record.
        bytes[LOG_HEADER_LEN] = 0xff;
        assert!(matches!(
            decode_log_record(&keys::log(1), &bytes),
            Err(Error::Corrupted { tree: "log", .. })
        ));
    }
}
