//! The PostgreSQL store's reads (`EventReader`), each on one of the reader threads
//! (`readers.rs`); the caller waits for the answer.

use uuid::Uuid;

use super::readers::Connection;
use super::statements::{kind, GROUP_EVENTS_BITS};
use super::{database, PgStore};
use crate::codec;
use crate::error::{Error, Result};
use crate::event::EventEnvelope;
use crate::event_store::{EventReader, NodeRecord, Nodes};
use crate::ids::{CommandId, EffectId, ExecutionId, OwnerId, ProcessId, SessionId, WaitId};
use crate::keys;
use crate::open::Incarnation;
use crate::records::{
    BlobHash, CommandRecord, ExecutionHead, ExecutionState, JobRecord, ProcessRecord,
    ProjectionRecord, PurgedRecord, ReceiptRecord, WaitRecord,
};
use crate::shared::MetricsSnapshot;

impl PgStore {
    fn read<T: Send + 'static>(
        &self,
        read: impl FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.inner.readers.run(read)
    }

    /// One record of `kind` by its key (`keys`: its id after the prefix byte), decoded.
    fn record<T>(&self, kind: i16, key: [u8; 17]) -> Result<Option<T>>
    where
        T: serde::de::DeserializeOwned + Send + 'static,
    {
        let id = Uuid::from_slice(&key[1..]).map_err(|_| Error::corrupted(&key))?;
        self.read(move |client| {
            let statement =
                client.prepared("SELECT value FROM op_records WHERE kind = $1 AND id = $2")?;
            let row = client
                .query_opt(&statement, &[&kind, &id])
                .map_err(database)?;
            row.map(|row| codec::decode(&key, row.get(0))).transpose()
        })
    }

    /// Every record of `kind`, by id, each checked against its key (`key_of` its id).
    /// A record that does not decode is returned as its error, by its key.
    fn records_of<T>(
        &self,
        kind: i16,
        key_of: fn(Uuid) -> [u8; 17],
    ) -> Result<Vec<([u8; 17], Result<T>)>>
    where
        T: serde::de::DeserializeOwned + Send + 'static,
    {
        self.read(move |client| {
            let rows = client
                .query(
                    "SELECT id, value FROM op_records WHERE kind = $1 ORDER BY id",
                    &[&kind],
                )
                .map_err(database)?;
            let decoded = rows.iter().map(|row| {
                let key = key_of(row.get(0));
                (key, codec::decode(&key, row.get(1)))
            });
            Ok(decoded.collect())
        })
    }

    /// `result`, and the execution quarantined if it was a damaged row of it (S-4).
    fn quarantine_on_corruption<T>(
        &self,
        execution_id: ExecutionId,
        result: Result<T>,
    ) -> Result<T> {
        match result {
            Err(error @ Error::Corrupted { .. }) => {
                let reason = error.to_string();
                let recorded = reason.clone();
                let stored = self.read(move |client| {
                    client
                        .execute(
                            "INSERT INTO op_quarantine (execution_id, reason) VALUES ($1, $2) \
                             ON CONFLICT (execution_id) DO NOTHING",
                            &[execution_id.as_uuid(), &recorded],
                        )
                        .map_err(database)
                });
                if let Err(store_error) = stored {
                    tracing::error!(%execution_id, %store_error, "the quarantine was not stored");
                }
                self.shared()
                    .refusals
                    .quarantine(execution_id, reason.clone());
                Err(Error::Quarantined {
                    execution_id,
                    reason,
                })
            }
            other => other,
        }
    }
}

fn ids(rows: &[postgres::Row]) -> Vec<ExecutionId> {
    rows.iter()
        .map(|row| ExecutionId::from_uuid(row.get(0)))
        .collect()
}

/// The columns `envelopes` reads, in its order.
const EVENT_COLUMNS: &str = "execution_id, seq, envelope, position, last_seq";

/// The events of rows of `EVENT_COLUMNS` (in the rows' order) that `keep` keeps, at most
/// `limit`. A row holds a transition's events, `seq..=last_seq`, encoded together, or (a
/// row written before schema 3, no `last_seq`) one event. Positions are the row's column
/// (its first event's) and follow it.
fn envelopes(
    rows: &[postgres::Row],
    keep: impl Fn(&EventEnvelope) -> bool,
    limit: usize,
) -> Result<Vec<EventEnvelope>> {
    let mut events = Vec::new();
    for row in rows {
        if events.len() >= limit {
            break;
        }
        let last_seq: Option<i64> = row.get(4);
        let decoded = row_events(
            ExecutionId::from_uuid(row.get(0)),
            unsigned(row.get(1)),
            last_seq.map(unsigned),
            unsigned(row.get(3)),
            row.get(2),
        )?;
        events.extend(decoded.into_iter().filter(&keep));
        events.truncate(limit);
    }
    Ok(events)
}

/// The events of one row of `op_events`: `seq..=last_seq` encoded together, or one event
/// (`last_seq` NULL, before schema 3), numbered from `position`.
fn row_events(
    execution_id: ExecutionId,
    seq: u64,
    last_seq: Option<u64>,
    position: u64,
    bytes: &[u8],
) -> Result<Vec<EventEnvelope>> {
    let key = keys::events(execution_id, seq);
    let mut events: Vec<EventEnvelope> = match last_seq {
        None => vec![codec::decode(&key, bytes)?],
        Some(_) => codec::decode(&key, bytes)?,
    };
    let last_seq = last_seq.unwrap_or(seq);
    let whole = last_seq >= seq
        && events.len() as u64 == last_seq - seq + 1
        && events.iter().enumerate().all(|(index, event)| {
            event.execution_id == execution_id && event.seq == seq + index as u64
        });
    if !whole {
        return Err(Error::Corrupted {
            tree: "op_events",
            key: keys::display(&key),
        });
    }
    for (index, event) in events.iter_mut().enumerate() {
        event.position = position + index as u64;
    }
    Ok(events)
}

/// A count or position from the database: never negative.
fn unsigned(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// A count or position for the database: beyond `i64::MAX`, as large as it holds.
fn signed(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl EventReader for PgStore {
    fn head(&self, execution_id: ExecutionId) -> Result<Option<ExecutionHead>> {
        self.shared().refusals.check_quarantine(execution_id)?;
        let result = self.read(move |client| {
            let statement = client.prepared("SELECT head FROM op_heads WHERE execution_id = $1")?;
            let row = client
                .query_opt(&statement, &[execution_id.as_uuid()])
                .map_err(database)?;
            row.map(|row| codec::decode(&keys::head(execution_id), row.get(0)))
                .transpose()
        });
        self.quarantine_on_corruption(execution_id, result)
    }

    fn events_after(
        &self,
        execution_id: ExecutionId,
        after_seq: u64,
        limit: usize,
    ) -> Result<Vec<EventEnvelope>> {
        self.shared().refusals.check_quarantine(execution_id)?;
        let after = signed(after_seq);
        let rows_max = signed(limit as u64);
        let result = self.read(move |client| {
            // The row holding `after_seq` (it may hold later events too), then the rows
            // after it: each holds at least one event, so `limit` rows are enough.
            let statement = client.prepared(&format!(
                "SELECT * FROM ( \
                 (SELECT {EVENT_COLUMNS} FROM op_events \
                  WHERE execution_id = $1 AND seq <= $2 ORDER BY seq DESC LIMIT 1) \
                 UNION ALL \
                 (SELECT {EVENT_COLUMNS} FROM op_events \
                  WHERE execution_id = $1 AND seq > $2 ORDER BY seq LIMIT $3) \
                 ) AS rows ORDER BY seq"
            ))?;
            let rows = client
                .query(&statement, &[execution_id.as_uuid(), &after, &rows_max])
                .map_err(database)?;
            envelopes(&rows, |event| event.seq > after_seq, limit)
        });
        self.quarantine_on_corruption(execution_id, result)
    }

    fn log_after(&self, after_position: u64, limit: usize) -> Result<Vec<EventEnvelope>> {
        let after = signed(after_position);
        let rows_max = signed(limit as u64);
        self.read(move |client| {
            // As `events_after`, by position across executions, and only below the first
            // position of the oldest transaction still running: a group numbers its events
            // from its transaction id (`commit.rs`), so every later commit lands above that
            // bound and the cursor never passes a position that may still appear.
            let rows = client
                .query(
                    &format!(
                        "WITH bound AS (SELECT position_base + \
                             (pg_snapshot_xmin(pg_current_snapshot())::text::bigint - xid_base) \
                             * $3 AS below FROM op_meta WHERE id = 1) \
                         SELECT * FROM ( \
                         (SELECT {EVENT_COLUMNS} FROM op_events \
                          WHERE position <= $1 AND position < (SELECT below FROM bound) \
                          ORDER BY position DESC LIMIT 1) \
                         UNION ALL \
                         (SELECT {EVENT_COLUMNS} FROM op_events \
                          WHERE position > $1 AND position < (SELECT below FROM bound) \
                          ORDER BY position LIMIT $2) \
                         ) AS rows ORDER BY position"
                    ),
                    &[&after, &rows_max, &(1i64 << GROUP_EVENTS_BITS)],
                )
                .map_err(database)?;
            envelopes(&rows, |event| event.position > after_position, limit)
        })
    }

    fn command(&self, command_id: CommandId) -> Result<Option<CommandRecord>> {
        self.record(kind::COMMAND, keys::command(command_id))
    }

    fn receipt(&self, effect_id: EffectId) -> Result<Option<ReceiptRecord>> {
        self.record(kind::RECEIPT, keys::receipt(effect_id))
    }

    fn wait(&self, wait_id: WaitId) -> Result<Option<WaitRecord>> {
        self.record(kind::WAIT, keys::wait(wait_id))
    }

    fn process(&self, process_id: ProcessId) -> Result<Option<ProcessRecord>> {
        self.record(kind::PROCESS, keys::process(process_id))
    }

    fn job(&self, job_id: ExecutionId) -> Result<Option<JobRecord>> {
        self.record(kind::JOB, keys::job(job_id))
    }

    fn session(&self, session_id: SessionId) -> Result<Option<crate::records::SessionRecord>> {
        self.record(kind::SESSION, keys::session(session_id))
    }

    fn conversation(
        &self,
        session_id: SessionId,
    ) -> Result<Option<crate::conversation::ConversationRecord>> {
        self.record(kind::CONVERSATION, keys::conversation(session_id))
    }

    fn projection(&self, execution_id: ExecutionId) -> Result<Option<ProjectionRecord>> {
        self.shared().refusals.check_quarantine(execution_id)?;
        self.record(kind::PROJECTION, keys::projection(execution_id))
    }

    fn purged(&self, execution_id: ExecutionId) -> Result<Option<PurgedRecord>> {
        self.read(move |client| {
            let row = client
                .query_opt(
                    "SELECT record FROM op_purged WHERE execution_id = $1",
                    &[execution_id.as_uuid()],
                )
                .map_err(database)?;
            row.map(|row| codec::decode(&keys::purged(execution_id), row.get(0)))
                .transpose()
        })
    }

    fn ended_before(
        &self,
        before_ms: u64,
        after: Option<(u64, ExecutionId)>,
        limit: usize,
    ) -> Result<Vec<(u64, ExecutionId)>> {
        let before = signed(before_ms);
        let (after_ms, after_id) = after.map_or((-1, Uuid::nil()), |(at, execution_id)| {
            (signed(at), *execution_id.as_uuid())
        });
        let limit = signed(limit as u64);
        self.read(move |client| {
            let rows = client
                .query(
                    "SELECT ended_at_ms, execution_id FROM op_heads \
                     WHERE ended_at_ms IS NOT NULL AND ended_at_ms < $1 \
                     AND (ended_at_ms, execution_id) > ($2, $3) \
                     ORDER BY ended_at_ms, execution_id LIMIT $4",
                    &[&before, &after_ms, &after_id, &limit],
                )
                .map_err(database)?;
            Ok(rows
                .iter()
                .map(|row| {
                    let at: i64 = row.get(0);
                    (unsigned(at), ExecutionId::from_uuid(row.get(1)))
                })
                .collect())
        })
    }

    fn purges_unfinished(&self) -> Result<Vec<ExecutionId>> {
        self.read(|client| {
            let rows = client
                .query(
                    "SELECT execution_id FROM op_purged WHERE NOT finished ORDER BY execution_id",
                    &[],
                )
                .map_err(database)?;
            Ok(ids(&rows))
        })
    }

    fn nodes(&self) -> Result<Nodes> {
        self.read(|client| {
            let now: i64 = client
                .query_one(NOW_MS, &[])
                .map_err(database)?
                .get(0);
            let rows = client
                .query(
                    "SELECT node_id, owner_id, incarnation, url, started_at_ms, lease_expires_at_ms \
                     FROM op_nodes ORDER BY node_id",
                    &[],
                )
                .map_err(database)?;
            Ok(Nodes {
                now_ms: unsigned(now),
                nodes: rows.iter().map(node_of).collect(),
            })
        })
    }

    fn disk_bytes(&self) -> u64 {
        let size = self.read(|client| {
            let row = client
                .query_one("SELECT pg_database_size(current_database())", &[])
                .map_err(database)?;
            Ok(unsigned(row.get(0)))
        });
        size.unwrap_or(0)
    }

    fn executions_in_session(&self, session_id: SessionId) -> Result<Vec<ExecutionId>> {
        self.read(move |client| {
            let rows = client
                .query(
                    "SELECT execution_id FROM op_heads WHERE session_id = $1 \
                     ORDER BY execution_id",
                    &[session_id.as_uuid()],
                )
                .map_err(database)?;
            Ok(ids(&rows))
        })
    }

    fn sessions(&self) -> Result<Vec<(SessionId, usize)>> {
        self.read(|client| {
            let rows = client
                .query(
                    "SELECT session_id, count(*) FROM op_heads GROUP BY session_id \
                     ORDER BY session_id",
                    &[],
                )
                .map_err(database)?;
            Ok(rows
                .iter()
                .map(|row| {
                    let count: i64 = row.get(1);
                    (SessionId::from_uuid(row.get(0)), unsigned(count) as usize)
                })
                .collect())
        })
    }

    fn processes(&self) -> Result<Vec<ProcessRecord>> {
        let found = self.records_of(kind::PROCESS, |id| keys::process(ProcessId::from_uuid(id)))?;
        found.into_iter().map(|(_, process)| process).collect()
    }

    fn policies(&self) -> Result<crate::policy::Policies> {
        let key_of = |id| keys::policy(ExecutionId::from_uuid(id));
        let found = self.records_of::<crate::policy::PolicyRecord>(kind::POLICY, key_of)?;
        let windows = found.into_iter().map(|(key, policy)| {
            let window = policy.map(|policy| policy.restart_window);
            (key, window.map_err(|error| error.to_string()))
        });
        Ok(crate::policy::Policies::of(windows, |key| {
            keys::execution_at(key, 1)
        }))
    }

    fn blob(&self, hash: BlobHash) -> Result<Option<Vec<u8>>> {
        self.read(move |client| {
            let row = client
                .query_opt(
                    "SELECT bytes FROM op_blobs WHERE hash = $1",
                    &[&&hash.0[..]],
                )
                .map_err(database)?;
            match row.map(|row| row.get::<_, Vec<u8>>(0)) {
                Some(bytes) if BlobHash::of(&bytes) != hash => {
                    Err(Error::corrupted(&keys::blob(hash)))
                }
                bytes => Ok(bytes),
            }
        })
    }

    fn count_in_state(&self, state: ExecutionState) -> Result<usize> {
        if state.is_terminal() {
            return Ok(0);
        }
        let code = i16::from(state.code());
        self.read(move |client| {
            let row = client
                .query_one(
                    "SELECT count(*) FROM op_heads WHERE ended_at_ms IS NULL AND state = $1",
                    &[&code],
                )
                .map_err(database)?;
            Ok(usize::try_from(row.get::<_, i64>(0)).unwrap_or(0))
        })
    }

    fn executions_in_state(&self, state: ExecutionState) -> Result<Vec<ExecutionId>> {
        if state.is_terminal() {
            return Ok(Vec::new());
        }
        let code = i16::from(state.code());
        self.read(move |client| {
            let rows = client
                .query(
                    "SELECT execution_id FROM op_heads WHERE ended_at_ms IS NULL AND state = $1 \
                     ORDER BY execution_id",
                    &[&code],
                )
                .map_err(database)?;
            Ok(ids(&rows))
        })
    }

    fn quarantined(&self) -> Vec<(ExecutionId, String)> {
        self.shared().refusals.quarantined()
    }

    fn incarnation(&self) -> &Incarnation {
        &self.inner.incarnation
    }

    fn metrics(&self) -> MetricsSnapshot {
        self.metrics_snapshot()
    }

    fn histograms(&self) -> Vec<crate::NamedHistogram> {
        self.shared().metrics.histograms()
    }

    fn failure(&self) -> Option<String> {
        self.shared().refusals.failure()
    }
}

/// The database's clock, in ms since the epoch: node leases are measured on it alone, so
/// the nodes' own clocks may disagree.
pub(super) const NOW_MS: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint";

pub(super) fn node_of(row: &postgres::Row) -> NodeRecord {
    NodeRecord {
        node_id: row.get(0),
        owner_id: OwnerId::from_uuid(row.get(1)),
        incarnation: unsigned(row.get(2)),
        url: row.get(3),
        started_at_ms: unsigned(row.get(4)),
        lease_expires_at_ms: unsigned(row.get(5)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::Event;
    use crate::ids::EffectId;

    fn envelope(execution_id: ExecutionId, seq: u64) -> EventEnvelope {
        EventEnvelope {
            execution_id,
            seq,
            position: 0,
            at_ms: 1,
            writer_epoch: 0,
            event: Event::ModelDecided {
                effect_id: EffectId::new(),
                decision: format!("event {seq}"),
            },
        }
    }

    #[test]
    fn s1_a_row_holds_a_transitions_events_numbered_from_its_position() {
        let id = ExecutionId::new();
        let events: Vec<_> = (4..=6).map(|seq| envelope(id, seq)).collect();
        let read = row_events(id, 4, Some(6), 40, &codec::encode(&events)).expect("row");
        assert_eq!(read.iter().map(|e| e.seq).collect::<Vec<_>>(), [4, 5, 6]);
        assert_eq!(
            read.iter().map(|e| e.position).collect::<Vec<_>>(),
            [40, 41, 42]
        );
        assert_eq!(read[1].event, events[1].event);
    }

    #[test]
    fn s1_a_row_of_schema_2_holds_one_event() {
        let id = ExecutionId::new();
        let mut event = envelope(id, 3);
        event.position = 9;
        let read = row_events(id, 3, None, 9, &codec::encode(&event)).expect("row");
        assert_eq!(read, vec![event]);
    }

    #[test]
    fn s4_a_row_whose_events_do_not_match_its_columns_is_corrupted() {
        let id = ExecutionId::new();
        let events: Vec<_> = (4..=6).map(|seq| envelope(id, seq)).collect();
        let bytes = codec::encode(&events);
        for (seq, last_seq) in [(4, 5), (4, 7), (5, 7), (6, 4)] {
            let read = row_events(id, seq, Some(last_seq), 1, &bytes);
            assert!(
                matches!(
                    read,
                    Err(Error::Corrupted {
                        tree: "op_events",
                        ..
                    })
                ),
                "{seq}..={last_seq}: {read:?}"
            );
        }
        let other = row_events(ExecutionId::new(), 4, Some(6), 1, &bytes);
        assert!(other.is_err(), "another execution's events");
        let mut damaged = bytes.clone();
        damaged[bytes.len() / 2] ^= 0x20;
        assert!(row_events(id, 4, Some(6), 1, &damaged).is_err());
    }
}
