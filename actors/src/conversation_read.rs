//! Reads of a session's conversation from the store — its graph (B-1), its conversation
//! record (C-2, C-3), an execution's messages (C-1) — shared by the transcript's pages
//! (`conversation.rs`), compaction (C-3) and a model request's context (E-8). They take the
//! store, not the command service. Nothing here writes.

use std::collections::{HashMap, HashSet};

use openprogram_storage::{
    ConversationRecord, EventEnvelope, EventStore, ExecutionHead, ExecutionId, MessageId, SessionId,
};

use crate::activity::MessageLinks;
use crate::compaction::{summary_message, Item};
use crate::error::{Error, Result};
use crate::transcript::{assistant_message, forked_from, inherited_blocks, user_message, Message};

/// The most events one assistant message is read from at a time: a longer turn says where
/// to read on (`Message::more_after_seq`).
pub const EVENTS_PER_MESSAGE: usize = 2_000;

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

/// The places on the graph of `all` (a session's executions), in that order.
pub(crate) fn links_all(store: &dyn EventStore, all: &[ExecutionId]) -> Result<Vec<MessageLinks>> {
    all.iter().map(|id| links_of(store, *id)).collect()
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

/// The user message of an execution (unless it shares it with the original it was forked or
/// retried from, and `listed` says that original is shown with it) and its assistant message.
pub(crate) fn execution_messages(
    store: &dyn EventStore,
    execution_id: ExecutionId,
    listed: impl Fn(&ExecutionId) -> bool,
) -> Result<Vec<Message>> {
    let Some(head) = store.head(execution_id)? else {
        // Purged meanwhile (S-8): nothing of it to show.
        return Ok(Vec::new());
    };
    let events = store.events_after(execution_id, 0, EVENTS_PER_MESSAGE)?;
    let mut messages = Vec::with_capacity(2);
    let shared = match head.parent_execution_id.filter(|parent| listed(parent)) {
        Some(parent) => store
            .head(parent)?
            .is_some_and(|parent| parent.user_message_id == head.user_message_id),
        None => false,
    };
    if !shared {
        if let Some(user) = events.first().and_then(|first| user_message(&head, first)) {
            messages.push(user);
        }
    }
    messages.push(assistant_of(store, &head, &events, 0)?);
    Ok(messages)
}

/// An execution's assistant message, its blocks from events after `after_seq`.
pub(crate) fn assistant(
    store: &dyn EventStore,
    head: &ExecutionHead,
    after_seq: u64,
) -> Result<Message> {
    let events = store.events_after(head.execution_id, after_seq, EVENTS_PER_MESSAGE)?;
    assistant_of(store, head, &events, after_seq)
}

fn assistant_of(
    store: &dyn EventStore,
    head: &ExecutionHead,
    events: &[EventEnvelope],
    after_seq: u64,
) -> Result<Message> {
    // A fork's branch shows the original's history up to the fork's checkpoint first.
    let inherited = match forked_from(events).filter(|_| after_seq == 0) {
        Some(fork) => match store.head(fork.execution_id)? {
            Some(original) => {
                let through = store.events_after(fork.execution_id, 0, EVENTS_PER_MESSAGE)?;
                inherited_blocks(&original, &through, fork.checkpoint_seq)
            }
            None => Vec::new(),
        },
        None => Vec::new(),
    };
    let mut message = assistant_message(head, events, inherited);
    let read_through = events.last().map_or(after_seq, |last| last.seq);
    if read_through < head.last_seq {
        message.more_after_seq = Some(read_through);
    }
    Ok(message)
}

/// The messages of `items`, oldest first. An execution shares its user message with an
/// original shown before it (a fork's, a retry's): shown once.
pub fn item_messages(
    store: &dyn EventStore,
    items: &[Item<'_>],
    shown_before: impl Fn(&ExecutionId) -> bool,
) -> Result<Vec<Message>> {
    let mut messages = Vec::with_capacity(items.len() * 2);
    for (at, item) in items.iter().enumerate() {
        match item {
            Item::Summary(compaction) => messages.push(summary_message(compaction)),
            Item::Execution(execution_id) => {
                let listed = |id: &ExecutionId| {
                    shown_before(id) || items[..at].iter().any(|earlier| earlier.holds(*id))
                };
                messages.extend(execution_messages(store, *execution_id, listed)?);
            }
        }
    }
    Ok(messages)
}
