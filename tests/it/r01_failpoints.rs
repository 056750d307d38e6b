//! R01 (RELIABILITY.md): a crash at each durable boundary. `openprogram serve` runs with
//! `OP_FAILPOINT=Bxx:SKIP` and aborts when it reaches that boundary (after SKIP hits, seeded,
//! 3 seeds a boundary); the test then starts it again, and at the end runs it to quiescence
//! and checks the invariants against the oracle outside the data dir, the `append` sink:
//! no effect delivered twice (I1), one dispatch per effect and epoch (I4), the original ids
//! (I7), every acknowledged admission and command still there (I8), everything finished
//! (L1). A boundary the workload never reached fails the test: the harness must not pass
//! by not trying. `OP_R01_SEED` replays a run.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use openprogram::storage::failpoints::BOUNDARIES;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::http::{call_raw, try_call_raw};
use crate::kill9::{
    abandoned_appends, assert_all_completed_exactly_once, assert_no_duplicate, kill9,
};
use crate::support::*;

/// Seeds (skips) tried at each boundary.
const SEEDS_PER_BOUNDARY: u64 = 3;
/// How long a run may take to reach its boundary before it is killed instead.
const REACH_WAIT: Duration = Duration::from_secs(4);

fn seed() -> u64 {
    let seed = std::env::var("OP_R01_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("r01: seed {seed} (replay with OP_R01_SEED={seed})");
    seed
}

/// A `serve` this test started, with its stderr kept; killed by pid (SIGKILL) and reaped on
/// drop, so a failing test leaves no process behind.
struct Armed {
    child: Option<Child>,
    failpoint: String,
    stderr: tempfile::NamedTempFile,
}

impl Armed {
    /// Whether its stderr says it aborted at its failpoint.
    fn reached(&self) -> bool {
        let name = self.failpoint.split(':').next().unwrap_or_default();
        std::fs::read_to_string(self.stderr.path())
            .is_ok_and(|text| text.contains(&format!("failpoint {name} reached")))
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            kill9(child);
        }
    }
}

/// `serve` with a failpoint armed, its listen URL read from stdout.
fn serve_armed(data: &Path, failpoint: &str, token: &str) -> (Armed, String) {
    let stderr = tempfile::NamedTempFile::new().expect("stderr file");
    let mut child = Command::new(env!("CARGO_BIN_EXE_openprogram"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--token",
            token,
            "--data",
        ])
        .arg(data)
        .env("OP_FAILPOINT", failpoint)
        .stdout(Stdio::piped())
        .stderr(stderr.reopen().expect("stderr"))
        .spawn()
        .expect("spawn openprogram serve");
    let mut url = String::new();
    let stdout = child.stdout.take().expect("stdout");
    // An abort before listening ends stdout empty.
    let _ = std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut url);
    let armed = Armed {
        child: Some(child),
        failpoint: failpoint.to_owned(),
        stderr,
    };
    (armed, url.trim().to_owned())
}

/// Waits for the process to end at its failpoint (true: its stderr says so), or kills it
/// after `wait` (false).
fn aborted_within(mut armed: Armed, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    if let Some(child) = armed.child.as_mut() {
        while child.try_wait().expect("wait").is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    if let Some(child) = armed.child.take() {
        kill9(child);
    }
    armed.reached()
}

/// Boundaries the restart workload reaches: the store's, the effect path's and recovery's.
/// B13 first: it needs abandoned work at startup, which a run that misses its boundary may
/// finish.
const RESTART_BOUNDARIES: [&str; 9] = [
    "B13", "B02", "B03", "B05", "B06", "B07", "B08", "B09", "B10",
];

/// Executions abandoned with `append` steps in flight; each run of `serve` resumes them and
/// aborts at one boundary; the sink must never see an effect twice, and at the end every
/// step is delivered exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r01_a_crash_at_each_boundary_of_the_effect_path_loses_and_repeats_nothing() {
    let seed = seed();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let restarts = Restarts::new();
    let sink_dir = tempfile::tempdir().expect("sink dir");
    let sink = sink_dir.path().join("sink");
    const EXECUTIONS: usize = 6;
    // Work that outlasts the runs: each run that reaches its boundary does a little of it.
    let steps = 2 * RESTART_BOUNDARIES.len() * SEEDS_PER_BOUNDARY as usize;
    let started = abandoned_appends(
        &restarts,
        &sink,
        EXECUTIONS,
        steps,
        || Some(sleep(rng.gen_range(5..=20))),
        |_| Vec::new(),
    )
    .await;
    let mut reached = Vec::new();
    for boundary in RESTART_BOUNDARIES {
        for round in 0..SEEDS_PER_BOUNDARY {
            // The first run stops at the boundary's first hit; the others later, seeded.
            let skip: u64 = if round == 0 { 0 } else { rng.gen_range(1..6) };
            let (child, _) = serve_armed(
                restarts.dir.path(),
                &format!("{boundary}:{skip}"),
                "r01-admin-token",
            );
            if aborted_within(child, REACH_WAIT) {
                reached.push(boundary);
            }
            assert_no_duplicate(&sink, &format!("seed {seed}: after {boundary}:{skip}"));
        }
    }
    let missed: Vec<&str> = RESTART_BOUNDARIES
        .into_iter()
        .filter(|b| !reached.contains(b))
        .collect();
    assert!(
        missed.is_empty(),
        "seed {seed}: boundaries never reached: {missed:?}"
    );
    assert_all_completed_exactly_once(&restarts, &sink, &started, steps).await;
    eprintln!(
        "r01: seed {seed}: {} aborts at {RESTART_BOUNDARIES:?}",
        reached.len()
    );
}

const REQUEST_BOUNDARIES: [&str; 5] = ["B01", "B04", "B11", "B12", "B14"];

/// Boundaries a client's requests reach: a command received (B01), a claim (B04), a reply
/// not yet delivered (B11), a cancel before the effect is told (B12), a process spawned
/// before its identity is saved (B14). Every request answered before the crash is still
/// answered so after it (I8, I5); nothing runs twice.
#[test]
fn r01_a_crash_at_each_boundary_of_a_request_keeps_every_answer() {
    let seed = seed();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("data dir");
    let sink_dir = tempfile::tempdir().expect("sink dir");
    let sink = sink_dir.path().join("sink");
    std::fs::write(&sink, "").expect("sink");
    let token = "r01-admin-token";
    let mut answered_starts: Vec<(String, String)> = Vec::new();
    let mut answered_commands: Vec<(String, Value)> = Vec::new();
    let mut reached = Vec::new();
    let boundaries = REQUEST_BOUNDARIES;
    let mut line = 0;
    for boundary in boundaries {
        for round in 0..SEEDS_PER_BOUNDARY {
            let skip: u64 = if round == 0 { 0 } else { rng.gen_range(0..2) };
            let (child, url) = serve_armed(dir.path(), &format!("{boundary}:{skip}"), token);
            let created = try_call_raw(&url, "POST", "/v1/sessions", Some(token), None);
            let Ok((201, session)) = created else {
                // Aborted before it answered anything (its startup resumed earlier work).
                if aborted_within(child, Duration::from_secs(2)) {
                    reached.push(boundary);
                }
                continue;
            };
            let session = session["session_id"].as_str().expect("id").to_owned();
            // A paused turn that appends, then a Continue (a claim) and a Cancel of a turn
            // in a sleep, and a turn that runs a process.
            line += 1;
            let append =
                json!({"tool": "append", "args": {"path": sink, "line": format!("l{line}")}});
            let shell = json!({"tool": "shell", "args": {"program": "true", "args": []}});
            let bodies = [
                json!({"message": "m", "start_paused": true, "script": [append, {"reply": "done"}]}),
                json!({"message": "m", "script": [{"tool": "sleep", "args": {"ms": 60_000}}, {"reply": "never"}]}),
                json!({"message": "m", "script": [shell, {"reply": "done"}]}),
            ];
            let path = format!("/v1/sessions/{session}/executions");
            let mut ids = Vec::new();
            for body in bodies {
                let body = Some(body.to_string());
                let Ok((201, started)) = try_call_raw(&url, "POST", &path, Some(token), body)
                else {
                    break;
                };
                let id = started["execution_id"].as_str().expect("id").to_owned();
                answered_starts.push((session.clone(), id.clone()));
                ids.push(id);
            }
            for (index, kind) in [(0, "continue"), (1, "cancel")] {
                let Some(execution) = ids.get(index) else {
                    break;
                };
                let body =
                    json!({"command_id": openprogram::storage::CommandId::new(), "kind": kind});
                let path = format!("{path}/{execution}/commands");
                let body = Some(body.to_string());
                if let Ok((202, reply)) = try_call_raw(&url, "POST", &path, Some(token), body) {
                    answered_commands.push((session.clone(), reply));
                }
            }
            if aborted_within(child, Duration::from_secs(2)) {
                reached.push(boundary);
            }
            assert_no_duplicate(&sink, &format!("seed {seed}: after {boundary}:{skip}"));
        }
    }
    let missed: Vec<&str> = boundaries
        .into_iter()
        .filter(|b| !reached.contains(b))
        .collect();
    assert!(
        missed.is_empty(),
        "seed {seed}: boundaries never reached: {missed:?}"
    );
    // Quiescence: started again without a failpoint; every answer still stands.
    let (quiet, url) = serve_armed(dir.path(), "", token);
    for (session, execution) in &answered_starts {
        let path = format!("/v1/sessions/{session}/executions/{execution}");
        let (status, snapshot) = call_raw(&url, "GET", &path, Some(token), None);
        assert_eq!(
            status, 200,
            "seed {seed}: an admitted execution is gone: {snapshot}"
        );
    }
    for (session, reply) in &answered_commands {
        let path = format!(
            "/v1/sessions/{session}/commands/{}",
            reply["command_id"].as_str().expect("id")
        );
        let (status, stored) = call_raw(&url, "GET", &path, Some(token), None);
        assert_eq!(
            (status, &stored["status"]),
            (200, &reply["status"]),
            "seed {seed}: {reply}"
        );
    }
    drop(quiet);
    assert_no_duplicate(&sink, &format!("seed {seed}: at the end"));
}

/// The two workloads together crash at every boundary RELIABILITY.md names.
#[test]
fn r01_the_workloads_cover_every_boundary() {
    let mut covered: Vec<&str> = RESTART_BOUNDARIES.to_vec();
    covered.extend(REQUEST_BOUNDARIES);
    covered.sort_unstable();
    assert_eq!(covered, BOUNDARIES);
}

/// Boundaries of a durable function's External step: its intent durable before it runs
/// (B05), its effect taken before its result returns (B06), its result in hand before its
/// receipt is committed (B07).
const FUNCTION_BOUNDARIES: [&str; 3] = ["B05", "B06", "B07"];

/// R01 for durable functions (F-4): `steps`, `fanout` and `nested` executions abandoned
/// mid-run; each run of `serve` resumes them and aborts at one boundary of a step; no step's
/// line is ever appended twice, and at the end every execution completes with every line
/// once.
#[test]
fn r01_a_crash_at_each_boundary_of_a_function_step_repeats_no_step() {
    use crate::served::Served;
    let seed = seed();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("dir");
    let data = dir.path().join("data");
    let token = "r01-function-token";
    const EXECUTIONS: usize = 4;
    let steps = 2 * FUNCTION_BOUNDARIES.len() * SEEDS_PER_BOUNDARY as usize + 4;
    let served = Served::start(&data, token, &[], &[]);
    let (_, session) = served.call("POST", "/v1/sessions", Some(&json!({})));
    let session = session["session_id"].as_str().expect("session").to_owned();
    let mut started = Vec::new();
    for index in 0..EXECUTIONS {
        let path = dir.path().join(format!("steps-{index}.log"));
        // The `append` protocol reads a missing file as no evidence (an operator decides).
        std::fs::write(&path, "").expect("the steps file");
        let body = json!({"kind": "function", "function": "steps",
            "input": {"count": steps, "path": path, "sleep_ms": 20}});
        let (status, reply) = served.call(
            "POST",
            &format!("/v1/sessions/{session}/executions"),
            Some(&body),
        );
        assert_eq!(status, 201, "{reply}");
        // The newest revision of `steps` runs (3: its steps are `t1..`).
        assert_eq!(reply["function_revision"], 3, "{reply}");
        let expected: Vec<String> = (1..=steps).map(|index| format!("t{index}")).collect();
        started.push((
            reply["execution_id"].as_str().expect("id").to_owned(),
            path,
            expected,
        ));
    }
    // A fanout of parallel branches, and a nested workflow.
    let branches: Vec<String> = (0..4).map(|index| format!("b{index}")).collect();
    let others = [
        (
            "fanout",
            json!({"branches": branches, "sleep_ms": 20}),
            branches
                .iter()
                .cloned()
                .chain(["join".to_owned()])
                .collect::<Vec<_>>(),
        ),
        (
            "nested",
            json!({"count": steps, "sleep_ms": 20}),
            (1..=steps)
                .map(|index| format!("s{index}"))
                .chain(["after".to_owned()])
                .collect(),
        ),
    ];
    for (function, mut input, expected) in others {
        let path = dir.path().join(format!("{function}.log"));
        std::fs::write(&path, "").expect("the file");
        input["path"] = json!(path);
        let body = json!({"kind": "function", "function": function, "input": input});
        let (status, reply) = served.call(
            "POST",
            &format!("/v1/sessions/{session}/executions"),
            Some(&body),
        );
        assert_eq!(status, 201, "{reply}");
        started.push((
            reply["execution_id"].as_str().expect("id").to_owned(),
            path,
            expected,
        ));
    }
    served.kill9();
    let no_duplicate = |when: &str| {
        for (_, path, _) in &started {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let mut seen = std::collections::BTreeSet::new();
            for line in text.lines() {
                let step = line.split('\t').next().unwrap_or_default();
                assert!(
                    seen.insert(step.to_owned()),
                    "seed {seed}: {step} twice {when}"
                );
            }
        }
    };
    let mut reached = Vec::new();
    for boundary in FUNCTION_BOUNDARIES {
        for round in 0..SEEDS_PER_BOUNDARY {
            let skip: u64 = if round == 0 { 0 } else { rng.gen_range(1..6) };
            let (child, _) = serve_armed(&data, &format!("{boundary}:{skip}"), token);
            if aborted_within(child, REACH_WAIT) {
                reached.push(boundary);
            }
            no_duplicate(&format!("after {boundary}:{skip}"));
        }
    }
    let missed: Vec<&str> = FUNCTION_BOUNDARIES
        .into_iter()
        .filter(|b| !reached.contains(b))
        .collect();
    assert!(
        missed.is_empty(),
        "seed {seed}: boundaries never reached: {missed:?}"
    );
    let served = Served::start(&data, token, &[], &[]);
    for (execution, path, expected) in &started {
        let read = format!("/v1/sessions/{session}/executions/{execution}");
        let waited = Instant::now();
        loop {
            let (_, snapshot) = served.call("GET", &read, None);
            if snapshot["state"] == "completed" {
                break;
            }
            assert!(
                waited.elapsed() < DEADLINE,
                "seed {seed}: not completed: {snapshot}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut appended: Vec<String> = std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|line| line.split('\t').next().unwrap_or_default().to_owned())
            .collect();
        // Parallel branches append in any order; everything else in order, once.
        let mut expected = expected.clone();
        if appended.last().is_some_and(|last| last == "join") {
            appended.sort();
            expected.sort();
        }
        assert_eq!(appended, expected, "seed {seed}: {execution}");
    }
    served.stop();
    eprintln!(
        "r01 functions: seed {seed}: {} aborts at {FUNCTION_BOUNDARIES:?}",
        reached.len()
    );
}
