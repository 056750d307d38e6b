//! S-5: blobs are stored once by content hash, size-limited with a clear error, and checked
//! against their hash when read.

use openprogram_storage::{Blob, Error, EventStore, Limits, Store, Transition, Upsert};

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
