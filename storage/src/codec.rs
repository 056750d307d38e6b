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
//!          | execution id: 16 bytes | bincode(WireFrame) (4), (WireFrameV3) (2, 3), (Frame) (1) |
//! ```
//! Formats: 1 — `bincode(Frame)`, every frame with the whole head and every event in its
//! own envelope. 2 — a frame carries the head's identity (its ids, set at creation) only when
//! its transition creates or changes it, and its events without envelopes (execution, seq,
//! position, time and epoch are the frame's, as the committer writes them); an admission's
//! input of `INPUT_BLOB_BYTES_MIN` or more is a blob (S-5), listed by the frame as
//! `(event index, blob hash)` and put back by readers. 3 — the same frame in bincode's
//! variable-length integers. 4 — the attempt is part of the identity (`HeadIdentity`), so a
//! frame carries it only when it changes, and the head's last seq and last activity are the
//! frame's last event's seq and time, not written again (`frame.rs`). All four are read
//! (1–3 by `frame_v3.rs`). Records stay in record format 1 (fixed
//! integers), so that an older build still reads the schema version and refuses the store;
//! head records have their own format (`head_record.rs`).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::frame::WireFrame;
pub(crate) use crate::frame::{inputs_to_blob, Frame, HeadIdentity, StoredFrame};
use crate::frame_v3::WireFrameV3;
use crate::ids::ExecutionId;
use crate::keys;
pub(crate) use crate::record_value::RecordValue;
use crate::records::BlobHash;

/// The format version written in front of every record.
pub const RECORD_FORMAT_VERSION: u8 = 1;
/// The format version written in front of every log record (4); 1 to 3 are still read.
pub const LOG_FORMAT_VERSION: u8 = 4;
const LOG_FORMAT_V1: u8 = 1;
const LOG_FORMAT_V2: u8 = 2;
const LOG_FORMAT_V3: u8 = 3;

const CRC_LEN: usize = 4;
const FRAME_HEADER_LEN: usize = 4 + 4 + 16;
const LOG_HEADER_LEN: usize = 1 + 8 + 4;
/// Log records are cut at this size (the committer starts a new one when a frame would not
/// fit): sled writes a node bigger than a quarter segment (512 KiB with our 2 MiB segments)
/// to a separate file, and a leaf holds up to 17 values.
pub(crate) const LOG_RECORD_BYTES_MAX: usize = 16 * 1024;

/// Records, and frames of log formats 1 and 2: fixed-length integers.
pub(crate) fn bincode_options() -> impl bincode::Options + Copy {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .reject_trailing_bytes()
}

/// Frames of log formats 3 and 4 and head records of format 2: variable-length integers.
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
    encode_with(RECORD_FORMAT_VERSION, value, bincode_options())
}

/// Decodes a record read at `key`, validating its checksum and version.
pub fn decode<T: DeserializeOwned>(key: &[u8], bytes: &[u8]) -> Result<T> {
    match checked_record(key, bytes)? {
        (RECORD_FORMAT_VERSION, payload) => decode_payload(key, payload, bincode_options()),
        _ => Err(Error::corrupted(key)),
    }
}

/// The version byte and the payload of a record whose checksum holds.
pub(crate) fn checked_record<'a>(key: &[u8], bytes: &'a [u8]) -> Result<(u8, &'a [u8])> {
    if bytes.len() < 1 + CRC_LEN {
        return Err(Error::corrupted(key));
    }
    let (body, crc) = bytes.split_at(bytes.len() - CRC_LEN);
    let stored_crc = u32::from_be_bytes(crc.try_into().map_err(|_| Error::corrupted(key))?);
    if crc32fast::hash(body) != stored_crc {
        return Err(Error::corrupted(key));
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
        .map_err(|_| Error::corrupted(key))
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

/// Encodes a frame with its header, in the current format (version 4): with the head's
/// identity only if `with_identity`, and without the admission inputs `blobbed` names
/// (`inputs_to_blob`; the caller stores them). The committer writes a frame's events with
/// one execution, time and epoch and consecutive seqs and positions, at least one, and sets
/// the head's last seq and last activity from them; the format relies on it.
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
    debug_assert!(frame
        .events
        .last()
        .is_some_and(|last| { last.seq == head.last_seq && last.at_ms == head.last_activity_ms }));
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

/// A log record's header, checked (length, format, checksum, positions): its format
/// version and last position.
fn log_record_header(key: &[u8], bytes: &[u8]) -> Result<(u8, u64)> {
    if bytes.len() < LOG_HEADER_LEN
        || !matches!(
            bytes[0],
            LOG_FORMAT_V1 | LOG_FORMAT_V2 | LOG_FORMAT_V3 | LOG_FORMAT_VERSION
        )
    {
        return Err(Error::corrupted(key));
    }
    let last_position = u64::from_be_bytes([
        bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7], bytes[8],
    ]);
    let crc = u32::from_be_bytes([bytes[9], bytes[10], bytes[11], bytes[12]]);
    let first_position = keys::log_position(key).ok_or_else(|| Error::corrupted(key))?;
    if crc32fast::hash(&bytes[..9]) != crc || last_position < first_position {
        return Err(Error::corrupted(key));
    }
    Ok((bytes[0], last_position))
}

/// One frame of a log record, as its header lays it out.
struct RawFrame<'a> {
    /// The execution its header names.
    claimed: ExecutionId,
    crc: u32,
    /// What the checksum covers: the execution id, then the payload.
    checked: &'a [u8],
    /// The whole frame, its header included.
    whole: &'a [u8],
}

impl RawFrame<'_> {
    fn intact(&self) -> bool {
        crc32fast::hash(self.checked) == self.crc
    }
}

/// A log record's header (see `log_record_header`) and its frames, split by their lengths
/// without being checked or decoded; a length running past the end is an error for the
/// record.
fn raw_frames<'a>(key: &[u8], bytes: &'a [u8]) -> Result<(u8, u64, Vec<RawFrame<'a>>)> {
    let (version, last_position) = log_record_header(key, bytes)?;
    let mut frames = Vec::new();
    let mut rest = &bytes[LOG_HEADER_LEN..];
    while !rest.is_empty() {
        if rest.len() < FRAME_HEADER_LEN {
            return Err(Error::corrupted(key));
        }
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let end = FRAME_HEADER_LEN
            .checked_add(len)
            .filter(|end| *end <= rest.len())
            .ok_or_else(|| Error::corrupted(key))?;
        frames.push(RawFrame {
            claimed: keys::execution_at(rest, 8).ok_or_else(|| Error::corrupted(key))?,
            crc: u32::from_be_bytes([rest[4], rest[5], rest[6], rest[7]]),
            checked: &rest[8..end],
            whole: &rest[..end],
        });
        rest = &rest[end..];
    }
    Ok((version, last_position, frames))
}

/// The last position of a log record and the execution each of its frames claims, read
/// from the headers, each frame checked against its checksum but not decoded (S-8: the
/// log's sweep asks whose frames a record holds).
pub(crate) fn frame_owners(key: &[u8], bytes: &[u8]) -> Result<(u64, Vec<ExecutionId>)> {
    let (_, last_position, frames) = raw_frames(key, bytes)?;
    // The owner is believed only from a frame that passes its checksum.
    let owners = frames.iter().map(|frame| match frame.intact() {
        true => Ok(frame.claimed),
        false => Err(Error::corrupted(key)),
    });
    Ok((last_position, owners.collect::<Result<_>>()?))
}

/// The log record without the frames whose execution `keep` refuses (S-8: a record copied
/// forward leaves its purged executions' frames behind), and how many frames it kept. A
/// frame that fails its checksum is kept: its owner is not known.
pub(crate) fn retain_frames(
    key: &[u8],
    bytes: &[u8],
    mut keep: impl FnMut(ExecutionId) -> Result<bool>,
) -> Result<(Vec<u8>, usize)> {
    let (_, _, frames) = raw_frames(key, bytes)?;
    let mut kept = bytes[..LOG_HEADER_LEN].to_vec();
    let mut count = 0;
    for frame in frames {
        if !frame.intact() || keep(frame.claimed)? {
            kept.extend_from_slice(frame.whole);
            count += 1;
        }
    }
    Ok((kept, count))
}

/// Like `decode_log_record`, but decodes only the frames whose header names `only`; the
/// others are skipped by their length without being decoded.
pub(crate) fn decode_frames(
    key: &[u8],
    bytes: &[u8],
    only: Option<ExecutionId>,
) -> Result<DecodedLogRecord> {
    let (version, last_position, raw) = raw_frames(key, bytes)?;
    let first_position = keys::log_position(key).ok_or_else(|| Error::corrupted(key))?;
    let frames = raw
        .into_iter()
        .filter(|frame| only.is_none_or(|only| only == frame.claimed))
        .map(|frame| {
            let claimed = frame.claimed;
            let payload = &frame.checked[16..];
            let from_v3 = |wire: WireFrameV3| StoredFrame::from_v3(claimed, wire);
            let decoded = match version {
                _ if !frame.intact() => None,
                LOG_FORMAT_V1 => decode_payload::<Frame>(key, payload, bincode_options())
                    .ok()
                    .map(StoredFrame::from_v1),
                LOG_FORMAT_V2 => decode_payload(key, payload, bincode_options())
                    .ok()
                    .map(from_v3),
                LOG_FORMAT_V3 => decode_payload(key, payload, frame_options())
                    .ok()
                    .map(from_v3),
                // Every frame has an event; format 4 takes its head's last seq from them.
                _ => decode_payload(key, payload, frame_options())
                    .ok()
                    .map(|wire: WireFrame| StoredFrame::from_wire(claimed, wire))
                    .filter(|frame| !frame.events.is_empty()),
            };
            let owned = |frame: &StoredFrame| {
                frame.execution_id == claimed
                    && frame
                        .identity
                        .is_none_or(|identity| identity.execution_id == claimed)
                    && frame.events.iter().all(|event| {
                        event.execution_id == claimed
                            && (first_position..=last_position).contains(&event.position)
                    })
            };
            match decoded.filter(owned) {
                Some(frame) => DecodedFrame::Ok(Box::new(frame)),
                None => DecodedFrame::Corrupt { claimed },
            }
        })
        .collect();
    Ok(DecodedLogRecord {
        last_position,
        frames,
    })
}

#[cfg(test)]
#[path = "codec_tests.rs"]
mod tests;
