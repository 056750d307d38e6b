//! C-2, one foreground turn per session (the default; `RuntimeBuilder::one_turn_per_session`),
//! through the library on a real store: a message sent while a turn runs follows its `when_busy` —
//! `queue` (default: it runs after, in order), `steer` (the running turn's steering text,
//! nothing admitted), `reject` (`session_busy`, nothing stored), `interrupt` (the running
//! turn pauses at its next safe point, the message runs, the paused turn continues later
//! behind the session); a crash with a turn queued keeps the order.

use openprogram::storage::{CommandId, Event, ExecutionId, SessionId};
use openprogram::{BusyStrategy, Runtime, StartRequest};
use serde_json::{json, Value};

use crate::support::*;

fn runtime(dir: &std::path::Path) -> Runtime {
    Runtime::builder().data_dir(dir).open().expect("open")
}

/// A runtime (one turn per session, the default) on a new store, and a new session.
fn fresh() -> (tempfile::TempDir, Runtime, SessionId) {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = runtime(dir.path());
    (dir, runtime, SessionId::new())
}

fn sleep(ms: u64) -> Value {
    json!({"tool": "sleep", "args": {"ms": ms}})
}

async fn send(
    runtime: &Runtime,
    session: SessionId,
    message: &str,
    script: Vec<Value>,
    when_busy: Option<BusyStrategy>,
) -> openprogram::Result<openprogram::StartReply> {
    let request = StartRequest {
        message: message.into(),
        script: elements(script),
        when_busy,
        ..Default::default()
    };
    runtime.start_execution(session, request).await
}

/// When `execution` committed its first event of `kind` (a `type_name`), as (position).
fn first_position(
    runtime: &Runtime,
    session: SessionId,
    execution: ExecutionId,
    kind: &str,
) -> u64 {
    runtime
        .events(session, execution, 0)
        .expect("events")
        .iter()
        .find(|envelope| envelope.event.type_name() == kind)
        .map(|envelope| envelope.position)
        .unwrap_or_else(|| panic!("{execution} has no {kind}"))
}

/// The position of the event that ended `execution`.
fn end_position(runtime: &Runtime, session: SessionId, execution: ExecutionId) -> u64 {
    runtime
        .events(session, execution, 0)
        .expect("events")
        .iter()
        .find(|envelope| matches!(&envelope.event, Event::StateChanged { state, .. } if state.is_terminal()))
        .map(|envelope| envelope.position)
        .expect("ended")
}

#[tokio::test]
async fn c2_a_message_while_a_turn_runs_waits_in_line_and_runs_after_it() {
    let (_dir, runtime, session) = fresh();
    let first = send(
        &runtime,
        session,
        "first",
        vec![sleep(300), reply("one")],
        None,
    )
    .await
    .expect("first");
    assert_eq!(first.session_turn, Some("immediate"));
    let second = send(&runtime, session, "second", vec![reply("two")], None)
        .await
        .expect("second");
    let third = send(&runtime, session, "third", vec![reply("three")], None)
        .await
        .expect("third");
    assert_eq!(second.session_turn, Some("queue"));
    let queued = runtime
        .snapshot(session, second.execution_id)
        .await
        .expect("snapshot");
    assert_eq!(queued.state, "queued", "{queued:?}");
    let turn = queued.session_turn.expect("a session turn");
    assert!(turn.queued);
    // Said with the turn it waits behind and its place in line.
    assert_eq!(
        (turn.behind, turn.place),
        (Some(first.execution_id), Some(1))
    );
    let last = runtime.snapshot(session, third.execution_id).await;
    let turn = last
        .expect("snapshot")
        .session_turn
        .expect("a session turn");
    assert_eq!(
        (turn.behind, turn.place),
        (Some(first.execution_id), Some(2))
    );
    for (execution, text) in [
        (third.execution_id, "three"),
        (second.execution_id, "two"),
        (first.execution_id, "one"),
    ] {
        let done = wait_state(&runtime, session, execution, "completed").await;
        assert_eq!(done.text, text);
    }
    // In line: each started only after the one before it ended.
    let first_end = end_position(&runtime, session, first.execution_id);
    let second_start = first_position(
        &runtime,
        session,
        second.execution_id,
        "session_turn_started",
    );
    let second_end = end_position(&runtime, session, second.execution_id);
    let third_start = first_position(
        &runtime,
        session,
        third.execution_id,
        "session_turn_started",
    );
    assert!(
        first_end < second_start && second_end < third_start,
        "{first_end} {second_start} {second_end} {third_start}"
    );
    // Another session was never held up.
    let elsewhere = send(
        &runtime,
        SessionId::new(),
        "elsewhere",
        vec![reply("x")],
        None,
    )
    .await
    .expect("other");
    assert_eq!(elsewhere.session_turn, Some("immediate"));
    runtime.shutdown().await;
}

#[tokio::test]
async fn c2_reject_stores_nothing_and_steer_reaches_the_running_turn() {
    let (_dir, runtime, session) = fresh();
    let running = send(
        &runtime,
        session,
        "first",
        vec![sleep(400), reply("done")],
        None,
    )
    .await
    .expect("first");
    let refused = send(
        &runtime,
        session,
        "no",
        vec![reply("x")],
        Some(BusyStrategy::Reject),
    )
    .await;
    match refused {
        Err(openprogram::Error::SessionBusy { foreground, .. }) => {
            assert_eq!(foreground, running.execution_id)
        }
        other => panic!("{other:?}"),
    }
    let steered = send(
        &runtime,
        session,
        "keep it short",
        vec![],
        Some(BusyStrategy::Steer),
    )
    .await
    .expect("steered");
    assert_eq!(steered.execution_id, running.execution_id);
    assert_eq!(
        steered.steered.as_ref().map(|reply| reply.status),
        Some("applied")
    );
    let done = wait_state(&runtime, session, running.execution_id, "completed").await;
    assert_eq!(done.text, "done\n[steer] keep it short");
    let executions = runtime.executions(session).await.expect("list");
    assert_eq!(
        executions.len(),
        1,
        "neither the refused nor the steered message was admitted"
    );
    runtime.shutdown().await;
}

#[tokio::test]
async fn c2_an_interrupt_pauses_the_running_turn_runs_first_and_the_paused_one_continues_after() {
    let (_dir, runtime, session) = fresh();
    let script = vec![sleep(300), echo("a"), sleep(300), reply("first")];
    let first = send(&runtime, session, "first", script, None)
        .await
        .expect("first");
    let urgent = send(
        &runtime,
        session,
        "urgent",
        vec![sleep(400), reply("urgent")],
        Some(BusyStrategy::Interrupt),
    )
    .await
    .expect("urgent");
    assert_eq!(urgent.session_turn, Some("interrupt"));
    let paused = wait_state(&runtime, session, first.execution_id, "paused").await;
    assert_eq!(paused.pause_reason.as_deref(), Some("pause"));
    // Continued while the interrupting turn runs: it no longer holds its session, so it
    // waits in line instead of running beside it.
    wait_state(&runtime, session, urgent.execution_id, "running").await;
    let reply = runtime
        .command(
            session,
            first.execution_id,
            command_of(json!({"command_id": CommandId::new(), "kind": "continue"})),
        )
        .await
        .expect("continue");
    assert_eq!(reply.status, "applied", "{reply:?}");
    let waiting = runtime
        .snapshot(session, first.execution_id)
        .await
        .expect("snapshot");
    assert_eq!(waiting.state, "queued", "{waiting:?}");
    wait_state(&runtime, session, urgent.execution_id, "completed").await;
    let done = wait_state(&runtime, session, first.execution_id, "completed").await;
    assert_eq!(done.text, "first");
    let paused_position = runtime
        .events(session, first.execution_id, 0)
        .expect("events")
        .iter()
        .find(|envelope| matches!(&envelope.event, Event::StateChanged { state, .. } if state.as_str() == "paused"))
        .map(|envelope| envelope.position)
        .expect("paused");
    let urgent_start = first_position(
        &runtime,
        session,
        urgent.execution_id,
        "session_turn_started",
    );
    let urgent_end = end_position(&runtime, session, urgent.execution_id);
    let first_again = runtime
        .events(session, first.execution_id, 0)
        .expect("events")
        .iter()
        .find(|envelope| envelope.event.type_name() == "session_turn_started")
        .map(|envelope| envelope.position)
        .expect("took its session again");
    assert!(
        paused_position < urgent_start,
        "the interrupt ran only once the turn paused"
    );
    assert!(
        urgent_end < first_again,
        "the paused turn ran again only after the interrupt"
    );
    runtime.shutdown().await;
}

#[tokio::test]
async fn c2_a_paused_or_cancelled_turn_in_line_holds_nobody_up() {
    let (_dir, runtime, session) = fresh();
    let holder = send(
        &runtime,
        session,
        "holder",
        vec![sleep(400), reply("h")],
        None,
    )
    .await
    .expect("holder");
    let paused = send(&runtime, session, "paused", vec![reply("p")], None)
        .await
        .expect("paused");
    let cancelled = send(&runtime, session, "cancelled", vec![reply("c")], None)
        .await
        .expect("cancelled");
    let last = send(&runtime, session, "last", vec![reply("l")], None)
        .await
        .expect("last");
    for (execution, kind) in [
        (paused.execution_id, "pause"),
        (cancelled.execution_id, "cancel"),
    ] {
        let reply = runtime
            .command(
                session,
                execution,
                command_of(json!({"command_id": CommandId::new(), "kind": kind})),
            )
            .await
            .expect(kind);
        assert_eq!(reply.status, "applied", "{kind}: {reply:?}");
    }
    wait_state(&runtime, session, holder.execution_id, "completed").await;
    let done = wait_state(&runtime, session, last.execution_id, "completed").await;
    assert_eq!(done.text, "l");
    assert_eq!(
        runtime
            .snapshot(session, paused.execution_id)
            .await
            .expect("s")
            .state,
        "paused"
    );
    assert_eq!(
        runtime
            .snapshot(session, cancelled.execution_id)
            .await
            .expect("s")
            .state,
        "cancelled"
    );
    // Continued now, the paused one queues again and runs (nobody holds the session).
    runtime
        .command(
            session,
            paused.execution_id,
            command_of(json!({"command_id": CommandId::new(), "kind": "continue"})),
        )
        .await
        .expect("continue");
    assert_eq!(
        wait_state(&runtime, session, paused.execution_id, "completed")
            .await
            .text,
        "p"
    );
    // Without one turn per session, `when_busy` is refused.
    let plain = Runtime::builder()
        .data_dir(tempfile::tempdir().expect("dir").path())
        .one_turn_per_session(false)
        .open()
        .expect("open");
    let refused = send(
        &plain,
        SessionId::new(),
        "x",
        vec![reply("x")],
        Some(BusyStrategy::Queue),
    )
    .await;
    assert!(
        matches!(refused, Err(openprogram::Error::InvalidRequest(_))),
        "{refused:?}"
    );
    plain.shutdown().await;
    runtime.shutdown().await;
}

#[tokio::test]
async fn c2_a_crash_with_a_turn_in_line_keeps_the_order() {
    let restarts = Restarts::new();
    let open = || {
        restarts.open_with(|builder| builder.restart_window(openprogram::RestartWindow::Unlimited))
    };
    let runtime = open();
    let session = restarts.session;
    let first = send(
        &runtime,
        session,
        "first",
        vec![sleep(600), reply("one")],
        None,
    )
    .await
    .expect("first");
    let second = send(&runtime, session, "second", vec![reply("two")], None)
        .await
        .expect("second");
    crash(runtime);
    let runtime = open();
    let one = wait_state(&runtime, session, first.execution_id, "completed").await;
    let two = wait_state(&runtime, session, second.execution_id, "completed").await;
    assert_eq!((one.text.as_str(), two.text.as_str()), ("one", "two"));
    let first_end = end_position(&runtime, session, first.execution_id);
    let second_start = first_position(
        &runtime,
        session,
        second.execution_id,
        "session_turn_started",
    );
    assert!(
        first_end < second_start,
        "after the restart too, the second ran after the first"
    );
    runtime.shutdown().await;
}

#[test]
fn c2_over_http_a_busy_session_answers_by_the_strategy_sent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = crate::http::TestServer::on(dir, |builder| builder, |_| {});
    let session = server.session();
    let first = server.start(
        &session,
        json!({"kind": "agent", "message": "first", "script": [{"tool": "sleep", "args": {"ms": 500}}, {"reply": "done"}]}),
    );
    assert_eq!(first["session_turn"], "immediate");
    let path = format!("/v1/sessions/{}/executions", session.0);
    let body = |when_busy: &str| json!({"kind": "agent", "message": "second", "script": [{"reply": "x"}], "when_busy": when_busy});
    let (status, refused) = server.call("POST", &path, Some(&session.1), Some(&body("reject")));
    assert_eq!(
        (status, refused["code"].as_str()),
        (409, Some("session_busy")),
        "{refused}"
    );
    assert_eq!(refused["foreground"], first["execution_id"]);
    let (status, steered) = server.call("POST", &path, Some(&session.1), Some(&body("steer")));
    assert_eq!(status, 202, "{steered}");
    assert_eq!(steered["execution_id"], first["execution_id"]);
    assert_eq!(steered["steered"]["status"], "applied");
    let (status, wrong) = server.call("POST", &path, Some(&session.1), Some(&body("later")));
    assert_eq!(status, 400, "{wrong}");
    let queued = server.start(&session, body("queue"));
    assert_eq!(queued["session_turn"], "queue");
    let execution = queued["execution_id"].as_str().expect("id").to_owned();
    let snapshot = server.snapshot(&session, &execution);
    assert!(
        snapshot["state"] == "queued" || snapshot["state"] == "completed",
        "{snapshot}"
    );
    let done = server.wait_for(&session, &execution, "completed", |s: &Value| {
        s["state"] == "completed"
    });
    assert_eq!(done["session_turn"]["strategy"], "queue");
    let first_id = first["execution_id"].as_str().expect("id");
    let first_done = server.snapshot(&session, first_id);
    assert_eq!(first_done["text"], "done\n[steer] second");
}

/// C-2 at length: many messages sent at once to one session all run, one at a time, in the
/// order they were admitted. (With a take that gave up after a few conflicts with the
/// admissions still arriving, the second turn stayed queued for good.)
#[tokio::test]
async fn c2_a_long_line_of_messages_runs_in_order() {
    const TURNS: usize = 400;
    let (_dir, runtime, session) = fresh();
    let mut turns = Vec::new();
    for turn in 0..TURNS {
        let script = vec![
            json!({"tool": "echo", "args": {"text": "x"}}),
            reply(&turn.to_string()),
        ];
        let reply_ = send(&runtime, session, "m", script, None)
            .await
            .expect("admitted");
        turns.push(reply_.execution_id);
    }
    let mut ended = Vec::new();
    for (turn, execution) in turns.iter().enumerate() {
        let done = wait_state(&runtime, session, *execution, "completed").await;
        assert_eq!(done.text, turn.to_string());
        ended.push(end_position(&runtime, session, *execution));
    }
    assert!(ended.windows(2).all(|pair| pair[0] < pair[1]), "{ended:?}");
}

/// C-2, `interrupt` of a turn waiting for a person: Pause is not offered while it waits, so
/// the interrupting turn waits first in line; once the answer lets the turn run again, it
/// pauses at its next safe point and the interrupting turn runs before it goes on.
#[tokio::test]
async fn c2_an_interrupt_pauses_a_turn_that_was_waiting_once_it_runs_again() {
    let (_dir, runtime, session) = fresh();
    let script = vec![
        json!({"ask": "go on?"}),
        sleep(300),
        echo("a"),
        reply("first"),
    ];
    let first = send(&runtime, session, "first", script, None)
        .await
        .expect("first");
    let asked = wait_state(&runtime, session, first.execution_id, "waiting").await;
    let urgent = send(
        &runtime,
        session,
        "urgent",
        vec![reply("urgent")],
        Some(BusyStrategy::Interrupt),
    )
    .await
    .expect("urgent");
    // Still waiting for the person; the interrupting turn waits for it.
    let still = wait_state(&runtime, session, urgent.execution_id, "queued").await;
    assert_eq!(still.state, "queued");
    let answered = runtime
        .command(
            session,
            first.execution_id,
            command_of(json!({"command_id": CommandId::new(), "kind": "answer",
                "wait_id": asked.waits[0].wait_id, "answer": "yes"})),
        )
        .await
        .expect("answer");
    assert_eq!(answered.status, "applied", "{answered:?}");
    let paused = wait_state(&runtime, session, first.execution_id, "paused").await;
    assert_eq!(paused.pause_reason.as_deref(), Some("pause"));
    let done = wait_state(&runtime, session, urgent.execution_id, "completed").await;
    assert_eq!(done.text, "urgent");
    // Continued, the first turn takes its session again and finishes.
    runtime
        .command(
            session,
            first.execution_id,
            command_of(json!({"command_id": CommandId::new(), "kind": "continue"})),
        )
        .await
        .expect("continue");
    let first_done = wait_state(&runtime, session, first.execution_id, "completed").await;
    assert_eq!(first_done.text, "first");
    let urgent_end = end_position(&runtime, session, urgent.execution_id);
    let paused_at = runtime
        .events(session, first.execution_id, 0)
        .expect("events")
        .iter()
        .find(|envelope| matches!(&envelope.event, Event::StateChanged { state, .. } if state.as_str() == "paused"))
        .map(|envelope| envelope.position)
        .expect("paused");
    assert!(paused_at < urgent_end);
}

/// C-2 for turns admitted paused — a paused start, a fork, a retry: continued while another
/// turn holds the session, each waits in line instead of running beside it, and runs after.
#[tokio::test]
async fn c2_a_paused_start_a_fork_and_a_retry_continued_wait_for_the_session() {
    let (_dir, runtime, session) = fresh();
    let original = send(
        &runtime,
        session,
        "original",
        vec![echo("a"), reply("o")],
        None,
    )
    .await
    .expect("original");
    wait_state(&runtime, session, original.execution_id, "completed").await;
    let mut children = Vec::new();
    for kind in ["fork", "retry"] {
        let reply = runtime
            .command(
                session,
                original.execution_id,
                command_of(json!({"command_id": CommandId::new(), "kind": kind})),
            )
            .await
            .expect("child");
        children.push(reply.execution_id.expect("a child"));
    }
    let paused = runtime
        .start_execution(
            session,
            StartRequest {
                message: "later".into(),
                script: elements(vec![reply("p")]),
                start_paused: true,
                ..Default::default()
            },
        )
        .await
        .expect("paused start");
    children.push(paused.execution_id);
    let holder = send(
        &runtime,
        session,
        "busy",
        vec![sleep(400), reply("h")],
        None,
    )
    .await
    .expect("holder");
    wait_state(&runtime, session, holder.execution_id, "running").await;
    for child in &children {
        let reply = runtime
            .command(
                session,
                *child,
                command_of(json!({"command_id": CommandId::new(), "kind": "continue"})),
            )
            .await
            .expect("continue");
        assert_eq!(reply.status, "applied", "{reply:?}");
        let now = runtime.snapshot(session, *child).await.expect("snapshot");
        assert_eq!(
            now.state, "queued",
            "{child} ran beside the holder: {now:?}"
        );
    }
    wait_state(&runtime, session, holder.execution_id, "completed").await;
    let holder_end = end_position(&runtime, session, holder.execution_id);
    let mut ends = Vec::new();
    for child in &children {
        wait_state(&runtime, session, *child, "completed").await;
        let started = first_position(&runtime, session, *child, "session_turn_started");
        assert!(
            started > holder_end,
            "{child} took the session before the holder ended"
        );
        ends.push((started, end_position(&runtime, session, *child)));
    }
    // One at a time: no two of them overlap.
    ends.sort();
    assert!(
        ends.windows(2).all(|pair| pair[0].1 < pair[1].0),
        "{ends:?}"
    );
}

/// C-2: a paused start continued in a free session takes it, so a message sent while it runs
/// waits behind it.
#[tokio::test]
async fn c2_a_paused_start_continued_holds_its_session() {
    let (_dir, runtime, session) = fresh();
    let paused = runtime
        .start_execution(
            session,
            StartRequest {
                message: "later".into(),
                script: elements(vec![sleep(300), reply("p")]),
                start_paused: true,
                ..Default::default()
            },
        )
        .await
        .expect("paused start");
    runtime
        .command(
            session,
            paused.execution_id,
            command_of(json!({"command_id": CommandId::new(), "kind": "continue"})),
        )
        .await
        .expect("continue");
    wait_state(&runtime, session, paused.execution_id, "running").await;
    let message = send(&runtime, session, "m", vec![reply("m")], None)
        .await
        .expect("message");
    assert_eq!(message.session_turn, Some("queue"));
    wait_state(&runtime, session, message.execution_id, "completed").await;
    let started = first_position(
        &runtime,
        session,
        message.execution_id,
        "session_turn_started",
    );
    assert!(started > end_position(&runtime, session, paused.execution_id));
}

/// C-2: an interrupt pauses only the turn it was admitted to interrupt. Interrupted in turn
/// and continued, it waits in line like any turn: it never pauses the turn that interrupted
/// it.
#[tokio::test]
async fn c2_an_interrupt_continued_later_interrupts_no_one_else() {
    let (_dir, runtime, session) = fresh();
    let holder = send(&runtime, session, "h", vec![sleep(400), reply("h")], None)
        .await
        .expect("holder");
    wait_state(&runtime, session, holder.execution_id, "running").await;
    let urgent = |text: &'static str| {
        send(
            &runtime,
            session,
            text,
            vec![sleep(300), echo("x"), reply(text)],
            Some(BusyStrategy::Interrupt),
        )
    };
    let first = urgent("first").await.expect("first");
    wait_state(&runtime, session, holder.execution_id, "paused").await;
    wait_state(&runtime, session, first.execution_id, "running").await;
    let second = urgent("second").await.expect("second");
    wait_state(&runtime, session, first.execution_id, "paused").await;
    wait_state(&runtime, session, second.execution_id, "running").await;
    runtime
        .command(
            session,
            first.execution_id,
            command_of(json!({"command_id": CommandId::new(), "kind": "continue"})),
        )
        .await
        .expect("continue");
    let done = wait_state(&runtime, session, second.execution_id, "completed").await;
    assert_eq!(done.text, "second");
    let paused_second = runtime
        .events(session, second.execution_id, 0)
        .expect("events")
        .iter()
        .any(|envelope| matches!(&envelope.event, Event::StateChanged { state, .. } if state.as_str() == "paused"));
    assert!(
        !paused_second,
        "the continued interrupt paused the turn that interrupted it"
    );
    let first_done = wait_state(&runtime, session, first.execution_id, "completed").await;
    assert_eq!(first_done.text, "first");
}

/// F-6: a function a person starts is a turn of its session, as a message is: started while
/// an agent turn runs, it waits in line and runs after it, and a message sent while it
/// waits or runs waits behind it. (A function an agent's call starts is its caller's child,
/// not a turn: `functions_crash.rs`.)
#[tokio::test]
async fn f6_a_function_a_person_starts_takes_its_turn_in_the_session() {
    let (dir, runtime, session) = fresh();
    let first = send(
        &runtime,
        session,
        "first",
        vec![sleep(300), reply("one")],
        None,
    )
    .await
    .expect("first");
    let start = openprogram::FunctionStart {
        function: "steps".into(),
        input: json!({"count": 2, "path": dir.path().join("steps.log")}),
        ..Default::default()
    };
    let function = runtime
        .start_function(session, start)
        .await
        .expect("function")
        .started;
    assert_eq!(function.session_turn, Some("queue"));
    let after = send(&runtime, session, "after", vec![reply("two")], None)
        .await
        .expect("after");
    assert_eq!(after.session_turn, Some("queue"));
    for execution in [
        after.execution_id,
        function.execution_id,
        first.execution_id,
    ] {
        wait_state(&runtime, session, execution, "completed").await;
    }
    let started = |execution| first_position(&runtime, session, execution, "session_turn_started");
    let (first_end, function_start) = (
        end_position(&runtime, session, first.execution_id),
        started(function.execution_id),
    );
    let (function_end, after_start) = (
        end_position(&runtime, session, function.execution_id),
        started(after.execution_id),
    );
    assert!(
        first_end < function_start && function_end < after_start,
        "{first_end} {function_start} {function_end} {after_start}"
    );
    runtime.shutdown().await;
}
