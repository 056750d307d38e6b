//! The vocabulary of the execution state machine, pure data: what goes in (`Input`,
//! `Decision`s), what comes out (`Action`, `Next`, `Rejection`), the data it keeps about an
//! agent turn (apart from the rules, which import the machine), and `NextAction`.

use openprogram_storage::{
    AttemptId, CommandId, Control, EffectId, Event, ExecutionKind, OwnerId, ReceiptStatus,
    RevisionId, WaitStatus,
};
use serde::{Deserialize, Serialize};

pub use crate::command::CommandKind;

pub use super::decision::*;
pub use super::refusal::Refusal;
use super::wait_types::LiveOutcome;

/// How a tool behaves when a crash leaves its outcome unknown (E-2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// Safe to run again when no receipt exists.
    Idempotent,
    /// Recorded as dispatched before it runs; a crash after that leaves it `Unknown`.
    External,
}

/// The admission input of an agent turn: the user's message and, for the built-in
/// scripted provider, its script.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AgentInput {
    pub message: String,
    #[serde(default)]
    pub script: Vec<ScriptElement>,
    #[serde(default = "default_max_iterations")]
    pub max_iterations: u32,
}

/// One element of a script, kept as its JSON text: a turn holds its whole script for its
/// life, and a text is one allocation to make and free where a parsed value is a tree of
/// them. The provider reads the keys of the element it takes (`text`). Two
/// elements are equal when their texts are: the same value written with other whitespace
/// or key order is a different element (a replay reads back the text that was stored).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ScriptElement(Box<serde_json::value::RawValue>);

impl ScriptElement {
    pub fn new(value: &serde_json::Value) -> Result<Self, serde_json::Error> {
        serde_json::value::to_raw_value(value).map(Self)
    }

    /// An element from its JSON text; an error if it is not JSON.
    pub fn from_text(text: impl Into<String>) -> Result<Self, serde_json::Error> {
        serde_json::value::RawValue::from_string(text.into()).map(Self)
    }

    pub fn parse(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }

    /// The JSON text.
    pub fn text(&self) -> &str {
        self.0.get()
    }
}

impl From<serde_json::Value> for ScriptElement {
    fn from(value: serde_json::Value) -> Self {
        // A `Value` always writes valid JSON, so the fallback is never taken.
        Self::new(&value).unwrap_or_else(|_| Self(serde_json::value::RawValue::NULL.to_owned()))
    }
}

impl PartialEq for ScriptElement {
    fn eq(&self, other: &Self) -> bool {
        self.0.get() == other.0.get()
    }
}

pub(crate) fn default_max_iterations() -> u32 {
    50
}

/// What model calls used, as their provider reported it (E-6): tokens, and the retries of
/// failed tries (what the execution's retry budget is charged).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ModelUsage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    #[serde(default)]
    pub retries: u32,
}

impl ModelUsage {
    pub fn add(&mut self, other: ModelUsage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.retries = self.retries.saturating_add(other.retries);
    }
}

/// One entry of the committed context a provider decides from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Turn {
    Decided(Decision),
    ToolResult {
        tool: String,
        status: ReceiptStatus,
        output: String,
    },
    /// A durable wait was resolved (W-2): `answered` (with the answer), `declined`, or a
    /// discussion reply that decides nothing.
    WaitResolved {
        prompt: String,
        status: WaitStatus,
        answer: Option<String>,
        discussion: bool,
    },
    /// A steer text (K-2), where it arrived among the turns: it shapes work not yet run.
    Steer {
        text: String,
    },
}

/// E-8: which earlier turns of its branch a turn's model requests carry, as the turn fixed
/// it (`Event::ContextPinned`). Its branch's ended turns never change; this fixes the rest.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextPin {
    /// The compaction summaries standing for the branch's oldest turns, as they read when
    /// fixed: message id and text (the conversation record may drop one later).
    pub summaries: Vec<(openprogram_storage::MessageId, String)>,
    /// With summaries: the oldest turn of the branch after them (`None`: none after them).
    pub first_kept: Option<openprogram_storage::ExecutionId>,
    /// Earlier turns of the branch that had not ended, each counting through this seq.
    pub open: Vec<(openprogram_storage::ExecutionId, u64)>,
    /// How many of the oldest earlier entries are left out for the context budget.
    pub left_out: u32,
}

/// E-8: what the provider reported of the turn's last model request made under its
/// current `ContextPin` (a new pin forgets it): the budget's estimate starts from it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastPrompt {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

impl ContextPin {
    /// The event that fixes this pin.
    pub fn event(&self) -> openprogram_storage::Event {
        openprogram_storage::Event::ContextPinned {
            summaries: self.summaries.clone(),
            first_kept: self.first_kept,
            open: self.open.clone(),
            left_out: self.left_out,
        }
    }
}

/// One effect's receipt as the machine keeps it for inspection (the snapshot): what ran it
/// (`model` for a model call, else the tool's name) and its latest status. The durable
/// receipt is the event that recorded it (E-3).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Receipt {
    pub effect_id: EffectId,
    pub tool: std::borrow::Cow<'static, str>,
    pub status: ReceiptStatus,
}

/// An execution's receipts, in the order their effects were first recorded: a list, as a
/// map growing with the execution would cost every fold. One effect is in flight at a time
/// (no model call while a tool call is pending or unresolved), so a receipt that changes is
/// always the newest: recording compares the newest only (the R10 sim checks it).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Receipts(Vec<Receipt>);

impl Receipts {
    /// A model call's receipt: its effect id was drawn for that call (`Machine::next`).
    pub(crate) fn model(&mut self, effect_id: EffectId, status: ReceiptStatus) {
        self.record(effect_id, std::borrow::Cow::Borrowed("model"), status);
    }

    /// A tool call's receipt, new or updated.
    pub(crate) fn tool(&mut self, effect_id: EffectId, tool: &str, status: ReceiptStatus) {
        self.record(effect_id, std::borrow::Cow::Owned(tool.to_owned()), status);
    }

    fn record(
        &mut self,
        effect_id: EffectId,
        tool: std::borrow::Cow<'static, str>,
        status: ReceiptStatus,
    ) {
        let receipt = Receipt {
            effect_id,
            tool,
            status,
        };
        match self.0.last_mut().filter(|r| r.effect_id == effect_id) {
            Some(newest) => *newest = receipt,
            None => self.0.push(receipt),
        }
    }

    /// Puts back a receipt a projection kept (oldest first).
    pub(crate) fn restore(&mut self, receipt: Receipt) {
        self.0.push(receipt);
    }

    pub fn get(&self, effect_id: EffectId) -> Option<&Receipt> {
        self.0.iter().rev().find(|r| r.effect_id == effect_id)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Receipt> {
        self.0.iter()
    }
}

/// A tool call decided by the model and not yet finished.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PendingTool {
    pub effect_id: EffectId,
    pub tool: String,
    /// Shared with the decision in the context, and with every transition's plan.
    pub args: ToolArgs,
    /// A `ToolDispatched` event was committed for it.
    pub dispatched: bool,
    /// It was dispatched by an earlier attempt and has no outcome: it may or may not have
    /// taken effect, so it is never run again (E-4).
    pub uncertain: bool,
    /// The owner (runtime incarnation) of the attempt that dispatched it. A reconcile
    /// protocol may ask about it only once that owner is gone: an attempt of this very
    /// incarnation that was taken over may still be running it.
    pub dispatched_by: Option<OwnerId>,
    /// The attempt that dispatched it. A protocol that fences at the resource may answer
    /// for an effect of this incarnation only if a later attempt asks: the fence refuses
    /// only writes of older epochs, so the dispatching attempt itself cannot be fenced.
    #[serde(default)]
    pub dispatched_in: Option<AttemptId>,
    /// W-7: the approval or grant it runs on, if it needed one.
    #[serde(default)]
    pub grant: Option<openprogram_storage::WaitId>,
}

impl PendingTool {
    /// A decided call not dispatched yet.
    pub(crate) fn new(effect_id: EffectId, tool: String, args: ToolArgs) -> Self {
        Self {
            effect_id,
            tool,
            args,
            dispatched: false,
            uncertain: false,
            dispatched_by: None,
            dispatched_in: None,
            grant: None,
        }
    }
}

/// What the shell must do after an event is applied.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// The execution may take its next step (`next`).
    Advance,
    /// Stop the effect in flight (a Cancel was applied).
    AbortEffect,
    /// The execution reached a terminal state: release its actor.
    Finished,
    /// An effect's outcome is unknown: ask the tool's reconcile protocol, if it has one.
    Reconcile,
    /// The execution paused: its actor may be released once nothing is in flight.
    Park,
    /// An External tool's dispatch is committed: run it now, before anything else is taken
    /// from the mailbox, so a dispatched effect is always a started one.
    RunDispatched,
    /// A live question was resolved: hand the outcome to the call that asked (W-4).
    LiveResolved {
        wait_id: openprogram_storage::WaitId,
        outcome: LiveOutcome,
    },
    /// A managed process must be stopped (P-1, `stop_process`).
    StopProcess {
        process_id: openprogram_storage::ProcessId,
    },
    /// J-1: the Job waits in the resource queue (again): tell the queue.
    Enqueue,
    /// J-1: the Job left the queue without a lease (paused, cancelled, expired).
    Dequeue,
    /// J-2: the Job's lease is released, durably: the queue may lease it again.
    ReleaseLease {
        lease_id: openprogram_storage::LeaseId,
    },
    /// J-1: the Job holds a lease: its wall budget runs.
    LeaseHeld,
    /// W-8: a durable wait expires at `deadline_ms` (wall clock) unless resolved first.
    WatchDeadline {
        wait_id: openprogram_storage::WaitId,
        deadline_ms: u64,
    },
    /// W-8: a wait with a deadline was resolved before it: its timer goes.
    UnwatchDeadline {
        wait_id: openprogram_storage::WaitId,
    },
}

/// An input the execution refuses, with the controls it offers now (K-3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub refusal: Refusal,
    pub capabilities: Vec<CommandKind>,
}

impl Rejection {
    /// The stable code of the refusal (`Refusal::code`).
    pub fn code(&self) -> &'static str {
        self.refusal.code()
    }

    /// What a person reads: why, and what the execution offers instead.
    pub fn reason(&self) -> String {
        if let Refusal::Invalid(reason) = &self.refusal {
            return reason.clone();
        }
        let offered: Vec<&str> = self.capabilities.iter().map(|kind| kind.as_str()).collect();
        format!("{}; available: [{}]", self.refusal, offered.join(", "))
    }
}

/// What a command is decided against besides the machine: the facts only the shell knows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandContext {
    /// The execution's version now (K-4).
    pub version: u64,
    /// The contract this runtime runs: Fork and Retry need the execution's own (K-2).
    pub contract: Contract,
    /// An effect is in flight: a Pause waits for it, a Cancel aborts it.
    pub busy: bool,
    /// The wall clock now: a Job's budget is charged by it (J-1), a wait's deadline passes
    /// by it (W-8).
    pub now_ms: u64,
    /// W-7: the session's record as read for this command: a session grant can be revoked
    /// from any execution of the session. `None`: not read (no session grant offered).
    pub session: Option<std::sync::Arc<openprogram_storage::SessionRecord>>,
    /// C-2: it holds its session (or is no foreground turn): a Continue runs it; else the
    /// Continue queues it for its session.
    pub holds_session: bool,
}

/// K-2: the contract a runtime runs: the revision of its provider, model, system text and
/// tools (their names, how each recovers, their descriptions and parameters), and the
/// revision a build before it derived from the tools alone. An execution recorded under
/// either runs here as it was admitted; any other ran another contract.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Contract {
    pub revision: RevisionId,
    pub legacy: RevisionId,
}

impl Contract {
    /// A contract with no earlier derivation (a test's).
    pub fn of(revision: RevisionId) -> Self {
        Self {
            revision,
            legacy: revision,
        }
    }

    /// Whether an execution of `kind` recorded under `revision` runs the contract it was
    /// admitted with. A durable function's runs no model and no tool: its code is judged by
    /// its own identity (F-3, F-7), never by this.
    pub fn runs(&self, kind: ExecutionKind, revision: RevisionId) -> bool {
        kind == ExecutionKind::Function || revision == self.revision || revision == self.legacy
    }
}

/// A command the machine accepted, and what it leads to.
#[derive(Debug, Clone, PartialEq)]
pub enum Accepted {
    /// A control of this execution, resolved (the wait or effect it names), and its events
    /// (`ControlApplied` first).
    Control {
        control: Control,
        events: Vec<Event>,
    },
    /// K-2: a new child from this saved point; nothing of this execution changes.
    Fork { checkpoint_seq: u64 },
    /// K-2: a new child from the admission input.
    Retry,
}

/// What a partial machine's history leaves out, by part: how many items older than those
/// it holds. All zero for a complete machine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Dropped {
    pub receipts: u64,
    pub ended_waits: u64,
    pub completed_steps: u64,
    pub fork_points: u64,
    pub context: u64,
}

/// A checkpoint a fork may start from (K-2), and the effect its next step would run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ForkPoint {
    pub checkpoint_seq: u64,
    pub next_effect: Option<EffectId>,
}

/// What a running, idle execution does next.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Persist these events first.
    Persist(Vec<Event>),
    /// Ask the provider for a decision under this effect id.
    CallModel { effect_id: EffectId },
    /// Run the pending tool.
    RunTool(PendingTool),
    /// Run the durable function's body (F-1): from the start, its committed steps read back.
    RunFunction,
    /// Nothing to do (not running, or waiting for an effect).
    Idle,
}

/// An input for `decide`.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    ModelDecided {
        effect_id: EffectId,
        decision: Decision,
    },
    ModelFailed {
        effect_id: EffectId,
        error: String,
    },
    ToolFinished {
        effect_id: EffectId,
        status: ReceiptStatus,
        output: String,
    },
    /// A running tool asks a live question (W-4).
    AskLive {
        wait_id: openprogram_storage::WaitId,
        prompt: String,
        /// W-6: what it asks, structured (canonical JSON text).
        request: Option<String>,
        binding: openprogram_storage::LiveBinding,
    },
}

/// The checkpoint's next action, as JSON text (`{"next": "tool", ...}`), serialized from
/// borrowed parts on every transition. It names the action; what the action needs (a tool
/// call's arguments) is in the decision event before the checkpoint, so the head, written
/// with every transition, does not carry it twice.
#[derive(serde::Serialize)]
#[serde(tag = "next", rename_all = "lowercase")]
pub(crate) enum NextAction<'a> {
    None,
    Wait {
        #[serde(skip_serializing_if = "Option::is_none")]
        wait_id: Option<openprogram_storage::WaitId>,
    },
    Tool {
        effect_id: EffectId,
        tool: &'a str,
    },
    Model {
        iterations: u32,
    },
    /// A durable function continues at its step `next_position` (0-based).
    Function {
        next_position: u32,
    },
}

/// The effect id of the tool call a model decision made: derived, so a replay finds the same
/// id (UUID v5 of the decision's id).
pub fn tool_effect(decision: EffectId) -> EffectId {
    EffectId::from_uuid(uuid_v5(decision.as_uuid(), b"tool"))
}

/// A command id the runtime derives for its own command (from `of`, `tag` and `at`), so
/// the command is decided once however often it is sent.
pub fn derived_command_id(of: &uuid::Uuid, tag: &[u8], at: u64) -> CommandId {
    CommandId::from_uuid(uuid::Uuid::new_v5(of, &[tag, &at.to_be_bytes()].concat()))
}

/// `uuid::Uuid::new_v5`, with a SHA-1 that uses the CPU's SHA instructions where it has them.
fn uuid_v5(namespace: &uuid::Uuid, name: &[u8]) -> uuid::Uuid {
    use sha1::Digest;
    let mut hasher = sha1::Sha1::new();
    hasher.update(namespace.as_bytes());
    hasher.update(name);
    let hash = hasher.finalize();
    let mut bytes = [0; 16];
    bytes.copy_from_slice(&hash[..16]);
    uuid::Builder::from_sha1_bytes(bytes).into_uuid()
}

/// Arguments may nest this deep: the decision text adds two levels, and serde_json reads back
/// at most 128.
pub(crate) const DECISION_ARGS_DEPTH_MAX: usize = 100;

/// Why a decision cannot be recorded, if it cannot: its text must read back as the same
/// decision on replay, so arguments nested deeper than `DECISION_ARGS_DEPTH_MAX` are refused.
pub(crate) fn unreadable(decision: &Decision) -> Option<String> {
    if let Some(Err(error)) = decision.wait_spec() {
        return Some(error);
    }
    let Decision::Tool { args, .. } = decision else {
        return None;
    };
    (nesting(args.get()) > DECISION_ARGS_DEPTH_MAX)
        .then(|| format!("the tool arguments nest deeper than {DECISION_ARGS_DEPTH_MAX} levels"))
}

/// How deep arrays and objects nest in a JSON text (1 for `[]`, 0 for a string), read in one
/// pass over its bytes without building anything. Every tool decision is checked, and its
/// arguments are mostly string contents: those are skipped with `memchr` to the next quote or
/// backslash, not looked at byte by byte.
pub(crate) fn nesting(json: &str) -> usize {
    let bytes = json.as_bytes();
    let (mut depth, mut deepest, mut at) = (0usize, 0usize, 0usize);
    while let Some(byte) = bytes.get(at) {
        at += 1;
        match byte {
            b'"' => loop {
                let rest = bytes.get(at..).unwrap_or_default();
                match memchr::memchr2(b'"', b'\\', rest) {
                    // An escape: the character after the backslash is text, whatever it is.
                    Some(offset) if rest[offset] == b'\\' => at += offset + 2,
                    Some(offset) => {
                        at += offset + 1;
                        break;
                    }
                    // An unterminated string: nothing after it counts.
                    None => return deepest,
                }
            },
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;

    /// E-3/E-4: a replay derives the tool effect id that stored receipts and dispatches
    /// name, so the derivation is UUID v5 of the decision's id, exactly.
    #[test]
    fn e4_a_tool_effect_id_is_the_uuid_v5_of_its_decision() {
        for _ in 0..1000 {
            let decision = EffectId::from_uuid(uuid::Uuid::new_v4());
            let expected = uuid::Uuid::new_v5(decision.as_uuid(), b"tool");
            assert_eq!(tool_effect(decision).as_uuid(), &expected, "{decision}");
        }
        // Computed elsewhere (Python's uuid.uuid5), so a change to both sides shows too.
        let known = [
            (
                "00000000-0000-0000-0000-000000000000",
                "3beb8406-b768-5d7f-8084-a1d99f93c655",
            ),
            (
                "0190c8a2-7b1e-7c3d-9f00-123456789abc",
                "c1d262c7-36ca-525c-ae2a-7e299b8b9dd2",
            ),
        ];
        for (decision, tool) in known {
            let decision = uuid::Uuid::parse_str(decision).expect("a uuid");
            let derived = tool_effect(EffectId::from_uuid(decision));
            assert_eq!(derived.as_uuid().to_string(), tool);
        }
    }
}

/// A grant this execution gave (W-7): an approval answered for its tool, for this execution
/// or (`session`) the session.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Grant {
    /// The approval that gave it.
    pub grant_id: openprogram_storage::WaitId,
    pub tool: String,
    pub session: bool,
    pub revoked: bool,
}

/// C-2: what the machine knows of its execution as a session's foreground turn.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionTurn {
    /// How it was admitted: `queue`, `interrupt`, `immediate` (the session was free) or
    /// `paused` (admitted paused: it holds nothing until continued).
    pub strategy: String,
    /// It waits for its session: it runs nothing until it takes it.
    pub queued: bool,
}
