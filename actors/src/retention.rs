//! S-8: retention, in the background. The `Retention` actor, every `ROUND_EVERY`: finishes
//! purges a crash left half done, purges executions that ended longer than `retain_finished`
//! ago (when the runtime has such a policy), and sweeps a stretch of the log for records
//! only purged executions used. Every write is a bounded step of the committer
//! (`EventStore::purge`, `sweep_log`), so no group commit waits on a whole history; a round
//! that finds executions not yet written to their own keys leaves them for the next.
//!
//! `purge_session` is the same purge, asked for by a person (`DELETE /v1/sessions/{sid}`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use openprogram_storage::{EventStore, ExecutionId, PurgeStep};

use crate::error::{Error, Result};
use crate::recovery::Clock;

/// How often a round runs.
pub const ROUND_EVERY: Duration = Duration::from_secs(1);
/// Executions one round purges at most (the rest wait for the next round).
const ROUND_PURGES_MAX: usize = 8192;
/// Purges sent to the committer together (one group commit for all of their steps).
const PURGES_TOGETHER: usize = 256;
/// Log records one sweep step examines.
const SWEEP_STEP_RECORDS: usize = 256;
/// Log records one round examines at most...
const ROUND_SWEEP_RECORDS: usize = 65_536;
/// ...and the time it spends on them: each step is a group commit, and a round that swept
/// for seconds would leave the purges of the next waiting behind the load.
const ROUND_SWEEP_TIME: Duration = Duration::from_millis(250);

/// What retention did since the runtime opened (for `/metrics`).
#[derive(Debug, Default)]
pub struct RetentionStats {
    pub executions_purged: AtomicU64,
    pub log_records_deleted: AtomicU64,
    pub log_bytes_deleted: AtomicU64,
    pub log_records_examined: AtomicU64,
    pub rounds: AtomicU64,
}

/// Purges `execution_id` to the end: its last step, never `More`. `Unsettled`: its latest
/// transitions are still in memory, nothing done; try later.
pub async fn purge_fully(
    store: &dyn EventStore,
    execution_id: ExecutionId,
    ended_key: Option<u64>,
    ended_before: Option<u64>,
) -> Result<PurgeStep> {
    loop {
        match store.purge(execution_id, ended_key, ended_before).await? {
            PurgeStep::More => continue,
            last => return Ok(last),
        }
    }
}

pub struct Retention {
    store: Arc<dyn EventStore>,
    clock: Arc<dyn Clock>,
    retain_finished: Option<Duration>,
    stats: Arc<RetentionStats>,
    /// Where the next sweep step starts.
    sweep_from: u64,
    /// A round is running (rounds never overlap).
    busy: bool,
    /// The first round finishes purges a crash left half done.
    resumed: bool,
}

impl std::fmt::Debug for Retention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Retention")
            .field("retain_finished", &self.retain_finished)
            .field("sweep_from", &self.sweep_from)
            .finish()
    }
}

impl Retention {
    pub fn new(
        store: Arc<dyn EventStore>,
        clock: Arc<dyn Clock>,
        retain_finished: Option<Duration>,
        stats: Arc<RetentionStats>,
    ) -> Self {
        Self {
            store,
            clock,
            retain_finished,
            stats,
            sweep_from: 0,
            busy: false,
            resumed: false,
        }
    }

    fn round(&mut self, ctx: &mut Context<Self>) {
        if self.busy {
            return;
        }
        self.busy = true;
        let store = Arc::clone(&self.store);
        let stats = Arc::clone(&self.stats);
        let resume = !self.resumed;
        let cutoff = self.retain_finished.map(|retain| {
            self.clock
                .now_ms()
                .saturating_sub(u64::try_from(retain.as_millis()).unwrap_or(u64::MAX))
        });
        let sweep_from = self.sweep_from;
        let round = async move {
            // Until every purge a crash left half done has finished (one not settled yet,
            // or that failed, is tried again next round).
            let mut resumed = true;
            if resume {
                for execution_id in store.purges_unfinished()? {
                    match purge_fully(store.as_ref(), execution_id, None, None).await {
                        Ok(PurgeStep::Unsettled) => resumed = false,
                        Ok(_) => {}
                        Err(error) => {
                            resumed = false;
                            tracing::warn!(%execution_id, %error, "an unfinished purge failed");
                        }
                    }
                }
            }
            if let Some(cutoff) = cutoff {
                if let Err(error) = purge_ended(store.as_ref(), cutoff, &stats).await {
                    tracing::warn!(%error, "retention's purges stopped for this round");
                }
            }
            sweep(store.as_ref(), sweep_from, &stats)
                .await
                .map(|next| (resumed, next))
        };
        ctx.spawn(fut::wrap_future::<_, Self>(round).map(|swept, act, _ctx| {
            act.busy = false;
            act.stats.rounds.fetch_add(1, Ordering::Relaxed);
            match swept {
                Ok((resumed, next)) => {
                    act.resumed = resumed;
                    act.sweep_from = next;
                }
                Err(error) => tracing::warn!(%error, "a retention round failed; retrying"),
            }
        }));
    }
}

/// Purges what ended before `cutoff`, oldest first, up to `ROUND_PURGES_MAX`. An
/// execution a purge could not read is logged and passed over (the others go on); a child
/// whose parent still runs (F-6: the parent reads its result) waits for a later round.
async fn purge_ended(store: &dyn EventStore, cutoff: u64, stats: &RetentionStats) -> Result<()> {
    let (mut done, mut after) = (0, None);
    while done < ROUND_PURGES_MAX {
        let ended = store.ended_before(cutoff, after, PURGES_TOGETHER)?;
        let Some(last) = ended.last() else {
            return Ok(());
        };
        after = Some(*last);
        let purgeable: Vec<(u64, ExecutionId)> = ended
            .into_iter()
            .filter(|(_, execution_id)| !parent_runs(store, *execution_id))
            .collect();
        // Together: their steps share group commits.
        let purges = purgeable
            .iter()
            .map(|(at, execution_id)| purge_fully(store, *execution_id, Some(*at), Some(cutoff)));
        let mut settled = true;
        for (purged, (_, execution_id)) in futures::future::join_all(purges)
            .await
            .into_iter()
            .zip(&purgeable)
        {
            match purged {
                Ok(PurgeStep::Unsettled) => settled = false,
                Ok(_) => {
                    stats.executions_purged.fetch_add(1, Ordering::Relaxed);
                    done += 1;
                }
                Err(error) => {
                    tracing::warn!(%execution_id, %error, "not purged; passed over");
                }
            }
        }
        if !settled {
            // Some are not written to their own keys yet: the next round.
            return Ok(());
        }
    }
    Ok(())
}

/// Whether the execution's parent (a caller, or a fork's original) has not ended.
fn parent_runs(store: &dyn EventStore, execution_id: ExecutionId) -> bool {
    let parent = match store.head(execution_id) {
        Ok(Some(head)) => head.parent_execution_id,
        _ => None,
    };
    parent.is_some_and(
        |parent| matches!(store.head(parent), Ok(Some(head)) if !head.state.is_terminal()),
    )
}

/// Sweeps up to `ROUND_SWEEP_RECORDS` log records from `from`, for `ROUND_SWEEP_TIME` at
/// most; returns where the next round goes on (0: from the start again, the end was
/// reached). Every record is examined once a pass: a kept session's old records do not hide
/// newer ones a purge freed.
async fn sweep(store: &dyn EventStore, mut from: u64, stats: &RetentionStats) -> Result<u64> {
    let (mut examined, started) = (0, std::time::Instant::now());
    while examined < ROUND_SWEEP_RECORDS && started.elapsed() < ROUND_SWEEP_TIME {
        let step = store.sweep_log(from, SWEEP_STEP_RECORDS).await?;
        examined += step.records_examined;
        stats
            .log_records_examined
            .fetch_add(step.records_examined as u64, Ordering::Relaxed);
        stats
            .log_records_deleted
            .fetch_add(step.records_deleted as u64, Ordering::Relaxed);
        stats
            .log_bytes_deleted
            .fetch_add(step.bytes_deleted, Ordering::Relaxed);
        match step.next_position {
            Some(next) => from = next,
            None => return Ok(0),
        }
    }
    Ok(from)
}

impl Actor for Retention {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.round(ctx);
        ctx.run_interval(ROUND_EVERY, |act, ctx| act.round(ctx));
    }
}

/// S-8: purges every execution of a session, once all of them ended (`active_executions`
/// otherwise, nothing purged). Waits for executions not yet written to their own keys, up
/// to `settle`. Returns how many it purged.
pub async fn purge_session(
    store: &dyn EventStore,
    executions: Vec<ExecutionId>,
    settle: Duration,
) -> Result<usize> {
    let mut active = 0;
    for execution_id in &executions {
        if let Some(head) = store.head(*execution_id)? {
            active += usize::from(!head.state.is_terminal());
        }
    }
    if active > 0 {
        return Err(Error::ActiveExecutions(active));
    }
    let deadline = tokio::time::Instant::now() + settle;
    for execution_id in &executions {
        loop {
            match purge_fully(store, *execution_id, None, None).await? {
                PurgeStep::Unsettled if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await
                }
                PurgeStep::Unsettled => {
                    return Err(Error::Unavailable(
                        "the session's latest changes are not settled yet; try again".into(),
                    ))
                }
                // It moved on since the check (a command, a fork's child): refused as a whole.
                PurgeStep::NotEnded => return Err(Error::ActiveExecutions(1)),
                PurgeStep::Done | PurgeStep::Unknown | PurgeStep::More => break,
            }
        }
    }
    Ok(executions.len())
}
