//! What a reader sees of one execution (the snapshot of the HTTP contract, SPEC §6).

use openprogram_storage::{EventStore, ExecutionHead, ExecutionKind, MessageId, ReceiptStatus};
use serde::Serialize;

use crate::machine::projection::KEPT;
use crate::machine::{
    CommandContext, Contract, Machine, ManagedProcess, Present, Receipt, TurnState, WaitState,
};

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
    /// S-8: the newest `projection::KEPT` receipts, oldest first; every one is in the
    /// execution's events.
    pub receipts: Vec<ReceiptView>,
    /// How many receipts the execution has in all.
    pub receipts_total: u64,
    /// The newest `projection::KEPT` waits and live questions, oldest first.
    pub waits: Vec<WaitView>,
    /// How many waits and live questions it has in all.
    pub waits_total: u64,
    pub processes: Vec<ProcessView>,
    pub restart_deadline_ms: Option<u64>,
    /// K-7: its own restart window (`-1`, `0` or a duration), if it has one; the runtime's
    /// applies otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restart_window: Option<String>,
    /// A durable function's execution (F-2): what it runs and how far it got.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub function: Option<FunctionView>,
    /// J-1: a Job's standing with the resource queue. `job_id` is `execution_id`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<JobView>,
    /// E-6: the tokens its model calls used, summed, as their providers reported them.
    pub usage: crate::machine::ModelUsage,
    /// W-7: the grants its approvals gave (a tool, for this execution or the session).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub grants: Vec<GrantView>,
    /// C-2: as its session's foreground turn, how it was admitted and, while it waits for
    /// its session, behind which turn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_turn: Option<SessionTurnView>,
    /// E-8: what its model requests carry of its conversation, once it has earlier turns or
    /// made a request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<ContextView>,
}

/// C-2: an execution as its session's foreground turn.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionTurnView {
    /// How it was admitted: `queue`, `interrupt`, `immediate` (the session was free) or
    /// `paused` (admitted paused: it holds nothing until continued).
    pub strategy: String,
    /// It waits for its session: it runs nothing until it takes it.
    pub queued: bool,
    /// While it waits: the turn that holds the session now (from the session's record).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub behind: Option<openprogram_storage::ExecutionId>,
    /// While it waits: its place in the session's line (1: next).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub place: Option<usize>,
}

/// E-8: the context of an agent turn's model requests as it stands.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContextView {
    /// The newest compaction summary standing for the branch's oldest turns, if one does.
    pub summary: Option<openprogram_storage::MessageId>,
    /// Earlier entries of the branch left out for the context budget, oldest first.
    pub left_out: u32,
    /// The size of its last request, as its provider reported it (tokens).
    pub prompt_tokens: Option<u64>,
}

impl ContextView {
    fn of(turn: &TurnState) -> Option<Self> {
        if turn.context_pin.is_none() && turn.last_prompt.is_none() {
            return None;
        }
        let pin = turn.context_pin.clone().unwrap_or_default();
        Some(Self {
            summary: pin.summaries.last().map(|(message_id, _)| *message_id),
            left_out: pin.left_out,
            prompt_tokens: turn.last_prompt.map(|last| last.input_tokens),
        })
    }
}

/// W-7: a grant this execution may revoke: one its approvals gave for itself, or one of its
/// session's (whichever execution gave it).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GrantView {
    /// The approval (wait) that gave it: what `revoke` names.
    pub grant_id: openprogram_storage::WaitId,
    pub tool: String,
    /// `tool` (this execution) or `session`.
    pub scope: &'static str,
    pub revoked: bool,
    /// The execution whose approval gave it.
    pub granted_by: openprogram_storage::ExecutionId,
}

/// W-7: a session's record, read for its grants (`None`: none, or unreadable: a reader then
/// shows no session grant and offers no revoke of one).
pub fn session_of(
    store: &dyn EventStore,
    session_id: openprogram_storage::SessionId,
) -> Option<std::sync::Arc<openprogram_storage::SessionRecord>> {
    match store.session(session_id) {
        Ok(record) => record.map(std::sync::Arc::new),
        Err(error) => {
            tracing::warn!(%session_id, %error, "the session's record could not be read");
            None
        }
    }
}

/// The `job` object of a Job's snapshot (SPEC §6).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct JobView {
    pub job_id: openprogram_storage::ExecutionId,
    pub resources: std::collections::BTreeMap<String, u32>,
    /// The lease it holds now.
    pub lease_id: Option<openprogram_storage::LeaseId>,
    /// Its place in line while it waits (1: next), as the queue has it now.
    pub queue_position: Option<usize>,
    pub queued_at_ms: u64,
    pub queue_deadline_ms: Option<u64>,
    /// When it first got a lease.
    pub admitted_at_ms: Option<u64>,
    pub budget: openprogram_storage::JobBudget,
    /// What it used, under a lease only.
    pub budget_used: BudgetUsed,
    /// When the lease it holds was granted (what `budget_used.wall_ms` runs from).
    #[serde(skip)]
    pub lease_granted_at_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BudgetUsed {
    pub steps: u32,
    pub wall_ms: u64,
}

impl JobView {
    fn of(head: &ExecutionHead, machine: &Machine) -> Option<Self> {
        let job = machine.present.job.as_ref()?;
        Some(Self {
            job_id: head.execution_id,
            resources: job.spec.resources.iter().cloned().collect(),
            lease_id: job.lease.as_ref().map(|lease| lease.lease_id),
            queue_position: None,
            queued_at_ms: job.spec.queued_at_ms,
            queue_deadline_ms: job.spec.queue_deadline_ms,
            admitted_at_ms: job.admitted_at_ms,
            budget: job.budget,
            budget_used: BudgetUsed {
                steps: job.steps_used,
                wall_ms: job.wall_used_ms,
            },
            lease_granted_at_ms: job.lease.as_ref().map(|lease| lease.granted_at_ms),
        })
    }

    /// Completes the view at `now_ms` with the queue's `position` of the Job: the wall
    /// time of the lease it holds is charged up to now.
    pub fn at(&mut self, now_ms: u64, position: Option<usize>) {
        if let Some(granted) = self.lease_granted_at_ms {
            self.budget_used.wall_ms += now_ms.saturating_sub(granted);
        }
        self.queue_position = position;
    }
}

/// The `function` object of a function execution's snapshot (SPEC §6).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FunctionView {
    pub name: String,
    /// The revision it runs: the one it started with, or one it adopted (F-3).
    pub revision: u32,
    /// `keep_original` or `use_latest` (F-3).
    pub policy: &'static str,
    pub completed_steps: Vec<StepView>,
    /// How many steps have a committed result: where the function continues.
    pub next_position: u32,
    /// Non-empty only while a version switch waits on them (`version_conflict`).
    pub differences: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepView {
    pub step_id: String,
    pub status: &'static str,
    /// The revision that ran it (its provenance, kept across a switch).
    pub revision: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReceiptView {
    pub effect_id: openprogram_storage::EffectId,
    pub tool: String,
    pub status: &'static str,
    /// W-7: the approval or grant the call ran on, if it needed one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grant: Option<openprogram_storage::WaitId>,
}

/// A wait or live question (W-1..W-5).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WaitView {
    pub wait_id: openprogram_storage::WaitId,
    pub kind: &'static str,
    pub prompt: String,
    /// `open`, `submitted` (an answer accepted, not yet applied: only in logs written when
    /// accepting and deciding were two transitions), `answered`, `declined`, `expired` or
    /// `invalidated`.
    pub status: &'static str,
    pub answer: Option<String>,
    /// What an answer granted: `operation` (this one operation, never more) or
    /// `discussion` (a reply that approves nothing). Scopes never widen implicitly.
    pub scope: Option<&'static str>,
    /// W-6: what a question, form or permission request asks (`{"items": [...]}` or
    /// `{"permission", "resource"}`); absent for a plain approval or question.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request: Option<serde_json::Value>,
    /// W-8: when it expires (wall-clock ms), if it has a deadline.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// W-8: the expired wait a Continue opened this one again for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reopens: Option<openprogram_storage::WaitId>,
    /// The assistant message it belongs to: the execution's own `reply_message_id`, from
    /// its own record, never guessed (W-5).
    pub message_id: openprogram_storage::MessageId,
}

/// A managed process (P-1).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProcessView {
    pub process_id: openprogram_storage::ProcessId,
    /// `running`, `exited`, `stopped` or `lost`.
    pub state: &'static str,
    pub exit_code: Option<i32>,
    pub output_bytes: u64,
    /// The persisted tail of its output (lossy UTF-8).
    pub output_tail: String,
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

/// An execution at `version`, idle and holding its session, as a command is decided
/// against it when what counts is its history alone (a Fork or Retry, the controls offered
/// now). No session record: the session's grants are added by `with_session`.
pub(crate) fn idle_context(version: u64, contract: Contract, now_ms: u64) -> CommandContext {
    CommandContext {
        version,
        contract,
        busy: false,
        now_ms,
        session: None,
        holds_session: true,
    }
}

/// K-3: the controls `machine` accepts now at `version` in a runtime of `contract`.
pub(crate) fn capabilities(
    machine: &Machine,
    version: u64,
    contract: Contract,
) -> Vec<&'static str> {
    // Capabilities alone are read here: they do not depend on the time.
    let context = idle_context(version, contract, 0);
    let kinds = machine.capabilities(&context).into_iter();
    kinds.map(|kind| kind.as_str()).collect()
}

impl Snapshot {
    /// The snapshot of `head` and its machine, offering the controls accepted now (K-3) by
    /// a runtime of `contract`.
    pub fn of(head: &ExecutionHead, machine: &Machine, contract: Contract) -> Self {
        let (receipts_total, ended_waits_total, _) = machine.totals();
        let receipts: Vec<_> = machine.receipts.iter().collect();
        let waits = machine.waits();
        let own_grants = machine.present.waits.grants.iter();
        let Present {
            turn, processes, ..
        } = &machine.present;
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
            capabilities: capabilities(machine, head.version, contract),
            text: machine.text.clone(),
            usage: turn.usage,
            session_turn: turn.session_turn.as_ref().map(|turn| SessionTurnView {
                strategy: turn.strategy.clone(),
                queued: turn.queued,
                behind: None,
                place: None,
            }),
            context: ContextView::of(turn),
            // Its own tool grants; the session's are added by `with_session`.
            grants: own_grants
                .filter(|grant| !grant.session)
                .map(|grant| GrantView {
                    grant_id: grant.grant_id,
                    tool: grant.tool.clone(),
                    scope: "tool",
                    revoked: grant.revoked,
                    granted_by: head.execution_id,
                })
                .collect(),
            receipts: newest(&receipts)
                .iter()
                .map(|receipt| ReceiptView::of(receipt, machine))
                .collect(),
            receipts_total,
            waits_total: ended_waits_total + machine.present.waits.active.len() as u64,
            waits: newest(&waits)
                .iter()
                .map(|wait| WaitView::of(wait, head.reply_message_id))
                .collect(),
            processes: processes.iter().map(ProcessView::of).collect(),
            restart_deadline_ms: head
                .restart_intent
                .as_ref()
                .and_then(|intent| intent.deadline_ms),
            restart_window: (machine.present.run.restart_window).map(|window| window.to_string()),
            function: FunctionView::of(machine),
            job: JobView::of(head, machine),
        }
    }

    /// What its session's record holds for it: the session's grants, and `revoke` among the
    /// controls while one stands (W-7); while it waits for the session, the turn it waits
    /// behind and its place in line (C-2).
    pub fn with_session(mut self, session: Option<&openprogram_storage::SessionRecord>) -> Self {
        let Some(session) = session else {
            return self;
        };
        self.grants
            .extend(session.grants.iter().map(|grant| GrantView {
                grant_id: grant.grant_id,
                tool: grant.tool.clone(),
                scope: "session",
                revoked: grant.revoked,
                granted_by: grant.granted_by,
            }));
        let standing = session.grants.iter().any(|grant| !grant.revoked);
        if standing && !self.capabilities.contains(&"revoke") {
            self.capabilities.push("revoke");
        }
        let me = self.execution_id;
        let queued = self.state == "queued";
        if let Some(turn) = self
            .session_turn
            .as_mut()
            .filter(|turn| turn.queued && queued)
        {
            turn.behind = session.foreground.filter(|holder| *holder != me);
            turn.place = session
                .waiting
                .iter()
                .position(|id| *id == me)
                .map(|at| at + 1);
        }
        self
    }

    /// Adds what only the process records hold: exit codes and output tails. A record or
    /// tail that cannot be read leaves its fields empty; the state stands.
    pub fn with_process_records(mut self, store: &dyn EventStore) -> Self {
        for view in &mut self.processes {
            let Ok(Some(record)) = store.process(view.process_id) else {
                continue;
            };
            view.exit_code = record.exit_code;
            view.output_bytes = view.output_bytes.max(record.output_bytes);
            if let Some(Ok(Some(tail))) = record.output_chunks.last().map(|hash| store.blob(*hash))
            {
                view.output_tail = String::from_utf8_lossy(&tail).into_owned();
            }
        }
        self
    }
}

impl ReceiptView {
    fn of(receipt: &Receipt, machine: &Machine) -> Self {
        ReceiptView {
            effect_id: receipt.effect_id,
            tool: receipt.tool.to_string(),
            status: receipt_status(receipt.status),
            grant: machine
                .relied_on
                .iter()
                .find(|(effect_id, _)| *effect_id == receipt.effect_id)
                .map(|(_, grant)| *grant),
        }
    }
}

impl WaitView {
    /// A wait of the execution whose reply is `message_id`.
    fn of(wait: &WaitState, message_id: MessageId) -> Self {
        WaitView {
            wait_id: wait.wait_id,
            kind: wait.kind.as_str(),
            prompt: wait.prompt.clone(),
            status: wait.status.as_str(),
            answer: wait.answer.clone(),
            scope: wait.scope.map(openprogram_storage::AnswerScope::as_str),
            request: wait
                .request
                .as_deref()
                .and_then(|text| serde_json::from_str(text).ok()),
            deadline_ms: wait.deadline_ms,
            reopens: wait.reopens,
            message_id,
        }
    }
}

impl ProcessView {
    /// A process as the machine has it; its record adds the rest (`with_process_records`).
    fn of(process: &ManagedProcess) -> Self {
        ProcessView {
            process_id: process.process_id,
            state: process.state.as_str(),
            exit_code: None,
            output_bytes: process.output_bytes,
            output_tail: String::new(),
        }
    }
}

/// The newest `KEPT` of `items` (S-8: what a snapshot shows of a list that grows with the
/// history).
fn newest<T>(items: &[T]) -> &[T] {
    &items[items.len().saturating_sub(KEPT)..]
}

impl FunctionView {
    fn of(machine: &Machine) -> Option<Self> {
        let run = machine.present.function.as_ref()?;
        Some(Self {
            name: run.input.function.clone(),
            revision: run.active_revision,
            policy: run.policy.as_str(),
            completed_steps: newest(&machine.completed_steps)
                .iter()
                .map(|step| StepView {
                    step_id: step.step_id.clone(),
                    status: receipt_status(step.status),
                    revision: step.revision,
                })
                .collect(),
            next_position: run.steps_done,
            differences: run.differences.clone(),
        })
    }
}
