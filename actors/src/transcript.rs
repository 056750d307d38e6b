//! C-1: the transcript read model, pure — an execution's events folded into the messages a
//! conversation shows: its user message and its assistant message, whose blocks are what the
//! model produced (reasoning, text beside a tool call), the tool calls with their receipts,
//! a durable function's steps, steering as it arrived, and the waits the turn opened with
//! their outcome, in the order they were committed. Built from the event log alone; nothing
//! is stored for it. How pages are read is in `conversation.rs`.

use openprogram_storage::{
    AnswerScope, Control, EffectId, Event, EventEnvelope, ExecutionHead, ExecutionId,
    ExecutionKind, MessageId, ReceiptStatus, WaitId,
};
use serde::Serialize;
use serde_json::Value;

use crate::machine::{tool_effect, Decision};

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Message {
    pub message_id: MessageId,
    /// The message it answers (B-1): a user message's is the admission's parent message, an
    /// assistant message's its user message.
    pub parent_id: Option<MessageId>,
    /// `user` or `assistant`.
    pub role: &'static str,
    /// The execution whose admission (user) or reply (assistant) it is.
    pub execution_id: ExecutionId,
    pub at_ms: u64,
    /// The user's request, or the assistant's reply (empty until it replied; a failure's
    /// reason is in its `error` block).
    pub text: String,
    /// The execution's state (assistant messages).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<&'static str>,
    /// What the assistant message holds, oldest first (none for a user message).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub blocks: Vec<Block>,
    /// Set when the blocks stop short of the execution's end: read on from this seq
    /// (`execution` and `after_seq` of the messages query).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub more_after_seq: Option<u64>,
    /// A fork's reply: the execution and checkpoint it continues (its first blocks are the
    /// original's up to that point, marked `inherited`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkedFrom>,
    /// C-3, a `summary` message: the messages it stands in for, oldest first (they keep
    /// their place on the graph: a message after them still names its parent among them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub replaces: Vec<MessageId>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ForkedFrom {
    pub execution_id: ExecutionId,
    pub checkpoint_seq: u64,
}

/// One part of an assistant message.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Block {
    /// The seq of the event that made it.
    pub seq: u64,
    /// Shown on a fork's branch from the original's history.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub inherited: bool,
    #[serde(flatten)]
    pub body: BlockBody,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BlockBody {
    Reasoning {
        text: String,
    },
    /// What the model said beside a tool call.
    Text {
        text: String,
    },
    ToolCall {
        effect_id: EffectId,
        tool: String,
        args: Value,
        /// Its receipt once it has one: `{status, output}`.
        receipt: Option<Receipt>,
        /// W-7: the approval or grant it ran on, if it needed one.
        #[serde(skip_serializing_if = "Option::is_none")]
        grant: Option<WaitId>,
    },
    /// W-7: an approval given by a grant, without a wait.
    Grant {
        grant_id: WaitId,
        tool: String,
        /// `tool` (this execution's grant) or `session`.
        scope: &'static str,
    },
    /// A durable function's step.
    Step {
        step_id: String,
        effect_id: EffectId,
        receipt: Option<Receipt>,
    },
    Wait {
        wait_id: WaitId,
        kind: &'static str,
        prompt: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        request: Option<Value>,
        status: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        answer: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        scope: Option<&'static str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        deadline_ms: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        reopens: Option<WaitId>,
    },
    /// Steering text, where it arrived.
    Steer {
        text: String,
    },
    /// A model error (E-6).
    Error {
        text: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Receipt {
    pub status: &'static str,
    pub output: String,
}

impl ForkedFrom {
    /// The fork an event starts, if it is a `Forked`.
    fn of(event: &Event) -> Option<ForkedFrom> {
        match event {
            Event::Forked {
                from_execution_id,
                checkpoint_seq,
                ..
            } => Some(ForkedFrom {
                execution_id: *from_execution_id,
                checkpoint_seq: *checkpoint_seq,
            }),
            _ => None,
        }
    }
}

impl Receipt {
    fn new(status: ReceiptStatus, output: &str) -> Self {
        Receipt {
            status: crate::snapshot::receipt_status(status),
            output: output.to_owned(),
        }
    }
}

/// The user message of an execution, from its admission (`Admitted`, its first event).
pub fn user_message(head: &ExecutionHead, admitted: &EventEnvelope) -> Option<Message> {
    let Event::Admitted {
        kind,
        input,
        parent_message_id,
        ..
    } = &admitted.event
    else {
        return None;
    };
    Some(Message {
        message_id: head.user_message_id,
        parent_id: *parent_message_id,
        role: "user",
        execution_id: head.execution_id,
        at_ms: admitted.at_ms,
        text: request_text(*kind, input),
        state: None,
        blocks: Vec::new(),
        more_after_seq: None,
        forked_from: None,
        replaces: Vec::new(),
    })
}

/// What a person asked, from an admission's input: an agent turn's message, or a function's
/// name and input (the transcript's user message, the overview's `request`).
pub fn request_text(kind: ExecutionKind, input: &str) -> String {
    let parsed: Value = serde_json::from_str(input).unwrap_or(Value::Null);
    match kind {
        ExecutionKind::Function => {
            format!(
                "{} {}",
                parsed["function"].as_str().unwrap_or_default(),
                parsed["input"]
            )
        }
        _ => parsed["message"]
            .as_str()
            .map_or_else(|| input.to_owned(), str::to_owned),
    }
}

/// The assistant message of an execution, folded from `events` (its own, oldest first;
/// `inherited`: a fork's original's blocks up to its checkpoint, put first).
pub fn assistant_message(
    head: &ExecutionHead,
    events: &[EventEnvelope],
    inherited: Vec<Block>,
) -> Message {
    let mut fold = Fold {
        blocks: inherited,
        ..Fold::default()
    };
    for envelope in events {
        fold.event(envelope);
    }
    Message {
        message_id: head.reply_message_id,
        parent_id: Some(head.user_message_id),
        role: "assistant",
        execution_id: head.execution_id,
        at_ms: events.first().map_or(0, |first| first.at_ms),
        text: fold.text,
        state: Some(head.state.as_str()),
        blocks: fold.blocks,
        more_after_seq: None,
        forked_from: fold.forked_from,
        replaces: Vec::new(),
    }
}

/// A fork's original's blocks up to `checkpoint_seq`, marked inherited.
pub fn inherited_blocks(
    head: &ExecutionHead,
    events: &[EventEnvelope],
    checkpoint_seq: u64,
) -> Vec<Block> {
    let through = events.partition_point(|envelope| envelope.seq <= checkpoint_seq);
    let mut blocks = assistant_message(head, &events[..through], Vec::new()).blocks;
    for block in &mut blocks {
        block.inherited = true;
    }
    blocks
}

/// Where a fork started, if the execution is one: its `Forked` event.
pub fn forked_from(events: &[EventEnvelope]) -> Option<ForkedFrom> {
    events
        .iter()
        .find_map(|envelope| ForkedFrom::of(&envelope.event))
}

#[derive(Default)]
struct Fold {
    blocks: Vec<Block>,
    text: String,
    forked_from: Option<ForkedFrom>,
    /// W-7: the approval or grant the next tool call runs on, and the tool it names (as the
    /// machine keeps them: `Waits::granted_next`, `granted_tool`).
    granted_next: Option<WaitId>,
    granted_tool: Option<String>,
}

impl Fold {
    fn push(&mut self, seq: u64, body: BlockBody) {
        self.blocks.push(Block {
            seq,
            inherited: false,
            body,
        });
    }

    fn event(&mut self, envelope: &EventEnvelope) {
        let seq = envelope.seq;
        match &envelope.event {
            Event::ModelDecided {
                effect_id,
                decision,
            } => self.decided(seq, *effect_id, decision),
            Event::ModelFailed { error, .. } => {
                self.push(
                    seq,
                    BlockBody::Error {
                        text: error.clone(),
                    },
                );
            }
            Event::ToolFinished {
                effect_id,
                status,
                output,
            } => self.tool_finished(*effect_id, Receipt::new(*status, output)),
            Event::StepStarted { step_id, effect_id } => {
                self.step(seq, step_id, *effect_id, None);
            }
            Event::StepFinished {
                step_id,
                effect_id,
                status,
                output,
            } => self.step(
                seq,
                step_id,
                *effect_id,
                Some(Receipt::new(*status, output)),
            ),
            Event::WaitOpened {
                wait_id,
                kind,
                prompt,
                ..
            } => self.push(
                seq,
                BlockBody::Wait {
                    wait_id: *wait_id,
                    kind: kind.as_str(),
                    prompt: prompt.clone(),
                    request: None,
                    status: "open",
                    answer: None,
                    scope: None,
                    deadline_ms: None,
                    reopens: None,
                },
            ),
            Event::WaitDetails { wait_id, .. } | Event::WaitChanged { wait_id, .. } => {
                self.wait_changed(*wait_id, &envelope.event);
            }
            Event::GrantUsed {
                grant_id,
                tool,
                session_version,
            } => self.grant_used(seq, *grant_id, tool, session_version.is_some()),
            Event::ControlApplied { control, .. } => match control {
                Control::Answer {
                    wait_id,
                    answer,
                    scope,
                } => self.answered(*wait_id, answer, *scope),
                Control::Steer { text } => self.push(seq, BlockBody::Steer { text: text.clone() }),
                _ => {}
            },
            Event::Replied { text } => self.text.clone_from(text),
            event @ Event::Forked { .. } => self.forked_from = ForkedFrom::of(event),
            _ => {}
        }
    }

    /// A tool's receipt, on its call: by its effect id; a fork's first call runs under a
    /// fresh id: the call still waiting for its receipt.
    fn tool_finished(&mut self, effect_id: EffectId, receipt: Receipt) {
        let is_call = |block: &Block, exact: bool| match &block.body {
            BlockBody::ToolCall {
                effect_id: id,
                receipt,
                ..
            } => (exact && *id == effect_id) || (!exact && receipt.is_none()),
            _ => false,
        };
        let at = (self.blocks.iter().rposition(|block| is_call(block, true)))
            .or_else(|| self.blocks.iter().rposition(|block| is_call(block, false)));
        if let Some(BlockBody::ToolCall { receipt: slot, .. }) =
            at.map(|at| &mut self.blocks[at].body)
        {
            *slot = Some(receipt);
        }
    }

    /// A step started (no receipt) or finished: a finish lands on its start's block, or is
    /// a block of its own when its start is not among these events.
    fn step(&mut self, seq: u64, step_id: &str, effect_id: EffectId, receipt: Option<Receipt>) {
        if receipt.is_some() {
            let started = self
                .blocks
                .iter_mut()
                .rev()
                .find_map(|block| match &mut block.body {
                    BlockBody::Step {
                        effect_id: id,
                        receipt,
                        ..
                    } if *id == effect_id => Some(receipt),
                    _ => None,
                });
            if let Some(slot) = started {
                *slot = receipt;
                return;
            }
        }
        let step_id = step_id.to_owned();
        self.push(
            seq,
            BlockBody::Step {
                step_id,
                effect_id,
                receipt,
            },
        );
    }

    /// A wait's details, given after it opened (its request, deadline and the wait it
    /// reopens), or its new status, on its block.
    fn wait_changed(&mut self, wait_id: WaitId, event: &Event) {
        let Some(BlockBody::Wait {
            request,
            status,
            deadline_ms,
            reopens,
            ..
        }) = self.wait(wait_id)
        else {
            return;
        };
        match event {
            Event::WaitDetails {
                request: given,
                deadline_ms: until,
                reopens: again,
                ..
            } => {
                *request = given
                    .as_deref()
                    .and_then(|text| serde_json::from_str(text).ok());
                *deadline_ms = *until;
                *reopens = *again;
            }
            Event::WaitChanged { status: now, .. } => *status = now.as_str(),
            _ => {}
        }
    }

    /// A grant used instead of a wait: a block, and the grant the next tool call runs on.
    fn grant_used(&mut self, seq: u64, grant_id: WaitId, tool: &str, session: bool) {
        self.granted_next = Some(grant_id);
        self.granted_tool = Some(tool.to_owned());
        let scope = if session { "session" } else { "tool" };
        let tool = tool.to_owned();
        self.push(
            seq,
            BlockBody::Grant {
                grant_id,
                tool,
                scope,
            },
        );
    }

    /// An answer, on its wait; only an open approval's answer (not a discussion) approves
    /// the call after it.
    fn answered(&mut self, wait_id: WaitId, given: &str, granted: AnswerScope) {
        let mut approved = None;
        if let Some(BlockBody::Wait {
            answer,
            scope,
            kind,
            status,
            request,
            ..
        }) = self.wait(wait_id)
        {
            if matches!(*kind, "approval" | "permission") && *status == "open" {
                let tool = request
                    .as_ref()
                    .and_then(|request| request["tool"].as_str());
                approved = Some(tool.map(str::to_owned));
            }
            *answer = Some(given.to_owned());
            *scope = Some(granted.as_str());
        }
        if let Some(tool) = approved.filter(|_| granted != AnswerScope::Discussion) {
            self.granted_next = Some(wait_id);
            self.granted_tool = tool;
        }
    }

    fn decided(&mut self, seq: u64, effect_id: EffectId, text: &str) {
        let Ok(decision) = serde_json::from_str::<Decision>(text) else {
            return;
        };
        let grant = self.granted_next.take();
        let granted_tool = self.granted_tool.take();
        if let Decision::Tool { reasoning, .. } | Decision::Reply { reasoning, .. } = &decision {
            for block in reasoning {
                let text = block.clone();
                self.push(seq, BlockBody::Reasoning { text });
            }
        }
        match decision {
            Decision::Tool {
                tool, args, text, ..
            } => {
                if !text.is_empty() {
                    self.push(seq, BlockBody::Text { text });
                }
                let args = serde_json::from_str(args.get()).unwrap_or(Value::Null);
                let grant =
                    grant.filter(|_| granted_tool.as_ref().is_none_or(|named| *named == tool));
                self.push(
                    seq,
                    BlockBody::ToolCall {
                        effect_id: tool_effect(effect_id),
                        tool,
                        args,
                        receipt: None,
                        grant,
                    },
                );
            }
            // The wait an `Ask` opens is its own block (`WaitOpened`).
            Decision::Reply { .. } | Decision::Ask { .. } => {}
        }
    }

    fn wait(&mut self, wait_id: WaitId) -> Option<&mut BlockBody> {
        self.blocks
            .iter_mut()
            .rev()
            .find_map(|block| match &block.body {
                BlockBody::Wait { wait_id: id, .. } if *id == wait_id => Some(&mut block.body),
                _ => None,
            })
    }
}
