//! What a conversation keeps beside its executions: its name (C-2's naming) and
//! its compactions (C-3), in one record per session. Written by a compare-and-swap of its
//! own (`ConversationWrite`, `EventStore::write_conversation`), never by an execution's
//! transition: naming and compaction follow a turn, they are no part of one. Kept apart from
//! the session record, which every turn's admission rewrites, so that summaries never weigh
//! on that path.

use serde::{Deserialize, Serialize};

use crate::ids::{ExecutionId, MessageId, SessionId};

/// The longest name, in bytes.
pub const NAME_BYTES_MAX: usize = 200;
/// The longest summary, in bytes.
pub const SUMMARY_BYTES_MAX: usize = 64 * 1024;
/// The largest record, encoded: each compaction names the turns it replaces, and only those
/// some branch can still show are kept, so a conversation of ~40,000 turns fits.
pub const RECORD_BYTES_MAX: usize = 4 * 1024 * 1024;

/// A session's name and compactions.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConversationRecord {
    pub session_id: SessionId,
    /// 0 before its first write; set by the store (one more than the version read).
    pub version: u64,
    pub name: Option<String>,
    /// Oldest first.
    pub compactions: Vec<Compaction>,
}

/// C-3: a prefix of one path of the conversation graph, replaced by a summary message. The
/// executions it replaces keep their events (readable until retention purges them) and their
/// place on the graph: the summary names them, so branch membership never changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compaction {
    /// The summary message's id.
    pub message_id: MessageId,
    /// The execution whose reply ends the prefix.
    pub through: ExecutionId,
    /// The executions on the path from the root to `through`, oldest first.
    pub replaces: Vec<ExecutionId>,
    /// Their messages (each one's user and assistant message), oldest first: what the
    /// summary stands in for on the graph.
    pub messages: Vec<MessageId>,
    pub summary: String,
    pub at_ms: u64,
}

/// A conversation record's compare-and-swap: the record is at `expected_version` (0: none
/// yet), else `Conflict` and nothing is written; then it becomes `record`, one version on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConversationWrite {
    pub session_id: SessionId,
    pub expected_version: u64,
    pub record: ConversationRecord,
}

/// What a `ConversationWrite` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConversationOutcome {
    /// Durable at `version`.
    Written { version: u64 },
    /// The record is at `current`; nothing was written.
    Conflict { current: u64 },
}

impl ConversationWrite {
    /// Every store's rule: the record to store, or the conflict.
    pub(crate) fn decide(
        &self,
        current: Option<&ConversationRecord>,
    ) -> std::result::Result<ConversationRecord, ConversationOutcome> {
        let version = current.map_or(0, |record| record.version);
        if version != self.expected_version {
            return Err(ConversationOutcome::Conflict { current: version });
        }
        Ok(ConversationRecord {
            session_id: self.session_id,
            version: self.expected_version + 1,
            ..self.record.clone()
        })
    }

    /// Refuses a name or summary past its bound, before anything is queued.
    pub(crate) fn check(&self) -> crate::Result<()> {
        let too_long = |what: &str, len: usize, max: usize| {
            crate::Error::InvalidTransition(format!("{what} of {len} bytes (at most {max})"))
        };
        if let Some(name) = &self.record.name {
            if name.len() > NAME_BYTES_MAX {
                return Err(too_long("a session name", name.len(), NAME_BYTES_MAX));
            }
        }
        for compaction in &self.record.compactions {
            if compaction.summary.len() > SUMMARY_BYTES_MAX {
                let len = compaction.summary.len();
                return Err(too_long("a summary", len, SUMMARY_BYTES_MAX));
            }
        }
        let len = crate::codec::encode(&self.record).len();
        if len > RECORD_BYTES_MAX {
            return Err(too_long("a conversation record", len, RECORD_BYTES_MAX));
        }
        Ok(())
    }
}
