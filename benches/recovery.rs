//! `cargo bench --bench recovery`: recovery time for N abandoned executions.
//! Writes N executions as a dead owner leaves them (admitted, running, an attempt of an
//! earlier incarnation, a model request in flight), then opens a runtime on the store and
//! times open → startup recovery done (every execution classified, claimed durably with a
//! new attempt, its actor started). The resumed executions then finish (one decision each);
//! that time is reported too. The raw baseline of the same run (sled batches of 256 + flush +
//! fsync) gives the ratio of claims per second to raw durable records per second.
//!
//! `RECOVERY_N` sets N as a comma-separated list (default `10000,100000`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use openprogram::storage::baseline::raw_sled_baseline;
use openprogram::storage::{
    AttemptId, AttemptLease, Event, EventStore, ExecutionHead, ExecutionId, ExecutionKind,
    ExecutionState, OwnerId, RunId, SessionId, Store, Transition,
};
use openprogram::Runtime;
use serde_json::json;

/// The `openprogram` binary's allocator (see `src/main.rs`), so that this bench measures what
/// the binary runs.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Admissions written at once while preparing.
const PREPARE_IN_FLIGHT: usize = 1024;

fn main() {
    let sizes: Vec<usize> = std::env::var("RECOVERY_N")
        .unwrap_or_else(|_| "10000,100000".into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    let threads = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let raw_dir = tempfile::tempdir().expect("tempdir");
    let raw = raw_sled_baseline(raw_dir.path(), Duration::from_secs(3), 200).expect("baseline");
    println!(
        "{:>9} {:>10} {:>12} {:>12} {:>12} {:>9}",
        "abandoned", "open ms", "recovery ms", "claims/s", "finished ms", "ratio"
    );
    for n in sizes {
        let dir = tempfile::tempdir().expect("tempdir");
        threads.block_on(prepare(dir.path(), n));
        eprintln!("prepared {n} abandoned executions; opening and recovering");
        let started = Instant::now();
        let runtime = Runtime::builder()
            .data_dir(dir.path())
            .open()
            .expect("open runtime");
        let opened = started.elapsed();
        let before = runtime.store().metrics();
        let report = threads.block_on(runtime.recovery()).expect("recovery");
        let recovered = started.elapsed();
        let during = runtime.store().metrics();
        assert_eq!(report.resumed.len(), n, "{report:?}");
        let store = Arc::clone(runtime.store());
        threads.block_on(async {
            while !store
                .executions_in_state(ExecutionState::Running)
                .expect("index")
                .is_empty()
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        let finished = started.elapsed();
        let claims_per_s = n as f64 / report.elapsed.as_secs_f64();
        println!(
            "{:>9} {:>10.0} {:>12.0} {:>12.0} {:>12.0} {:>9.2}",
            n,
            opened.as_secs_f64() * 1e3,
            recovered.as_secs_f64() * 1e3,
            claims_per_s,
            finished.as_secs_f64() * 1e3,
            claims_per_s / raw.per_s()
        );
        println!(
            "{}",
            json!({
                "abandoned": n,
                "open_ms": opened.as_millis() as u64,
                "recovery_ms": recovered.as_millis() as u64,
                "recovery_report_ms": report.elapsed.as_millis() as u64,
                "claims_per_s": claims_per_s.round(),
                "finished_ms": finished.as_millis() as u64,
                // The recovery's commit groups: how many, and the time spent in fsync.
                "recovery_groups": during.groups - before.groups,
                "recovery_fsync_ms": (during.fsync_micros_total - before.fsync_micros_total) / 1000,
                "raw_per_s": raw.per_s().round(),
                "ratio_to_raw": claims_per_s / raw.per_s(),
            })
        );
        runtime.halt();
    }
}

/// Writes `n` executions as an owner that died mid-request leaves them.
async fn prepare(dir: &std::path::Path, n: usize) {
    let store = Store::open(dir).expect("store");
    let tools = openprogram::agent::ToolRegistry::builtin();
    let scripted = openprogram::agent::Scripted;
    let revision = openprogram::actors::env::contract_of(&scripted, &tools).revision;
    let dead_owner = OwnerId::new();
    let session = SessionId::new();
    let input = json!({"message": "hi", "script": [{"reply": "done"}]}).to_string();
    let mut writes = futures::stream::iter((0..n).map(|_| {
        let mut head = ExecutionHead::new(
            ExecutionId::new(),
            session,
            RunId::new(),
            ExecutionKind::AgentTurn,
        );
        head.revision_id = revision;
        head.state = ExecutionState::Running;
        let attempt = AttemptLease {
            attempt_id: AttemptId::new(),
            owner_id: dead_owner,
            epoch: 1,
        };
        head.attempt = Some(attempt);
        let events = vec![
            Event::Admitted {
                kind: head.kind,
                session_id: session,
                run_id: head.run_id,
                parent_execution_id: None,
                revision_id: revision,
                turn_id: head.turn_id,
                user_message_id: head.user_message_id,
                reply_message_id: head.reply_message_id,
                parent_message_id: None,
                input: input.clone(),
            },
            Event::AttemptStarted {
                attempt_id: attempt.attempt_id,
                owner_id: attempt.owner_id,
                epoch: attempt.epoch,
            },
        ];
        store.submit(Transition::create(head, events).by_epoch(1))
    }))
    .buffer_unordered(PREPARE_IN_FLIGHT);
    while let Some(outcome) = writes.next().await {
        let outcome = outcome.expect("prepare");
        assert!(
            matches!(outcome, openprogram::storage::Outcome::Committed(_)),
            "{outcome:?}"
        );
    }
}
