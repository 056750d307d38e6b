//! K-4 at the storage level: a command id is stored once; a retry with the same payload gets
//! the stored record, with another payload a conflict — also across a reopen and when the
//! duplicates race into one group commit (R08).

use openprogram_storage::{
    CommandId, CommandRecord, CommandStatus, EventStore, ExecutionId, Outcome, Store, Transition,
    Upsert,
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
