//! S-5: blobs are stored once by content hash, size-limited with a clear error, and checked
//! against their hash when read.

use openprogram_storage::{
    Blob, Error, EventReader, EventStore, Limits, Store, Transition, Upsert,
};

use crate::support::*;

#[tokio::test]
async fn s5_blob_is_stored_by_content_and_size_limited() {
    let dir = tempfile::tempdir().expect("tempdir");
    let limits = Limits {
        blob_bytes_max: 1024,
        ..Default::default()
    };
    let blob = Blob::new(b"process output chunk".to_vec());
    {
        let store = Store::open_with(dir.path(), limits.clone()).expect("open");
        let a = create(&store).await;
        for version in 1..=2 {
            let transition = Transition::new(a, vec![decided("chunk")])
                .expect_version(version)
                .with(Upsert::Blob(blob.clone()));
            committed(store.submit(transition).await.expect("submit"));
        }
        assert_eq!(
            store.blob(blob.hash()).expect("blob").as_deref(),
            Some(blob.bytes())
        );
        let big = Blob::new(vec![0u8; 1025]);
        let transition = Transition::new(a, vec![decided("big")]).with(Upsert::Blob(big.clone()));
        match store.submit(transition).await {
            Err(
                error @ Error::PayloadTooLarge {
                    what: "blob",
                    len: 1025,
                    max: 1024,
                },
            ) => {
                assert_eq!(error.code(), "payload_too_large");
            }
            other => panic!("expected PayloadTooLarge, got {other:?}"),
        }
        assert_eq!(store.blob(big.hash()).expect("blob"), None);
        assert_eq!(all_events(&store, a).len(), 3);
    }
    {
        let db = raw_open(dir.path());
        db.insert(
            openprogram_storage::keys::blob(blob.hash()),
            &b"tampered"[..],
        )
        .expect("insert");
        db.flush().expect("flush");
    }
    let store = Store::open_with(dir.path(), limits).expect("reopen");
    assert!(matches!(
        store.blob(blob.hash()),
        Err(Error::Corrupted { tree: "blobs", .. })
    ));
}

/// S-5: a large admission input is stored once, as a blob, however many executions share
/// it; both readers of the log (an execution's events, the global log) give it back whole,
/// before and after a reopen; a small one stays inline.
#[tokio::test]
async fn s5_a_large_admission_input_is_one_blob_and_reads_back_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let large = format!("{{\"script\": \"{}\"}}", "x".repeat(4096));
    let inputs = [large.as_str(), large.as_str(), "{\"small\": true}"];
    let mut executions = Vec::new();
    {
        let store = Store::open_with(dir.path(), eager_limits()).expect("open");
        for input in inputs {
            let execution_id = openprogram_storage::ExecutionId::new();
            let transition = Transition::create(head(execution_id), vec![admission(input)]);
            committed(store.submit(transition).await.expect("submit"));
            executions.push(execution_id);
        }
        check_inputs(&store, &executions, &inputs);
        let hash = openprogram_storage::BlobHash::of(large.as_bytes());
        assert_eq!(
            store.blob(hash).expect("blob").as_deref(),
            Some(large.as_bytes())
        );
    }
    let store = Store::open(dir.path()).expect("reopen");
    check_inputs(&store, &executions, &inputs);
    drop(store);
    let db = raw_open(dir.path());
    let blob_prefix = openprogram_storage::keys::blob(openprogram_storage::BlobHash([0; 32]))[0];
    let blobs = db.scan_prefix([blob_prefix]).count();
    assert_eq!(
        blobs, 1,
        "the two large inputs are one blob; the small one none"
    );
}

fn check_inputs(store: &Store, executions: &[openprogram_storage::ExecutionId], inputs: &[&str]) {
    let input_of = |event: &openprogram_storage::Event| match event {
        openprogram_storage::Event::Admitted { input, .. } => input.clone(),
        other => panic!("expected an admission, got {other:?}"),
    };
    for (execution_id, input) in executions.iter().zip(inputs) {
        let events = all_events(store, *execution_id);
        assert_eq!(input_of(&events[0].event), *input);
    }
    let log: Vec<String> = whole_log(store)
        .iter()
        .map(|e| input_of(&e.event))
        .collect();
    assert_eq!(log, inputs);
}

/// S-4 + S-5: a damaged admission-input blob quarantines its execution in the global log,
/// which goes on for the others; the next admission with the same input writes the blob
/// again instead of pointing at the damaged copy.
#[tokio::test]
async fn s5_a_damaged_input_blob_quarantines_only_its_execution_and_is_written_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let large = format!("{{\"script\": \"{}\"}}", "y".repeat(2048));
    let hash = openprogram_storage::BlobHash::of(large.as_bytes());
    let (damaged, healthy) = {
        let store = Store::open(dir.path()).expect("open");
        let damaged = openprogram_storage::ExecutionId::new();
        let transition = Transition::create(head(damaged), vec![admission(&large)]);
        committed(store.submit(transition).await.expect("submit"));
        (damaged, create(&store).await)
    };
    {
        let db = raw_open(dir.path());
        db.insert(openprogram_storage::keys::blob(hash), &b"damaged"[..])
            .expect("insert");
        db.flush().expect("flush");
    }
    let store = Store::open(dir.path()).expect("reopen");
    let log = whole_log(&store);
    assert!(
        log.iter().all(|event| event.execution_id == healthy),
        "{log:?}"
    );
    assert!(!log.is_empty());
    assert!(store
        .quarantined()
        .iter()
        .any(|(execution_id, _)| *execution_id == damaged));
    let again = openprogram_storage::ExecutionId::new();
    let transition = Transition::create(head(again), vec![admission(&large)]);
    committed(store.submit(transition).await.expect("submit"));
    assert_eq!(
        store.blob(hash).expect("blob").as_deref(),
        Some(large.as_bytes())
    );
    let events = all_events(&store, again);
    assert!(matches!(
        &events[0].event,
        openprogram_storage::Event::Admitted { input, .. } if *input == large
    ));
}

fn admission(input: &str) -> openprogram_storage::Event {
    openprogram_storage::Event::Admitted {
        kind: openprogram_storage::ExecutionKind::AgentTurn,
        session_id: openprogram_storage::SessionId::new(),
        run_id: openprogram_storage::RunId::new(),
        parent_execution_id: None,
        revision_id: openprogram_storage::RevisionId::new(),
        turn_id: openprogram_storage::TurnId::new(),
        user_message_id: openprogram_storage::MessageId::new(),
        reply_message_id: openprogram_storage::MessageId::new(),
        parent_message_id: None,
        input: input.to_owned(),
    }
}
