//! The machine's history (`Machine` beside its `Present`): what each
//! committed event adds to it — receipts, context turns, results, decided commands, fork
//! points — read from the present as it was before the event, and ended waits moved out of
//! the present. Pure, like the rest of the machine.

use openprogram_storage::{
    EffectId, Event, ExecutionState as Status, ReceiptStatus, VersionPolicy,
};

use super::{FunctionInput, Machine, Turn, WaitState};

impl Machine {
    /// The wait or live question `wait_id`, pending or ended.
    pub fn wait(&self, wait_id: openprogram_storage::WaitId) -> Option<&WaitState> {
        let active = self.present.waits.active.iter();
        active
            .chain(&self.ended_waits)
            .find(|wait| wait.wait_id == wait_id)
    }

    /// The history an event adds (a model decision's turn aside), read from the present as
    /// it was before the event: the call a result finishes, the wait an answer resolves.
    pub(crate) fn record(&mut self, event: &Event, seq: u64) {
        match event {
            Event::StateChanged {
                state: Status::Failed,
                reason,
            } if self.text.is_empty() => self.text.clone_from(reason),
            Event::CommandRejected { command_id, .. } => {
                self.decided_commands.insert(*command_id);
            }
            Event::ControlApplied {
                command_id,
                control,
            } => {
                self.decided_commands.insert(*command_id);
                self.record_control(control);
            }
            Event::ModelDecided { effect_id, .. } => {
                self.receipts.model(*effect_id, ReceiptStatus::Confirmed);
            }
            Event::ModelFailed { effect_id, error } => {
                self.receipts.model(*effect_id, ReceiptStatus::Failed);
                self.text.clone_from(error);
            }
            Event::ToolDispatched {
                effect_id, tool, ..
            } => {
                self.receipts
                    .tool(*effect_id, tool, ReceiptStatus::Dispatched);
                // The intent is durable: no fork starts before it.
                self.dispatched_externals.insert(*effect_id);
                self.fork_points
                    .retain(|point| point.next_effect != Some(*effect_id));
            }
            Event::ToolFinished {
                effect_id,
                status,
                output,
            } => self.record_tool_finished(*effect_id, *status, output),
            // W-7: a grant approved it: the provider is told as of an approval.
            Event::GrantUsed { tool, grant_id, .. } => {
                std::sync::Arc::make_mut(&mut self.context).push(Turn::WaitResolved {
                    prompt: format!("approval for {tool}"),
                    status: openprogram_storage::WaitStatus::Answered,
                    answer: Some(format!("granted by {grant_id}")),
                    discussion: false,
                });
            }
            Event::Replied { text } => self.text.clone_from(text),
            Event::Forked { state, .. } => self.record_forked(state),
            Event::CheckpointPublished { .. } => self.note_fork_point(seq),
            Event::RevisionAdopted { converted, .. } => {
                self.converted_outputs.extend(converted.iter().cloned());
            }
            Event::WorkflowCalled {
                call_id,
                function,
                revision,
                input,
            } => {
                let call = FunctionInput {
                    function: function.clone(),
                    revision: *revision,
                    // Written by `ctx.workflow` from a value: reads back; else nothing to
                    // reconcile with (an operator decides).
                    input: serde_json::from_str(input).unwrap_or(serde_json::Value::Null),
                    policy: VersionPolicy::KeepOriginal,
                    identity: String::new(),
                    called_by: None,
                };
                self.nested_calls.insert(call_id.clone(), call);
            }
            Event::StepStarted { step_id, effect_id } => {
                self.receipts
                    .tool(*effect_id, step_id, ReceiptStatus::Dispatched);
            }
            Event::StepFinished {
                step_id,
                effect_id,
                status,
                output,
            } => {
                self.receipts.tool(*effect_id, step_id, *status);
                self.step_completed(step_id, *effect_id, *status, output);
            }
            _ => {}
        }
    }

    /// A tool call's outcome: its result enters the context, or, `Unknown`, it waits for
    /// reconciliation with nothing in the context. W-7: the receipt of a call that ran
    /// on an approval or grant keeps it.
    fn record_tool_finished(&mut self, effect_id: EffectId, status: ReceiptStatus, output: &str) {
        let pending = self.present.calls.pending_tool.as_ref();
        let granted = pending
            .filter(|pending| pending.effect_id == effect_id)
            .and_then(|pending| pending.grant);
        let tool = pending.map(|pending| pending.tool.clone());
        if let Some(grant) = granted {
            if !self
                .relied_on
                .iter()
                .any(|(effect, _)| *effect == effect_id)
            {
                self.relied_on.push((effect_id, grant));
            }
        }
        if status == ReceiptStatus::Unknown {
            if let Some(tool) = tool {
                self.receipts.tool(effect_id, &tool, status);
            }
            return;
        }
        let tool = tool.unwrap_or_default();
        self.receipts.tool(effect_id, &tool, status);
        std::sync::Arc::make_mut(&mut self.context).push(Turn::ToolResult {
            tool,
            status,
            output: output.to_owned(),
        });
    }

    /// Waits that ended leave the present for the history: they never change again.
    pub(crate) fn retire_waits(&mut self) {
        let active = &self.present.waits.active;
        if active.iter().all(|wait| wait.status.is_pending()) {
            return;
        }
        let (pending, ended) = std::mem::take(&mut self.present.waits.active)
            .into_iter()
            .partition(|wait| wait.status.is_pending());
        self.present.waits.active = pending;
        self.ended_waits.extend::<Vec<WaitState>>(ended);
    }
}
