//! The pure machine's rules for restart recovery: resolving an
//! `unknown` effect by reconciliation, the cooperative pause of an orderly shutdown
//! and an execution's own restart window (K-7). Like the rest of the machine: no
//! actix, no sled, no clock.

use openprogram_storage::{
    Control, EffectId, Event, ExecutionId, ExecutionState as Status, PolicyRecord, ReceiptStatus,
    RestartIntent, RestartWindow,
};

use crate::machine::{
    state_changed, Action, Machine, PendingTool, Present, Refusal, Turn, RESTART_PAUSE_REASON,
};

/// K-7: the event that gives a new execution `execution_id` its own restart window, in its
/// admission (under a command id derived from it: no command asked for it).
pub(crate) fn window_at_start(execution_id: ExecutionId, restart_window: RestartWindow) -> Event {
    Event::ControlApplied {
        command_id: super::derived_command_id(execution_id.as_uuid(), b"restart window", 0),
        control: Control::SetExecutionPolicy {
            version_policy: None,
            restart_window,
        },
    }
}

/// K-7: the record a transition writes beside `events`, where recovery reads an execution's
/// own restart window: the newest one they set, if any. Every transition that sets one
/// carries it (an admission, a `set_policy`), whoever builds it.
pub fn policy_record<'a>(
    execution_id: ExecutionId,
    events: impl DoubleEndedIterator<Item = &'a Event>,
) -> Option<PolicyRecord> {
    events.rev().find_map(|event| match event {
        Event::ControlApplied {
            control: Control::SetExecutionPolicy { restart_window, .. },
            ..
        } => Some(PolicyRecord {
            execution_id,
            restart_window: *restart_window,
        }),
        _ => None,
    })
}

impl Machine {
    /// The events after a `reconcile` control's `ControlApplied`: it must name the effect
    /// awaiting reconciliation and resolve it `confirmed` or `not_applied`.
    pub(crate) fn decide_reconcile(
        &self,
        effect_id: EffectId,
        status: ReceiptStatus,
        output: &str,
    ) -> Result<Vec<Event>, Refusal> {
        if self.present.calls.unresolved_effect() != Some(effect_id) {
            return Err(Refusal::NotUnresolved { effect_id });
        }
        if !matches!(status, ReceiptStatus::Confirmed | ReceiptStatus::NotApplied) {
            return Err(Refusal::Invalid(
                "reconcile resolves an effect as confirmed or not_applied".into(),
            ));
        }
        // A function's step confirmed by hand: its output is the step's result, which the
        // body reads back as JSON (F-4).
        let unreadable = |output: &str| serde_json::from_str::<serde_json::Value>(output).is_err();
        if self.present.function.is_some()
            && status == ReceiptStatus::Confirmed
            && unreadable(output)
        {
            return Err(Refusal::Invalid(
                "a durable function's step confirmed by reconcile needs its result as JSON in `text` (for the built-in functions: \"appended\")".into(),
            ));
        }
        if !self.present.calls.unresolved_queue.is_empty() {
            // Another step of the function is still in doubt: reconciled next.
            return Ok(vec![Event::CheckpointPublished { checkpoint_seq: 0 }]);
        }
        Ok(vec![
            Event::CheckpointPublished { checkpoint_seq: 0 },
            state_changed(self.present.run_state(), "reconciled"),
        ])
    }

    /// The history of an applied `reconcile`: the effect's receipt and, `confirmed`, its
    /// output in the context. Read before the present folds it.
    pub(crate) fn record_reconcile(
        &mut self,
        effect_id: EffectId,
        status: ReceiptStatus,
        output: &str,
    ) {
        let unresolved = self.present.calls.unresolved.as_ref();
        let Some(unresolved) = unresolved.filter(|unresolved| unresolved.effect_id == effect_id)
        else {
            return;
        };
        let tool = unresolved.tool.clone();
        self.receipts.tool(effect_id, &tool, status);
        if self.present.function.is_some() {
            // A durable function's step: its result is what the body reads back (F-4).
            self.step_completed(&tool, effect_id, status, output);
            return;
        }
        if status != ReceiptStatus::NotApplied {
            std::sync::Arc::make_mut(&mut self.context).push(Turn::ToolResult {
                tool,
                status,
                output: output.to_owned(),
            });
        }
    }

    /// K-7: the runtime's shutdown intent as this execution takes it: its deadline from its
    /// own restart window, if it has one.
    pub fn own_intent(&self, stopping: RestartIntent) -> RestartIntent {
        match self.present.run.restart_window {
            Some(own) => RestartIntent {
                deadline_ms: own.deadline_from(stopping.recorded_at_ms),
                ..stopping
            },
            None => stopping,
        }
    }

    /// the cooperative pause owned by restart recovery, for a running execution with
    /// nothing in flight. It records the restart intent in the same transition. A
    /// user's Pause or Step in progress wins: that pause is the user's, and stays explicit.
    pub fn restart_pause(&self, intent: RestartIntent) -> Option<Vec<Event>> {
        if self.status() != Status::Running || self.present.run.cancel_requested {
            return None;
        }
        let users = if self.present.run.pause_requested {
            Some("pause")
        } else if self.present.run.steps_left.is_some() {
            Some("step")
        } else {
            None
        };
        if let Some(reason) = users {
            return Some(vec![state_changed(Status::Paused, reason)]);
        }
        Some(vec![
            Event::RestartIntentRecorded { intent },
            state_changed(Status::Paused, RESTART_PAUSE_REASON),
        ])
    }
}

impl Present {
    /// Folds an applied `reconcile`: the effect is resolved; `not_applied` makes it pending
    /// again, under the same effect id.
    pub(crate) fn apply_reconcile(
        &mut self,
        effect_id: EffectId,
        status: ReceiptStatus,
        seq: u64,
        actions: &mut Vec<Action>,
    ) {
        let Some(unresolved) = self
            .calls
            .unresolved
            .take_if(|unresolved| unresolved.effect_id == effect_id)
        else {
            return;
        };
        if let Some(function) = &mut self.function {
            // A durable function's step: the body runs it again when it gets there, or
            // reads its result. The next step in doubt, if any, is asked about next.
            function.steps_done += u32::from(status == ReceiptStatus::Confirmed);
            if !self.calls.unresolved_queue.is_empty() {
                self.calls.unresolved = Some(self.calls.unresolved_queue.remove(0));
                self.calls.unresolved_seq = seq;
                actions.push(Action::Reconcile);
            }
            return;
        }
        if status == ReceiptStatus::NotApplied {
            // Proven never to have taken effect: it may run again, same effect id.
            self.calls.pending_tool = Some(PendingTool::new(
                unresolved.effect_id,
                unresolved.tool,
                unresolved.args,
            ));
        }
    }
}
