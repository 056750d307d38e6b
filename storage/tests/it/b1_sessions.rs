//! The executions-by-session index (B-1's reads start from a session): every execution of a
//! session is listed, whether its creation is still in the overlay, materialized, or in a
//! log tail replayed at open; a store written before the index gets it from its migration.

use openprogram_storage::{EventReader, EventStore, ExecutionId, SessionId, Store, Transition};

use crate::support::*;

async fn create_in(store: &Store, session_id: SessionId) -> ExecutionId {
    let execution_id = ExecutionId::new();
    let mut new_head = head(execution_id);
    new_head.session_id = session_id;
    let outcome = store
        .submit(Transition::create(new_head, vec![decided("admitted")]))
        .await
        .expect("create");
    committed(outcome);
    execution_id
}

fn sorted(mut ids: Vec<ExecutionId>) -> Vec<ExecutionId> {
    ids.sort();
    ids
}

#[tokio::test]
async fn b1_executions_are_listed_by_session_before_and_after_materialization_and_reopen() {
    for limits in [openprogram_storage::Limits::default(), eager_limits()] {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mine, theirs) = (SessionId::new(), SessionId::new());
        let mut expected = Vec::new();
        {
            let store = Store::open_with(dir.path(), limits.clone()).expect("open");
            for _ in 0..3 {
                expected.push(create_in(&store, mine).await);
            }
            create_in(&store, theirs).await;
            // Fresh in the overlay (default limits) or on disk already (eager ones).
            assert_eq!(store.sessions().expect("sessions").len(), 2);
            assert_eq!(
                sorted(store.executions_in_session(mine).expect("list")),
                sorted(expected.clone())
            );
        }
        let store = Store::open_with(dir.path(), limits).expect("reopen");
        assert_eq!(
            sorted(store.executions_in_session(mine).expect("list")),
            sorted(expected.clone())
        );
        assert_eq!(store.executions_in_session(theirs).expect("list").len(), 1);
        assert!(store
            .executions_in_session(SessionId::new())
            .expect("list")
            .is_empty());
        let mut expected_sessions = vec![(mine, 3), (theirs, 1)];
        expected_sessions.sort();
        assert_eq!(store.sessions().expect("sessions"), expected_sessions);
    }
}

/// A store of schema 1 (no index): the migration to 2 lists every execution.
#[tokio::test]
async fn b1_a_store_written_before_the_index_is_migrated() {
    let dir = tempfile::tempdir().expect("tempdir");
    let session = SessionId::new();
    let mut expected = Vec::new();
    {
        let store = Store::open(dir.path()).expect("open");
        for _ in 0..4 {
            expected.push(create_in(&store, session).await);
        }
    }
    {
        // Back to schema 1: drop the index and the version.
        let db = raw_open(dir.path());
        let index: Vec<_> = db
            .scan_prefix([openprogram_storage::keys::BY_SESSION])
            .keys()
            .map(|key| key.expect("key"))
            .collect();
        assert_eq!(
            index.len(),
            4,
            "the index is written by the materialization"
        );
        for key in index {
            db.remove(key).expect("remove");
        }
        let version = openprogram_storage::keys::meta("schema_version");
        db.insert(&version, openprogram_storage::codec::encode(&1u32))
            .expect("insert");
        db.flush().expect("flush");
    }
    let store = Store::open(dir.path()).expect("migrating open");
    assert_eq!(
        sorted(store.executions_in_session(session).expect("list")),
        sorted(expected)
    );
}
