//! How a resumed execution continues, how unknown effects are resolved,
//! orderly shutdown and client views. Crashes here are `halt` plus reopening
//! the same store; the kill -9 harness (`kill9.rs`) does it with real processes.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use openprogram::actors::machine::Recovery;
use openprogram::agent::{Tool, ToolCall};
use openprogram::storage::{
    Event, EventStore, ExecutionHead, ExecutionKind, ExecutionState, RunId, Store, Transition,
};
use openprogram::{Command, RestartWindow};
use serde_json::json;

use crate::support::*;

/// A tool counting its calls. `hang`: it never returns (its worker "dies" in it).
/// `append_first`: before hanging, it does what the built-in `append` does.
struct Probe {
    name: &'static str,
    recovery: Recovery,
    calls: AtomicUsize,
    hang: bool,
    append_first: bool,
}

impl Probe {
    fn new(name: &'static str, recovery: Recovery, hang: bool) -> Arc<Self> {
        Arc::new(Self {
            name,
            recovery,
            calls: AtomicUsize::new(0),
            hang,
            append_first: false,
        })
    }
}

impl Tool for Probe {
    fn name(&self) -> &str {
        self.name
    }
    fn recovery(&self) -> Recovery {
        self.recovery
    }
    fn call(&self, call: ToolCall) -> BoxFuture<'static, openprogram::agent::ToolResult> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let appended = self
            .append_first
            .then(|| openprogram::agent::Append.call(call));
        let hang = self.hang;
        async move {
            if let Some(appended) = appended {
                appended.await?;
            }
            if hang {
                futures::future::pending::<()>().await;
            }
            Ok("ran".into())
        }
        .boxed()
    }
}

fn command(kind: &str, text: Option<&str>, outcome: Option<&str>) -> Command {
    command_of(json!({"kind": kind, "text": text, "outcome": outcome}))
}

fn is_decision(event: &Event) -> bool {
    matches!(event, Event::ModelDecided { .. })
}

fn is_dispatch(event: &Event) -> bool {
    matches!(event, Event::ToolDispatched { .. })
}

#[tokio::test]
async fn r5_an_interrupted_model_request_is_regenerated_and_committed_tools_are_skipped() {
    r5_an_interrupted_model_request_is_regenerated_and_committed_tools_are_skipped_on(
        Restarts::new(),
    )
    .await
}

/// The body of `r5_an_interrupted_model_request_is_regenerated_and_committed_tools_are_skipped`, on either store (N-1: `postgres.rs` runs it on PostgreSQL).
pub(crate) async fn r5_an_interrupted_model_request_is_regenerated_and_committed_tools_are_skipped_on(
    restarts: Restarts,
) {
    let counter = Probe::new("count", Recovery::Idempotent, false);
    let script = vec![
        json!({"tool": "count", "args": {}}),
        json!({"tool": "count", "args": {}}),
        reply("done"),
    ];
    let runtime = restarts.open_with(|builder| {
        builder
            .provider(Arc::new(FreezeAfter(2)))
            .tool(counter.clone())
    });
    let execution = restarts.start(&runtime, script).await.execution_id;
    restarts
        .wait_events(&runtime, execution, "both tool results", 2, |e| {
            matches!(e, Event::ToolFinished { .. })
        })
        .await;
    crash(runtime);
    assert_eq!(counter.calls.load(Ordering::SeqCst), 2);
    let runtime = restarts.open_with(|builder| builder.tool(counter.clone()));
    runtime.recovery().await.expect("recovery");
    runtime
        .wait_finished(restarts.session, execution)
        .await
        .expect("finished");
    assert_eq!(restarts.snapshot(&runtime, execution).await.text, "done");
    assert_eq!(
        counter.calls.load(Ordering::SeqCst),
        2,
        "committed tools are skipped"
    );
    let events = restarts.events(&runtime, execution);
    assert_eq!(
        count(&events, is_decision),
        3,
        "only the interrupted decision is made again"
    );
    runtime.halt();
}

/// The remaining iteration budget is the original one minus what was spent (never reset).
#[tokio::test]
async fn r5_resume_keeps_the_remaining_iteration_budget() {
    let restarts = Restarts::new();
    let runtime = restarts.open_freezing(1, RestartWindow::Unlimited);
    let request = openprogram::StartRequest {
        message: "test".into(),
        script: elements(vec![echo("a"), echo("b"), reply("done")]),
        max_iterations: Some(2),
        ..Default::default()
    };
    let execution = runtime
        .start_execution(restarts.session, request)
        .await
        .expect("start")
        .execution_id;
    restarts
        .wait_events(&runtime, execution, "the first decision", 1, is_decision)
        .await;
    crash(runtime);
    let runtime = restarts.open(RestartWindow::Unlimited);
    runtime.recovery().await.expect("recovery");
    runtime
        .wait_finished(restarts.session, execution)
        .await
        .expect("finished");
    let snapshot = restarts.snapshot(&runtime, execution).await;
    assert_eq!(snapshot.state, "failed", "{snapshot:?}");
    assert!(
        snapshot.text.contains("iteration limit of 2"),
        "{}",
        snapshot.text
    );
    runtime.halt();
}

/// An admission whose worker died before it was ever activated continues from its input.
#[tokio::test]
async fn r5_an_admission_never_activated_continues_from_its_input() {
    let restarts = Restarts::new();
    let session = restarts.session;
    let execution = openprogram::storage::ExecutionId::new();
    {
        let store = Store::open(restarts.dir.path()).expect("store");
        let mut head =
            ExecutionHead::new(execution, session, RunId::new(), ExecutionKind::AgentTurn);
        head.revision_id = openprogram::actors::env::contract_of(
            &openprogram::agent::Scripted,
            &openprogram::agent::ToolRegistry::builtin(),
        )
        .revision;
        let admitted = Event::Admitted {
            kind: head.kind,
            session_id: session,
            run_id: head.run_id,
            parent_execution_id: None,
            revision_id: head.revision_id,
            turn_id: head.turn_id,
            user_message_id: head.user_message_id,
            reply_message_id: head.reply_message_id,
            parent_message_id: None,
            input: json!({"message": "hi", "script": [reply("from the input")]}).to_string(),
        };
        let outcome = store
            .submit(Transition::create(head, vec![admitted]))
            .await
            .expect("admit");
        assert!(matches!(
            outcome,
            openprogram::storage::Outcome::Committed(_)
        ));
    }
    let runtime = restarts.open(RestartWindow::Unlimited);
    let report = runtime.recovery().await.expect("recovery");
    assert_eq!(report.resumed, vec![execution], "{report:?}");
    runtime
        .wait_finished(session, execution)
        .await
        .expect("finished");
    assert_eq!(
        restarts.snapshot(&runtime, execution).await.text,
        "from the input"
    );
    runtime.halt();
}

/// a second interruption before any new effect resumes from the very checkpoint the
/// first resume inherited.
#[tokio::test]
async fn a3_a_second_interruption_keeps_the_inherited_checkpoint() {
    let restarts = Restarts::new();
    let runtime = restarts.open_freezing(1, RestartWindow::Unlimited);
    let execution = restarts
        .start(&runtime, vec![echo("a"), reply("done")])
        .await
        .execution_id;
    restarts
        .wait_events(&runtime, execution, "the tool result", 1, |e| {
            matches!(e, Event::ToolFinished { .. })
        })
        .await;
    crash(runtime);
    for _ in 0..2 {
        let runtime = restarts.open_freezing(1, RestartWindow::Unlimited);
        assert_eq!(
            runtime.recovery().await.expect("recovery").resumed,
            vec![execution]
        );
        crash(runtime);
    }
    let runtime = restarts.open(RestartWindow::Unlimited);
    runtime.recovery().await.expect("recovery");
    runtime
        .wait_finished(restarts.session, execution)
        .await
        .expect("finished");
    let events = restarts.events(&runtime, execution);
    let first_resume = events
        .iter()
        .find(|e| matches!(e.event, Event::Resumed { .. }))
        .map(|e| e.seq)
        .expect("resumed");
    let checkpoint_before = events
        .iter()
        .rev()
        .filter(|e| e.seq < first_resume && matches!(e.event, Event::CheckpointPublished { .. }))
        .map(|e| e.seq)
        .next();
    assert!(checkpoint_before.is_some());
    let inherited: Vec<Option<u64>> = events
        .iter()
        .filter_map(|e| match e.event {
            Event::Resumed {
                inherited_checkpoint_seq,
                ..
            } => Some(inherited_checkpoint_seq),
            _ => None,
        })
        .collect();
    assert_eq!(inherited.len(), 3);
    assert!(
        inherited.iter().all(|seq| *seq == checkpoint_before),
        "{inherited:?} vs {checkpoint_before:?}"
    );
    runtime.halt();
}

/// R-8, the tool's protocol: the built-in `append` finds its effect id in the file, so an
/// append that landed before the crash is confirmed and never written twice.
#[tokio::test]
async fn r8_the_append_protocol_confirms_an_effect_that_landed() {
    let (sink, lines) = reconcile_append(true).await;
    assert_eq!(lines, 1, "{sink}");
}

/// R-8, the tool's protocol: an append that never landed is `not_applied` and runs again,
/// once, under the same effect id.
#[tokio::test]
async fn r8_the_append_protocol_runs_an_effect_that_never_landed_again() {
    let (sink, lines) = reconcile_append(false).await;
    assert_eq!(lines, 1, "{sink}");
}

/// Runs an `append` whose worker dies after dispatch (having written or not), then lets the
/// next runtime reconcile it. Returns the sink and its number of lines.
async fn reconcile_append(landed: bool) -> (String, usize) {
    let restarts = Restarts::new();
    let sink_dir = tempfile::tempdir().expect("sink dir");
    let sink = sink_dir.path().join("sink");
    // The protocol reads the file: a missing one proves nothing.
    std::fs::write(&sink, "").expect("sink");
    let dying = Arc::new(Probe {
        name: "append",
        recovery: Recovery::External,
        calls: AtomicUsize::new(0),
        hang: true,
        append_first: landed,
    });
    let runtime = restarts.open_with(|builder| builder.tool(dying.clone()));
    let script = vec![
        json!({"tool": "append", "args": {"path": sink, "line": "once"}}),
        reply("done"),
    ];
    let execution = restarts.start(&runtime, script).await.execution_id;
    restarts
        .wait_events(&runtime, execution, "the dispatch", 1, is_dispatch)
        .await;
    let started = std::time::Instant::now();
    while dying.calls.load(Ordering::SeqCst) == 0
        || (landed && std::fs::metadata(&sink).map_or(0, |m| m.len()) == 0)
    {
        assert!(started.elapsed() < DEADLINE, "the append never ran");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    crash(runtime);
    let runtime = restarts.open(RestartWindow::Unlimited);
    runtime.recovery().await.expect("recovery");
    runtime
        .wait_finished(restarts.session, execution)
        .await
        .expect("finished");
    let snapshot = restarts.snapshot(&runtime, execution).await;
    assert_eq!(snapshot.text, "done");
    assert!(
        snapshot
            .receipts
            .iter()
            .any(|r| r.tool == "append" && r.status == "confirmed"),
        "{:?}",
        snapshot.receipts
    );
    let events = restarts.events(&runtime, execution);
    let reconciled = events.iter().find_map(|e| match &e.event {
        Event::ControlApplied {
            control: openprogram::storage::Control::Reconcile { status, .. },
            ..
        } => Some(*status),
        _ => None,
    });
    let expected = if landed { "confirmed" } else { "not_applied" };
    assert_eq!(
        reconciled.map(openprogram::actors::snapshot::receipt_status),
        Some(expected)
    );
    assert_eq!(count(&events, is_dispatch), if landed { 1 } else { 2 });
    runtime.halt();
    let text = std::fs::read_to_string(&sink).expect("sink");
    let lines = text.lines().count();
    (text, lines)
}

/// R-8 at startup: an execution already `reconciliation_required` when the runtime starts
/// (its tool had no protocol in the previous runtime) is handed to the protocol of the tool
/// it has now.
#[tokio::test]
async fn r8_startup_hands_a_reconciliation_required_execution_to_the_protocol() {
    let restarts = Restarts::new();
    let sink_dir = tempfile::tempdir().expect("sink dir");
    let sink = sink_dir.path().join("sink");
    let dying = || {
        Arc::new(Probe {
            name: "append",
            recovery: Recovery::External,
            calls: AtomicUsize::new(0),
            hang: true,
            append_first: true,
        })
    };
    let first = dying();
    let runtime = restarts.open_with(|builder| builder.tool(first.clone()));
    let script = vec![
        json!({"tool": "append", "args": {"path": sink, "line": "once"}}),
        reply("done"),
    ];
    let execution = restarts.start(&runtime, script).await.execution_id;
    let started = std::time::Instant::now();
    while !sink.exists() {
        assert!(started.elapsed() < DEADLINE, "the append never ran");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    crash(runtime);
    // A runtime whose `append` has no protocol: the effect is recorded unknown and stays so.
    let runtime = restarts.open_with(|builder| builder.tool(dying()));
    runtime.recovery().await.expect("recovery");
    restarts
        .wait_events(&runtime, execution, "the unknown receipt", 1, |e| {
            matches!(
                e,
                Event::StateChanged {
                    state: ExecutionState::ReconciliationRequired,
                    ..
                }
            )
        })
        .await;
    crash(runtime);
    let runtime = restarts.open(RestartWindow::Unlimited);
    let report = runtime.recovery().await.expect("recovery");
    assert_eq!(report.reconciling, vec![execution], "{report:?}");
    runtime
        .wait_finished(restarts.session, execution)
        .await
        .expect("finished");
    assert_eq!(restarts.snapshot(&runtime, execution).await.text, "done");
    runtime.halt();
    let text = std::fs::read_to_string(&sink).expect("sink");
    assert_eq!(text.lines().count(), 1, "{text}");
}

/// R-8, the operator: a tool without a protocol stays `reconciliation_required` — Continue
/// does not resolve it — until a `reconcile` command says what happened.
#[tokio::test]
async fn r8_an_operator_reconcile_resolves_an_effect_without_a_protocol() {
    for (outcome, runs_again) in [("confirmed", 0), ("not_applied", 1)] {
        let restarts = Restarts::new();
        let dying = Probe::new("ext", Recovery::External, true);
        let runtime = restarts.open_with(|builder| builder.tool(dying.clone()));
        let script = vec![json!({"tool": "ext", "args": {}}), reply("done")];
        let execution = restarts.start(&runtime, script).await.execution_id;
        restarts
            .wait_events(&runtime, execution, "the dispatch", 1, is_dispatch)
            .await;
        crash(runtime);
        let healthy = Probe::new("ext", Recovery::External, false);
        let runtime = restarts.open_with(|builder| builder.tool(healthy.clone()));
        runtime.recovery().await.expect("recovery");
        let snapshot = restarts
            .wait_state(&runtime, execution, "reconciliation_required")
            .await;
        // No fork: the only saved point's next step is the unknown effect (K-3).
        assert_eq!(
            snapshot.capabilities,
            vec!["reconcile", "cancel", "set_policy"]
        );
        let refused = runtime
            .command(restarts.session, execution, command("continue", None, None))
            .await
            .expect("continue");
        assert_eq!(refused.status, "rejected", "nothing else resolves it");
        let bad = openprogram::Command::from_json(&json!({
            "command_id": openprogram::storage::CommandId::new(),
            "kind": "reconcile",
            "outcome": "maybe",
        }));
        assert!(
            matches!(bad, Err(openprogram::Error::InvalidRequest(_))),
            "{bad:?}"
        );
        let applied = runtime
            .command(
                restarts.session,
                execution,
                command("reconcile", Some("checked by hand"), Some(outcome)),
            )
            .await
            .expect("reconcile");
        assert_eq!(applied.status, "applied", "{applied:?}");
        runtime
            .wait_finished(restarts.session, execution)
            .await
            .expect("finished");
        assert_eq!(restarts.snapshot(&runtime, execution).await.text, "done");
        assert_eq!(
            healthy.calls.load(Ordering::SeqCst),
            runs_again,
            "{outcome}"
        );
        runtime.halt();
    }
}

/// R-7 in process: `shutdown` pauses running executions under a restart intent; the next
/// start resumes them with their ids.
#[tokio::test]
async fn r7_orderly_shutdown_pauses_running_executions_and_the_next_start_resumes_them() {
    r7_orderly_shutdown_pauses_running_executions_and_the_next_start_resumes_them_on(Restarts::new()).await
}

/// The body of `r7_orderly_shutdown_pauses_running_executions_and_the_next_start_resumes_them`, on either store (N-1: `postgres.rs` runs it on PostgreSQL).
pub(crate) async fn r7_orderly_shutdown_pauses_running_executions_and_the_next_start_resumes_them_on(
    restarts: Restarts,
) {
    let runtime = restarts.open(RestartWindow::Unlimited);
    let mut started = Vec::new();
    for _ in 0..3 {
        // Three sessions: a session's turns run one at a time (C-2).
        let reply_ = restarts
            .start_apart(&runtime, vec![sleep(200), sleep(200), reply("done")])
            .await;
        started.push(reply_);
    }
    for execution in &started {
        restarts
            .wait_events(
                &runtime,
                execution.execution_id,
                "the sleep",
                1,
                is_sleep_dispatch_or_decision,
            )
            .await;
    }
    let report = runtime.shutdown().await;
    assert_eq!((report.live, report.left_running), (3, 0), "{report:?}");
    drop(runtime);
    {
        let store = restarts.open_store();
        for execution in &started {
            let head = store
                .head(execution.execution_id)
                .expect("head")
                .expect("exists");
            assert_eq!(head.state, ExecutionState::Paused);
            assert_eq!(head.pause_reason.as_deref(), Some("restart_recovery"));
            assert!(head.restart_intent.is_some());
        }
    }
    let runtime = restarts.open(RestartWindow::Unlimited);
    assert_eq!(runtime.recovery().await.expect("recovery").resumed.len(), 3);
    for execution in &started {
        runtime
            .wait_finished(
                restarts.session_of(execution.execution_id),
                execution.execution_id,
            )
            .await
            .expect("finished");
        let snapshot = restarts.snapshot(&runtime, execution.execution_id).await;
        assert_eq!(
            (snapshot.state, snapshot.text.as_str()),
            ("completed", "done")
        );
        assert_eq!(snapshot.reply_message_id, execution.reply_message_id);
    }
    runtime.halt();
}

/// dropping every client handle and subscription leaves the execution running.
#[tokio::test]
async fn r1_dropping_client_views_never_stops_an_execution() {
    let restarts = Restarts::new();
    let runtime = restarts.open(RestartWindow::Unlimited);
    let execution = restarts
        .start(&runtime, vec![sleep(100), reply("done")])
        .await
        .execution_id;
    {
        let view = runtime.clone();
        let subscription = view.wait_finished(restarts.session, execution);
        // The subscription is dropped unfinished, then its handle.
        let _ = tokio::time::timeout(Duration::from_millis(10), subscription).await;
        let _ = view.snapshot(restarts.session, execution).await;
    }
    runtime
        .wait_finished(restarts.session, execution)
        .await
        .expect("finished");
    assert_eq!(
        restarts.snapshot(&runtime, execution).await.state,
        "completed"
    );
    runtime.halt();
}

/// pending commands stay authoritative. A Pause accepted just before the worker died
/// (saved `accepted`, never decided: a log written when accepting and deciding were two
/// transitions) is decided by the resumed attempt before it takes a
/// step, so the execution pauses instead of running on.
#[tokio::test]
async fn r5_a_command_accepted_before_the_crash_is_decided_first_by_the_resumed_attempt() {
    use openprogram::storage::Control;
    let restarts = Restarts::new();
    let runtime = restarts.open_freezing(0, RestartWindow::Unlimited);
    let execution = restarts
        .start(&runtime, vec![reply("done")])
        .await
        .execution_id;
    restarts
        .wait_events(&runtime, execution, "the attempt", 1, |e| {
            matches!(e, Event::AttemptStarted { .. })
        })
        .await;
    let pause = accept_undecided(
        &restarts,
        runtime,
        execution,
        command("pause", None, None),
        Control::Pause,
    )
    .await;
    let runtime = restarts.open(RestartWindow::Unlimited);
    assert_eq!(
        runtime.recovery().await.expect("recovery").resumed,
        vec![execution]
    );
    restarts.wait_state(&runtime, execution, "paused").await;
    let status = runtime
        .command_status(restarts.session, pause.command_id)
        .expect("status");
    assert_eq!(status.status, "applied", "{status:?}");
    let events = restarts.events(&runtime, execution);
    assert_eq!(count(&events, is_decision), 0, "no step before the pause");
    runtime.halt();
}

/// R-5, K-5: a Cancel accepted for a paused execution whose worker died before deciding it
/// is decided when the execution is next activated — before the command that activated it.
#[tokio::test]
async fn r5_a_cancel_accepted_for_a_parked_execution_is_decided_at_its_next_activation() {
    use openprogram::storage::Control;
    let restarts = Restarts::new();
    let runtime = restarts.open(RestartWindow::Unlimited);
    let execution = restarts.start_paused(&runtime, vec![reply("done")]).await;
    let cancel = accept_undecided(
        &restarts,
        runtime,
        execution,
        command("cancel", None, None),
        Control::Cancel,
    )
    .await;
    let runtime = restarts.open(RestartWindow::Unlimited);
    runtime.recovery().await.expect("recovery");
    assert_eq!(restarts.snapshot(&runtime, execution).await.state, "paused");
    let later = runtime
        .command(restarts.session, execution, command("continue", None, None))
        .await
        .expect("continue");
    assert_eq!(
        later.status, "rejected",
        "cancellation came first: {later:?}"
    );
    let status = runtime
        .command_status(restarts.session, cancel.command_id)
        .expect("status");
    assert_eq!(status.status, "applied", "{status:?}");
    assert_eq!(
        restarts.snapshot(&runtime, execution).await.state,
        "cancelled"
    );
    runtime.halt();
}

/// W-4: an `External` tool whose first call never returns (its worker dies in it) and whose
/// reconcile protocol asks a person whether the effect went through — asked outside any
/// attempt, at the next runtime's startup.
struct AskingTool {
    calls: AtomicUsize,
}

impl Tool for AskingTool {
    fn name(&self) -> &str {
        "transfer"
    }
    fn recovery(&self) -> Recovery {
        Recovery::External
    }
    fn call(&self, _call: ToolCall) -> BoxFuture<'static, openprogram::agent::ToolResult> {
        let first = self.calls.fetch_add(1, Ordering::SeqCst) == 0;
        async move {
            if first {
                futures::future::pending::<()>().await;
            }
            Ok("sent".into())
        }
        .boxed()
    }
    fn reconcile(&self, call: ToolCall) -> BoxFuture<'static, openprogram::agent::Reconciliation> {
        use openprogram::agent::{LiveOutcome, Reconciliation};
        let asked = call.handle.ask("did the transfer go through?");
        async move {
            match asked.await {
                Ok(LiveOutcome::Answered(answer)) if answer == "no" => Reconciliation::NotApplied,
                Ok(LiveOutcome::Answered(answer)) => Reconciliation::Confirmed(answer),
                _ => Reconciliation::Unknown,
            }
        }
        .boxed()
    }
}

/// W-4: a question asked outside a managed execution (a reconcile protocol at startup) goes
/// to the embedder's handler; its answer resolves the effect. Without the handler the
/// protocol gets `no_interaction` and the effect waits for an operator.
#[tokio::test]
async fn w4_a_reconcile_protocol_at_startup_asks_the_embedders_question_handler() {
    let restarts = Restarts::new();
    let tool = Arc::new(AskingTool {
        calls: AtomicUsize::new(0),
    });
    let runtime = restarts.open_with(|builder| builder.tool(tool.clone()));
    let script = vec![json!({"tool": "transfer", "args": {}}), reply("done")];
    let execution = restarts.start(&runtime, script).await.execution_id;
    restarts
        .wait_events(&runtime, execution, "the dispatch", 1, is_dispatch)
        .await;
    crash(runtime);
    let asked = Arc::new(std::sync::Mutex::new(Vec::new()));
    let heard = asked.clone();
    let handler = move |_effect, spec: openprogram::agent::WaitSpec| {
        heard.lock().expect("asked").push(spec.prompt);
        let answer = openprogram::agent::LiveOutcome::Answered("no".into());
        futures::future::ready(Ok(answer)).boxed()
    };
    let runtime = restarts.open_with(|builder| {
        builder
            .tool(tool.clone())
            .restart_window(RestartWindow::Unlimited)
            .question_handler(Arc::new(handler))
    });
    runtime.recovery().await.expect("recovery");
    let finished = runtime.wait_finished(restarts.session, execution);
    tokio::time::timeout(DEADLINE, finished)
        .await
        .expect("the handler's answer resolved the effect")
        .expect("finished");
    assert_eq!(restarts.snapshot(&runtime, execution).await.text, "done");
    assert_eq!(
        *asked.lock().expect("asked"),
        ["did the transfer go through?"]
    );
    // "Not applied": the transfer ran again, once.
    assert_eq!(tool.calls.load(Ordering::SeqCst), 2);
    runtime.halt();
}
