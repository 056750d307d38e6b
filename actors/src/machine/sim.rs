//! A seeded simulation of the pure state machine (RELIABILITY R10, a small R22): random
//! controls, model decisions, tool results, late results and attempt restarts, driven the
//! way the actor drives it, with the invariants checked after every commit:
//! - replaying the committed events rebuilds exactly the live state (recovery = apply);
//! - once a Cancel is applied, the execution can only end Cancelled (K-5);
//! - a terminal state is final: no later transition changes it;
//! - no effect gets two results, and an External effect dispatched by an earlier attempt is
//!   never run again (E-4);
//! - a Step lets at most one step event commit before the execution pauses (K-2);
//! - a wait is answered or declined only while it is the pending wait of the current
//!   checkpoint, and a resolved wait never changes again (W-2, W-3);
//! - every transition is committed as the actor commits it, from the machine's plan
//!   (`Machine::plan`), with and without the model decision it was written from; the plan's
//!   head (state, pause reason, checkpoint and its next action), wait records and actions
//!   are what the machine itself reaches by folding the committed events.
//!
//! `OP_SIM_SEED` replays a run; each run prints its seed.

use openprogram_storage::{
    CommandId, Control, EffectId, Event, ExecutionState as Status, OwnerId, ReceiptStatus,
};

use super::projection::Projected;
use super::sim_checks::{
    check_capabilities, check_plan, check_waits_and_grants, control_of, fitting_answer, recovery,
    Rng, Seen,
};
use super::*;
use crate::attempt_lease::LeaseState;

/// Runs per test and inputs per run.
const RUNS: u64 = 300;
const INPUTS_PER_RUN: usize = 60;

/// What is in flight, as the actor would have it.
#[derive(Clone, Copy, PartialEq)]
enum InFlight {
    Model(EffectId),
    Tool(EffectId),
}

struct Sim {
    machine: Machine,
    log: Vec<Event>,
    in_flight: Option<InFlight>,
    /// Tools the script uses: `append` is External.
    epoch: u64,
    /// A result that was already on its way when its effect was aborted.
    late: Option<InFlight>,
    /// What the invariants remember across the run's commits.
    seen: Seen,
    /// S-8: the machine as a reader rebuilds it from the projection taken at the last
    /// restart, folded with every commit since, as a parked actor's partial machine is.
    partial: Option<Machine>,
    /// The model rarely replies, asks or fails (`s8_long_interleavings…`).
    long: bool,
    /// W-8: the wall clock, moved on by every input.
    now_ms: u64,
    /// W-7: the session's record as this execution's transitions leave it.
    session: openprogram_storage::SessionRecord,
    /// W-7: grants revoked so far: none ever approves again.
    revoked: std::collections::HashSet<openprogram_storage::WaitId>,
}

impl Sim {
    fn new(max_iterations: u32) -> Self {
        let admitted = super::tests::admitted(max_iterations);
        let mut sim = Sim {
            machine: Machine::default(),
            log: Vec::new(),
            in_flight: None,
            epoch: 0,
            late: None,
            seen: Seen::default(),
            partial: None,
            long: max_iterations > 100,
            now_ms: 1_000_000,
            session: Default::default(),
            revoked: Default::default(),
        };
        sim.commit(vec![admitted], "admission");
        sim.restart("first attempt");
        sim
    }

    fn restart(&mut self, context: &str) {
        // The old attempt's results are fenced: they never reach this machine.
        self.in_flight = None;
        self.late = None;
        let started = self.claim();
        self.partial = self.projected();
        if !self.machine.status().is_terminal() {
            self.commit(vec![started], context);
        }
    }

    /// S-8: the partial machine a reader rebuilds from a projection of the machine now
    /// (through its stored encoding).
    fn projected(&self) -> Option<Machine> {
        let first = self.log.first()?;
        let record = Projected::record(
            &self.machine,
            openprogram_storage::ExecutionId::new(),
            self.log.len() as u64,
        );
        let projected = Projected::read(&record).expect("a projection reads back");
        let mut admitted = Machine::default();
        admitted.apply(first, 1, &mut Vec::new());
        Some(projected.into_machine(admitted))
    }

    /// Commits events as the actor does, then checks every invariant.
    fn commit(&mut self, events: Vec<Event>, context: &str) {
        self.commit_decided(events, None, context);
    }

    /// `commit` for events decided from a model's `decision`, folded as the actor folds
    /// them (`apply_decided`): the replay check below then also checks that the decision
    /// and the text it was written to fold alike.
    fn commit_decided(&mut self, events: Vec<Event>, decision: Option<Decision>, context: &str) {
        let before = self.machine.status();
        let before_waits: Vec<WaitState> = self.machine.waits().into_iter().cloned().collect();
        let fresh = self.projected();
        let head = self.head();
        let writer = crate::machine::plan::Writer::Attempt { epoch: self.epoch };
        // The plan as the actor makes it (with the decision), and one from the events'
        // text alone: the same transition.
        let plan = self
            .machine
            .plan(&head, events, Vec::new(), decision, writer, 0, recovery);
        let events = plan.transition.events.clone();
        let from_text =
            self.machine
                .plan(&head, events.clone(), Vec::new(), None, writer, 0, recovery);
        let mut decision = plan.after.decision.clone();
        let mut actions = Vec::new();
        for event in &events {
            let seq = self.log.len() as u64 + 1;
            self.machine
                .apply_decided(event, seq, &mut actions, &mut decision);
            self.log.push(event.clone());
            self.seen.track(event, self.epoch, context);
        }
        // The machine folded the decision as a value, not from its text.
        assert!(
            decision.is_none(),
            "{context}: the machine did not take the decision"
        );
        for plan in [&plan, &from_text] {
            check_plan(&self.machine, plan, &head, &before_waits, &actions, context);
        }
        self.seen.check_state(&self.machine, before, context);
        check_waits_and_grants(
            &self.machine,
            &self.log,
            &events,
            &self.session,
            &mut self.revoked,
            context,
        );
        self.check_rebuilt(&events, fresh, context);
        if actions.contains(&Action::AbortEffect) {
            // The actor aborts it; a result already on its way still arrives.
            self.late = self.late.or(self.in_flight.take());
        }
        if actions.contains(&Action::RunDispatched) {
            if let Some(pending) = &self.machine.present.calls.pending_tool {
                self.in_flight = Some(InFlight::Tool(pending.effect_id));
            }
        }
    }

    /// Recovery = apply: the whole log replayed rebuilds the machine. S-8: a machine rebuilt
    /// from a projection (`fresh`, taken before this commit, or the one of the last restart)
    /// and folded since reads as the whole history, and offers the same controls.
    fn check_rebuilt(&mut self, events: &[Event], mut fresh: Option<Machine>, context: &str) {
        let mut replayed = Machine::default();
        for (index, event) in self.log.iter().enumerate() {
            replayed.apply(event, index as u64 + 1, &mut Vec::new());
        }
        assert_eq!(replayed, self.machine, "{context}: replay diverged");
        check_capabilities(&self.machine, self.in_flight.is_some(), context);
        let first_seq = self.log.len() - events.len() + 1;
        for partial in [fresh.as_mut(), self.partial.as_mut()]
            .into_iter()
            .flatten()
        {
            for (at, event) in events.iter().enumerate() {
                partial.apply(event, (first_seq + at) as u64, &mut Vec::new());
            }
            if !partial.reads_as(&self.machine) {
                assert_eq!(partial.present, self.machine.present, "{context}: present");
                assert_eq!(
                    format!("{:#?}", Projected::of(partial)),
                    format!("{:#?}", Projected::of(&self.machine)),
                    "{context}: a projection diverged"
                );
            }
            let at = super::tests::at(&self.machine, self.in_flight.is_some());
            assert_eq!(
                partial.capabilities(&at),
                self.machine.capabilities(&at),
                "{context}: a projection offers other controls"
            );
        }
    }

    /// The head the actor would hold now: the sim's log and attempt.
    fn head(&self) -> openprogram_storage::ExecutionHead {
        let mut head = openprogram_storage::ExecutionHead::new(
            openprogram_storage::ExecutionId::from_uuid(uuid::Uuid::nil()),
            openprogram_storage::SessionId::from_uuid(uuid::Uuid::nil()),
            openprogram_storage::RunId::from_uuid(uuid::Uuid::nil()),
            openprogram_storage::ExecutionKind::AgentTurn,
        );
        head.last_seq = self.log.len() as u64;
        head.version = self.log.len() as u64;
        head.fencing_epoch = self.epoch;
        head.state = self.machine.status();
        head
    }

    /// A new attempt's claim, built as the shell builds it (`LeaseState::claim`).
    fn claim(&mut self) -> Event {
        self.epoch += 1;
        let execution_id = openprogram_storage::ExecutionId::new();
        let ttl = std::time::Duration::from_secs(1);
        LeaseState::new(execution_id, OwnerId::new(), self.epoch, ttl).claim()
    }

    fn decide(&mut self, input: Input, context: &str) {
        if let Input::ModelDecided {
            effect_id,
            decision,
        } = input
        {
            let (events, decision) =
                self.machine
                    .decide_decision(effect_id, decision, self.now_ms, Some(&self.session));
            self.commit_decided(events, decision, context);
        } else if let Ok(events) = self.machine.decide(input) {
            self.commit(events, context);
        }
    }

    fn advance(&mut self, rng: &mut Rng) {
        if self.in_flight.is_some() {
            return;
        }
        match self.machine.next(EffectId::new, recovery, 0) {
            Next::Persist(events) => self.commit(events, "advance"),
            Next::CallModel { effect_id } => self.in_flight = Some(InFlight::Model(effect_id)),
            Next::RunTool(pending) => {
                if let Some(epoch) = self.seen.dispatched_at.get(&pending.effect_id) {
                    assert_eq!(
                        *epoch, self.epoch,
                        "an External effect dispatched by attempt {epoch} was run again"
                    );
                }
                let _ = rng;
                self.in_flight = Some(InFlight::Tool(pending.effect_id));
            }
            Next::RunFunction => unreachable!("the simulation runs agent turns"),
            Next::Idle => {}
        }
    }

    fn finish_effect(&mut self, rng: &mut Rng) {
        let effect = if self.late.is_some() && rng.below(2) == 0 {
            self.late.take()
        } else {
            self.in_flight.take()
        };
        let Some(effect) = effect else {
            return;
        };
        match effect {
            InFlight::Model(effect_id) => {
                // A long run's model mostly calls `echo`: its turn outgrows a projection.
                let pick = rng.below(if self.long { 70 } else { 7 });
                // W-7: once a grant was given, the model asks for its tool again often.
                let granted = !self.machine.present.waits.grants.is_empty()
                    || !self.session.grants.is_empty();
                let pick = if granted && rng.below(2) == 0 {
                    6
                } else {
                    pick
                };
                let input = match pick {
                    // W-6, W-8: a third of the asks are structured questions with a deadline;
                    // W-7: a third approve the `append` that follows (a grant may cover it).
                    6 => Input::ModelDecided {
                        effect_id,
                        decision: Decision::Ask {
                            prompt: "go?".into(),
                            wait: match if granted { 1 } else { rng.below(4) } {
                                0 => Some(super::AskDetails {
                                    kind: super::AskKind::Question,
                                    request: Some(serde_json::json!({"items": [
                                        {"id": "ok", "type": "boolean"}]})),
                                    timeout_ms: Some(1 + rng.below(3_000)),
                                }),
                                1 | 2 => Some(super::AskDetails {
                                    kind: super::AskKind::Approval,
                                    request: Some(serde_json::json!({"tool": "append"})),
                                    timeout_ms: None,
                                }),
                                _ => None,
                            },
                        },
                    },
                    0 => Input::ModelFailed {
                        effect_id,
                        error: "model error".into(),
                    },
                    1 => Input::ModelDecided {
                        effect_id,
                        decision: Decision::reply("done".into()),
                    },
                    2 | 3 => Input::ModelDecided {
                        effect_id,
                        decision: Decision::tool("append".into(), serde_json::json!({}).into()),
                    },
                    _ => Input::ModelDecided {
                        effect_id,
                        // Arguments stay the decision's text: the live machine and a replay
                        // fold the same text, whatever numbers it holds.
                        decision: Decision::tool(
                            "echo".into(),
                            serde_json::json!({"n": rng.float(), "text": "t"}).into(),
                        ),
                    },
                };
                self.decide(input, "model result");
            }
            InFlight::Tool(effect_id) => {
                let status = if rng.below(5) == 0 {
                    ReceiptStatus::Failed
                } else {
                    ReceiptStatus::Confirmed
                };
                self.decide(
                    Input::ToolFinished {
                        effect_id,
                        status,
                        output: "out".into(),
                    },
                    "tool result",
                );
            }
        }
    }

    /// W-8: the clock moves on; a pending wait's deadline may pass, and the deadlines actor
    /// asks the execution to expire it (now and then too early, as a stray timer would).
    fn expire(&mut self, rng: &mut Rng) {
        self.now_ms += rng.below(2_000);
        let Some(wait) = self.machine.present.waits.pending_wait().cloned() else {
            return;
        };
        let Some(deadline) = wait.deadline_ms else {
            assert_eq!(
                self.machine.decide_wait_expiry(wait.wait_id, u64::MAX),
                None
            );
            return;
        };
        let Some(mut events) = self.machine.decide_wait_expiry(wait.wait_id, self.now_ms) else {
            assert!(
                self.now_ms < deadline
                    || self.machine.present.run.cancel_requested
                    || wait.status != openprogram_storage::WaitStatus::Open,
                "a wait past its deadline did not expire"
            );
            return;
        };
        assert!(
            self.now_ms >= deadline,
            "a wait expired before its deadline"
        );
        // As the actor does: a parked execution's expiry claims an attempt.
        events.insert(0, self.claim());
        self.commit(events, "expire");
        let expired = self.machine.wait(wait.wait_id).expect("the wait");
        assert_eq!(expired.status, openprogram_storage::WaitStatus::Expired);
        assert_eq!(self.machine.status(), Status::Paused);
    }

    /// A random control, and the wait an answer or decline names.
    fn pick_control(&self, rng: &mut Rng) -> (Control, openprogram_storage::WaitId) {
        // An answer names the pending wait or, as a stale client would, any earlier one.
        let target = match rng.below(2) {
            0 => self
                .machine
                .present
                .waits
                .pending_wait()
                .map(|wait| wait.wait_id),
            _ => None,
        }
        .or_else(|| {
            let waits = self.machine.waits();
            (!waits.is_empty()).then(|| waits[rng.below(waits.len() as u64) as usize].wait_id)
        })
        .unwrap_or_else(openprogram_storage::WaitId::new);
        // the effect in doubt, resolved either way (a `NotApplied` one runs again, same
        // effect id); some other effect, refused.
        let doubted = self
            .machine
            .present
            .calls
            .unresolved
            .as_ref()
            .map_or_else(EffectId::new, |unresolved| unresolved.effect_id);
        // A waiting execution is answered often: approvals and their grants get used.
        let waiting = self.machine.status() == Status::Waiting && rng.below(2) == 0;
        let revoking =
            self.machine.present.waits.has_grant(Some(&self.session)) && rng.below(8) == 0;
        let pick = match (waiting, revoking) {
            (true, _) => 5,
            (_, true) => 4,
            _ => rng.below(8),
        };
        let control = match pick {
            7 => Control::Reconcile {
                effect_id: doubted,
                status: match rng.below(2) {
                    0 => ReceiptStatus::Confirmed,
                    _ => ReceiptStatus::NotApplied,
                },
                output: "checked".into(),
            },
            // W-6: an answer that fits the wait's request, or (now and then) one that does not.
            5 => Control::Answer {
                wait_id: target,
                answer: if rng.below(4) == 0 {
                    "yes".into()
                } else {
                    fitting_answer(&self.machine, target)
                },
                // W-7: any scope; tool and session ones fit approvals for a tool only.
                scope: match rng.below(4) {
                    0 => openprogram_storage::AnswerScope::Tool,
                    1 => openprogram_storage::AnswerScope::Session,
                    2 => openprogram_storage::AnswerScope::Discussion,
                    _ => openprogram_storage::AnswerScope::Operation,
                },
            },
            // W-7: a grant given (or, now and then, one that is not).
            4 if revoking || rng.below(2) == 0 => Control::Revoke {
                grant_id: self
                    .machine
                    .present
                    .waits
                    .grants
                    .iter()
                    .find(|grant| !grant.revoked)
                    .filter(|_| rng.below(5) > 0)
                    .map_or_else(openprogram_storage::WaitId::new, |grant| grant.grant_id),
            },
            6 => Control::Decline { wait_id: target },
            0 => Control::Pause,
            1 => Control::Continue,
            2 => Control::Step,
            3 => Control::Steer {
                text: "steer".into(),
            },
            // A long run is cancelled once in a while only.
            _ if self.long && rng.below(20) > 0 => Control::Continue,
            _ => Control::Cancel,
        };
        (control, target)
    }

    fn control(&mut self, rng: &mut Rng) {
        let (control, target) = self.pick_control(rng);
        let kind = control.kind();
        // As the actor does: one transition saves the command (`ControlAccepted` first), claims
        // an attempt if the control moves a parked execution, and records the decision.
        let busy = self.in_flight.is_some();
        let command_id = CommandId::new();
        let accepted = Event::ControlAccepted {
            command_id,
            control: control.clone(),
        };
        let mut at = super::tests::at(&self.machine, busy);
        at.now_ms = self.now_ms;
        at.session = Some(std::sync::Arc::new(self.session.clone()));
        let decided = self
            .machine
            .decide_command(command_id, control.into(), None, &at);
        if let Ok(Accepted::Control { mut events, .. }) = decided {
            if matches!(
                events.first(),
                Some(Event::ControlApplied {
                    control: Control::Answer { .. } | Control::Decline { .. },
                    ..
                })
            ) {
                let pending = self.machine.present.waits.pending_wait();
                assert_eq!(
                    pending.map(|wait| wait.wait_id),
                    Some(target),
                    "{kind} applied to a wait that is not pending"
                );
                assert_eq!(
                    pending.map(|wait| wait.checkpoint_seq),
                    Some(self.machine.present.run.checkpoint_seq),
                    "{kind} applied to a wait of an earlier checkpoint"
                );
            }
            if matches!(self.machine.status(), Status::Paused | Status::Waiting)
                && events
                    .iter()
                    .any(|e| matches!(e, Event::StateChanged { .. }))
            {
                events.insert(0, self.claim());
            }
            events.insert(0, accepted);
            // W-7: the session write the actor adds for this control, at the version read.
            let after = self.machine.session_after(
                &control_of(&events),
                openprogram_storage::ExecutionId::from_uuid(uuid::Uuid::nil()),
                self.session.clone(),
            );
            self.commit(events, kind);
            if let Some(mut after) = after {
                after.version = self.session.version + 1;
                self.session = after;
            }
        }
    }
}

#[test]
fn r10_seeded_interleavings_keep_the_machine_invariants() {
    simulate(RUNS, INPUTS_PER_RUN, 8);
}

/// S-8 with histories longer than a projection keeps (`projection::KEPT`): fewer, longer
/// runs of the same simulation.
#[test]
fn s8_long_interleavings_read_alike_from_a_projection() {
    simulate(12, 400, 200);
}

fn simulate(runs: u64, inputs_per_run: usize, max_iterations: u32) {
    let seed = std::env::var("OP_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |elapsed| elapsed.as_nanos() as u64)
                | 1
        });
    eprintln!("machine simulation: seed {seed} (replay with OP_SIM_SEED={seed})");
    let mut rng = Rng(seed);
    let mut ended = 0;
    let mut longest = 0;
    let (mut granted, mut expired) = (0, 0);
    for _ in 0..runs {
        let mut sim = Sim::new(max_iterations);
        for _ in 0..inputs_per_run {
            sim.now_ms += rng.below(200);
            match rng.below(11) {
                0..=3 => sim.advance(&mut rng),
                4..=6 => sim.finish_effect(&mut rng),
                7 | 8 => sim.control(&mut rng),
                9 => sim.expire(&mut rng),
                _ => sim.restart("restart"),
            }
        }
        ended += usize::from(sim.seen.terminal.is_some());
        for event in &sim.log {
            match event {
                Event::GrantUsed { .. } => granted += 1,

                Event::WaitChanged {
                    status: openprogram_storage::WaitStatus::Expired,
                    ..
                } => expired += 1,
                _ => {}
            }
        }
        longest = longest.max(sim.machine.receipts.iter().count());
    }
    assert!(
        ended > 0,
        "seed {seed}: no run reached a terminal state; the simulation is too weak"
    );
    if inputs_per_run < 100 {
        assert!(
            granted > 0 && expired > 0,
            "seed {seed}: {granted} grants used, {expired} waits expired: the simulation is too weak"
        );
    }
    if inputs_per_run > 100 {
        assert!(
            longest > super::projection::KEPT,
            "seed {seed}: no run outgrew a projection ({longest} receipts)"
        );
    }
}
