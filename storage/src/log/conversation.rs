//! A conversation record's compare-and-swap in the committer, against the record
//! as the group leaves it (PostgreSQL's is `pg/conversation.rs`). Part of the committer
//! (`log.rs`), whose state it reads.

use super::*;
use crate::codec;
use crate::shared::lock;

impl Committer {
    /// Written to its own key in the batch; until the group is durable, readers get the
    /// durable value it had (`in_flight_overwrites`). Nothing else writes that key.
    pub(super) fn write_conversation(
        &self,
        group: &mut Group,
        write: ConversationWrite,
    ) -> Result<ConversationOutcome> {
        let key = keys::conversation(write.session_id);
        let current = match group.conversations.get(&write.session_id) {
            Some(record) => Some(record.clone()),
            // The batch is applied at the group's end: disk holds the durable value.
            None => {
                let bytes = self.shared.db()?.get(key)?;
                let record: Option<ConversationRecord> = bytes
                    .as_ref()
                    .map(|bytes| codec::decode(&key, bytes))
                    .transpose()?;
                // The first value the group saw, if it rewrites the key twice.
                lock(&self.shared.in_flight_overwrites)
                    .entry(key)
                    .or_insert(bytes);
                record
            }
        };
        let record = match write.decide(current.as_ref()) {
            Ok(record) => record,
            Err(conflict) => return Ok(conflict),
        };
        group.batch.insert(&key[..], codec::encode(&record));
        let version = record.version;
        group.conversations.insert(write.session_id, record);
        Ok(ConversationOutcome::Written { version })
    }
}
