//! Issue 37, on both backends: a transition's `SessionWrite` is a compare-and-swap on its
//! session's record in the same atomic write as the transition — a stale version writes
//! nothing (not the record, not the events), a check without a record changes nothing, of
//! many writers at the same version exactly one commits, and the record survives a reopen.

use openprogram_storage::{
    ExecutionState, Outcome, SessionGrant, SessionId, SessionRecord, SessionWrite, Transition,
    WaitId,
};

use crate::conformance_backends::Backend;
use crate::suite;
use crate::support::*;

suite!(
    s2_a_session_write_commits_with_its_transition_or_not_at_all,
    s2_of_many_session_writers_at_one_version_exactly_one_commits,
);

fn grant(tool: &str, execution: openprogram_storage::ExecutionId) -> SessionGrant {
    SessionGrant {
        grant_id: WaitId::new(),
        tool: tool.into(),
        granted_by: execution,
        revoked: false,
    }
}

fn write(session_id: SessionId, expected: u64, record: Option<SessionRecord>) -> SessionWrite {
    SessionWrite {
        session_id,
        expected_version: expected,
        record,
    }
}

async fn s2_a_session_write_commits_with_its_transition_or_not_at_all(backend: &dyn Backend) {
    let store = backend.open();
    let a = create(&*store).await;
    let session = store.head(a).expect("head").expect("exists").session_id;
    assert_eq!(store.session(session).expect("read"), None);
    let granted = SessionRecord {
        grants: vec![grant("shell", a)],
        ..SessionRecord::default()
    };
    let first = Transition::new(a, vec![decided("grant")]).with_session(write(
        session,
        0,
        Some(granted.clone()),
    ));
    committed(store.submit(first).await.expect("submit"));
    let stored = store.session(session).expect("read").expect("written");
    assert_eq!((stored.version, stored.session_id), (1, session));
    assert_eq!(stored.grants, granted.grants);

    // A stale version: neither the record nor the events are written.
    let events_before = all_events(&*store, a).len();
    let stale = Transition::new(a, vec![decided("stale")]).with_session(write(
        session,
        0,
        Some(SessionRecord::default()),
    ));
    assert_eq!(
        store.submit(stale).await.expect("submit"),
        Outcome::SessionConflict { current: 1 }
    );
    assert_eq!(all_events(&*store, a).len(), events_before);
    assert_eq!(
        store.session(session).expect("read").expect("kept").grants,
        granted.grants
    );

    // A check alone commits the transition and leaves the record as it was.
    let check = Transition::new(a, vec![decided("relied on the grant")])
        .with_session(write(session, 1, None));
    committed(store.submit(check).await.expect("submit"));
    assert_eq!(
        store.session(session).expect("read").expect("kept").version,
        1
    );
    let stale_check =
        Transition::new(a, vec![decided("stale check")]).with_session(write(session, 7, None));
    assert_eq!(
        store.submit(stale_check).await.expect("submit"),
        Outcome::SessionConflict { current: 1 }
    );

    // Revoked, then read back after a reopen.
    let mut revoked = stored.clone();
    revoked.grants[0].revoked = true;
    let revoke =
        Transition::new(a, vec![decided("revoke")]).with_session(write(session, 1, Some(revoked)));
    committed(store.submit(revoke).await.expect("submit"));
    let version = store.head(a).expect("head").expect("exists").version;
    set_state(&*store, a, version, ExecutionState::Completed).await;
    drop(store);
    let store = backend.open();
    let reopened = store.session(session).expect("read").expect("kept");
    assert_eq!(reopened.version, 2);
    assert!(reopened.grants[0].revoked);
    // Another session is untouched.
    assert_eq!(store.session(SessionId::new()).expect("read"), None);
}

async fn s2_of_many_session_writers_at_one_version_exactly_one_commits(backend: &dyn Backend) {
    let store = backend.open();
    let first = create(&*store).await;
    let session = store.head(first).expect("head").expect("exists").session_id;
    // Sixteen executions of one session, each writing the session record at version 0 at
    // once: they share groups, committers and (in PostgreSQL) locks.
    let mut executions = vec![first];
    for _ in 1..16 {
        let execution = openprogram_storage::ExecutionId::new();
        let mut created = head(execution);
        created.session_id = session;
        committed(
            store
                .submit(Transition::create(created, vec![decided("admitted")]))
                .await
                .expect("create"),
        );
        executions.push(execution);
    }
    let submissions =
        executions.iter().map(|execution| {
            let record = SessionRecord {
                foreground: Some(*execution),
                ..SessionRecord::default()
            };
            store.submit(
                Transition::new(*execution, vec![decided("take the foreground")])
                    .with_session(write(session, 0, Some(record))),
            )
        });
    let outcomes = futures::future::join_all(submissions).await;
    let winners: Vec<_> = outcomes
        .iter()
        .zip(&executions)
        .filter(|(outcome, _)| matches!(outcome, Ok(Outcome::Committed(_))))
        .map(|(_, execution)| *execution)
        .collect();
    assert_eq!(winners.len(), 1, "{outcomes:?}");
    assert!(outcomes.iter().all(|outcome| matches!(
        outcome,
        Ok(Outcome::Committed(_) | Outcome::SessionConflict { current: 1 })
    )));
    let stored = store.session(session).expect("read").expect("written");
    assert_eq!(stored.foreground, Some(winners[0]));
    assert_eq!(stored.version, 1);
}
