//! The pure machine's rules for waits. A durable wait (W-1) opens right after its
//! checkpoint; the execution is `waiting` until an `answer` or `decline` (W-2) of that wait
//! while its checkpoint is current (W-3). A live question (W-4) is asked by a running tool
//! call: no checkpoint, no state change; it ends with its attempt and call.

use openprogram_storage::{
    AnswerScope, AttemptId, CommandId, Control, Event, ExecutionId, ExecutionState as Status,
    LiveBinding, WaitId, WaitKind, WaitRecord, WaitStatus,
};

use crate::machine::wait_types::WaitSpec;
use crate::machine::{
    state_changed, Action, CommandKind, LiveOutcome, Machine, Present, Refusal, Rejection, Turn,
    WaitState, Waits,
};
use crate::wait_request::WaitRequest;

/// The pause reason of an execution whose wait expired (W-8).
pub const WAIT_EXPIRED: &str = "wait_expired";

/// The longest prompt a wait or question may carry.
pub const PROMPT_BYTES_MAX: usize = 16 * 1024;

impl Machine {
    /// The events that open a durable wait (W-1) after a decision: the pre-wait checkpoint,
    /// the wait, what it asks and until when (W-6, W-8), and the `waiting` state. `now_ms`
    /// is the time of the decision: a timeout runs from it. `reopens`: the expired wait a
    /// Continue opens again.
    pub(crate) fn open_wait(
        &self,
        wait_id: WaitId,
        spec: &WaitSpec,
        now_ms: u64,
        reopens: Option<WaitId>,
    ) -> Vec<Event> {
        let mut prompt = spec.prompt.clone();
        truncate(&mut prompt, PROMPT_BYTES_MAX);
        let kind = spec.kind.unwrap_or(WaitKind::Approval);
        let mut events = vec![
            Event::CheckpointPublished { checkpoint_seq: 0 },
            Event::WaitOpened {
                wait_id,
                kind,
                prompt,
                live: None,
            },
        ];
        if spec.request.is_some() || spec.timeout_ms.is_some() || reopens.is_some() {
            events.push(Event::WaitDetails {
                wait_id,
                request: spec.request.clone(),
                timeout_ms: spec.timeout_ms,
                deadline_ms: spec
                    .timeout_ms
                    .map(|timeout| now_ms.saturating_add(timeout)),
                reopens,
            });
        }
        let reason = reopens.map_or(kind.as_str(), |_| "wait_reopened");
        events.push(state_changed(Status::Waiting, reason));
        events
    }

    /// F-1, W-1: a function's `ask`: the checkpoint, the wait at it, and the `waiting` state,
    /// or, asked before, the wait as it is (the newest one re-opening it, W-8).
    pub fn decide_ask(
        &self,
        wait_id: WaitId,
        spec: &WaitSpec,
        now_ms: u64,
    ) -> Result<Vec<Event>, &WaitState> {
        if let Some(wait) = self.newest_of(wait_id) {
            return Err(wait);
        }
        Ok(self.open_wait(wait_id, spec, now_ms, None))
    }

    /// The wait `wait_id`, or the newest wait that re-opens it (W-8), following the chain.
    fn newest_of(&self, wait_id: WaitId) -> Option<&WaitState> {
        let mut newest = self.wait(wait_id)?;
        let waits = self.waits();
        while let Some(next) = waits
            .iter()
            .find(|wait| wait.reopens == Some(newest.wait_id))
        {
            newest = next;
        }
        Some(newest)
    }

    /// W-8: the wait `wait_id`'s deadline passed (at `now_ms`): it is `expired` — never an
    /// approval — and the execution pauses `wait_expired`. `None` if that is not so (resolved
    /// meanwhile, not yet due, no longer the current checkpoint's).
    pub fn decide_wait_expiry(&self, wait_id: WaitId, now_ms: u64) -> Option<Vec<Event>> {
        let wait = self.present.waits.active.iter().find(|wait| {
            wait.wait_id == wait_id && wait.live.is_none() && wait.status == WaitStatus::Open
        })?;
        let due = wait.deadline_ms.is_some_and(|deadline| deadline <= now_ms);
        let current = self.status() == Status::Waiting
            && wait.checkpoint_seq == self.present.run.checkpoint_seq;
        if !due || !current || self.present.run.cancel_requested {
            return None;
        }
        Some(vec![
            Event::WaitChanged {
                wait_id,
                status: WaitStatus::Expired,
            },
            Event::CheckpointPublished { checkpoint_seq: 0 },
            state_changed(Status::Paused, WAIT_EXPIRED),
        ])
    }

    /// W-8: a Continue or Step of an execution paused `wait_expired` opens the expired wait
    /// again, as a fresh wait (a new id, derived from the command's) with a new deadline.
    pub(crate) fn reopened_wait(&self, command_id: CommandId, now_ms: u64) -> Option<Vec<Event>> {
        if self.status() != Status::Paused
            || self.present.run.pause_reason.as_deref() != Some(WAIT_EXPIRED)
        {
            return None;
        }
        let expired = self.present.waits.expired.as_ref()?;
        let spec = WaitSpec {
            kind: Some(expired.kind),
            prompt: expired.prompt.clone(),
            request: expired.request.clone(),
            timeout_ms: expired.timeout_ms,
        };
        let wait_id = WaitId::from_uuid(uuid::Uuid::new_v5(command_id.as_uuid(), b"reopened wait"));
        Some(self.open_wait(wait_id, &spec, now_ms, Some(expired.wait_id)))
    }

    /// W-4: only the live attempt's running call may ask.
    pub(crate) fn decide_live_question(
        &self,
        wait_id: WaitId,
        prompt: String,
        request: Option<String>,
        binding: LiveBinding,
    ) -> Result<Vec<Event>, Rejection> {
        if self.present.run.cancel_requested || self.status() != Status::Running {
            return Err(self.reject(Refusal::Invalid(format!(
                "a question cannot be asked while the execution is {}",
                self.status()
            ))));
        }
        if self.present.attempt.id != Some(binding.attempt_id)
            || self.present.calls.pending_effect() != Some(binding.effect_id)
        {
            return Err(self.reject(Refusal::Invalid(
                "only the running call of the live attempt may ask".into(),
            )));
        }
        if prompt.len() > PROMPT_BYTES_MAX {
            return Err(self.reject(Refusal::Invalid(format!(
                "a question is longer than {PROMPT_BYTES_MAX} bytes"
            ))));
        }
        if self.wait(wait_id).is_some() {
            return Err(self.reject(Refusal::Invalid(format!("wait {wait_id} exists already"))));
        }
        let mut events = vec![Event::WaitOpened {
            wait_id,
            kind: WaitKind::Live,
            prompt,
            live: Some(binding),
        }];
        if let Some(request) = request {
            if let Err(error) = WaitRequest::from_text(&request) {
                return Err(self.reject(Refusal::Invalid(error)));
            }
            events.push(Event::WaitDetails {
                wait_id,
                request: Some(request),
                timeout_ms: None,
                deadline_ms: None,
                reopens: None,
            });
        }
        Ok(events)
    }

    /// `answer` and `decline` (W-2..W-4): they name their wait, and only a pending one.
    pub(crate) fn decide_wait_control(
        &self,
        command_id: CommandId,
        control: Control,
        now_ms: u64,
    ) -> Result<Vec<Event>, Refusal> {
        let (wait_id, resolved) = match &control {
            Control::Answer { wait_id, .. } => (*wait_id, WaitStatus::Answered),
            Control::Decline { wait_id } => (*wait_id, WaitStatus::Declined),
            _ => return Err(Refusal::Invalid("not a wait control".into())),
        };
        let Some(wait) = self.wait(wait_id) else {
            return Err(Refusal::UnknownWait { wait_id });
        };
        // W-8: past its deadline a wait approves nothing, even before its expiry is written.
        let due = wait.deadline_ms.is_some_and(|deadline| deadline <= now_ms);
        if due && wait.status == WaitStatus::Open && wait.live.is_none() {
            return Err(Refusal::WaitClosed {
                wait_id,
                status: WaitStatus::Expired.as_str(),
            });
        }
        // W-7: a tool or session scope needs an approval that names its tool.
        if let Control::Answer { scope, .. } = &control {
            if wait.status.is_pending() {
                Machine::check_scope(wait, *scope)?;
            }
        }
        // W-6: an answer fits its request, or nothing happens (a discussion reply is no
        // answer to it: it approves nothing).
        if let (Control::Answer { answer, scope, .. }, Some(request)) = (&control, &wait.request) {
            if wait.status.is_pending() && *scope != AnswerScope::Discussion {
                let request = WaitRequest::from_text(request)
                    .map_err(|error| Refusal::Invalid(format!("wait {wait_id}: {error}")))?;
                if let Some(request) = request {
                    request
                        .validate(answer)
                        .map_err(|invalid| Refusal::InvalidAnswer {
                            wait_id,
                            field: invalid.field,
                            message: invalid.message,
                        })?;
                }
            }
        }
        if self.present.run.cancel_requested {
            return Err(Refusal::Cancelling {
                kind: CommandKind::parse(control.kind()).unwrap_or(CommandKind::Answer),
            });
        }
        let applied = Event::ControlApplied {
            command_id,
            control: control.clone(),
        };
        if wait.live.is_some() {
            if let (WaitStatus::Answered, Control::Answer { answer, .. }) = (wait.status, &control)
            {
                // The same answer again: it stands, nothing happens (W-4).
                if wait.answer.as_deref() == Some(answer.as_str()) {
                    return Ok(vec![applied]);
                }
                return Err(Refusal::AnsweredOtherwise { wait_id });
            }
        }
        if !wait.status.is_pending() {
            // Resolved, expired or invalidated: nothing is approved by a late answer (W-2).
            return Err(Refusal::WaitClosed {
                wait_id,
                status: wait.status.as_str(),
            });
        }
        let changed = Event::WaitChanged {
            wait_id,
            status: resolved,
        };
        if let Some(live) = wait.live {
            if self.present.attempt.id != Some(live.attempt_id) {
                return Err(Refusal::WaitNotCurrent { wait_id });
            }
            return Ok(vec![applied, changed]);
        }
        // W-3: only the wait of the current checkpoint can move the execution.
        if self.status() != Status::Waiting
            || wait.checkpoint_seq != self.present.run.checkpoint_seq
        {
            return Err(Refusal::WaitNotCurrent { wait_id });
        }
        Ok(vec![
            applied,
            changed,
            Event::CheckpointPublished { checkpoint_seq: 0 },
            state_changed(self.present.run_state(), resolved.as_str()),
        ])
    }

    /// `invalidated` for every pending wait that `which` selects.
    pub(crate) fn invalidate_waits(&self, which: impl Fn(&WaitState) -> bool) -> Vec<Event> {
        let active = self.present.waits.active.iter();
        active
            .filter(|wait| wait.status.is_pending() && which(wait))
            .map(|wait| Event::WaitChanged {
                wait_id: wait.wait_id,
                status: WaitStatus::Invalidated,
            })
            .collect()
    }

    /// The context turn of an applied `answer` or `decline` of a durable wait: its outcome
    /// enters the context the provider decides from. Read before the present folds it.
    pub(crate) fn record_wait_control(&mut self, control: &Control) {
        let (wait_id, status, answer, discussion) = match control {
            Control::Answer {
                wait_id,
                answer,
                scope,
            } => (
                *wait_id,
                WaitStatus::Answered,
                Some(answer.clone()),
                *scope == AnswerScope::Discussion,
            ),
            Control::Decline { wait_id } => (*wait_id, WaitStatus::Declined, None, false),
            _ => return,
        };
        let pending = self.present.waits.pending(wait_id);
        let Some(wait) = pending.filter(|wait| wait.live.is_none()) else {
            return;
        };
        let prompt = wait.prompt.clone();
        std::sync::Arc::make_mut(&mut self.context).push(Turn::WaitResolved {
            prompt,
            status,
            answer,
            discussion,
        });
    }
}

impl Waits {
    /// A new attempt: live questions of earlier attempts will never be answered (W-4).
    pub(crate) fn invalidate_live_of_other_attempts(&mut self, attempt_id: AttemptId) {
        for wait in &mut self.active {
            if wait.status.is_pending()
                && wait.live.is_some_and(|live| live.attempt_id != attempt_id)
            {
                wait.status = WaitStatus::Invalidated;
            }
        }
    }

    /// An accepted answer reads `submitted`, with the answer, until it is decided (W-2).
    pub(crate) fn answer_submitted(&mut self, control: &Control) {
        if let Control::Answer {
            wait_id, answer, ..
        } = control
        {
            if let Some(wait) = self.wait_mut(*wait_id) {
                if wait.status == WaitStatus::Open {
                    wait.status = WaitStatus::Submitted;
                    wait.answer = Some(answer.clone());
                }
            }
        }
    }

    /// A wait's events: opened (a durable one at the execution's `checkpoint_seq`), what it
    /// asks and until when (W-6, W-8), and how it ended.
    pub(crate) fn fold(
        &mut self,
        event: &Event,
        seq: u64,
        checkpoint_seq: u64,
        actions: &mut Vec<Action>,
    ) {
        match event {
            Event::WaitOpened {
                wait_id,
                kind,
                prompt,
                live,
            } => {
                self.active.push(WaitState {
                    wait_id: *wait_id,
                    opened_seq: seq,
                    kind: *kind,
                    prompt: prompt.clone(),
                    status: WaitStatus::Open,
                    // The checkpoint published just before it, in the same transition.
                    checkpoint_seq: if live.is_some() { 0 } else { checkpoint_seq },
                    answer: None,
                    scope: None,
                    live: *live,
                    request: None,
                    timeout_ms: None,
                    deadline_ms: None,
                    reopens: None,
                });
                if live.is_none() {
                    self.expired = None;
                }
            }
            Event::WaitDetails {
                wait_id,
                request,
                timeout_ms,
                deadline_ms,
                reopens,
            } => {
                let Some(wait) = self.wait_mut(*wait_id) else {
                    return;
                };
                wait.request.clone_from(request);
                wait.timeout_ms = *timeout_ms;
                wait.deadline_ms = *deadline_ms;
                wait.reopens = *reopens;
                if let Some(deadline_ms) = *deadline_ms {
                    let wait_id = *wait_id;
                    actions.push(Action::WatchDeadline {
                        wait_id,
                        deadline_ms,
                    });
                }
            }
            Event::WaitChanged { wait_id, status } => self.wait_changed(*wait_id, *status, actions),
            _ => {}
        }
    }

    fn wait_changed(&mut self, wait_id: WaitId, status: WaitStatus, actions: &mut Vec<Action>) {
        let Some(wait) = self.wait_mut(wait_id) else {
            return;
        };
        wait.status = status;
        if wait.deadline_ms.is_some() && status != WaitStatus::Expired && !status.is_pending() {
            actions.push(Action::UnwatchDeadline { wait_id });
        }
        if status == WaitStatus::Expired && wait.live.is_none() {
            self.expired = Some(wait.clone());
            return;
        }
        if wait.live.is_some() {
            let outcome = match status {
                WaitStatus::Answered => {
                    LiveOutcome::Answered(wait.answer.clone().unwrap_or_default())
                }
                WaitStatus::Declined => LiveOutcome::Declined,
                WaitStatus::Open | WaitStatus::Submitted => return,
                WaitStatus::Expired | WaitStatus::Invalidated => LiveOutcome::Invalidated,
            };
            actions.push(Action::LiveResolved { wait_id, outcome });
        }
    }

    /// An applied `answer` or `decline` records the answer and what it granted (the
    /// `WaitChanged` after it sets the status).
    pub(crate) fn apply_wait_control(&mut self, control: &Control) {
        let (wait_id, answer, scope) = match control {
            Control::Answer {
                wait_id,
                answer,
                scope,
            } => (*wait_id, Some(answer.clone()), Some(*scope)),
            Control::Decline { wait_id } => (*wait_id, None, None),
            _ => return,
        };
        let Some(wait) = self.wait_mut(wait_id) else {
            return;
        };
        if !wait.status.is_pending() {
            return;
        }
        wait.answer = answer;
        if scope.is_some() {
            wait.scope = scope;
        }
    }

    /// The oldest pending wait or live question.
    pub fn first_pending(&self) -> Option<&WaitState> {
        self.active.iter().find(|wait| wait.status.is_pending())
    }

    /// The pending wait `wait_id`.
    pub fn pending(&self, wait_id: WaitId) -> Option<&WaitState> {
        let pending = |wait: &&WaitState| wait.wait_id == wait_id && wait.status.is_pending();
        self.active.iter().find(pending)
    }

    /// The pending wait `wait_id`: an ended wait never changes again.
    fn wait_mut(&mut self, wait_id: WaitId) -> Option<&mut WaitState> {
        self.active
            .iter_mut()
            .find(|wait| wait.wait_id == wait_id && wait.status.is_pending())
    }

    /// The pending durable wait, if the execution is waiting for one.
    pub fn pending_wait(&self) -> Option<&WaitState> {
        self.active
            .iter()
            .find(|wait| wait.live.is_none() && wait.status.is_pending())
    }
}

impl Present {
    /// A rejected answer leaves its wait open again.
    pub(crate) fn answer_rejected(&mut self, command_id: CommandId) {
        let pending = self.run.pending(command_id);
        let rejected = pending.and_then(|control| match control {
            Control::Answer { wait_id, .. } => Some(*wait_id),
            _ => None,
        });
        if let Some(wait) = rejected.and_then(|wait_id| self.waits.wait_mut(wait_id)) {
            if wait.status == WaitStatus::Submitted {
                wait.status = WaitStatus::Open;
                wait.answer = None;
            }
        }
    }
}

/// The wait records to write when the pending waits `before` become `after` (a plan's fold
/// of them): waits opened, or moved on (status or answer).
pub fn changed_wait_records(
    before: &[WaitState],
    after: &[WaitState],
    execution_id: ExecutionId,
) -> Vec<WaitRecord> {
    after
        .iter()
        .filter(|wait| {
            !before.iter().any(|old| {
                old.wait_id == wait.wait_id
                    && old.status == wait.status
                    && old.answer == wait.answer
            })
        })
        .map(|wait| WaitRecord {
            wait_id: wait.wait_id,
            execution_id,
            kind: wait.kind,
            prompt: wait.prompt.clone(),
            status: wait.status,
            checkpoint_seq: wait.checkpoint_seq,
            attempt_id: wait.live.map(|live| live.attempt_id),
            answer: wait.answer.clone(),
        })
        .collect()
}

/// Cuts `text` to at most `max` bytes, at a character boundary; whether it cut.
pub(crate) fn truncate(text: &mut String, max: usize) -> bool {
    if text.len() <= max {
        return false;
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    text.truncate(cut);
    true
}
