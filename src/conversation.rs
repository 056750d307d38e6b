//! The runtime's reads of a session's conversation: its branches (Activity, B-2..B-5), its
//! transcript (C-1), its feed of events (B-6) and the waits shown with a message (W-5); its
//! name and compaction (C-2, C-3). Split from `lib.rs`.

use openprogram_actors::conversation::{MessagesPage, MessagesQuery};
use openprogram_actors::conversation_follow_up::SessionView;
use openprogram_storage::{Compaction, MessageId, SessionId};

use crate::{Result, Runtime};

impl Runtime {
    /// B-2..B-5: the session's conversation branches, in Needs attention, In progress and
    /// History.
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
