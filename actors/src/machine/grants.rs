//! W-7, approval scopes, in the pure machine. An approval answered with scope `tool`
//! approves its tool for the rest of this execution; with `session`, for the session (the
//! grant lives in the session's record). A later `Ask` for a granted tool opens no wait:
//! `GrantUsed` records the grant relied on (a session grant with the record's version, which
//! the committer checks). Scopes never widen; a revoked grant never approves again.

use openprogram_storage::{
    AnswerScope, CommandId, Control, Event, ExecutionId, SessionGrant, SessionRecord, WaitId,
    WaitKind,
};

use super::{Machine, Refusal, WaitState, Waits};

pub use super::types::Grant;

impl WaitState {
    /// The tool an approval guards, if its request names one.
    pub fn tool(&self) -> Option<String> {
        let request = crate::wait_request::WaitRequest::from_text(self.request.as_deref()?);
        request.ok().flatten()?.tool
    }
}

impl Waits {
    /// The approval an `Ask` for `tool` gets without a new wait, if a grant covers it: this
    /// execution's, else the session's (as `session` stands, at its version).
    pub(crate) fn grant_for(&self, tool: &str, session: Option<&SessionRecord>) -> Option<Event> {
        let own = self.standing_own().find(|grant| grant.tool == tool);
        if let Some(grant) = own {
            return Some(Event::GrantUsed {
                grant_id: grant.grant_id,
                tool: tool.to_owned(),
                session_version: None,
            });
        }
        let session = session?;
        let grant = session
            .grants
            .iter()
            .find(|grant| !grant.revoked && grant.tool == tool)?;
        Some(Event::GrantUsed {
            grant_id: grant.grant_id,
            tool: tool.to_owned(),
            session_version: Some(session.version),
        })
    }

    /// W-7: `revoke` of a grant that stands: one of this execution's own, or one of its
    /// session's (`session`, as read for the command), whichever execution gave it.
    pub(crate) fn decide_revoke(
        &self,
        command_id: CommandId,
        grant_id: WaitId,
        session: Option<&SessionRecord>,
    ) -> Result<Vec<Event>, Refusal> {
        let own = self
            .grants
            .iter()
            .find(|grant| grant.grant_id == grant_id && !grant.session)
            .map(|grant| grant.revoked);
        let shared = session
            .and_then(|session| {
                session
                    .grants
                    .iter()
                    .find(|grant| grant.grant_id == grant_id)
            })
            .map(|grant| grant.revoked);
        match own.or(shared) {
            Some(true) => Err(Refusal::GrantRevoked { grant_id }),
            Some(false) => Ok(vec![Event::ControlApplied {
                command_id,
                control: Control::Revoke { grant_id },
            }]),
            None => Err(Refusal::UnknownGrant { grant_id }),
        }
    }

    /// Its own grants (of a tool, for this execution) that stand.
    fn standing_own(&self) -> impl Iterator<Item = &Grant> {
        self.grants
            .iter()
            .filter(|grant| !grant.session && !grant.revoked)
    }

    /// Whether a `revoke` has anything to revoke (K-3): a grant of its own, or one of the
    /// session's that stands.
    pub fn has_grant(&self, session: Option<&SessionRecord>) -> bool {
        let own = self.standing_own().next().is_some();
        own || session.is_some_and(|session| session.grants.iter().any(|grant| !grant.revoked))
    }

    /// An applied answer of a durable approval: with a `tool` or `session` scope, the grant
    /// (read before the answer's `WaitChanged`); any approving answer is what the next tool
    /// call relies on.
    pub(crate) fn note_approval(&mut self, control: &Control) {
        let Control::Answer { wait_id, scope, .. } = control else {
            return;
        };
        if *scope == AnswerScope::Discussion {
            return;
        }
        let Some(wait) = self.active.iter().find(|wait| {
            wait.wait_id == *wait_id && wait.status.is_pending() && wait.live.is_none()
        }) else {
            return;
        };
        // Only an approval approves an operation; a question's answer approves nothing.
        if !matches!(wait.kind, WaitKind::Approval | WaitKind::Permission) {
            return;
        }
        let tool = wait.tool();
        if matches!(scope, AnswerScope::Tool | AnswerScope::Session) {
            if let Some(tool) = &tool {
                self.grants.push(Grant {
                    grant_id: *wait_id,
                    tool: tool.clone(),
                    session: *scope == AnswerScope::Session,
                    revoked: false,
                });
            }
        }
        self.granted_next = Some(*wait_id);
        self.granted_tool = tool;
    }

    /// A grant revoked: it never approves again.
    pub(crate) fn apply_revoke(&mut self, grant_id: WaitId) {
        for grant in &mut self.grants {
            if grant.grant_id == grant_id {
                grant.revoked = true;
            }
        }
    }
}

impl Machine {
    /// W-7: `tool` and `session` scopes grant the tool an approval names; nothing else may
    /// take them (a question's answer approves no tool).
    pub(crate) fn check_scope(wait: &WaitState, scope: AnswerScope) -> Result<(), Refusal> {
        if !matches!(scope, AnswerScope::Tool | AnswerScope::Session) {
            return Ok(());
        }
        let approval = matches!(wait.kind, WaitKind::Approval | WaitKind::Permission);
        if approval && wait.live.is_none() && wait.tool().is_some() {
            return Ok(());
        }
        Err(Refusal::InvalidAnswer {
            wait_id: wait.wait_id,
            field: "scope".into(),
            message: format!(
                "`{}` grants the tool an approval names; this {} names none",
                scope.as_str(),
                wait.kind.as_str()
            ),
        })
    }

    /// The session's record once `control` (applied by this execution) is: a session grant
    /// given or revoked. `None`: the control does not change it.
    pub fn session_after(
        &self,
        control: &Control,
        execution_id: ExecutionId,
        session: SessionRecord,
    ) -> Option<SessionRecord> {
        match control {
            Control::Answer {
                wait_id,
                scope: AnswerScope::Session,
                ..
            } => {
                let tool = self.wait(*wait_id)?.tool()?;
                let mut after = session;
                if !after.grants.iter().any(|grant| grant.grant_id == *wait_id) {
                    after.grants.push(SessionGrant {
                        grant_id: *wait_id,
                        tool,
                        granted_by: execution_id,
                        revoked: false,
                    });
                }
                Some(after)
            }
            Control::Revoke { grant_id } => {
                if !session
                    .grants
                    .iter()
                    .any(|grant| grant.grant_id == *grant_id)
                {
                    return None;
                }
                let mut after = session;
                for grant in &mut after.grants {
                    if grant.grant_id == *grant_id {
                        grant.revoked = true;
                    }
                }
                Some(after)
            }
            _ => None,
        }
    }
}
