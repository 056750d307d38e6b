//! Helpers for the runtime tests: a runtime on a fresh store, scripts, and waiting for a
//! condition with a deadline (a liveness bound, never a timing assertion).

use std::time::{Duration, Instant};

use openprogram::storage::{CommandId, Event, EventEnvelope, ExecutionId, SessionId};
use openprogram::{Command, CommandReply, Runtime, ScriptElement, Snapshot, StartRequest};
use serde_json::{json, Value};

/// How long a condition may take before the test fails: far above what it needs.
pub const DEADLINE: Duration = Duration::from_secs(20);

pub struct Harness {
    pub runtime: Runtime,
    /// The session `start` admits into.
    pub session: SessionId,
    apart: Apart,
    _dir: tempfile::TempDir,
}

/// The executions a test admitted each into a session of its own (`start_apart`): a
/// session's turns run one at a time (C-2), so turns meant to run side by side are apart.
#[derive(Default)]
pub struct Apart(std::sync::Mutex<std::collections::HashMap<ExecutionId, SessionId>>);

impl Apart {
    /// Records that `execution` was admitted into `session`.
    pub fn admitted(&self, execution: ExecutionId, session: SessionId) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(execution, session);
    }

    /// The session `execution` was admitted into: its own, or `default`.
    fn session_of(&self, execution: ExecutionId, default: SessionId) -> SessionId {
        let apart = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        apart.get(&execution).copied().unwrap_or(default)
    }
}

impl Harness {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let runtime = Runtime::builder()
            .data_dir(dir.path())
            .open()
            .expect("open runtime");
        Self::with_runtime(runtime, dir)
    }

    /// A harness whose runtime runs on a store the test opened, and the test's own handle
    /// on it: for a test that writes what no command can (a record a dead worker left).
    pub fn keeping_store() -> (Self, openprogram::storage::Store) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = openprogram::storage::Store::open(dir.path()).expect("open the store");
        let runtime = Runtime::builder()
            .store(store.clone())
            .open()
            .expect("open runtime");
        (Self::with_runtime(runtime, dir), store)
    }

    /// A harness around a runtime configured by the test, on `dir`.
    pub fn with_runtime(runtime: Runtime, dir: tempfile::TempDir) -> Self {
        Self {
            runtime,
            session: SessionId::new(),
            apart: Default::default(),
            _dir: dir,
        }
    }

    pub async fn start(&self, script: Vec<Value>, max_iterations: Option<u32>) -> ExecutionId {
        self.admit(StartRequest {
            script: elements(script),
            max_iterations,
            ..Default::default()
        })
        .await
    }

    /// Admits a turn into a session of its own: it runs beside the turns of `session`,
    /// which run one at a time (C-2). The helpers below find its session.
    pub async fn start_apart(&self, script: Vec<Value>) -> ExecutionId {
        self.start_apart_with(script, None).await
    }

    /// `start_apart` with an iteration budget.
    pub async fn start_apart_with(
        &self,
        script: Vec<Value>,
        max_iterations: Option<u32>,
    ) -> ExecutionId {
        let session = SessionId::new();
        let request = StartRequest {
            message: "test".into(),
            script: elements(script),
            max_iterations,
            ..Default::default()
        };
        let execution = self
            .runtime
            .start_execution(session, request)
            .await
            .expect("start")
            .execution_id;
        self.apart.admitted(execution, session);
        execution
    }

    /// The session `execution` was admitted into.
    pub fn session_of(&self, execution: ExecutionId) -> SessionId {
        self.apart.session_of(execution, self.session)
    }

    /// Admits a turn paused (`start_paused`): it waits for Continue or Step, with no actor.
    pub async fn start_paused(&self, script: Vec<Value>) -> ExecutionId {
        self.admit(StartRequest {
            script: elements(script),
            start_paused: true,
            ..Default::default()
        })
        .await
    }

    async fn admit(&self, request: StartRequest) -> ExecutionId {
        let request = StartRequest {
            message: "test".into(),
            ..request
        };
        self.runtime
            .start_execution(self.session, request)
            .await
            .expect("start")
            .execution_id
    }

    pub async fn snapshot(&self, execution: ExecutionId) -> Snapshot {
        self.runtime
            .snapshot(self.session_of(execution), execution)
            .await
            .expect("snapshot")
    }

    pub fn events(&self, execution: ExecutionId) -> Vec<EventEnvelope> {
        self.runtime
            .events(self.session_of(execution), execution, 0)
            .expect("events")
    }

    pub async fn command(
        &self,
        execution: ExecutionId,
        kind: &str,
        text: Option<&str>,
    ) -> CommandReply {
        self.command_with(execution, CommandId::new(), kind, text, None)
            .await
    }

    pub async fn command_with(
        &self,
        execution: ExecutionId,
        command_id: CommandId,
        kind: &str,
        text: Option<&str>,
        expected_version: Option<u64>,
    ) -> CommandReply {
        let mut body = json!({"command_id": command_id, "kind": kind});
        if let Some(text) = text {
            body["text"] = json!(text);
        }
        if let Some(version) = expected_version {
            body["expected_version"] = json!(version);
        }
        self.runtime
            .command(self.session_of(execution), execution, command_of(body))
            .await
            .expect("command")
    }

    /// Sends the command `body` (as a client writes it) to `execution`.
    pub async fn send(&self, execution: ExecutionId, body: Value) -> CommandReply {
        self.runtime
            .command(self.session_of(execution), execution, command_of(body))
            .await
            .expect("command")
    }

    /// Waits until the snapshot satisfies `done`; fails with the last one after `DEADLINE`.
    pub async fn wait_for(
        &self,
        execution: ExecutionId,
        what: &str,
        done: impl Fn(&Snapshot) -> bool,
    ) -> Snapshot {
        wait_until(
            &self.runtime,
            self.session_of(execution),
            execution,
            what,
            done,
        )
        .await
    }

    pub async fn wait_for_state(&self, execution: ExecutionId, state: &str) -> Snapshot {
        self.wait_for(execution, state, |snapshot| snapshot.state == state)
            .await
    }

    /// Waits until the model has decided to call `sleep` (so a control lands mid-step).
    pub async fn wait_for_sleep(&self, execution: ExecutionId) {
        self.wait_for_event(
            execution,
            "the sleep decision",
            is_sleep_dispatch_or_decision,
        )
        .await;
    }

    /// Waits until an event matching `found` is committed.
    pub async fn wait_for_event(
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
}

impl Drop for Harness {
    fn drop(&mut self) {
        end_processes(&self.runtime);
        self.runtime.halt();
    }
}

/// Ends the OS processes this runtime started and still records running, by their
/// verified identity: a failing test leaves nothing behind (processes outlive `halt`).
pub fn end_processes(runtime: &Runtime) {
    use openprogram::actors::process::os;
    let owner = runtime.store().incarnation().owner_id;
    for record in runtime.store().processes().unwrap_or_default() {
        if record.owner_id != owner || record.state != openprogram::storage::ProcessState::Running {
            continue;
        }
        if let (Some(pid), Some(start_time)) = (record.os_pid, record.os_start_time) {
            let identity = os::OsIdentity { pid, start_time };
            let _ = os::signal_verified(identity, os::StopSignal::Kill);
        }
    }
}

/// A script as `StartRequest` takes it: each element as its JSON text.
pub fn elements(script: Vec<Value>) -> Vec<ScriptElement> {
    script.into_iter().map(Into::into).collect()
}

pub fn echo(text: &str) -> Value {
    json!({"tool": "echo", "args": {"text": text}})
}

pub fn sleep(ms: u64) -> Value {
    json!({"tool": "sleep", "args": {"ms": ms}})
}

pub fn reply(text: &str) -> Value {
    json!({"reply": text})
}

pub fn count(events: &[EventEnvelope], found: impl Fn(&Event) -> bool) -> usize {
    events
        .iter()
        .filter(|envelope| found(&envelope.event))
        .count()
}

pub fn is_sleep_dispatch_or_decision(event: &Event) -> bool {
    matches!(event, Event::ModelDecided { decision, .. } if decision.contains("sleep"))
}

/// A provider that never answers: the worker "dies" while a model request is in flight.
/// After `decisions` answers (the built-in script's), it freezes.
pub struct FreezeAfter(pub u32);

impl openprogram::agent::Provider for FreezeAfter {
    fn decide(
        &self,
        request: openprogram::agent::ModelRequest,
    ) -> futures::future::BoxFuture<'static, Result<openprogram::actors::machine::Decision, String>>
    {
        use futures::FutureExt;
        if request.iterations >= self.0 {
            return futures::future::pending().boxed();
        }
        openprogram::agent::Scripted.decide(request)
    }

    /// The built-in script's decisions: the same contract as `Scripted` (K-2).
    fn contract(&self) -> String {
        openprogram::agent::Provider::contract(&openprogram::agent::Scripted)
    }
}

/// One data dir opened by runtime after runtime, as restarts do, with a wall clock the test
/// moves (R12).
pub struct Restarts {
    pub dir: tempfile::TempDir,
    /// The session `start` admits into.
    pub session: SessionId,
    pub apart: Apart,
    pub clock: std::sync::Arc<openprogram::ManualClock>,
    /// N-1: a PostgreSQL database the runtimes open instead of the dir's sled store.
    pub store: Option<String>,
}

impl Restarts {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
            session: SessionId::new(),
            apart: Apart::default(),
            clock: std::sync::Arc::new(openprogram::ManualClock::new()),
            store: None,
        }
    }

    /// Runtimes on a fresh PostgreSQL database (for the tests ignored without PostgreSQL).
    pub fn on_postgres() -> Self {
        Self {
            store: Some(crate::pg_cluster::database()),
            ..Self::new()
        }
    }

    /// The store itself, opened by the test while no runtime has it open (sled's directory
    /// takes one opener at a time).
    pub fn open_store(&self) -> Box<dyn openprogram::storage::EventStore> {
        match &self.store {
            Some(url) => {
                Box::new(openprogram::storage::pg::PgStore::open(url).expect("open PostgreSQL"))
            }
            None => Box::new(
                openprogram::storage::Store::open(self.dir.path()).expect("open the store"),
            ),
        }
    }

    /// A runtime on the dir whose provider freezes after `decisions` answers.
    pub fn open_freezing(&self, decisions: u32, window: openprogram::RestartWindow) -> Runtime {
        self.open_with(|builder| {
            builder
                .provider(std::sync::Arc::new(FreezeAfter(decisions)))
                .restart_window(window)
        })
    }

    /// A runtime on the dir with the built-in provider.
    pub fn open(&self, window: openprogram::RestartWindow) -> Runtime {
        self.open_with(|builder| builder.restart_window(window))
    }

    pub fn open_with(
        &self,
        configure: impl FnOnce(openprogram::RuntimeBuilder) -> openprogram::RuntimeBuilder,
    ) -> Runtime {
        let builder = match &self.store {
            Some(url) => Runtime::builder().store_url(url.clone()),
            None => Runtime::builder().data_dir(self.dir.path()),
        };
        configure(builder.clock(self.clock.clone()))
            .open()
            .expect("open runtime")
    }

    pub async fn start(&self, runtime: &Runtime, script: Vec<Value>) -> openprogram::StartReply {
        let request = StartRequest {
            message: "test".into(),
            script: elements(script),
            ..Default::default()
        };
        runtime
            .start_execution(self.session, request)
            .await
            .expect("start")
    }

    /// Admits a turn into a session of its own, to run beside the others.
    pub async fn start_apart(
        &self,
        runtime: &Runtime,
        script: Vec<Value>,
    ) -> openprogram::StartReply {
        let session = SessionId::new();
        let request = StartRequest {
            message: "test".into(),
            script: elements(script),
            ..Default::default()
        };
        let started = runtime
            .start_execution(session, request)
            .await
            .expect("start");
        self.apart.admitted(started.execution_id, session);
        started
    }

    /// The session `execution` was admitted into.
    pub fn session_of(&self, execution: ExecutionId) -> SessionId {
        self.apart.session_of(execution, self.session)
    }

    /// Notes that the test admitted `execution` into a `session` of its own.
    pub fn admitted_apart(&self, execution: ExecutionId, session: SessionId) {
        self.apart.admitted(execution, session);
    }

    /// Admits a turn paused (as a user's pause leaves it): it waits for Continue or Step.
    pub async fn start_paused(&self, runtime: &Runtime, script: Vec<Value>) -> ExecutionId {
        let request = StartRequest {
            message: "test".into(),
            script: elements(script),
            start_paused: true,
            ..Default::default()
        };
        runtime
            .start_execution(self.session, request)
            .await
            .expect("start")
            .execution_id
    }

    /// Waits until `count` events of the execution match `found`.
    pub async fn wait_events(
        &self,
        runtime: &Runtime,
        execution: ExecutionId,
        what: &str,
        at_least: usize,
        found: impl Fn(&Event) -> bool,
    ) {
        let started = Instant::now();
        loop {
            let session = self.session_of(execution);
            let events = runtime.events(session, execution, 0).expect("events");
            if count(&events, &found) >= at_least {
                return;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "waited {DEADLINE:?} for {what}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub async fn snapshot(&self, runtime: &Runtime, execution: ExecutionId) -> Snapshot {
        runtime
            .snapshot(self.session_of(execution), execution)
            .await
            .expect("snapshot")
    }

    /// Waits until the execution is in `state`; fails with the last snapshot after
    /// `DEADLINE`.
    pub async fn wait_state(
        &self,
        runtime: &Runtime,
        execution: ExecutionId,
        state: &str,
    ) -> Snapshot {
        wait_state(runtime, self.session_of(execution), execution, state).await
    }

    pub fn events(&self, runtime: &Runtime, execution: ExecutionId) -> Vec<EventEnvelope> {
        runtime
            .events(self.session_of(execution), execution, 0)
            .expect("events")
    }
}

/// Waits until the snapshot satisfies `done`; fails with the last one after `DEADLINE`.
pub async fn wait_until(
    runtime: &Runtime,
    session: SessionId,
    execution: ExecutionId,
    what: &str,
    done: impl Fn(&Snapshot) -> bool,
) -> Snapshot {
    let started = Instant::now();
    loop {
        let snapshot = runtime
            .snapshot(session, execution)
            .await
            .expect("snapshot");
        if done(&snapshot) {
            return snapshot;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "waited {DEADLINE:?} for {what}; last: {snapshot:#?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Waits until an execution is in `state`; fails with the last snapshot after `DEADLINE`.
pub async fn wait_state(
    runtime: &Runtime,
    session: SessionId,
    execution: ExecutionId,
    state: &str,
) -> Snapshot {
    let started = Instant::now();
    loop {
        let snapshot = runtime
            .snapshot(session, execution)
            .await
            .expect("snapshot");
        if snapshot.state == state {
            return snapshot;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "waited for {state}: {snapshot:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// What a crash leaves: the actors stop without pausing anything, the store is closed.
pub fn crash(runtime: Runtime) {
    runtime.halt();
    drop(runtime);
}

/// What an execution's actor writes when it accepts a control, and nothing more: the
/// runtime crashes, and the store is left as if its worker had died after accepting the
/// command and before deciding it (written through a store opened here: only the runtime's
/// actors write through the runtime).
pub async fn accept_undecided(
    restarts: &Restarts,
    runtime: Runtime,
    execution: ExecutionId,
    request: Command,
    control: openprogram::storage::Control,
) -> Command {
    use openprogram::storage::{EventStore, Outcome, Store, Transition, Upsert};
    crash(runtime);
    let store = Store::open(restarts.dir.path()).expect("open the store");
    let accepted = request.accepted_record(execution);
    let event = Event::ControlAccepted {
        command_id: request.command_id,
        control,
    };
    let saved = store
        .submit(Transition::new(execution, vec![event]).with(Upsert::Command(accepted)))
        .await
        .expect("accept");
    assert!(matches!(saved, Outcome::Committed(_)), "{saved:?}");
    request
}

/// A command from its body as a client sends it (SPEC §6), without its `null` fields; a
/// fresh `command_id` when the body has none.
pub fn command_of(mut body: Value) -> Command {
    if let Value::Object(fields) = &mut body {
        fields.retain(|_, value| !value.is_null());
    }
    if body.get("command_id").is_none() {
        body["command_id"] = json!(CommandId::new());
    }
    Command::from_json(&body).expect("a command body")
}

/// The requirement ids (`S-8`, `K-4`) and fault scenario ids (`R02`) `text` names: what
/// users read (help, errors, metrics) names none.
pub fn requirement_ids(text: &str) -> Vec<String> {
    let is_id = |word: &str| {
        let requirement = word.split_once('-').is_some_and(|(letters, digits)| {
            (1..=2).contains(&letters.len())
                && letters.chars().all(|c| c.is_ascii_uppercase())
                && !digits.is_empty()
                && digits.chars().all(|c| c.is_ascii_digit())
        });
        let scenario = word.len() == 3
            && word.starts_with('R')
            && word[1..].chars().all(|c| c.is_ascii_digit());
        requirement || scenario
    };
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|word| is_id(word))
        .map(str::to_owned)
        .collect()
}

#[test]
fn requirement_ids_are_found_where_they_are() {
    assert_eq!(
        requirement_ids("kill loop (R02), purge (S-8); K-12."),
        ["R02", "S-8", "K-12"]
    );
    assert!(requirement_ids("UTF-8, R2-D2, x-1, 2h, R123").is_empty());
}
