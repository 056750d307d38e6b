//! R13 / S-3: when a write fails (here: the child runs under a file size limit, so sled's
//! writes fail with EFBIG as on a full disk), the failed group and every later submission are
//! refused with `fail_stop`, nothing unacknowledged is reported as committed, everything
//! acknowledged is on disk after a reopen, and the store takes writes again once there is
//! room.

use std::process::Command;

use openprogram_storage::{EventReader, ExecutionId, Store};

use crate::support::*;

/// The file size limit of the child, in KiB: room for a few hundred transitions.
const FILE_SIZE_LIMIT_KIB: &str = "8192";

#[tokio::test]
async fn r13_failed_write_stops_acknowledging_and_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().expect("tempdir");
    // `trap "" XFSZ` makes the size limit an EFBIG error instead of a kill; ignored signals
    // stay ignored across exec.
    let script = format!("trap '' XFSZ; ulimit -f {FILE_SIZE_LIMIT_KIB}; exec \"$0\" \"$1\" 1");
    let output = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_storage-crash-writer"))
        .arg(dir.path())
        .env("OP_FILL_UNTIL_ERROR", "1")
        .output()
        .expect("run the crash writer");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    let acked = lines.iter().filter(|line| line.starts_with("ack ")).count() as u64;
    assert!(
        acked > 10,
        "the child should commit for a while first: {stdout}"
    );
    assert!(lines.contains(&"error fail_stop"), "{stdout}");
    assert!(lines.contains(&"then fail_stop"), "{stdout}");

    let store = Store::open(dir.path()).expect("reopen with room");
    let execution_id = ExecutionId::from_uuid(uuid::Uuid::from_u128(1));
    let head = store
        .head(execution_id)
        .expect("head")
        .expect("created before the failure");
    assert!(
        head.version >= acked,
        "acknowledged {acked}, found {}",
        head.version
    );
    assert_eq!(all_events(&store, execution_id).len() as u64, head.version);
    let next = append(&store, execution_id, head.version, "after space returned").await;
    assert_eq!(next.version, head.version + 1);
}
