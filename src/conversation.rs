//! The runtime's reads of a session's conversation: its branches (Activity, B-2..B-5), its
//! transcript (C-1), its feed of events (B-6) and the waits shown with a message (W-5); its
//! name and compaction (C-2, C-3); and the builder's conversation hooks.

use std::sync::Arc;

use openprogram_actors::conversation::SessionView;
use openprogram_actors::conversation::{MessagesPage, MessagesQuery};
use openprogram_actors::conversation_hooks::{
    CompactionPolicy, Compactor, ConversationHooks, SessionNamer,
};
use openprogram_storage::{Compaction, MessageId, SessionId};

use crate::{Error, Result, Runtime, RuntimeBuilder};

impl Runtime {
    /// B-2..B-5: the session's conversation branches, in Needs attention, In progress and History.
    pub fn activity(&self, session: SessionId) -> Result<openprogram_actors::activity::Activity> {
        self.inner.service.activity(session)
    }

    /// C-1: the session's transcript (messages from the event log) as `query` asks.
    pub fn messages(&self, session: SessionId, query: &MessagesQuery) -> Result<MessagesPage> {
        self.inner.service.messages(session, query)
    }

    /// The session's name (given by the naming hook), foreground turn and compactions.
    pub fn session(&self, session: SessionId) -> Result<SessionView> {
        self.inner.service.session_view(session)
    }

    /// C-3: replaces the conversation's prefix through the turn whose user or assistant
    /// message is `through` (a turn that has ended) with a summary from the compactor
    /// (`RuntimeBuilder::compactor`). The messages it replaces stay readable
    /// (`MessagesQuery::originals`) until retention purges them; the graph, branches and
    /// Activity do not change. Asked again for the same turn, it answers the same compaction.
    pub async fn compact(&self, session: SessionId, through: MessageId) -> Result<Compaction> {
        self.inner.service.compact(session, through).await
    }

    /// B-6: the session's events after a global log position, each terminal outcome followed
    /// by a `session_reload` entry (only once it is committed).
    pub fn session_feed(
        &self,
        session: SessionId,
        after_position: u64,
        limit: usize,
    ) -> Result<openprogram_actors::branches::SessionFeed> {
        self.inner
            .service
            .session_feed(session, after_position, limit)
    }

    /// W-5: the pending waits to show with one assistant message of a session.
    pub async fn pending_waits(
        &self,
        session: SessionId,
        message: MessageId,
    ) -> Result<Vec<openprogram_actors::snapshot::WaitView>> {
        self.inner.service.pending_waits(session, message).await
    }
}

impl RuntimeBuilder {
    /// C-2: one foreground turn per session. An agent turn a person starts while another of
    /// its session has not ended follows its `when_busy` (`queue` by default: it runs after
    /// it). On unless turned off (`serve --parallel-turns`): with it off, the turns of a
    /// session run side by side and `when_busy` is refused.
    pub fn one_turn_per_session(mut self, on: bool) -> Self {
        self.parallel_turns = !on;
        self
    }

    /// C-2's follow-up: names a session without a name after each completed turn a person
    /// started, once the turn freed its session (`Runtime::session` shows the name).
    pub fn session_namer(mut self, namer: Arc<dyn SessionNamer>) -> Self {
        self.conversation_hooks.namer = Some(namer);
        self
    }

    /// C-3: writes the summary that replaces a prefix of a conversation
    /// (`Runtime::compact`; and after each completed turn, with `compaction_policy`).
    pub fn compactor(mut self, compactor: Arc<dyn Compactor>) -> Self {
        self.conversation_hooks.compactor = Some(compactor);
        self
    }

    /// E-8: the tokens a model request may hold, as estimated before it is made (the provider's
    /// count of the turn's last request, plus a token per four bytes added since). Past it, the
    /// `compactor` summarizes the branch's earlier turns (all but the `compaction_policy`'s newest
    /// `keep`); without one, or still past it, the oldest earlier turns are left out whole and the
    /// request says so. A turn's own progress is never cut. Default: no limit.
    pub fn context_budget(mut self, tokens: u64) -> Self {
        self.conversation_hooks.context_budget = Some(tokens);
        self
    }

    /// C-3: compact a branch after a completed turn once it shows more than `policy.past`
    /// entries, keeping the newest `policy.keep` turns (with a `compactor`).
    pub fn compaction_policy(mut self, policy: CompactionPolicy) -> Self {
        self.conversation_hooks.policy = Some(policy);
        self
    }

    /// The hooks, checked: a policy needs a compactor and room to keep turns.
    pub(crate) fn conversation_hooks(&self) -> Result<ConversationHooks> {
        if let Some(policy) = self.conversation_hooks.policy {
            if self.conversation_hooks.compactor.is_none() || policy.keep + 1 >= policy.past {
                return Err(Error::InvalidRequest(format!(
                    "a compaction policy needs a compactor and `past` above `keep + 1` ({policy:?})"
                )));
            }
        }
        Ok(self.conversation_hooks.clone())
    }
}
