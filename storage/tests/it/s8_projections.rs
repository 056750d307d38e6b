//! S-8: an execution's projection (what a reader needs of its state as of a seq) is a
//! record written with a transition of its own execution, replaced by the next one, read
//! back after a reopen; one naming another execution or a seq past the transition's last
//! event is refused and changes nothing.

use openprogram_storage::{
    Error, EventReader, EventStore, ExecutionId, ProjectionRecord, Store, Transition, Upsert,
};

use crate::support::*;

fn projection(execution_id: ExecutionId, through_seq: u64, state: &[u8]) -> Upsert {
    Upsert::Projection(ProjectionRecord {
        execution_id,
        through_seq,
        format: 1,
        state: state.to_vec(),
    })
}

#[tokio::test]
async fn s8_a_projection_is_replaced_by_the_next_and_survives_a_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let execution_id = {
        let store = Store::open(dir.path()).expect("open");
        let execution_id = create(&store).await;
        assert_eq!(store.projection(execution_id).expect("read"), None);
        for (version, through_seq) in [(1, 1), (2, 3)] {
            let transition = Transition::new(execution_id, vec![decided("a"), decided("b")])
                .expect_version(version)
                .with(projection(execution_id, through_seq, b"state"));
            committed(store.submit(transition).await.expect("submit"));
        }
        let read = store.projection(execution_id).expect("read").expect("some");
        assert_eq!(
            (read.through_seq, read.state.as_slice()),
            (3, &b"state"[..])
        );
        execution_id
    };
    let store = Store::open(dir.path()).expect("reopen");
    let read = store.projection(execution_id).expect("read").expect("some");
    assert_eq!(read.through_seq, 3);
}

#[tokio::test]
async fn s8_a_projection_of_another_execution_or_past_the_head_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    let execution_id = create(&store).await;
    let other = create(&store).await;
    for upsert in [
        projection(other, 1, b"x"),
        projection(execution_id, 3, b"x"),
    ] {
        let transition = Transition::new(execution_id, vec![decided("a")])
            .expect_version(1)
            .with(upsert);
        let refused = store.submit(transition).await;
        assert!(
            matches!(refused, Err(Error::InvalidTransition(_))),
            "{refused:?}"
        );
    }
    let head = store.head(execution_id).expect("head").expect("exists");
    assert_eq!((head.version, head.last_seq), (1, 1), "nothing changed");
    assert_eq!(store.projection(execution_id).expect("read"), None);
    assert_eq!(store.projection(other).expect("read"), None);
}
