//! What a log frame holds (codec.rs frames it): one committed transition in memory (`Frame`),
//! as formats 2 and 3 write it (`WireFrameRef`, read as `WireFrame`), and as read back
//! (`StoredFrame`, completed with its head's identity and its blobbed inputs).

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

/// The rest of a head, as a version 2 or 3 frame writes it: borrowed from the head when
/// written (`HeadStateRef`), owned when read back (`HeadState`), one field list for both.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HeadState<
    Reason = Option<String>,
    Attempt = Option<AttemptLease>,
    Point = Option<Checkpoint>,
    Intent = Option<RestartIntent>,
> {
    state: ExecutionState,
    pause_reason: Reason,
    version: u64,
    last_seq: u64,
    fencing_epoch: u64,
    attempt: Attempt,
    checkpoint: Point,
    restart_intent: Intent,
    last_activity_ms: u64,
}

pub(crate) type HeadStateRef<'a> = HeadState<
    &'a Option<String>,
    &'a Option<AttemptLease>,
    &'a Option<Checkpoint>,
    &'a Option<RestartIntent>,
>;

/// A version 2 or 3 frame as written (`WireFrame` reads it back; the two differ only in
/// bincode's integer encoding, `codec.rs`).
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

/// A frame as versions 2 and 3 write it (see `codec::encode_frame`).
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
    use crate::codec::{decode_log_record, encode_frame, DecodedFrame, LogRecordWriter};
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

    /// `frame()` with its identity as log format 3 writes it, recorded from commit 8a04c11's
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

    #[test]
    fn s6_format_3_writes_a_blobbed_input_and_a_record_as_it_always_did() {
        let frame = frame();
        let blobbed = inputs_to_blob(&frame);
        assert_eq!(blobbed.len(), 1, "the large admission input is a blob");
        let bytes = encode_frame(&frame, true, &blobbed);
        let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
        assert_eq!(hex, V3_FIXTURE_HEX, "not the bytes format 3 wrote");
        // And it reads back from a log record as the frame, its input put back from the blob.
        let mut writer = LogRecordWriter::new();
        writer.push(&bytes);
        let record = writer.finish(12);
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
        assert_eq!(stored.complete(None), Some(frame));
    }
}
