//! S-8, the committer's half of retention: one step of an execution's purge, and one step of
//! the log's sweep, each part of a group's batch like a transition (atomic, durable before
//! it is answered) and bounded, so no group waits on a whole history.
//!
//! A purge's first step makes the execution unreadable: it writes the tombstone
//! (`PurgedRecord`) and removes the head record, projection, Job record, session listing and
//! retention entry. Later steps remove the records it owned (`keys::owned`), its index
//! chunks, and the blobs no other execution uses (S-9), until the tombstone says `finished`;
//! after a crash, the next step goes on from what is left. Its events stay in shared log records until the sweep removes a record
//! whose every frame is of a purged execution. A record still living in a journal segment
//! that is mostly dead is copied forward without its purged executions' frames (`relocate`),
//! so that the segment goes (`history.rs`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::*;
use crate::codec;
use crate::event_store::{PurgeStep, SweepStep};
use crate::records::{BlobHash, PurgedRecord};

/// Keys one purge step removes at most (records it owned, index chunks).
pub(crate) const PURGE_KEYS_MAX: usize = 1024;
/// Log records a group copies forward at most.
const RELOCATE_RECORDS_MAX: usize = 16;
/// A segment whose live records fill less than this share of it has them copied forward,
/// once none has left it for `Limits::relocate_settled_ms`.
const RELOCATE_BELOW_SHARE: f64 = 0.5;

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
        let db = &self.shared.db()?;
        // Settled: nothing of it in this group or in memory — neither its head nor a record
        // it owns, which a materialization may write in a later slice than its head (it
        // would land after the purge). Its frames may still come after the materialization
        // mark: a crash then replays none of them, as it is purged (`open.rs`).
        if group.heads.contains_key(&execution_id)
            || group.purged.contains(&execution_id)
            || group.recorded.contains(&execution_id)
            || self.shared.overlay_read().holds(execution_id)
        {
            return Ok(PurgeStep::Unsettled);
        }
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
        for item in db.scan_prefix(keys::used_blobs_prefix(execution_id)) {
            if removed >= PURGE_KEYS_MAX {
                break;
            }
            let (key, _) = item?;
            self.release_blob(group, execution_id, &key)?;
            group.batch.remove(key);
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

    /// S-9: the execution no longer uses the blob its `keys::used_blob` key names; the blob
    /// goes too when no other execution does — none but executions this group purges, and
    /// no transition of this group — unless it is pinned (stored before schema 15).
    fn release_blob(&self, group: &mut Group, execution_id: ExecutionId, key: &[u8]) -> Result<()> {
        let Some(hash) = key
            .get(17..)
            .and_then(|hash| <[u8; 32]>::try_from(hash).ok())
        else {
            return Ok(());
        };
        let hash = BlobHash(hash);
        group.batch.remove(&keys::blob_user(hash, execution_id)[..]);
        let db = self.shared.db()?;
        let pinned = db.contains_key(keys::pinned_blob(hash))?;
        let mut used = pinned || group.blobs_used.contains(&hash);
        for user in db.scan_prefix(keys::blob_users_prefix(hash)).keys() {
            let user = keys::execution_at(&user?, 33);
            if used || user.is_none_or(|user| !group.purged.contains(&user)) {
                used = true;
                break;
            }
        }
        if !used {
            group.batch.remove(&keys::blob(hash)[..]);
            group.blobs_removed.insert(hash);
        }
        Ok(())
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
        let db = &self.shared.db()?;
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
            let Some(value) =
                self.shared
                    .history
                    .record(&|key| self.shared.get(key), &key, value)?
            else {
                continue;
            };
            step.next_position = Some(first.saturating_add(1));
            // A record it cannot read is left as it is: the sweep removes only what it knows.
            let Ok((last, owners)) = codec::frame_owners(&key, &value) else {
                continue;
            };
            if last > mark {
                step.next_position = None;
                break;
            }
            // A record with no frame left was copied forward without its purged ones.
            let mut all_purged = true;
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

impl Committer {
    /// Removes the journal segments sled holds in which nothing lives, once the group is
    /// answered (off its latency); one that cannot be removed now is tried after the next.
    pub(super) fn drop_dead_segments(&mut self) {
        let liveness = &self.liveness;
        let dropped = self
            .journal
            .drop_dead(self.flushing.durable_seq(), |segment| {
                liveness.live_bytes(segment) > 0
            });
        if let Err(error) = dropped {
            tracing::warn!(%error, "a journal segment nothing lives in was not removed");
        }
    }

    /// Copies forward, into this group's frame, up to `RELOCATE_RECORDS_MAX` records still
    /// living in the oldest segment sled holds that is mostly dead (`Liveness::sparse`),
    /// without the frames of purged executions; a record left with none is removed if the
    /// materialization mark covers it (an open replays the records after the mark, which
    /// must follow one another). Not beside a sweep, which may remove the same records in
    /// this group. A record it cannot read is left where it is.
    pub(super) fn relocate(&mut self, group: &mut Group) {
        if group.atomic {
            return;
        }
        let durable_seq = self.flushing.durable_seq();
        let segment_bytes = self.journal.segment_bytes();
        let settled = Duration::from_millis(self.shared.limits.relocate_settled_ms);
        let sparse = self.journal.sealed(durable_seq).find(|(segment, held)| {
            *held
                && self
                    .liveness
                    .sparse(*segment, segment_bytes, RELOCATE_BELOW_SHARE, settled)
        });
        let Some((segment, _)) = sparse else {
            return;
        };
        let Ok(mark) = self.shared.materialized_through() else {
            return;
        };
        for (position, location) in self.liveness.records_in(segment, RELOCATE_RECORDS_MAX) {
            let key = keys::log(position);
            match self.without_purged(&key, location) {
                Ok((_, 0, last)) if last <= mark => group.batch.remove(&key[..]),
                Ok((kept, _, _)) => group.batch.insert(&key[..], kept),
                // Copied whole: its checksums say what is wrong where it is read.
                Err(error) => {
                    tracing::warn!(%error, position, "a log record copied forward as it was");
                    match self.shared.history.read(location) {
                        Ok(Some(bytes)) => group.batch.insert(&key[..], bytes),
                        // Unreadable: left where it is, and not tried again.
                        _ => self.liveness.unmovable(position),
                    }
                }
            }
        }
    }

    /// The record at `location` without its purged executions' frames, how many frames it
    /// kept, and its last position.
    fn without_purged(&self, key: &[u8], location: Location) -> Result<(Vec<u8>, usize, u64)> {
        let shared = &self.shared;
        let bytes = shared.history.read(location)?;
        let bytes = bytes.ok_or_else(|| Error::corrupted(key))?;
        let (last, _) = codec::frame_owners(key, &bytes)?;
        let purged = |owner| Ok(!shared.db()?.contains_key(keys::purged(owner))?);
        let (kept, count) = codec::retain_frames(key, &bytes, purged)?;
        Ok((kept, count, last))
    }
}
