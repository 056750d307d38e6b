//! Helpers shared by the storage tests: building executions and transitions, and reading a
//! whole history back.

use openprogram_storage::{
    Committed, EffectId, Event, EventEnvelope, EventStore, ExecutionHead, ExecutionId,
    ExecutionKind, ExecutionState, Outcome, RunId, SessionId, Transition,
};

pub fn head(execution_id: ExecutionId) -> ExecutionHead {
    ExecutionHead::new(
        execution_id,
        SessionId::new(),
        RunId::new(),
        ExecutionKind::AgentTurn,
    )
}

pub fn decided(text: &str) -> Event {
    Event::ModelDecided {
        effect_id: EffectId::new(),
        decision: text.to_owned(),
    }
}

pub fn state_changed(state: ExecutionState) -> Event {
    Event::StateChanged {
        state,
        reason: String::from("test"),
    }
}

pub fn committed(outcome: Outcome) -> Committed {
    match outcome {
        Outcome::Committed(committed) => committed,
        other => panic!("expected a commit, got {other:?}"),
    }
}

/// Creates an execution and returns its id.
pub async fn create(store: &dyn EventStore) -> ExecutionId {
    let execution_id = ExecutionId::new();
    let outcome = store
        .submit(Transition::create(
            head(execution_id),
            vec![decided("admitted")],
        ))
        .await
        .expect("create");
    assert_eq!(committed(outcome).version, 1);
    execution_id
}

/// Appends one event at the expected version and returns the commit.
pub async fn append(
    store: &dyn EventStore,
    execution_id: ExecutionId,
    version: u64,
    text: &str,
) -> Committed {
    let transition = Transition::new(execution_id, vec![decided(text)]).expect_version(version);
    committed(store.submit(transition).await.expect("append"))
}

/// Moves an execution to `state` at the expected version.
pub async fn set_state(
    store: &dyn EventStore,
    execution_id: ExecutionId,
    version: u64,
    state: ExecutionState,
) -> Committed {
    let mut next = store.head(execution_id).expect("head").expect("exists");
    next.state = state;
    let epoch = next.fencing_epoch;
    let transition = Transition::new(execution_id, vec![state_changed(state)])
        .expect_version(version)
        .by_epoch(epoch)
        .with_head(next);
    committed(store.submit(transition).await.expect("set state"))
}

pub fn all_events(store: &dyn EventStore, execution_id: ExecutionId) -> Vec<EventEnvelope> {
    store
        .events_after(execution_id, 0, usize::MAX)
        .expect("events")
}

pub fn whole_log(store: &dyn EventStore) -> Vec<EventEnvelope> {
    store.log_after(0, usize::MAX).expect("log")
}

/// The whole log once it holds `len` events (or, after 10 s, as it is): in PostgreSQL it
/// stops below the oldest transaction still running on the server, and the tests of other
/// databases on the same server run beside this one. An event once read stays readable.
pub fn settled_log(store: &dyn EventStore, len: usize) -> Vec<EventEnvelope> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let log = whole_log(store);
        if log.len() >= len || std::time::Instant::now() > deadline {
            return log;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Limits that materialize after every group, so tests cross the overlay/disk boundary
/// constantly.
pub fn eager_limits() -> openprogram_storage::Limits {
    openprogram_storage::Limits {
        materialize_interval_ms: 0,
        ..Default::default()
    }
}

/// Opens the store's sled database directly, to plant damage while the store is closed.
/// Retries the lock like `Store::open` does: sled's IO threads may hold it a few
/// milliseconds after the store closed.
pub fn raw_open(dir: &std::path::Path) -> sled::Db {
    for _ in 0..200 {
        let opened = sled::Config::new()
            .path(dir)
            .segment_size(openprogram_storage::store::SEGMENT_BYTES)
            .open();
        match opened {
            Ok(db) => return db,
            Err(sled::Error::Io(error)) if error.to_string().contains("could not acquire lock") => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(error) => panic!("raw open: {error}"),
        }
    }
    panic!("raw open: the store stayed locked");
}

/// Moves the materialization mark back to 0, so the next open replays the whole log (as
/// after a crash in a materialization that had written some heads already).
pub fn replay_everything(db: &sled::Db) {
    db.insert(
        openprogram_storage::keys::meta("materialized_through"),
        openprogram_storage::codec::encode(&0u64),
    )
    .expect("reset the mark");
}

/// A log record as the store keeps it: its bytes in a journal segment, which sled's value at
/// its key locates (`0xF1`, the segment's first seq, the offset, the length, big-endian).
pub struct LocatedRecord {
    pub segment: std::path::PathBuf,
    pub offset: u64,
    pub bytes: Vec<u8>,
}

impl LocatedRecord {
    /// The record sled's `value` locates in the journal of the store in `dir`.
    pub fn read(dir: &std::path::Path, value: &[u8]) -> Self {
        use std::os::unix::fs::FileExt;
        assert!(value.len() == 21 && value[0] == 0xF1, "not a location");
        let word = |at: usize| u64::from_be_bytes(value[at..at + 8].try_into().expect("8"));
        let len = u32::from_be_bytes(value[17..21].try_into().expect("4")) as usize;
        let segment = dir.join("journal").join(format!("{:020}.wal", word(1)));
        let mut bytes = vec![0u8; len];
        let file = std::fs::File::open(&segment).expect("segment");
        file.read_exact_at(&mut bytes, word(9)).expect("read");
        LocatedRecord {
            segment,
            offset: word(9),
            bytes,
        }
    }

    /// Writes byte `at` of the record, in place.
    pub fn write_byte(&self, at: usize, byte: u8) {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&self.segment)
            .expect("segment");
        file.write_all_at(&[byte], self.offset + at as u64)
            .expect("write");
        file.sync_all().expect("sync");
    }
}
