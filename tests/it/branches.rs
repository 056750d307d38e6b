//! Fork, Retry and Activity through the library (K-2, B-1..B-5): children are new paused
//! executions in the same run and leave the original's history exactly as it was; Activity
//! counts branches of the conversation graph.

use openprogram::storage::{CommandId, Event, ExecutionId};
use openprogram::{Command, CommandReply, StartRequest};
use serde_json::{json, Value};

use crate::support::*;

fn fork_request(command_id: CommandId, checkpoint: Option<u64>) -> Command {
    command_of(json!({"command_id": command_id, "kind": "fork", "checkpoint": checkpoint}))
}

async fn send(harness: &Harness, execution: ExecutionId, request: Command) -> CommandReply {
    harness
        .runtime
        .command(harness.session, execution, request)
        .await
        .expect("command")
}

fn checkpoints(harness: &Harness, execution: ExecutionId) -> Vec<u64> {
    harness
        .events(execution)
        .iter()
        .filter(|envelope| matches!(envelope.event, Event::CheckpointPublished { .. }))
        .map(|envelope| envelope.seq)
        .collect()
}

fn tool_results(harness: &Harness, execution: ExecutionId) -> usize {
    count(&harness.events(execution), |event| {
        matches!(event, Event::ToolFinished { .. })
    })
}

async fn start_after(
    harness: &Harness,
    parent: Option<openprogram::storage::MessageId>,
    script: Vec<Value>,
) -> openprogram::StartReply {
    let request = StartRequest {
        message: "next".into(),
        parent_message_id: parent,
        script: elements(script),
        ..Default::default()
    };
    harness
        .runtime
        .start_execution(harness.session, request)
        .await
        .expect("start")
}

#[tokio::test]
async fn k2_fork_from_a_checkpoint_starts_a_paused_child_and_leaves_the_original_unchanged() {
    let harness = Harness::new();
    let original = harness
        .start(vec![echo("a"), echo("b"), reply("done")], None)
        .await;
    let finished = harness.wait_for_state(original, "completed").await;
    assert!(finished.capabilities.contains(&"fork"));
    let before = harness.events(original);

    let forked = send(&harness, original, fork_request(CommandId::new(), None)).await;
    assert_eq!(forked.status, "applied", "{forked:?}");
    let child = forked.execution_id.expect("the child's id");
    assert_ne!(child, original);
    assert_eq!(
        harness.events(original),
        before,
        "the original history changed"
    );
    let paused = harness.snapshot(child).await;
    assert_eq!(
        (paused.state, paused.pause_reason.as_deref()),
        ("paused", Some("fork"))
    );
    assert_eq!(paused.run_id, finished.run_id);
    assert_eq!(paused.parent_execution_id, Some(original));
    assert_eq!(paused.user_message_id, finished.user_message_id);
    assert_ne!(paused.reply_message_id, finished.reply_message_id);
    // From the latest saved point: both tool results are reused, only the reply is new.
    assert_eq!(
        harness.command(child, "continue", None).await.status,
        "applied"
    );
    let done = harness.wait_for_state(child, "completed").await;
    assert_eq!(done.text, "done");
    assert_eq!(
        tool_results(&harness, child),
        0,
        "a completed effect ran again"
    );

    // From the first checkpoint (the decision to call `echo a`): the child makes both calls,
    // as its own effects.
    let first = checkpoints(&harness, original)[0];
    let early = send(
        &harness,
        original,
        fork_request(CommandId::new(), Some(first)),
    )
    .await;
    let early = early.execution_id.expect("child");
    harness.command(early, "continue", None).await;
    harness.wait_for_state(early, "completed").await;
    assert_eq!(tool_results(&harness, early), 2);
    assert_eq!(
        harness.events(original),
        before,
        "the original history changed"
    );
}

#[tokio::test]
async fn k2_fork_refuses_a_point_that_is_not_an_allowed_saved_point() {
    let harness = Harness::new();
    let original = harness.start(vec![echo("a"), reply("done")], None).await;
    harness.wait_for_state(original, "completed").await;
    let last = *checkpoints(&harness, original).last().expect("checkpoints");
    let before = harness.events(original);
    for checkpoint in [last, 9_999] {
        let command_id = CommandId::new();
        let refused = send(
            &harness,
            original,
            fork_request(command_id, Some(checkpoint)),
        )
        .await;
        assert_eq!(refused.status, "rejected", "{refused:?}");
        assert_eq!(refused.execution_id, None);
        // Recorded (K-1): its status reads back, and a retry gets the same answer (K-4).
        let status = harness
            .runtime
            .command_status(harness.session, command_id)
            .expect("status");
        assert_eq!(status.status, "rejected");
        let again = send(
            &harness,
            original,
            fork_request(command_id, Some(checkpoint)),
        )
        .await;
        assert_eq!(again, refused);
    }
    // The refusals were appended; the original's earlier events are exactly as they were.
    assert_eq!(harness.events(original)[..before.len()], before[..]);
}

#[tokio::test]
async fn k4_a_retried_fork_returns_the_same_child_and_another_payload_conflicts() {
    let harness = Harness::new();
    let original = harness.start(vec![echo("a"), reply("done")], None).await;
    harness.wait_for_state(original, "completed").await;
    let command_id = CommandId::new();
    let first = send(&harness, original, fork_request(command_id, None)).await;
    let again = send(&harness, original, fork_request(command_id, None)).await;
    assert_eq!(first, again);
    let status = harness
        .runtime
        .command_status(harness.session, command_id)
        .expect("status");
    assert_eq!(status.execution_id, first.execution_id);
    let other = harness
        .runtime
        .command(harness.session, original, fork_request(command_id, Some(1)))
        .await;
    assert!(
        matches!(other, Err(openprogram::Error::CommandConflict { .. })),
        "{other:?}"
    );
}

#[tokio::test]
async fn k2_retry_is_a_new_execution_in_the_same_run_from_the_request() {
    let harness = Harness::new();
    // One decision allowed for a two-step script: it fails (E-5).
    let original = harness.start(vec![echo("a"), reply("done")], Some(1)).await;
    let failed = harness.wait_for_state(original, "failed").await;
    assert!(failed.capabilities.contains(&"retry"));
    let request = command_of(json!({"kind": "retry"}));
    let retried = send(&harness, original, request).await;
    assert_eq!(retried.status, "applied", "{retried:?}");
    let child = retried.execution_id.expect("child");
    let paused = harness.snapshot(child).await;
    assert_eq!(paused.state, "paused");
    assert_eq!(paused.run_id, failed.run_id);
    assert_ne!(child, original);
    harness.command(child, "continue", None).await;
    // The same request from its beginning: the same limit fails it again, with its own call.
    harness.wait_for_state(child, "failed").await;
    assert_eq!(tool_results(&harness, child), 1);
    // Retry of a running execution is refused.
    let running = harness.start(vec![sleep(5_000), reply("x")], None).await;
    harness.wait_for_sleep(running).await;
    let refused = send(&harness, running, command_of(json!({"kind": "retry"}))).await;
    assert_eq!(refused.status, "rejected");
    harness.command(running, "cancel", None).await;
}

/// K-2: a fork is an independent execution: cancelling the original leaves it be. (Continued
/// while the original runs, it waits for the session, C-2; the cancel frees it to run.)
#[tokio::test]
async fn k2_a_fork_is_independent_of_its_original() {
    let harness = Harness::new();
    let original = harness.start(vec![sleep(5_000), reply("x")], None).await;
    harness.wait_for_sleep(original).await;
    let child = send(&harness, original, fork_request(CommandId::new(), None))
        .await
        .execution_id
        .expect("child");
    // Forked after the decision to sleep: the child runs the sleep itself, no decision.
    harness.command(child, "continue", None).await;
    harness.wait_for_state(child, "queued").await;
    assert_eq!(
        harness.command(original, "cancel", None).await.status,
        "applied"
    );
    harness.wait_for_state(original, "cancelled").await;
    harness.wait_for_state(child, "running").await;
    harness.command(child, "cancel", None).await;
}

/// K-2: a fork never runs an External effect the original dispatched, and never inherits an
/// approval: the point between an approval and its operation is not a saved point to fork.
#[tokio::test]
async fn k2_a_fork_never_repeats_an_external_effect_or_an_approval() {
    let harness = Harness::new();
    let sink_dir = tempfile::tempdir().expect("sink dir");
    let sink = sink_dir.path().join("sink");
    let append = serde_json::json!({"tool": "append", "args": {"path": sink, "line": "once"}});
    let original = harness.start(vec![append, reply("done")], None).await;
    harness.wait_for_state(original, "completed").await;
    let before_append = checkpoints(&harness, original)[0];
    let refused = send(
        &harness,
        original,
        fork_request(CommandId::new(), Some(before_append)),
    )
    .await;
    assert_eq!(refused.status, "rejected", "{refused:?}");
    // The default point is after the append's result: the child reuses it.
    let child = send(&harness, original, fork_request(CommandId::new(), None))
        .await
        .execution_id
        .expect("child");
    harness.command(child, "continue", None).await;
    harness.wait_for_state(child, "completed").await;
    let lines = std::fs::read_to_string(&sink).expect("sink");
    assert_eq!(lines.lines().count(), 1, "the fork appended again");

    let asking = harness
        .start(
            vec![
                serde_json::json!({"ask": "go?"}),
                echo("guarded"),
                reply("done"),
            ],
            None,
        )
        .await;
    let wait = harness.wait_for_state(asking, "waiting").await.waits[0].wait_id;
    let answer = command_of(json!({"kind": "answer", "wait_id": wait}));
    send(&harness, asking, answer).await;
    harness.wait_for_state(asking, "completed").await;
    let answered_at = harness
        .events(asking)
        .iter()
        .find(|e| matches!(e.event, Event::ControlApplied { .. }))
        .map(|e| e.seq)
        .expect("the answer");
    let after_answer = checkpoints(&harness, asking)
        .into_iter()
        .find(|seq| *seq > answered_at)
        .expect("the answer's checkpoint");
    let refused = send(
        &harness,
        asking,
        fork_request(CommandId::new(), Some(after_answer)),
    )
    .await;
    assert_eq!(refused.status, "rejected", "{refused:?}");
}

/// B-2 through the runtime: a conversation continued on its branch is one History row; a
/// retry adds a row, which needs attention while the child waits for Continue.
#[tokio::test]
async fn b2_activity_counts_branches_of_a_real_conversation() {
    let harness = Harness::new();
    let first = start_after(&harness, None, vec![reply("hello")]).await;
    harness
        .wait_for_state(first.execution_id, "completed")
        .await;
    let second = start_after(&harness, Some(first.reply_message_id), vec![reply("again")]).await;
    harness
        .wait_for_state(second.execution_id, "completed")
        .await;
    let activity = harness.runtime.activity(harness.session).expect("activity");
    assert_eq!(
        (
            activity.needs_attention.len(),
            activity.in_progress.len(),
            activity.history.len()
        ),
        (0, 0, 1),
        "{activity:#?}"
    );
    assert_eq!(activity.history[0].executions, 2);
    assert_eq!(activity.history[0].details[0].request, "next");

    let child = send(
        &harness,
        second.execution_id,
        command_of(json!({"kind": "retry"})),
    )
    .await
    .execution_id
    .expect("child");
    let activity = harness.runtime.activity(harness.session).expect("activity");
    assert_eq!(
        (activity.needs_attention.len(), activity.history.len()),
        (1, 1),
        "{activity:#?}"
    );
    harness.command(child, "continue", None).await;
    harness.wait_for_state(child, "completed").await;
    let activity = harness.runtime.activity(harness.session).expect("activity");
    assert_eq!(activity.history.len(), 2, "{activity:#?}");
    // The shared first turn is in both branches' details.
    for row in &activity.history {
        assert_eq!(row.details[0].execution_id, first.execution_id);
    }
    // Another session sees none of it.
    let other = harness
        .runtime
        .activity(openprogram::storage::SessionId::new())
        .expect("activity");
    assert!(other.history.is_empty());
}

/// B-4 through a real owner loss: the worker dies while the model request is in flight and
/// no automatic restart is allowed (window 0), so the execution is `expired` with only the
/// model's response missing: History, "Ended · response record incomplete", never
/// `completed`; an old Cancel request left undecided does not make it actionable.
#[tokio::test]
async fn b4_an_owner_lost_during_a_model_request_ends_in_history_as_incomplete() {
    use openprogram::RestartWindow;
    let restarts = Restarts::new();
    let runtime = restarts.open_freezing(1, RestartWindow::Disabled);
    let execution = restarts
        .start(&runtime, vec![echo("a"), reply("done")])
        .await
        .execution_id;
    restarts
        .wait_events(&runtime, execution, "the first tool result", 1, |event| {
            matches!(event, Event::ToolFinished { .. })
        })
        .await;
    let cancel = command_of(json!({"kind": "cancel"}));
    accept_undecided(
        &restarts,
        runtime,
        execution,
        cancel,
        openprogram::storage::Control::Cancel,
    )
    .await;
    let runtime = restarts.open(RestartWindow::Disabled);
    runtime.recovery().await.expect("recovery");
    let activity = runtime.activity(restarts.session).expect("activity");
    assert!(activity.needs_attention.is_empty(), "{activity:#?}");
    let row = &activity.history[0];
    assert_eq!(row.label, "Ended · response record incomplete");
    assert_eq!(row.status, "ended");
    assert!(row.controls.is_empty());
    runtime.halt();
}

/// B-6: the session stream emits `session_reload` right after a terminal outcome, never
/// before it, and a cursor resumes exactly after what was read.
#[tokio::test]
async fn b6_session_reload_follows_a_committed_terminal_outcome_and_a_cursor_resumes() {
    let harness = Harness::new();
    let other = openprogram::storage::SessionId::new();
    let execution = harness.start(vec![echo("a"), reply("done")], None).await;
    let elsewhere = harness
        .runtime
        .start_execution(
            other,
            StartRequest {
                message: "x".into(),
                script: elements(vec![reply("y")]),
                ..Default::default()
            },
        )
        .await
        .expect("start");
    harness.wait_for_state(execution, "completed").await;
    wait_state(&harness.runtime, other, elsewhere.execution_id, "completed").await;
    let feed = harness
        .runtime
        .session_feed(harness.session, 0, usize::MAX)
        .expect("feed")
        .entries;
    assert!(
        feed.iter().all(|entry| entry.execution_id == execution),
        "{feed:#?}"
    );
    let reload = feed
        .iter()
        .position(|entry| entry.kind == "session_reload")
        .expect("a session_reload");
    assert_eq!(feed[reload - 1].kind, "state_changed", "{feed:#?}");
    assert_eq!(
        reload,
        feed.len() - 1,
        "nothing of the turn comes after its reload"
    );
    assert_eq!(count_reloads(&feed), 1);
    // Read one entry at a time: the same entries, an event never parted from its reload.
    let mut paged = Vec::new();
    let mut cursor = 0;
    loop {
        let page = harness
            .runtime
            .session_feed(harness.session, cursor, 1)
            .expect("feed");
        if page.entries.is_empty() {
            break;
        }
        cursor = page.scanned_through;
        paged.extend(page.entries);
    }
    assert_eq!(paged, feed);
    // A session with nothing of its own still moves its cursor past the others' events.
    let quiet = harness
        .runtime
        .session_feed(openprogram::storage::SessionId::new(), 0, 10)
        .expect("feed");
    assert!(quiet.entries.is_empty());
    let newest = harness
        .runtime
        .store()
        .log_after(0, usize::MAX)
        .expect("log")
        .last()
        .map(|envelope| envelope.position);
    assert_eq!(Some(quiet.scanned_through), newest);
    // Resuming from the middle gives exactly the rest.
    let middle = feed[feed.len() / 2].position;
    let rest = harness
        .runtime
        .session_feed(harness.session, middle, usize::MAX)
        .expect("feed")
        .entries;
    let expected: Vec<_> = feed
        .iter()
        .filter(|entry| entry.position > middle)
        .cloned()
        .collect();
    assert_eq!(rest, expected);
}

fn count_reloads(feed: &[openprogram::actors::branches::SessionEntry]) -> usize {
    feed.iter()
        .filter(|entry| entry.kind == "session_reload")
        .count()
}
