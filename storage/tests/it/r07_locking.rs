//! R07 in one process: a second handle on an open store is refused with a clear error, and
//! the store opens again once the first handle is gone.

use openprogram_storage::{Error, Store};

#[test]
fn r07_second_opener_is_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path()).expect("open");
    match Store::open(dir.path()) {
        Err(error @ Error::Locked { .. }) => {
            assert_eq!(error.code(), "store_locked");
            assert!(error.to_string().contains("already open"), "{error}");
        }
        other => panic!("expected Locked, got {other:?}"),
    }
    drop(store);
    Store::open(dir.path()).expect("open after the first handle closed");
}
