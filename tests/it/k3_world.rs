//! The world the K-3 property (`k3_property.rs`) runs in: one store opened by runtime after
//! runtime, the generator that decides restarts, and the three checks made in each state
//! (`World::check_state`); the control kinds it checks and the tools its states use.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::FutureExt;
use openprogram::actors::machine::{LiveOutcome, Recovery};
use openprogram::agent::{Tool, ToolCall};
use openprogram::storage::{CommandId, Event, ExecutionId, ProcessId, WaitId};
use openprogram::{CommandKind, CommandReply, RestartWindow, Runtime, Snapshot, StartRequest};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::support::*;

/// Every control kind the runtime runs: a kind added to `CommandKind` is checked here as soon
/// as it is built.
pub(crate) fn kinds() -> Vec<CommandKind> {
    CommandKind::ALL
        .into_iter()
        .filter(|kind| kind.is_built())
        .collect()
}

/// A state, and how to bring a new execution into it.
pub(crate) type Build = for<'a> fn(&'a mut World) -> BoxFuture<'a, ExecutionId>;

/// One store, opened by runtime after runtime, and the generator that decides restarts.
pub(crate) struct World {
    pub(crate) restarts: Restarts,
    pub(crate) runtime: Option<Runtime>,
    pub(crate) rng: StdRng,
    /// Restarts made, for the report.
    pub(crate) n_restarts: usize,
    /// A Job holding the only `slot` for good, so that the Jobs after it wait.
    pub(crate) blocker: Option<ExecutionId>,
}

/// The restart window of every runtime here: an execution abandoned longer ago expires.
const WINDOW: RestartWindow = RestartWindow::Within(Duration::from_secs(3600));

impl World {
    pub(crate) fn new(seed: u64) -> Self {
        let restarts = Restarts::new();
        let runtime = open(&restarts);
        Self {
            restarts,
            runtime: Some(runtime),
            rng: StdRng::seed_from_u64(seed),
            n_restarts: 0,
            blocker: None,
        }
    }

    pub(crate) fn runtime(&self) -> &Runtime {
        self.runtime.as_ref().expect("a runtime is open")
    }

    /// The runtime dies (as `kill -9` would leave the store) and the store is reopened,
    /// with startup recovery run.
    pub(crate) async fn restart(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            end_processes(&runtime);
            crash(runtime);
        }
        let runtime = open(&self.restarts);
        runtime.recovery().await.expect("recovery");
        self.runtime = Some(runtime);
        self.n_restarts += 1;
    }

    /// A restart between two steps, one time in three.
    pub(crate) async fn maybe_restart(&mut self) {
        if self.rng.gen_ratio(1, 3) {
            self.restart().await;
        }
    }

    pub(crate) async fn start(
        &self,
        script: Vec<Value>,
        max_iterations: Option<u32>,
        paused: bool,
    ) -> ExecutionId {
        let request = StartRequest {
            message: "k3".into(),
            script: elements(script),
            max_iterations,
            start_paused: paused,
            ..Default::default()
        };
        // Each state in a session of its own: a session's turns run one at a time (C-2),
        // and the states are built side by side.
        let session = openprogram::storage::SessionId::new();
        let execution_id = self
            .runtime()
            .start_execution(session, request)
            .await
            .expect("start")
            .execution_id;
        self.restarts.apart.admitted(execution_id, session);
        execution_id
    }

    /// An agent turn running `script` as a Job asking for `job`.
    pub(crate) async fn start_job(&self, script: Vec<Value>, job: Value) -> ExecutionId {
        let request = StartRequest {
            message: "k3 job".into(),
            script: elements(script),
            job: Some(serde_json::from_value(job).expect("a job body")),
            ..Default::default()
        };
        self.runtime()
            .start_execution(self.restarts.session, request)
            .await
            .expect("start a job")
            .execution_id
    }

    /// The Job holding `slot` (started once; it runs again first after each restart).
    pub(crate) async fn blocker(&mut self) -> ExecutionId {
        // A restart past the window expires it: a new one takes its place.
        if let Some(blocker) = self.blocker {
            let state = self.snapshot(blocker).await.state;
            if !matches!(state, "running" | "queued") {
                self.send(blocker, json!({"kind": "cancel"})).await;
                self.blocker = None;
            }
        }
        let blocker = match self.blocker {
            Some(blocker) => blocker,
            None => {
                let job = json!({"resources": {"slot": 1}});
                let blocker = self
                    .start_job(vec![sleep_long(), reply("never")], job)
                    .await;
                self.blocker = Some(blocker);
                blocker
            }
        };
        self.until_state(blocker, "running").await;
        blocker
    }

    /// A `steps` execution of `count` steps of `sleep_ms` each, appending to a file of its
    /// own in the store's directory.
    pub(crate) async fn start_function(
        &self,
        count: u32,
        sleep_ms: u64,
        paused: bool,
    ) -> ExecutionId {
        let path = self
            .restarts
            .dir
            .path()
            .join(format!("steps-{}.log", CommandId::new()));
        let request = openprogram::FunctionStart {
            function: "steps".into(),
            input: json!({"count": count, "path": path, "sleep_ms": sleep_ms}),
            start_paused: paused,
            ..Default::default()
        };
        // A session of its own, as `start`'s: a function a person starts is a turn (F-6).
        let session = openprogram::storage::SessionId::new();
        let execution_id = self
            .runtime()
            .start_function(session, request)
            .await
            .expect("start a function")
            .started
            .execution_id;
        self.restarts.apart.admitted(execution_id, session);
        execution_id
    }

    pub(crate) async fn snapshot(&self, execution: ExecutionId) -> Snapshot {
        self.restarts.snapshot(self.runtime(), execution).await
    }

    pub(crate) fn events(
        &self,
        execution: ExecutionId,
    ) -> Vec<openprogram::storage::EventEnvelope> {
        self.restarts.events(self.runtime(), execution)
    }

    /// Waits until the snapshot satisfies `done`.
    pub(crate) async fn until(
        &self,
        execution: ExecutionId,
        what: &str,
        done: impl Fn(&Snapshot) -> bool,
    ) -> Snapshot {
        wait_until(
            self.runtime(),
            self.restarts.session_of(execution),
            execution,
            what,
            done,
        )
        .await
    }

    pub(crate) async fn until_state(&self, execution: ExecutionId, state: &str) -> Snapshot {
        self.until(execution, state, |snapshot| snapshot.state == state)
            .await
    }

    /// Waits until an event matching `found` is committed.
    pub(crate) async fn until_event(
        &self,
        execution: ExecutionId,
        what: &str,
        found: impl Fn(&Event) -> bool,
    ) {
        let started = Instant::now();
        while !self
            .events(execution)
            .iter()
            .any(|envelope| found(&envelope.event))
        {
            assert!(
                started.elapsed() < DEADLINE,
                "waited {DEADLINE:?} for {what}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub(crate) async fn send(&self, execution: ExecutionId, body: Value) -> CommandReply {
        let session = self.restarts.session_of(execution);
        let reply = self
            .runtime()
            .command(session, execution, command_of(body))
            .await
            .expect("a command is answered");
        // A fork or retry child is in its original's session.
        if let Some(child) = reply.execution_id {
            self.restarts.apart.admitted(child, session);
        }
        reply
    }

    /// Checks the three properties in one state: every kind it does not offer on one
    /// execution (rejections change nothing, so they can share it), and every kind it
    /// offers on an execution of its own, built the same way.
    pub(crate) async fn check_state(&mut self, case: &str, build: Build) {
        let execution = build(self).await;
        let before = self.snapshot(execution).await;
        let n_events = self.events(execution).len();
        let offered: Vec<CommandKind> = kinds()
            .into_iter()
            .filter(|kind| before.capabilities.contains(&kind.as_str()))
            .collect();
        assert_eq!(
            offered.len(),
            before.capabilities.len(),
            "{case}: capabilities name a kind that does not exist: {:?}",
            before.capabilities
        );
        // K-4: a stale version is refused, whatever the kind, and changes nothing.
        let mut kinds = kinds();
        kinds.shuffle(&mut self.rng);
        let stale = kinds[0];
        let mut body = self.body(stale, &before);
        body["expected_version"] = json!(before.version + 1 + self.rng.gen_range(0..3u64));
        let reply = self.send(execution, body).await;
        assert_eq!(
            reply.code.as_deref(),
            Some("version_conflict"),
            "{case}: stale {stale}: {reply:?}"
        );
        self.unchanged(case, execution, (&before, n_events), &reply)
            .await;
        for kind in kinds.iter().filter(|kind| !offered.contains(kind)) {
            let reply = self.send(execution, self.body(*kind, &before)).await;
            assert_eq!(
                reply.status, "rejected",
                "{case}: {kind} is not offered: {reply:?}"
            );
            self.unchanged(case, execution, (&before, n_events), &reply)
                .await;
        }
        // The version read before the rejections still commands: an offered kind with it is
        // accepted (the first one below runs on this very execution).
        let mut target = Some(execution);
        for kind in kinds.iter().filter(|kind| offered.contains(kind)) {
            let execution = match target.take() {
                Some(execution) => execution,
                None => build(self).await,
            };
            let before = self.snapshot(execution).await;
            assert!(
                before.capabilities.contains(&kind.as_str()),
                "{case}: a second build offers other controls: {:?}",
                before.capabilities
            );
            let reply = self.send(execution, self.body(*kind, &before)).await;
            assert_eq!(
                reply.status, "applied",
                "{case}: {kind} is offered: {reply:?}"
            );
            self.check_effect(case, *kind, execution, &before, &reply)
                .await;
        }
    }

    /// A body of `kind` with valid arguments for the execution `now` describes, and its
    /// current version. Where no valid argument exists (no wait to answer), a made-up one.
    pub(crate) fn body(&self, kind: CommandKind, now: &Snapshot) -> Value {
        let mut body = json!({
            "command_id": CommandId::new(),
            "kind": kind.as_str(),
            "expected_version": now.version,
        });
        let open_wait = now
            .waits
            .iter()
            .find(|wait| wait.status == "open")
            .map_or_else(WaitId::new, |wait| wait.wait_id);
        match kind {
            CommandKind::Steer => body["text"] = json!("steered"),
            CommandKind::Answer => {
                body["wait_id"] = json!(open_wait);
                body["answer"] = fitting_answer(now, open_wait);
            }
            CommandKind::Decline => body["wait_id"] = json!(open_wait),
            CommandKind::Reconcile => {
                body["outcome"] = json!("confirmed");
                // A function's step result is JSON, read back by its body.
                body["text"] = match now.function {
                    Some(_) => json!("\"checked by hand\""),
                    None => json!("checked by hand"),
                };
            }
            CommandKind::StopProcess => {
                let running = now
                    .processes
                    .iter()
                    .find(|process| process.state == "running")
                    .map_or_else(ProcessId::new, |process| process.process_id);
                body["process_id"] = json!(running);
            }
            // K-7: a restart window is every execution's; a version policy a function's.
            CommandKind::SetPolicy => {
                body["restart_window"] = json!("2h");
                if now.function.is_some() {
                    body["policy"] = json!("use_latest");
                }
            }
            // W-7: a grant it gave, not revoked yet.
            CommandKind::Revoke => {
                let grant = now
                    .grants
                    .iter()
                    .find(|grant| !grant.revoked)
                    .map_or_else(WaitId::new, |grant| grant.grant_id);
                body["grant_id"] = json!(grant);
            }
            // J-1: a Job whose budget is spent continues with more.
            CommandKind::Continue if now.pause_reason.as_deref() == Some("budget_exhausted") => {
                body["budget"] = json!({"steps": 100})
            }
            _ => {}
        }
        body
    }

    /// (b): the rejection is stored and read back, and nothing of the execution moved.
    pub(crate) async fn unchanged(
        &self,
        case: &str,
        execution: ExecutionId,
        (before, n_events): (&Snapshot, usize),
        reply: &CommandReply,
    ) {
        assert_eq!(reply.status, "rejected", "{case}: {reply:?}");
        assert!(
            reply.code.is_some(),
            "{case}: a rejection has a code: {reply:?}"
        );
        assert_eq!(reply.version, before.version, "{case}: {reply:?}");
        let after = self.snapshot(execution).await;
        assert_eq!(
            serde_json::to_value(&after).expect("json"),
            serde_json::to_value(before).expect("json"),
            "{case}: a rejected {:?} changed the execution",
            reply.reason
        );
        assert_eq!(
            self.events(execution).len(),
            n_events,
            "{case}: events were appended"
        );
        let stored = self
            .runtime()
            .command_status(self.restarts.session_of(execution), reply.command_id)
            .expect("the rejection is stored");
        assert_eq!(&stored, reply, "{case}");
    }

    /// (c): SPEC's control table (K-2, W-2, P-2, R-8).
    pub(crate) async fn check_effect(
        &self,
        case: &str,
        kind: CommandKind,
        execution: ExecutionId,
        before: &Snapshot,
        reply: &CommandReply,
    ) {
        let case = format!("{case}: {kind}");
        if matches!(kind, CommandKind::Fork | CommandKind::Retry) {
            // A new child in the same run: an agent's paused; a Job's or a function's follows
            // its scheduler (K-2, K-3). The original is untouched.
            let child = reply.execution_id.expect("a child");
            let child = self.snapshot(child).await;
            if before.job.is_some() || before.function.is_some() {
                assert_ne!(
                    (child.state, child.pause_reason.as_deref()),
                    ("paused", Some(kind.as_str())),
                    "{case}"
                );
                assert_eq!(child.job.is_some(), before.job.is_some(), "{case}");
            } else {
                assert_eq!(child.state, "paused", "{case}");
                assert_eq!(child.pause_reason.as_deref(), Some(kind.as_str()), "{case}");
            }
            assert_eq!(child.run_id, before.run_id, "{case}");
            assert_eq!(child.parent_execution_id, Some(execution), "{case}");
            assert_eq!(
                self.snapshot(execution).await.version,
                before.version,
                "{case}"
            );
            return;
        }
        assert_eq!(reply.version, before.version + 1, "{case}: one transition");
        let applied = |wanted: CommandKind| {
            move |event: &Event| match event {
                Event::ControlApplied {
                    command_id,
                    control,
                } => *command_id == reply.command_id && control.kind() == wanted.as_str(),
                _ => false,
            }
        };
        self.until_event(execution, &case, applied(kind)).await;
        let wait_status = |status: &'static str| {
            let wait_id = before
                .waits
                .iter()
                .find(|wait| wait.status == "open")
                .map(|wait| wait.wait_id);
            move |snapshot: &Snapshot| {
                snapshot
                    .waits
                    .iter()
                    .any(|wait| Some(wait.wait_id) == wait_id && wait.status == status)
            }
        };
        match kind {
            CommandKind::Pause => {
                self.until(execution, &case, |now| {
                    now.state == "paused"
                        || (now.state == "running" && now.capabilities.contains(&"continue"))
                })
                .await;
            }
            // W-8: after an expired wait, a fresh wait that re-opens it.
            CommandKind::Continue if before.pause_reason.as_deref() == Some("wait_expired") => {
                self.until(execution, &case, |now| {
                    now.state == "waiting"
                        && now
                            .waits
                            .iter()
                            .any(|wait| wait.status == "open" && wait.reopens.is_some())
                })
                .await;
            }
            CommandKind::Continue => {
                self.until(execution, &case, |now| {
                    !matches!(now.state, "paused" | "expired")
                })
                .await;
            }
            CommandKind::Step => {
                // One step runs (a long one is still running), then it pauses (or the turn
                // ended or waits within that step).
                self.until(execution, &case, |now| {
                    (now.state == "paused" && now.pause_reason.as_deref() == Some("step"))
                        || matches!(now.state, "running" | "completed" | "failed" | "waiting")
                })
                .await;
            }
            CommandKind::Steer => {
                // Instructions for work not yet run: nothing else changes now.
                assert_eq!(self.snapshot(execution).await.state, before.state, "{case}");
            }
            CommandKind::Cancel => {
                self.until_state(execution, "cancelled").await;
            }
            CommandKind::Answer => {
                self.until(execution, &case, wait_status("answered")).await;
            }
            CommandKind::Decline => {
                self.until(execution, &case, wait_status("declined")).await;
            }
            CommandKind::Reconcile => {
                self.until(execution, &case, |now| {
                    now.state != "reconciliation_required"
                })
                .await;
            }
            // W-7: the grant the body named (the first standing one) is revoked.
            CommandKind::Revoke => {
                let named = before
                    .grants
                    .iter()
                    .find(|grant| !grant.revoked)
                    .map(|grant| grant.grant_id);
                self.until(execution, &case, |now| {
                    now.grants
                        .iter()
                        .any(|grant| Some(grant.grant_id) == named && grant.revoked)
                })
                .await;
            }
            CommandKind::StopProcess => {
                self.until(execution, &case, |now| {
                    now.processes
                        .iter()
                        .all(|process| process.state != "running")
                })
                .await;
            }
            CommandKind::SetPolicy => {
                // K-7: the policies change; nothing else does (a change starts nothing).
                let now = self.snapshot(execution).await;
                if before.function.is_some() {
                    let policy = now.function.as_ref().map(|function| function.policy);
                    assert_eq!(policy, Some("use_latest"), "{case}");
                }
                assert_eq!(now.restart_window.as_deref(), Some("2h"), "{case}");
                if before.state != "running" {
                    assert_eq!(
                        now.state, before.state,
                        "{case}: a policy change started it"
                    );
                }
            }
            CommandKind::Fork | CommandKind::Retry => {}
        }
    }

    pub(crate) fn finish(mut self) {
        if let Some(runtime) = self.runtime.take() {
            end_processes(&runtime);
            runtime.halt();
        }
        eprintln!("k3 property: {} restart(s)", self.n_restarts);
    }
}

pub(crate) fn open(restarts: &Restarts) -> Runtime {
    restarts.open_with(|builder| {
        builder
            .restart_window(WINDOW)
            .resource("slot", 1)
            .resource("pool", 4)
            .tool(Arc::new(AskOnce))
            .tool(Arc::new(Hang))
    })
}

/// Asks one live question (W-4) and returns its answer.
struct AskOnce;

impl Tool for AskOnce {
    fn name(&self) -> &str {
        "ask_once"
    }
    fn recovery(&self) -> Recovery {
        Recovery::Idempotent
    }
    fn call(&self, call: ToolCall) -> BoxFuture<'static, openprogram::agent::ToolResult> {
        let question = call.args["question"].as_str().unwrap_or("?").to_owned();
        let handle = call.handle;
        async move {
            match handle.ask(question).await {
                Ok(LiveOutcome::Answered(answer)) => Ok(answer),
                Ok(other) => Ok(format!("{other:?}")),
                Err(error) => Err(error.to_string().into()),
            }
        }
        .boxed()
    }
}

/// An External call that never returns and has no reconcile protocol: a crash leaves it
/// unknown until an operator reconciles it.
pub(crate) struct Hang;

impl Tool for Hang {
    fn name(&self) -> &str {
        "hang"
    }
    fn recovery(&self) -> Recovery {
        Recovery::External
    }
    fn call(&self, _call: ToolCall) -> BoxFuture<'static, openprogram::agent::ToolResult> {
        futures::future::pending().boxed()
    }
}

pub(crate) fn sleep_long() -> Value {
    sleep(600_000)
}

/// W-6: an answer that fits the request of `wait_id` (each item's first option, `true`, its
/// lowest number, a word), or `yes` for a wait that asks nothing structured.
fn fitting_answer(now: &Snapshot, wait_id: WaitId) -> Value {
    let items = now
        .waits
        .iter()
        .find(|wait| wait.wait_id == wait_id)
        .and_then(|wait| wait.request.as_ref())
        .and_then(|request| request["items"].as_array().cloned());
    let Some(items) = items else {
        return json!("yes");
    };
    let mut answer = serde_json::Map::new();
    for item in items {
        let first = item["options"][0].clone();
        let value = match item["type"].as_str() {
            Some("choice") if item["multiple"] == true => json!([first]),
            Some("choice") => first,
            Some("boolean") => json!(true),
            Some("number" | "integer") => item.get("min").cloned().unwrap_or(json!(1)),
            _ => json!("x"),
        };
        answer.insert(item["id"].as_str().unwrap_or_default().to_owned(), value);
    }
    Value::Object(answer)
}
