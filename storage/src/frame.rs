//! What a log frame holds (codec.rs frames it): one committed transition in memory (`Frame`),
//! as format 4 writes it (`WireFrameRef`, read as `WireFrame`), and as read back
//! (`StoredFrame`, completed with its head's identity and its blobbed inputs). What formats
//! 1–3 wrote is read by `frame_v3.rs`.

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::event::{Event, EventEnvelope};
use crate::ids::{ExecutionId, MessageId, RevisionId, RunId, SessionId, TurnId};
use crate::record_value::RecordValue;
use crate::records::{
    AttemptLease, BlobHash, Checkpoint, ExecutionHead, ExecutionKind, ExecutionState, RestartIntent,
};

/// An admission input this large is stored as a blob, once however many executions share
/// it, and referenced from its event (S-5).
pub(crate) const INPUT_BLOB_BYTES_MIN: usize = 1024;

/// What the log keeps of one committed transition: enough to rebuild the head, the events
/// and the records without reading anything else.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Frame {
    pub head: ExecutionHead,
    pub events: Vec<EventEnvelope>,
    pub records: Vec<RecordValue>,
}

/// The fields of a head that stay the same from frame to frame: those set when its
/// execution is created, and the attempt that owns it. A frame carries them only when its
/// transition sets or changes one (a new attempt); the others take them from the head
/// before them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HeadIdentity {
    pub execution_id: ExecutionId,
    pub(crate) session_id: SessionId,
    pub(crate) run_id: RunId,
    pub(crate) parent_execution_id: Option<ExecutionId>,
    pub(crate) kind: ExecutionKind,
    pub(crate) revision_id: RevisionId,
    pub(crate) turn_id: TurnId,
    pub(crate) user_message_id: MessageId,
    pub(crate) reply_message_id: MessageId,
    pub(crate) attempt: Option<AttemptLease>,
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
            attempt: head.attempt,
        }
    }
}

/// The rest of a head, as a format 4 frame writes it: borrowed from the head when written
/// (`HeadStateRef`), owned when read back (`HeadState`), one field list for both. Its last
/// seq and last activity are the frame's last event's seq and its time (the committer sets
/// them so), not written again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HeadState<
    Reason = Option<String>,
    Point = Option<Checkpoint>,
    Intent = Option<RestartIntent>,
> {
    pub(crate) state: ExecutionState,
    pub(crate) pause_reason: Reason,
    pub(crate) version: u64,
    pub(crate) fencing_epoch: u64,
    pub(crate) checkpoint: Point,
    pub(crate) restart_intent: Intent,
}

pub(crate) type HeadStateRef<'a> =
    HeadState<&'a Option<String>, &'a Option<Checkpoint>, &'a Option<RestartIntent>>;

/// A format 4 frame as written (`WireFrame` reads it back).
#[derive(Serialize)]
pub(crate) struct WireFrameRef<'a> {
    identity: Option<HeadIdentity>,
    head: HeadStateRef<'a>,
    first_seq: u64,
    first_position: u64,
    at_ms: u64,
    writer_epoch: u64,
    events: Vec<Cow<'a, Event>>,
    blobbed: &'a [(u32, BlobHash)],
    records: &'a [RecordValue],
}

/// A frame of format 2 or later read back, by the identity and head state its format writes
/// (format 4's by default; `frame_v3.rs` names formats 2 and 3's).
#[derive(Deserialize)]
pub(crate) struct WireFrame<Identity = HeadIdentity, Head = HeadState> {
    identity: Option<Identity>,
    head: Head,
    first_seq: u64,
    first_position: u64,
    at_ms: u64,
    writer_epoch: u64,
    events: Vec<Event>,
    blobbed: Vec<(u32, BlobHash)>,
    records: Vec<RecordValue>,
}

/// A frame read back with its events in their envelopes: what every format from 2 on shares.
pub(crate) struct Unpacked<Identity, Head> {
    pub(crate) identity: Option<Identity>,
    pub(crate) head: Head,
    pub(crate) events: Vec<EventEnvelope>,
    pub(crate) blobbed: Vec<(u32, BlobHash)>,
    pub(crate) records: Vec<RecordValue>,
}

impl<Identity, Head> WireFrame<Identity, Head> {
    /// The frame with its events in their envelopes, as the committer wrote them: one
    /// execution, time and epoch, and consecutive seqs and positions from the frame's first.
    pub(crate) fn unpack(self, execution_id: ExecutionId) -> Unpacked<Identity, Head> {
        let (first_seq, first_position) = (self.first_seq, self.first_position);
        let (at_ms, writer_epoch) = (self.at_ms, self.writer_epoch);
        let events = self
            .events
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
        Unpacked {
            identity: self.identity,
            head: self.head,
            events,
            blobbed: self.blobbed,
            records: self.records,
        }
    }
}

/// What formats 1–3 wrote in every frame, and format 4 takes from elsewhere: the attempt
/// from the identity, the last seq and last activity from the events.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Kept {
    pub(crate) attempt: Option<AttemptLease>,
    pub(crate) last_seq: u64,
    pub(crate) last_activity_ms: u64,
}

/// A frame read back from the log. Its head is whole once `complete` has the identity:
/// from the frame itself (the creating transition, one that changed it, every version 1
/// frame), else from the execution's head before the frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredFrame {
    pub execution_id: ExecutionId,
    pub(crate) identity: Option<HeadIdentity>,
    pub(crate) head: HeadState,
    /// Formats 1–3 only.
    pub(crate) kept: Option<Kept>,
    pub events: Vec<EventEnvelope>,
    /// Events stored without their admission input: (index in `events`, the input's blob).
    pub(crate) blobbed: Vec<(u32, BlobHash)>,
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
        let Kept {
            attempt,
            last_seq,
            last_activity_ms,
        } = self.kept.unwrap_or_else(|| Kept {
            attempt: identity.attempt,
            last_seq: self.events.last().map_or(0, |event| event.seq),
            last_activity_ms: self.events.first().map_or(0, |event| event.at_ms),
        });
        let HeadState {
            state,
            pause_reason,
            version,
            fencing_epoch,
            checkpoint,
            restart_intent,
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

    /// A format 4 frame read back.
    pub(crate) fn from_wire(execution_id: ExecutionId, wire: WireFrame) -> Self {
        let Unpacked {
            identity,
            head,
            events,
            blobbed,
            records,
        } = wire.unpack(execution_id);
        Self {
            execution_id,
            identity,
            head,
            kept: None,
            events,
            blobbed,
            records,
        }
    }
}

/// The admission inputs of `frame` to store as blobs: (event index, hash).
pub(crate) fn inputs_to_blob(frame: &Frame) -> Vec<(u32, BlobHash)> {
    frame
        .events
        .iter()
        .zip(0u32..)
        .filter_map(|(envelope, index)| match &envelope.event {
            Event::Admitted { input, .. } if input.len() >= INPUT_BLOB_BYTES_MIN => {
                Some((index, BlobHash::of(input.as_bytes())))
            }
            _ => None,
        })
        .collect()
}

/// `event` without its admission input (stored as a blob), which is never copied: it may be
/// as large as a blob may be, and this runs on the committer's thread.
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

/// A frame as format 4 writes it (see `codec::encode_frame`).
pub(crate) fn wire<'a>(
    frame: &'a Frame,
    with_identity: bool,
    blobbed: &'a [(u32, BlobHash)],
) -> WireFrameRef<'a> {
    let head = &frame.head;
    let first = frame.events.first();
    WireFrameRef {
        identity: with_identity.then(|| HeadIdentity::of(head)),
        head: HeadStateRef {
            state: head.state,
            pause_reason: &head.pause_reason,
            version: head.version,
            fencing_epoch: head.fencing_epoch,
            checkpoint: &head.checkpoint,
            restart_intent: &head.restart_intent,
        },
        first_seq: first.map_or(0, |event| event.seq),
        first_position: first.map_or(0, |event| event.position),
        at_ms: first.map_or(0, |event| event.at_ms),
        writer_epoch: first.map_or(0, |event| event.writer_epoch),
        events: frame
            .events
            .iter()
            .zip(0u32..)
            .map(|(envelope, index)| {
                if blobbed.iter().any(|(blobbed, _)| *blobbed == index) {
                    Cow::Owned(without_input(&envelope.event))
                } else {
                    Cow::Borrowed(&envelope.event)
                }
            })
            .collect(),
        blobbed,
        records: &frame.records,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{
        decode_log_record, encode_frame, DecodedFrame, LogRecordWriter, LOG_FORMAT_VERSION,
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

    /// `frame()` with its identity as log format 3 wrote it, recorded from commit 8a04c11's
    /// `encode_frame`: an admission input stored as a blob and a record, which the fixtures
    /// of `codec.rs` do not have.
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

    /// The frame in `bytes`, the one frame of a log record of format `version`, its blobbed
    /// input put back.
    fn read_back(version: u8, bytes: &[u8], blobbed: &[(u32, BlobHash)]) -> StoredFrame {
        let mut writer = LogRecordWriter::new();
        writer.push(bytes);
        let mut record = writer.finish(12);
        record[0] = version;
        let crc = crc32fast::hash(&record[..9]);
        record[9..13].copy_from_slice(&crc.to_be_bytes());
        let decoded = decode_log_record(&keys::log(11), &record).expect("framing");
        let Some(DecodedFrame::Ok(mut stored)) = decoded.frames.into_iter().next() else {
            panic!("the frame does not decode");
        };
        let input = "i".repeat(INPUT_BLOB_BYTES_MIN).into_bytes();
        let resolved = stored.resolve_blobs(|hash| {
            assert_eq!(hash, blobbed[0].1);
            Ok(Some(input.clone()))
        });
        assert!(resolved.expect("blob read"));
        *stored
    }

    #[test]
    fn s6_a_format_3_frame_with_a_blobbed_input_and_a_record_still_reads() {
        let frame = frame();
        let blobbed = inputs_to_blob(&frame);
        assert_eq!(blobbed.len(), 1, "the large admission input is a blob");
        let hex = V3_FIXTURE_HEX.as_bytes();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|at| u8::from_str_radix(&V3_FIXTURE_HEX[at..at + 2], 16).expect("hex"))
            .collect();
        let stored = read_back(3, &bytes, &blobbed);
        assert_eq!(stored.complete(None), Some(frame.clone()));
        // Format 4 writes it in fewer bytes and reads it back the same.
        let v4 = encode_frame(&frame, true, &blobbed);
        assert!(v4.len() < bytes.len(), "{} vs {}", v4.len(), bytes.len());
        let stored = read_back(LOG_FORMAT_VERSION, &v4, &blobbed);
        assert_eq!(stored.complete(None), Some(frame));
    }
}
