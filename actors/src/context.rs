//! E-8, pure: the context a model request carries, and the one form both provider APIs (and
//! the scripted provider's `digest`) are written from.
//!
//! A request carries its turn's branch: the earlier turns on the path from the root to the
//! turn's parent message (`Branch`: a compaction summary in place of the turns it replaced,
//! then each turn's user message, the model's decisions, the tool results and the steers
//! where they arrived), then the turn's own user message and committed progress. The
//! earlier turns have ended and never change, so a `Branch` is a persistent list: a turn's
//! branch is its parent's with one more entry, and every execution on it shares the rest.
//! Reading a branch from the store is `context_read.rs`.
//!
//! Everything here is a function of committed facts only, so a request regenerated after a
//! crash is the request made before it.

use std::sync::Arc;

use openprogram_storage::{ExecutionId, MessageId, ReceiptStatus, WaitStatus};

use crate::machine::{Decision, LastPrompt, Turn};

/// One earlier turn of a branch as a model is shown it.
#[derive(Debug, Clone, PartialEq)]
pub struct EarlierTurn {
    pub execution_id: ExecutionId,
    /// The message its user message answers: `Some` on the oldest turn read means the turns
    /// before it are gone (retention purged them).
    pub parent_message_id: Option<MessageId>,
    pub reply_message_id: MessageId,
    /// The user's message.
    pub message: String,
    /// Its committed context: decisions, results, resolved waits, steers.
    pub turns: Arc<Vec<Turn>>,
}

/// One entry of a branch: a compaction's summary, or an earlier turn.
#[derive(Debug, Clone, PartialEq)]
pub enum Earlier {
    Summary {
        message_id: MessageId,
        text: Arc<str>,
    },
    Turn(Arc<EarlierTurn>),
}

impl Earlier {
    /// The earlier turn it is, unless it is a summary.
    pub fn turn(&self) -> Option<&Arc<EarlierTurn>> {
        match self {
            Earlier::Turn(turn) => Some(turn),
            Earlier::Summary { .. } => None,
        }
    }

    /// The bytes of text it adds to a request, roughly (the context budget's estimate).
    fn bytes(&self) -> usize {
        match self {
            Earlier::Summary { text, .. } => text.len(),
            Earlier::Turn(turn) => {
                turn.message.len() + turn.turns.iter().map(turn_bytes).sum::<usize>()
            }
        }
    }
}

fn turn_bytes(turn: &Turn) -> usize {
    match turn {
        Turn::Decided(Decision::Tool {
            tool, args, text, ..
        }) => tool.len() + args.get().len() + text.len(),
        Turn::Decided(Decision::Reply { text, .. }) => text.len(),
        Turn::Decided(Decision::Ask { prompt, .. }) => prompt.len(),
        Turn::ToolResult { output, .. } => output.len(),
        Turn::WaitResolved { prompt, answer, .. } => {
            prompt.len() + answer.as_ref().map_or(0, String::len)
        }
        Turn::Steer { text } => text.len(),
    }
}

/// The earlier entries of a request's context, oldest first: a persistent list whose
/// extensions share it (`then` copies nothing).
#[derive(Debug, Clone, Default)]
pub struct Branch(Option<Arc<Node>>);

#[derive(Debug)]
struct Node {
    before: Branch,
    entry: Earlier,
    len: usize,
    bytes: usize,
}

impl Drop for Node {
    /// Dropped link by link, not recursively: a branch of many thousand turns would
    /// overflow the stack.
    fn drop(&mut self) {
        let mut next = self.before.0.take();
        while let Some(node) = next {
            next = match Arc::try_unwrap(node) {
                Ok(mut node) => node.before.0.take(),
                Err(_shared) => None,
            };
        }
    }
}

impl PartialEq for Branch {
    fn eq(&self, other: &Self) -> bool {
        self.entries() == other.entries()
    }
}

impl Branch {
    /// This branch with `entry` after its newest.
    pub fn then(&self, entry: Earlier) -> Branch {
        let bytes = self.bytes() + entry.bytes();
        Branch(Some(Arc::new(Node {
            before: self.clone(),
            entry,
            len: self.len() + 1,
            bytes,
        })))
    }

    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |node| node.len)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// The text it holds, in bytes, roughly.
    pub fn bytes(&self) -> usize {
        self.0.as_ref().map_or(0, |node| node.bytes)
    }

    /// Its entries, oldest first.
    pub fn entries(&self) -> Vec<&Earlier> {
        let mut entries = Vec::with_capacity(self.len());
        let mut at = self.0.as_deref();
        while let Some(node) = at {
            entries.push(&node.entry);
            at = node.before.0.as_deref();
        }
        entries.reverse();
        entries
    }

    /// The newest entry.
    pub fn newest(&self) -> Option<&Earlier> {
        self.0.as_deref().map(|node| &node.entry)
    }

    /// This branch without its `n` oldest entries (all of them, if it has fewer).
    pub fn without_oldest(&self, n: usize) -> Branch {
        if n == 0 {
            return self.clone();
        }
        let entries = self.entries();
        let kept = &entries[n.min(entries.len())..];
        kept.iter().fold(Branch::default(), |branch, entry| {
            branch.then((*entry).clone())
        })
    }
}

/// Bytes of text per token, for an estimate: English text and JSON run 3.5 to 4.5 with the
/// usual tokenizers. A request's size is known only from its provider's report.
const BYTES_PER_TOKEN: usize = 4;

/// The tokens a request would hold, estimated: what the provider reported of the turn's
/// last request (`last`, made under the turn's current pin) — its prompt, and its response,
/// which the next request holds — plus a token per four bytes of what the turn committed
/// after that response; without a report, a token per four bytes of all of it (the system
/// prompt and the tools offered not counted).
pub fn estimate_tokens(
    earlier: &Branch,
    message: &str,
    context: &[Turn],
    last: Option<LastPrompt>,
) -> u64 {
    let bytes = |turns: &[Turn]| turns.iter().map(turn_bytes).sum::<usize>();
    let tokens = |bytes: usize| (bytes / BYTES_PER_TOKEN) as u64;
    match last {
        Some(last) => {
            let since = context
                .iter()
                .rposition(|turn| matches!(turn, Turn::Decided(_)))
                .map_or(0, |at| at + 1);
            last.input_tokens + last.output_tokens + tokens(bytes(&context[since..]))
        }
        None => tokens(earlier.bytes() + message.len() + bytes(context)),
    }
}

/// What a request estimated past its context budget does first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OverBudget {
    /// The embedder's compactor summarizes the branch through this earlier turn.
    Compact { through: ExecutionId },
    /// The fewest oldest entries of the branch whose text covers the excess are left out,
    /// whole: never a part of a message, never a call without its result.
    Cut { entries: usize },
}

/// Whether a request of `estimate` tokens with the branch `earlier` fits `budget`, and if
/// not, what comes first. `compact_keep`: a compactor may summarize all but the newest this
/// many earlier turns (`None`: no compaction now). The turn's own progress is never cut: a
/// request over its budget without earlier turns goes as it is.
pub fn over_budget(
    budget: u64,
    estimate: u64,
    earlier: &Branch,
    compact_keep: Option<usize>,
) -> Option<OverBudget> {
    if estimate <= budget || earlier.is_empty() {
        return None;
    }
    let entries = earlier.entries();
    if let Some(keep) = compact_keep {
        let turns: Vec<ExecutionId> = entries
            .iter()
            .filter_map(|entry| Some(entry.turn()?.execution_id))
            .collect();
        if turns.len() > keep {
            return Some(OverBudget::Compact {
                through: turns[turns.len() - keep - 1],
            });
        }
    }
    let excess = estimate - budget;
    let mut covered = 0u64;
    let mut cut = 0;
    for entry in &entries {
        if covered >= excess {
            break;
        }
        covered += (entry.bytes() / BYTES_PER_TOKEN) as u64;
        cut += 1;
    }
    Some(OverBudget::Cut {
        entries: cut.max(1),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    User,
    Assistant,
}

impl Role {
    /// Its name in both APIs.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    Text(String),
    /// A tool call the model made; `id` pairs it with its result.
    ToolCall {
        id: String,
        name: String,
        arguments: String,
    },
    ToolResult {
        id: String,
        content: String,
        is_error: bool,
    },
}

/// One message: a role and its parts; consecutive parts of one role share a message.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub role: Role,
    pub parts: Vec<Part>,
}

/// The messages of a request, alternating roles: its branch (`earlier`, after the note of
/// the `left_out` entries), then its own turn: the user's `message` and its committed
/// `context`. `ModelRequest::messages` is the one caller.
pub fn conversation(
    earlier: &Branch,
    left_out: u32,
    message: &str,
    context: &[Turn],
) -> Vec<Message> {
    let mut writer = Writer::default();
    if left_out > 0 {
        writer.text(
            Role::User,
            format!(
                "[{left_out} earlier entries of this conversation are left out to fit the context budget.]"
            ),
        );
    }
    for entry in earlier.entries() {
        match entry {
            Earlier::Summary { text, .. } => writer.text(
                Role::User,
                format!("[A summary of the conversation so far]\n{text}"),
            ),
            Earlier::Turn(turn) => writer.turn(&turn.message, &turn.turns),
        }
    }
    writer.turn(message, context);
    writer.messages
}

/// Writes turns into messages, numbering tool calls across the whole conversation.
#[derive(Default)]
struct Writer {
    messages: Vec<Message>,
    /// Tool calls numbered so far.
    calls: u32,
    /// The call made last, while its result has not been written.
    open_call: Option<String>,
    /// Steers that arrived while a call ran: written after its result (a result must follow
    /// its call).
    deferred: Vec<String>,
}

impl Writer {
    fn turn(&mut self, message: &str, turns: &[Turn]) {
        self.close_call();
        self.text(Role::User, message.to_owned());
        for turn in turns {
            self.step(turn);
        }
    }

    fn step(&mut self, turn: &Turn) {
        match turn {
            Turn::Decided(Decision::Tool {
                tool, args, text, ..
            }) => {
                self.close_call();
                self.calls += 1;
                if !text.is_empty() {
                    self.text(Role::Assistant, text.clone());
                }
                let id = call_id(self.calls);
                self.open_call = Some(id.clone());
                self.push(
                    Role::Assistant,
                    Part::ToolCall {
                        id,
                        name: tool.clone(),
                        arguments: args.get().to_owned(),
                    },
                );
            }
            Turn::Decided(Decision::Reply { text, .. }) => {
                self.close_call();
                self.text(Role::Assistant, text.clone());
            }
            Turn::Decided(Decision::Ask { prompt, .. }) => {
                self.close_call();
                self.text(Role::Assistant, prompt.clone());
            }
            Turn::ToolResult { status, output, .. } => {
                let (content, is_error) = match status {
                    ReceiptStatus::Confirmed => (output.clone(), false),
                    ReceiptStatus::Failed => (output.clone(), true),
                    other => (format!("[{}] {output}", status_name(*other)), true),
                };
                // A result answers the call decided last (one call is in flight at a time).
                let id = self
                    .open_call
                    .take()
                    .unwrap_or_else(|| call_id(self.calls.max(1)));
                self.push(
                    Role::User,
                    Part::ToolResult {
                        id,
                        content,
                        is_error,
                    },
                );
                self.flush_deferred();
            }
            Turn::WaitResolved {
                prompt,
                status,
                answer,
                ..
            } => {
                self.close_call();
                let text = match (status, answer) {
                    (WaitStatus::Answered, Some(answer)) => format!("{prompt}\n{answer}"),
                    (WaitStatus::Answered, None) => format!("{prompt}\n[approved]"),
                    (status, _) => format!("{prompt}\n[{}]", wait_name(*status)),
                };
                self.text(Role::User, text);
            }
            Turn::Steer { text } => match self.open_call {
                Some(_) => self.deferred.push(text.clone()),
                None => self.text(Role::User, text.clone()),
            },
        }
    }

    /// A call whose turn ended before its result (cancelled, failed) gets one saying so:
    /// both APIs refuse a call without its result.
    fn close_call(&mut self) {
        if let Some(id) = self.open_call.take() {
            self.push(
                Role::User,
                Part::ToolResult {
                    id,
                    content: "[no result: the turn ended before the call finished]".into(),
                    is_error: true,
                },
            );
            self.flush_deferred();
        }
    }

    fn flush_deferred(&mut self) {
        for steer in std::mem::take(&mut self.deferred) {
            self.text(Role::User, steer);
        }
    }

    fn text(&mut self, role: Role, text: String) {
        self.push(role, Part::Text(text));
    }

    fn push(&mut self, role: Role, part: Part) {
        match self.messages.last_mut() {
            Some(last) if last.role == role => last.parts.push(part),
            _ => self.messages.push(Message {
                role,
                parts: vec![part],
            }),
        }
    }
}

/// `call00001`: nine letters and digits, which every API accepts (Mistral's demand exactly
/// that).
fn call_id(n: u32) -> String {
    format!("call{n:05}")
}

fn status_name(status: ReceiptStatus) -> &'static str {
    match status {
        ReceiptStatus::Confirmed => "confirmed",
        ReceiptStatus::Failed => "failed",
        ReceiptStatus::NotStarted => "not started",
        ReceiptStatus::Unknown => "outcome unknown",
        ReceiptStatus::NotApplied => "not applied",
        ReceiptStatus::Dispatched => "dispatched",
    }
}

fn wait_name(status: WaitStatus) -> String {
    format!("{status:?}").to_lowercase()
}

/// The messages as plain lines, one per part (`user: …`, `assistant: call echo {…}`,
/// `tool: …`): what the scripted provider's `digest` element replies, so a test can see what
/// a request held without a real model.
pub fn digest(messages: &[Message]) -> String {
    let mut lines = Vec::new();
    for message in messages {
        let role = message.role.as_str();
        for part in &message.parts {
            lines.push(match part {
                Part::Text(text) => format!("{role}: {text}"),
                Part::ToolCall {
                    id,
                    name,
                    arguments,
                } => format!("{role}: call {id} {name} {arguments}"),
                Part::ToolResult { id, content, .. } => format!("tool {id}: {content}"),
            });
        }
    }
    lines.join("\n")
}

#[cfg(test)]
#[path = "context_tests.rs"]
mod tests;
