//! The raw limit of a PostgreSQL database, measured the way the committer writes (N-1): one
//! transaction per batch of `RAW_BATCH_LEN` rows shaped like `op_events`' (an execution id,
//! a sequence number, a position and the payload), inserted with one `UNNEST` statement and
//! committed (the server's WAL flush). `openprogram load --store postgres://… --baseline`
//! reports its steps per second as a ratio of this, measured in the same run.
//!
//! The rows go to a table of their own (`op_baseline_raw`), created for the measurement and
//! dropped after it: the event log's tables are never touched.

use std::time::{Duration, Instant};

use uuid::Uuid;

use super::{connect, database};
use crate::baseline::{RawBaseline, RAW_BATCH_LEN};
use crate::error::{Error, Result};

/// Inserts `payload_bytes`-byte rows into the database at `url` for `duration`.
pub fn raw_postgres_baseline(
    url: &str,
    duration: Duration,
    payload_bytes: usize,
) -> Result<RawBaseline> {
    let url = url.to_owned();
    // The blocking client refuses to run on a runtime thread: a thread of its own.
    std::thread::Builder::new()
        .name("openprogram-pg-baseline".into())
        .spawn(move || measure(&url, duration, payload_bytes))
        .map_err(|error| Error::Database(format!("starting the baseline: {error}")))?
        .join()
        .map_err(|_| Error::Database("the baseline thread panicked".into()))?
}

fn measure(url: &str, duration: Duration, payload_bytes: usize) -> Result<RawBaseline> {
    let mut client = connect(url)?;
    client
        .batch_execute(
            "DROP TABLE IF EXISTS op_baseline_raw;
             CREATE TABLE op_baseline_raw (
                 execution_id uuid NOT NULL,
                 seq bigint NOT NULL,
                 position bigint NOT NULL UNIQUE,
                 envelope bytea NOT NULL,
                 PRIMARY KEY (execution_id, seq))",
        )
        .map_err(database)?;
    let value = vec![0x61u8; payload_bytes];
    let execution = Uuid::now_v7();
    let started = Instant::now();
    let mut records = 0i64;
    let mut batch_latencies_us = Vec::new();
    while started.elapsed() < duration {
        let batch_started = Instant::now();
        let ids = vec![execution; RAW_BATCH_LEN];
        let seqs: Vec<i64> = (records..records + RAW_BATCH_LEN as i64).collect();
        let payloads = vec![value.as_slice(); RAW_BATCH_LEN];
        let mut transaction = client.transaction().map_err(database)?;
        transaction
            .execute(
                "INSERT INTO op_baseline_raw (execution_id, seq, position, envelope)
                 SELECT * FROM UNNEST($1::uuid[], $2::int8[], $2::int8[], $3::bytea[])",
                &[&ids, &seqs, &payloads],
            )
            .map_err(database)?;
        transaction.commit().map_err(database)?;
        records += RAW_BATCH_LEN as i64;
        batch_latencies_us.push(batch_started.elapsed().as_micros() as u64);
    }
    let elapsed = started.elapsed();
    client
        .batch_execute("DROP TABLE op_baseline_raw")
        .map_err(database)?;
    Ok(RawBaseline {
        records: records as u64,
        batches: batch_latencies_us.len() as u64,
        elapsed,
        batch_latencies_us,
    })
}
