//! R22's in-memory model (RELIABILITY.md): SPEC's rules over one agent turn admitted paused
//! — K-2 controls, K-3 which are offered where, W-2 answer and decline, E-5 iteration
//! limits, the scripted provider and `append` of §6 — and the random scripts and actions
//! it is driven with. `model_check.rs` applies the same actions to a runtime and compares.

use std::path::Path;

use rand::rngs::StdRng;
use rand::Rng;
use serde_json::{json, Value};

/// A script element (§6, scripted provider).
#[derive(Debug, Clone)]
pub(super) enum Element {
    Echo,
    Append(String),
    Fail,
    Ask,
    Reply(String),
}

impl Element {
    pub(super) fn json(&self, sink: &Path) -> Value {
        match self {
            Element::Echo => json!({"tool": "echo", "args": {"text": "e"}}),
            Element::Append(line) => {
                json!({"tool": "append", "args": {"path": sink, "line": line}})
            }
            Element::Fail => json!({"tool": "fail", "args": {"message": "no"}}),
            Element::Ask => json!({"ask": "may I?"}),
            Element::Reply(text) => json!({"reply": text}),
        }
    }
}

/// What the test does next; applied to whatever state the execution is in.
#[derive(Debug, Clone)]
pub(super) enum Action {
    Pause,
    Continue,
    Step,
    Steer(String),
    Cancel,
    Answer,
    Decline,
    Fork,
    Retry,
    Reconcile,
    StopProcess,
    /// The previous command again, same id and payload (K-4).
    Duplicate,
    /// The previous command's id with another payload (K-4).
    Reuse,
    /// A steer against the version before the current one (K-4).
    Stale,
    /// Crash and restart at rest.
    Crash,
    /// Continue, crash after this many ms, restart: recovery resumes the turn.
    CrashWhileRunning(u64),
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum State {
    /// As admitted.
    #[default]
    Paused,
    Waiting,
    Completed,
    Cancelled,
    Failed,
}

impl State {
    pub(super) fn name(self) -> &'static str {
        match self {
            State::Paused => "paused",
            State::Waiting => "waiting",
            State::Completed => "completed",
            State::Cancelled => "cancelled",
            State::Failed => "failed",
        }
    }

    pub(super) fn terminal(self) -> bool {
        matches!(self, State::Completed | State::Cancelled | State::Failed)
    }
}

/// The model: SPEC's rules over one agent turn, admitted paused.
#[derive(Debug, Clone, Default)]
pub(super) struct Model {
    pub(super) script: Vec<Element>,
    pub(super) max_iterations: u32,
    /// The next element a decision takes.
    pub(super) cursor: usize,
    /// A decided tool call not yet run.
    pub(super) tool_pending: bool,
    pub(super) decisions: u32,
    pub(super) state: State,
    pub(super) steers: Vec<String>,
    pub(super) text: String,
    pub(super) delivered: Vec<String>,
    /// The last run was a Step: a wait it reached pauses the turn once resolved.
    pub(super) stepping: bool,
}

impl Model {
    pub(super) fn new(script: Vec<Element>, max_iterations: u32) -> Self {
        Self {
            script,
            max_iterations,
            ..Self::default()
        }
    }

    /// Which kinds a command may have now (K-3, the control table of K-2 and W-2). Fork is
    /// not predicted: its saved points are the runtime's to list.
    pub(super) fn accepts(&self, kind: &str) -> bool {
        match (self.state, kind) {
            (State::Paused, "continue" | "step" | "steer" | "cancel") => true,
            (State::Waiting, "answer" | "decline" | "steer" | "cancel") => true,
            (state, "retry") => state.terminal(),
            _ => false,
        }
    }

    /// One declared step (K-2): a provider decision, or the decided tool action.
    pub(super) fn step_once(&mut self) {
        if self.tool_pending {
            self.tool_pending = false;
            if let Some(Element::Append(line)) = self.script.get(self.cursor - 1) {
                self.delivered.push(line.clone());
            }
            return;
        }
        if self.decisions == self.max_iterations {
            self.state = State::Failed; // E-5
            return;
        }
        let Some(element) = self.script.get(self.cursor).cloned() else {
            // A declined ask skipped the reply: the script has nothing left (a model error).
            self.state = State::Failed;
            return;
        };
        self.decisions += 1;
        self.cursor += 1;
        match element {
            Element::Echo | Element::Append(_) | Element::Fail => self.tool_pending = true,
            Element::Ask => self.state = State::Waiting,
            Element::Reply(text) => {
                self.text = text;
                for steer in &self.steers {
                    self.text.push_str(&format!("\n[steer] {steer}"));
                }
                self.state = State::Completed;
            }
        }
    }

    /// Runs until something stops the turn: a wait, its end.
    pub(super) fn run(&mut self) {
        while self.state == State::Paused {
            self.step_once();
        }
    }

    /// Applies an accepted command of `kind`.
    pub(super) fn apply(&mut self, kind: &str, text: &str) {
        match kind {
            "continue" => {
                self.stepping = false;
                self.run();
            }
            "step" => {
                self.stepping = true;
                self.step_once();
            }
            "steer" => self.steers.push(text.to_owned()),
            "cancel" => self.state = State::Cancelled,
            "answer" | "decline" => {
                // Declined, the guarded element is skipped, never run (W-2). Either way the
                // turn goes on, unless a Step reached the wait: that step is spent (K-2).
                if kind == "decline" {
                    self.cursor += 1;
                }
                self.state = State::Paused;
                if !self.stepping {
                    self.run();
                }
            }
            _ => {}
        }
    }
}

/// One case: a script and the actions applied to it.
#[derive(Debug, Clone)]
pub(super) struct Case {
    pub(super) tag: String,
    pub(super) script: Vec<Element>,
    pub(super) max_iterations: u32,
}

pub(super) fn random_case(rng: &mut StdRng, tag: String) -> Case {
    let len = rng.gen_range(1..7);
    let mut script: Vec<Element> = (0..len)
        .map(|index| match rng.gen_range(0..4) {
            0 => Element::Echo,
            1 => Element::Append(format!("{tag}-{index}")),
            2 => Element::Fail,
            _ => Element::Ask,
        })
        .collect();
    script.push(Element::Reply(format!("done {tag}")));
    // Mostly enough iterations; sometimes too few (E-5).
    let needed = script.len() as u32;
    let max_iterations = match rng.gen_bool(0.8) {
        true => needed + 2,
        false => rng.gen_range(1..=needed),
    };
    Case {
        tag,
        script,
        max_iterations,
    }
}

pub(super) fn random_action(rng: &mut StdRng) -> Action {
    match rng.gen_range(0..24) {
        0 => Action::Pause,
        1..=4 => Action::Continue,
        5..=8 => Action::Step,
        9 | 10 => Action::Steer(format!("s{}", rng.gen_range(0..100))),
        11 => Action::Cancel,
        12..=14 => Action::Answer,
        15 => Action::Decline,
        16 => Action::Fork,
        17 => Action::Retry,
        18 => Action::Reconcile,
        19 => Action::StopProcess,
        20 => Action::Duplicate,
        21 => Action::Reuse,
        22 => Action::Stale,
        _ => match rng.gen_bool(0.5) {
            true => Action::Crash,
            false => Action::CrashWhileRunning(rng.gen_range(0..20)),
        },
    }
}

/// The case with its own sink lines, so a replay's deliveries are told apart.
pub(super) fn retag(case: &Case, tag: &str) -> Case {
    let script = case
        .script
        .iter()
        .enumerate()
        .map(|(index, element)| match element {
            Element::Append(_) => Element::Append(format!("{tag}-{index}")),
            other => other.clone(),
        })
        .collect();
    Case {
        tag: tag.to_owned(),
        script,
        max_iterations: case.max_iterations,
    }
}
