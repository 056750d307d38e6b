//! N-2: positions in PostgreSQL are counted from each group's transaction id, without a
//! lock every group waits for, so a group may commit after another that holds higher
//! positions. `log_after` stops below the oldest transaction still running: these tests
//! hold one open on a connection of their own and watch the log stop there.

use openprogram_storage::{EventReader, EventStore, PgStore, Transition};

use crate::pg_cluster;
use crate::support::*;

/// A client of the test's own, beside the store's connections.
fn client(url: &str) -> postgres::Client {
    postgres::Client::connect(url, postgres::NoTls).expect("connect")
}

/// Runs `work` with a client on a thread of its own: the blocking client refuses to run on
/// a runtime thread.
async fn with_client<T: Send + 'static>(
    url: &str,
    work: impl FnOnce(&mut postgres::Client) -> T + Send + 'static,
) -> T {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || work(&mut client(&url)))
        .await
        .expect("client thread")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL (apt-get install postgresql); run with \
            `cargo test --workspace -- --include-ignored`"]
async fn n2_the_whole_log_stops_below_a_transaction_still_running() {
    let url = pg_cluster::database();
    let store = PgStore::open(&url).expect("open");
    let a = create(&store).await;
    let before = settled_log(&store, 1);
    assert_eq!(before.len(), 1);
    // A transaction that took its id before the next group and has not ended, as a group
    // of another node still writing would.
    let (hold, held) = std::sync::mpsc::channel::<()>();
    let (took, taken) = tokio::sync::oneshot::channel();
    let holder = tokio::task::spawn_blocking({
        let url = url.clone();
        move || {
            let mut client = client(&url);
            let mut open = client.transaction().expect("begin");
            open.query_one("SELECT pg_current_xact_id()", &[])
                .expect("take an id");
            took.send(()).expect("tell");
            held.recv().ok();
            open.rollback().expect("rollback");
        }
    });
    taken.await.expect("the holder took its id");
    let later = append(&store, a, 1, "committed while an older transaction runs").await;
    assert_eq!(
        all_events(&store, a).len(),
        2,
        "its execution reads it at once"
    );
    assert_eq!(
        whole_log(&store),
        before,
        "the whole log stops below the running transaction"
    );
    assert_eq!(store.log_after(0, 10).expect("page"), before);
    hold.send(()).expect("release");
    holder.await.expect("holder");
    let after = settled_log(&store, 2);
    assert_eq!(after.len(), 2);
    assert_eq!(after[1].position, *later.positions.start());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs PostgreSQL (apt-get install postgresql); run with \
            `cargo test --workspace -- --include-ignored`"]
async fn n2_transaction_ids_that_went_back_are_renumbered_at_the_next_opening() {
    let url = pg_cluster::database();
    let (a, last) = {
        let store = PgStore::open(&url).expect("open");
        let a = create(&store).await;
        let events = (0..3).map(|i| decided(&format!("{i}"))).collect();
        let transition = Transition::new(a, events).expect_version(1);
        committed(store.submit(transition).await.expect("submit"));
        let last = settled_log(&store, 4).last().expect("events").position;
        // As if the database were restored from a dump: its transaction ids now count
        // from below the store's base.
        with_client(&url, |client| {
            client
                .execute("UPDATE op_meta SET xid_base = xid_base + 1000000000", &[])
                .expect("move the base")
        })
        .await;
        let refused = store
            .submit(Transition::new(a, vec![decided("refused")]).expect_version(2))
            .await;
        assert!(
            matches!(&refused, Err(openprogram_storage::Error::Database(message)) if message.contains("restored")),
            "{refused:?}"
        );
        (a, last)
    };
    let store = PgStore::open(&url).expect("reopen");
    let next = append(&store, a, 2, "after the renumbering").await;
    assert!(*next.positions.start() > last);
    let log = settled_log(&store, 5);
    assert_eq!(log.len(), 5);
    assert!(log
        .windows(2)
        .all(|pair| pair[0].position < pair[1].position));
}
