//! Issue 37, on both backends: a conversation record (a session's name and compactions) is
//! written by a compare-and-swap of its own — a stale version writes nothing, of many
//! writers at one version exactly one is written, a name or summary past its bound is
//! refused before anything is queued, and the record survives a reopen.

use openprogram_storage::{
    Compaction, ConversationOutcome, ConversationRecord, ConversationWrite, Error, ExecutionId,
    MessageId, SessionId,
};

use crate::conformance_backends::Backend;
use crate::suite;

suite!(
    c3_a_conversation_write_is_a_compare_and_swap_that_survives_a_reopen,
    c3_of_many_conversation_writers_at_one_version_exactly_one_is_written,
    c3_a_conversation_read_during_a_rewrite_is_never_lost,
);

fn named(session_id: SessionId, expected: u64, name: &str) -> ConversationWrite {
    ConversationWrite {
        session_id,
        expected_version: expected,
        record: ConversationRecord {
            name: Some(name.into()),
            ..ConversationRecord::default()
        },
    }
}

async fn c3_a_conversation_write_is_a_compare_and_swap_that_survives_a_reopen(
    backend: &dyn Backend,
) {
    let store = backend.open();
    let session = SessionId::new();
    assert_eq!(store.conversation(session).expect("read"), None);
    let written = store
        .write_conversation(named(session, 0, "first"))
        .await
        .expect("write");
    assert_eq!(written, ConversationOutcome::Written { version: 1 });

    // A stale version writes nothing.
    let stale = store
        .write_conversation(named(session, 0, "stale"))
        .await
        .expect("write");
    assert_eq!(stale, ConversationOutcome::Conflict { current: 1 });
    let stored = store.conversation(session).expect("read").expect("written");
    assert_eq!(
        (stored.session_id, stored.version, stored.name.as_deref()),
        (session, 1, Some("first"))
    );

    // Past a bound: refused, nothing queued.
    let long = store
        .write_conversation(named(session, 1, &"n".repeat(201)))
        .await;
    assert!(matches!(long, Err(Error::InvalidTransition(_))), "{long:?}");

    let through = ExecutionId::new();
    let compaction = Compaction {
        message_id: MessageId::new(),
        through,
        replaces: vec![ExecutionId::new(), through],
        messages: vec![MessageId::new(), MessageId::new()],
        summary: "what was said".into(),
        at_ms: 7,
    };
    let compacted = ConversationWrite {
        session_id: session,
        expected_version: 1,
        record: ConversationRecord {
            compactions: vec![compaction.clone()],
            ..stored
        },
    };
    assert_eq!(
        store.write_conversation(compacted).await.expect("write"),
        ConversationOutcome::Written { version: 2 }
    );
    drop(store);
    let store = backend.open();
    let reopened = store.conversation(session).expect("read").expect("kept");
    assert_eq!(reopened.version, 2);
    assert_eq!(reopened.name.as_deref(), Some("first"));
    assert_eq!(reopened.compactions, vec![compaction]);
    // Another session's is untouched.
    assert_eq!(store.conversation(SessionId::new()).expect("read"), None);
}

async fn c3_of_many_conversation_writers_at_one_version_exactly_one_is_written(
    backend: &dyn Backend,
) {
    let store = backend.open();
    let session = SessionId::new();
    let writes =
        (0..16).map(|writer| store.write_conversation(named(session, 0, &writer.to_string())));
    let outcomes = futures::future::join_all(writes).await;
    let written: Vec<usize> = outcomes
        .iter()
        .enumerate()
        .filter(|(_, outcome)| matches!(outcome, Ok(ConversationOutcome::Written { .. })))
        .map(|(writer, _)| writer)
        .collect();
    assert_eq!(written.len(), 1, "{outcomes:?}");
    assert!(outcomes.iter().all(|outcome| matches!(
        outcome,
        Ok(ConversationOutcome::Written { version: 1 }
            | ConversationOutcome::Conflict { current: 1 })
    )));
    let stored = store.conversation(session).expect("read").expect("written");
    assert_eq!(stored.name, Some(written[0].to_string()));
}

/// While a record is rewritten, a reader gets the version before or the one after — never
/// none, never an older one.
async fn c3_a_conversation_read_during_a_rewrite_is_never_lost(backend: &dyn Backend) {
    let store = std::sync::Arc::<dyn openprogram_storage::EventStore>::from(backend.open());
    let session = SessionId::new();
    store
        .write_conversation(named(session, 0, "v1"))
        .await
        .expect("write");
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (store, done) = (store.clone(), done.clone());
        tokio::spawn(async move {
            let (mut reads, mut last) = (0u64, 1u64);
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                let read = store.conversation(session).expect("read");
                let version = read.map(|record| record.version).unwrap_or(0);
                assert!(version >= last, "read version {version} after {last}");
                last = version;
                reads += 1;
                tokio::task::yield_now().await;
            }
            reads
        })
    };
    for version in 1..100u64 {
        let outcome = store
            .write_conversation(named(session, version, &format!("v{}", version + 1)))
            .await
            .expect("write");
        assert_eq!(
            outcome,
            ConversationOutcome::Written {
                version: version + 1
            }
        );
    }
    done.store(true, std::sync::atomic::Ordering::Release);
    let reads = reader.await.expect("the reader");
    assert!(reads > 0);
}
