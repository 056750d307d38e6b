//! The committer's validation of one transition (`apply`): its shape, K-4's stored
//! outcomes, fencing and the expected version, then the frame it becomes, staged into the
//! group (`stage`); and a rejection written alone (`record_rejection`). Part of the
//! committer (`log.rs`), whose state it reads.

use std::sync::atomic::Ordering;

use super::*;
use crate::records::{Blob, BlobHash};

/// Where a validated frame goes: its execution, its first seq and log position, and what
/// the overlay needs to list it.
struct Placement {
    execution_id: ExecutionId,
    first_seq: u64,
    first_position: u64,
    at_ms: u64,
    indexed_state: Option<ExecutionState>,
    disk_index: Option<HeadIndex>,
    answer: usize,
}

impl Committer {
    /// Validates one transition against the committer's view and, if it commits, adds its
    /// frame to the group. Nothing here is visible to readers until the group is durable.
    pub(super) fn apply(
        &self,
        group: &mut Group,
        batch: &mut sled::Batch,
        transition: Transition,
        at_ms: u64,
        answer: usize,
    ) -> Result<Outcome> {
        let rejection = transition.is_rejection();
        let transition_checks = (
            transition.execution_id,
            transition.expected_version,
            transition.writer_epoch,
        );
        let Transition {
            execution_id,
            expected_version,
            writer_epoch,
            head,
            events,
            upserts,
            session,
        } = transition;
        if rejection && session.is_some() {
            return Err(Error::InvalidTransition(
                "a rejection alone carries no session write".into(),
            ));
        }
        if events.is_empty() && !rejection {
            return Err(Error::InvalidTransition(
                "a transition carries at least one event".into(),
            ));
        }
        if head
            .as_ref()
            .is_some_and(|head| head.execution_id != execution_id)
        {
            return Err(Error::InvalidTransition(
                "the head names another execution".into(),
            ));
        }
        let foreign_projection = upserts.iter().any(|upsert| {
            matches!(upsert, Upsert::Projection(projection)
                if projection.execution_id != execution_id || rejection)
        });
        if foreign_projection {
            return Err(Error::InvalidTransition(
                "a projection goes with an event of its own execution".into(),
            ));
        }
        self.shared.check_quarantine(execution_id)?;

        // K-4 before the version check: a retried command gets its stored outcome even when
        // the execution has moved on since.
        if let Some(outcome) = self.stored_outcome(group, execution_id, &upserts)? {
            return Ok(outcome);
        }

        if rejection {
            return self.record_rejection(group, batch, transition_checks, upserts);
        }

        // The head itself is copied only for a transition that brings none (most bring one).
        let copy_head = head.is_none();
        let current = self.with_head(group, execution_id, |head, on_disk| {
            Current::of(head, on_disk, copy_head)
        })?;
        let (current_version, current_epoch, current_last_seq) =
            current.as_ref().map_or((0, 0, 0), |current| {
                (current.version, current.fencing_epoch, current.last_seq)
            });
        let stale = writer_epoch.is_some_and(|epoch| epoch < current_epoch);
        // The planted bug `skip_fencing` checks no epoch.
        if stale && !crate::planted::planted(crate::planted::Bug::SkipFencing) {
            self.shared.metrics.fenced.fetch_add(1, Ordering::Relaxed);
            return Ok(Outcome::Fenced { current_epoch });
        }
        if let Some(expected) = expected_version {
            if expected != current_version {
                return Ok(Outcome::VersionConflict {
                    current: current_version,
                });
            }
        }
        // Issue 37: the session record is where the transition read it, in this same write.
        let session_record = match &session {
            Some(write) => match write.decide(self.session(group, write.session_id)?.as_ref()) {
                Ok(record) => record,
                Err(conflict) => return Ok(conflict),
            },
            None => None,
        };
        // A frame carries the head's identity only when it is new or changes (codec v2).
        let previous_identity = current.as_ref().map(|current| current.identity);
        let (mut next, indexed_state, disk_index) = match (current, head) {
            (None, None) => return Err(Error::UnknownExecution(execution_id)),
            (None, Some(_)) if expected_version != Some(0) => {
                return Err(Error::InvalidTransition(
                    "creating an execution needs expected_version Some(0)".into(),
                ))
            }
            // A new execution: nothing of it on disk.
            (None, Some(head)) => (head, None, Some(HeadIndex::default())),
            (Some(_), Some(_)) if writer_epoch.is_none() => {
                return Err(Error::InvalidTransition(
                    "only an attempt (a writer epoch) may replace an existing head".into(),
                ))
            }
            (Some(current), Some(head)) => (head, current.indexed_state, current.disk_index),
            (Some(current), None) => {
                let head = current.head.ok_or(Error::UnknownExecution(execution_id))?;
                (head, current.indexed_state, current.disk_index)
            }
        };
        next.version = current_version + 1;
        next.fencing_epoch = writer_epoch.map_or(current_epoch, |epoch| epoch.max(current_epoch));
        next.last_activity_ms = at_ms;
        let first_seq = current_last_seq + 1;
        let first_position = group.next_position;
        let envelopes: Vec<EventEnvelope> = events
            .into_iter()
            .enumerate()
            .map(|(index, event)| EventEnvelope {
                execution_id,
                seq: first_seq + index as u64,
                position: first_position + index as u64,
                at_ms,
                writer_epoch: writer_epoch.unwrap_or(0),
                event,
            })
            .collect();
        let n_events = envelopes.len() as u64;
        next.last_seq = first_seq + n_events - 1;
        let beyond = upserts.iter().any(|upsert| {
            matches!(upsert, Upsert::Projection(projection) if projection.through_seq > next.last_seq)
        });
        if beyond {
            return Err(Error::InvalidTransition(
                "a projection is of a seq past the transition's last event".into(),
            ));
        }

        let mut records = Vec::new();
        let mut blobs = Vec::new();
        for upsert in upserts {
            if let Upsert::Blob(blob) = &upsert {
                blobs.push(blob.clone());
            }
            if let Some(record) = upsert.into_record() {
                records.push(record);
            }
        }
        records.extend(session_record.map(RecordValue::Session));
        let mut frame = Frame {
            head: next,
            events: envelopes,
            records,
        };
        let with_identity = previous_identity != Some(HeadIdentity::of(&frame.head));
        // S-5: a large admission input is stored once, as a blob, and referenced.
        let blobbed = inputs_to_blob(&frame);
        encode_frame_into(&mut group.frame_bytes, &frame, with_identity, &blobbed);
        let limit = self
            .shared
            .limits
            .transition_bytes_max
            .min(u32::MAX as usize);
        // S-8: a projection is a cache: one that makes its transition too large is left out
        // (readers replay), never the reason the transition fails.
        let projected = |record: &RecordValue| matches!(record, RecordValue::Projection(_));
        if group.frame_bytes.len() > limit && frame.records.iter().any(projected) {
            frame.records.retain(|record| !projected(record));
            encode_frame_into(&mut group.frame_bytes, &frame, with_identity, &blobbed);
        }
        let encoded = &group.frame_bytes;
        if encoded.len() > limit {
            return Err(Error::PayloadTooLarge {
                what: "transition",
                len: encoded.len(),
                max: limit,
            });
        }

        // Committed: from here on the group owns the change.
        let placement = Placement {
            execution_id,
            first_seq,
            first_position,
            at_ms,
            indexed_state,
            disk_index,
            answer,
        };
        let committed = self.stage(group, batch, frame, &blobs, &blobbed, placement)?;
        Ok(Outcome::Committed(committed))
    }

    /// A rejection alone (K-4 checked already): its command record goes to its own key in
    /// this group's batch, unreadable until the group is durable (`in_flight_records`). It
    /// never passes through the overlay: nothing else writes a command id that has a record.
    fn record_rejection(
        &self,
        group: &mut Group,
        batch: &mut sled::Batch,
        (execution_id, expected_version, writer_epoch): (ExecutionId, Option<u64>, Option<u64>),
        upserts: Vec<Upsert>,
    ) -> Result<Outcome> {
        let current = self.with_head(group, execution_id, |head, _| {
            (head.version, head.fencing_epoch)
        })?;
        let Some((version, current_epoch)) = current else {
            return Err(Error::UnknownExecution(execution_id));
        };
        if writer_epoch.is_some_and(|epoch| epoch < current_epoch) {
            self.shared.metrics.fenced.fetch_add(1, Ordering::Relaxed);
            return Ok(Outcome::Fenced { current_epoch });
        }
        if expected_version.is_some_and(|expected| expected != version) {
            return Ok(Outcome::VersionConflict { current: version });
        }
        for upsert in upserts {
            if let Upsert::Command(record) = upsert {
                // A command saved before (accepted, its decision pending) is decided by an
                // event of its execution, through the overlay like its acceptance was: a
                // record here could be hidden by, or written over with, the overlay's.
                if let Some(stored) = self.command(group, record.command_id)? {
                    return Err(Error::InvalidTransition(format!(
                        "command {} was saved {:?}: a rejection alone is for a new command",
                        stored.command_id, stored.status
                    )));
                }
                let key = keys::command(record.command_id);
                let value = RecordValue::Command(record);
                crate::overlay::put_record(batch, &key, &value);
                group.recorded.insert(execution_id);
                self.shared.in_flight_record_insert(key);
                if let RecordValue::Command(record) = value {
                    group.commands.insert(record.command_id, record);
                }
            }
        }
        Ok(Outcome::Recorded { version })
    }

    /// K-4: the outcome stored for a command this transition carries again, if any — a
    /// conflict for another payload, the stored record for a duplicate.
    fn stored_outcome(
        &self,
        group: &Group,
        execution_id: ExecutionId,
        upserts: &[Upsert],
    ) -> Result<Option<Outcome>> {
        for upsert in upserts {
            if let Upsert::Command(command) = upsert {
                if command.execution_id != execution_id {
                    return Err(Error::InvalidTransition(
                        "a command names another execution".into(),
                    ));
                }
                if let Some(stored) = self.command(group, command.command_id)? {
                    if stored.payload_hash != command.payload_hash
                        || stored.execution_id != command.execution_id
                    {
                        return Ok(Some(Outcome::CommandConflict { stored }));
                    }
                    // A new submission, or an outcome for a command already decided: the
                    // stored record stands and nothing is written. Only an accepted command
                    // can move on to applied or rejected.
                    if command.status == CommandStatus::Accepted
                        || stored.status != CommandStatus::Accepted
                    {
                        return Ok(Some(Outcome::DuplicateCommand { stored }));
                    }
                }
            }
        }
        Ok(None)
    }

    /// Adds a validated frame to the group: its blobs to the batch, its commands to the
    /// group's view, its encoded bytes to the open log record, its place in the group.
    fn stage(
        &self,
        group: &mut Group,
        batch: &mut sled::Batch,
        frame: Frame,
        blobs: &[Blob],
        blobbed: &[(u32, BlobHash)],
        placement: Placement,
    ) -> Result<Committed> {
        let Placement {
            execution_id,
            first_seq,
            first_position,
            at_ms,
            indexed_state,
            disk_index,
            answer,
        } = placement;
        let n_events = frame.events.len() as u64;
        let encoded = &group.frame_bytes;
        let inputs = blobbed.iter().filter_map(|(index, hash)| {
            match &frame.events.get(*index as usize)?.event {
                Event::Admitted { input, .. } => Some((*hash, input.as_bytes())),
                _ => None,
            }
        });
        let upserted = blobs.iter().map(|blob| (blob.hash(), blob.bytes()));
        for (hash, bytes) in upserted.chain(inputs) {
            let key = keys::blob(hash);
            // Stored once; a stored copy that differs (damaged) is written again.
            if self.shared.db.get(key)?.as_deref() != Some(bytes) {
                self.shared.in_flight_blobs_insert(hash);
                batch.insert(&key[..], bytes);
            }
        }
        for record in &frame.records {
            match record {
                RecordValue::Command(command) => {
                    group.commands.insert(command.command_id, command.clone());
                }
                RecordValue::Session(session) => {
                    group.sessions.insert(session.session_id, session.clone());
                }
                _ => {}
            }
        }
        group.next_position += n_events;
        let (record, writer) = match &mut group.writer {
            Some((record, writer)) if writer.len() + encoded.len() <= LOG_RECORD_BYTES_MAX => {
                (*record, writer)
            }
            slot => {
                if let Some((position, full)) = slot.take() {
                    group
                        .log_records
                        .push((position, full.finish(first_position - 1)));
                }
                (
                    first_position,
                    &mut slot.insert((first_position, LogRecordWriter::new())).1,
                )
            }
        };
        writer.push(encoded);
        let committed = Committed {
            version: frame.head.version,
            seqs: first_seq..=frame.head.last_seq,
            positions: first_position..=first_position + n_events - 1,
            at_ms,
            // Filled in once the group is durable.
            events: Vec::new(),
        };
        group.heads.insert(execution_id, group.frames.len());
        group.frames.push(GroupFrame {
            frame,
            record,
            indexed_state,
            disk_index,
            answer,
        });
        Ok(committed)
    }
}
