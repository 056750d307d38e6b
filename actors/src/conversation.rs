//! The command service's conversation reads: C-1, a session's transcript (`transcript.rs`
//! folds one execution's events into its messages) — by page, by branch, one assistant
//! message on from a seq, or the messages changed since a log position; and the session's
//! view (name, foreground turn, compactions), `compact` and `DELETE`'s part (C-2, C-3).
//! Everything comes from the event log and the session's records.
//!
//! Costs: a page reads its own executions (a head and at most `EVENTS_PER_MESSAGE` events
//! each, and a fork's original's events up to its checkpoint) and the session's
//! by-session index (one small key per execution). A branch filter also reads each
//! execution's head and admission event, to walk the conversation graph (B-1).

use std::collections::{HashMap, HashSet};

use openprogram_storage::conversation::Compaction;
use openprogram_storage::{ExecutionId, MessageId, SessionId};
use serde::Serialize;

use crate::activity::branch_executions;
use crate::compaction::{fold, Item};
use crate::conversation_read::{
    anchors_of, assistant, execution_messages, item_messages, links_all, record_of,
};
use crate::error::{Error, Result};
use crate::service::Service;
use crate::transcript::Message;

pub use crate::conversation_read::EVENTS_PER_MESSAGE;
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
            true => links_all(store, &all)?,
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
        let mut changed: Vec<ExecutionId> = feed
            .entries
            .iter()
            .map(|entry| entry.execution_id)
            .collect();
        changed.sort();
        changed.dedup();
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

    /// `DELETE` of a session, after its executions were purged: its name and summaries.
    pub async fn forget_conversation(&self, session_id: SessionId) -> Result<()> {
        crate::conversation_follow_up::forget(self.env(), session_id).await
    }

    /// The session's name, foreground turn and compactions (all empty for a session with
    /// nothing stored: a session exists as soon as its id is made).
    pub fn session_view(&self, session_id: SessionId) -> Result<SessionView> {
        let store = self.env().store.as_ref();
        let executions = store.executions_in_session(session_id)?.len();
        let record = record_of(store, session_id)?;
        let turns = store.session(session_id)?.unwrap_or_default();
        Ok(SessionView {
            session_id,
            name: record.name,
            conversation_version: record.version,
            foreground: turns.foreground,
            waiting: turns.waiting,
            executions,
            compactions: record.compactions,
        })
    }

    /// C-3: compacts the session's conversation through the turn whose user or assistant
    /// message is `through` (see `compact`).
    pub async fn compact(&self, session_id: SessionId, through: MessageId) -> Result<Compaction> {
        if self.env().conversation_hooks.compactor.is_none() {
            return Err(Error::HookMissing("compactor"));
        }
        let store = self.env().store.as_ref();
        let mut found = None;
        for execution_id in store.executions_in_session(session_id)? {
            let Some(head) = store.head(execution_id)? else {
                continue;
            };
            if head.reply_message_id == through || head.user_message_id == through {
                found = Some(execution_id);
                // A fork shares its original's user message: the original is the older.
                break;
            }
        }
        let through = found.ok_or(Error::NotFound)?;
        crate::conversation_follow_up::compact(self.env(), session_id, through).await
    }
}

/// A session as `GET /v1/sessions/{sid}` shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SessionView {
    pub session_id: SessionId,
    /// Given by the naming hook after a completed turn.
    pub name: Option<String>,
    /// The version of the name and compactions (`conversation_version` of a messages page).
    pub conversation_version: u64,
    /// C-2: the turn holding the session (it may have ended since), and the turns in line.
    pub foreground: Option<ExecutionId>,
    pub waiting: Vec<ExecutionId>,
    pub executions: usize,
    pub compactions: Vec<Compaction>,
}
