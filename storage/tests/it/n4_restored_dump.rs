//! S-7 on PostgreSQL (N-4): a node keeps, beside its own data, the highest position it saw
//! acknowledged, and refuses a database that holds less — one restored from an older
//! dump — unless it accepts the loss. The test takes a real dump with `pg_dump`, runs more
//! work, restores the dump into a new database with `psql` and opens a node on it.

use std::path::Path;

use openprogram_storage::ExecutionState;
use openprogram_storage::{Error, EventStore, Limits, PgStore, PurgeStep};

use crate::pg_cluster::{self, client_program};
use crate::support::*;

fn open_node(url: &str, dir: &Path, accept_loss: bool) -> openprogram_storage::Result<PgStore> {
    PgStore::open_node(url, Limits::default(), dir, accept_loss).map(|(store, report)| {
        assert_eq!(
            report.is_some(),
            accept_loss,
            "a report only when a loss is accepted"
        );
        store
    })
}

/// Purges an ended execution whole.
async fn purge(store: &PgStore, execution_id: openprogram_storage::ExecutionId) {
    loop {
        match store.purge(execution_id, None, None).await.expect("purge") {
            PurgeStep::Done => return,
            PurgeStep::More => continue,
            other => panic!("purging: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL (apt-get install postgresql); run with \
            `cargo test --workspace -- --include-ignored`"]
async fn n4_a_node_refuses_a_database_restored_from_an_older_dump() {
    let url = pg_cluster::database();
    let node = tempfile::tempdir().expect("node dir");
    // Two more nodes of the same database: one that works after the dump too, one that
    // does not.
    let (second, third) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let dump = node.path().join("dump.sql");
    let a = {
        let store = open_node(&url, node.path(), false).expect("open");
        let a = create(&store).await;
        append(&store, a, 1, "before the dump").await;
        a
    };
    drop(open_node(&url, third.path(), false).expect("the third node"));
    client_program("pg_dump", &["-f", dump.to_str().expect("path"), &url]);
    {
        let store = open_node(&url, second.path(), false).expect("the second node");
        let c = create(&store).await;
        append(&store, c, 1, "on the second node, after the dump").await;
    }
    let acknowledged = {
        let store = open_node(&url, node.path(), false).expect("reopen");
        append(&store, a, 2, "after the dump").await;
        // The newest events purged: the database still knows it held them.
        let b = create(&store).await;
        set_state(&store, b, 1, ExecutionState::Completed).await;
        let newest = settled_log(&store, 5).last().expect("events").position;
        purge(&store, b).await;
        newest
    };
    drop(open_node(&url, node.path(), false).expect("a purge loses nothing acknowledged"));

    let restored = pg_cluster::database();
    client_program(
        "psql",
        &[
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-f",
            dump.to_str().expect("path"),
            &restored,
        ],
    );
    // As restored into another server, whose transaction ids count from lower again.
    client_program(
        "psql",
        &[
            "-q",
            "-c",
            "UPDATE op_meta SET xid_base = xid_base + 1000000000",
            &restored,
        ],
    );
    let refused = open_node(&restored, node.path(), false).map(|_| ());
    let Err(Error::AcknowledgedLost {
        acknowledged_through,
        present_through,
    }) = refused
    else {
        panic!("a database behind the node's mark is refused, got {refused:?}");
    };
    assert!(
        acknowledged_through >= acknowledged,
        "{acknowledged_through} < {acknowledged}"
    );
    assert!(present_through < acknowledged_through);
    let message = Error::AcknowledgedLost {
        acknowledged_through,
        present_through,
    }
    .to_string();
    assert!(message.contains("--accept-loss"), "{message}");

    let (store, report) = PgStore::open_node(&restored, Limits::default(), node.path(), true)
        .expect("accept the loss");
    let report = report.expect("a report of the loss");
    assert_eq!(report.acknowledged_through, Some(acknowledged_through));
    assert_eq!(report.present_through, present_through);
    assert_eq!(
        all_events(&store, a).len(),
        2,
        "what the dump held is served"
    );
    let next = append(&store, a, 2, "after the restore").await;
    assert!(
        *next.positions.start() > acknowledged_through,
        "a position acknowledged before never names another event"
    );
    drop(store);
    drop(open_node(&restored, node.path(), false).expect("the loss was accepted once"));

    // The second node acknowledged after the dump too: it finds its loss under the
    // database's retired identity, and refuses in turn. The third lost nothing it answered.
    let refused = open_node(&restored, second.path(), false).map(|_| ());
    assert!(
        matches!(refused, Err(Error::AcknowledgedLost { .. })),
        "the second node lost history too: {refused:?}"
    );
    drop(open_node(&restored, third.path(), false).expect("the third node lost nothing"));
    drop(open_node(&restored, second.path(), true).expect("the second node accepts"));
    drop(open_node(&restored, second.path(), false).expect("and serves on"));
    for dir in [&node, &second, &third] {
        let marks = std::fs::read_dir(dir.path())
            .expect("the node's directory")
            .flatten()
            .filter(|entry| {
                entry
                    .file_name()
                    .to_string_lossy()
                    .starts_with("acknowledged-")
            })
            .count();
        assert_eq!(
            marks, 1,
            "one mark a node, under the database's new identity"
        );
    }

    // Another database is another database: its mark starts from what it holds.
    drop(open_node(&pg_cluster::database(), node.path(), false).expect("a new database"));
}
