//! `cargo bench --bench parked`: memory per parked execution. Admits N agent turns
//! paused, steps each once (activating its actor, which runs one model decision, pauses and
//! releases itself), and reports the growth of the process's resident memory per parked
//! execution once no actor is live. Prints a table, then one JSON line.
//!
//! `PARKED_N` sets N (default 100,000); `PARKED_CONCURRENCY` the admissions in flight
//! (default 256).

use std::time::{Duration, Instant};

use openprogram::storage::{CommandId, SessionId};
use openprogram::{CommandRequest, Runtime, StartRequest};
use serde_json::json;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// Resident memory of this process, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn main() {
    let n = env_usize("PARKED_N", 100_000);
    let concurrency = env_usize("PARKED_CONCURRENCY", 256).max(1);
    let runtime_threads = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .open()
        .expect("open runtime");
    let session = SessionId::new();
    let rss_before_kib = rss_kib();
    let started = Instant::now();
    runtime_threads.block_on(async {
        let mut admitted = 0;
        while admitted < n {
            let batch = concurrency.min(n - admitted);
            let parks = (0..batch).map(|_| park_one(&runtime, session));
            futures::future::join_all(parks).await;
            admitted += batch;
            eprint!("\rparked {admitted}/{n}");
        }
        eprintln!();
        while runtime.live_executions() > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    let elapsed = started.elapsed();
    let rss_after_kib = rss_kib();
    let per_execution_bytes =
        (rss_after_kib.saturating_sub(rss_before_kib) * 1024) as f64 / n as f64;
    println!("{:<28} {:>14}", "parked executions", n);
    println!("{:<28} {:>14.1}", "seconds to park", elapsed.as_secs_f64());
    println!("{:<28} {:>14}", "rss before (KiB)", rss_before_kib);
    println!("{:<28} {:>14}", "rss after (KiB)", rss_after_kib);
    println!(
        "{:<28} {:>14.0}",
        "rss per parked (bytes)", per_execution_bytes
    );
    println!(
        "{}",
        json!({
            "parked": n,
            "seconds": elapsed.as_secs_f64(),
            "rss_before_kib": rss_before_kib,
            "rss_after_kib": rss_after_kib,
            "rss_per_parked_bytes": per_execution_bytes.round(),
            "live_actors": runtime.live_executions(),
        })
    );
    runtime.shutdown();
}

/// Admits one turn paused and steps it once; the step's actor parks itself afterwards.
async fn park_one(runtime: &Runtime, session: SessionId) {
    let request = StartRequest {
        message: "park".into(),
        script: vec![
            json!({"tool": "echo", "args": {"text": "x"}}),
            json!({"reply": "done"}),
        ],
        start_paused: true,
        ..Default::default()
    };
    let started = runtime
        .start_execution(session, request)
        .await
        .expect("start");
    let step = CommandRequest {
        command_id: CommandId::new(),
        kind: "step".into(),
        expected_version: None,
        text: None,
    };
    let reply = runtime
        .command(session, started.execution_id, step)
        .await
        .expect("step");
    assert_eq!(reply.status, "applied", "{reply:?}");
}
