//! Managed processes through the library (P-1..P-3, R20): the built-in `shell` tool starts
//! an OS command under a process actor; `stop_process` is its own control; Cancel leaves it
//! running; a restart marks the processes of a dead incarnation lost and never signals them.
//! Every OS process a test starts is ended by the test, by pid.

use std::time::Duration;

use openprogram::actors::process::os::{self, OsIdentity, StopSignal};
use openprogram::storage::{
    Event, EventStore, ExecutionId, OwnerId, ProcessId, ProcessRecord, ProcessState, Store,
    Transition, Upsert,
};
use openprogram::{Command, RestartWindow, Runtime, Snapshot};
use serde_json::{json, Value};

use crate::support::*;

fn shell(program: &str, args: &[&str], background: bool) -> Value {
    json!({"tool": "shell", "args": {"program": program, "args": args, "background": background}})
}

fn harness_with_grace(grace: Duration) -> Harness {
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .process_stop_grace(grace)
        .open()
        .expect("open");
    Harness::with_runtime(runtime, dir)
}

fn stop_request(process_id: ProcessId) -> Command {
    command_of(json!({"kind": "stop_process", "process_id": process_id}))
}

async fn wait_process(harness: &Harness, execution: ExecutionId, state: &str) -> Snapshot {
    harness
        .wait_for(execution, state, |snapshot| {
            snapshot
                .processes
                .first()
                .is_some_and(|process| process.state == state)
        })
        .await
}

/// The OS identity the runtime recorded for a process.
fn recorded_identity(runtime: &Runtime, process_id: ProcessId) -> OsIdentity {
    let record = runtime
        .store()
        .process(process_id)
        .expect("read")
        .expect("record");
    OsIdentity {
        pid: record.os_pid.expect("pid"),
        start_time: record.os_start_time.expect("start time"),
    }
}

/// Kills a process the test started (through the runtime) if the test ends before the
/// runtime stops it: a failing test leaves nothing running.
struct EndOnDrop(Option<OsIdentity>);

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        if let Some(identity) = self.0 {
            // Verified: never a reused pid. Gone already is the usual case.
            let _ = os::signal_verified(identity, StopSignal::Kill);
        }
    }
}

fn alive(identity: OsIdentity) -> bool {
    os::identity_of(identity.pid).is_ok_and(|now| now.start_time == identity.start_time)
}

#[tokio::test]
async fn p1_twenty_megabytes_of_output_keep_a_bounded_tail_and_every_byte_counted() {
    let harness = Harness::new();
    let script = vec![
        shell("sh", &["-c", "yes 0123456789 | head -c 20000000"], false),
        reply("done"),
    ];
    let execution = harness.start(script, None).await;
    let done = harness.wait_for_state(execution, "completed").await;
    let process = &done.processes[0];
    assert_eq!(process.state, "exited", "{process:?}");
    assert_eq!(process.exit_code, Some(0));
    assert_eq!(process.output_bytes, 20_000_000);
    assert_eq!(
        process.output_tail.len(),
        openprogram::actors::process::OUTPUT_TAIL_BYTES
    );
    // 20,000,000 bytes = 1,818,181 lines of 11 bytes and 9 bytes of the next.
    assert!(
        process.output_tail.ends_with("0123456789\n012345678"),
        "{:?}",
        &process.output_tail[65_000..]
    );
    let shell_receipt = done.receipts.iter().find(|receipt| receipt.tool == "shell");
    assert_eq!(
        shell_receipt.map(|receipt| receipt.status),
        Some("confirmed")
    );
}

#[tokio::test]
async fn p1_stop_ends_a_process_that_ignores_sigterm_after_the_grace_period() {
    let harness = harness_with_grace(Duration::from_millis(200));
    let stubborn = "trap '' TERM; echo ready; while :; do sleep 0.05; done";
    let script = vec![shell("sh", &["-c", stubborn], true), reply("started")];
    let execution = harness.start(script, None).await;
    let running = harness.wait_for_state(execution, "completed").await;
    let process_id = running.processes[0].process_id;
    let _end = EndOnDrop(Some(recorded_identity(&harness.runtime, process_id)));
    // The trap is set before `ready` is printed: wait for its output.
    harness
        .wait_for(execution, "its output", |snapshot| {
            snapshot.processes[0].output_bytes > 0
        })
        .await;
    let stop = harness
        .runtime
        .command(harness.session, execution, stop_request(process_id))
        .await
        .expect("stop");
    assert_eq!(stop.status, "applied", "{stop:?}");
    let stopped = wait_process(&harness, execution, "stopped").await;
    assert_eq!(
        stopped.processes[0].exit_code,
        Some(128 + 9),
        "SIGTERM was ignored"
    );
    assert!(!stopped.capabilities.contains(&"stop_process"));
}

/// P-2: Cancel ends the execution and its call, not its process: the process stays running
/// and listed, and `stop_process` ends it.
#[tokio::test]
async fn p2_cancel_leaves_the_process_running_and_stop_process_ends_it() {
    let harness = harness_with_grace(Duration::from_secs(5));
    let script = vec![shell("sleep", &["30"], false), reply("never")];
    let execution = harness.start(script, None).await;
    let running = wait_process(&harness, execution, "running").await;
    let process_id = running.processes[0].process_id;
    let _end = EndOnDrop(Some(recorded_identity(&harness.runtime, process_id)));
    let cancel = harness.command(execution, "cancel", None).await;
    assert_eq!(cancel.status, "applied");
    let cancelled = harness.wait_for_state(execution, "cancelled").await;
    assert_eq!(cancelled.processes[0].state, "running");
    assert_eq!(
        cancelled.capabilities,
        // No fork: the only saved point's next step is the shell call, dispatched already.
        vec!["stop_process", "retry"]
    );
    let identity = recorded_identity(&harness.runtime, process_id);
    assert!(alive(identity), "Cancel stopped the process");
    let stop = harness
        .runtime
        .command(harness.session, execution, stop_request(process_id))
        .await
        .expect("stop");
    assert_eq!(stop.status, "applied", "{stop:?}");
    let stopped = wait_process(&harness, execution, "stopped").await;
    assert_eq!(stopped.processes[0].exit_code, Some(128 + 15));
}

/// P-2: an execution whose reply is done while its process runs still has work in
/// progress: the process is listed running, with its own control.
#[tokio::test]
async fn p2_a_finished_reply_with_a_background_process_is_still_in_progress() {
    let harness = Harness::new();
    let script = vec![shell("sleep", &["30"], true), reply("started it")];
    let execution = harness.start(script, None).await;
    let done = harness.wait_for_state(execution, "completed").await;
    assert_eq!(done.text, "started it");
    assert_eq!(done.processes[0].state, "running");
    assert_eq!(done.capabilities, vec!["stop_process", "fork", "retry"]);
    // Its branch is In progress, not History, while the process runs (B-3).
    let activity = harness.runtime.activity(harness.session).expect("activity");
    assert!(activity.history.is_empty(), "{activity:#?}");
    assert_eq!(activity.in_progress.len(), 1);
    assert_eq!(activity.in_progress[0].label, "Process running");
    let process_id = done.processes[0].process_id;
    let _end = EndOnDrop(Some(recorded_identity(&harness.runtime, process_id)));
    harness
        .runtime
        .command(harness.session, execution, stop_request(process_id))
        .await
        .expect("stop");
    wait_process(&harness, execution, "stopped").await;
    let activity = harness.runtime.activity(harness.session).expect("activity");
    assert_eq!(
        activity.history.len(),
        1,
        "once it stopped, the branch has ended"
    );
}

/// P-3, R20: after a crash, the processes of the dead incarnation are recorded lost and
/// never signalled — neither the real one it left behind, nor a forged record pointing at
/// a live process of someone else with a start time that does not match.
#[tokio::test]
async fn p3_r20_processes_of_a_dead_incarnation_are_lost_and_never_signalled() {
    let restarts = Restarts::new();
    let runtime = restarts.open(RestartWindow::Unlimited);
    let script = vec![shell("sleep", &["30"], true), reply("started")];
    let execution = restarts.start(&runtime, script).await.execution_id;
    let done = restarts.wait_state(&runtime, execution, "completed").await;
    let left = done.processes[0].process_id;
    let left_identity = recorded_identity(&runtime, left);

    // Someone else's process, and a forged record claiming its pid with another start time.
    let mut stranger = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("spawn sleep");
    let stranger_identity = os::identity_of(stranger.id()).expect("identity");
    let forged = forge_record(&restarts, runtime, execution, stranger_identity).await;

    let runtime = restarts.open(RestartWindow::Unlimited);
    let report = runtime.recovery().await.expect("recovery");
    let mut lost = report.lost_processes.clone();
    lost.sort();
    let mut expected = vec![left, forged];
    expected.sort();
    assert_eq!(lost, expected);
    let snapshot = restarts.snapshot(&runtime, execution).await;
    assert!(
        snapshot
            .processes
            .iter()
            .all(|process| process.state == "lost"),
        "{snapshot:?}"
    );
    let stop = runtime
        .command(restarts.session, execution, stop_request(left))
        .await
        .expect("stop");
    assert_eq!(
        stop.status, "rejected",
        "a lost process has no stop: {stop:?}"
    );
    assert!(
        alive(left_identity),
        "the left-behind process was signalled"
    );
    assert_eq!(
        stranger.try_wait().expect("try_wait"),
        None,
        "the stranger was signalled"
    );
    runtime.halt();

    // The test ends what it started, by pid, verified.
    os::signal_verified(left_identity, StopSignal::Kill).expect("kill the left-behind sleep");
    stranger.kill().expect("kill the stranger");
    stranger.wait().expect("reap the stranger");
}

/// A process record a dead incarnation might have left, written with the runtime crashed:
/// only the runtime's actors write through a runtime.
async fn forge_record(
    restarts: &Restarts,
    runtime: Runtime,
    execution: ExecutionId,
    of: OsIdentity,
) -> ProcessId {
    crash(runtime);
    let store = Store::open(restarts.dir.path()).expect("open the store");
    forge_record_of(&store, execution, of, OwnerId::new()).await
}

async fn forge_record_of(
    store: &Store,
    execution: ExecutionId,
    of: OsIdentity,
    owner_id: OwnerId,
) -> ProcessId {
    let process_id = ProcessId::new();
    let record = ProcessRecord {
        process_id,
        execution_id: execution,
        attempt_id: openprogram::storage::AttemptId::new(),
        owner_id,
        program: "sleep".into(),
        args: vec!["30".into()],
        os_pid: Some(of.pid),
        os_start_time: Some(of.start_time + 1),
        state: ProcessState::Running,
        exit_code: None,
        output_bytes: 0,
        output_chunks: Vec::new(),
    };
    let event = Event::ProcessChanged {
        process_id,
        state: "running".into(),
    };
    let saved = store
        .submit(Transition::new(execution, vec![event]).with(Upsert::Process(record)))
        .await
        .expect("forge");
    assert!(matches!(saved, openprogram::storage::Outcome::Committed(_)));
    process_id
}

/// P-3 with a real crash: `openprogram serve` runs the execution that starts a background
/// `sleep`, and is killed with SIGKILL. The next start records the orphan lost, and never
/// signals it; the test ends it, by its verified identity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p3_a_process_left_by_a_killed_serve_is_lost_and_never_signalled() {
    use std::process::{Command, Stdio};
    let restarts = Restarts::new();
    let sink_dir = tempfile::tempdir().expect("sink dir");
    let sink = sink_dir.path().join("sink");
    // The provider of this first runtime never decides: the execution is left for serve.
    let runtime = restarts.open_freezing(0, RestartWindow::Unlimited);
    let script = vec![
        shell("sleep", &["31"], true),
        json!({"tool": "append", "args": {"path": sink, "line": "after the shell"}}),
        reply("done"),
    ];
    let execution = restarts.start(&runtime, script).await.execution_id;
    crash(runtime);
    let mut child = Command::new(env!("CARGO_BIN_EXE_openprogram"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(restarts.dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn openprogram serve");
    // The append runs only after the shell's result, which comes after the process record.
    let started = std::time::Instant::now();
    while !sink.exists() {
        assert!(started.elapsed() < DEADLINE, "serve never ran the script");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    child.kill().expect("SIGKILL"); // by pid: the child this test started
    child.wait().expect("reap");

    let runtime = restarts.open(RestartWindow::Unlimited);
    let report = runtime.recovery().await.expect("recovery");
    assert_eq!(report.lost_processes.len(), 1, "{report:?}");
    let identity = recorded_identity(&runtime, report.lost_processes[0]);
    assert!(alive(identity), "the orphan was signalled");
    let done = restarts.wait_state(&runtime, execution, "completed").await;
    assert_eq!(done.processes[0].state, "lost");
    runtime.halt();
    os::signal_verified(identity, StopSignal::Kill).expect("end the orphan");
}

/// P-1: a process this runtime records running but holds no actor for (its end could not be
/// recorded) is recorded `lost` by `stop_process`, even on a parked execution, and nothing
/// is signalled: the record's pid belongs to a stranger here.
#[tokio::test]
async fn p1_stop_process_without_an_actor_records_it_lost_and_signals_nothing() {
    let (harness, store) = Harness::keeping_store();
    let execution = harness.start(vec![reply("done")], None).await;
    harness.wait_for_state(execution, "completed").await;
    let mut stranger = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .expect("spawn sleep");
    let identity = os::identity_of(stranger.id()).expect("identity");
    let owner = harness.runtime.store().incarnation().owner_id;
    let process_id = forge_record_of(&store, execution, identity, owner).await;
    let stop = harness
        .runtime
        .command(harness.session, execution, stop_request(process_id))
        .await
        .expect("stop");
    assert_eq!(stop.status, "applied", "{stop:?}");
    wait_process(&harness, execution, "lost").await;
    let record = harness
        .runtime
        .store()
        .process(process_id)
        .expect("read")
        .expect("record");
    assert_eq!(record.state, ProcessState::Lost);
    assert_eq!(
        stranger.try_wait().expect("try_wait"),
        None,
        "the stranger was signalled"
    );
    stranger.kill().expect("kill the stranger");
    stranger.wait().expect("reap the stranger");
}
