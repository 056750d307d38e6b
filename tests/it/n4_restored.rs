//! S-7 across nodes (N-4): `serve --store postgres://…` keeps the highest position it saw
//! acknowledged in its `--data`. Restarted on a database restored from an older dump, it
//! refuses to serve (`acknowledged_lost`, naming the gap); with `--accept-loss` it prints
//! what was lost and serves what the dump held.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::pg_cluster::{self, client_program};
use crate::served::{stderr_path, Served};
use crate::support::DEADLINE;

const TOKEN: &str = "restored-dump-token";

/// Admits a turn that replies at once; its path.
fn admit(node: &Served, message: &str) -> String {
    let (status, session) = node.call("POST", "/v1/sessions", Some(&json!({})));
    assert_eq!(status, 201, "{session}");
    let session = session["session_id"].as_str().expect("session");
    let executions = format!("/v1/sessions/{session}/executions");
    let start = json!({"kind": "agent", "message": message, "script": [{"reply": "done"}]});
    let (status, started) = node.call("POST", &executions, Some(&start));
    assert_eq!(status, 201, "{started}");
    format!(
        "{executions}/{}",
        started["execution_id"].as_str().expect("id")
    )
}

#[test]
#[ignore = "needs PostgreSQL (apt-get install postgresql); run with \
            `cargo test --workspace -- --include-ignored`"]
fn n4_a_node_restarted_on_a_restored_dump_refuses_until_it_accepts_the_loss() {
    let url = pg_cluster::database();
    let dir = tempfile::tempdir().expect("temp dir");
    let data = dir.path().join("node");
    let dump = dir.path().join("dump.sql");
    let dump = dump.to_str().expect("path");
    let node = Served::start(&data, TOKEN, &[], &["--store", &url]);
    let kept = admit(&node, "before the dump");
    node.stop();
    client_program("pg_dump", &["-f", dump, &url]);
    let node = Served::start(&data, TOKEN, &[], &["--store", &url]);
    let lost = admit(&node, "after the dump");
    node.stop();

    let restored = pg_cluster::database();
    client_program(
        "psql",
        &["-q", "-v", "ON_ERROR_STOP=1", "-f", dump, &restored],
    );
    let mut refused = Command::new(env!("CARGO_BIN_EXE_openprogram"))
        .args(["serve", "--listen", "127.0.0.1:0", "--token", TOKEN])
        .args(["--store", &restored, "--data"])
        .arg(&data)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run serve");
    let deadline = Instant::now() + DEADLINE;
    while refused.try_wait().expect("wait").is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    // Still running: it served (killed by pid, the child this test started).
    let served = refused.try_wait().expect("wait").is_none();
    if served {
        refused.kill().expect("kill");
    }
    let refused = refused.wait_with_output().expect("its output");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!served, "served a database behind it: {stderr}");
    assert!(!refused.status.success(), "{stderr}");
    assert!(refused.stdout.is_empty(), "listened: {stderr}");
    assert!(
        stderr.contains("acknowledged_lost") && stderr.contains("--accept-loss"),
        "{stderr}"
    );

    let node = Served::start_with_env(
        &data,
        TOKEN,
        &[],
        &["--store", &restored, "--accept-loss"],
        &[],
    );
    assert_eq!(node.call("GET", &kept, None).0, 200, "what the dump held");
    assert_eq!(node.call("GET", &lost, None).0, 404, "what came after it");
    let log = std::fs::read_to_string(stderr_path(&data)).expect("serve's log");
    let salvage = log
        .lines()
        .find_map(|line| line.strip_prefix("openprogram: opened to salvage: "))
        .unwrap_or_else(|| panic!("no salvage report in {log}"));
    let report: Value = serde_json::from_str(salvage).expect("a JSON report");
    assert!(
        report["acknowledged_through"].as_u64() > report["present_through"].as_u64(),
        "{report}"
    );
    node.stop();
    let node = Served::start(&data, TOKEN, &[], &["--store", &restored]);
    assert_eq!(
        node.call("GET", &kept, None).0,
        200,
        "the loss was accepted once"
    );
    node.stop();
}
