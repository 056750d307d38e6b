//! R22 (RELIABILITY.md), the check: random scripts and commands — every control kind,
//! duplicates, reused ids, stale versions — with crashes and restarts (at rest, and while a
//! turn runs), applied to a runtime on a real store and to an in-memory model of SPEC's
//! rules (K-2, K-3, K-4, W-2, E-5, §6's scripted provider and `append`). After every action
//! they must agree: state, reply text, open wait, and the lines the oracle (an `append` sink
//! outside the data dir) received, each exactly once. A divergence carries the seed and the
//! history, shrunk (actions dropped one at a time while a fresh execution still diverges).
//!
//! A crash here is in-process (`Runtime::halt`): `append` writes within its call's first
//! poll, so a crash between a dispatch and its delivery is R01's to check (a real abort).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use openprogram_storage::{CommandId, ExecutionId, ProcessId, SessionId};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde::Serialize;
use serde_json::{json, Value};

use crate::soak::kill_loop::harness;
use crate::soak::model::{random_action, random_case, retag, Action, Case, Model, State};
use crate::soak::oracle::sink_lines;
use crate::{Command, CommandReply, RestartWindow, Runtime, ScriptElement, Snapshot, StartRequest};

/// How long the runtime may take to come to rest after an action.
const AT_REST_WITHIN: Duration = Duration::from_secs(30);

/// The runtime (reopened after each crash), the session of the case it runs, and the oracle.
struct World {
    /// The store in `data`, the oracle's sink beside it (outside the data dir).
    dir: tempfile::TempDir,
    session: SessionId,
    runtime: Option<Runtime>,
    sink: PathBuf,
    crashes: usize,
}

impl World {
    fn new() -> Result<Self, String> {
        let dir = tempfile::tempdir().map_err(harness)?;
        let sink = dir.path().join("sink");
        std::fs::write(&sink, "").map_err(harness)?;
        let mut world = Self {
            dir,
            session: SessionId::new(),
            runtime: None,
            sink,
            crashes: 0,
        };
        world.runtime = Some(world.open()?);
        Ok(world)
    }

    fn open(&self) -> Result<Runtime, String> {
        Runtime::builder()
            .data_dir(self.dir.path().join("data"))
            .restart_window(RestartWindow::Unlimited)
            .open()
            .map_err(|error| format!("harness: open: {error}"))
    }

    fn runtime(&self) -> Result<&Runtime, String> {
        self.runtime
            .as_ref()
            .ok_or_else(|| "harness: no runtime".to_owned())
    }

    /// A crash (the actors stop where they are, nothing is paused) and a restart.
    async fn restart(&mut self) -> Result<(), String> {
        if let Some(runtime) = self.runtime.take() {
            runtime.halt();
        }
        let runtime = self.open()?;
        runtime
            .recovery()
            .await
            .map_err(|error| format!("recovery: {error}"))?;
        self.runtime = Some(runtime);
        self.crashes += 1;
        Ok(())
    }

    async fn snapshot(&self, execution: ExecutionId) -> Result<Snapshot, String> {
        self.runtime()?
            .snapshot(self.session, execution)
            .await
            .map_err(|error| format!("snapshot: {error}"))
    }

    /// The snapshot once nothing runs: no turn in progress, no answer being applied, no
    /// unknown effect the `append` protocol is being asked about (it always answers here:
    /// the sink exists, so `reconciliation_required` never lasts).
    async fn at_rest(&self, execution: ExecutionId) -> Result<Snapshot, String> {
        let started = Instant::now();
        loop {
            let snapshot = self.snapshot(execution).await?;
            let busy = matches!(
                snapshot.state,
                "running" | "queued" | "cancelling" | "reconciliation_required"
            ) || snapshot.waits.iter().any(|wait| wait.status == "submitted");
            if !busy {
                return Ok(snapshot);
            }
            if started.elapsed() > AT_REST_WITHIN {
                return Err(format!("L1: never at rest: {snapshot:?}"));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    async fn send(&self, execution: ExecutionId, command: Command) -> Result<CommandReply, String> {
        self.runtime()?
            .command(self.session, execution, command)
            .await
            .map_err(|error| format!("command: {error}"))
    }

    /// The sink's lines of case `tag`, in order.
    fn delivered(&self, tag: &str) -> Vec<String> {
        let prefix = format!("{tag}-");
        sink_lines(&self.sink)
            .into_iter()
            .map(|(line, _)| line)
            .filter(|line| line.starts_with(&prefix))
            .collect()
    }

    /// Runs `actions` on a new execution of `case`; the first divergence, if any.
    async fn run(&mut self, case: &Case, actions: &[Action]) -> Result<(), String> {
        // Each case a conversation of its own: a session runs one turn at a time (C-2), and
        // a case may leave its turn paused or waiting.
        self.session = SessionId::new();
        let script = case
            .script
            .iter()
            .map(|e| ScriptElement::from(e.json(&self.sink)));
        let request = StartRequest {
            message: "test".into(),
            script: script.collect(),
            max_iterations: Some(case.max_iterations),
            start_paused: true,
            ..Default::default()
        };
        let execution = self
            .runtime()?
            .start_execution(self.session, request)
            .await
            .map_err(|error| format!("start: {error}"))?
            .execution_id;
        let mut model = Model::new(case.script.clone(), case.max_iterations);
        let mut last: Option<(Command, CommandReply)> = None;
        for (index, action) in actions.iter().enumerate() {
            let before = self.at_rest(execution).await?;
            let diverged = |what: String| Err(format!("after action {index} ({action:?}): {what}"));
            let acted = self.act(execution, &mut model, &before, action, &mut last);
            if let Err(what) = acted.await {
                return diverged(what);
            }
            let after = self.at_rest(execution).await?;
            if let Err(what) = self.agree(case, &model, &after) {
                return diverged(what);
            }
        }
        Ok(())
    }

    /// One action: a crash, a command sent again (as it was, or its id with another
    /// payload), or a command the model decides too.
    async fn act(
        &mut self,
        execution: ExecutionId,
        model: &mut Model,
        before: &Snapshot,
        action: &Action,
        last: &mut Option<(Command, CommandReply)>,
    ) -> Result<(), String> {
        match action {
            Action::Crash => self.restart().await,
            Action::CrashWhileRunning(ms) => {
                let body = json!({"kind": "continue", "expected_version": before.version});
                let reply = self.send(execution, command(body)?).await?;
                expect_status(model, "continue", &reply)?;
                if reply.status == "applied" {
                    model.apply("continue", "");
                }
                tokio::time::sleep(Duration::from_millis(*ms)).await;
                self.restart().await
            }
            Action::Duplicate => {
                let Some((sent, reply)) = last.clone() else {
                    return Ok(());
                };
                let again = self.send(execution, sent).await?;
                match (again.status, again.version) == (reply.status, reply.version) {
                    true => Ok(()),
                    false => Err(format!(
                        "K-4: a duplicate answered {again:?}, first {reply:?}"
                    )),
                }
            }
            Action::Reuse => {
                let Some((sent, _)) = last.clone() else {
                    return Ok(());
                };
                let other = command(
                    json!({"command_id": sent.command_id, "kind": "steer", "text": "another payload"}),
                )?;
                let reply = self
                    .runtime()?
                    .command(self.session, execution, other)
                    .await;
                match reply {
                    Err(crate::Error::CommandConflict { .. }) => Ok(()),
                    _ => Err(format!("K-4: an id reused with another payload: {reply:?}")),
                }
            }
            _ => match body(action, before) {
                Some((kind, body)) => {
                    let sent = command(body)?;
                    let reply = self.send(execution, sent.clone()).await?;
                    *last = Some((sent, reply.clone()));
                    self.decided(execution, model, before, action, kind, reply)
                        .await
                }
                None => Ok(()),
            },
        }
    }

    /// The reply to a command agrees with the model, which then applies it; a fork's or a
    /// retry's child starts paused (K-2), and the original is untouched.
    async fn decided(
        &self,
        execution: ExecutionId,
        model: &mut Model,
        before: &Snapshot,
        action: &Action,
        kind: &str,
        reply: CommandReply,
    ) -> Result<(), String> {
        // Whether there is a saved point to fork from is the runtime's to say: a fork is
        // not the model's.
        if kind != "fork" {
            expect_status(model, kind, &reply)?;
        }
        let child = match kind {
            "fork" => reply.execution_id,
            "retry" if reply.status != "rejected" => {
                Some(reply.execution_id.ok_or("retry named no child")?)
            }
            _ if reply.status == "rejected" => return self.unchanged(execution, before).await,
            _ => {
                let text = match action {
                    Action::Steer(text) => text.as_str(),
                    _ => "",
                };
                model.apply(kind, text);
                return Ok(());
            }
        };
        if let Some(child) = child {
            let child = self.snapshot(child).await?;
            if child.state != "paused" {
                return Err(format!("K-2: a {kind} child is {}", child.state));
            }
        }
        self.unchanged(execution, before).await
    }

    /// A rejected command, a fork or a retry leaves the execution as it was.
    async fn unchanged(&self, execution: ExecutionId, before: &Snapshot) -> Result<(), String> {
        let after = self.at_rest(execution).await?;
        let seen = |s: &Snapshot| (s.state, s.version, s.text.clone(), s.waits.len());
        match seen(&after) == seen(before) {
            true => Ok(()),
            false => Err(format!(
                "changed by a command that must not: {before:#?} -> {after:#?}"
            )),
        }
    }

    /// The runtime at rest agrees with the model.
    fn agree(&self, case: &Case, model: &Model, snapshot: &Snapshot) -> Result<(), String> {
        if snapshot.state != model.state.name() {
            return Err(format!("state {} (model {:?})", snapshot.state, model));
        }
        if model.state == State::Completed && snapshot.text != model.text {
            return Err(format!("text {:?} (model {:?})", snapshot.text, model.text));
        }
        let open = snapshot.waits.iter().filter(|w| w.status == "open").count();
        if open != usize::from(model.state == State::Waiting) {
            return Err(format!("{open} open waits in state {}", snapshot.state));
        }
        let delivered = self.delivered(&case.tag);
        if delivered != model.delivered {
            return Err(format!(
                "I1/I8: the sink received {delivered:?}, the model {:?}",
                model.delivered
            ));
        }
        Ok(())
    }
}

/// The command an action sends, by its kind as the model knows it, fenced by the version
/// the execution is at (a stale one by the version before); `None`: nothing to send.
fn body(action: &Action, before: &Snapshot) -> Option<(&'static str, Value)> {
    let version = before.version;
    let open_wait = before
        .waits
        .iter()
        .find(|wait| wait.status == "open")
        .map(|wait| json!(wait.wait_id));
    let (kind, mut body) = match action {
        Action::Stale if version > 1 => {
            let body = json!({"kind": "steer", "text": "stale", "expected_version": version - 1});
            return Some(("stale", body));
        }
        Action::Pause => ("pause", json!({})),
        Action::Continue => ("continue", json!({})),
        Action::Step => ("step", json!({})),
        Action::Steer(text) => ("steer", json!({"text": text})),
        Action::Cancel => ("cancel", json!({})),
        Action::Answer => ("answer", json!({"wait_id": open_wait, "answer": "yes"})),
        Action::Decline => ("decline", json!({"wait_id": open_wait})),
        Action::Fork => ("fork", json!({})),
        Action::Retry => ("retry", json!({})),
        Action::Reconcile => ("reconcile", json!({"outcome": "confirmed"})),
        Action::StopProcess => ("stop_process", json!({"process_id": ProcessId::new()})),
        _ => return None,
    };
    body["kind"] = json!(kind);
    body["expected_version"] = json!(version);
    Some((kind, body))
}

/// The command was accepted exactly when the model offers its kind.
fn expect_status(model: &Model, kind: &str, reply: &CommandReply) -> Result<(), String> {
    let accepted = reply.status != "rejected";
    let expected = kind != "stale" && model.accepts(kind);
    match accepted == expected {
        true => Ok(()),
        false => Err(format!(
            "K-3: {kind} in {:?}: {reply:?}, the model says {}",
            model.state,
            if expected { "accepted" } else { "rejected" }
        )),
    }
}

/// The size of a run.
#[derive(Debug, Clone, Copy)]
pub struct ModelOptions {
    pub seed: u64,
    pub cases: u64,
    pub actions_per_case: usize,
}

/// What a run did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ModelReport {
    pub seed: u64,
    pub cases: u64,
    pub actions: usize,
    pub crashes: usize,
    pub divergences: usize,
    /// The first divergence, shrunk, if there was one.
    pub divergence: Option<String>,
    pub wall_s: f64,
}

/// Runs `options.cases` random cases; stops at the first divergence (shrunk) or harness
/// error. `progress` is told each case done.
pub async fn run(options: ModelOptions, progress: impl Fn(u64)) -> ModelReport {
    let started = Instant::now();
    let seed = options.seed;
    let mut report = ModelReport {
        seed,
        ..ModelReport::default()
    };
    let mut rng = StdRng::seed_from_u64(seed);
    let mut world = match World::new() {
        Ok(world) => world,
        Err(error) => {
            report.divergences = 1;
            report.divergence = Some(error);
            return report;
        }
    };
    for index in 0..options.cases {
        let case = random_case(&mut rng, format!("c{index}"));
        let actions: Vec<Action> = (0..options.actions_per_case)
            .map(|_| random_action(&mut rng))
            .collect();
        report.cases += 1;
        report.actions += actions.len();
        if let Err(divergence) = world.run(&case, &actions).await {
            let (shrunk, shrunk_divergence) =
                shrink(&mut world, &case, actions, divergence.clone()).await;
            report.divergences = 1;
            report.divergence = Some(format!(
                "seed {seed}, case {index}: {divergence}\n\
                 script: {:?} (max_iterations {})\nshrunk history ({} actions): {shrunk:?}\n\
                 which diverges {shrunk_divergence}",
                case.script,
                case.max_iterations,
                shrunk.len()
            ));
            break;
        }
        progress(index + 1);
    }
    report.crashes = world.crashes;
    if let Some(runtime) = world.runtime.take() {
        runtime.halt();
    }
    report.wall_s = started.elapsed().as_secs_f64();
    report
}

/// A command from its body as a client sends it, with a fresh id unless it names one.
fn command(mut body: Value) -> Result<Command, String> {
    if let Value::Object(fields) = &mut body {
        fields.retain(|_, value| !value.is_null());
    }
    if body.get("command_id").is_none() {
        body["command_id"] = json!(CommandId::new());
    }
    Command::from_json(&body).map_err(|error| format!("harness: a command body: {error}"))
}

/// Drops actions one at a time while a fresh execution of the case still diverges.
async fn shrink(
    world: &mut World,
    case: &Case,
    mut actions: Vec<Action>,
    mut divergence: String,
) -> (Vec<Action>, String) {
    let mut attempt = 0;
    let mut index = 0;
    while index < actions.len() {
        let mut fewer = actions.clone();
        fewer.remove(index);
        attempt += 1;
        let tag = format!("{}-shrink{attempt}", case.tag);
        match world.run(&retag(case, &tag), &fewer).await {
            Err(diverged) => (actions, divergence) = (fewer, diverged),
            Ok(()) => index += 1,
        }
    }
    (actions, divergence)
}
