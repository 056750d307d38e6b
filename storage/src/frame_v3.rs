//! Frames as log formats 1–3 wrote them, read back into `StoredFrame`. Nothing writes them
//! any more. Format 1 is `bincode(Frame)`. Formats 2 and 3 carry the identity without the
//! attempt, and every other field of the head in every frame; they differ only in bincode's
//! integer encoding (`codec.rs`).

use serde::Deserialize;

use crate::frame::{Frame, HeadIdentity, HeadState, Kept, StoredFrame, Unpacked, WireFrame};
use crate::ids::{ExecutionId, MessageId, RevisionId, RunId, SessionId, TurnId};
use crate::records::{AttemptLease, Checkpoint, ExecutionKind, ExecutionState, RestartIntent};

/// The identity as formats 2 and 3 wrote it: without the attempt.
#[derive(Deserialize)]
pub(crate) struct IdentityV3 {
    execution_id: ExecutionId,
    session_id: SessionId,
    run_id: RunId,
    parent_execution_id: Option<ExecutionId>,
    kind: ExecutionKind,
    revision_id: RevisionId,
    turn_id: TurnId,
    user_message_id: MessageId,
    reply_message_id: MessageId,
}

/// The rest of the head as formats 2 and 3 wrote it, in every frame.
#[derive(Deserialize)]
pub(crate) struct HeadStateV3 {
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

/// A frame of format 2 or 3.
pub(crate) type WireFrameV3 = WireFrame<IdentityV3, HeadStateV3>;

impl StoredFrame {
    /// A format 1 frame read back: it carries its whole head.
    pub(crate) fn from_v1(frame: Frame) -> Self {
        let head = frame.head;
        Self {
            execution_id: head.execution_id,
            identity: Some(HeadIdentity::of(&head)),
            head: HeadState {
                state: head.state,
                pause_reason: head.pause_reason,
                version: head.version,
                fencing_epoch: head.fencing_epoch,
                checkpoint: head.checkpoint,
                restart_intent: head.restart_intent,
            },
            kept: Some(Kept {
                attempt: head.attempt,
                last_seq: head.last_seq,
                last_activity_ms: head.last_activity_ms,
            }),
            events: frame.events,
            blobbed: Vec::new(),
            records: frame.records,
        }
    }

    /// A format 2 or 3 frame read back.
    pub(crate) fn from_v3(execution_id: ExecutionId, wire: WireFrameV3) -> Self {
        let Unpacked {
            identity,
            head,
            events,
            blobbed,
            records,
        } = wire.unpack(execution_id);
        Self {
            execution_id,
            identity: identity.map(|identity| HeadIdentity {
                execution_id: identity.execution_id,
                session_id: identity.session_id,
                run_id: identity.run_id,
                parent_execution_id: identity.parent_execution_id,
                kind: identity.kind,
                revision_id: identity.revision_id,
                turn_id: identity.turn_id,
                user_message_id: identity.user_message_id,
                reply_message_id: identity.reply_message_id,
                attempt: head.attempt,
            }),
            head: HeadState {
                state: head.state,
                pause_reason: head.pause_reason,
                version: head.version,
                fencing_epoch: head.fencing_epoch,
                checkpoint: head.checkpoint,
                restart_intent: head.restart_intent,
            },
            kept: Some(Kept {
                attempt: head.attempt,
                last_seq: head.last_seq,
                last_activity_ms: head.last_activity_ms,
            }),
            events,
            blobbed,
            records,
        }
    }
}
