//! A conversation record's compare-and-swap in PostgreSQL (the sled committer's
//! is `Committer::write_conversation`): read and written in one transaction, under an
//! advisory lock on the session's id, so that two writers of one session — on one node or
//! two — never both pass the version check.

use postgres::Client;

use super::database;
use super::statements::{command_lock_key, kind, CONVERSATION_LOCK_CLASS};
use crate::codec;
use crate::conversation::{ConversationOutcome, ConversationRecord, ConversationWrite};
use crate::error::Result;
use crate::keys;

/// Checks the version and writes the record, in one transaction on `client`.
pub(super) fn write(client: &mut Client, write: &ConversationWrite) -> Result<ConversationOutcome> {
    let id = *write.session_id.as_uuid();
    let key = keys::conversation(write.session_id);
    let mut transaction = client.transaction().map_err(database)?;
    transaction
        .execute(
            "SELECT pg_advisory_xact_lock($1, $2)",
            &[&CONVERSATION_LOCK_CLASS, &command_lock_key(&id)],
        )
        .map_err(database)?;
    let row = transaction
        .query_opt(
            "SELECT value FROM op_records WHERE kind = $1 AND id = $2",
            &[&kind::CONVERSATION, &id],
        )
        .map_err(database)?;
    let current = match row {
        Some(row) => Some(codec::decode::<ConversationRecord>(&key, row.get(0))?),
        None => None,
    };
    let record = match write.decide(current.as_ref()) {
        Ok(record) => record,
        // Dropped: rolled back, nothing written.
        Err(conflict) => return Ok(conflict),
    };
    transaction
        .execute(
            "INSERT INTO op_records (kind, id, execution_id, value) VALUES ($1, $2, $2, $3) \
             ON CONFLICT (kind, id) DO UPDATE SET value = EXCLUDED.value",
            &[&kind::CONVERSATION, &id, &codec::encode(&record)],
        )
        .map_err(database)?;
    transaction.commit().map_err(database)?;
    Ok(ConversationOutcome::Written {
        version: record.version,
    })
}
