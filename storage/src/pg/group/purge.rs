//! One step of a purge in a PostgreSQL group (S-8; the sled committer's rules are
//! `log/purge.rs`), on the group's view of the heads it locked (`group.rs`).

use super::*;

impl Group {
    /// One step of a purge (the sled committer's rules, `log/purge.rs`): the first deletes
    /// the head row (and with it the session listing and the retention entry), the Job
    /// record and the projection, and writes the tombstone; each deletes at most
    /// `PURGE_ROWS_MAX` of the records and events it owned.
    pub(in crate::pg) fn purge(
        &mut self,
        shared: &Shared,
        transaction: &mut SqlTransaction<'_>,
        execution_id: ExecutionId,
        ended_before: Option<u64>,
    ) -> Result<PurgeStep> {
        if self.touched.contains(&execution_id) {
            return Ok(PurgeStep::Unsettled);
        }
        let uuid = *execution_id.as_uuid();
        let stored = transaction
            .query_opt(
                "SELECT record FROM op_purged WHERE execution_id = $1",
                &[&uuid],
            )
            .map_err(database)?;
        // The first step records the execution's last position with its tombstone (S-7).
        let mut last_position: Option<i64> = None;
        let mut tombstone = match stored {
            Some(row) => codec::decode::<PurgedRecord>(&keys::purged(execution_id), row.get(0))?,
            None => {
                let Some(head) = self.heads.get(&execution_id) else {
                    return Ok(PurgeStep::Unknown);
                };
                let recent = ended_before.is_some_and(|before| head.last_activity_ms >= before);
                if !head.state.is_terminal() || recent {
                    return Ok(PurgeStep::NotEnded);
                }
                let tombstone = PurgedRecord {
                    execution_id,
                    session_id: head.session_id,
                    purged_at_ms: self.at_ms,
                    finished: false,
                };
                last_position = transaction
                    .query_opt(
                        "SELECT position + COALESCE(last_seq - seq, 0) FROM op_events \
                         WHERE execution_id = $1 ORDER BY seq DESC LIMIT 1",
                        &[&uuid],
                    )
                    .map_err(database)?
                    .map(|row| row.get(0));
                transaction
                    .execute("DELETE FROM op_heads WHERE execution_id = $1", &[&uuid])
                    .map_err(database)?;
                transaction
                    .execute(
                        "DELETE FROM op_records WHERE execution_id = $1 AND kind IN ($2, $3)",
                        &[&uuid, &kind::JOB, &kind::PROJECTION],
                    )
                    .map_err(database)?;
                self.heads.remove(&execution_id);
                tombstone
            }
        };
        self.purged.insert(execution_id);
        self.touched.insert(execution_id);
        shared.metrics.purge_steps.fetch_add(1, Ordering::Relaxed);
        if tombstone.finished {
            return Ok(PurgeStep::Done);
        }
        let mut removed = transaction
            .execute(
                "DELETE FROM op_records WHERE ctid IN \
                 (SELECT ctid FROM op_records WHERE execution_id = $1 LIMIT $2)",
                &[&uuid, &PURGE_ROWS_MAX],
            )
            .map_err(database)? as i64;
        if removed < PURGE_ROWS_MAX {
            removed += transaction
                .execute(
                    "DELETE FROM op_events WHERE ctid IN \
                     (SELECT ctid FROM op_events WHERE execution_id = $1 LIMIT $2)",
                    &[&uuid, &(PURGE_ROWS_MAX - removed)],
                )
                .map_err(database)? as i64;
        }
        let step = if removed < PURGE_ROWS_MAX {
            tombstone.finished = true;
            PurgeStep::Done
        } else {
            PurgeStep::More
        };
        transaction
            .execute(
                "INSERT INTO op_purged (execution_id, finished, record, last_position) \
                 VALUES ($1, $2, $3, $4) ON CONFLICT (execution_id) DO UPDATE \
                 SET finished = excluded.finished, record = excluded.record",
                &[
                    &uuid,
                    &tombstone.finished,
                    &codec::encode(&tombstone),
                    &last_position,
                ],
            )
            .map_err(database)?;
        Ok(step)
    }
}
