//! Optional work on a conversation, with the embedder's hooks: compacting it
//! through one of its turns (C-3, `compact`), and what follows a completed turn once it freed
//! its session (C-2, `follow_up`): a name for the session, a compaction the policy asks for.
//! Both write the session's conversation record by compare-and-swap; the executions, their
//! events and the graph are never touched.

use std::sync::Arc;

use openprogram_storage::conversation::{Compaction, ConversationRecord, ConversationWrite};
use openprogram_storage::{ConversationOutcome, ExecutionId, MessageId, SessionId};

use crate::activity::executions_to;
use crate::compaction::fold;
use crate::conversation_read::{
    anchors_of, execution_messages, item_messages, links_all, record_of,
};
use crate::env::Env;
use crate::error::{Error, Result};

/// How often a conversation write is tried again when another write came first.
const WRITE_TRIES_MAX: usize = 8;

/// Where a compaction's prefix is on the graph as the session's executions are read now.
struct Prefix {
    /// The session's executions and their links (read once per try).
    all: Vec<ExecutionId>,
    links: Vec<crate::activity::MessageLinks>,
    /// The executions from the root to `through`, and their messages.
    replaces: Vec<ExecutionId>,
    messages: Vec<MessageId>,
}

impl Prefix {
    /// The prefix through `through`, an execution of the session that has ended.
    fn read(
        store: &dyn openprogram_storage::EventStore,
        session_id: SessionId,
        through: ExecutionId,
    ) -> Result<Self> {
        let all = store.executions_in_session(session_id)?;
        let Some(at) = all.iter().position(|id| *id == through) else {
            return Err(Error::NotFound);
        };
        let head = store.head(through)?.ok_or(Error::NotFound)?;
        if !head.state.is_terminal() {
            return Err(Error::InvalidRequest(format!(
                "{through} is {}: a conversation is compacted through a turn that has ended",
                head.state.as_str()
            )));
        }
        let links = links_all(store, &all)?;
        let path = executions_to(&links, links[at].reply_message_id);
        Ok(Self {
            replaces: path.iter().map(|index| all[*index]).collect(),
            messages: path
                .iter()
                .flat_map(|index| {
                    [
                        links[*index].user_message_id,
                        links[*index].reply_message_id,
                    ]
                })
                .collect(),
            all,
            links,
        })
    }

    /// Whether `compaction` is still needed beside one through `through` that replaces
    /// `replaces`: some branch (the path to a reply nobody answered) holds its turn and not
    /// `through`.
    fn needs(&self, compaction: &Compaction, through: ExecutionId) -> bool {
        if !self.replaces.contains(&compaction.through) {
            return true;
        }
        let answered: std::collections::HashSet<MessageId> = self
            .links
            .iter()
            .filter_map(|links| links.parent_message_id)
            .collect();
        let leaves = self
            .links
            .iter()
            .filter(|links| !answered.contains(&links.reply_message_id));
        leaves.into_iter().any(|links| {
            let path = executions_to(&self.links, links.reply_message_id);
            let holds =
                |execution_id: ExecutionId| path.iter().any(|at| self.all[*at] == execution_id);
            holds(compaction.through) && !holds(through)
        })
    }
}

/// C-3: replaces the conversation's prefix through `through` (an execution of the session
/// that has ended) with the summary the embedder's compactor writes. Asking again for the
/// same execution answers the compaction made. An earlier compaction the new one covers on
/// every path is dropped, so the record holds what some list can show.
pub async fn compact(env: &Env, session_id: SessionId, through: ExecutionId) -> Result<Compaction> {
    let compactor = env
        .conversation_hooks
        .compactor
        .clone()
        .ok_or(Error::HookMissing("compactor"))?;
    let store = env.store.as_ref();
    // The summary of the prefix as it was shown, kept across tries: the hook is asked again
    // only if what it summarizes changed.
    let mut summarized: Option<(Vec<MessageId>, String)> = None;
    for _ in 0..WRITE_TRIES_MAX {
        // Read again on each try: a write that came first may have been a session's deletion.
        let record = record_of(store, session_id)?;
        let prefix = Prefix::read(store, session_id, through)?;
        if let Some(made) = record
            .compactions
            .iter()
            .find(|made| made.through == through)
        {
            return Ok(made.clone());
        }
        let items = fold(
            &prefix.replaces,
            &record.compactions,
            &anchors_of(&prefix.all, &prefix.links),
        );
        let shown = item_messages(store, &items, |_| false)?;
        let shown_ids: Vec<MessageId> = shown.iter().map(|message| message.message_id).collect();
        let summary = match summarized.take() {
            Some((ids, summary)) if ids == shown_ids => summary,
            _ => compactor
                .summarize(session_id, shown)
                .await
                .map_err(hook_failed("compactor"))?,
        };
        let bound = openprogram_storage::conversation::SUMMARY_BYTES_MAX;
        if summary.len() > bound {
            let message = format!("a summary of {} bytes (at most {bound})", summary.len());
            return Err(hook_failed("compactor")(message));
        }
        summarized = Some((shown_ids, summary.clone()));
        let compaction = Compaction {
            message_id: MessageId::from_uuid(uuid::Uuid::new_v5(through.as_uuid(), b"compaction")),
            through,
            replaces: prefix.replaces.clone(),
            messages: prefix.messages.clone(),
            summary,
            at_ms: env.clock.now_ms(),
        };
        let mut compactions: Vec<Compaction> = record
            .compactions
            .iter()
            .filter(|earlier| prefix.needs(earlier, through))
            .cloned()
            .collect();
        compactions.push(compaction.clone());
        let write = ConversationWrite {
            session_id,
            expected_version: record.version,
            record: ConversationRecord {
                compactions,
                ..record
            },
        };
        match store.write_conversation(write).await {
            Ok(ConversationOutcome::Written { .. }) => return Ok(compaction),
            Ok(ConversationOutcome::Conflict { .. }) => continue,
            // Past the record's bound: refused, nothing written.
            Err(openprogram_storage::Error::InvalidTransition(message)) => {
                return Err(Error::InvalidRequest(message))
            }
            Err(error) => return Err(error.into()),
        }
    }
    Err(Error::Unavailable(
        "the conversation kept changing; ask again".into(),
    ))
}

/// C-2's follow-up work, after a turn of the session completed and freed its session: a name
/// for the session if it has none, then a compaction if the policy asks for one. Optional:
/// a failure is logged and nothing is written, and the next turn's end tries again.
pub async fn follow_up(env: Arc<Env>, session_id: SessionId, execution_id: ExecutionId) {
    if let Err(error) = name_session(&env, session_id, execution_id).await {
        tracing::warn!(%session_id, %error, "the session was not named");
    }
    if let Err(error) = compact_by_policy(&env, session_id, execution_id).await {
        tracing::warn!(%session_id, %error, "the conversation was not compacted");
    }
}

async fn name_session(env: &Env, session_id: SessionId, execution_id: ExecutionId) -> Result<()> {
    let Some(namer) = env.conversation_hooks.namer.clone() else {
        return Ok(());
    };
    let store = env.store.as_ref();
    let mut record = record_of(store, session_id)?;
    if record.name.is_some() {
        return Ok(());
    }
    let turn = execution_messages(store, execution_id, |_| false)?;
    let name = namer
        .name(session_id, turn)
        .await
        .map_err(hook_failed("namer"))?;
    let Some(name) = name
        .map(|name| bounded(name.trim()))
        .filter(|name| !name.is_empty())
    else {
        return Ok(());
    };
    // Written against the record as it was before the hook: a session deleted meanwhile (its
    // record cleared, its turns purged) is never named again.
    for _ in 0..WRITE_TRIES_MAX {
        if record.name.is_some() || store.head(execution_id)?.is_none() {
            return Ok(()); // named meanwhile (the first name stays), or deleted
        }
        let write = ConversationWrite {
            session_id,
            expected_version: record.version,
            record: ConversationRecord {
                name: Some(name.clone()),
                ..record.clone()
            },
        };
        if let ConversationOutcome::Written { .. } = store.write_conversation(write).await? {
            return Ok(());
        }
        record = record_of(store, session_id)?;
    }
    Err(Error::Unavailable("the conversation kept changing".into()))
}

/// An embedder's hook answered `Err(message)`, or what it answered is refused.
fn hook_failed(hook: &'static str) -> impl FnOnce(String) -> Error {
    move |message| Error::HookFailed { hook, message }
}

/// `name` cut to the bound a name has, at a character boundary.
fn bounded(name: &str) -> String {
    let max = openprogram_storage::conversation::NAME_BYTES_MAX;
    let mut end = name.len().min(max);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_owned()
}

/// The policy's compaction of the path that ends with `execution_id`, if it grew too long.
async fn compact_by_policy(
    env: &Env,
    session_id: SessionId,
    execution_id: ExecutionId,
) -> Result<()> {
    let (Some(_), Some(policy)) = (
        &env.conversation_hooks.compactor,
        env.conversation_hooks.policy,
    ) else {
        return Ok(());
    };
    let store = env.store.as_ref();
    // The branch up to the turn that completed: the prefix a compaction through it replaces.
    let branch = match Prefix::read(store, session_id, execution_id) {
        Ok(branch) => branch,
        Err(Error::NotFound) => return Ok(()), // purged meanwhile
        Err(error) => return Err(error),
    };
    let path = &branch.replaces;
    let record = record_of(store, session_id)?;
    let anchors = anchors_of(&branch.all, &branch.links);
    let shown = fold(path, &record.compactions, &anchors).len();
    if shown <= policy.past || path.len() <= policy.keep {
        return Ok(());
    }
    let through = path[path.len() - policy.keep - 1];
    compact(env, session_id, through).await.map(|_| ())
}

/// `DELETE` of a session: its name and summaries go with its executions (an empty record
/// stays, at its next version).
pub async fn forget(env: &Env, session_id: SessionId) -> Result<()> {
    for _ in 0..WRITE_TRIES_MAX {
        // Written even when there is none yet: a follow-up that read none fails its write.
        let record = record_of(env.store.as_ref(), session_id)?;
        let write = ConversationWrite {
            session_id,
            expected_version: record.version,
            record: ConversationRecord::default(),
        };
        if let ConversationOutcome::Written { .. } = env.store.write_conversation(write).await? {
            return Ok(());
        }
    }
    Err(Error::Unavailable("the conversation kept changing".into()))
}
