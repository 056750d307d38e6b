//! What `load` measures of its store: the size on disk, sampled while the load runs (S-8,
//! `--retain-finished`, `--sample-store-every`, 10 s by default) with what retention purged and
//! swept by then; and the raw store's rate (`--baseline`), the ceiling a run compares with.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::load_report::{panicked, LoadOptions, StoreSample};
use crate::{Error, Result, Runtime};

/// Samples now and every `every` until `done`, then once more; each also printed to
/// stderr when `print`.
pub fn sample(
    runtime: Runtime,
    every: Duration,
    done: Arc<AtomicBool>,
    print: bool,
) -> tokio::task::JoinHandle<Vec<StoreSample>> {
    tokio::spawn(async move {
        let started = Instant::now();
        let mut samples = Vec::new();
        let mut next = started;
        loop {
            let finished = done.load(Ordering::Acquire);
            if finished || Instant::now() >= next {
                let stats = runtime.retention_stats();
                let sample = StoreSample {
                    at_s: started.elapsed().as_secs_f64(),
                    bytes: runtime.store().disk_bytes(),
                    purged: stats.executions_purged.load(Ordering::Relaxed),
                    swept: stats.log_records_deleted.load(Ordering::Relaxed),
                    examined: stats.log_records_examined.load(Ordering::Relaxed),
                };
                if print {
                    eprintln!(
                        "store: {:.1} MiB at {:.0} s ({} purged, {} of {} log records examined swept)",
                        sample.bytes as f64 / 1048576.0,
                        sample.at_s,
                        sample.purged,
                        sample.swept,
                        sample.examined
                    );
                }
                samples.push(sample);
                next += every;
            }
            if finished {
                return samples;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// The sampler a load's options ask for (`--sample-store-every`, or every 10 s with
/// `--retain-finished`), started now.
pub fn start(
    options: &LoadOptions,
    runtime: &Runtime,
    done: &Arc<AtomicBool>,
) -> Option<tokio::task::JoinHandle<Vec<StoreSample>>> {
    let every = options
        .sample_store_every
        .or(options.retain_finished.map(|_| Duration::from_secs(10)))?;
    Some(sample(runtime.clone(), every, done.clone(), !options.json))
}

/// The samples (once `done` is set) and, with retention, the executions it purged.
pub async fn finish(
    sampler: Option<tokio::task::JoinHandle<Vec<StoreSample>>>,
    options: &LoadOptions,
    runtime: &Runtime,
) -> Result<(Vec<StoreSample>, Option<u64>)> {
    let samples = match sampler {
        Some(sampler) => sampler.await.map_err(panicked("the store sampler"))?,
        None => Vec::new(),
    };
    let purged = options.retain_finished.map(|_| {
        runtime
            .retention_stats()
            .executions_purged
            .load(Ordering::Relaxed)
    });
    Ok((samples, purged))
}

/// S-9, with retention: how many executions ended longer ago than the retention period and
/// one retention round, and are not purged yet.
pub fn retention_backlog(options: &LoadOptions, runtime: &Runtime) -> Result<Option<u64>> {
    let Some(retain) = options.retain_finished else {
        return Ok(None);
    };
    let slack = retain + openprogram_actors::retention::ROUND_EVERY;
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64);
    let cutoff = now_ms.saturating_sub(slack.as_millis() as u64);
    let (mut count, mut after) = (0, None);
    loop {
        let page = runtime.store().ended_before(cutoff, after, 10_000)?;
        count += page.len() as u64;
        match page.last() {
            Some(last) => after = Some(*last),
            None => return Ok(Some(count)),
        }
    }
}

/// S-9, `--drain`: what `compact` keeps of the closed store in `data_dir`; then the store
/// reopened (`open`) for the drain period while retention purges what the load left,
/// sampled, and what `compact` keeps after. `None`s without `--drain`.
pub async fn drain(
    options: &LoadOptions,
    data_dir: &std::path::Path,
    open: impl Fn() -> Result<Runtime>,
) -> Result<(Option<u64>, Vec<StoreSample>, Option<u64>)> {
    let Some(period) = options.drain else {
        return Ok((None, Vec::new(), None));
    };
    let at_end = compacted_bytes(data_dir)?;
    let runtime = open()?;
    let done = Arc::new(AtomicBool::new(false));
    let every = options.sample_store_every.unwrap_or(Duration::from_secs(10));
    let sampler = sample(runtime.clone(), every, done.clone(), !options.json);
    tokio::time::sleep(period).await;
    done.store(true, Ordering::Release);
    let samples = sampler.await.map_err(panicked("the store sampler"))?;
    runtime.shutdown().await;
    drop(runtime);
    Ok((Some(at_end), samples, Some(compacted_bytes(data_dir)?)))
}

/// The bytes `compact` keeps of the closed store in `data_dir` (a copy beside it, removed).
fn compacted_bytes(data_dir: &std::path::Path) -> Result<u64> {
    let parent = data_dir.parent().unwrap_or(data_dir);
    let unavailable = |error: std::io::Error| Error::Unavailable(error.to_string());
    let copy = tempfile::tempdir_in(parent).map_err(unavailable)?;
    let into = copy.path().join("compacted");
    let report = openprogram_storage::compact::compact(data_dir, &into, |_| {})?;
    Ok(report.bytes_after)
}

/// The raw store, for `duration`: records per second. Sled in this process, or the same
/// PostgreSQL database the load wrote.
pub(crate) fn raw_baseline(options: &LoadOptions, duration: Duration) -> Result<f64> {
    let payload_bytes = options.payload_bytes.max(1);
    if let Some(url) = options.postgres() {
        let raw =
            openprogram_storage::pg::baseline::raw_postgres_baseline(url, duration, payload_bytes)?;
        return Ok(raw.per_s());
    }
    let dir = tempfile::tempdir().map_err(|error| Error::Unavailable(error.to_string()))?;
    let raw =
        openprogram_storage::baseline::raw_sled_baseline(dir.path(), duration, payload_bytes)?;
    Ok(raw.per_s())
}
