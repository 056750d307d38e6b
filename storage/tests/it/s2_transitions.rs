//! S-2: a transition is one atomic write with its version check and fencing check.

use openprogram_storage::{
    Blob, CommandId, CommandRecord, CommandStatus, EventReader, EventStore, ExecutionId, Limits,
    Outcome, Store, Transition, Upsert,
};

use crate::support::*;

#[tokio::test]
async fn s2_cas_conflict_returns_current_version_and_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let a = create(&store).await;
    append(&store, a, 1, "first").await;
    let stale = Transition::new(a, vec![decided("stale")]).expect_version(1);
    assert_eq!(
        store.submit(stale).await.expect("submit"),
        Outcome::VersionConflict { current: 2 }
    );
    assert_eq!(all_events(&store, a).len(), 2);
    assert_eq!(store.head(a).expect("head").map(|h| h.version), Some(2));
    // Creating an existing execution is a conflict too.
    let again = Transition::create(head(a), vec![decided("again")]);
    assert_eq!(
        store.submit(again).await.expect("submit"),
        Outcome::VersionConflict { current: 2 }
    );
}

/// A queue bound of 1 and 64 submissions made at once: the first are queued when `submit` is
/// called, the rest wait for room when first polled; every one commits, none is lost.
#[tokio::test]
async fn s2_a_full_queue_makes_submit_wait_and_every_transition_commits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let limits = Limits {
        queue_len_max: 1,
        ..Default::default()
    };
    let store = Store::open_with(dir.path(), limits).expect("open");
    let ids: Vec<_> = (0..64).map(|_| ExecutionId::new()).collect();
    let submitted: Vec<_> = ids
        .iter()
        .map(|id| store.submit(Transition::create(head(*id), vec![decided("admitted")])))
        .collect();
    for outcome in futures::future::join_all(submitted).await {
        assert_eq!(committed(outcome.expect("submit")).version, 1);
    }
    for id in ids {
        assert_eq!(store.head(id).expect("head").map(|h| h.version), Some(1));
    }
}

#[tokio::test]
async fn s2_fenced_writer_is_rejected_and_newer_epoch_claims() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let a = create(&store).await;
    let claim = Transition::new(a, vec![decided("attempt 2")])
        .expect_version(1)
        .by_epoch(2);
    committed(store.submit(claim).await.expect("claim"));
    // The stale attempt is fenced even with the right version.
    let stale = Transition::new(a, vec![decided("attempt 1")])
        .expect_version(2)
        .by_epoch(1);
    assert_eq!(
        store.submit(stale).await.expect("submit"),
        Outcome::Fenced { current_epoch: 2 }
    );
    let current = Transition::new(a, vec![decided("attempt 2 again")])
        .expect_version(2)
        .by_epoch(2);
    committed(store.submit(current).await.expect("current"));
    let head = store.head(a).expect("head").expect("exists");
    assert_eq!((head.version, head.fencing_epoch), (3, 2));
    let texts: Vec<u64> = all_events(&store, a)
        .iter()
        .map(|e| e.writer_epoch)
        .collect();
    assert_eq!(texts, vec![0, 2, 2]);
}

#[tokio::test]
async fn s2_rejected_transition_leaves_no_partial_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let limits = Limits {
        transition_bytes_max: 4096,
        ..Default::default()
    };
    let store = Store::open_with(dir.path(), limits).expect("open");
    let a = create(&store).await;
    let blob = Blob::new(b"attached".to_vec());
    let too_big = Transition::new(a, vec![decided(&"x".repeat(8192))])
        .expect_version(1)
        .with(Upsert::Blob(blob.clone()));
    match store.submit(too_big).await {
        Err(openprogram_storage::Error::PayloadTooLarge {
            what: "transition", ..
        }) => {}
        other => panic!("expected PayloadTooLarge, got {other:?}"),
    }
    assert_eq!(store.blob(blob.hash()).expect("blob"), None);
    assert_eq!(all_events(&store, a).len(), 1);
    // A version conflict racing a good transition (in its group or the next) does not take
    // it down.
    let good = store.submit(Transition::new(a, vec![decided("good")]).expect_version(1));
    let bad = store.submit(Transition::new(a, vec![decided("bad")]).expect_version(1));
    let (good, bad) = futures::join!(good, bad);
    committed(good.expect("good"));
    assert_eq!(bad.expect("bad"), Outcome::VersionConflict { current: 2 });
    let texts: Vec<String> = all_events(&store, a)
        .into_iter()
        .map(|e| format!("{:?}", e.event))
        .collect();
    assert!(
        texts.iter().all(|text| !text.contains("\"bad\"")),
        "{texts:?}"
    );
}

#[tokio::test]
async fn s2_transition_must_carry_an_event_and_name_known_execution() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let a = create(&store).await;
    assert!(matches!(
        store.submit(Transition::new(a, vec![])).await,
        Err(openprogram_storage::Error::InvalidTransition(_))
    ));
    let unknown = openprogram_storage::ExecutionId::new();
    assert!(matches!(
        store.submit(Transition::new(unknown, vec![decided("x")])).await,
        Err(openprogram_storage::Error::UnknownExecution(id)) if id == unknown
    ));
    assert_eq!(store.head(unknown).expect("head"), None);
}

#[tokio::test]
async fn s2_a_write_by_no_attempt_cannot_replace_an_existing_head() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let a = create(&store).await;
    let mut next = store.head(a).expect("head").expect("exists");
    next.state = openprogram_storage::ExecutionState::Completed;
    let transition = Transition::new(a, vec![decided("no attempt")]).with_head(next);
    assert!(matches!(
        store.submit(transition).await,
        Err(openprogram_storage::Error::InvalidTransition(_))
    ));
    assert_eq!(
        store.head(a).expect("head").map(|h| h.state),
        Some(openprogram_storage::ExecutionState::Queued)
    );
}

#[tokio::test]
async fn r09_concurrent_writers_with_same_expected_version_have_one_winner() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let a = create(&store).await;
    for round in 1..=5u64 {
        let attempts = (0..8).map(|writer| {
            let store = store.clone();
            tokio::spawn(async move {
                let text = format!("round {round} writer {writer}");
                store
                    .submit(Transition::new(a, vec![decided(&text)]).expect_version(round))
                    .await
            })
        });
        let outcomes: Vec<Outcome> = futures::future::join_all(attempts)
            .await
            .into_iter()
            .map(|joined| joined.expect("task").expect("submit"))
            .collect();
        let winners = outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Committed(_)))
            .count();
        assert_eq!(winners, 1, "round {round}: {outcomes:?}");
        for outcome in &outcomes {
            if !matches!(outcome, Outcome::Committed(_)) {
                assert_eq!(outcome, &Outcome::VersionConflict { current: round + 1 });
            }
        }
    }
}

#[tokio::test]
async fn s2_records_commit_with_the_transition() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open_with(dir.path(), eager_limits()).expect("open");
    let a = create(&store).await;
    let command = CommandRecord {
        command_id: CommandId::new(),
        execution_id: a,
        kind: "pause".into(),
        payload_hash: [7; 32],
        status: CommandStatus::Accepted,
        reason: None,
        reason_code: None,
        result_version: None,
        child_execution_id: None,
        accepted_at_ms: 0,
    };
    let transition =
        Transition::new(a, vec![decided("with command")]).with(Upsert::Command(command.clone()));
    committed(store.submit(transition).await.expect("submit"));
    assert_eq!(
        store.command(command.command_id).expect("command"),
        Some(command)
    );
}

#[test]
fn s2_zero_bounds_are_refused_at_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let limits = Limits {
        batch_len_max: 0,
        ..Default::default()
    };
    match Store::open_with(dir.path(), limits) {
        Err(error @ openprogram_storage::Error::InvalidLimits(_)) => {
            assert_eq!(error.code(), "invalid_limits");
            assert!(error.to_string().contains("batch_len_max"), "{error}");
        }
        other => panic!("expected InvalidLimits, got {other:?}"),
    }
}
