//! Reads of a session's conversation graph (B-1) and conversation record (C-2, C-3) from the
//! store, shared by the transcript (C-1), compaction (C-3) and a model request's context
//! (E-8). Nothing here writes.

use std::collections::{HashMap, HashSet};

use openprogram_storage::{ConversationRecord, EventStore, ExecutionId, MessageId, SessionId};

use crate::activity::MessageLinks;
use crate::error::{Error, Result};

/// For `fold`: the executions of `all` (a session's, with their `links`) whose parent
/// message is of no execution there any more (retention purged it), with that parent.
pub(crate) fn anchors_of(
    all: &[ExecutionId],
    links: &[MessageLinks],
) -> HashMap<ExecutionId, MessageId> {
    let present: HashSet<MessageId> = links
        .iter()
        .flat_map(|links| [links.user_message_id, links.reply_message_id])
        .collect();
    all.iter()
        .zip(links)
        .filter_map(|(execution_id, links)| {
            let parent = links.parent_message_id?;
            (!present.contains(&parent)).then_some((*execution_id, parent))
        })
        .collect()
}

/// An execution's place on the graph: its head and its admission's parent message.
pub(crate) fn links_of(store: &dyn EventStore, execution_id: ExecutionId) -> Result<MessageLinks> {
    let head = store.head(execution_id)?.ok_or(Error::NotFound)?;
    let admitted = store.events_after(execution_id, 0, 1)?;
    let parent_message_id = admitted.first().and_then(|envelope| match &envelope.event {
        openprogram_storage::Event::Admitted {
            parent_message_id, ..
        } => *parent_message_id,
        _ => None,
    });
    Ok(MessageLinks {
        user_message_id: head.user_message_id,
        reply_message_id: head.reply_message_id,
        parent_message_id,
    })
}

/// A session's conversation record, or its empty one.
pub fn record_of(store: &dyn EventStore, session_id: SessionId) -> Result<ConversationRecord> {
    Ok(store
        .conversation(session_id)?
        .unwrap_or_else(|| ConversationRecord {
            session_id,
            ..ConversationRecord::default()
        }))
}
