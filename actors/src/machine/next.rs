//! What a running, idle execution does next (`Machine::next`): persist a state change (a
//! pause, a Step used up, a spent Job budget, a cancel, an effect in doubt), run the
//! function's body, dispatch or run the pending tool, or call the model. Part of the pure
//! state machine (`mod.rs`).

use openprogram_storage::{EffectId, Event, ExecutionState as Status};

use super::{cancelled, state_changed, Machine, Next, Recovery};

impl Machine {
    /// What a running execution does when no effect is in flight. `fresh` makes the effect
    /// id to use if it calls the model (only then: a new id costs the caller a random
    /// number); `recovery` tells how a tool recovers.
    pub fn next(
        &self,
        fresh: impl FnOnce() -> EffectId,
        recovery: impl Fn(&str) -> Recovery,
        now_ms: u64,
    ) -> Next {
        if self.status() != Status::Running && self.status() != Status::Cancelling {
            return Next::Idle;
        }
        // Never repeated, never guessed: record it unknown and stop for reconciliation.
        if let Some(mut events) = self.in_doubt(false) {
            let state = if self.present.run.cancel_requested {
                Status::Cancelled
            } else {
                Status::ReconciliationRequired
            };
            events.push(Event::CheckpointPublished { checkpoint_seq: 0 });
            events.push(Event::StateChanged {
                state,
                reason: "unknown external effect".into(),
            });
            return Next::Persist(events);
        }
        if self.present.run.cancel_requested {
            return Next::Persist(vec![cancelled()]);
        }
        if self.present.run.pause_requested {
            return Next::Persist(vec![state_changed(Status::Paused, "pause")]);
        }
        if self.present.run.steps_left == Some(0) {
            return Next::Persist(vec![state_changed(Status::Paused, "step")]);
        }
        if self.present.job_spent(now_ms) {
            return Next::Persist(vec![state_changed(
                Status::Paused,
                super::job::BUDGET_EXHAUSTED,
            )]);
        }
        if self.present.function.is_some() {
            return Next::RunFunction;
        }
        if let Some(pending) = &self.present.calls.pending_tool {
            if recovery(&pending.tool) == Recovery::External && !pending.dispatched {
                return Next::Persist(vec![Event::ToolDispatched {
                    effect_id: pending.effect_id,
                    tool: pending.tool.clone(),
                    args: pending.args.get().to_owned(),
                }]);
            }
            return Next::RunTool(pending.clone());
        }
        if self.present.turn.iterations >= self.present.turn.input.max_iterations {
            return Next::Persist(vec![state_changed(
                Status::Failed,
                format!(
                    "iteration limit of {} reached",
                    self.present.turn.input.max_iterations
                ),
            )]);
        }
        Next::CallModel { effect_id: fresh() }
    }
}
