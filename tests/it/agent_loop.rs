//! The agent loop through the library (E-3, E-4, E-5, I-1, X-1, passivation).

use openprogram::storage::{Event, ExecutionId};
use openprogram::Runtime;

use crate::support::*;

#[tokio::test]
async fn e3_twenty_step_turn_completes_with_twenty_confirmed_tool_receipts() {
    let harness = Harness::new();
    let mut script: Vec<_> = (0..20).map(|step| echo(&format!("step {step}"))).collect();
    script.push(reply("all done"));
    let execution = harness.start(script, None).await;
    let snapshot = harness.wait_for_state(execution, "completed").await;
    assert_eq!(snapshot.text, "all done");
    // S-8: the snapshot shows the newest receipts and counts them all (20 tools, 21
    // model decisions); the events hold every one.
    assert_eq!(snapshot.receipts_total, 41);
    assert!(
        snapshot
            .receipts
            .iter()
            .all(|receipt| receipt.status == "confirmed"),
        "{:?}",
        snapshot.receipts
    );
    let events = harness.events(execution);
    // Every decision and every tool result published a checkpoint in its own transition.
    assert_eq!(
        count(&events, |e| matches!(e, Event::CheckpointPublished { .. })),
        41
    );
    assert_eq!(
        count(&events, |e| matches!(
            e,
            Event::ToolFinished {
                status: openprogram::storage::ReceiptStatus::Confirmed,
                ..
            }
        )),
        20
    );
    assert_eq!(
        snapshot.capabilities,
        vec!["fork", "retry"],
        "a completed turn offers only new child executions"
    );
}

#[tokio::test]
async fn e5_iteration_limit_fails_keeping_text_and_history() {
    let harness = Harness::new();
    let script = vec![echo("a"), echo("b"), echo("c"), echo("d"), reply("never")];
    let execution = harness.start(script, Some(3)).await;
    let snapshot = harness.wait_for_state(execution, "failed").await;
    assert!(
        snapshot.text.contains("iteration limit of 3"),
        "{}",
        snapshot.text
    );
    let events = harness.events(execution);
    assert_eq!(
        count(&events, |e| matches!(e, Event::ModelDecided { .. })),
        3
    );
    assert_eq!(
        count(&events, |e| matches!(e, Event::ToolFinished { .. })),
        3
    );
}

#[tokio::test]
async fn e6_model_error_gets_a_response_record_and_fails() {
    let harness = Harness::new();
    // The scripted provider fails when the script runs out.
    let execution = harness.start(vec![echo("only")], None).await;
    let snapshot = harness.wait_for_state(execution, "failed").await;
    let events = harness.events(execution);
    assert_eq!(
        count(&events, |e| matches!(e, Event::ModelFailed { .. })),
        1
    );
    assert!(snapshot
        .receipts
        .iter()
        .any(|r| r.tool == "model" && r.status == "failed"));
}

#[tokio::test]
async fn e4_tool_error_is_a_failed_receipt_and_the_turn_goes_on() {
    let harness = Harness::new();
    let script = vec![
        serde_json::json!({"tool": "fail", "args": {"message": "boom"}}),
        reply("recovered"),
    ];
    let execution = harness.start(script, None).await;
    let snapshot = harness.wait_for_state(execution, "completed").await;
    assert!(snapshot
        .receipts
        .iter()
        .any(|r| r.tool == "fail" && r.status == "failed"));
    assert_eq!(snapshot.text, "recovered");
}

#[tokio::test]
async fn e4_external_tool_is_recorded_as_dispatched_before_it_runs() {
    let harness = Harness::new();
    let sink = tempfile::NamedTempFile::new().expect("sink");
    let path = sink.path().to_string_lossy().into_owned();
    let script = vec![
        serde_json::json!({"tool": "append", "args": {"path": path, "line": "hello"}}),
        reply("ok"),
    ];
    let execution = harness.start(script, None).await;
    harness.wait_for_state(execution, "completed").await;
    let events = harness.events(execution);
    let dispatched = events
        .iter()
        .position(|e| matches!(e.event, Event::ToolDispatched { .. }));
    let finished = events
        .iter()
        .position(|e| matches!(e.event, Event::ToolFinished { .. }));
    assert!(dispatched.is_some() && dispatched < finished, "{events:#?}");
    let written = std::fs::read_to_string(sink.path()).expect("sink");
    let Some(Event::ToolDispatched { effect_id, .. }) =
        dispatched.map(|index| &events[index].event)
    else {
        panic!("no dispatch");
    };
    assert_eq!(written, format!("hello\t{effect_id}\n"));
}

#[tokio::test]
async fn x1_another_sessions_execution_is_not_found() {
    let harness = Harness::new();
    let execution = harness.start(vec![reply("hi")], None).await;
    let stranger = openprogram::storage::SessionId::new();
    let error = harness
        .runtime
        .snapshot(stranger, execution)
        .await
        .expect_err("hidden");
    assert_eq!(error.code(), "not_found");
    let unknown = harness
        .runtime
        .snapshot(harness.session, ExecutionId::new())
        .await
        .expect_err("unknown");
    assert_eq!(unknown.code(), "not_found");
    assert_eq!(
        harness
            .runtime
            .events(stranger, execution, 0)
            .expect_err("hidden")
            .code(),
        "not_found"
    );
}

#[tokio::test]
async fn finished_executions_release_their_actors() {
    let harness = Harness::new();
    let mut executions = Vec::new();
    for _ in 0..20 {
        executions.push(harness.start(vec![echo("x"), reply("done")], None).await);
    }
    for execution in &executions {
        harness.wait_for_state(*execution, "completed").await;
    }
    let started = std::time::Instant::now();
    while harness.runtime.live_executions() > 0 {
        assert!(
            started.elapsed() < DEADLINE,
            "{} actors still live",
            harness.runtime.live_executions()
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // A read of a parked execution rebuilds it from storage.
    assert_eq!(harness.snapshot(executions[0]).await.text, "done");
}

#[tokio::test]
async fn i1_two_runtimes_live_in_one_process() {
    let (first, second) = (Harness::new(), Harness::new());
    let a = first.start(vec![echo("a"), reply("first")], None).await;
    let b = second.start(vec![echo("b"), reply("second")], None).await;
    assert_eq!(first.wait_for_state(a, "completed").await.text, "first");
    assert_eq!(second.wait_for_state(b, "completed").await.text, "second");
    // Each runtime sees only its own store.
    assert_eq!(
        second
            .runtime
            .snapshot(first.session, a)
            .await
            .expect_err("other store")
            .code(),
        "not_found"
    );
}

/// I-1: `shutdown` closes the store the runtime opened. Once it returns, nothing holds the
/// directory's lock or sled's file (taken here at once, no wait), reads through the old
/// handle answer `closed`, a new runtime opens the directory and finds the finished turn,
/// and after its own shutdown the directory can be removed.
#[tokio::test]
async fn i1_shutdown_closes_the_store_so_its_directory_opens_again_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().to_path_buf();
    let open = || {
        Runtime::builder()
            .data_dir(&path)
            .open()
            .expect("open runtime")
    };
    let harness = Harness::with_runtime(open(), tempfile::tempdir().expect("tempdir"));
    let execution = harness.start(vec![echo("a"), reply("kept")], None).await;
    harness.wait_for_state(execution, "completed").await;
    harness.runtime.shutdown().await;

    let free = |file: &std::path::Path| {
        let file = std::fs::File::open(file).expect("open the file");
        file.try_lock().is_ok()
    };
    assert!(free(&path.join("lock")), "the store's lock is still held");
    let sled_files = walk(&path).into_iter().filter(|file| file.ends_with("db"));
    for sled_file in sled_files {
        assert!(free(&sled_file), "{} is still locked", sled_file.display());
    }
    let read = harness.runtime.store().head(execution);
    assert_eq!(read.expect_err("closed").code(), "closed");

    let again = open();
    let snapshot = again.snapshot(harness.session, execution).await;
    assert_eq!(snapshot.expect("the turn, reopened").text, "kept");
    again.shutdown().await;
    std::fs::remove_dir_all(&path).expect("remove the data directory");
}

/// Every file under `dir`, recursively.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)
        .expect("read the directory")
        .flatten()
    {
        match entry.file_type().expect("file type").is_dir() {
            true => files.extend(walk(&entry.path())),
            false => files.push(entry.path()),
        }
    }
    files
}

#[test]
fn i1_the_handle_is_send_sync_clone() {
    fn assert_handle<T: Send + Sync + Clone + 'static>() {}
    assert_handle::<openprogram::Runtime>();
}

/// E-4 with controls racing: an External tool that answers at once (the built-in `append`)
/// has its result recorded before any command that arrived while its dispatch was being
/// committed is decided. Pauses and Continues land at random moments (seeded) on executions
/// of many `append` steps; with no crash anywhere, no effect may end `unknown` and none may
/// run twice.
#[tokio::test]
async fn e4_an_external_result_ready_at_once_is_recorded_before_a_racing_command() {
    use rand::{Rng, SeedableRng};
    let seed: u64 = std::env::var("OP_RACE_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("e4 race: seed {seed} (replay with OP_RACE_SEED={seed})");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let harness = Harness::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let (executions, steps) = (8, 300);
    let mut started = Vec::new();
    for index in 0..executions {
        let path = dir.path().join(format!("sink-{index}"));
        let path = path.to_string_lossy().into_owned();
        let mut script: Vec<_> = (0..steps)
            .map(|step| serde_json::json!({"tool": "append", "args": {"path": path, "line": step.to_string()}}))
            .collect();
        script.push(reply("ok"));
        // Each in a session of its own: the race is between executions running side by
        // side (one session runs one turn at a time, C-2).
        started.push((
            harness
                .start_apart_with(script, Some(steps as u32 + 1))
                .await,
            path,
        ));
    }
    let deadline = std::time::Instant::now() + DEADLINE;
    let mut applied = 0;
    loop {
        let mut running = Vec::new();
        let mut states = Vec::new();
        for (execution, _) in &started {
            let state = harness.snapshot(*execution).await.state;
            states.push(state);
            assert!(
                !matches!(state, "reconciliation_required" | "failed"),
                "seed {seed}: {execution} is {state}"
            );
            if state != "completed" {
                running.push(*execution);
            }
        }
        if running.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "seed {seed}: not all completed: {states:?}"
        );
        let execution = running[rng.gen_range(0..running.len())];
        let paused = harness.command(execution, "pause", None).await;
        if paused.status == "applied" {
            applied += 1;
        }
        tokio::time::sleep(std::time::Duration::from_micros(rng.gen_range(0..2_000))).await;
        harness.command(execution, "continue", None).await;
    }
    eprintln!("e4 race: {applied} pauses applied");
    for (execution, path) in &started {
        let events = harness.events(*execution);
        let unknown = count(&events, |e| {
            matches!(
                e,
                Event::ToolFinished {
                    status: openprogram::storage::ReceiptStatus::Unknown,
                    ..
                }
            )
        });
        assert_eq!(
            unknown, 0,
            "seed {seed}: an effect ended unknown without a crash"
        );
        let written = std::fs::read_to_string(path).expect("sink");
        let lines: Vec<&str> = written.lines().collect();
        assert_eq!(lines.len(), steps, "seed {seed}: {written}");
        let effects: std::collections::HashSet<_> = lines
            .iter()
            .filter_map(|line| line.split('\t').nth(1))
            .collect();
        assert_eq!(
            effects.len(),
            steps,
            "seed {seed}: an effect ran twice: {written}"
        );
    }
}
