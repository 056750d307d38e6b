//! Test helper for the S-3 crash test (`tests/it/s3_crash.rs`): opens the store given on the
//! command line and lets `WRITERS` concurrent writers commit transitions until the parent
//! kills the process. Each writer owns one execution and prints `ack WRITER VERSION` only
//! after its transition is `Committed`, so every printed line is an acknowledgement.
//!
//! Not a tool for users: it exists so the crash test can kill a real process.

use std::io::Write;
use std::process::ExitCode;

use openprogram_storage::{
    EffectId, Event, EventStore, ExecutionHead, ExecutionId, ExecutionKind, Outcome, RunId,
    SessionId, Store, Transition,
};

/// The execution a writer owns: the same in every run, so runs continue each other's work.
pub fn execution_of(writer: u64) -> ExecutionId {
    ExecutionId::from_uuid(uuid::Uuid::from_u128(u128::from(writer) + 1))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(dir), Some(writers)) = (args.get(1), args.get(2).and_then(|n| n.parse::<u64>().ok()))
    else {
        eprintln!("usage: storage-crash-writer DIR WRITERS");
        return ExitCode::from(2);
    };
    let store = match Store::open(dir) {
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
    let failure = runtime.block_on(async move {
        let tasks: Vec<_> = (0..writers)
            .map(|writer| tokio::spawn(write_forever(store.clone(), writer, epoch)))
            .collect();
        for task in tasks {
            match task.await {
                Ok(message) => return message,
                Err(error) => return format!("writer panicked: {error}"),
            }
        }
        String::from("no writers")
    });
    eprintln!("{failure}");
    ExitCode::from(3)
}

/// Commits one transition after another; returns only on an unexpected answer.
async fn write_forever(store: Store, writer: u64, epoch: u64) -> String {
    let execution_id = execution_of(writer);
    let mut version = match store.head(execution_id) {
        Ok(head) => head.map_or(0, |head| head.version),
        Err(error) => return format!("head of writer {writer}: {error}"),
    };
    loop {
        let next = version + 1;
        let event = Event::ModelDecided {
            effect_id: EffectId::new(),
            decision: format!("{writer}:{next}:{}", "x".repeat(160)),
        };
        let transition = if version == 0 {
            let head = ExecutionHead::new(
                execution_id,
                SessionId::new(),
                RunId::new(),
                ExecutionKind::Job,
            );
            Transition::create(head, vec![event])
        } else {
            Transition::new(execution_id, vec![event]).expect_version(version)
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
                version = next;
            }
            other => return format!("writer {writer} at version {version}: unexpected {other:?}"),
        }
    }
}
