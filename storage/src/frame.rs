//! What a log frame holds (codec.rs frames it): one committed transition's head, events and
//! records in memory (`Frame`), as log formats 2 and 3 write them (a prefix only the committer
//! knows, `WirePrefixRef`, then the tail the submitting thread encodes, `FrameTail`; read back
//! as one `WireFrame`), and as read back (`StoredFrame`, whose head is completed with its
//! identity and whose blob-stored admission inputs are put back by the reader).

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::codec::{RecordValue, INPUT_BLOB_BYTES_MIN};
use crate::error::Result;
use crate::event::{Event, EventEnvelope};
use crate::ids::{ExecutionId, MessageId, RevisionId, RunId, SessionId, TurnId};
use crate::records::{
    AttemptLease, BlobHash, Checkpoint, ExecutionHead, ExecutionKind, ExecutionState, RestartIntent,
};

/// What the log keeps of one committed transition: enough to rebuild the head, the events
/// and the records without reading anything else.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Frame {
    pub head: ExecutionHead,
    pub events: Vec<EventEnvelope>,
    pub records: Vec<RecordValue>,
}

/// The fields of a head set when its execution is created (a writer may replace them; the
/// frame that does carries them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HeadIdentity {
    pub execution_id: ExecutionId,
    session_id: SessionId,
    run_id: RunId,
    parent_execution_id: Option<ExecutionId>,
    kind: ExecutionKind,
    revision_id: RevisionId,
    turn_id: TurnId,
    user_message_id: MessageId,
    reply_message_id: MessageId,
}

impl HeadIdentity {
    pub fn of(head: &ExecutionHead) -> Self {
        Self {
            execution_id: head.execution_id,
            session_id: head.session_id,
            run_id: head.run_id,
            parent_execution_id: head.parent_execution_id,
            kind: head.kind,
            revision_id: head.revision_id,
            turn_id: head.turn_id,
            user_message_id: head.user_message_id,
            reply_message_id: head.reply_message_id,
        }
    }
}

/// The rest of a head, as a version 2 or 3 frame writes it (`HeadState` reads it back: the same
/// fields in the same order).
#[derive(Serialize)]
pub(crate) struct HeadStateRef<'a> {
    state: ExecutionState,
    pause_reason: &'a Option<String>,
    version: u64,
    last_seq: u64,
    fencing_epoch: u64,
    attempt: &'a Option<AttemptLease>,
    checkpoint: &'a Option<Checkpoint>,
    restart_intent: &'a Option<RestartIntent>,
    last_activity_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub(crate) struct HeadState {
    state: ExecutionState,
    pause_reason: Option<String>,
    version: u64,
    last_seq: u64,
    fencing_epoch: u64,
    attempt: Option<AttemptLease>,
    checkpoint: Option<Checkpoint>,
    restart_intent: Option<RestartIntent>,
    last_activity_ms: u64,
}

/// A version 2 or 3 frame as written (`WireFrame` reads it back; the two differ only in
/// bincode's integer encoding, `codec.rs`): its prefix, then its tail. bincode writes a
/// struct's fields one after the other with nothing between them, so the nesting is not on
/// disk: `WireFrame` reads the same fields flat. The committer writes the two halves apart
/// (`codec::encode_frame_prefix_into`, `FrameTail`); tests write them whole.
#[cfg(test)]
#[derive(Serialize)]
pub(crate) struct WireFrameRef<'a> {
    prefix: WirePrefixRef<'a>,
    tail: WireTailRef<'a>,
}

/// What only the committer knows: the head it writes and where the events go.
#[derive(Serialize)]
pub(crate) struct WirePrefixRef<'a> {
    identity: Option<HeadIdentity>,
    head: HeadStateRef<'a>,
    first_seq: u64,
    first_position: u64,
    at_ms: u64,
    writer_epoch: u64,
}

/// What the writer brings: its events, the admission inputs among them stored as blobs, and
/// its records (`FrameTail`).
#[derive(Serialize)]
struct WireTailRef<'a> {
    events: Vec<Cow<'a, Event>>,
    blobbed: &'a [(u32, BlobHash)],
    records: &'a [RecordValue],
}

#[derive(Deserialize)]
pub(crate) struct WireFrame {
    identity: Option<HeadIdentity>,
    head: HeadState,
    first_seq: u64,
    first_position: u64,
    at_ms: u64,
    writer_epoch: u64,
    events: Vec<Event>,
    blobbed: Vec<(u32, BlobHash)>,
    records: Vec<RecordValue>,
}

/// A frame read back from the log. Its head is whole once `complete` has the identity:
/// from the frame itself (the creating transition, one that changed it, every version 1
/// frame), else from the execution's head before the frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredFrame {
    pub execution_id: ExecutionId,
    pub(crate) identity: Option<HeadIdentity>,
    head: HeadState,
    pub events: Vec<EventEnvelope>,
    /// Events stored without their admission input: (index in `events`, the input's blob).
    blobbed: Vec<(u32, BlobHash)>,
    pub records: Vec<RecordValue>,
}

impl StoredFrame {
    /// Puts back the admission inputs stored as blobs, read with `blob`. `false` if one is
    /// missing, is not UTF-8 or names an event that is not an admission: the frame is
    /// corrupted.
    pub fn resolve_blobs(
        &mut self,
        mut blob: impl FnMut(BlobHash) -> Result<Option<Vec<u8>>>,
    ) -> Result<bool> {
        for (index, hash) in std::mem::take(&mut self.blobbed) {
            let Some(bytes) = blob(hash)? else {
                return Ok(false);
            };
            let Ok(text) = String::from_utf8(bytes) else {
                return Ok(false);
            };
            match self
                .events
                .get_mut(index as usize)
                .map(|envelope| &mut envelope.event)
            {
                Some(Event::Admitted { input, .. }) => *input = text,
                _ => return Ok(false),
            }
        }
        Ok(true)
    }

    /// The frame with its whole head; `None` if it carries no identity and `previous` (the
    /// identity of the execution's head before it) is unknown or names another execution.
    pub fn complete(self, previous: Option<HeadIdentity>) -> Option<Frame> {
        let identity = self
            .identity
            .or(previous)
            .filter(|identity| identity.execution_id == self.execution_id)?;
        let HeadState {
            state,
            pause_reason,
            version,
            last_seq,
            fencing_epoch,
            attempt,
            checkpoint,
            restart_intent,
            last_activity_ms,
        } = self.head;
        let head = ExecutionHead {
            execution_id: identity.execution_id,
            session_id: identity.session_id,
            run_id: identity.run_id,
            parent_execution_id: identity.parent_execution_id,
            kind: identity.kind,
            revision_id: identity.revision_id,
            turn_id: identity.turn_id,
            user_message_id: identity.user_message_id,
            reply_message_id: identity.reply_message_id,
            state,
            pause_reason,
            version,
            last_seq,
            fencing_epoch,
            attempt,
            checkpoint,
            restart_intent,
            last_activity_ms,
        };
        Some(Frame {
            head,
            events: self.events,
            records: self.records,
        })
    }

    pub(crate) fn from_v1(frame: Frame) -> Self {
        let head = frame.head;
        Self {
            execution_id: head.execution_id,
            identity: Some(HeadIdentity::of(&head)),
            head: HeadState {
                state: head.state,
                pause_reason: head.pause_reason,
                version: head.version,
                last_seq: head.last_seq,
                fencing_epoch: head.fencing_epoch,
                attempt: head.attempt,
                checkpoint: head.checkpoint,
                restart_intent: head.restart_intent,
                last_activity_ms: head.last_activity_ms,
            },
            events: frame.events,
            blobbed: Vec::new(),
            records: frame.records,
        }
    }

    pub(crate) fn from_wire(execution_id: ExecutionId, wire: WireFrame) -> Self {
        let WireFrame {
            identity,
            head,
            first_seq,
            first_position,
            at_ms,
            writer_epoch,
            events,
            blobbed,
            records,
        } = wire;
        let events = events
            .into_iter()
            .zip(0u64..)
            .map(|(event, index)| EventEnvelope {
                execution_id,
                seq: first_seq.saturating_add(index),
                position: first_position.saturating_add(index),
                at_ms,
                writer_epoch,
                event,
            })
            .collect();
        Self {
            execution_id,
            identity,
            head,
            events,
            blobbed,
            records,
        }
    }
}

/// The admission inputs among `events` to store as blobs: (event index, hash).
fn inputs_to_blob<'a>(events: impl IntoIterator<Item = &'a Event>) -> Vec<(u32, BlobHash)> {
    events
        .into_iter()
        .zip(0u32..)
        .filter_map(|(event, index)| match event {
            Event::Admitted { input, .. } if input.len() >= INPUT_BLOB_BYTES_MIN => {
                Some((index, BlobHash::of(input.as_bytes())))
            }
            _ => None,
        })
        .collect()
}

/// The tail of a frame, encoded by the thread that submits its transition: its events
/// (admission inputs of `INPUT_BLOB_BYTES_MIN` or more left out, stored as blobs), the blobs
/// they went to, and its records. The committer writes only the prefix in front of it
/// (`codec::encode_frame_prefix_into`), so the one thread every commit goes through does not
/// encode the bulk of the bytes.
#[derive(Debug)]
pub(crate) struct FrameTail {
    pub bytes: Vec<u8>,
    pub blobbed: Vec<(u32, BlobHash)>,
}

/// What `FrameTail::encode` reserves up front.
const TAIL_PRESIZE: usize = 512;

impl FrameTail {
    pub fn encode(events: &[Event], records: &[RecordValue]) -> Self {
        use bincode::Options;
        let blobbed = inputs_to_blob(events);
        let wire = tail(events, &blobbed, records);
        // Most tails are a few hundred bytes: grown from empty, one was reallocated about
        // seven times, which cost more than encoding it (callgrind).
        let mut bytes = Vec::with_capacity(TAIL_PRESIZE);
        crate::codec::frame_options()
            .serialize_into(&mut bytes, &wire)
            .expect("invariant: frames serialize into memory");
        Self { bytes, blobbed }
    }
}

impl FrameTail {
    /// Whether this is the tail of `frame` (a debug check of the committer's).
    pub fn is_of(&self, frame: &Frame) -> bool {
        let events: Vec<Event> = frame.events.iter().map(|e| e.event.clone()).collect();
        let again = Self::encode(&events, &frame.records);
        again.bytes == self.bytes && again.blobbed == self.blobbed
    }
}

fn tail<'a>(
    events: impl IntoIterator<Item = &'a Event>,
    blobbed: &'a [(u32, BlobHash)],
    records: &'a [RecordValue],
) -> WireTailRef<'a> {
    WireTailRef {
        events: events
            .into_iter()
            .zip(0u32..)
            .map(|(event, index)| {
                if blobbed.iter().any(|(blobbed, _)| *blobbed == index) {
                    Cow::Owned(without_input(event))
                } else {
                    Cow::Borrowed(event)
                }
            })
            .collect(),
        blobbed,
        records,
    }
}

/// `event` without its admission input (stored as a blob).
fn without_input(event: &Event) -> Event {
    match event {
        Event::Admitted {
            kind,
            session_id,
            run_id,
            parent_execution_id,
            revision_id,
            turn_id,
            user_message_id,
            reply_message_id,
            parent_message_id,
            input: _,
        } => Event::Admitted {
            kind: *kind,
            session_id: *session_id,
            run_id: *run_id,
            parent_execution_id: *parent_execution_id,
            revision_id: *revision_id,
            turn_id: *turn_id,
            user_message_id: *user_message_id,
            reply_message_id: *reply_message_id,
            parent_message_id: *parent_message_id,
            input: String::new(),
        },
        other => other.clone(),
    }
}

/// The prefix of `frame` as versions 2 and 3 write it: with the head's identity only if
/// `with_identity`.
pub(crate) fn prefix(frame: &Frame, with_identity: bool) -> WirePrefixRef<'_> {
    let head = &frame.head;
    let first = frame.events.first();
    WirePrefixRef {
        identity: with_identity.then(|| HeadIdentity::of(head)),
        head: HeadStateRef {
            state: head.state,
            pause_reason: &head.pause_reason,
            version: head.version,
            last_seq: head.last_seq,
            fencing_epoch: head.fencing_epoch,
            attempt: &head.attempt,
            checkpoint: &head.checkpoint,
            restart_intent: &head.restart_intent,
            last_activity_ms: head.last_activity_ms,
        },
        first_seq: first.map_or(0, |event| event.seq),
        first_position: first.map_or(0, |event| event.position),
        at_ms: first.map_or(0, |event| event.at_ms),
        writer_epoch: first.map_or(0, |event| event.writer_epoch),
    }
}

/// A frame as versions 2 and 3 write it, whole (see `codec::encode_frame`).
#[cfg(test)]
pub(crate) fn wire<'a>(
    frame: &'a Frame,
    with_identity: bool,
    blobbed: &'a [(u32, BlobHash)],
) -> WireFrameRef<'a> {
    let events = frame.events.iter().map(|envelope| &envelope.event);
    WireFrameRef {
        prefix: prefix(frame, with_identity),
        tail: tail(events, blobbed, &frame.records),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{
        decode_log_record, encode_frame, encode_frame_prefix_into, finish_frame, DecodedFrame,
        LogRecordWriter,
    };
    use crate::keys;

    /// An admission whose input is stored as a blob, an event after it, and a record; every
    /// id and number fixed, so its bytes can be recorded.
    fn frame() -> Frame {
        use crate::ids::{MessageId, RevisionId, TurnId, WaitId};
        use crate::records::{ExecutionKind, WaitKind, WaitRecord, WaitStatus};
        let mut head = ExecutionHead::new(
            ExecutionId::from_bytes([1; 16]),
            SessionId::from_bytes([2; 16]),
            RunId::from_bytes([3; 16]),
            ExecutionKind::AgentTurn,
        );
        head.revision_id = RevisionId::from_bytes([4; 16]);
        head.turn_id = TurnId::from_bytes([5; 16]);
        head.user_message_id = MessageId::from_bytes([6; 16]);
        head.reply_message_id = MessageId::from_bytes([7; 16]);
        head.version = 1;
        head.last_seq = 2;
        head.last_activity_ms = 1_764_000_000_000;
        let admitted = Event::Admitted {
            kind: head.kind,
            session_id: head.session_id,
            run_id: head.run_id,
            parent_execution_id: None,
            revision_id: head.revision_id,
            turn_id: head.turn_id,
            user_message_id: head.user_message_id,
            reply_message_id: head.reply_message_id,
            parent_message_id: None,
            input: "i".repeat(INPUT_BLOB_BYTES_MIN),
        };
        let checkpoint = Event::CheckpointPublished { checkpoint_seq: 2 };
        let events = [admitted, checkpoint]
            .into_iter()
            .zip(1..)
            .map(|(event, seq)| EventEnvelope {
                execution_id: head.execution_id,
                seq,
                position: 10 + seq,
                at_ms: 1_764_000_000_000,
                writer_epoch: 0,
                event,
            })
            .collect();
        let wait = WaitRecord {
            wait_id: WaitId::from_bytes([8; 16]),
            execution_id: head.execution_id,
            kind: WaitKind::Approval,
            prompt: "may I?".into(),
            status: WaitStatus::Open,
            checkpoint_seq: 2,
            attempt_id: None,
            answer: None,
        };
        Frame {
            head,
            events,
            records: vec![RecordValue::Wait(wait)],
        }
    }

    /// `frame()` with its identity as log format 3 wrote it before the committer wrote frames
    /// in two halves, recorded from commit 8a04c11's one-pass `encode_frame`.
    const V3_FIXTURE_HEX: &str = concat!(
        "00000148cfb9793c010101010101010101010101010101010101010101010101010101010101010101020202",
        "0202020202020202020202020203030303030303030303030303030303000004040404040404040404040404",
        "0404040505050505050505050505050505050506060606060606060606060606060606070707070707070707",
        "070707070707070000010200000000fd00e897b69a010000010bfd00e897b69a010000000200000202020202",
        "0202020202020202020202030303030303030303030303030303030004040404040404040404040404040404",
        "0505050505050505050505050505050506060606060606060606060606060606070707070707070707070707",
        "0707070700000a0201003fc5e73c73be579d44d6e77e60f43c7270c659137fcdcb5555ffd37daf8978c60102",
        "080808080808080808080808080808080101010101010101010101010101010100066d617920493f00020000",
    );

    #[test]
    fn s2_the_committer_writes_the_frame_in_two_halves_byte_for_byte() {
        let frame = frame();
        let events: Vec<Event> = frame.events.iter().map(|e| e.event.clone()).collect();
        let tail = FrameTail::encode(&events, &frame.records);
        assert_eq!(tail.blobbed.len(), 1, "the large admission input is a blob");
        for with_identity in [true, false] {
            let mut start = Vec::new();
            encode_frame_prefix_into(&mut start, &frame, with_identity);
            let len = finish_frame(&mut start, &tail);
            let halves = [start.as_slice(), &tail.bytes].concat();
            assert_eq!(len, halves.len());
            assert_eq!(halves, encode_frame(&frame, with_identity, &tail.blobbed));
            if with_identity {
                let hex: String = halves.iter().map(|byte| format!("{byte:02x}")).collect();
                assert_eq!(hex, V3_FIXTURE_HEX, "not the bytes format 3 wrote");
                // And it reads back as the frame, its input put back from the blob.
                let mut writer = LogRecordWriter::new();
                writer.push_halves(&halves[..len - tail.bytes.len()], &tail.bytes);
                let record = writer.finish(12);
                let decoded = decode_log_record(&keys::log(11), &record).expect("framing");
                let Some(DecodedFrame::Ok(mut stored)) = decoded.frames.into_iter().next() else {
                    panic!("the frame does not decode");
                };
                let input = "i".repeat(INPUT_BLOB_BYTES_MIN).into_bytes();
                let resolved = stored.resolve_blobs(|hash| {
                    assert_eq!(hash, tail.blobbed[0].1);
                    Ok(Some(input.clone()))
                });
                assert!(resolved.expect("blob read"));
                assert_eq!(stored.complete(None), Some(frame.clone()));
            }
        }
    }
}
