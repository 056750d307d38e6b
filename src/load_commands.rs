//! `openprogram load --commands-per-s`: while the load runs, Pause/Continue pairs to
//! random running executions, each command timed from its call to its answer; applied and
//! rejected commands apart (a command that reaches an execution just finished is rejected,
//! after activating it to answer).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use openprogram_storage::{ExecutionId, SessionId};

use crate::load_report::{histogram, lock, ms, panicked, LoadReport};
use crate::{Command, CommandBody, Result, Runtime};

/// Executions admitted and not yet ended, each in its own session: where commands aim.
pub(crate) type Running = Arc<Mutex<Vec<(SessionId, ExecutionId)>>>;

/// How many times a Continue is retried while its execution is still paused.
const CONTINUE_ATTEMPTS_MAX: usize = 5;

/// Command latencies (µs), applied and rejected apart.
pub(crate) struct CommandLatencies {
    applied: Histogram<u64>,
    rejected: Histogram<u64>,
}

/// Sends Pause/Continue pairs to random running executions until `done`, each pair in its
/// own task so slow commands do not lower the rate; returns the latencies (µs) of the applied
/// and of the rejected commands.
pub(crate) async fn send(
    runtime: Runtime,
    running: Running,
    per_s: f64,
    done: Arc<AtomicBool>,
) -> Result<CommandLatencies> {
    let interval = Duration::from_secs_f64(1.0 / per_s.max(0.001));
    // xorshift64 picks the targets; which ones does not change what is measured.
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut pairs = Vec::new();
    // One pair at a time per execution: overlapping pairs could leave it paused.
    let commanded: Arc<Mutex<HashSet<ExecutionId>>> = Arc::default();
    while !done.load(Ordering::Acquire) {
        tokio::time::sleep(interval).await;
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let (session, target) = {
            let running = lock(&running);
            match running.len() {
                0 => continue,
                len => running[(state % len as u64) as usize],
            }
        };
        if !lock(&commanded).insert(target) {
            continue;
        }
        let (runtime, commanded) = (runtime.clone(), commanded.clone());
        pairs.push(tokio::spawn(async move {
            let pair = pause_then_continue(runtime, session, target).await;
            lock(&commanded).remove(&target);
            pair
        }));
    }
    let mut latencies = CommandLatencies {
        applied: histogram(),
        rejected: histogram(),
    };
    for pair in pairs {
        let pair = pair.await.map_err(panicked("a command task"))??;
        for (micros, applied) in pair {
            match applied {
                true => latencies.applied.saturating_record(micros),
                false => latencies.rejected.saturating_record(micros),
            }
        }
    }
    Ok(latencies)
}

/// Pauses an execution and continues it again (a paused execution would never finish);
/// returns each command's latency (µs) and whether it was applied.
async fn pause_then_continue(
    runtime: Runtime,
    session: SessionId,
    target: ExecutionId,
) -> Result<Vec<(u64, bool)>> {
    let mut timings = Vec::new();
    let mut timed = async |body: CommandBody| -> Result<bool> {
        let sent_at = Instant::now();
        let reply = runtime.command(session, target, Command::new(body)).await?;
        let applied = reply.status == "applied";
        timings.push((sent_at.elapsed().as_micros() as u64, applied));
        Ok(applied)
    };
    if !timed(CommandBody::Pause).await? {
        return Ok(timings);
    }
    for _ in 0..CONTINUE_ATTEMPTS_MAX {
        let continued = CommandBody::Continue {
            policy: None,
            budget: None,
        };
        if timed(continued).await?
            || runtime
                .store()
                .head(target)?
                .map(|head| head.state.is_terminal())
                .unwrap_or(true)
        {
            break;
        }
    }
    Ok(timings)
}

/// The commands sent and rejected, and their latencies' percentiles, if the sender ran.
pub(crate) fn into_report(
    latencies: Option<CommandLatencies>,
    mut report: LoadReport,
) -> LoadReport {
    let Some(latencies) = latencies else {
        return report;
    };
    report.commands = Some(latencies.applied.len() + latencies.rejected.len());
    report.commands_rejected = Some(latencies.rejected.len());
    if !latencies.applied.is_empty() {
        report.command_p50_ms = Some(ms(&latencies.applied, 0.50));
        report.command_p99_ms = Some(ms(&latencies.applied, 0.99));
    }
    if !latencies.rejected.is_empty() {
        report.rejected_p99_ms = Some(ms(&latencies.rejected, 0.99));
    }
    report
}
