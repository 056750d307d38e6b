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
//!          | execution id: 16 bytes | bincode(WireFrame) (formats 2, 3), bincode(Frame) (1) |
//! ```
//! Format changelog: version 1 — the initial format (`bincode(Frame)`: every frame with the
//! whole head, every event in its own envelope). Version 2 — a frame carries the head's
//! identity (ids, kind, parent: `HeadIdentity`) only when its transition creates the
//! execution or changes it, and its events without envelopes: execution, seq, position,
//! time and epoch are the frame's, as the committer writes them; an admission's input of
//! `INPUT_BLOB_BYTES_MIN` or more is a blob (S-5), its event stored with an empty input and
//! the frame listing `(event index, blob hash)`, and readers put it back. ~30% fewer bytes
//! per transition, which sled writes about 3.4 times over. Version 3 — the same frame in
//! bincode's variable-length integer encoding: an enum tag, a length or a small number takes
//! one byte instead of four or eight. ~21% fewer bytes per transition again (1,000 × 50
//! load: 40.0 MB of log records against 50.6 MB). Versions 1 and 2 are still read. Records
//! (receipts, index chunks…) stay in record format 1, fixed-length integers: the stored
//! schema version is one, and an older build must still read it to refuse the store. Head
//! records have their own format 2 since schema 5 (`head_record.rs`).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::frame::WireFrame;
pub(crate) use crate::frame::{inputs_to_blob, Frame, HeadIdentity, StoredFrame};
use crate::ids::ExecutionId;
use crate::keys;
use crate::records::{BlobHash, CommandRecord, ProcessRecord, ReceiptRecord, WaitRecord};

/// The format version written in front of every record.
pub const RECORD_FORMAT_VERSION: u8 = 1;
/// The format version written in front of every log record (3); 1 and 2 are still read.
pub const LOG_FORMAT_VERSION: u8 = 3;
const LOG_FORMAT_V1: u8 = 1;
const LOG_FORMAT_V2: u8 = 2;
/// An admission input this large is stored as a blob, once however many executions share
/// it, and referenced from its event (S-5).
pub(crate) const INPUT_BLOB_BYTES_MIN: usize = 1024;

const CRC_LEN: usize = 4;
const FRAME_HEADER_LEN: usize = 4 + 4 + 16;
const LOG_HEADER_LEN: usize = 1 + 8 + 4;
/// Log records are cut at this size (the committer starts a new one when a frame would not
/// fit): sled writes a node bigger than a quarter segment (512 KiB with our 2 MiB segments)
/// to a separate file, and a leaf holds up to 17 values. Measured: 64 KiB records in 8 MiB
/// segments gave a worse p99 for the same throughput.
pub(crate) const LOG_RECORD_BYTES_MAX: usize = 16 * 1024;

/// Records, and frames of log formats 1 and 2: fixed-length integers.
pub(crate) fn bincode_options() -> impl bincode::Options + Copy {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .reject_trailing_bytes()
}

/// Frames of log format 3 and head records of format 2: variable-length integers.
pub(crate) fn frame_options() -> impl bincode::Options + Copy {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_varint_encoding()
        .reject_trailing_bytes()
}

/// `encode` reserves at most this much up front; a larger record grows as it is written.
const RECORD_PRESIZE_MAX: u64 = 1 << 20;

/// Encodes a record. Serializing our own types into memory cannot fail; if it ever did, it
/// would be a programming error worth stopping for.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    // Sized up front: growing from empty reallocated a head ~7 times while it was encoded.
    encode_with(RECORD_FORMAT_VERSION, value, bincode_options())
}

/// Decodes a record read at `key`, validating its checksum and version.
pub fn decode<T: DeserializeOwned>(key: &[u8], bytes: &[u8]) -> Result<T> {
    match checked_record(key, bytes)? {
        (RECORD_FORMAT_VERSION, payload) => decode_payload(key, payload, bincode_options()),
        _ => Err(corrupted(key)),
    }
}

/// The version byte and the payload of a record whose checksum holds.
pub(crate) fn checked_record<'a>(key: &[u8], bytes: &'a [u8]) -> Result<(u8, &'a [u8])> {
    if bytes.len() < 1 + CRC_LEN {
        return Err(corrupted(key));
    }
    let (body, crc) = bytes.split_at(bytes.len() - CRC_LEN);
    let stored_crc = u32::from_be_bytes(crc.try_into().map_err(|_| corrupted(key))?);
    if crc32fast::hash(body) != stored_crc {
        return Err(corrupted(key));
    }
    Ok((body[0], &body[1..]))
}

/// Decodes a record's payload with `options`.
pub(crate) fn decode_payload<T: DeserializeOwned>(
    key: &[u8],
    payload: &[u8],
    options: impl bincode::Options,
) -> Result<T> {
    use bincode::Options;
    // The limit bounds what a hostile length prefix can make the decoder read.
    options
        .with_limit(payload.len() as u64)
        .deserialize(payload)
        .map_err(|_| corrupted(key))
}

/// Encodes a record of format `version` with `options`.
pub(crate) fn encode_with<T: Serialize>(
    version: u8,
    value: &T,
    options: impl bincode::Options + Copy,
) -> Vec<u8> {
    let hint = options
        .serialized_size(value)
        .unwrap_or(0)
        .min(RECORD_PRESIZE_MAX) as usize;
    let mut bytes = Vec::with_capacity(hint + 1 + CRC_LEN);
    bytes.push(version);
    options
        .serialize_into(&mut bytes, value)
        .expect("invariant: our record types serialize into memory");
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_be_bytes());
    bytes
}

fn corrupted(key: &[u8]) -> Error {
    Error::Corrupted {
        tree: keys::tree_name(key),
        key: keys::display(key),
    }
}

/// A record upsert carried by a transition and replayed from the log.
///
/// Stored by variant index (`WireRecord`): a command record is written as index 4 since
/// schema 6 (it gained `reason_code`); index 0, the command record before that, is still
/// read. Append new indexes, never reuse one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RecordValue {
    Command(CommandRecord),
    Receipt(ReceiptRecord),
    Wait(WaitRecord),
    Process(ProcessRecord),
}

/// The command record as schemas 1..=5 wrote it (no `reason_code`).
#[derive(Deserialize)]
struct CommandRecordV1 {
    command_id: crate::ids::CommandId,
    execution_id: ExecutionId,
    kind: String,
    payload_hash: [u8; 32],
    status: crate::records::CommandStatus,
    reason: Option<String>,
    result_version: Option<u64>,
    child_execution_id: Option<ExecutionId>,
    accepted_at_ms: u64,
}

/// What `RecordValue` is stored as, read back (indexes are the stored variant numbers).
#[derive(Deserialize)]
enum WireRecord {
    CommandV1(CommandRecordV1),
    Receipt(ReceiptRecord),
    Wait(WaitRecord),
    Process(ProcessRecord),
    Command(CommandRecord),
}

/// What `RecordValue` is stored as, written (the same indexes; index 0 is never written).
#[derive(Serialize)]
enum WireRecordRef<'a> {
    #[allow(dead_code)]
    CommandV1(()),
    Receipt(&'a ReceiptRecord),
    Wait(&'a WaitRecord),
    Process(&'a ProcessRecord),
    Command(&'a CommandRecord),
}

impl Serialize for RecordValue {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        match self {
            RecordValue::Command(record) => WireRecordRef::Command(record),
            RecordValue::Receipt(record) => WireRecordRef::Receipt(record),
            RecordValue::Wait(record) => WireRecordRef::Wait(record),
            RecordValue::Process(record) => WireRecordRef::Process(record),
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RecordValue {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        Ok(match WireRecord::deserialize(deserializer)? {
            WireRecord::CommandV1(old) => RecordValue::Command(CommandRecord {
                command_id: old.command_id,
                execution_id: old.execution_id,
                kind: old.kind,
                payload_hash: old.payload_hash,
                status: old.status,
                reason: old.reason,
                reason_code: None,
                result_version: old.result_version,
                child_execution_id: old.child_execution_id,
                accepted_at_ms: old.accepted_at_ms,
            }),
            WireRecord::Receipt(record) => RecordValue::Receipt(record),
            WireRecord::Wait(record) => RecordValue::Wait(record),
            WireRecord::Process(record) => RecordValue::Process(record),
            WireRecord::Command(record) => RecordValue::Command(record),
        })
    }
}

/// Builds one log record frame by frame.
#[derive(Debug)]
pub(crate) struct LogRecordWriter {
    bytes: Vec<u8>,
}

impl LogRecordWriter {
    pub fn new() -> Self {
        // A record is cut at `LOG_RECORD_BYTES_MAX`; only a single larger frame outgrows this.
        let mut bytes = Vec::with_capacity(LOG_HEADER_LEN + LOG_RECORD_BYTES_MAX);
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

/// Encodes a frame with its header, in the current format (version 3): with the head's
/// identity only if `with_identity`, and without the admission inputs `blobbed` names
/// (`inputs_to_blob`; the caller stores them). The committer writes a frame's events with
/// one execution, time and epoch and consecutive seqs and positions; the format relies on it.
#[cfg(test)]
pub(crate) fn encode_frame(
    frame: &Frame,
    with_identity: bool,
    blobbed: &[(u32, BlobHash)],
) -> Vec<u8> {
    let mut bytes = Vec::new();
    encode_frame_into(&mut bytes, frame, with_identity, blobbed);
    bytes
}

/// `encode_frame` into `bytes`, which it clears first: the committer encodes every frame
/// into one buffer, so encoding does not allocate once the buffer has grown.
pub(crate) fn encode_frame_into(
    bytes: &mut Vec<u8>,
    frame: &Frame,
    with_identity: bool,
    blobbed: &[(u32, BlobHash)],
) {
    use bincode::Options;
    let head = &frame.head;
    let first = frame.events.first();
    debug_assert!(frame.events.iter().zip(0u64..).all(|(event, index)| {
        first.is_some_and(|first| {
            event.execution_id == head.execution_id
                && event.seq == first.seq + index
                && event.position == first.position + index
                && event.at_ms == first.at_ms
                && event.writer_epoch == first.writer_epoch
        })
    }));
    let wire = crate::frame::wire(frame, with_identity, blobbed);
    bytes.clear();
    bytes.resize(FRAME_HEADER_LEN, 0);
    bytes[8..24].copy_from_slice(head.execution_id.as_bytes());
    frame_options()
        .serialize_into(&mut *bytes, &wire)
        .expect("invariant: frames serialize into memory");
    // A frame over 4 GiB gets a wrong length here, and the size limit (at most 4 GiB,
    // `log.rs`) refuses it before it is written.
    let len = u32::try_from(bytes.len() - FRAME_HEADER_LEN).unwrap_or(u32::MAX);
    let crc = crc32fast::hash(&bytes[8..]);
    bytes[0..4].copy_from_slice(&len.to_be_bytes());
    bytes[4..8].copy_from_slice(&crc.to_be_bytes());
}

/// One frame read back from a log record.
#[derive(Debug)]
pub(crate) enum DecodedFrame {
    Ok(Box<StoredFrame>),
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
    if bytes.len() < LOG_HEADER_LEN
        || !matches!(bytes[0], LOG_FORMAT_V1 | LOG_FORMAT_V2 | LOG_FORMAT_VERSION)
    {
        return Err(corrupted());
    }
    let version = bytes[0];
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
            // The limit bounds what a hostile length prefix can make the decoder read.
            let limit = len as u64;
            let from_wire =
                |wire: Option<WireFrame>| wire.map(|wire| StoredFrame::from_wire(claimed, wire));
            match version {
                LOG_FORMAT_V1 => bincode_options()
                    .with_limit(limit)
                    .deserialize::<Frame>(payload)
                    .ok()
                    .map(StoredFrame::from_v1),
                LOG_FORMAT_V2 => from_wire(
                    bincode_options()
                        .with_limit(limit)
                        .deserialize(payload)
                        .ok(),
                ),
                _ => from_wire(frame_options().with_limit(limit).deserialize(payload).ok()),
            }
            .filter(|frame| {
                frame.execution_id == claimed
                    && frame
                        .identity
                        .map_or(true, |identity| identity.execution_id == claimed)
                    && frame.events.iter().all(|event| {
                        event.execution_id == claimed
                            && (first_position..=last_position).contains(&event.position)
                    })
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
    use crate::event::{Event, EventEnvelope};
    use crate::ids::{RunId, SessionId};
    use crate::records::{ExecutionHead, ExecutionKind};

    /// R16: every decoder of bytes from disk refuses random and mutated input with an
    /// error, never a panic or an unbounded allocation. Records and head records get their
    /// checksum made valid on purpose, so the decoding behind it runs; a mutated log record
    /// keeps its broken checksums (its framing checks run first). Seeded (`OP_FUZZ_SEED`,
    /// `OP_FUZZ_CASES`).
    #[test]
    fn r16_decoders_refuse_random_and_mutated_bytes_without_a_panic() {
        use rand::{Rng, SeedableRng};
        let seed: u64 = std::env::var("OP_FUZZ_SEED")
            .ok()
            .and_then(|seed| seed.parse().ok())
            .unwrap_or_else(|| rand::thread_rng().gen());
        let cases: usize = std::env::var("OP_FUZZ_CASES")
            .ok()
            .and_then(|cases| cases.parse().ok())
            .unwrap_or(3000);
        eprintln!("r16 decoders: seed {seed} (replay with OP_FUZZ_SEED={seed}), {cases} cases");
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        // Valid encodings to mutate: a command record, a head record, a log record.
        let head = ExecutionHead::new(
            ExecutionId::new(),
            SessionId::new(),
            RunId::new(),
            ExecutionKind::AgentTurn,
        );
        let record = encode(&RecordValue::Command(CommandRecord {
            command_id: crate::ids::CommandId::new(),
            execution_id: head.execution_id,
            kind: "steer".into(),
            payload_hash: [1; 32],
            status: crate::records::CommandStatus::Rejected,
            reason: Some("why".into()),
            reason_code: Some("not_available".into()),
            result_version: Some(2),
            child_execution_id: None,
            accepted_at_ms: 3,
        }));
        let head_record =
            crate::head_record::encode(&head, &crate::head_record::HeadIndex::default());
        let mut writer = LogRecordWriter::new();
        let frame = Frame {
            head: head.clone(),
            events: vec![EventEnvelope {
                execution_id: head.execution_id,
                seq: 1,
                position: 1,
                at_ms: 1,
                writer_epoch: 0,
                event: Event::Replied { text: "hi".into() },
            }],
            records: Vec::new(),
        };
        let mut frame_bytes = Vec::new();
        encode_frame_into(&mut frame_bytes, &frame, true, &[]);
        writer.push(&frame_bytes);
        let log_record = writer.finish(1);
        let with_crc = |mut body: Vec<u8>| {
            let crc = crc32fast::hash(&body);
            body.extend_from_slice(&crc.to_be_bytes());
            body
        };
        for case in 0..cases {
            let mut bytes = match case % 4 {
                // Random bytes behind a valid version byte and checksum.
                0 => {
                    let len = rng.gen_range(0..512);
                    let mut body = vec![RECORD_FORMAT_VERSION];
                    body.extend((0..len).map(|_| rng.gen::<u8>()));
                    with_crc(body)
                }
                1 => record.clone(),
                2 => head_record.clone(),
                _ => log_record.clone(),
            };
            // Mutations: flips, a cut, a length field made huge; then the checksum fixed.
            if case % 4 != 0 && !bytes.is_empty() {
                for _ in 0..rng.gen_range(1..6) {
                    let at = rng.gen_range(0..bytes.len());
                    bytes[at] = rng.gen();
                }
                if rng.gen_bool(0.3) {
                    bytes.truncate(rng.gen_range(0..bytes.len()));
                }
                if case % 4 != 3 && bytes.len() > 4 {
                    let body = bytes[..bytes.len() - 4].to_vec();
                    bytes = with_crc(body);
                }
            }
            let _ = decode::<RecordValue>(b"\x05k", &bytes);
            let _ = crate::head_record::decode(b"\x03k", &bytes);
            let _ = decode_log_record(&crate::keys::log(1), &bytes);
        }
    }

    /// S-1: a command record as schemas 1..=5 stored it (variant 0, no `reason_code`) is
    /// still read; a new one is written as variant 4 and read back whole.
    #[test]
    fn s1_command_records_of_schema_5_are_still_read() {
        use crate::ids::CommandId;
        use crate::records::CommandStatus;
        #[derive(Serialize)]
        enum Old {
            Command {
                command_id: CommandId,
                execution_id: ExecutionId,
                kind: String,
                payload_hash: [u8; 32],
                status: CommandStatus,
                reason: Option<String>,
                result_version: Option<u64>,
                child_execution_id: Option<ExecutionId>,
                accepted_at_ms: u64,
            },
        }
        let record = CommandRecord {
            command_id: CommandId::new(),
            execution_id: ExecutionId::new(),
            kind: "pause".into(),
            payload_hash: [3; 32],
            status: CommandStatus::Rejected,
            reason: Some("no".into()),
            reason_code: None,
            result_version: Some(4),
            child_execution_id: None,
            accepted_at_ms: 9,
        };
        let old = encode(&Old::Command {
            command_id: record.command_id,
            execution_id: record.execution_id,
            kind: record.kind.clone(),
            payload_hash: record.payload_hash,
            status: record.status,
            reason: record.reason.clone(),
            result_version: record.result_version,
            child_execution_id: record.child_execution_id,
            accepted_at_ms: record.accepted_at_ms,
        });
        let read: RecordValue = decode(b"\x05k", &old).expect("an old command record");
        assert_eq!(read, RecordValue::Command(record.clone()));
        let new = RecordValue::Command(CommandRecord {
            reason_code: Some("not_available".into()),
            ..record
        });
        let bytes = encode(&new);
        assert_eq!(bytes[1..5], 4u32.to_le_bytes(), "variant 4");
        assert_eq!(decode::<RecordValue>(b"\x05k", &bytes).ok(), Some(new));
    }

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
        writer.push(&encode_frame(&first, true, &[]));
        let first_len = writer.len();
        writer.push(&encode_frame(&second, true, &[]));
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
        assert!(
            matches!(&frames[1], DecodedFrame::Ok(frame) if frame.clone().complete(None) == Some(second))
        );
        // A length running past the end is a broken record.
        bytes[LOG_HEADER_LEN] = 0xff;
        assert!(matches!(
            decode_log_record(&keys::log(1), &bytes),
            Err(Error::Corrupted { tree: "log", .. })
        ));
    }

    /// A frame as the committer builds it: `n` events from seq 5, position 40.
    fn frame_with_events(n: u64) -> Frame {
        let mut head = ExecutionHead::new(
            ExecutionId::new(),
            SessionId::new(),
            RunId::new(),
            ExecutionKind::AgentTurn,
        );
        head.version = 3;
        head.last_seq = 4 + n;
        head.pause_reason = Some("step".into());
        let events = (0..n)
            .map(|index| EventEnvelope {
                execution_id: head.execution_id,
                seq: 5 + index,
                position: 40 + index,
                at_ms: 1_700,
                writer_epoch: 2,
                event: Event::CheckpointPublished {
                    checkpoint_seq: 5 + index,
                },
            })
            .collect();
        Frame {
            head,
            events,
            records: vec![],
        }
    }

    fn decode_one(version: u8, frame_bytes: &[u8]) -> StoredFrame {
        match decode_one_frame(version, frame_bytes) {
            DecodedFrame::Ok(frame) => *frame,
            corrupt => panic!("expected a readable frame, got {corrupt:?}"),
        }
    }

    /// `frame_bytes` as the one frame of a log record of format `version`, read back.
    fn decode_one_frame(version: u8, frame_bytes: &[u8]) -> DecodedFrame {
        let mut writer = LogRecordWriter::new();
        writer.push(frame_bytes);
        let mut bytes = writer.finish(60);
        bytes[0] = version;
        let crc = crc32fast::hash(&bytes[..9]);
        bytes[9..LOG_HEADER_LEN].copy_from_slice(&crc.to_be_bytes());
        let mut frames = decode_log_record(&keys::log(40), &bytes)
            .expect("framing intact")
            .frames;
        assert_eq!(frames.len(), 1);
        frames.pop().expect("one frame")
    }

    #[test]
    fn s2_a_frame_without_its_identity_is_completed_from_the_previous_head() {
        let frame = frame_with_events(3);
        let identity = HeadIdentity::of(&frame.head);
        let with = encode_frame(&frame, true, &[]);
        let without = encode_frame(&frame, false, &[]);
        assert!(
            without.len() + 100 < with.len(),
            "{} vs {}",
            without.len(),
            with.len()
        );
        assert_eq!(
            decode_one(LOG_FORMAT_VERSION, &with).complete(None),
            Some(frame.clone())
        );
        let stored = decode_one(LOG_FORMAT_VERSION, &without);
        assert_eq!(stored.events, frame.events);
        assert_eq!(
            stored.clone().complete(None),
            None,
            "no identity to complete it with"
        );
        let other = HeadIdentity::of(&frame_with_events(1).head);
        assert_eq!(
            stored.clone().complete(Some(other)),
            None,
            "another execution's"
        );
        assert_eq!(stored.complete(Some(identity)), Some(frame));
    }

    /// A frame with fixed ids, so its version 1 bytes can be a fixture.
    fn fixed_frame() -> Frame {
        use crate::ids::{MessageId, RevisionId, TurnId};
        let mut frame = frame_with_events(2);
        let id = ExecutionId::from_bytes([1; 16]);
        let head = &mut frame.head;
        head.execution_id = id;
        head.session_id = SessionId::from_bytes([2; 16]);
        head.run_id = RunId::from_bytes([3; 16]);
        head.revision_id = RevisionId::from_bytes([4; 16]);
        head.turn_id = TurnId::from_bytes([5; 16]);
        head.user_message_id = MessageId::from_bytes([6; 16]);
        head.reply_message_id = MessageId::from_bytes([7; 16]);
        for event in &mut frame.events {
            event.execution_id = id;
        }
        frame
    }

    /// `fixed_frame()` as log format 1 wrote it (`bincode(Frame)` with its frame header),
    /// recorded from the format 1 encoder (commit 4ac7142's `encode_frame`).
    const V1_FIXTURE_HEX: &str = concat!(
        "000001315fdc50d6010101010101010101010101010101010101010101010101010101010101010102020202",
        "0202020202020202020202020303030303030303030303030303030300000000000404040404040404040404",
        "0404040404050505050505050505050505050505050606060606060606060606060606060607070707070707",
        "0707070707070707070000000001040000000000000073746570030000000000000006000000000000000000",
        "0000000000000000000000000000000000020000000000000001010101010101010101010101010101050000",
        "00000000002800000000000000a40600000000000002000000000000000a0000000500000000000000010101",
        "0101010101010101010101010106000000000000002900000000000000a40600000000000002000000000000",
        "000a00000006000000000000000000000000000000",
    );

    /// `fixed_frame()` as log format 2 wrote it, with and without the head's identity,
    /// recorded from the format 2 encoder (commit 5724873's `encode_frame`).
    const V2_FIXTURE_HEX: &str = concat!(
        "000000fa0a712d0d010101010101010101010101010101010101010101010101010101010101010101020202",
        "0202020202020202020202020203030303030303030303030303030303000000000004040404040404040404",
        "0404040404040505050505050505050505050505050506060606060606060606060606060606070707070707",
        "0707070707070707070700000000010400000000000000737465700300000000000000060000000000000000",
        "00000000000000000000000000000000000005000000000000002800000000000000a4060000000000000200",
        "00000000000002000000000000000a00000005000000000000000a0000000600000000000000000000000000",
        "00000000000000000000",
    );
    const V2_FIXTURE_WITHOUT_IDENTITY_HEX: &str = concat!(
        "000000850a6d9002010101010101010101010101010101010000000000010400000000000000737465700300",
        "0000000000000600000000000000000000000000000000000000000000000000000500000000000000280000",
        "0000000000a406000000000000020000000000000002000000000000000a00000005000000000000000a0000",
        "00060000000000000000000000000000000000000000000000",
    );

    fn from_hex(hex: &str) -> Vec<u8> {
        (0..hex.len())
            .step_by(2)
            .map(|at| u8::from_str_radix(&hex[at..at + 2], 16).expect("hex"))
            .collect()
    }

    #[test]
    fn s6_a_version_2_log_record_still_decodes() {
        let frame = fixed_frame();
        let identity = HeadIdentity::of(&frame.head);
        let with = decode_one(LOG_FORMAT_V2, &from_hex(V2_FIXTURE_HEX));
        assert_eq!(with.complete(None), Some(frame.clone()));
        let without = decode_one(LOG_FORMAT_V2, &from_hex(V2_FIXTURE_WITHOUT_IDENTITY_HEX));
        assert_eq!(without.complete(Some(identity)), Some(frame));
    }

    #[test]
    fn s6_format_3_writes_the_same_frame_in_fewer_bytes_and_reads_it_back() {
        let frame = fixed_frame();
        for (with_identity, v2_hex) in [
            (true, V2_FIXTURE_HEX),
            (false, V2_FIXTURE_WITHOUT_IDENTITY_HEX),
        ] {
            let v3 = encode_frame(&frame, with_identity, &[]);
            let v2_len = v2_hex.len() / 2;
            assert!(v3.len() < v2_len, "{} bytes, format 2 {v2_len}", v3.len());
            let stored = decode_one(LOG_FORMAT_VERSION, &v3);
            let identity = (!with_identity).then(|| HeadIdentity::of(&frame.head));
            assert_eq!(stored.complete(identity), Some(frame.clone()));
            // Read as format 2, the same bytes are not that frame: the version byte decides.
            match decode_one_frame(LOG_FORMAT_V2, &v3) {
                DecodedFrame::Corrupt { claimed } => assert_eq!(claimed, frame.head.execution_id),
                DecodedFrame::Ok(misread) => {
                    assert_ne!(misread.complete(identity), Some(frame.clone()))
                }
            }
        }
        // Numbers of every varint width, as real clocks and long histories give them.
        let mut large = fixed_frame();
        large.head.last_activity_ms = 1_764_000_000_000;
        large.head.fencing_epoch = u64::MAX;
        large.head.version = u64::from(u32::MAX) + 1;
        for event in &mut large.events {
            event.at_ms = 1_764_000_000_000;
            event.writer_epoch = u64::MAX;
        }
        let stored = decode_one(LOG_FORMAT_VERSION, &encode_frame(&large, true, &[]));
        assert_eq!(stored.complete(None), Some(large));
    }

    #[test]
    fn s6_a_version_1_log_record_still_decodes() {
        let stored = decode_one(LOG_FORMAT_V1, &from_hex(V1_FIXTURE_HEX));
        assert_eq!(stored.complete(None), Some(fixed_frame()));
    }
}
