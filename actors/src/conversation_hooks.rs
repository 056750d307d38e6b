//! The embedder's hooks on a conversation, and its context budget (E-8): naming a session after a turn ended
//! (C-2's follow-up work, run once the turn has freed its session) and summarizing a prefix
//! of a conversation (C-3's compaction). Both are optional; `serve` uses the two plain ones
//! here, which call no model.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use openprogram_storage::SessionId;

use crate::transcript::Message;

/// Names a session. Given the messages of a turn that just completed (its user message,
/// then its assistant message), answers a name, or `None` to leave the session unnamed (it
/// is asked again after the next turn). An `Err` is logged; nothing is written.
pub trait SessionNamer: Send + Sync + 'static {
    fn name(
        &self,
        session_id: SessionId,
        turn: Vec<Message>,
    ) -> BoxFuture<'static, Result<Option<String>, String>>;
}

/// Summarizes a prefix of a conversation: its messages as the transcript shows them, oldest
/// first (an earlier compaction's summary in place of what it replaced). An `Err` leaves the
/// conversation as it was.
pub trait Compactor: Send + Sync + 'static {
    fn summarize(
        &self,
        session_id: SessionId,
        prefix: Vec<Message>,
    ) -> BoxFuture<'static, Result<String, String>>;
}

/// When a completed turn compacts its branch on its own: once the branch shows more than
/// `past` entries (an execution's pair of messages, or a summary), everything but the
/// newest `keep` executions is replaced by a summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactionPolicy {
    pub past: usize,
    pub keep: usize,
}

/// The hooks a runtime was built with.
#[derive(Clone, Default)]
pub struct ConversationHooks {
    pub namer: Option<Arc<dyn SessionNamer>>,
    pub compactor: Option<Arc<dyn Compactor>>,
    /// Without one, compaction happens only when asked for (`Service::compact`).
    pub policy: Option<CompactionPolicy>,
    /// E-8: the tokens a model request may hold, estimated: past it, the compactor
    /// summarizes the branch, else its oldest turns are left out (`None`: no limit).
    pub context_budget: Option<u64>,
}

impl std::fmt::Debug for ConversationHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConversationHooks")
            .field("namer", &self.namer.is_some())
            .field("compactor", &self.compactor.is_some())
            .field("policy", &self.policy)
            .field("context_budget", &self.context_budget)
            .finish()
    }
}

/// Words of the first message a name keeps.
const NAME_WORDS_MAX: usize = 8;
/// Characters of each message an excerpt keeps.
const EXCERPT_CHARS_MAX: usize = 160;

/// Names a session after its first words: the user message's first eight.
#[derive(Debug, Clone, Copy, Default)]
pub struct FirstWords;

impl SessionNamer for FirstWords {
    fn name(
        &self,
        _session_id: SessionId,
        turn: Vec<Message>,
    ) -> BoxFuture<'static, Result<Option<String>, String>> {
        let name = turn
            .iter()
            .find(|message| message.role == "user")
            .map(|message| {
                let words: Vec<&str> = message.text.split_whitespace().collect();
                let mut name = words[..words.len().min(NAME_WORDS_MAX)].join(" ");
                if words.len() > NAME_WORDS_MAX {
                    name.push('…');
                }
                name
            })
            .filter(|name| !name.is_empty());
        futures::future::ready(Ok(name)).boxed()
    }
}

/// Summarizes by excerpt: each message's role and its first line, cut at 160 characters.
#[derive(Debug, Clone, Copy, Default)]
pub struct Excerpts;

impl Compactor for Excerpts {
    fn summarize(
        &self,
        _session_id: SessionId,
        prefix: Vec<Message>,
    ) -> BoxFuture<'static, Result<String, String>> {
        let mut summary = String::new();
        for message in &prefix {
            let line = message.text.lines().next().unwrap_or_default();
            let mut excerpt: String = line.chars().take(EXCERPT_CHARS_MAX).collect();
            if excerpt.len() < line.len() {
                excerpt.push('…');
            }
            let line = format!("{}: {excerpt}\n", message.role);
            if summary.len() + line.len() > openprogram_storage::conversation::SUMMARY_BYTES_MAX {
                break;
            }
            summary.push_str(&line);
        }
        futures::future::ready(Ok(summary)).boxed()
    }
}

/// The instruction a `ModelNamer` gives the model, before the turn's messages.
const NAME_PROMPT: &str = "Give this conversation a short title of at most eight words. \
Answer with the title alone, without quotes.";

/// Names a session by asking a model (the product document's optional model-generated
/// naming): one request holding the instruction and the first turn's messages, answered
/// with a title. Its answer is not recorded anywhere but as the name. A failure, or an
/// answer that is no text, leaves the first words (`FirstWords`).
#[derive(Clone)]
pub struct ModelNamer {
    provider: Arc<dyn crate::agent::Provider>,
}

impl std::fmt::Debug for ModelNamer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelNamer").finish_non_exhaustive()
    }
}

impl ModelNamer {
    pub fn new(provider: Arc<dyn crate::agent::Provider>) -> Self {
        Self { provider }
    }
}

impl SessionNamer for ModelNamer {
    fn name(
        &self,
        session_id: SessionId,
        turn: Vec<Message>,
    ) -> BoxFuture<'static, Result<Option<String>, String>> {
        use crate::agent::{AgentInput, Decision, ModelRequest};
        let mut message = String::from(NAME_PROMPT);
        for said in &turn {
            message.push_str(&format!("\n\n{}: {}", said.role, said.text));
        }
        let request = ModelRequest {
            execution_id: openprogram_storage::ExecutionId::new(),
            effect_id: openprogram_storage::EffectId::new(),
            input: Arc::new(AgentInput {
                message,
                ..AgentInput::default()
            }),
            context: Arc::default(),
            earlier: Default::default(),
            left_out: 0,
            iterations: 0,
            used: Default::default(),
            usage: Default::default(),
            deltas: Default::default(),
        };
        let asked = self.provider.decide(request);
        async move {
            match asked.await {
                Ok(Decision::Reply { text, .. }) if !text.trim().is_empty() => {
                    let title = text.trim().trim_matches(['"', '\'', '“', '”']).trim();
                    Ok(Some(title.to_owned()))
                }
                Ok(_) => FirstWords.name(session_id, turn).await,
                Err(error) => {
                    tracing::warn!(%session_id, %error, "the model named no session; its first words do");
                    FirstWords.name(session_id, turn).await
                }
            }
        }
        .boxed()
    }
}
