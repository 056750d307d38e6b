//! S-8, the committer's half of retention: one step of an execution's purge, and one step of
//! the log's sweep, each part of a group's batch like a transition (atomic, durable before
//! it is answered) and bounded, so no group waits on a whole history.
//!
//! A purge's first step makes the execution unreadable: it writes the tombstone
//! (`PurgedRecord`) and removes the head record, projection, Job record, session listing and
//! retention entry. Later steps remove the records it owned (`keys::owned`) and its index
//! chunks until the tombstone says `finished`; after a crash, the next step goes on from
//! what is left. Its events stay in shared log records until the sweep removes a record
//! whose every frame is of a purged execution.

use std::sync::atomic::Ordering;

use super::*;
use crate::codec;
use crate::event_store::{PurgeStep, SweepStep};
use crate::records::PurgedRecord;

/// Keys one purge step removes at most (records it owned, index chunks).
pub(crate) const PURGE_KEYS_MAX: usize = 1024;

impl Committer {
    /// One step of the purge of `execution_id` (see the module). `ended_key`: its entry in
    /// the retention index, removed with it (the caller found it there; an entry of an
    /// execution that moved on since is removed all the same). `ended_before`: purge only
    /// an execution whose last activity is before this (retention's cutoff).
    pub(super) fn purge_step(
        &self,
        group: &mut Group,
        execution_id: ExecutionId,
        ended_key: Option<u64>,
        ended_before: Option<u64>,
    ) -> Result<PurgeStep> {
        let db = &self.shared.db;
        // Settled: nothing of it in this group or in memory, and no materialization under
        // way — one writes an execution's head and its records in different slices and moves
        // the mark only with its last, so until it ends a record could still land after the
        // purge, or a crash replay the execution's frames from before the mark.
        let overlay = self.shared.overlay_read();
        if group.heads.contains_key(&execution_id)
            || group.purged.contains(&execution_id)
            || group.recorded.contains(&execution_id)
            || overlay.is_materializing()
            || overlay.current(execution_id).is_some()
        {
            return Ok(PurgeStep::Unsettled);
        }
        drop(overlay);
        if let Some(ended_at_ms) = ended_key {
            group
                .batch
                .remove(&keys::ended(ended_at_ms, execution_id)[..]);
        }
        let tombstone_key = keys::purged(execution_id);
        let mut tombstone = match db.get(tombstone_key)? {
            Some(bytes) => codec::decode::<PurgedRecord>(&tombstone_key, &bytes)?,
            None => {
                let Some((head, _)) = self.shared.head_record_on_disk(execution_id)? else {
                    return Ok(PurgeStep::Unknown);
                };
                let recent = ended_before.is_some_and(|before| head.last_activity_ms >= before);
                if !head.state.is_terminal() || recent {
                    return Ok(PurgeStep::NotEnded);
                }
                group.batch.remove(&keys::head(execution_id)[..]);
                group.batch.remove(&keys::projection(execution_id)[..]);
                group.batch.remove(&keys::job(execution_id)[..]);
                group
                    .batch
                    .remove(&keys::by_session(head.session_id, execution_id)[..]);
                group
                    .batch
                    .remove(&keys::ended(head.last_activity_ms, execution_id)[..]);
                PurgedRecord {
                    execution_id,
                    session_id: head.session_id,
                    purged_at_ms: group.at_ms,
                    finished: false,
                }
            }
        };
        group.purged.insert(execution_id);
        if tombstone.finished {
            return Ok(PurgeStep::Done);
        }
        let mut removed = 0;
        for item in db.scan_prefix(keys::owned_prefix(execution_id)) {
            if removed >= PURGE_KEYS_MAX {
                break;
            }
            let (key, _) = item?;
            if let Some(record_key) = key.get(17..) {
                group.batch.remove(record_key);
            }
            group.batch.remove(key);
            removed += 1;
        }
        for item in db.scan_prefix(keys::events_prefix(execution_id)) {
            if removed >= PURGE_KEYS_MAX {
                break;
            }
            group.batch.remove(item?.0);
            removed += 1;
        }
        let step = if removed < PURGE_KEYS_MAX {
            tombstone.finished = true;
            PurgeStep::Done
        } else {
            PurgeStep::More
        };
        group
            .batch
            .insert(&tombstone_key[..], codec::encode(&tombstone));
        self.shared
            .metrics
            .purge_steps
            .fetch_add(1, Ordering::Relaxed);
        Ok(step)
    }

    /// One step of the log's sweep: examines at most `max_records` log records from
    /// `from_position` up to the materialization mark (a record after it is still replayed
    /// at open) and removes each whose every frame is of a purged execution.
    pub(super) fn sweep_step(
        &self,
        group: &mut Group,
        from_position: u64,
        max_records: usize,
    ) -> Result<SweepStep> {
        let db = &self.shared.db;
        let mark = self.shared.materialized_through()?;
        let mut step = SweepStep::default();
        let mut purged: HashMap<ExecutionId, bool> = HashMap::new();
        for item in db.range(keys::log(from_position)..=keys::log(mark)) {
            if step.records_examined >= max_records {
                break;
            }
            let (key, value) = item?;
            let Some(first) = keys::log_position(&key) else {
                continue;
            };
            step.records_examined += 1;
            step.next_position = Some(first.saturating_add(1));
            // A record it cannot read is left as it is: the sweep removes only what it knows.
            let Ok((last, owners)) = codec::frame_owners(&key, &value) else {
                continue;
            };
            if last > mark {
                step.next_position = None;
                break;
            }
            let mut all_purged = !owners.is_empty();
            for owner in owners {
                let gone = match purged.get(&owner) {
                    Some(gone) => *gone,
                    None => {
                        let gone = !group.heads.contains_key(&owner)
                            && db.contains_key(keys::purged(owner))?;
                        purged.insert(owner, gone);
                        gone
                    }
                };
                if !gone {
                    all_purged = false;
                    break;
                }
            }
            if all_purged {
                group.batch.remove(key);
                step.records_deleted += 1;
                step.bytes_deleted += value.len() as u64;
            }
        }
        if step.records_examined < max_records {
            step.next_position = None;
        }
        self.shared
            .metrics
            .log_records_swept
            .fetch_add(step.records_deleted as u64, Ordering::Relaxed);
        Ok(step)
    }
}
