//! What a reader sees of one execution (the snapshot of the HTTP contract, SPEC §6).

use openprogram_storage::{ExecutionHead, ExecutionKind, ReceiptStatus};
use serde::Serialize;

use crate::execution::machine::Machine;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Snapshot {
    pub execution_id: openprogram_storage::ExecutionId,
    pub session_id: openprogram_storage::SessionId,
    pub run_id: openprogram_storage::RunId,
    pub parent_execution_id: Option<openprogram_storage::ExecutionId>,
    pub turn_id: openprogram_storage::TurnId,
    pub user_message_id: openprogram_storage::MessageId,
    pub reply_message_id: openprogram_storage::MessageId,
    pub kind: &'static str,
    pub state: &'static str,
    pub pause_reason: Option<String>,
    pub version: u64,
    /// The fencing epoch of the current attempt.
    pub attempt: u64,
    pub capabilities: Vec<&'static str>,
    pub text: String,
    pub receipts: Vec<ReceiptView>,
    /// Waits and processes arrive with issue 6; always empty today.
    pub waits: Vec<serde_json::Value>,
    pub processes: Vec<serde_json::Value>,
    pub restart_deadline_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReceiptView {
    pub effect_id: openprogram_storage::EffectId,
    pub tool: String,
    pub status: &'static str,
}

pub fn receipt_status(status: ReceiptStatus) -> &'static str {
    match status {
        // Dispatched and not yet confirmed: to a reader its outcome is unknown (the HTTP
        // contract has no "dispatched").
        ReceiptStatus::Dispatched => "unknown",
        ReceiptStatus::Confirmed => "confirmed",
        ReceiptStatus::Failed => "failed",
        ReceiptStatus::NotStarted => "not_started",
        ReceiptStatus::Unknown => "unknown",
        ReceiptStatus::NotApplied => "not_applied",
    }
}

impl Snapshot {
    pub fn of(head: &ExecutionHead, machine: &Machine) -> Self {
        Self {
            execution_id: head.execution_id,
            session_id: head.session_id,
            run_id: head.run_id,
            parent_execution_id: head.parent_execution_id,
            turn_id: head.turn_id,
            user_message_id: head.user_message_id,
            reply_message_id: head.reply_message_id,
            kind: match head.kind {
                ExecutionKind::AgentTurn => "agent",
                ExecutionKind::Job => "job",
                ExecutionKind::Function => "function",
            },
            state: head.state.as_str(),
            pause_reason: head.pause_reason.clone(),
            version: head.version,
            attempt: head.fencing_epoch,
            capabilities: machine.capabilities(),
            text: machine.text.clone(),
            receipts: machine
                .receipts
                .iter()
                .map(|(effect_id, (tool, status))| ReceiptView {
                    effect_id: *effect_id,
                    tool: tool.clone(),
                    status: receipt_status(*status),
                })
                .collect(),
            waits: Vec::new(),
            processes: Vec::new(),
            restart_deadline_ms: head
                .restart_intent
                .as_ref()
                .and_then(|intent| intent.deadline_ms),
        }
    }
}
