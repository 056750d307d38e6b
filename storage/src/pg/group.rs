//! A group of the PostgreSQL committer (`commit.rs`): its view of the heads, tombstones and
//! command records it touches, the sled committer's rules applied to each transition in
//! memory (`log/apply.rs`), and the rows it writes.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use postgres::Transaction as SqlTransaction;
use serde::de::DeserializeOwned;
use uuid::Uuid;

use super::statements::{
    command_lock_key, kind, Statements, COMMAND_LOCK_CLASS, GROUP_EVENTS_BITS, PURGE_ROWS_MAX,
    SESSION_LOCK_CLASS,
};
use super::{database, Shared};
use crate::codec;
use crate::commit::{self, Held, Verdict, View, Written};
use crate::error::{Error, Result};
use crate::event_store::PurgeStep;
use crate::ids::{CommandId, ExecutionId, SessionId};
use crate::keys;
use crate::record_value::RecordValue;
use crate::records::{CommandRecord, ExecutionHead, PurgedRecord, SessionRecord};
use crate::shared::now_ms;
use crate::transition::{Outcome, Transition, Upsert};

mod purge;

/// The group's view of what it touches, and what it will write.
pub(super) struct Group {
    at_ms: u64,
    /// The next event's position: the group's first (`first_position`) plus the events
    /// staged so far, at most `GROUP_EVENTS_MAX`.
    next_position: u64,
    /// Heads as of this group: read from the database (locked), then as staged.
    heads: HashMap<ExecutionId, ExecutionHead>,
    /// Executions with no head row before this group that it creates.
    created: HashSet<ExecutionId>,
    /// Executions whose head this group changes (written at the end).
    dirty: Vec<ExecutionId>,
    /// Executions purged (tombstoned): a write to one is `Purged`.
    purged: HashSet<ExecutionId>,
    /// Executions a transition of this group touched: a purge of one waits (`Unsettled`).
    touched: HashSet<ExecutionId>,
    /// K-4: the command records the transitions carry (locked), then as staged.
    commands: Locked<CommandRecord>,
    /// The session records the transitions name (locked), then as staged.
    sessions: Locked<SessionRecord>,
    /// Rows to write: a transition's events (execution, first seq, last seq, first
    /// position, envelopes), records by (kind, id), blobs by hash.
    events: Vec<EventsRow>,
    records: HashMap<(i16, Uuid), (Uuid, Vec<u8>)>,
    blobs: HashMap<Vec<u8>, Vec<u8>>,
}

impl Group {
    /// Locks the heads the transitions and purges name; reads their tombstones and the command records
    /// they carry.
    pub(super) fn load(
        shared: &Shared,
        transaction: &mut SqlTransaction<'_>,
        statements: &Statements,
        transitions: &[&Transition],
        purges: &[ExecutionId],
    ) -> Result<Self> {
        let mut ids: Vec<Uuid> = purges.iter().map(|id| *id.as_uuid()).collect();
        let mut command_ids = Vec::new();
        let mut session_ids = Vec::new();
        for transition in transitions {
            ids.push(*transition.execution_id.as_uuid());
            if let Some(write) = &transition.session {
                session_ids.push(*write.session_id.as_uuid());
            }
            for upsert in &transition.upserts {
                if let Upsert::Command(command) = upsert {
                    command_ids.push(*command.command_id.as_uuid());
                }
            }
        }
        ids.sort_unstable();
        ids.dedup();
        let mut heads = HashMap::new();
        let rows = transaction
            .query(&statements.heads, &[&ids])
            .map_err(database)?;
        let numbering = rows
            .first()
            .ok_or_else(|| Error::Database("no op_meta row".into()))?;
        let next_position = first_position(numbering.get(0), numbering.get(1), numbering.get(2))?;
        for row in &rows {
            let Some(id) = row.get::<_, Option<Uuid>>(3) else {
                continue; // no head stored
            };
            let execution_id = ExecutionId::from_uuid(id);
            let bytes: &[u8] = row.get(4);
            match codec::decode::<ExecutionHead>(&keys::head(execution_id), bytes) {
                Ok(head) => drop(heads.insert(execution_id, head)),
                Err(error) => quarantine(shared, transaction, execution_id, &error)?,
            }
        }
        // A purge deletes the head with the tombstone's writing: only an execution without a
        // head row may have one (usually none: a round trip saved).
        let headless: Vec<Uuid> = ids
            .iter()
            .filter(|id| !heads.contains_key(&ExecutionId::from_uuid(**id)))
            .copied()
            .collect();
        let rows = match headless.is_empty() {
            true => Vec::new(),
            false => transaction
                .query(&statements.purged, &[&headless])
                .map_err(database)?,
        };
        let purged = rows.iter().map(|row| row.get(0));
        let commands = Locked::load(transaction, statements, &COMMANDS, &command_ids)?;
        let sessions = Locked::load(transaction, statements, &SESSIONS, &session_ids)?;
        Ok(Group {
            at_ms: now_ms(),
            next_position,
            heads,
            created: HashSet::new(),
            dirty: Vec::new(),
            purged: purged.map(ExecutionId::from_uuid).collect(),
            touched: HashSet::new(),
            commands,
            sessions,
            events: Vec::new(),
            records: HashMap::new(),
            blobs: HashMap::new(),
        })
    }

    /// Decides one transition against the group's view (`commit::decide`) and, if it
    /// commits, stages its rows.
    pub(super) fn apply(&mut self, shared: &Shared, transition: Transition) -> Result<Outcome> {
        let execution_id = transition.execution_id;
        let uuid = *execution_id.as_uuid();
        let mut view = PgView {
            group: self,
            shared,
            execution_id,
        };
        let next = match commit::decide(&transition, &mut view)? {
            Verdict::Answer(outcome) => return Ok(shared.metrics.answered(outcome)),
            Verdict::Rejection { version } => {
                for upsert in transition.upserts {
                    if let Upsert::Command(record) = upsert {
                        self.stage_record(uuid, &RecordValue::Command(record));
                    }
                }
                return Ok(Outcome::Recorded { version });
            }
            Verdict::Commit(next) => next,
        };
        let creates = next.creates;
        let heads = &self.heads;
        let current = || heads.get(&execution_id).cloned();
        let mut written = next.frame(transition, current, self.at_ms, self.next_position)?;
        written.fit(shared.limits.transition_bytes_max, |frame| {
            let records = frame.records.iter();
            codec::encoded_size(&(&frame.head, &frame.events))
                + records
                    .map(|record| record_row(record).2.len() as u64)
                    .sum::<u64>()
        })?;

        // Committed: from here on the group owns the change.
        let Written {
            frame,
            blobs,
            mut committed,
        } = written;
        self.events.push(EventsRow {
            execution_id: uuid,
            first_seq: *committed.seqs.start() as i64,
            last_seq: *committed.seqs.end() as i64,
            position: *committed.positions.start() as i64,
            envelopes: codec::encode(&frame.events),
        });
        for record in &frame.records {
            self.stage_record(uuid, record);
        }
        for blob in blobs {
            self.blobs
                .insert(blob.hash().0.to_vec(), blob.bytes().to_vec());
        }
        if creates {
            self.created.insert(execution_id);
        }
        if !self.dirty.contains(&execution_id) {
            self.dirty.push(execution_id);
        }
        self.touched.insert(execution_id);
        self.next_position += frame.events.len() as u64;
        self.heads.insert(execution_id, frame.head);
        committed.events = frame.events;
        Ok(Outcome::Committed(committed))
    }

    fn stage_record(&mut self, execution_id: Uuid, record: &RecordValue) {
        let mut owner = execution_id;
        match record {
            RecordValue::Command(command) => {
                self.commands.insert(command.command_id.as_uuid(), command);
            }
            // A session's record belongs to no execution: listed under the session's own
            // id, which no execution has, so a purge never takes it.
            RecordValue::Session(session) => {
                self.sessions.insert(session.session_id.as_uuid(), session);
                owner = *session.session_id.as_uuid();
            }
            _ => {}
        }
        let (kind, id, bytes) = record_row(record);
        self.records.insert((kind, id), (owner, bytes));
    }

    /// The last position of the events staged, if any.
    pub(super) fn last_position(&self) -> Option<u64> {
        (!self.events.is_empty()).then(|| self.next_position - 1)
    }

    /// Writes what committed: one statement per table.
    pub(super) fn write(
        mut self,
        transaction: &mut SqlTransaction<'_>,
        statements: &Statements,
    ) -> Result<()> {
        let (mut new, mut changed) = (HeadRows::default(), HeadRows::default());
        // In id order, as `load` locked them: new rows' index entries too.
        self.dirty.sort_unstable();
        for execution_id in &self.dirty {
            let Some(head) = self.heads.get(execution_id) else {
                continue;
            };
            let rows = if self.created.contains(execution_id) {
                &mut new
            } else {
                &mut changed
            };
            rows.push(head);
        }
        if !new.ids.is_empty() {
            transaction
                .execute(
                    &statements.insert_heads,
                    &[&new.ids, &new.sessions, &new.states, &new.ended, &new.heads],
                )
                .map_err(database)?;
        }
        if !changed.ids.is_empty() {
            transaction
                .execute(
                    &statements.update_heads,
                    &[
                        &changed.ids,
                        &changed.sessions,
                        &changed.states,
                        &changed.ended,
                        &changed.heads,
                    ],
                )
                .map_err(database)?;
        }
        if !self.records.is_empty() {
            // In key order: the row locks two groups take never cross.
            let mut records: Vec<_> = self.records.into_iter().collect();
            records.sort_unstable_by_key(|(key, _)| *key);
            let mut columns = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for ((kind, id), (execution_id, value)) in records {
                columns.0.push(kind);
                columns.1.push(id);
                columns.2.push(execution_id);
                columns.3.push(value);
            }
            transaction
                .execute(
                    &statements.records,
                    &[&columns.0, &columns.1, &columns.2, &columns.3],
                )
                .map_err(database)?;
        }
        if !self.blobs.is_empty() {
            let mut blobs: Vec<_> = self.blobs.into_iter().collect();
            blobs.sort_unstable();
            let (hashes, bytes): (Vec<_>, Vec<_>) = blobs.into_iter().unzip();
            transaction
                .execute(&statements.blobs, &[&hashes, &bytes])
                .map_err(database)?;
        }
        if !self.events.is_empty() {
            let n = self.events.len();
            let mut columns = (
                Vec::with_capacity(n),
                Vec::with_capacity(n),
                Vec::with_capacity(n),
                Vec::with_capacity(n),
                Vec::with_capacity(n),
            );
            for row in self.events {
                columns.0.push(row.execution_id);
                columns.1.push(row.first_seq);
                columns.2.push(row.last_seq);
                columns.3.push(row.position);
                columns.4.push(row.envelopes);
            }
            transaction
                .execute(
                    &statements.events,
                    &[&columns.0, &columns.1, &columns.2, &columns.3, &columns.4],
                )
                .map_err(database)?;
        }
        Ok(())
    }
}

/// The first position of a group whose transaction has the id `xid`: counted from it (N-2),
/// so that groups on every connection and node number their events without waiting for
/// each other, and a reader that stops below the oldest transaction still running never
/// skips a position committed later (`reads.rs`).
fn first_position(xid: i64, position_base: i64, xid_base: i64) -> Result<u64> {
    if xid < xid_base {
        // A database restored from a dump counts its transactions from lower again: the
        // next opening of the store moves the bases past what is stored (`schema.rs`).
        return Err(Error::Database(format!(
            "transaction id {xid} is below the store's base {xid_base} (restored from a \
             dump?): restart a node to renumber"
        )));
    }
    let first = (xid - xid_base)
        .checked_mul(1 << GROUP_EVENTS_BITS)
        .and_then(|offset| offset.checked_add(position_base));
    first
        .and_then(|first| u64::try_from(first).ok())
        .ok_or_else(|| {
            Error::Database(format!(
                "transaction id {xid} gives no position (base {position_base}, {xid_base})"
            ))
        })
}

/// One transition's events: one row of `op_events`.
struct EventsRow {
    execution_id: Uuid,
    first_seq: i64,
    last_seq: i64,
    /// The first event's.
    position: i64,
    /// `Vec<EventEnvelope>`.
    envelopes: Vec<u8>,
}

/// Heads to write, as columns.
#[derive(Default)]
struct HeadRows {
    ids: Vec<Uuid>,
    sessions: Vec<Uuid>,
    states: Vec<i16>,
    ended: Vec<Option<i64>>,
    heads: Vec<Vec<u8>>,
}

impl HeadRows {
    fn push(&mut self, head: &ExecutionHead) {
        self.ids.push(*head.execution_id.as_uuid());
        self.sessions.push(*head.session_id.as_uuid());
        self.states.push(i16::from(head.state.code()));
        // S-8: the retention index lists an ended execution under its last activity.
        self.ended.push(
            head.state
                .is_terminal()
                .then_some(head.last_activity_ms as i64),
        );
        self.heads.push(codec::encode(head));
    }
}

/// A record's row: its kind, its id, its stored bytes.
pub(super) fn record_row(record: &RecordValue) -> (i16, Uuid, Vec<u8>) {
    let (kind, bytes) = match record {
        RecordValue::Command(record) => (kind::COMMAND, codec::encode(record)),
        RecordValue::Receipt(record) => (kind::RECEIPT, codec::encode(record)),
        RecordValue::Wait(record) => (kind::WAIT, codec::encode(record)),
        RecordValue::Process(record) => (kind::PROCESS, codec::encode(record)),
        RecordValue::Job(record) => (kind::JOB, codec::encode(record)),
        RecordValue::Policy(record) => (kind::POLICY, codec::encode(record)),
        RecordValue::Projection(record) => (kind::PROJECTION, codec::encode(record)),
        RecordValue::Session(record) => (kind::SESSION, codec::encode(record)),
    };
    (kind, record.id(), bytes)
}

/// S-4: refuses an execution whose stored head is damaged, on every node from now on.
fn quarantine(
    shared: &Shared,
    transaction: &mut SqlTransaction<'_>,
    execution_id: ExecutionId,
    error: &Error,
) -> Result<()> {
    let reason = error.to_string();
    transaction
        .execute(
            "INSERT INTO op_quarantine (execution_id, reason) VALUES ($1, $2) \
             ON CONFLICT (execution_id) DO NOTHING",
            &[execution_id.as_uuid(), &reason],
        )
        .map_err(database)?;
    shared.refusals.quarantine(execution_id, reason);
    Ok(())
}

/// What the commit rule reads, as the group sees it: what it loaded for its transitions and
/// what it wrote since. A record that did not decode fails the transition that needs it.
struct PgView<'a> {
    group: &'a Group,
    shared: &'a Shared,
    execution_id: ExecutionId,
}

impl View for PgView<'_> {
    fn writable(&self) -> Result<()> {
        self.shared.refusals.check_quarantine(self.execution_id)?;
        if self.group.purged.contains(&self.execution_id) {
            return Err(Error::Purged(self.execution_id));
        }
        Ok(())
    }

    fn head(&mut self) -> Result<Option<Held>> {
        Ok(self.group.heads.get(&self.execution_id).map(Held::of))
    }

    fn command(&self, command_id: CommandId) -> Result<Option<CommandRecord>> {
        self.group.commands.get(command_id.as_uuid())
    }

    fn session(&self, session_id: SessionId) -> Result<Option<SessionRecord>> {
        self.group.sessions.get(session_id.as_uuid())
    }
}

/// A kind of record a group reads under advisory locks on their ids.
struct Lockable {
    class: i32,
    kind: i16,
    tree: &'static str,
    key: fn(Uuid) -> [u8; 17],
}

const COMMANDS: Lockable = Lockable {
    class: COMMAND_LOCK_CLASS,
    kind: kind::COMMAND,
    tree: "commands",
    key: |id| keys::command(CommandId::from_uuid(id)),
};

const SESSIONS: Lockable = Lockable {
    class: SESSION_LOCK_CLASS,
    kind: kind::SESSION,
    tree: "sessions",
    key: |id| keys::session(SessionId::from_uuid(id)),
};

/// Records of one kind as the group read them under their locks, then as it staged them;
/// a record that did not decode fails the transition that needs it.
struct Locked<R> {
    of: &'static Lockable,
    records: HashMap<Uuid, R>,
    corrupt: HashSet<Uuid>,
}

impl<R: DeserializeOwned + Clone> Locked<R> {
    /// Reads the records with `ids` under an advisory lock on each (in key order, held to
    /// the commit): a record's row may not exist yet, and a missing row cannot be locked, so
    /// a second group carrying the same id — on another committer or node — waits, then
    /// reads what the first one wrote (K-4 for commands, C-2 and W-7 for sessions).
    fn load(
        transaction: &mut SqlTransaction<'_>,
        statements: &Statements,
        of: &'static Lockable,
        ids: &[Uuid],
    ) -> Result<Self> {
        let mut locked = Locked {
            of,
            records: HashMap::new(),
            corrupt: HashSet::new(),
        };
        if ids.is_empty() {
            return Ok(locked);
        }
        let mut keys: Vec<i32> = ids.iter().map(command_lock_key).collect();
        keys.sort_unstable();
        keys.dedup();
        transaction
            .execute(&statements.command_locks, &[&of.class, &keys])
            .map_err(database)?;
        let rows = transaction
            .query(&statements.commands, &[&of.kind, &ids])
            .map_err(database)?;
        for row in rows {
            let id: Uuid = row.get(0);
            match codec::decode::<R>(&(of.key)(id), row.get(1)) {
                Ok(record) => drop(locked.records.insert(id, record)),
                Err(_) => drop(locked.corrupt.insert(id)),
            }
        }
        Ok(locked)
    }

    fn get(&self, id: &Uuid) -> Result<Option<R>> {
        if self.corrupt.contains(id) {
            return Err(Error::Corrupted {
                tree: self.of.tree,
                key: keys::display(&(self.of.key)(*id)),
            });
        }
        Ok(self.records.get(id).cloned())
    }

    fn insert(&mut self, id: &Uuid, record: &R) {
        self.records.insert(*id, record.clone());
    }
}
