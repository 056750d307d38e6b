//! The raw storage limit, measured the way the committer writes: sled batches of 256
//! inserts, `flush()`, then an fsync of sled's data file. Benchmarks and `openprogram load`
//! report their throughput as a ratio of this, measured in the same run.

use std::fs::File;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::store::SEGMENT_BYTES;

/// Inserts per raw batch.
pub const RAW_BATCH_LEN: usize = 256;

/// What the raw baseline measured.
#[derive(Debug, Clone)]
pub struct RawBaseline {
    pub records: u64,
    pub batches: u64,
    pub elapsed: Duration,
    /// The time of each durable batch (apply + flush + fsync), in microseconds.
    pub batch_latencies_us: Vec<u64>,
}

impl RawBaseline {
    pub fn per_s(&self) -> f64 {
        self.records as f64 / self.elapsed.as_secs_f64().max(f64::EPSILON)
    }
}

/// Writes `payload_bytes`-byte records into a fresh sled database in `dir` for `duration`.
pub fn raw_sled_baseline(
    dir: &Path,
    duration: Duration,
    payload_bytes: usize,
) -> Result<RawBaseline> {
    let io_error = |error| Error::io(dir, error);
    let db = sled::Config::new()
        .path(dir)
        .segment_size(SEGMENT_BYTES)
        .flush_every_ms(None)
        .open()?;
    let data_file = File::open(dir.join("db")).map_err(io_error)?;
    let value = vec![0x61u8; payload_bytes];
    let started = Instant::now();
    let mut records = 0u64;
    let mut batch_latencies_us = Vec::new();
    while started.elapsed() < duration {
        let batch_started = Instant::now();
        let mut batch = sled::Batch::default();
        for _ in 0..RAW_BATCH_LEN {
            batch.insert(&records.to_be_bytes()[..], &value[..]);
            records += 1;
        }
        db.apply_batch(batch)?;
        db.flush()?;
        data_file.sync_data().map_err(io_error)?;
        batch_latencies_us.push(batch_started.elapsed().as_micros() as u64);
    }
    Ok(RawBaseline {
        records,
        batches: batch_latencies_us.len() as u64,
        elapsed: started.elapsed(),
        batch_latencies_us,
    })
}
