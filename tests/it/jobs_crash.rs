//! Jobs with real processes (J-1, J-2, R-2..R-5): the queue as users see it over HTTP, the
//! CLI and `/metrics`; and `openprogram serve --resource model=2` killed with SIGKILL twice
//! while Jobs hold leases. After each restart the dead owner's leases are released and the
//! Jobs go through the queue again; all finish, every `append` is in the file exactly once,
//! and the lease audit of the whole log finds no resource over its capacity at any committed
//! transition and every lease released exactly once.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use openprogram::storage::Store;
use serde_json::{json, Value};

use crate::jobs::audit;
use crate::served::{appending_turn, Served};
use crate::support::DEADLINE;

const JOBS: usize = 6;
const STEPS: usize = 4;
const TOKEN: &str = "jobs-crash-token";
const EXTRA: [&str; 2] = ["--resource", "model=2"];

/// Waits until the queue leases all of `model` and the sink holds `lines` lines.
fn wait_leased(served: &Served, sink: &std::path::Path, lines: usize) {
    let started = Instant::now();
    loop {
        let (_, resources) = served.call("GET", "/v1/resources", None);
        let in_use = resources[0]["in_use"].as_u64().unwrap_or(0);
        let written = std::fs::read_to_string(sink)
            .unwrap_or_default()
            .lines()
            .count();
        if in_use == 2 && written >= lines {
            return;
        }
        assert!(started.elapsed() < DEADLINE, "never leased: {resources}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn j2_kill9_twice_while_jobs_hold_leases_every_job_finishes_and_every_lease_is_released_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("data");
    let sink = dir.path().join("sink.log");
    let served = Served::start(&data, TOKEN, &[], &EXTRA);
    let (status, session) = served.call("POST", "/v1/sessions", Some(&json!({})));
    assert_eq!(status, 201, "{session}");
    let executions = format!(
        "/v1/sessions/{}/executions",
        session["session_id"].as_str().expect("session id")
    );
    let mut ids = Vec::new();
    for execution in 0..JOBS {
        let mut body = appending_turn(execution, STEPS, &sink, 60);
        body["job"] = json!({"resources": {"model": 1}});
        let (status, started) = served.call("POST", &executions, Some(&body));
        assert_eq!(status, 201, "{started}");
        ids.push(started["execution_id"].as_str().expect("id").to_owned());
    }
    wait_leased(&served, &sink, 2);
    served.kill9();
    let served = Served::start(&data, TOKEN, &[], &EXTRA);
    wait_leased(&served, &sink, 2 * STEPS);
    served.kill9();
    let served = Served::start(&data, TOKEN, &[], &EXTRA);
    for id in &ids {
        let started = Instant::now();
        loop {
            let (_, snapshot) = served.call("GET", &format!("{executions}/{id}"), None);
            if snapshot["state"] == "completed" {
                assert!(snapshot["job"]["lease_id"].is_null(), "{snapshot}");
                break;
            }
            assert!(started.elapsed() < DEADLINE, "not completed: {snapshot}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let (_, resources): (u16, Value) = served.call("GET", "/v1/resources", None);
    assert_eq!(resources[0]["in_use"], 0, "{resources}");
    served.stop();
    // Every append exactly once: the dead owners' calls in doubt were reconciled by their
    // effect ids, never run twice.
    let mut appended: BTreeMap<String, usize> = BTreeMap::new();
    for line in std::fs::read_to_string(&sink).expect("sink").lines() {
        let step = line.split('\t').next().unwrap_or_default().to_owned();
        *appended.entry(step).or_insert(0) += 1;
    }
    assert_eq!(appended.len(), JOBS * STEPS, "{appended:?}");
    assert!(appended.values().all(|count| *count == 1), "{appended:?}");
    let store = Store::open(&data).expect("reopen");
    let audit = audit(&store, &[("model", 2)]);
    assert_eq!(audit.granted.len(), audit.released.len(), "{audit:#?}");
    assert_eq!(audit.steps_without_lease, 0);
    let dead = audit
        .released
        .iter()
        .filter(|(_, reason)| reason == "new_attempt")
        .count();
    assert!(
        dead >= 2,
        "the leases of both dead owners were released: {audit:#?}"
    );
}

/// J-1 as users see it over HTTP and the CLI (SPEC §6): a Job's body and snapshot
/// (`job_id` = `execution_id`, its place in line), refusals with stable codes, `GET
/// /v1/resources` (admin only), the queue's metrics and `openprogram inspect resources`.
#[test]
fn j1_the_queue_over_http_the_cli_and_metrics() {
    let dir = tempfile::tempdir().expect("tempdir");
    let served = Served::start(
        &dir.path().join("data"),
        TOKEN,
        &[],
        &["--resource", "model=1"],
    );
    let (status, session) = served.call("POST", "/v1/sessions", Some(&json!({})));
    assert_eq!(status, 201, "{session}");
    let sid = session["session_id"]
        .as_str()
        .expect("session id")
        .to_owned();
    let session_token = session["token"].as_str().expect("token").to_owned();
    let executions = format!("/v1/sessions/{sid}/executions");
    let start = |script: Value| {
        let body = json!({"message": "m", "script": script, "job": {"resources": {"model": 1}}});
        let (status, started) = served.call("POST", &executions, Some(&body));
        assert_eq!(status, 201, "{started}");
        started["execution_id"].as_str().expect("id").to_owned()
    };
    let running = start(json!([{"tool": "sleep", "args": {"ms": 600_000}}, {"reply": "r"}]));
    let queued = start(json!([{"reply": "q"}]));
    for (job, code) in [
        (json!({"resources": {"gpu": 1}}), "unknown_resource"),
        (json!({"resources": {"model": 2}}), "exceeds_capacity"),
        (
            json!({"resources": {"model": 1}, "priority": 1}),
            "unknown_field",
        ),
        (
            json!({"resources": {"model": 1}, "budget": {"tokens": 9}}),
            "unknown_field",
        ),
        (json!({"resources": {"model": "one"}}), "invalid_request"),
    ] {
        let body = json!({"message": "m", "job": job});
        let (status, refused) = served.call("POST", &executions, Some(&body));
        assert_eq!(
            (status, refused["code"].as_str()),
            (400, Some(code)),
            "{refused}"
        );
    }
    let started = Instant::now();
    let snapshot = loop {
        let (_, snapshot) = served.call("GET", &format!("{executions}/{queued}"), None);
        if snapshot["job"]["queue_position"] == 1 {
            break snapshot;
        }
        assert!(started.elapsed() < DEADLINE, "never in line: {snapshot}");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(snapshot["state"], "queued", "{snapshot}");
    assert_eq!(
        snapshot["job"]["job_id"], snapshot["execution_id"],
        "{snapshot}"
    );
    assert!(snapshot["job"]["lease_id"].is_null(), "{snapshot}");
    assert_eq!(
        snapshot["job"]["budget_used"],
        json!({"steps": 0, "wall_ms": 0})
    );
    // The queue is the admin's to read.
    let refused = crate::http::call_raw(
        &served.url,
        "GET",
        "/v1/resources",
        Some(&session_token),
        None,
    );
    assert_eq!(refused.0, 401, "{refused:?}");
    let (status, resources) = served.call("GET", "/v1/resources", None);
    assert_eq!(status, 200, "{resources}");
    assert_eq!(resources[0]["name"], "model");
    assert_eq!(resources[0]["in_use"], 1, "{resources}");
    assert_eq!(resources[0]["waiting"], json!([queued]), "{resources}");
    assert_eq!(
        resources[0]["leases"][0]["job_id"],
        running.as_str(),
        "{resources}"
    );
    let (_, metrics) = crate::http::call_raw(&served.url, "GET", "/metrics", Some(TOKEN), None);
    let metrics = metrics.as_str().unwrap_or_default().to_owned();
    for line in [
        "openprogram_resource_in_use{resource=\"model\"} 1",
        "openprogram_resource_queued{resource=\"model\"} 1",
        "openprogram_job_admissions_total 1",
        "openprogram_job_queue_wait_seconds_count 1",
    ] {
        assert!(
            metrics.lines().any(|shown| shown == line),
            "{line} in:\n{metrics}"
        );
    }
    let inspect = std::process::Command::new(env!("CARGO_BIN_EXE_openprogram"))
        .args([
            "inspect",
            "--url",
            &served.url,
            "--token",
            TOKEN,
            "resources",
        ])
        .output()
        .expect("run inspect");
    let table = String::from_utf8_lossy(&inspect.stdout);
    assert!(inspect.status.success(), "{table}");
    assert!(
        table.contains("model") && table.contains(&queued),
        "{table}"
    );
    served.stop();
}
