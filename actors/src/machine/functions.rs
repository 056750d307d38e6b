//! The pure machine's rules for durable functions (F-1..F-7): what a run of the body runs
//! (version policy, `decide_run`), when it stops at a boundary, what a step's result and the
//! body's return commit, and how committed steps are read back.

use std::collections::HashSet;

use openprogram_storage::{
    EffectId, Event, ExecutionState as Status, ReceiptStatus, VersionPolicy,
};

use super::{
    cancelled, state_changed, Action, CompletedStep, FunctionInput, FunctionRun, Machine,
    PendingTool, Present, Registered, RunDecision, StepConvert, StepMap, ToolArgs,
};

impl Machine {
    /// The `Unknown` receipts of the effects in doubt, asked when nothing is in flight: an
    /// agent's tool call dispatched by an earlier attempt (any dispatched one, `new_attempt`:
    /// as a claim for a new attempt sees them); a function's External steps dispatched with
    /// no run of its body going on (a crash, a cancel, a lost run). `None`: none is.
    pub fn in_doubt(&self, new_attempt: bool) -> Option<Vec<Event>> {
        let output = |pending: &PendingTool| match pending.uncertain || new_attempt {
            true => "dispatched by an earlier attempt; its outcome is unknown".to_owned(),
            false => "its run ended before its result was recorded; its outcome is unknown".into(),
        };
        let Present { calls, .. } = &self.present;
        if self.present.function.is_some() {
            let events: Vec<Event> = calls
                .pending_steps
                .iter()
                .map(|pending| Event::StepFinished {
                    step_id: pending.tool.clone(),
                    effect_id: pending.effect_id,
                    status: ReceiptStatus::Unknown,
                    output: output(pending),
                })
                .collect();
            return (!events.is_empty()).then_some(events);
        }
        let pending = calls
            .pending_tool
            .as_ref()
            .filter(|pending| pending.uncertain || (new_attempt && pending.dispatched))?;
        Some(vec![Event::ToolFinished {
            effect_id: pending.effect_id,
            status: ReceiptStatus::Unknown,
            output: output(pending),
        }])
    }

    /// F-5: a durable function's body stops at its next boundary instead of passing it: the
    /// execution pauses (a Pause, a Step used up, a Job's budget spent by `now_ms`), is
    /// cancelled, or does not run.
    pub fn suspends_at_boundary(&self, now_ms: u64) -> bool {
        let run = &self.present.run;
        self.status() != Status::Running
            || run.cancel_requested
            || run.pause_requested
            || run.steps_left == Some(0)
            || self.present.job_spent(now_ms)
    }

    /// F-3: which revision a run of the function's body runs, decided at its start from the
    /// policy and what is registered: the active revision (keep_original; use_latest when it
    /// is the newest), or events first — the newest revision adopted through the
    /// correspondence it declares with the active one (`correspond`: an active step id to
    /// its own), a `version_conflict` pause with the differences, or a `revision_missing`
    /// pause. Never other code silently, never a fresh start.
    pub fn decide_run(
        &self,
        run: &FunctionRun,
        registered: &Registered,
        correspond: Option<&StepMap>,
        convert: Option<&StepConvert>,
    ) -> RunDecision {
        let active = run.active_revision;
        let paused = |reason: &str| state_changed(Status::Paused, reason);
        let (latest, latest_identity) = match run.policy {
            VersionPolicy::KeepOriginal if registered.active => return RunDecision::Run(active),
            VersionPolicy::KeepOriginal => {
                return RunDecision::Persist(vec![paused("revision_missing")])
            }
            VersionPolicy::UseLatest => match &registered.latest {
                Some((latest, _)) if *latest == active && registered.active => {
                    return RunDecision::Run(active)
                }
                // The active revision is gone or its code changed (an older one is no
                // stand-in), or none is registered.
                Some((latest, identity)) if *latest > active => (*latest, identity.clone()),
                _ => return RunDecision::Persist(vec![paused("revision_missing")]),
            },
        };
        // Each committed step, by its id in the active revision, must be one of the newest
        // revision's steps.
        let active_ids: std::collections::BTreeMap<u32, &str> = run
            .step_aliases
            .iter()
            .map(|(active_id, position)| (*position, active_id.as_str()))
            .collect();
        let mut adopted = Vec::new();
        let mut converted = Vec::new();
        let mut differences = Vec::new();
        if correspond.is_none() && !self.completed_steps.is_empty() {
            differences.push(format!(
                "revision {latest} declares no step correspondence with revision {active}"
            ));
        }
        for (position, step) in (0u32..).zip(&self.completed_steps) {
            // Its id in the active revision: an adopted alias, or its own if the active
            // revision ran it; a step the active revision does not stand for is none.
            let active_id = active_ids
                .get(&position)
                .copied()
                .or_else(|| (step.revision == active).then_some(step.step_id.as_str()));
            match active_id
                .zip(correspond)
                .and_then(|(active_id, correspond)| correspond(active_id))
            {
                // A confirmed result in the newer shape, where a conversion is declared.
                Some(new_id) => {
                    let earlier = self.step_output(position);
                    let converting = convert.filter(|_| step.status == ReceiptStatus::Confirmed);
                    match converting.map(|convert| convert(&new_id, earlier)) {
                        Some(Ok(output)) if output != earlier => converted.push((position, output)),
                        Some(Err(why)) => differences.push(format!(
                            "the result of step `{}` does not convert to revision {latest}: {why}",
                            step.step_id
                        )),
                        _ => {}
                    }
                    adopted.push((new_id, position));
                }
                None => differences.push(format!(
                    "step `{}` completed in revision {} is not accounted for by revision {latest}",
                    step.step_id, step.revision
                )),
            }
        }
        if differences.is_empty() {
            return RunDecision::Persist(vec![Event::RevisionAdopted {
                revision: latest,
                identity: latest_identity,
                steps: adopted,
                converted,
            }]);
        }
        RunDecision::Persist(vec![
            Event::VersionConflict {
                revision: latest,
                differences,
            },
            paused("version_conflict"),
        ])
    }

    /// The events of a step's result (E-3): its receipt, then the checkpoint after it. A
    /// result arriving after a Cancel is recorded, not acted on (K-5: the run's abort ends
    /// the execution, with whatever else is in flight recorded `unknown`). While the
    /// execution waits for a person (another branch asked), no checkpoint moves past the
    /// wait's (W-3).
    pub fn decide_step_done(
        &self,
        step_id: String,
        effect_id: EffectId,
        status: ReceiptStatus,
        output: String,
    ) -> Vec<Event> {
        let mut events = vec![Event::StepFinished {
            step_id,
            effect_id,
            status,
            output,
        }];
        if self.status() != Status::Waiting {
            events.push(Event::CheckpointPublished { checkpoint_seq: 0 });
        }
        events
    }

    /// The events of a function body's return: its result as the reply, or its error. Steps
    /// it left running (a panic inside one, a dropped step future) are in doubt: the
    /// execution needs reconciliation, never an end that hides them.
    pub fn decide_returned(
        &self,
        result: Result<String, String>,
        never_started: &HashSet<EffectId>,
    ) -> Vec<Event> {
        let mut events = self.not_started(never_started).unwrap_or_default();
        let left: Vec<Event> = self
            .in_doubt(false)
            .into_iter()
            .flatten()
            .filter(|event| !is_step_of(event, never_started))
            .collect();
        if !left.is_empty() {
            events.extend(left);
            events.push(Event::CheckpointPublished { checkpoint_seq: 0 });
            events.push(match self.present.run.cancel_requested {
                true => cancelled(),
                false => state_changed(Status::ReconciliationRequired, "unknown external effect"),
            });
            return events;
        }
        events.extend(self.returned(result));
        events
    }

    /// F-5: the receipts of the pending steps among `never_started` — steps this attempt told
    /// its run to run and saw end before they started: `NotStarted`, so they may run again
    /// and need no reconciliation. `None`: none is pending.
    pub fn not_started(&self, never_started: &HashSet<EffectId>) -> Option<Vec<Event>> {
        let steps = self.present.calls.pending_steps.iter();
        let events: Vec<Event> = steps
            .filter(|step| !step.uncertain && never_started.contains(&step.effect_id))
            .map(|step| Event::StepFinished {
                step_id: step.tool.clone(),
                effect_id: step.effect_id,
                status: ReceiptStatus::NotStarted,
                output: "its run ended before it started".into(),
            })
            .collect();
        (!events.is_empty()).then_some(events)
    }

    /// The events of a body's return with no step in doubt.
    fn returned(&self, result: Result<String, String>) -> Vec<Event> {
        if self.present.run.cancel_requested {
            return vec![cancelled()];
        }
        match result {
            Ok(text) => vec![
                Event::Replied { text },
                Event::CheckpointPublished { checkpoint_seq: 0 },
                state_changed(Status::Completed, "returned"),
            ],
            Err(error) => vec![state_changed(
                Status::Failed,
                format!("function error: {error}"),
            )],
        }
    }

    /// A step's result or error is what every later run of the function reads (F-4); an
    /// unknown or not-applied outcome is none.
    pub(crate) fn step_completed(
        &mut self,
        step_id: &str,
        effect_id: EffectId,
        status: ReceiptStatus,
        output: &str,
    ) {
        if !matches!(status, ReceiptStatus::Confirmed | ReceiptStatus::Failed) {
            return;
        }
        self.step_index
            .insert(step_id.to_owned(), self.completed_steps.len());
        self.completed_steps.push(CompletedStep {
            step_id: step_id.to_owned(),
            revision: self.present.active_revision(),
            effect_id,
            status,
            output: output.to_owned(),
        });
    }

    /// The committed step the active revision's step `step_id` stands for, if any — one it
    /// ran itself, or one an adoption mapped it to (F-3) — with the result as that revision
    /// reads it (converted, where its conversion changed it).
    pub fn completed_step(&self, step_id: &str) -> Option<(&CompletedStep, &str)> {
        let run = self.present.function.as_ref()?;
        if let Some(position) = run.step_aliases.get(step_id) {
            let step = self.completed_steps.get(*position as usize)?;
            return Some((step, self.step_output(*position)));
        }
        self.step_index
            .get(step_id)
            .and_then(|at| self.completed_steps.get(*at))
            .filter(|step| step.revision == run.active_revision)
            .map(|step| (step, step.output.as_str()))
    }

    /// The result of the committed step at `position`, as the active revision reads it.
    fn step_output(&self, position: u32) -> &str {
        match self.converted_outputs.get(&position) {
            Some(converted) => converted,
            None => self
                .completed_steps
                .get(position as usize)
                .map_or("", |step| step.output.as_str()),
        }
    }

    /// The nested call a step id of this function belongs to (the innermost), and the step's
    /// id within it; `None`: the function's own step.
    pub fn nested_call_of<'a>(&self, step_id: &'a str) -> Option<(&FunctionInput, &'a str)> {
        self.nested_calls
            .iter()
            .filter_map(|(call_id, call)| {
                let rest = step_id.strip_prefix(call_id.as_str())?.strip_prefix('/')?;
                Some((call_id.len(), call, rest))
            })
            .max_by_key(|(length, _, _)| *length)
            .map(|(_, call, rest)| (call, rest))
    }
}

impl Present {
    /// A durable function's events: an External step dispatched or ended, a revision
    /// adopted (F-3) or found in conflict with the steps committed.
    pub(crate) fn fold_function(&mut self, event: &Event, seq: u64, actions: &mut Vec<Action>) {
        match event {
            Event::StepStarted { step_id, effect_id } => {
                let mut step = PendingTool::new(*effect_id, step_id.clone(), ToolArgs::default());
                step.dispatched = true;
                step.dispatched_by = self.attempt.owner;
                step.dispatched_in = self.attempt.id;
                self.calls.pending_steps.push(step);
            }
            Event::StepFinished {
                step_id,
                effect_id,
                status,
                ..
            } => self.step_finished(step_id, *effect_id, *status, seq, actions),
            Event::RevisionAdopted {
                revision,
                identity,
                steps,
                ..
            } => {
                if let Some(run) = &mut self.function {
                    run.adopted(*revision, identity, steps);
                }
                if self.status() == Status::Running {
                    actions.push(Action::Advance);
                }
            }
            Event::VersionConflict { differences, .. } => {
                if let Some(run) = &mut self.function {
                    run.differences.clone_from(differences);
                }
            }
            _ => {}
        }
    }

    /// A durable function's step ended: done, or, `Unknown`, in doubt until reconciled.
    fn step_finished(
        &mut self,
        step_id: &str,
        effect_id: EffectId,
        status: ReceiptStatus,
        seq: u64,
        actions: &mut Vec<Action>,
    ) {
        let steps = &mut self.calls.pending_steps;
        let at = steps.iter().position(|step| step.effect_id == effect_id);
        let pending = at.map(|at| steps.remove(at));
        if status == ReceiptStatus::Unknown {
            let step = pending.unwrap_or_else(|| {
                PendingTool::new(effect_id, step_id.to_owned(), ToolArgs::default())
            });
            match self.calls.unresolved {
                None => {
                    self.calls.unresolved = Some(step);
                    self.calls.unresolved_seq = seq;
                }
                Some(_) => self.calls.unresolved_queue.push(step),
            }
            return;
        }
        // F-5: a step that never started took no step (of a Step command's budget either);
        // what stopped its run (a pause, a cancel) is decided next.
        if status == ReceiptStatus::NotStarted {
            if matches!(self.status(), Status::Running | Status::Cancelling) {
                actions.push(Action::Advance);
            }
            return;
        }
        let counted = matches!(status, ReceiptStatus::Confirmed | ReceiptStatus::Failed);
        if let Some(run) = self.function.as_mut().filter(|_| counted) {
            run.steps_done += 1;
        }
        self.step_taken(actions);
    }
}

/// Whether `event` is the `Unknown` receipt of a step among `effects`.
fn is_step_of(event: &Event, effects: &HashSet<EffectId>) -> bool {
    matches!(event, Event::StepFinished { effect_id, .. } if effects.contains(effect_id))
}
