//! `cargo bench --bench storage`: durable transitions per second through the committer for
//! 1, 100 and 1,000 concurrent writers (1 event + head update, 200-byte payload), and in the
//! same run the raw limit of the engine underneath: sled batches of 256 inserts + flush +
//! fsync of the data file. Prints a table, then one JSON line (the last line of stdout).
//!
//! The raw row's latencies are per durable batch of 256. `BENCH_SECONDS` sets how long each
//! writer scenario runs (default 3); `BENCH_WORKERS` the tokio worker threads (default 2).

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use openprogram::storage::{
    EffectId, Event, EventReader, EventStore, ExecutionHead, ExecutionId, ExecutionKind, Outcome,
    RunId, SessionId, Store, Transition,
};
use serde_json::json;

const PAYLOAD_BYTES: usize = 200;

struct Figures {
    per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    transitions: u64,
    fsyncs: u64,
}

/// The `openprogram` binary's allocator (see `src/main.rs`), so that this bench measures what
/// the binary runs.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    let seconds: u64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(
            std::env::var("BENCH_WORKERS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(2),
        )
        .enable_all()
        .build()
        .expect("tokio runtime");
    let raw = raw_baseline(Duration::from_secs(seconds));
    let raw_per_s = raw.per_s;
    let mut rows = Vec::new();
    for writers in [1usize, 100, 1000] {
        let figures = runtime.block_on(writers_scenario(writers, Duration::from_secs(seconds)));
        rows.push((writers, figures));
    }

    println!(
        "{:<14} {:>12} {:>9} {:>9} {:>9} {:>12} {:>10} {:>8}",
        "scenario", "per_s", "p50_ms", "p99_ms", "max_ms", "transitions", "fsyncs", "vs_raw"
    );
    println!(
        "{:<14} {:>12.0} {:>9.3} {:>9.3} {:>9.3} {:>12} {:>10} {:>8}",
        "raw sled",
        raw.per_s,
        raw.p50_ms,
        raw.p99_ms,
        raw.max_ms,
        raw.transitions,
        raw.fsyncs,
        "1.00"
    );
    for (writers, f) in &rows {
        println!(
            "{:<14} {:>12.0} {:>9.3} {:>9.3} {:>9.3} {:>12} {:>10} {:>8.2}",
            format!("writers_{writers}"),
            f.per_s,
            f.p50_ms,
            f.p99_ms,
            f.max_ms,
            f.transitions,
            f.fsyncs,
            f.per_s / raw_per_s
        );
    }
    let mut summary = serde_json::Map::new();
    for (writers, f) in &rows {
        summary.insert(
            format!("writers_{writers}"),
            json!({"per_s": f.per_s.round(), "p50_ms": f.p50_ms, "p99_ms": f.p99_ms, "max_ms": f.max_ms, "ratio_to_raw": f.per_s / raw_per_s}),
        );
    }
    summary.insert("raw_per_s".into(), json!(raw_per_s.round()));
    summary.insert(
        "raw_batch".into(),
        json!({"p50_ms": raw.p50_ms, "p99_ms": raw.p99_ms, "max_ms": raw.max_ms}),
    );
    println!("{}", serde_json::Value::Object(summary));
}

/// The storage limit: what sled does with the same durable writes and no runtime around it,
/// for as long as a writer scenario runs. Latencies are per durable batch of 256.
fn raw_baseline(duration: Duration) -> Figures {
    let dir = tempfile::tempdir().expect("tempdir");
    let raw =
        openprogram::storage::baseline::raw_sled_baseline(dir.path(), duration, PAYLOAD_BYTES)
            .expect("raw baseline");
    let mut latencies = Histogram::<u64>::new(3).expect("histogram");
    for micros in &raw.batch_latencies_us {
        latencies.record(*micros).expect("in range");
    }
    Figures {
        per_s: raw.per_s(),
        p50_ms: latencies.value_at_quantile(0.50) as f64 / 1000.0,
        p99_ms: latencies.value_at_quantile(0.99) as f64 / 1000.0,
        max_ms: latencies.max() as f64 / 1000.0,
        transitions: raw.records,
        fsyncs: raw.batches,
    }
}

async fn writers_scenario(writers: usize, duration: Duration) -> Figures {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open store");
    let deadline = Instant::now() + duration;
    let tasks: Vec<_> = (0..writers)
        .map(|_| tokio::spawn(writer(store.clone(), deadline)))
        .collect();
    let started = Instant::now();
    let mut histogram = Histogram::<u64>::new(3).expect("histogram");
    let mut transitions = 0u64;
    for task in tasks {
        let (count, latencies) = task.await.expect("writer");
        transitions += count;
        histogram.add(latencies).expect("same bounds");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let fsyncs = store.metrics().fsyncs;
    drop(store);
    Figures {
        per_s: transitions as f64 / elapsed,
        p50_ms: histogram.value_at_quantile(0.50) as f64 / 1000.0,
        p99_ms: histogram.value_at_quantile(0.99) as f64 / 1000.0,
        max_ms: histogram.max() as f64 / 1000.0,
        transitions,
        fsyncs,
    }
}

/// One writer: creates its execution, then commits one transition after another until the
/// deadline. Returns the count and the latencies in microseconds.
async fn writer(store: Store, deadline: Instant) -> (u64, Histogram<u64>) {
    let mut histogram = Histogram::<u64>::new(3).expect("histogram");
    let execution_id = ExecutionId::new();
    let head = ExecutionHead::new(
        execution_id,
        SessionId::new(),
        RunId::new(),
        ExecutionKind::Job,
    );
    let payload = "p".repeat(PAYLOAD_BYTES);
    let mut transition = Transition::create(head, vec![event(&payload)]);
    let mut count = 0u64;
    loop {
        let started = Instant::now();
        let outcome = store.submit(transition).await.expect("submit");
        histogram
            .record(started.elapsed().as_micros() as u64)
            .expect("in range");
        let Outcome::Committed(committed) = outcome else {
            panic!("a single writer per execution cannot conflict: {outcome:?}");
        };
        count += 1;
        if Instant::now() >= deadline {
            return (count, histogram);
        }
        transition =
            Transition::new(execution_id, vec![event(&payload)]).expect_version(committed.version);
    }
}

fn event(payload: &str) -> Event {
    Event::ModelDecided {
        effect_id: EffectId::new(),
        decision: payload.to_owned(),
    }
}
