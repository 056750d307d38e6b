//! The PostgreSQL committer's SQL (`commit.rs`, `group.rs`): the statements a group runs,
//! prepared once per connection, and the numbers they share with the readers.

use postgres::{Client, Statement};
use uuid::Uuid;

use super::database;
use crate::error::Result;

/// A group numbers at most `1 << GROUP_EVENTS_BITS` events from its transaction id
/// (`first_position`); `run` ends a group before it would hold more.
pub(super) const GROUP_EVENTS_BITS: u32 = 16;
pub(super) const GROUP_EVENTS_MAX: usize = 1 << GROUP_EVENTS_BITS;

/// The first key of a command's advisory lock ("opcm"; the migrations' lock is a single
/// bigint key, a space of its own).
pub(super) const COMMAND_LOCK_CLASS: i32 = 0x6f70_636d;
/// The first key of a session record's advisory lock, as for commands.
pub(super) const SESSION_LOCK_CLASS: i32 = 0x6f70_7373;
/// The advisory lock class of a conversation record's write (its session's id, as a
/// command's key).
pub(super) const CONVERSATION_LOCK_CLASS: i32 = 0x6f70_636e;

/// The second key of a command's advisory lock: 32 bits of its id (two ids that share them
/// only wait for each other).
pub(super) fn command_lock_key(command_id: &Uuid) -> i32 {
    let (high, low) = command_id.as_u64_pair();
    (high ^ low) as i32
}

/// Rows one purge step deletes at most (as `log::purge::PURGE_KEYS_MAX` keys in sled).
pub(super) const PURGE_ROWS_MAX: i64 = 1024;

/// `op_records.kind`.
pub(super) mod kind {
    pub const COMMAND: i16 = 0;
    pub const RECEIPT: i16 = 1;
    pub const WAIT: i16 = 2;
    pub const PROCESS: i16 = 3;
    pub const JOB: i16 = 4;
    pub const PROJECTION: i16 = 5;
    /// Schema 6.
    pub const SESSION: i16 = 6;
    /// Schema 7.
    pub const CONVERSATION: i16 = 7;
    /// Schema 11.
    pub const POLICY: i16 = 8;
}

/// The group's statements, prepared once per connection (parsed and planned by the server
/// once, not once per group).
pub(super) struct Statements {
    pub(super) heads: Statement,
    pub(super) purged: Statement,
    pub(super) command_locks: Statement,
    pub(super) commands: Statement,
    pub(super) insert_heads: Statement,
    pub(super) update_heads: Statement,
    pub(super) records: Statement,
    pub(super) blobs: Statement,
    pub(super) events: Statement,
}

impl Statements {
    pub(super) fn prepare(mut client: Client) -> Result<(Client, Self)> {
        let mut prepare = |sql: &str| client.prepare(sql).map_err(database);
        let statements = Self {
            // The group's transaction id (assigned here) and the bases its positions are
            // counted from (schema 3), then the heads it names, locked in id order, so two
            // groups locking overlapping sets never deadlock: one round trip (a row with
            // no head when none is stored).
            heads: prepare(
                "SELECT n.xid, n.position_base, n.xid_base, h.execution_id, h.head \
                 FROM (SELECT pg_current_xact_id()::text::bigint AS xid, position_base, \
                       xid_base FROM op_meta WHERE id = 1) AS n \
                 LEFT JOIN LATERAL (SELECT execution_id, head FROM op_heads \
                       WHERE execution_id = ANY($1) ORDER BY execution_id FOR UPDATE) AS h \
                 ON true",
            )?,
            purged: prepare("SELECT execution_id FROM op_purged WHERE execution_id = ANY($1)")?,
            command_locks: prepare(
                "SELECT pg_advisory_xact_lock($1, key) \
                 FROM UNNEST($2::int4[]) AS key ORDER BY key",
            )?,
            commands: prepare("SELECT id, value FROM op_records WHERE kind = $1 AND id = ANY($2)")?,
            insert_heads: prepare(
                "INSERT INTO op_heads (execution_id, session_id, state, ended_at_ms, head) \
                 SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::int2[], $4::int8[], \
                 $5::bytea[])",
            )?,
            update_heads: prepare(
                "UPDATE op_heads AS h SET session_id = u.session_id, state = u.state, \
                 ended_at_ms = u.ended_at_ms, head = u.head \
                 FROM UNNEST($1::uuid[], $2::uuid[], $3::int2[], $4::int8[], $5::bytea[]) \
                 AS u(execution_id, session_id, state, ended_at_ms, head) \
                 WHERE h.execution_id = u.execution_id",
            )?,
            records: prepare(
                "INSERT INTO op_records (kind, id, execution_id, value) \
                 SELECT * FROM UNNEST($1::int2[], $2::uuid[], $3::uuid[], $4::bytea[]) \
                 ON CONFLICT (kind, id) DO UPDATE \
                 SET execution_id = excluded.execution_id, value = excluded.value",
            )?,
            // Stored once; a stored copy that differs (damaged) is written again.
            blobs: prepare(
                "INSERT INTO op_blobs (hash, bytes) \
                 SELECT * FROM UNNEST($1::bytea[], $2::bytea[]) \
                 ON CONFLICT (hash) DO UPDATE SET bytes = excluded.bytes \
                 WHERE op_blobs.bytes IS DISTINCT FROM excluded.bytes",
            )?,
            events: prepare(
                "INSERT INTO op_events (execution_id, seq, last_seq, position, envelope) \
                 SELECT * FROM UNNEST($1::uuid[], $2::int8[], $3::int8[], $4::int8[], \
                     $5::bytea[])",
            )?,
        };
        Ok((client, statements))
    }
}
