//! The PostgreSQL store's tables and their migrations (S-1): numbered, each run once in a
//! transaction under an advisory lock, so that nodes starting together migrate once.
//!
//! Every stored value (head, event, record, tombstone) is the codec's checksummed bincode,
//! as in sled: a damaged row is detected when read and its execution quarantined (S-4).
//! The columns beside it (state, session, time ended, position) are what the indexes need.

use std::collections::BTreeMap;

use postgres::Client;

use super::database;
use crate::error::{Error, Result};
use crate::ids::{ExecutionId, OwnerId};
use crate::open::Incarnation;
use crate::shared::now_ms;

/// The newest schema this build writes.
pub const SCHEMA_VERSION: u32 = 11;

/// The advisory lock migrations hold (any value no other component of the database uses;
/// this one spells "opgm").
pub(super) const MIGRATION_LOCK: i64 = 0x6f70_676d;

/// A migration that changes nothing but the version.
const MARK: &str = "SELECT 1;";

/// The `n`th migration takes the schema from `n - 1` to `n`.
const MIGRATIONS: &[&str] = &[
    "
    CREATE TABLE op_meta (
        id smallint PRIMARY KEY CHECK (id = 1),
        next_position bigint NOT NULL
    );
    INSERT INTO op_meta VALUES (1, 1);
    CREATE TABLE op_incarnations (
        number bigserial PRIMARY KEY,
        owner_id uuid NOT NULL,
        started_at_ms bigint NOT NULL
    );
    CREATE TABLE op_heads (
        execution_id uuid PRIMARY KEY,
        session_id uuid NOT NULL,
        state smallint NOT NULL,
        ended_at_ms bigint,
        head bytea NOT NULL
    );
    CREATE INDEX op_heads_session ON op_heads (session_id, execution_id);
    CREATE INDEX op_heads_state ON op_heads (state, execution_id) WHERE ended_at_ms IS NULL;
    CREATE INDEX op_heads_ended ON op_heads (ended_at_ms, execution_id)
        WHERE ended_at_ms IS NOT NULL;
    CREATE TABLE op_events (
        execution_id uuid NOT NULL,
        seq bigint NOT NULL,
        position bigint NOT NULL,
        envelope bytea NOT NULL,
        PRIMARY KEY (execution_id, seq)
    );
    CREATE UNIQUE INDEX op_events_position ON op_events (position);
    CREATE TABLE op_records (
        kind smallint NOT NULL,
        id uuid NOT NULL,
        execution_id uuid NOT NULL,
        value bytea NOT NULL,
        PRIMARY KEY (kind, id)
    );
    CREATE INDEX op_records_execution ON op_records (execution_id);
    CREATE TABLE op_blobs (
        hash bytea PRIMARY KEY,
        bytes bytea NOT NULL
    );
    CREATE TABLE op_purged (
        execution_id uuid PRIMARY KEY,
        finished boolean NOT NULL,
        record bytea NOT NULL
    );
    CREATE INDEX op_purged_unfinished ON op_purged (execution_id) WHERE NOT finished;
    CREATE TABLE op_quarantine (
        execution_id uuid PRIMARY KEY,
        reason text NOT NULL
    );
    ",
    // N-2: the nodes sharing the store, with their leases (by the database's clock).
    "
    CREATE TABLE op_nodes (
        node_id text PRIMARY KEY,
        owner_id uuid NOT NULL,
        incarnation bigint NOT NULL,
        url text NOT NULL,
        started_at_ms bigint NOT NULL,
        lease_expires_at_ms bigint NOT NULL
    );
    ",
    // A row of `op_events` holds a transition's events, `seq..=last_seq` from
    // `position` on, encoded together (half the rows and index entries of a step). A
    // row written before has no `last_seq` and holds one event, as it did.
    // And room in each page of `op_heads` for a head's next version, so that its
    // update (one per transition) is a heap-only tuple: no new index entries.
    //
    // Positions without a lock (N-2): a group numbers its events from its transaction
    // id, `position_base + ((xid - xid_base) << 16) + offset`, so groups of every
    // node commit side by side; readers of the whole log stop below the oldest
    // transaction still running (`reads.rs`). The bases continue the positions handed
    // out before.
    "
    ALTER TABLE op_events ADD COLUMN last_seq bigint;
    ALTER TABLE op_heads SET (fillfactor = 50);
    ALTER TABLE op_meta ADD COLUMN position_base bigint, ADD COLUMN xid_base bigint;
    UPDATE op_meta SET position_base = next_position,
        xid_base = pg_current_xact_id()::text::bigint;
    ALTER TABLE op_meta ALTER COLUMN position_base SET NOT NULL,
        ALTER COLUMN xid_base SET NOT NULL;
    ",
    // 4 to 8 only mark the database, as sled's schemas 9 to 13 mark a store (`migrate.rs`),
    // so that an older build refuses it instead of quarantining executions whose events it
    // cannot decode: the events `ModelUsage` (E-6), `WaitDetails` (W-6, W-8), session
    // records (kind 6 of op_records, under the session's own id), conversation records
    // (kind 7, likewise, written by their own transaction), the event `ContextPinned` (E-8).
    MARK,
    MARK,
    MARK,
    MARK,
    MARK,
    // S-7 (N-4): the database's identity, kept by a dump, under which each node keeps the
    // highest position it saw acknowledged (`pg/mark.rs`); and a purged execution's last
    // position, so that the highest position the database held never goes down when a
    // purge takes the newest events (`PRESENT_THROUGH`).
    "
    ALTER TABLE op_meta ADD COLUMN database_id uuid NOT NULL DEFAULT gen_random_uuid();
    ALTER TABLE op_purged ADD COLUMN last_position bigint;
    CREATE INDEX op_purged_last_position ON op_purged (last_position)
        WHERE last_position IS NOT NULL;
    ",
    // A purge under way (by an older build) has its last position from the events it has
    // left. And the identities retired by a node that accepted a loss, with what the
    // database held then: a node whose mark names one of them lost what it acknowledged
    // after that.
    "
    UPDATE op_purged AS p SET last_position = (
        SELECT max(position + COALESCE(last_seq - seq, 0)) FROM op_events AS e
        WHERE e.execution_id = p.execution_id) WHERE NOT finished AND last_position IS NULL;
    CREATE TABLE op_retired_identities (
        database_id uuid PRIMARY KEY,
        present_through bigint NOT NULL,
        retired_at_ms bigint NOT NULL
    );
    ",
    // An execution's own restart window (K-7): policy records (kind 8 of op_records) and
    // the control `SetExecutionPolicy`; the event `ContractAdopted` (K-2). An older build
    // cannot decode them. A mark.
    MARK,
];

/// The highest position the database holds or held: its newest event's, or a purged
/// execution's last, whichever is higher (0 in an empty store).
pub(super) const PRESENT_THROUGH: &str = "SELECT GREATEST( \
     COALESCE((SELECT position + COALESCE(last_seq - seq, 0) FROM op_events \
               ORDER BY position DESC LIMIT 1), 0), \
     COALESCE((SELECT max(last_position) FROM op_purged), 0))";

/// Brings the schema to `SCHEMA_VERSION`; refuses a newer one.
pub(super) fn migrate(client: &mut Client) -> Result<()> {
    let mut transaction = client.transaction().map_err(database)?;
    transaction
        .execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .map_err(database)?;
    transaction
        .batch_execute("CREATE TABLE IF NOT EXISTS op_schema (version integer NOT NULL)")
        .map_err(database)?;
    let found: Option<i32> = transaction
        .query_opt("SELECT version FROM op_schema", &[])
        .map_err(database)?
        .map(|row| row.get(0));
    let found = match found {
        Some(version) => u32::try_from(version).map_err(|_| Error::Corrupted {
            tree: "op_schema",
            key: version.to_string(),
        })?,
        None => {
            transaction
                .execute("INSERT INTO op_schema VALUES (0)", &[])
                .map_err(database)?;
            0
        }
    };
    if found > SCHEMA_VERSION {
        return Err(Error::UnsupportedSchema {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for (version, sql) in (1u32..).zip(MIGRATIONS).skip(found as usize) {
        tracing::info!(version, "migrating the PostgreSQL store");
        transaction.batch_execute(sql).map_err(database)?;
        transaction
            .execute("UPDATE op_schema SET version = $1", &[&(version as i32)])
            .map_err(database)?;
    }
    renumber(&mut transaction, 0)?;
    transaction.commit().map_err(database)
}

/// Moves the numbering past what the database holds and past `floor`, when the next group
/// would number at or below either: a database restored from a dump counts transaction
/// ids from elsewhere (lower than the store's base, or inside the range it numbered from),
/// and a node that accepted a loss has acknowledged positions up to `floor` that must never
/// name other events. Positions go on from this transaction's id. Nodes restart after a
/// restore. Runs in a transaction holding the migration lock.
pub(super) fn renumber(transaction: &mut postgres::Transaction<'_>, floor: u64) -> Result<()> {
    let floor = i64::try_from(floor).map_err(|_| Error::Database(format!("position {floor}")))?;
    let renumbered = transaction
        .execute(
            &format!(
                "WITH floor AS (SELECT GREATEST(({PRESENT_THROUGH}), $2) AS position) \
                 UPDATE op_meta SET xid_base = pg_current_xact_id()::text::bigint, \
                     position_base = GREATEST(position_base, 1 + floor.position) \
                 FROM floor \
                 WHERE id = 1 AND (pg_current_xact_id()::text::bigint < xid_base \
                     OR position_base + (pg_current_xact_id()::text::bigint - xid_base) * $1 \
                         <= floor.position)"
            ),
            &[&(1i64 << super::statements::GROUP_EVENTS_BITS), &floor],
        )
        .map_err(database)?;
    if renumbered > 0 {
        tracing::warn!("positions renumbered past what the database holds (a restored database?)");
    }
    Ok(())
}

/// Records this opening as a new incarnation (its number is the database's sequence).
pub(super) fn record_incarnation(client: &mut Client, owner_id: OwnerId) -> Result<Incarnation> {
    let started_at_ms = now_ms();
    let row = client
        .query_one(
            "INSERT INTO op_incarnations (owner_id, started_at_ms) VALUES ($1, $2) \
             RETURNING number",
            &[owner_id.as_uuid(), &(started_at_ms as i64)],
        )
        .map_err(database)?;
    let number: i64 = row.get(0);
    Ok(Incarnation {
        number: number as u64,
        owner_id,
        started_at_ms,
    })
}

/// The executions quarantined so far, by any node.
pub(super) fn load_quarantine(client: &mut Client) -> Result<BTreeMap<ExecutionId, String>> {
    let rows = client
        .query("SELECT execution_id, reason FROM op_quarantine", &[])
        .map_err(database)?;
    Ok(rows
        .iter()
        .map(|row| (ExecutionId::from_uuid(row.get(0)), row.get(1)))
        .collect())
}
