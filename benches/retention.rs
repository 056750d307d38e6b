//! `cargo bench --bench retention` (S-8, issue 33): what purging gives back, and what a busy
//! session's Activity costs.
//! - `SESSIONS` sessions (default 10) of `EXECUTIONS` executions each (default 10,000), each
//!   `STEPS` `echo` steps (default 5), all completed; the store's bytes on disk.
//! - 90% of them purged (every session but the first, `Runtime::purge_session`), the log swept
//!   until a whole pass removes nothing: the bytes on disk again (sled reuses the space, but
//!   does not shrink its file), then `openprogram compact`'s copy into a new directory: its
//!   bytes, against the bytes before the purge.
//! - The Activity of the kept session (`EXECUTIONS` executions), p50 of 5 reads, and of a
//!   session of 10 executions, on the reopened compacted store.
//!
//! Prints one JSON line. Nothing is asserted: it measures.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use openprogram::storage::SessionId;
use openprogram::{Runtime, StartRequest};
use serde_json::json;

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1048576.0
}

fn request(steps: usize) -> StartRequest {
    let mut script: Vec<serde_json::Value> = (0..steps)
        .map(|step| json!({"tool": "echo", "args": {"text": format!("{step:0>200}")}}))
        .collect();
    script.push(json!({"reply": "done"}));
    StartRequest {
        message: "m".into(),
        script: serde_json::from_value(json!(script)).expect("script"),
        max_iterations: Some(steps as u32 + 2),
        ..Default::default()
    }
}

async fn activity_p50(runtime: &Runtime, session: SessionId) -> f64 {
    let mut times = Vec::new();
    for _ in 0..5 {
        let at = Instant::now();
        runtime.activity(session).expect("activity");
        times.push(at.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    times[2]
}

fn main() {
    let sessions = env_usize("SESSIONS", 10);
    let executions = env_usize("EXECUTIONS", 10_000);
    let steps = env_usize("STEPS", 5);
    let dir = tempfile::tempdir().expect("tempdir");
    let (data, compacted) = (dir.path().join("data"), dir.path().join("compacted"));
    let threads = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio");
    let line = threads.block_on(async {
        let runtime = Runtime::builder().data_dir(&data).open().expect("open");
        let ids: Vec<SessionId> = (0..sessions).map(|_| SessionId::new()).collect();
        let small = SessionId::new();
        let started = Instant::now();
        for session in ids.iter().chain([&small]) {
            let count = if *session == small { 10 } else { executions };
            let mut running = Vec::new();
            for _ in 0..count {
                let reply = runtime
                    .start_execution(*session, request(steps))
                    .await
                    .expect("start");
                running.push(reply.execution_id);
                if running.len() >= 500 {
                    for id in running.drain(..) {
                        runtime.wait_finished(*session, id).await.expect("finished");
                    }
                }
            }
            for id in running {
                runtime.wait_finished(*session, id).await.expect("finished");
            }
        }
        let built_s = started.elapsed().as_secs_f64();
        let activity_full_ms = activity_p50(&runtime, ids[0]).await;
        let activity_small_ms = activity_p50(&runtime, small).await;
        // Everything written to its own keys: the size before any purge.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = runtime.store().disk_bytes();
        let started = Instant::now();
        for session in &ids[1..] {
            runtime.purge_session(*session).await.expect("purge");
        }
        let purge_s = started.elapsed().as_secs_f64();
        // The background sweep: until a whole pass removed nothing more.
        let stats = runtime.retention_stats();
        let mut last = u64::MAX;
        loop {
            let rounds = stats.rounds.load(Ordering::Relaxed);
            let deleted = stats.log_records_deleted.load(Ordering::Relaxed);
            while stats.rounds.load(Ordering::Relaxed) < rounds + 3 {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            if deleted == last {
                break;
            }
            last = deleted;
        }
        let swept_s = started.elapsed().as_secs_f64();
        let after_purge = runtime.store().disk_bytes();
        runtime.shutdown().await;
        drop(runtime);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let report =
            openprogram::storage::compact::compact(&data, &compacted, |_| {}).expect("compact");
        let runtime = Runtime::builder()
            .data_dir(&compacted)
            .open()
            .expect("reopen");
        let activity_compacted_ms = activity_p50(&runtime, ids[0]).await;
        runtime.shutdown().await;
        json!({
            "sessions": sessions,
            "executions_per_session": executions,
            "steps": steps,
            "build_s": built_s,
            "mib_before": mib(before),
            "purged_fraction": (sessions - 1) as f64 / sessions as f64,
            "purge_s": purge_s,
            "swept_s": swept_s,
            "log_records_swept": last,
            "mib_after_purge": mib(after_purge),
            "mib_compacted": mib(report.bytes_after),
            "compacted_ratio": report.bytes_after as f64 / before as f64,
            "activity_ms_p50": activity_full_ms,
            "activity_10_ms_p50": activity_small_ms,
            "activity_compacted_ms_p50": activity_compacted_ms,
        })
    });
    println!("{line}");
}
