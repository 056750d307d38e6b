//! A-1 / R05: a stale attempt is fenced. The first attempt's worker freezes (its arbiter
//! thread blocks inside the provider, as a SIGSTOPped process would) before it commits; its
//! lease lapses; a new attempt is claimed with a higher epoch; when the old one wakes, its
//! write comes back `Fenced` and its actor stops. Only the new attempt's work is recorded.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::FutureExt;
use openprogram::actors::machine::Decision;
use openprogram::agent::{ModelRequest, Provider, Scripted};
use openprogram::storage::{Event, SessionId};

use openprogram::{Runtime, StartRequest};

use crate::support::*;

/// The scripted provider, except that its first call freezes the calling thread.
struct FreezeFirstCall {
    frozen: AtomicBool,
    freeze: Duration,
    /// Set once the first call has frozen its thread.
    entered: Arc<AtomicBool>,
}

impl Provider for FreezeFirstCall {
    fn decide(&self, request: ModelRequest) -> BoxFuture<'static, Result<Decision, String>> {
        if !self.frozen.swap(true, Ordering::SeqCst) {
            self.entered.store(true, Ordering::SeqCst);
            std::thread::sleep(self.freeze);
        }
        Scripted.decide(request).boxed()
    }

    /// The built-in script's decisions: the same contract as `Scripted` (K-2).
    fn contract(&self) -> String {
        openprogram::agent::Provider::contract(&openprogram::agent::Scripted)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r05_a_stale_attempt_is_fenced_and_stops() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ttl = Duration::from_millis(150);
    let provider = Arc::new(FreezeFirstCall {
        frozen: AtomicBool::new(false),
        freeze: ttl * 8,
        entered: Arc::new(AtomicBool::new(false)),
    });
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .provider(provider)
        .lease_ttl(ttl)
        .open()
        .expect("open");
    let session = SessionId::new();
    let request = StartRequest {
        message: "test".into(),
        script: elements(vec![echo("a"), reply("done")]),
        ..Default::default()
    };
    let execution = runtime
        .start_execution(session, request)
        .await
        .expect("start")
        .execution_id;
    // Wait until the frozen attempt's lease has lapsed and a new attempt takes over.
    let started = Instant::now();
    while !taken_over(&runtime, session, execution).await {
        assert!(started.elapsed() < DEADLINE, "the lease never lapsed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let done = loop {
        let snapshot = runtime
            .snapshot(session, execution)
            .await
            .expect("snapshot");
        if snapshot.state == "completed" {
            break snapshot;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "never completed: {snapshot:#?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(done.text, "done");
    assert_eq!(done.attempt, 2);
    let events = runtime.events(session, execution, 0).expect("events");
    let epochs: Vec<u64> = events
        .iter()
        .filter_map(|e| match e.event {
            Event::AttemptStarted { epoch, .. } => Some(epoch),
            _ => None,
        })
        .collect();
    assert_eq!(epochs, vec![1, 2]);
    // Every decision and tool result was written by the new attempt: the frozen one's
    // decision was fenced, never recorded.
    for envelope in &events {
        if matches!(
            envelope.event,
            Event::ModelDecided { .. } | Event::ToolFinished { .. }
        ) {
            assert_eq!(envelope.writer_epoch, 2, "{envelope:?}");
        }
    }
    assert_eq!(
        count(&events, |e| matches!(e, Event::ModelDecided { .. })),
        2
    );
    // The fenced actor stopped and the finished one released itself.
    while runtime.live_executions() > 0 {
        assert!(
            started.elapsed() < DEADLINE,
            "{} actors still live",
            runtime.live_executions()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    runtime.halt();
}

/// A long-running tool whose first call freezes the calling thread before it starts.
struct FreezeOnFirstCall {
    frozen: AtomicBool,
    freeze: Duration,
    entered: Arc<AtomicBool>,
}

impl openprogram::agent::Tool for FreezeOnFirstCall {
    fn name(&self) -> &str {
        "freeze"
    }
    fn recovery(&self) -> openprogram::actors::machine::Recovery {
        openprogram::actors::machine::Recovery::Idempotent
    }
    fn call(
        &self,
        _call: openprogram::agent::ToolCall,
    ) -> BoxFuture<'static, openprogram::agent::ToolResult> {
        if !self.frozen.swap(true, Ordering::SeqCst) {
            self.entered.store(true, Ordering::SeqCst);
            std::thread::sleep(self.freeze);
        }
        futures::future::pending().boxed()
    }
}

/// K-6: a cancel reaches a frozen attempt (its thread stuck starting a tool) and, as a retry,
/// its replacement. The replacement applies it; when the frozen attempt wakes and takes the
/// queued cancel, the first delivery resolves to the stored, already applied outcome — not
/// to an error, and without applying anything twice. Here storage answers the stale
/// attempt's write with the stored command (K-4 is checked before fencing); the service's
/// K-6 branch for a decision fenced after its acceptance is not reached by this test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k6_a_stale_attempts_delivery_returns_the_applied_commands_stored_outcome() {
    let dir = tempfile::tempdir().expect("tempdir");
    let entered = Arc::new(AtomicBool::new(false));
    let tool = Arc::new(FreezeOnFirstCall {
        frozen: AtomicBool::new(false),
        freeze: Duration::from_millis(2_000),
        entered: Arc::clone(&entered),
    });
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .tool(tool)
        .lease_ttl(Duration::from_millis(150))
        .open()
        .expect("open");
    let session = SessionId::new();
    let request = StartRequest {
        message: "test".into(),
        script: elements(vec![
            serde_json::json!({"tool": "freeze", "args": {}}),
            reply("never"),
        ]),
        ..Default::default()
    };
    let execution = runtime
        .start_execution(session, request)
        .await
        .expect("start")
        .execution_id;
    let command = |kind: &str, command_id: openprogram::storage::CommandId| {
        command_of(serde_json::json!({"command_id": command_id, "kind": kind}))
    };
    let started = Instant::now();
    while !entered.load(Ordering::SeqCst) {
        assert!(started.elapsed() < DEADLINE, "the tool was never called");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // The first delivery waits in the frozen attempt's mailbox.
    let cancel_id = openprogram::storage::CommandId::new();
    let first_cancel = {
        let (runtime, request) = (runtime.clone(), command("cancel", cancel_id));
        tokio::spawn(async move { runtime.command(session, execution, request).await })
    };
    while !taken_over(&runtime, session, execution).await {
        assert!(started.elapsed() < DEADLINE, "the lease never lapsed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The new attempt, on another arbiter, runs the tool again (it is idempotent).
    loop {
        let snapshot = runtime
            .snapshot(session, execution)
            .await
            .expect("snapshot");
        if snapshot.attempt == 2 && snapshot.capabilities.contains(&"cancel") {
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the new attempt never ran: {snapshot:#?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let retried = runtime
        .command(session, execution, command("cancel", cancel_id))
        .await
        .expect("retry");
    assert_eq!(retried.status, "applied", "{retried:?}");
    assert!(
        !first_cancel.is_finished(),
        "the frozen attempt must still hold the first delivery"
    );
    let first = first_cancel.await.expect("task").expect("first cancel");
    assert_eq!(first, retried);
    let events = runtime.events(session, execution, 0).expect("events");
    assert_eq!(
        count(&events, |e| matches!(e, Event::ControlApplied { .. })),
        1,
        "the cancel applied once"
    );
    runtime.halt();
}

/// Whether a second attempt took the execution over: by this call, or by the supervisor,
/// which reclaims lapsed attempts every half lease on its own.
async fn taken_over(
    runtime: &Runtime,
    session: openprogram::storage::SessionId,
    execution: openprogram::storage::ExecutionId,
) -> bool {
    runtime.reclaim_lapsed_attempts().await.expect("reclaim");
    runtime
        .events(session, execution, 0)
        .expect("events")
        .iter()
        .any(|e| {
            matches!(
                e.event,
                openprogram::storage::Event::AttemptStarted { epoch: 2, .. }
            )
        })
}

/// An External tool whose first call freezes its thread (the dispatching worker stops, its
/// lease lapses) and whose reconcile protocol would say "not applied" — a protocol that
/// fences at the resource if `fences`.
struct FreezeInEffect {
    frozen: AtomicBool,
    freeze: Duration,
    reconcile_asked: std::sync::atomic::AtomicUsize,
    fences: bool,
}

impl openprogram::agent::Tool for FreezeInEffect {
    fn name(&self) -> &str {
        "ext"
    }
    fn recovery(&self) -> openprogram::actors::machine::Recovery {
        openprogram::actors::machine::Recovery::External
    }
    fn call(
        &self,
        _call: openprogram::agent::ToolCall,
    ) -> BoxFuture<'static, openprogram::agent::ToolResult> {
        if !self.frozen.swap(true, Ordering::SeqCst) {
            std::thread::sleep(self.freeze);
        }
        futures::future::ready(Ok("done".to_owned())).boxed()
    }
    fn reconcile(
        &self,
        _call: openprogram::agent::ToolCall,
    ) -> BoxFuture<'static, openprogram::agent::Reconciliation> {
        self.reconcile_asked.fetch_add(1, Ordering::SeqCst);
        futures::future::ready(openprogram::agent::Reconciliation::NotApplied).boxed()
    }
    fn reconcile_fences(&self) -> bool {
        self.fences
    }
}

/// R-8 with A-1: an effect dispatched by an attempt of this very runtime that was taken over
/// may still be running; the external system's answer is not final, so the protocol is not
/// asked and the execution waits for an operator (a "not applied" here would run it twice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r8_an_effect_of_a_taken_over_attempt_waits_for_an_operator() {
    let (runtime, tool, session, execution, _dir) = freeze_in_effect(false).await;
    wait_state(&runtime, session, execution, "reconciliation_required").await;
    // The new attempt would have asked in the turn that recorded `reconciliation_required`.
    assert_eq!(tool.reconcile_asked.load(Ordering::SeqCst), 0);
    runtime.halt();
}

/// R-8 with A-1, the protocol fencing at the resource (`Tool::reconcile_fences`, as
/// `append` does): its answer stands though the taken-over attempt may still run, so it is
/// asked, and the execution goes on without an operator.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r8_a_fencing_protocol_reconciles_an_effect_of_a_taken_over_attempt() {
    let (runtime, tool, session, execution, _dir) = freeze_in_effect(true).await;
    wait_state(&runtime, session, execution, "completed").await;
    assert!(tool.reconcile_asked.load(Ordering::SeqCst) >= 1);
    runtime.halt();
}

/// A runtime whose one execution's `ext` call froze past its lease and was taken over.
async fn freeze_in_effect(
    fences: bool,
) -> (
    Runtime,
    Arc<FreezeInEffect>,
    SessionId,
    openprogram::storage::ExecutionId,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let ttl = Duration::from_millis(150);
    let tool = Arc::new(FreezeInEffect {
        frozen: AtomicBool::new(false),
        freeze: ttl * 8,
        reconcile_asked: std::sync::atomic::AtomicUsize::new(0),
        fences,
    });
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .tool(tool.clone())
        .lease_ttl(ttl)
        .open()
        .expect("open");
    let session = SessionId::new();
    let request = StartRequest {
        message: "test".into(),
        script: elements(vec![
            serde_json::json!({"tool": "ext", "args": {}}),
            reply("done"),
        ]),
        ..Default::default()
    };
    let execution = runtime
        .start_execution(session, request)
        .await
        .expect("start")
        .execution_id;
    let started = Instant::now();
    while !taken_over(&runtime, session, execution).await {
        assert!(started.elapsed() < DEADLINE, "the lease never lapsed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    (runtime, tool, session, execution, dir)
}
