//! `decide` for what is not a command (`controls.rs` decides those): a model's
//! decision (E-3; the wait an `Ask` opens, or the grant that spares it one: W-1, W-6..W-8),
//! a model's error (E-6), a tool's result, a live question. Part of the pure state machine
//! (`mod.rs`).

use openprogram_storage::{EffectId, Event, ExecutionState as Status, ReceiptStatus};

use super::{
    cancelled, decision_text, state_changed, unreadable, wait_of, Decision, Input, Machine,
    ModelUsage, Refusal, Rejection,
};

impl Machine {
    /// The events a result, decision or question leads to, or why it is refused. Commands
    /// are decided by `decide_command`.
    pub fn decide(&self, input: Input) -> Result<Vec<Event>, Rejection> {
        match input {
            Input::ModelDecided {
                effect_id,
                decision,
                // Taken at time 0, with no session grants: a timeout runs from then (the shell
                // and the simulation call `decide_decision` with the time and the session).
            } => Ok(self.decide_decision(effect_id, decision, 0, None).0),
            Input::ModelFailed { effect_id, error } => Ok(self.model_failed(effect_id, error)),
            Input::AskLive {
                wait_id,
                prompt,
                request,
                binding,
            } => self.decide_live_question(wait_id, prompt, request, binding),
            Input::ToolFinished {
                effect_id,
                status,
                output,
            } => {
                if self.present.calls.pending_effect() != Some(effect_id) {
                    return Err(self.reject(Refusal::Invalid(format!(
                        "no tool call {effect_id} is pending"
                    ))));
                }
                // The call that asked has ended: its open questions can never be answered.
                let mut events = self.invalidate_waits(|wait| {
                    wait.live.map(|live| live.effect_id) == Some(effect_id)
                });
                events.extend([
                    Event::ToolFinished {
                        effect_id,
                        status,
                        output,
                    },
                    Event::CheckpointPublished { checkpoint_seq: 0 },
                ]);
                if self.present.run.cancel_requested {
                    // A late result is recorded, not acted on (K-5).
                    events.push(cancelled());
                } else if status == ReceiptStatus::Unknown {
                    // The tool could not tell whether its effect took place (a request sent,
                    // no answer): never repeated, never guessed.
                    events.push(state_changed(
                        Status::ReconciliationRequired,
                        "unknown external effect",
                    ));
                }
                Ok(events)
            }
        }
    }

    fn model_failed(&self, effect_id: EffectId, error: String) -> Vec<Event> {
        let ended = if self.present.run.cancel_requested {
            cancelled()
        } else {
            state_changed(Status::Failed, format!("model error: {error}"))
        };
        vec![Event::ModelFailed { effect_id, error }, ended]
    }

    /// E-6: the event that records the tokens the model call `effect_id` used, committed
    /// with its decision or error; none if the provider reported nothing.
    pub fn usage_recorded(effect_id: EffectId, usage: Option<ModelUsage>) -> Option<Event> {
        usage.map(|usage| Event::ModelUsage {
            effect_id,
            input_tokens: usage.input_tokens,
            output_tokens: usage.output_tokens,
            retries: usage.retries,
        })
    }

    /// `decide` for a model's decision, handing the decision back when it is recorded: the
    /// shell passes it to `apply_decided` with the committed events, so the machine keeps
    /// the decision itself rather than parsing it back from the event's text.
    /// `now_ms` (wall clock) is when it was decided: a wait it opens times out from then (W-8).
    /// `session`: the session's record as read, whose grants an `Ask` for a tool may rely on
    /// (W-7; read only for such an `Ask`).
    pub fn decide_decision(
        &self,
        effect_id: EffectId,
        decision: Decision,
        now_ms: u64,
        session: Option<&openprogram_storage::SessionRecord>,
    ) -> (Vec<Event>, Option<Decision>) {
        match unreadable(&decision) {
            Some(error) => (self.model_failed(effect_id, error), None),
            None => (
                self.decide_model(effect_id, &decision, now_ms, session),
                Some(decision),
            ),
        }
    }

    fn decide_model(
        &self,
        effect_id: EffectId,
        decision: &Decision,
        now_ms: u64,
        session: Option<&openprogram_storage::SessionRecord>,
    ) -> Vec<Event> {
        let text = decision_text(decision);
        let mut events = vec![Event::ModelDecided {
            effect_id,
            decision: text,
        }];
        if self.present.run.cancel_requested {
            // A late decision is recorded, not acted on (K-5).
            events.push(Event::CheckpointPublished { checkpoint_seq: 0 });
            events.push(cancelled());
        } else if let Some(Ok(spec)) = decision.wait_spec() {
            // W-7: a granted tool is approved without a new wait.
            let granted = spec
                .tool()
                .and_then(|tool| self.present.waits.grant_for(&tool, session));
            match granted {
                Some(used) => {
                    events.extend([used, Event::CheckpointPublished { checkpoint_seq: 0 }])
                }
                None => events.extend(self.open_wait(wait_of(effect_id), &spec, now_ms, None)),
            }
        } else if let Decision::Reply { text, .. } = decision {
            let mut reply = text.clone();
            for steer in &self.present.run.steers {
                reply.push_str("\n[steer] ");
                reply.push_str(steer);
            }
            events.push(Event::Replied { text: reply });
            events.push(Event::CheckpointPublished { checkpoint_seq: 0 });
            events.push(state_changed(Status::Completed, "replied"));
        } else {
            events.push(Event::CheckpointPublished { checkpoint_seq: 0 });
        }
        events
    }
}
