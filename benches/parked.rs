//! `cargo bench --bench parked`: memory per parked execution. Parks N agent turns
//! (admitted paused, stepped once: the actor runs one model decision, pauses and releases
//! itself) with `openprogram::load::park`, and reports the growth of resident memory per
//! parked execution once no actor is live. Prints a table, then one JSON line.
//! (`openprogram load --park N` measures the same after a load.)
//!
//! `PARKED_N` sets N (default 100,000); `PARKED_CONCURRENCY` the admissions in flight
//! (default 256).

use std::time::Instant;

use openprogram::load::park;
use openprogram::process_stats::rss_kib;
use openprogram::Runtime;
use serde_json::json;

/// The `openprogram` binary's allocator (see `src/main.rs`), so that this bench measures what
/// the binary runs.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let n = env_usize("PARKED_N", 100_000);
    let concurrency = env_usize("PARKED_CONCURRENCY", 256).max(1);
    let threads = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .open()
        .expect("open runtime");
    let rss_before_kib = rss_kib();
    let started = Instant::now();
    threads
        .block_on(park(&runtime, n, concurrency))
        .expect("park");
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
    runtime.halt();
}
