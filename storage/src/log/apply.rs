//! The committer's part in one transition (`apply`): the commit rule (`commit::decide`)
//! read through the committer's view (`SledView`: the group's own writes, then the overlay,
//! then disk), then what the verdict writes — a committing frame, staged into the group's
//! open log record (`stage`), or a rejection's command record alone (`record_rejection`).
//! Part of the committer (`log.rs`), whose state it reads.

use super::*;
use crate::codec::{
    encode_frame_into, inputs_to_blob, HeadIdentity, RecordValue, LOG_RECORD_BYTES_MAX,
};
use crate::commit::{self, Held, Verdict, View, Written};
use crate::event::Event;
use crate::overlay::index_state;
use crate::records::{BlobHash, ExecutionHead};
use crate::shared::lock;
use crate::transition::Upsert;

impl Committer {
    /// Decides one transition against the committer's view and writes what the verdict says
    /// into the group. Nothing here is visible to readers until the group is durable.
    pub(super) fn apply(&self, group: &mut Group, transition: Transition) -> Result<Outcome> {
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
            Verdict::Answer(outcome) => return Ok(self.shared.metrics.answered(outcome)),
            Verdict::Rejection { version } => {
                self.record_rejection(group, execution_id, transition.upserts);
                return Ok(Outcome::Recorded { version });
            }
            Verdict::Commit(next) => next,
        };
        let (identity, on_disk, kept) = match current {
            Some(current) => (Some(current.identity), current.on_disk, current.head),
            // A new execution: nothing of it on disk.
            None => (None, (None, Some(HeadIndex::default())), None),
        };
        let mut written = next.frame(transition, || kept, group.at_ms, group.next_position)?;
        // A frame carries the head's identity (its ids and attempt) only when it is new or
        // changes (log formats 2 and 4).
        let with_identity = identity != Some(HeadIdentity::of(&written.frame.head));
        // S-5: a large admission input is stored once, as a blob, and referenced.
        let blobbed = inputs_to_blob(&written.frame);
        let bytes = &mut group.frame_bytes;
        written.fit(self.shared.limits.transition_bytes_max, |frame| {
            encode_frame_into(bytes, frame, with_identity, &blobbed);
            bytes.len() as u64
        })?;
        // Committed: from here on the group owns the change.
        self.stage(group, written, &blobbed, on_disk)
    }

    /// A rejection alone, allowed by the rule (`commit::decide`): its command record goes to
    /// its own key in this group's batch, unreadable until the group is durable
    /// (`in_flight_records`). It never passes through the overlay: nothing else writes a
    /// command id that has a record.
    fn record_rejection(&self, group: &mut Group, execution_id: ExecutionId, upserts: Vec<Upsert>) {
        for upsert in upserts {
            if let Upsert::Command(record) = upsert {
                let key = keys::command(record.command_id);
                let value = RecordValue::Command(record);
                crate::overlay::put_record(&mut group.batch, &key, &value);
                group.recorded.insert(execution_id);
                lock(&self.shared.in_flight_records).insert(key);
                if let RecordValue::Command(record) = value {
                    group.commands.insert(record.command_id, record);
                }
            }
        }
    }

    /// Adds a committing frame to the group: its blobs to the batch, its records to the
    /// group's view, its encoding (`Group::frame_bytes`) to the open log record, its place in
    /// the group.
    fn stage(
        &self,
        group: &mut Group,
        written: Written,
        blobbed: &[(u32, BlobHash)],
        on_disk: OnDiskNow,
    ) -> Result<Outcome> {
        let Written {
            frame,
            blobs,
            committed,
        } = written;
        let inputs = blobbed.iter().filter_map(|(index, hash)| {
            match &frame.events.get(*index as usize)?.event {
                Event::Admitted { input, .. } => Some((*hash, input.as_bytes())),
                _ => None,
            }
        });
        let upserted = blobs.iter().map(|blob| (blob.hash(), blob.bytes()));
        let user = frame.head.execution_id;
        for (hash, bytes) in upserted.chain(inputs) {
            let key = keys::blob(hash);
            // Stored once; a stored copy that differs (damaged), or one a purge of this
            // group removes, is written again.
            let stored = self.shared.db()?.get(key)?;
            if stored.as_deref() != Some(bytes) || group.blobs_removed.contains(&hash) {
                lock(&self.shared.in_flight_blobs).insert(hash);
                group.batch.insert(&key[..], bytes);
            }
            // S-9: its users, so that it goes with the last one's purge (`purge.rs`).
            group.batch.insert(&keys::blob_user(hash, user)[..], &[]);
            group.batch.insert(&keys::used_blob(user, hash)[..], &[]);
            group.blobs_used.insert(hash);
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
        let first_position = group.next_position;
        group.next_position += frame.events.len() as u64;
        let encoded = &group.frame_bytes;
        let (record, writer) = match &mut group.writer {
            Some((record, writer)) if writer.len() + encoded.len() <= LOG_RECORD_BYTES_MAX => {
                (*record, writer)
            }
            slot => {
                if let Some((position, full)) = slot.take() {
                    let bytes = full.finish(first_position - 1);
                    group.batch.insert(&keys::log(position), bytes);
                }
                (
                    first_position,
                    &mut slot.insert((first_position, LogRecordWriter::new())).1,
                )
            }
        };
        writer.push(encoded);
        group
            .heads
            .insert(frame.head.execution_id, group.frames.len());
        group.frames.push(GroupFrame {
            frame,
            record,
            on_disk,
            answer: group.answers.len(),
        });
        Ok(Outcome::Committed(committed))
    }

    /// The execution's head as this group would leave it (the group's own frame, then the
    /// overlay, then disk), with what disk says of it; read in place, copied only if
    /// `copy_head`.
    fn current(
        &self,
        group: &Group,
        execution_id: ExecutionId,
        copy_head: bool,
    ) -> Result<Option<Current>> {
        let in_group = group.heads.get(&execution_id);
        if let Some(in_group) = in_group.and_then(|&i| group.frames.get(i)) {
            let on_disk = in_group.on_disk.clone();
            return Ok(Some(Current::of(&in_group.frame.head, on_disk, copy_head)));
        }
        if let Some((head, indexed_state)) = self.shared.overlay_read().current(execution_id) {
            return Ok(Some(Current::of(head, (indexed_state, None), copy_head)));
        }
        // S-8: a purged execution takes no transition, and its id is never created again.
        if group.purged.contains(&execution_id)
            || self.shared.db()?.contains_key(keys::purged(execution_id))?
        {
            return Err(Error::Purged(execution_id));
        }
        let head = self.shared.head_record_on_disk(execution_id)?;
        Ok(head.map(|(head, index)| {
            let on_disk = (index_state(&head), Some(index));
            Current::of(&head, on_disk, copy_head)
        }))
    }
}

/// What the rule reads of an execution's head, and what its frame needs of it.
struct Current {
    held: Held,
    identity: HeadIdentity,
    /// What disk says of it: its by-state index state, and its head record's index when
    /// the head was read from disk.
    on_disk: OnDiskNow,
    /// A copy of the head, if asked for (`copy_head`).
    head: Option<ExecutionHead>,
}

impl Current {
    fn of(head: &ExecutionHead, on_disk: OnDiskNow, copy_head: bool) -> Self {
        Self {
            held: Held::of(head),
            identity: HeadIdentity::of(head),
            on_disk,
            head: copy_head.then(|| head.clone()),
        }
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
        self.committer
            .shared
            .refusals
            .check_quarantine(self.execution_id)
    }

    fn head(&mut self) -> Result<Option<Held>> {
        let (group, copy_head) = (self.group, self.copy_head);
        self.current = self
            .committer
            .current(group, self.execution_id, copy_head)?;
        Ok(self.current.as_ref().map(|current| current.held))
    }

    fn command(&self, command_id: CommandId) -> Result<Option<CommandRecord>> {
        if let Some(command) = self.group.commands.get(&command_id) {
            return Ok(Some(command.clone()));
        }
        self.committer
            .shared
            .committed_record(&keys::command(command_id))
    }

    fn session(&self, session_id: SessionId) -> Result<Option<SessionRecord>> {
        if let Some(record) = self.group.sessions.get(&session_id) {
            return Ok(Some(record.clone()));
        }
        self.committer
            .shared
            .committed_record(&keys::session(session_id))
    }
}
