//! K-4 at the storage level: a command id is stored once; a retry with the same payload gets
//! the stored record, with another payload a conflict — also across a reopen and when the
//! duplicates race into one group commit (R08).

use openprogram_storage::{
    CommandId, CommandRecord, CommandStatus, EventReader, EventStore, ExecutionId, Outcome, Store,
    Transition, Upsert,
};

use crate::support::*;

fn accepted(command_id: CommandId, execution_id: ExecutionId, payload: u8) -> CommandRecord {
    CommandRecord {
        command_id,
        execution_id,
        kind: "pause".into(),
        payload_hash: [payload; 32],
        status: CommandStatus::Accepted,
        reason: None,
        reason_code: None,
        result_version: None,
        child_execution_id: None,
        accepted_at_ms: 1,
    }
}

fn accept(record: CommandRecord) -> Transition {
    Transition::new(record.execution_id, vec![decided("accept")]).with(Upsert::Command(record))
}

#[tokio::test]
async fn k4_duplicate_command_id_returns_the_stored_outcome() {
    let dir = tempfile::tempdir().expect("tempdir");
    let command_id = CommandId::new();
    let a;
    {
        let store = Store::open(dir.path()).expect("open");
        a = create(&store).await;
        committed(
            store
                .submit(accept(accepted(command_id, a, 1)))
                .await
                .expect("accept"),
        );
        let retry = store
            .submit(accept(accepted(command_id, a, 1)))
            .await
            .expect("retry");
        assert_eq!(
            retry,
            Outcome::DuplicateCommand {
                stored: accepted(command_id, a, 1)
            }
        );
        let applied = CommandRecord {
            status: CommandStatus::Applied,
            result_version: Some(3),
            ..accepted(command_id, a, 1)
        };
        committed(store.submit(accept(applied)).await.expect("apply"));
        assert_eq!(
            all_events(&store, a).len(),
            3,
            "the duplicate appended nothing"
        );
    }
    let store = Store::open(dir.path()).expect("reopen");
    match store
        .submit(accept(accepted(command_id, a, 1)))
        .await
        .expect("retry")
    {
        Outcome::DuplicateCommand { stored } => {
            assert_eq!(stored.status, CommandStatus::Applied);
            assert_eq!(stored.result_version, Some(3));
        }
        other => panic!("expected the stored outcome, got {other:?}"),
    }
    match store
        .submit(accept(accepted(command_id, a, 2)))
        .await
        .expect("other payload")
    {
        Outcome::CommandConflict { stored } => assert_eq!(stored.payload_hash, [1; 32]),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(all_events(&store, a).len(), 3);
}

#[tokio::test]
async fn r08_concurrent_duplicates_apply_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let a = create(&store).await;
    let command_id = CommandId::new();
    let submissions = (0..16).map(|_| store.submit(accept(accepted(command_id, a, 9))));
    let outcomes: Vec<Outcome> = futures::future::join_all(submissions)
        .await
        .into_iter()
        .map(|outcome| outcome.expect("submit"))
        .collect();
    let commits = outcomes
        .iter()
        .filter(|o| matches!(o, Outcome::Committed(_)))
        .count();
    assert_eq!(commits, 1, "{outcomes:?}");
    assert!(outcomes
        .iter()
        .all(|o| matches!(o, Outcome::Committed(_) | Outcome::DuplicateCommand { .. })));
    assert_eq!(all_events(&store, a).len(), 2);
}

#[tokio::test]
async fn k4_a_command_decided_at_once_is_never_decided_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let a = create(&store).await;
    let command_id = CommandId::new();
    let rejected = CommandRecord {
        status: CommandStatus::Rejected,
        reason: Some("not allowed now".into()),
        ..accepted(command_id, a, 4)
    };
    committed(
        store
            .submit(accept(rejected.clone()))
            .await
            .expect("reject at once"),
    );
    // The same outcome again, and then a different outcome: both return the stored record.
    for retry in [
        rejected.clone(),
        CommandRecord {
            status: CommandStatus::Applied,
            reason: None,
            ..rejected.clone()
        },
    ] {
        let outcome = store.submit(accept(retry)).await.expect("retry");
        assert_eq!(
            outcome,
            Outcome::DuplicateCommand {
                stored: rejected.clone()
            }
        );
    }
    assert_eq!(store.command(command_id).expect("command"), Some(rejected));
    assert_eq!(all_events(&store, a).len(), 2, "retries appended nothing");
    // The same id on another execution is a conflict, not a duplicate.
    let b = create(&store).await;
    match store
        .submit(accept(accepted(command_id, b, 4)))
        .await
        .expect("other execution")
    {
        Outcome::CommandConflict { stored } => assert_eq!(stored.execution_id, a),
        other => panic!("expected a conflict, got {other:?}"),
    }
}

/// K-1, K-4 (issue 28): a rejection is stored as its command record alone. The execution's
/// version, head and events stay exactly as they were, so a client that read the version
/// before the rejection still commands with it; the record survives a reopen, a retry gets
/// it back, another payload is a conflict, and its `reason_code` is kept.
#[tokio::test]
async fn k4_a_rejection_changes_nothing_of_its_execution() {
    let dir = tempfile::tempdir().expect("tempdir");
    let command_id = CommandId::new();
    let (a, rejected, head_before, events_before);
    {
        let store = Store::open_with(dir.path(), eager_limits()).expect("open");
        a = create(&store).await;
        head_before = store.head(a).expect("head").expect("exists");
        events_before = all_events(&store, a);
        rejected = CommandRecord {
            status: CommandStatus::Rejected,
            reason: Some("stale expected_version 7: the current version is 1".into()),
            reason_code: Some("stale_version".into()),
            result_version: Some(head_before.version),
            ..accepted(command_id, a, 5)
        };
        let outcome = store
            .submit(Transition::rejection(
                rejected.clone(),
                head_before.version,
                None,
            ))
            .await
            .expect("reject");
        assert_eq!(
            outcome,
            Outcome::Recorded {
                version: head_before.version
            }
        );
        assert_eq!(store.head(a).expect("head"), Some(head_before.clone()));
        assert_eq!(all_events(&store, a), events_before);
        assert_eq!(
            store.command(command_id).expect("read"),
            Some(rejected.clone())
        );
        // The version the client read still commands.
        committed(
            store
                .submit(
                    Transition::new(a, vec![decided("next")]).expect_version(head_before.version),
                )
                .await
                .expect("next"),
        );
    }
    let store = Store::open(dir.path()).expect("reopen");
    assert_eq!(
        store.command(command_id).expect("read"),
        Some(rejected.clone())
    );
    let retry = store
        .submit(Transition::rejection(rejected.clone(), 1, None))
        .await
        .expect("retry");
    assert_eq!(
        retry,
        Outcome::DuplicateCommand {
            stored: rejected.clone()
        }
    );
    let other = CommandRecord {
        payload_hash: [9; 32],
        ..rejected.clone()
    };
    match store
        .submit(Transition::rejection(other, 1, None))
        .await
        .expect("other payload")
    {
        Outcome::CommandConflict { stored } => assert_eq!(stored, rejected),
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(all_events(&store, a).len(), events_before.len() + 1);
    // A rejection of an execution that does not exist writes nothing.
    let unknown = CommandRecord {
        command_id: CommandId::new(),
        execution_id: ExecutionId::new(),
        ..rejected.clone()
    };
    assert!(store
        .submit(Transition::rejection(unknown.clone(), 1, None))
        .await
        .is_err());
    assert_eq!(store.command(unknown.command_id).expect("read"), None);
}

/// Only a rejection may come without events, and only for a command with no record yet;
/// one decided against an older version or by a fenced attempt writes nothing.
#[tokio::test]
async fn s2_a_rejection_alone_is_checked_like_any_transition() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let a = create(&store).await;
    let mut accepted_alone = Transition::rejection(accepted(CommandId::new(), a, 1), 1, None);
    accepted_alone.expected_version = Some(1);
    assert!(
        store.submit(accepted_alone).await.is_err(),
        "accepted, no event"
    );
    let rejected = |command_id| CommandRecord {
        status: CommandStatus::Rejected,
        reason: Some("no".into()),
        ..accepted(command_id, a, 2)
    };
    let stale = rejected(CommandId::new());
    assert_eq!(
        store
            .submit(Transition::rejection(stale.clone(), 7, None))
            .await
            .expect("stale"),
        Outcome::VersionConflict { current: 1 }
    );
    assert_eq!(store.command(stale.command_id).expect("read"), None);
    // An attempt of epoch 3 claims it; a refusal decided by epoch 2 is fenced.
    committed(
        store
            .submit(Transition::new(a, vec![decided("claim")]).by_epoch(3))
            .await
            .expect("claim"),
    );
    let fenced = rejected(CommandId::new());
    assert_eq!(
        store
            .submit(Transition::rejection(fenced.clone(), 2, Some(2)))
            .await
            .expect("fenced"),
        Outcome::Fenced { current_epoch: 3 }
    );
    assert_eq!(store.command(fenced.command_id).expect("read"), None);
    // A command saved accepted is decided by an event, never by a record alone.
    let saved = CommandId::new();
    committed(
        store
            .submit(accept(accepted(saved, a, 2)))
            .await
            .expect("accept"),
    );
    assert!(store
        .submit(Transition::rejection(rejected(saved), 3, None))
        .await
        .is_err());
    assert_eq!(
        store
            .command(saved)
            .expect("read")
            .map(|stored| stored.status),
        Some(CommandStatus::Accepted)
    );
}
