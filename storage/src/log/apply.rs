//! The committer's validation of one transition (`apply`): its shape, K-4's stored
//! outcomes, fencing and the expected version, then the frame it becomes, staged into the
//! group (`stage`); and a rejection written alone (`record_rejection`). Part of the
//! committer (`log.rs`), whose state it reads.

use std::sync::atomic::Ordering;

use super::*;
use crate::commit::{self, Held, Verdict, View};
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
        let execution_id = transition.execution_id;
        // The head itself is copied only for a transition that brings none (most bring one).
        let mut view = SledView {
            committer: self,
            group,
            execution_id,
            copy_head: transition.head.is_none(),
            current: None,
        };
        let verdict = commit::decide(&transition, &mut view)?;
        let current = view.current.take();
        let next = match verdict {
            Verdict::Answer(outcome) => {
                if let Outcome::Fenced { .. } = outcome {
                    self.shared.metrics.fenced.fetch_add(1, Ordering::Relaxed);
                }
                return Ok(outcome);
            }
            Verdict::Rejection { version } => {
                return self.record_rejection(
                    group,
                    batch,
                    execution_id,
                    transition.upserts,
                    version,
                )
            }
            Verdict::Commit(next) => next,
        };
        let Transition {
            writer_epoch,
            head,
            events,
            upserts,
            ..
        } = transition;
        // A frame carries the head's identity only when it is new or changes (codec v2).
        let previous_identity = current.as_ref().map(|current| current.identity);
        let (mut head_next, indexed_state, disk_index) = match (current, head) {
            // A new execution: nothing of it on disk.
            (None, Some(head)) => (head, None, Some(HeadIndex::default())),
            (Some(current), Some(head)) => (head, current.indexed_state, current.disk_index),
            (Some(current), None) => {
                let head = current.head.ok_or(Error::UnknownExecution(execution_id))?;
                (head, current.indexed_state, current.disk_index)
            }
            // Refused by the rule.
            (None, None) => return Err(Error::UnknownExecution(execution_id)),
        };
        head_next.version = next.version;
        head_next.fencing_epoch = next.fencing_epoch;
        head_next.last_activity_ms = at_ms;
        head_next.last_seq = next.last_seq;
        let first_seq = next.first_seq;
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
        let session_record = next.session;
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
            head: head_next,
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

    /// A rejection alone, allowed by the rule (`commit::decide`): its command record goes to
    /// its own key in this group's batch, unreadable until the group is durable
    /// (`in_flight_records`). It never passes through the overlay: nothing else writes a
    /// command id that has a record.
    fn record_rejection(
        &self,
        group: &mut Group,
        batch: &mut sled::Batch,
        execution_id: ExecutionId,
        upserts: Vec<Upsert>,
        version: u64,
    ) -> Result<Outcome> {
        for upsert in upserts {
            if let Upsert::Command(record) = upsert {
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

/// What the commit rule reads, as the committer sees it: the group's writes, then the
/// overlay, then the disk. The head read keeps what the frame needs of it (`Current`).
struct SledView<'a> {
    committer: &'a Committer,
    group: &'a Group,
    execution_id: ExecutionId,
    copy_head: bool,
    current: Option<Current>,
}

impl View for SledView<'_> {
    fn writable(&self) -> Result<()> {
        self.committer.shared.check_quarantine(self.execution_id)
    }

    fn head(&mut self) -> Result<Option<Held>> {
        let copy_head = self.copy_head;
        self.current =
            self.committer
                .with_head(self.group, self.execution_id, |head, on_disk| {
                    Current::of(head, on_disk, copy_head)
                })?;
        Ok(self.current.as_ref().map(|current| Held {
            version: current.version,
            fencing_epoch: current.fencing_epoch,
            last_seq: current.last_seq,
        }))
    }

    fn command(&self, command_id: CommandId) -> Result<Option<CommandRecord>> {
        self.committer.command(self.group, command_id)
    }

    fn session(
        &self,
        session_id: crate::ids::SessionId,
    ) -> Result<Option<crate::records::SessionRecord>> {
        self.committer.session(self.group, session_id)
    }
}
