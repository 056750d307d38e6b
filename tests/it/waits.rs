//! Durable waits through the library (W-1..W-3, W-5): the scripted provider's `ask` guards
//! the next script element; `answer` and `decline` are commands. Live questions are in
//! `questions.rs`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Instant;

use openprogram::storage::{
    AnswerScope, CommandId, Control, ExecutionId, SessionId, WaitId, WaitStatus,
};
use openprogram::{CommandReply, RestartWindow, Runtime, Snapshot, StartRequest};
use serde_json::{json, Value};

use crate::support::*;

fn ask(prompt: &str) -> Value {
    json!({ "ask": prompt })
}

fn append(path: &std::path::Path, line: &str) -> Value {
    json!({"tool": "append", "args": {"path": path, "line": line}})
}

/// `answer` with `text` to `wait_id` under `command_id`, through the harness's session.
pub(crate) async fn answer(
    harness: &Harness,
    execution: ExecutionId,
    command_id: CommandId,
    wait_id: WaitId,
    text: &str,
) -> CommandReply {
    let request = answer_request(command_id, Some(wait_id), text);
    send(&harness.runtime, harness.session, execution, request).await
}

pub(crate) fn answer_request(
    command_id: CommandId,
    wait_id: Option<WaitId>,
    answer: &str,
) -> openprogram::Command {
    command_of(
        json!({"command_id": command_id, "kind": "answer", "wait_id": wait_id, "answer": answer}),
    )
}

pub(crate) async fn send(
    runtime: &Runtime,
    session: SessionId,
    execution: ExecutionId,
    request: openprogram::Command,
) -> CommandReply {
    runtime
        .command(session, execution, request)
        .await
        .expect("command")
}

fn lines_of(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |text| text.lines().count())
}

#[tokio::test]
async fn w2_decline_never_runs_the_guarded_operation() {
    let harness = Harness::new();
    let sink_dir = tempfile::tempdir().expect("sink dir");
    let sink = sink_dir.path().join("sink");
    let script = vec![ask("append?"), append(&sink, "guarded"), reply("done")];
    let execution = harness.start(script, None).await;
    let waiting = harness.wait_for_state(execution, "waiting").await;
    assert_eq!(waiting.waits.len(), 1, "{waiting:?}");
    assert_eq!(waiting.waits[0].status, "open");
    assert_eq!(waiting.waits[0].kind, "approval");
    assert_eq!(waiting.waits[0].message_id, waiting.reply_message_id);
    // No wait named: `expected_version` pins the pending one; with neither, it is refused.
    let (runtime, session) = (&harness.runtime, harness.session);
    let unpinned = json!({"command_id": CommandId::new(), "kind": "decline"});
    let refused = openprogram::Command::from_json(&unpinned);
    assert!(
        matches!(refused, Err(openprogram::Error::InvalidRequest(_))),
        "{refused:?}"
    );
    // The same for a command built in code: refused, and nothing changes.
    let typed = openprogram::Command::new(openprogram::CommandBody::Decline {
        wait: openprogram::WaitRef::Pending,
    });
    let refused = runtime.command(session, execution, typed).await;
    assert!(
        matches!(refused, Err(openprogram::Error::InvalidRequest(_))),
        "{refused:?}"
    );
    assert_eq!(harness.snapshot(execution).await.version, waiting.version);
    let pinned = command_of(json!({"kind": "decline", "expected_version": waiting.version}));
    let declined = send(runtime, session, execution, pinned).await;
    assert_eq!(declined.status, "applied", "{declined:?}");
    let done = harness.wait_for_state(execution, "completed").await;
    assert_eq!(done.text, "done");
    assert_eq!(done.waits[0].status, "declined");
    assert!(done.receipts.iter().all(|receipt| receipt.tool != "append"));
    assert!(!sink.exists(), "a declined operation ran");
}

#[tokio::test]
async fn w2_an_answer_retried_with_the_same_command_id_runs_the_operation_once() {
    let harness = Harness::new();
    let sink_dir = tempfile::tempdir().expect("sink dir");
    let sink = sink_dir.path().join("sink");
    let script = vec![ask("append?"), append(&sink, "approved"), reply("done")];
    let execution = harness.start(script, None).await;
    let waiting = harness.wait_for_state(execution, "waiting").await;
    let wait_id = waiting.waits[0].wait_id;
    let command_id = CommandId::new();
    let runtime = &harness.runtime;
    let first = answer(&harness, execution, command_id, wait_id, "yes").await;
    assert_eq!(first.status, "applied", "{first:?}");
    // An unknown delivery retried: the stored outcome, nothing runs twice.
    let retried = answer(&harness, execution, command_id, wait_id, "yes").await;
    assert_eq!(retried, first);
    harness.wait_for_state(execution, "completed").await;
    // A new answer to the resolved wait is refused and approves nothing.
    let late = answer(&harness, execution, CommandId::new(), wait_id, "yes").await;
    assert_eq!(late.status, "rejected", "{late:?}");
    let done = harness.snapshot(execution).await;
    assert_eq!(done.waits[0].status, "answered");
    assert_eq!(done.waits[0].answer.as_deref(), Some("yes"));
    assert_eq!(done.waits[0].scope, Some("operation"), "the default scope");
    assert_eq!(lines_of(&sink), 1, "the approved operation ran once");
    let record = runtime
        .store()
        .wait(wait_id)
        .expect("read")
        .expect("record");
    assert_eq!(record.status, WaitStatus::Answered);
}

/// W-2: a discussion reply answers the wait without deciding: the guarded operation is not
/// approved, and never runs.
#[tokio::test]
async fn w2_a_discussion_reply_approves_nothing() {
    let harness = Harness::new();
    let sink_dir = tempfile::tempdir().expect("sink dir");
    let sink = sink_dir.path().join("sink");
    let script = vec![ask("append?"), append(&sink, "guarded"), reply("done")];
    let execution = harness.start(script, None).await;
    let wait_id = harness.wait_for_state(execution, "waiting").await.waits[0].wait_id;
    let request = command_of(json!({
        "kind": "answer", "wait_id": wait_id, "answer": "why do you need it?", "scope": "discussion"
    }));
    let (runtime, session) = (&harness.runtime, harness.session);
    assert_eq!(
        send(runtime, session, execution, request).await.status,
        "applied"
    );
    let done = harness.wait_for_state(execution, "completed").await;
    assert_eq!(done.waits[0].scope, Some("discussion"));
    assert!(!sink.exists(), "a discussion reply approved the operation");
    // A scope wider than one operation does not exist.
    let wider = json!({
        "command_id": CommandId::new(), "kind": "answer", "wait_id": wait_id, "answer": "yes", "scope": "always"
    });
    let refused = openprogram::Command::from_json(&wider);
    assert!(
        matches!(refused, Err(openprogram::Error::InvalidRequest(_))),
        "{refused:?}"
    );
}

/// W-3 regression across a restart: the first wait is answered, the second is open; an
/// answer to the first wait, accepted and never decided before a crash, is decided at the
/// next activation against the current checkpoint: refused. The second wait stays open until
/// its own answer, which completes the turn.
#[tokio::test]
async fn w3_an_answer_to_an_earlier_wait_never_moves_the_newer_wait_after_a_restart() {
    let restarts = Restarts::new();
    let runtime = restarts.open(RestartWindow::Unlimited);
    let script = vec![ask("first?"), echo("one"), ask("second?"), reply("done")];
    let execution = restarts.start(&runtime, script).await.execution_id;
    let first = restarts
        .wait_state(&runtime, execution, "waiting")
        .await
        .waits[0]
        .wait_id;
    let answered = send(
        &runtime,
        restarts.session,
        execution,
        answer_request(CommandId::new(), Some(first), "yes"),
    )
    .await;
    assert_eq!(answered.status, "applied");
    let second = wait_until(&restarts, &runtime, execution, |snapshot| {
        snapshot.state == "waiting" && snapshot.waits.len() == 2
    })
    .await
    .waits[1]
        .wait_id;
    let stale = answer_request(CommandId::new(), Some(first), "yes again");
    let control = Control::Answer {
        wait_id: first,
        answer: "yes again".into(),
        scope: AnswerScope::Operation,
    };
    let stale = accept_undecided(&restarts, runtime, execution, stale, control).await;

    let runtime = restarts.open(RestartWindow::Unlimited);
    let report = runtime.recovery().await.expect("recovery");
    assert!(
        report.resumed.is_empty(),
        "a waiting execution stays: {report:?}"
    );
    let still = restarts.snapshot(&runtime, execution).await;
    assert_eq!(still.state, "waiting");
    assert_eq!(still.waits[1].status, "open", "{still:?}");
    let own = send(
        &runtime,
        restarts.session,
        execution,
        answer_request(CommandId::new(), Some(second), "yes"),
    )
    .await;
    assert_eq!(own.status, "applied", "{own:?}");
    let stale = runtime
        .command_status(restarts.session, stale.command_id)
        .expect("status");
    assert_eq!(stale.status, "rejected", "{stale:?}");
    let done = restarts.wait_state(&runtime, execution, "completed").await;
    assert_eq!(done.waits[1].answer.as_deref(), Some("yes"));
    assert_eq!(done.text, "done");
    runtime.halt();
}

pub(crate) async fn wait_until(
    restarts: &Restarts,
    runtime: &Runtime,
    execution: ExecutionId,
    done: impl Fn(&Snapshot) -> bool,
) -> Snapshot {
    let started = Instant::now();
    loop {
        let snapshot = restarts.snapshot(runtime, execution).await;
        if done(&snapshot) {
            return snapshot;
        }
        assert!(started.elapsed() < DEADLINE, "waited: {snapshot:#?}");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// W-1: a real `openprogram serve` owns the store with the execution waiting and is killed
/// with SIGKILL; the wait is still there after the restart, and its answer completes the
/// turn, running the approved operation once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn w1_a_wait_survives_kill9_and_an_answer_after_restart_completes_the_turn() {
    let restarts = Restarts::new();
    let sink_dir = tempfile::tempdir().expect("sink dir");
    let sink = sink_dir.path().join("sink");
    let runtime = restarts.open(RestartWindow::Unlimited);
    let script = vec![ask("append?"), append(&sink, "approved"), reply("done")];
    let execution = restarts.start(&runtime, script).await.execution_id;
    restarts.wait_state(&runtime, execution, "waiting").await;
    crash(runtime);

    let mut child = Command::new(env!("CARGO_BIN_EXE_openprogram"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(restarts.dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn openprogram serve");
    // Read on a thread, so a serve that never reports fails the test at the deadline.
    let stderr = child.stderr.take().expect("stderr");
    let (lines, reported) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                return;
            }
        }
    });
    let line = loop {
        let line = reported
            .recv_timeout(DEADLINE)
            .expect("serve reports its recovery");
        if line.contains("startup recovery") {
            break line;
        }
    };
    assert!(
        line.contains("0 resumed"),
        "a waiting execution is not resumed: {line}"
    );
    child.kill().expect("SIGKILL"); // by pid: the child this test started
    child.wait().expect("reap");

    let runtime = restarts.open(RestartWindow::Unlimited);
    runtime.recovery().await.expect("recovery");
    let waiting = restarts.snapshot(&runtime, execution).await;
    assert_eq!(waiting.state, "waiting");
    assert_eq!(waiting.waits[0].status, "open");
    let wait_id = Some(waiting.waits[0].wait_id);
    let answered = send(
        &runtime,
        restarts.session,
        execution,
        answer_request(CommandId::new(), wait_id, "yes"),
    )
    .await;
    assert_eq!(answered.status, "applied", "{answered:?}");
    restarts.wait_state(&runtime, execution, "completed").await;
    assert_eq!(lines_of(&sink), 1);
    runtime.halt();
}

/// W-5: a pending wait is shown with an assistant message only when the execution's own
/// record names that message as its reply, in the same session.
#[tokio::test]
async fn w5_a_wait_attaches_only_to_its_own_message_in_its_own_session() {
    let harness = Harness::new();
    let other_session = SessionId::new();
    let request = |session_tag: &str| StartRequest {
        message: session_tag.into(),
        script: elements(vec![ask("go?"), reply("done")]),
        ..Default::default()
    };
    let mine = harness
        .runtime
        .start_execution(harness.session, request("mine"))
        .await
        .expect("start");
    let theirs = harness
        .runtime
        .start_execution(other_session, request("theirs"))
        .await
        .expect("start");
    harness.wait_for_state(mine.execution_id, "waiting").await;
    wait_state(
        &harness.runtime,
        other_session,
        theirs.execution_id,
        "waiting",
    )
    .await;
    let runtime = &harness.runtime;
    let found = runtime
        .pending_waits(harness.session, mine.reply_message_id)
        .await
        .expect("waits");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].message_id, mine.reply_message_id);
    // Another execution's message, another session's message, or a user message: nothing.
    for (session, message) in [
        (harness.session, theirs.reply_message_id),
        (other_session, mine.reply_message_id),
        (harness.session, mine.user_message_id),
    ] {
        let found = runtime
            .pending_waits(session, message)
            .await
            .expect("waits");
        assert!(found.is_empty(), "{found:?}");
    }
}
