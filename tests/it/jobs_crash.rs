//! J-2, R-2..R-5 with real processes: `openprogram serve --resource model=2` is killed with
//! SIGKILL twice while Jobs hold leases. After each restart the dead owner's leases are
//! released and the Jobs go through the queue again; all finish, every `append` is in the
//! file exactly once, and the lease audit of the whole log finds no resource over its
//! capacity at any committed transition and every lease released exactly once.

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
