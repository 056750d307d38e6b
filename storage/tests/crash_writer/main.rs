//! Test helper for the S-3 crash test (`tests/it/s3_crash.rs`): opens the store given on the
//! command line and lets `WRITERS` concurrent writers commit transitions until the parent
//! kills the process. Each writer owns one execution and prints `ack WRITER VERSION` only
//! after its transition is `Committed`, so every printed line is an acknowledgement. Each
//! transition also moves the execution between Running (odd versions) and Paused (even), so
//! the by-state index changes all the time. Optional arguments set the materialization
//! slice and interval, to keep partial materializations in flight when the kill lands, and
//! how often sled's size is checked for a copy into a new generation (S-9), to keep copies
//! and switches in flight too.
//!
//! Not a tool for users: it exists so the crash test can kill a real process.

use std::io::Write;
use std::process::ExitCode;

use openprogram_storage::{
    EffectId, Event, EventReader, EventStore, ExecutionHead, ExecutionId, ExecutionKind,
    ExecutionState, Limits, Outcome, RunId, SessionId, Store, Transition,
};

/// The execution a writer owns: the same in every run, so runs continue each other's work.
pub fn execution_of(writer: u64) -> ExecutionId {
    ExecutionId::from_uuid(uuid::Uuid::from_u128(u128::from(writer) + 1))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(dir), Some(writers)) = (args.get(1), args.get(2).and_then(|n| n.parse::<u64>().ok()))
    else {
        eprintln!(
            "usage: storage-crash-writer DIR WRITERS [SLICE_LEN INTERVAL_MS [COPY_CHECK_MS]]"
        );
        return ExitCode::from(2);
    };
    let mut limits = Limits::default();
    if let Some(slice_len) = args.get(3).and_then(|n| n.parse().ok()) {
        limits.materialize_slice_len = slice_len;
    }
    if let Some(interval_ms) = args.get(4).and_then(|n| n.parse().ok()) {
        limits.materialize_interval_ms = interval_ms;
    }
    // Copies sled into a new generation whenever it grew at all, looking this often.
    if let Some(check_ms) = args.get(5).and_then(|n| n.parse().ok()) {
        limits.sled_copy_check_ms = check_ms;
        limits.sled_copy_growth_percent = 1;
        limits.sled_copy_min_growth_bytes = 0;
    }
    let store = match Store::open_with(dir, limits) {
        Ok(store) => store,
        Err(error) => {
            eprintln!("open failed: {error}");
            return ExitCode::from(1);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("runtime failed: {error}");
            return ExitCode::from(1);
        }
    };
    let epoch = store.incarnation().number;
    println!("ready {epoch}");
    if std::env::var_os("OP_FILL_UNTIL_ERROR").is_some() {
        return runtime.block_on(fill_until_error(store, epoch));
    }
    let failure = runtime.block_on(async move {
        let tasks: Vec<_> = (0..writers)
            .map(|writer| tokio::spawn(write_forever(store.clone(), writer, epoch)))
            .collect();
        if tasks.is_empty() {
            return String::from("no writers");
        }
        // Writers only return on an unexpected answer: report the first.
        match futures::future::select_all(tasks).await.0 {
            Ok(message) => message,
            Err(error) => format!("writer panicked: {error}"),
        }
    });
    eprintln!("{failure}");
    ExitCode::from(3)
}

/// The state a writer's execution has at `version`: Queued when created, then Running at
/// odd versions and Paused at even ones.
pub fn state_at(version: u64) -> ExecutionState {
    match version {
        0 | 1 => ExecutionState::Queued,
        odd if odd % 2 == 1 => ExecutionState::Running,
        _ => ExecutionState::Paused,
    }
}

/// Commits one transition after another; returns only on an unexpected answer.
async fn write_forever(store: Store, writer: u64, epoch: u64) -> String {
    let execution_id = execution_of(writer);
    let mut head = match store.head(execution_id) {
        Ok(head) => head,
        Err(error) => return format!("head of writer {writer}: {error}"),
    };
    loop {
        let version = head.as_ref().map_or(0, |head| head.version);
        let next = version + 1;
        let event = Event::ModelDecided {
            effect_id: EffectId::new(),
            decision: format!("{writer}:{next}:{}", "x".repeat(160)),
        };
        let transition = match &head {
            None => {
                let head = ExecutionHead::new(
                    execution_id,
                    SessionId::new(),
                    RunId::new(),
                    ExecutionKind::Job,
                );
                Transition::create(head, vec![event])
            }
            Some(current) => {
                let mut moved = current.clone();
                moved.state = state_at(next);
                Transition::new(execution_id, vec![event])
                    .expect_version(version)
                    .with_head(moved)
            }
        };
        match store.submit(transition.by_epoch(epoch)).await {
            Ok(Outcome::Committed(committed)) if committed.version == next => {
                let mut stdout = std::io::stdout().lock();
                if writeln!(stdout, "ack {writer} {next}")
                    .and_then(|()| stdout.flush())
                    .is_err()
                {
                    return String::from("stdout closed");
                }
                head = match store.head(execution_id) {
                    Ok(head) => head,
                    Err(error) => return format!("head of writer {writer}: {error}"),
                };
            }
            other => return format!("writer {writer} at version {version}: unexpected {other:?}"),
        }
    }
}

/// R13 helper: one writer with 4 KiB payloads until a write fails (the parent runs this
/// process under a file size limit). Prints each acknowledgement, the first error, and the
/// answer to one more submission, which must be refused by the fail-stop.
async fn fill_until_error(store: Store, epoch: u64) -> ExitCode {
    let execution_id = execution_of(0);
    let head = ExecutionHead::new(
        execution_id,
        SessionId::new(),
        RunId::new(),
        ExecutionKind::Job,
    );
    let event = || Event::ModelDecided {
        effect_id: EffectId::new(),
        decision: "f".repeat(4096),
    };
    let mut transition = Transition::create(head, vec![event()]);
    loop {
        match store.submit(transition.by_epoch(epoch)).await {
            Ok(Outcome::Committed(committed)) => {
                println!("ack 0 {}", committed.version);
                transition =
                    Transition::new(execution_id, vec![event()]).expect_version(committed.version);
            }
            Ok(other) => {
                eprintln!("unexpected {other:?}");
                return ExitCode::from(3);
            }
            Err(error) => {
                println!("error {}", error.code());
                let again = Transition::new(execution_id, vec![event()]);
                match store.submit(again).await {
                    Err(error) => println!("then {}", error.code()),
                    Ok(outcome) => println!("then accepted {outcome:?}"),
                }
                return ExitCode::SUCCESS;
            }
        }
    }
}
