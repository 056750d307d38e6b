//! C-1: reading a session's transcript (`transcript.rs` folds one execution's events into
//! its messages) — by page, by branch, one assistant message on from a seq, or the messages
//! changed since a log position. Everything comes from the event log; nothing is stored.
//!
//! Costs: a page reads its own executions (a head and at most `EVENTS_PER_MESSAGE` events
//! each, and a fork's original's events up to its checkpoint) and the session's
//! by-session index (one small key per execution). A branch filter also reads each
//! execution's head and admission event, to walk the conversation graph (B-1).

use std::collections::{HashMap, HashSet};

use openprogram_storage::{
    EventEnvelope, EventStore, ExecutionHead, ExecutionId, MessageId, SessionId,
};
use serde::Serialize;

use crate::activity::branch_executions;
use crate::compaction::{fold, summary_message, Item};
use crate::error::{Error, Result};
use crate::graph_read::{anchors_of, links_of, record_of};
use crate::service::Service;
use crate::transcript::{assistant_message, forked_from, inherited_blocks, user_message, Message};

/// The most events one assistant message is read from at a time: a longer turn says where
/// to read on (`Message::more_after_seq`).
pub const EVENTS_PER_MESSAGE: usize = 2_000;
/// Executions per page, by default and at most.
pub const PAGE_DEFAULT: usize = 20;
pub const PAGE_MAX: usize = 100;

/// What to read (the query of `GET /v1/sessions/{sid}/messages`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MessagesQuery {
    /// Only the messages on this branch (a `branch_id` of Activity).
    pub branch: Option<MessageId>,
    /// The page after this execution (the previous page's `next`).
    pub after: Option<ExecutionId>,
    /// Executions on the page (each gives its user and assistant message).
    pub limit: Option<usize>,
    /// One execution's assistant message, its blocks from events after `after_seq`.
    pub execution: Option<ExecutionId>,
    pub after_seq: u64,
    /// The messages of executions that changed after this global log position.
    pub changed_after: Option<u64>,
    /// C-3: the messages compactions replaced, instead of their summaries.
    pub originals: bool,
}

/// A page of messages, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MessagesPage {
    pub messages: Vec<Message>,
    /// The cursor of the next page (`after`), if there is more.
    pub next: Option<ExecutionId>,
    /// For `changed_after`: the log position to ask from next time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed_through: Option<u64>,
    /// C-3: the version of the session's name and compactions this page was read with (a
    /// page read at another version may show other summaries).
    pub conversation_version: u64,
}

impl Service {
    /// C-1: the session's transcript as `query` asks.
    pub fn messages(&self, session_id: SessionId, query: &MessagesQuery) -> Result<MessagesPage> {
        let store = self.env().store.as_ref();
        if let Some(execution_id) = query.execution {
            let head = self.head_in(session_id, execution_id)?;
            let message = assistant(store, &head, query.after_seq)?;
            return Ok(MessagesPage {
                messages: vec![message],
                ..MessagesPage::default()
            });
        }
        if let Some(position) = query.changed_after {
            return self.changed_messages(session_id, position, query.limit);
        }
        let limit = query.limit.unwrap_or(PAGE_DEFAULT).clamp(1, PAGE_MAX);
        let all = store.executions_in_session(session_id)?;
        let record = record_of(store, session_id)?;
        let compactions = match query.originals {
            true => &[][..],
            false => &record.compactions[..],
        };
        // The graph is read for a branch, and when a compaction's turn was purged (to find
        // where its summary stands now).
        let present: HashSet<ExecutionId> = all.iter().copied().collect();
        let purged_through = compactions
            .iter()
            .any(|compaction| !present.contains(&compaction.through));
        let links = match query.branch.is_some() || purged_through {
            true => all
                .iter()
                .map(|execution_id| links_of(store, *execution_id))
                .collect::<Result<Vec<_>>>()?,
            false => Vec::new(),
        };
        let anchors = match purged_through {
            true => anchors_of(&all, &links),
            false => HashMap::new(),
        };
        let on_branch: Vec<ExecutionId> = match query.branch {
            None => all,
            Some(branch) => {
                let path = branch_executions(&links, branch).ok_or(Error::NotFound)?;
                path.into_iter().map(|at| all[at]).collect()
            }
        };
        let items = fold(&on_branch, compactions, &anchors);
        // A cursor an earlier page gave may be an execution a summary now replaces: the page
        // goes on after the summary.
        let start = match query.after {
            None => 0,
            Some(after) => items
                .iter()
                .position(|item| item.holds(after))
                .map(|at| at + 1)
                .ok_or_else(|| {
                    Error::InvalidRequest(format!("`after`: {after} is not on this transcript"))
                })?,
        };
        let page = &items[start.min(items.len())..];
        let more = page.len() > limit;
        let page = &page[..page.len().min(limit)];
        let earlier = &items[..start.min(items.len())];
        // A fork or retry shares its original's user message: shown once, with the original,
        // where the original is on the same list.
        let messages = item_messages(store, page, |id| earlier.iter().any(|item| item.holds(*id)))?;
        Ok(MessagesPage {
            messages,
            next: more.then(|| page.last().map(Item::cursor)).flatten(),
            changed_through: None,
            conversation_version: record.version,
        })
    }

    /// The messages of the session's executions with events after `position` in the
    /// global log (B-6's session feed), and where to ask from next.
    fn changed_messages(
        &self,
        session_id: SessionId,
        position: u64,
        limit: Option<usize>,
    ) -> Result<MessagesPage> {
        let store = self.env().store.as_ref();
        let feed =
            self.session_feed(session_id, position, limit.unwrap_or(1000).clamp(1, 10_000))?;
        let mut changed: Vec<ExecutionId> = Vec::new();
        for entry in &feed.entries {
            if !changed.contains(&entry.execution_id) {
                changed.push(entry.execution_id);
            }
        }
        changed.sort();
        let mut messages = Vec::new();
        for execution_id in changed {
            messages.extend(execution_messages(store, execution_id, |_| true)?);
        }
        Ok(MessagesPage {
            messages,
            next: None,
            changed_through: Some(feed.scanned_through),
            conversation_version: record_of(store, session_id)?.version,
        })
    }
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
fn assistant(store: &dyn EventStore, head: &ExecutionHead, after_seq: u64) -> Result<Message> {
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
