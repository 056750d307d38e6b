//! The plan of one transition, decided by the pure machine: the events with their seqs, the
//! records they change, the head they lead to, and the actions once storage acknowledged
//! them. It folds into a copy of the present only, never the history, so planning costs the
//! same at the first step and the ten-thousandth.

use openprogram_storage::{
    AttemptLease, Checkpoint, Committed, Control, Event, EventEnvelope, ExecutionHead,
    ReceiptRecord, ReceiptStatus, Transition, Upsert,
};

use super::projection::Projected;
use super::waits::changed_wait_records;
use super::{Action, Decision, Machine, Present, Recovery};

/// Who writes a transition, which decides what its head says about the attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    /// An actor before its attempt started: events only, the head is left as it is.
    Unclaimed,
    /// The attempt fenced with `epoch` (it started in this transition or earlier).
    Attempt { epoch: u64 },
    /// Recovery claiming the execution with `epoch`: the attempt is the one this very
    /// transition starts, or none (a hold or an expiry leaves no attempt owning it).
    Recovery { epoch: u64 },
}

impl Writer {
    fn epoch(self) -> Option<u64> {
        match self {
            Writer::Unclaimed => None,
            Writer::Attempt { epoch } | Writer::Recovery { epoch } => Some(epoch),
        }
    }
}

/// One transition, decided: submit `transition`; once it is committed, do `after`.
#[derive(Debug)]
pub struct Plan {
    pub transition: Transition,
    pub after: AfterCommit,
}

/// What a plan does once its transition is committed; nothing if it is not.
#[derive(Debug)]
pub struct AfterCommit {
    /// The head the transition writes, but for what storage assigns (`committed_head`).
    pub head: ExecutionHead,
    /// What the shell performs, in order.
    pub actions: Vec<Action>,
    /// The model decision the events were written from, folded with them.
    pub decision: Option<Decision>,
    writer: Writer,
}

impl AfterCommit {
    /// The head as committed: the plan's, with the version, seqs, time and epoch storage
    /// acknowledged.
    pub fn committed_head(&self, committed: &Committed) -> ExecutionHead {
        let mut head = self.head.clone();
        head.version = committed.version;
        head.last_seq = *committed.seqs.end();
        head.last_activity_ms = committed.at_ms;
        if let Some(epoch) = self.writer.epoch() {
            head.fencing_epoch = epoch;
        }
        head
    }
}

impl Machine {
    /// The plan of the transition that appends `events` (with `upserts`) to the execution
    /// `head` describes, written by `writer` at `now_ms` (what a Job's lease released here
    /// was held for). `decision`: the model decision its `ModelDecided` was written from
    /// (`decide_decision`). `recovery` says how a tool recovers: an External tool's
    /// receipts are also kept by effect id.
    ///
    /// J-1, J-2: a Job's lease never outlives what it is for. The plan gives it back in the
    /// same transition — before a new attempt's claim (the old attempt's lease is not the
    /// new one's), and after any event that leaves the Job in a state it does not run in —
    /// and writes the Job's record whenever its lease changes.
    #[allow(clippy::too_many_arguments)]
    pub fn plan(
        &self,
        head: &ExecutionHead,
        mut events: Vec<Event>,
        upserts: Vec<Upsert>,
        decision: Option<Decision>,
        writer: Writer,
        now_ms: u64,
        recovery: impl Fn(&str) -> Recovery,
    ) -> Plan {
        let mut present = self.present.clone();
        let mut next = head.clone();
        let mut actions = Vec::new();
        let mut receipts = Vec::new();
        let mut unfolded = decision.as_ref();
        if let Writer::Recovery { .. } = writer {
            next.attempt = None;
        }
        let claim = events
            .iter()
            .enumerate()
            .find_map(|(at, event)| match event {
                Event::AttemptStarted { epoch, .. } => Some((at, *epoch)),
                _ => None,
            });
        if let Some((at, epoch)) = claim {
            if let Some(release) = present.lease_to_release(Some(epoch), now_ms) {
                events.insert(at, release);
            }
        }
        let mut index = 0;
        while index < events.len() {
            let event = &mut events[index];
            let seq = head.last_seq + index as u64 + 1;
            if let Event::CheckpointPublished { checkpoint_seq } = event {
                *checkpoint_seq = seq;
                // Its `next_action` is set below, once the whole transition is folded.
                next.checkpoint = Some(Checkpoint {
                    seq,
                    next_action: String::new(),
                });
            }
            if let Some(receipt) = receipt_of(&present, event, &next, writer, &recovery) {
                receipts.push(Upsert::Receipt(receipt));
            }
            let decided = match event {
                Event::ModelDecided { .. } => unfolded.take(),
                _ => None,
            };
            present.fold(event, seq, decided, &mut actions);
            head_follows(&mut next, event);
            if index + 1 == events.len() {
                if let Some(release) = present.lease_to_release(None, now_ms) {
                    events.push(release);
                }
            }
            index += 1;
        }
        // The checkpoint names what comes next once the whole transition is applied: after an
        // `Ask`, the wait opened after the checkpoint event in the same transition.
        if let Some(checkpoint) = next
            .checkpoint
            .as_mut()
            .filter(|checkpoint| checkpoint.seq > head.last_seq)
        {
            checkpoint.next_action = present.next_action();
        }
        next.state = present.status();
        next.pause_reason.clone_from(&present.run.pause_reason);
        let mut transition =
            Transition::new(head.execution_id, events).expect_version(head.version);
        transition.upserts = upserts;
        transition.upserts.extend(receipts);
        self.add_records(&present, head, &mut transition);
        if let Some(epoch) = writer.epoch() {
            transition = transition.by_epoch(epoch).with_head(next.clone());
        }
        Plan {
            transition,
            after: AfterCommit {
                head: next,
                actions,
                decision,
                writer,
            },
        }
    }

    /// What a transition writes besides its events and receipts, once its events are
    /// folded into `present`: the Job's record if its lease changed, the waits that moved,
    /// now and then a projection (S-8), and the session check of a grant relied on (W-7).
    fn add_records(&self, present: &Present, head: &ExecutionHead, transition: &mut Transition) {
        if let Some(job) = present.job.as_ref().filter(|job| {
            self.present.job.as_ref().map(|was| was.recorded()) != Some(job.recorded())
        }) {
            transition.upserts.push(Upsert::Job(job.record(head)));
        }
        // K-7: its own restart window, where recovery reads it.
        let policy = super::restart::policy_record(head.execution_id, transition.events.iter());
        transition.upserts.extend(policy.map(Upsert::Policy));
        let (before, after) = (&self.present.waits.active, &present.waits.active);
        let waits = changed_wait_records(before, after, head.execution_id);
        transition
            .upserts
            .extend(waits.into_iter().map(Upsert::Wait));
        // S-8: now and then, the projection of the machine as it is before these events.
        if super::projection::due(head.last_seq, transition.events.len()) {
            transition
                .upserts
                .push(Upsert::Projection(Projected::record(
                    self,
                    head.execution_id,
                    head.last_seq,
                )));
        }
        // W-7: a session grant relied on is checked in the same write: the session record is
        // still at the version the decision read.
        let relied = transition.events.iter().find_map(|event| match event {
            Event::GrantUsed {
                session_version: Some(version),
                ..
            } => Some(*version),
            _ => None,
        });
        if let Some(version) = relied {
            transition.session = Some(openprogram_storage::SessionWrite {
                session_id: head.session_id,
                expected_version: version,
                record: None,
            });
        }
    }

    /// Folds a committed plan's events (as storage returned them) into the present and the
    /// history. The actions they lead to are the plan's.
    pub fn apply_committed(&mut self, events: &[EventEnvelope], mut decision: Option<Decision>) {
        let mut ignored = Vec::new();
        for envelope in events {
            self.apply_decided(&envelope.event, envelope.seq, &mut ignored, &mut decision);
        }
    }
}

/// What an event changes in the head besides the state, the pause reason and the checkpoint.
fn head_follows(head: &mut ExecutionHead, event: &Event) {
    match event {
        Event::RestartIntentRecorded { intent } => head.restart_intent = Some(intent.clone()),
        Event::ContractAdopted { revision_id } => head.revision_id = *revision_id,
        // A new effect (not one still in doubt), or a person continuing it, ends the
        // interruption the intent was about.
        Event::ToolFinished { status, .. } | Event::StepFinished { status, .. }
            if matches!(status, ReceiptStatus::Dispatched | ReceiptStatus::Unknown) => {}
        Event::ModelDecided { .. }
        | Event::ToolFinished { .. }
        | Event::StepFinished { .. }
        | Event::ControlApplied {
            control: Control::Continue | Control::Step,
            ..
        } => head.restart_intent = None,
        Event::AttemptStarted {
            attempt_id,
            owner_id,
            epoch,
        } => {
            head.attempt = Some(AttemptLease {
                attempt_id: *attempt_id,
                owner_id: *owner_id,
                epoch: *epoch,
            });
        }
        _ => {}
    }
}

/// The receipt record an event updates, read from the present and head before the event
/// (the attempt is the one writing: none for a recovery claim that starts none). Every
/// receipt is in the log already (the decision or result event of the same transition,
/// E-3); a record is also kept by effect id for External tools only, whose receipts recovery
/// and reconciliation look up. Doing it for every step would cost a random-key sled insert
/// per step at materialization.
fn receipt_of(
    present: &Present,
    event: &Event,
    head: &ExecutionHead,
    writer: Writer,
    recovery: &impl Fn(&str) -> Recovery,
) -> Option<ReceiptRecord> {
    let receipt = |effect_id, tool, status, output| ReceiptRecord {
        effect_id,
        execution_id: head.execution_id,
        attempt_id: head.attempt.as_ref().map(|lease| lease.attempt_id),
        epoch: writer.epoch().unwrap_or(0),
        tool,
        status,
        output,
    };
    let (effect_id, tool, status, output) = match event {
        Event::ToolDispatched {
            effect_id, tool, ..
        } => (*effect_id, tool.clone(), ReceiptStatus::Dispatched, None),
        Event::ToolFinished {
            effect_id,
            status,
            output,
        } => {
            let tool = present.calls.pending_tool.as_ref()?.tool.clone();
            (*effect_id, tool, *status, Some(output.clone()))
        }
        // A durable function's External steps: only those have an intent (`StepStarted`).
        Event::StepStarted { step_id, effect_id } => {
            (*effect_id, step_id.clone(), ReceiptStatus::Dispatched, None)
        }
        Event::StepFinished {
            step_id,
            effect_id,
            status,
            output,
        } => {
            present
                .calls
                .pending_steps
                .iter()
                .find(|pending| pending.effect_id == *effect_id)?;
            (*effect_id, step_id.clone(), *status, Some(output.clone()))
        }
        Event::ControlApplied {
            control:
                Control::Reconcile {
                    effect_id,
                    status,
                    output,
                },
            ..
        } => {
            let tool = present.calls.unresolved.as_ref()?.tool.clone();
            (*effect_id, tool, *status, Some(output.clone()))
        }
        _ => return None,
    };
    // A function's receipts are all its External steps'.
    if present.function.is_none() && recovery(&tool) != Recovery::External {
        return None;
    }
    Some(receipt(effect_id, tool, status, output))
}
