//! Admission (K-1, F-1, F-6): the first transition of a new execution — an agent turn, a
//! durable function's execution, or a function an agent's call starts — and the head and
//! machine it leaves behind.

use std::collections::BTreeMap;

use openprogram_storage::{
    Event, EventStore, ExecutionHead, ExecutionId, ExecutionKind, ExecutionState, JobBudget,
    JobRecord, MessageId, Outcome, RestartWindow, RunId, SessionId, Transition, Upsert,
};
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::machine::ScriptElement;
use crate::machine::{AgentInput, Machine};

/// A new agent turn.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StartRequest {
    pub message: String,
    pub parent_message_id: Option<MessageId>,
    /// For the scripted provider: each element as the JSON text it was given (over HTTP,
    /// the body's own text), built from a value with `json!(…).into()`.
    #[serde(default)]
    pub script: Vec<ScriptElement>,
    pub max_iterations: Option<u32>,
    /// Admit the turn paused: it waits for Continue or Step (as Agent forks do, K-2).
    #[serde(default)]
    pub start_paused: bool,
    /// J-1: admit it as a background Job, through the resource queue.
    pub job: Option<JobRequest>,
    /// C-2: what this message does while another turn of the session runs (default `queue`).
    pub when_busy: Option<BusyStrategy>,
    /// K-7: its own restart window, in place of the runtime's: `-1`, `0` or a duration.
    #[serde(default, deserialize_with = "restart_window_field")]
    pub restart_window: Option<RestartWindow>,
}

/// K-7: a start body's `restart_window`, as a command's is read (a serde field reader).
pub fn restart_window_field<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<Option<RestartWindow>, D::Error> {
    let value = Option::<serde_json::Value>::deserialize(deserializer)?;
    value
        .map(|value| crate::command_fields::restart_window(&value))
        .transpose()
        .map_err(serde::de::Error::custom)
}

/// C-2: what a message does while another turn holds its session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BusyStrategy {
    /// Admitted `queued`; runs after the turns before it, on the same branch.
    #[default]
    Queue,
    /// Becomes steering text for the running turn; nothing is admitted.
    Steer,
    /// Refused, `409 session_busy`; nothing is stored.
    Reject,
    /// Admitted first in line; the running turn pauses at its next safe point, then it runs.
    Interrupt,
}

impl BusyStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            BusyStrategy::Queue => "queue",
            BusyStrategy::Steer => "steer",
            BusyStrategy::Reject => "reject",
            BusyStrategy::Interrupt => "interrupt",
        }
    }
}

/// J-1: what a Job asks for (the `job` of a start body, SPEC §6).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobRequest {
    /// Amounts by resource name: all leased at once, or none.
    pub resources: BTreeMap<String, u32>,
    /// Not leased within this many milliseconds of admission: it ends `expired`, never run.
    pub queue_deadline_ms: Option<u64>,
    pub budget: Option<BudgetRequest>,
}

/// J-1: a Job's budget as a body gives it; each a total, charged only under a lease.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetRequest {
    pub steps: Option<u32>,
    pub wall_ms: Option<u64>,
}

impl From<BudgetRequest> for JobBudget {
    fn from(budget: BudgetRequest) -> Self {
        JobBudget {
            steps: budget.steps,
            wall_ms: budget.wall_ms,
        }
    }
}

/// A new execution's first transition, with what it leaves behind: the head and the
/// machine a replay of it would build, so the admission can start its actor without
/// reading it back (`Executions::activate_admitted`).
pub(crate) struct Admission {
    pub(crate) head: ExecutionHead,
    events: Vec<Event>,
    input: AgentInput,
    parent_message_id: Option<MessageId>,
    pub(crate) start_paused: bool,
    /// J-1: its record, if it is a Job.
    pub(crate) job: Option<JobRecord>,
}

impl Admission {
    pub(crate) fn new(
        execution_id: ExecutionId,
        session_id: SessionId,
        revision_id: openprogram_storage::RevisionId,
        request: StartRequest,
        kind: ExecutionKind,
    ) -> Result<Self> {
        let mut head = ExecutionHead::new(execution_id, session_id, RunId::new(), kind);
        head.revision_id = revision_id;
        let input = AgentInput {
            message: request.message,
            script: request.script,
            max_iterations: request.max_iterations.unwrap_or(50),
        };
        if input.max_iterations == 0 {
            return Err(Error::InvalidRequest(
                "max_iterations must be at least 1".into(),
            ));
        }
        let encoded = match kind {
            // Encoded by `start_function` already.
            ExecutionKind::Function => input.message.clone(),
            _ => serde_json::to_string(&input)
                .map_err(|error| Error::InvalidRequest(error.to_string()))?,
        };
        let mut events = vec![Event::Admitted {
            kind: head.kind,
            session_id,
            run_id: head.run_id,
            parent_execution_id: None,
            revision_id: head.revision_id,
            turn_id: head.turn_id,
            user_message_id: head.user_message_id,
            reply_message_id: head.reply_message_id,
            parent_message_id: request.parent_message_id,
            input: encoded,
        }];
        if let Some(window) = request.restart_window {
            events.push(crate::machine::restart::window_at_start(
                execution_id,
                window,
            ));
        }
        if request.start_paused {
            let reason = String::from("start_paused");
            head.state = ExecutionState::Paused;
            head.pause_reason = Some(reason.clone());
            events.push(Event::StateChanged {
                state: ExecutionState::Paused,
                reason,
            });
        }
        Ok(Self {
            head,
            events,
            input,
            parent_message_id: request.parent_message_id,
            start_paused: request.start_paused,
            job: None,
        })
    }

    /// J-1: the execution is a Job asking for `resources` (checked against the runtime's
    /// declared ones), queued at `now_ms`: it runs once the queue leases them.
    pub(crate) fn into_job(
        mut self,
        resources: Vec<(String, u32)>,
        request: &JobRequest,
        now_ms: u64,
    ) -> Self {
        let queued = Event::JobQueued {
            resources,
            queued_at_ms: now_ms,
            queue_deadline_ms: request.queue_deadline_ms,
            budget: request.budget.map(JobBudget::from).unwrap_or_default(),
        };
        self.job = crate::machine::job::queued_record(&self.head, &queued);
        // After `Admitted`, before a paused start: the machine knows it is a Job first.
        self.events.insert(1, queued);
        self
    }

    /// F-6: the execution is a child of `parent` (an agent's call of a function).
    pub(crate) fn with_parent(mut self, parent: ExecutionId) -> Self {
        self.head.parent_execution_id = Some(parent);
        if let Some(Event::Admitted {
            parent_execution_id,
            ..
        }) = self.events.first_mut()
        {
            *parent_execution_id = Some(parent);
        }
        self
    }

    /// C-2: the execution is its session's foreground turn (`turn`: its `SessionTurn`), and
    /// the session record changes in the admission's own transition.
    pub(crate) fn into_session_turn(mut self, turn: Event) -> Self {
        if let Event::SessionTurn {
            behind: Some(_), ..
        } = &turn
        {
            self.head.state = ExecutionState::Queued;
        }
        self.events.insert(1, turn);
        self
    }

    /// Commits the admission; returns the head and machine as a replay would rebuild them
    /// (the input is not parsed back), and the version.
    pub(crate) async fn commit(
        self,
        store: &dyn EventStore,
    ) -> Result<(ExecutionHead, Machine, u64)> {
        self.commit_with(store, None).await?.ok_or_else(|| {
            Error::Internal("an admission without a session write conflicted".into())
        })
    }

    /// `commit`, with `session` written in the same transition: `None` if the session record
    /// moved since it was read (nothing written).
    pub(crate) async fn commit_with(
        self,
        store: &dyn EventStore,
        session: Option<openprogram_storage::SessionWrite>,
    ) -> Result<Option<(ExecutionHead, Machine, u64)>> {
        let mut head = self.head.clone();
        let mut machine = Machine::default();
        let mut ignored = Vec::new();
        // The first event is `Admitted` (`Admission::new`): an agent's input is at hand.
        let folded = match self.head.kind {
            ExecutionKind::AgentTurn => {
                let (revision, parent) = (self.head.revision_id, self.parent_message_id);
                machine.present.admit(revision, parent, self.input);
                1
            }
            _ => 0,
        };
        for (event, seq) in self.events.iter().zip(1..).skip(folded) {
            machine.apply(event, seq, &mut ignored);
        }
        let policy =
            crate::machine::restart::policy_record(self.head.execution_id, self.events.iter());
        let mut transition = Transition::create(self.head, self.events);
        if let Some(policy) = policy {
            transition = transition.with(Upsert::Policy(policy));
        }
        if let Some(job) = self.job {
            transition = transition.with(Upsert::Job(job));
        }
        transition.session = session;
        let committed = match store.submit(transition).await? {
            Outcome::Committed(committed) => committed,
            Outcome::SessionConflict { .. } => return Ok(None),
            other => return Err(Error::Internal(format!("creating an execution: {other:?}"))),
        };
        head.version = committed.version;
        head.last_seq = *committed.seqs.end();
        head.last_activity_ms = committed.at_ms;
        Ok(Some((head, machine, committed.version)))
    }
}
