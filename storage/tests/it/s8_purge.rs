//! S-8: purging an ended execution. Its first step makes it unreadable (a tombstone, no
//! head, no listing), later steps remove what it owned, a purge refuses an execution that
//! has not ended and changes nothing then, no transition reaches a purged execution, and
//! the log's sweep removes log records only once every frame in them is of a purged
//! execution: the others read on, across a reopen.

use openprogram_storage::{
    Blob, CommandId, CommandRecord, CommandStatus, Error, EventReader, EventStore, ExecutionId,
    ExecutionState, Outcome, PurgeStep, Store, Transition, Upsert, WaitId, WaitKind, WaitRecord,
    WaitStatus,
};

use crate::support::*;

async fn ended(store: &Store, steps: u64) -> ExecutionId {
    let execution_id = create(store).await;
    for version in 1..=steps {
        append(store, execution_id, version, "step").await;
    }
    set_state(store, execution_id, steps + 1, ExecutionState::Completed).await;
    execution_id
}

fn wait_record(execution_id: ExecutionId) -> WaitRecord {
    WaitRecord {
        wait_id: WaitId::new(),
        execution_id,
        kind: WaitKind::Approval,
        prompt: "go?".into(),
        status: WaitStatus::Answered,
        checkpoint_seq: 1,
        attempt_id: None,
        answer: Some("yes".into()),
    }
}

async fn purge_fully(store: &Store, execution_id: ExecutionId) -> usize {
    for steps in 1..10_000 {
        match store.purge(execution_id, None, None).await.expect("purge") {
            PurgeStep::Done => return steps,
            PurgeStep::More => continue,
            other => panic!("purge stopped: {other:?}"),
        }
    }
    panic!("a purge that never ends")
}

#[tokio::test]
async fn s8_purge_removes_an_ended_execution_and_nothing_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (gone, kept, gone_wait, kept_wait) = {
        let store = Store::open_with(dir.path(), eager_limits()).expect("open");
        let gone = ended(&store, 5).await;
        let kept = ended(&store, 5).await;
        let (gone_wait, kept_wait) = (wait_record(gone), wait_record(kept));
        for wait in [&gone_wait, &kept_wait] {
            let version = store.head(wait.execution_id).unwrap().unwrap().version;
            let transition = Transition::new(wait.execution_id, vec![decided("late")])
                .expect_version(version)
                .with(Upsert::Wait(wait.clone()));
            committed(store.submit(transition).await.expect("wait"));
        }
        (gone, kept, gone_wait.wait_id, kept_wait.wait_id)
    };
    let store = Store::open(dir.path()).expect("reopen: everything materialized");
    let session = store.head(gone).unwrap().unwrap().session_id;
    let ended_before: Vec<ExecutionId> = store
        .ended_before(u64::MAX, None, 100)
        .expect("ended")
        .into_iter()
        .map(|(_, id)| id)
        .collect();
    assert!(ended_before.contains(&gone) && ended_before.contains(&kept));
    let kept_events = all_events(&store, kept);

    assert_eq!(purge_fully(&store, gone).await, 1);
    assert_eq!(store.head(gone).expect("head"), None);
    assert!(all_events(&store, gone).is_empty());
    assert_eq!(
        store.wait(gone_wait).expect("wait"),
        None,
        "its records go with it"
    );
    assert!(!store
        .executions_in_session(session)
        .unwrap()
        .contains(&gone));
    let tombstone = store.purged(gone).expect("purged").expect("a tombstone");
    assert!(tombstone.finished);
    assert!(store.purges_unfinished().expect("unfinished").is_empty());
    // It moved on after it ended (the late wait): an entry of its end before that is still
    // listed; retention purges what it lists, which removes the entry.
    for (at, id) in store.ended_before(u64::MAX, None, 100).unwrap() {
        if id == gone {
            assert_eq!(
                store.purge(gone, Some(at), None).await.unwrap(),
                PurgeStep::Done
            );
        }
    }
    assert!(!store
        .ended_before(u64::MAX, None, 100)
        .unwrap()
        .iter()
        .any(|(_, id)| *id == gone));
    assert!(
        !whole_log(&store)
            .iter()
            .any(|event| event.execution_id == gone),
        "the global log reads none of its events"
    );
    // Purged again: done already. A transition to it: refused as purged.
    assert_eq!(
        store.purge(gone, None, None).await.unwrap(),
        PurgeStep::Done
    );
    let late = store
        .submit(Transition::new(gone, vec![decided("late")]).expect_version(8))
        .await;
    assert!(
        matches!(late, Err(Error::Purged(id)) if id == gone),
        "{late:?}"
    );

    // The other execution: all of it still there.
    assert_eq!(all_events(&store, kept), kept_events);
    assert!(store.wait(kept_wait).expect("wait").is_some());
    assert!(store.purged(kept).expect("purged").is_none());
}

#[tokio::test]
async fn s8_purge_refuses_what_has_not_ended_or_is_not_settled() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let running = create(&store).await;
    // Not yet materialized: nothing done until it is.
    let fresh = ended(&store, 1).await;
    assert_eq!(
        store.purge(fresh, None, None).await.unwrap(),
        PurgeStep::Unsettled
    );
    drop(store);
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(
        store.purge(running, None, None).await.unwrap(),
        PurgeStep::NotEnded
    );
    assert!(store.head(running).unwrap().is_some());
    assert!(store.purged(running).unwrap().is_none());
    assert_eq!(
        store.purge(ExecutionId::new(), None, None).await.unwrap(),
        PurgeStep::Unknown
    );
    assert_eq!(purge_fully(&store, fresh).await, 1);
}

#[tokio::test]
async fn s8_a_large_purge_goes_in_bounded_steps() {
    let dir = tempfile::tempdir().expect("tempdir");
    let execution_id = {
        let store = Store::open(dir.path()).expect("open");
        let execution_id = ended(&store, 1).await;
        // 1,500 refused commands: records it owns, more than one step removes.
        let version = store.head(execution_id).unwrap().unwrap().version;
        let refusals = (0..1_500).map(|_| {
            let record = CommandRecord {
                command_id: CommandId::new(),
                execution_id,
                kind: "pause".into(),
                payload_hash: [0; 32],
                status: CommandStatus::Rejected,
                reason: Some("not available".into()),
                reason_code: Some("not_available".into()),
                result_version: Some(version),
                child_execution_id: None,
                accepted_at_ms: 1,
            };
            store.submit(Transition::rejection(record, version, None))
        });
        for outcome in futures::future::join_all(refusals).await {
            let outcome = outcome.expect("refusal");
            assert!(matches!(outcome, Outcome::Recorded { .. }), "{outcome:?}");
        }
        execution_id
    };
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(
        store.purge(execution_id, None, None).await.unwrap(),
        PurgeStep::More
    );
    assert_eq!(
        store.head(execution_id).unwrap(),
        None,
        "unreadable after the first step"
    );
    assert_eq!(store.purges_unfinished().unwrap(), vec![execution_id]);
    drop(store);
    // A reopen between steps: the purge goes on from what is left.
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(purge_fully(&store, execution_id).await, 1);
    assert!(store.purges_unfinished().unwrap().is_empty());
}

#[tokio::test]
async fn s8_the_sweep_removes_log_records_of_purged_executions_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (purged, live) = {
        let store = Store::open(dir.path()).expect("open");
        let mut purged = Vec::new();
        for _ in 0..40 {
            purged.push(ended(&store, 20).await);
        }
        // One live execution whose frames share log records with them.
        let live = create(&store).await;
        append(&store, live, 1, "shared").await;
        for _ in 0..40 {
            purged.push(ended(&store, 20).await);
        }
        (purged, live)
    };
    let store = Store::open(dir.path()).expect("reopen");
    let live_events = all_events(&store, live);
    for execution_id in &purged {
        purge_fully(&store, *execution_id).await;
    }
    let mut from = 0;
    let mut deleted = 0;
    loop {
        let step = store.sweep_log(from, 16).await.expect("sweep");
        deleted += step.records_deleted;
        match step.next_position {
            Some(next) => from = next,
            None => break,
        }
    }
    assert!(
        deleted > 0,
        "log records of purged executions only were removed"
    );
    assert_eq!(all_events(&store, live), live_events);
    drop(store);
    let store = Store::open(dir.path()).expect("reopen after the sweep");
    assert_eq!(all_events(&store, live), live_events);
    let log = whole_log(&store);
    assert!(
        log.iter().all(|event| event.execution_id == live),
        "only the live one is left"
    );
    let second = store.sweep_log(0, usize::MAX).await.expect("sweep again");
    assert_eq!(second.records_deleted, 0, "nothing more to remove");
}

#[tokio::test]
async fn s8_compaction_copies_what_is_kept_into_a_smaller_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (from, to) = (dir.path().join("from"), dir.path().join("to"));
    let (purged, live, kept) = {
        let store = Store::open(&from).expect("open");
        let mut ended_ = Vec::new();
        for _ in 0..60 {
            ended_.push(ended(&store, 30).await);
        }
        let live = create(&store).await;
        append(&store, live, 1, "live").await;
        (ended_.split_off(6), live, ended_)
    };
    let live_events = {
        let store = Store::open(&from).expect("reopen");
        for execution_id in &purged {
            purge_fully(&store, *execution_id).await;
        }
        let mut from_position = 0;
        while let Some(next) = store
            .sweep_log(from_position, 64)
            .await
            .unwrap()
            .next_position
        {
            from_position = next;
        }
        all_events(&store, live)
    };
    let report = openprogram_storage::compact::compact(&from, &to, |_| {}).expect("compaction");
    assert!(report.bytes_after < report.bytes_before, "{report:?}");
    let store = Store::open(&to).expect("the compacted store opens (S-7 included)");
    assert_eq!(all_events(&store, live), live_events);
    for execution_id in &kept {
        assert_eq!(all_events(&store, *execution_id).len(), 32);
    }
    for execution_id in &purged {
        assert!(store.purged(*execution_id).unwrap().is_some());
    }
    // The old store is left as it was, and a compaction never writes into a used directory.
    drop(store);
    assert!(Store::open(&from).is_ok());
    assert!(openprogram_storage::compact::compact(&from, &to, |_| {}).is_err());
}

/// S-9: a blob goes with the purge of the last execution that uses it, and not before.
#[tokio::test]
async fn s9_a_blob_goes_with_the_last_execution_that_uses_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (shared, own) = (
        Blob::new(b"used by both".to_vec()),
        Blob::new(b"used by one".to_vec()),
    );
    let (a, b) = {
        let store = Store::open_with(dir.path(), eager_limits()).expect("open");
        let (a, b) = (create(&store).await, create(&store).await);
        for (execution_id, blobs) in [(a, vec![&shared, &own]), (b, vec![&shared])] {
            let mut transition = Transition::new(execution_id, vec![decided("output")]);
            for blob in blobs {
                transition = transition.with(Upsert::Blob(blob.clone()));
            }
            committed(
                store
                    .submit(transition.expect_version(1))
                    .await
                    .expect("blob"),
            );
            set_state(&store, execution_id, 2, ExecutionState::Completed).await;
        }
        (a, b)
    };
    // Reopened: everything written to its own keys, so the purges are settled.
    let store = Store::open(dir.path()).expect("reopen");
    assert!(store.blob(own.hash()).expect("read").is_some());
    purge_fully(&store, a).await;
    assert_eq!(
        store.blob(own.hash()).expect("read"),
        None,
        "only a used it"
    );
    assert_eq!(
        store.blob(shared.hash()).expect("read").as_deref(),
        Some(shared.bytes()),
        "b still uses it"
    );
    purge_fully(&store, b).await;
    assert_eq!(store.blob(shared.hash()).expect("read"), None);
}
