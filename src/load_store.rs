//! S-8: `load --retain-finished`: the store's size on disk, sampled while the load runs
//! (`--sample-store-every`, 10 s by default), with the runtime purging what ended.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openprogram_storage::EventReader;

/// Samples `store.disk_bytes()` now and every `every` until `done`, then once more; each
/// sample is (seconds since the start, bytes), also printed to stderr when `print`.
pub fn sample(
    store: Arc<dyn EventReader>,
    every: Duration,
    done: Arc<AtomicBool>,
    print: bool,
) -> tokio::task::JoinHandle<Vec<(f64, u64)>> {
    tokio::spawn(async move {
        let started = Instant::now();
        let mut samples = Vec::new();
        let mut next = started;
        loop {
            let finished = done.load(Ordering::Acquire);
            if finished || Instant::now() >= next {
                let bytes = store.disk_bytes();
                let at = started.elapsed().as_secs_f64();
                if print {
                    eprintln!("store: {:.1} MiB at {at:.0} s", bytes as f64 / 1048576.0);
                }
                samples.push((at, bytes));
                next += every;
            }
            if finished {
                return samples;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}
