//! R06 (RELIABILITY.md): an owner stalled past its lease. `openprogram serve` runs
//! executions that append to a sink outside the data dir (the oracle) and is stopped with
//! SIGSTOP — every thread frozen, as a paused VM or a debugger would leave it — for three
//! times its lease, then continued with SIGCONT, a few times at random moments. Each attempt
//! stopped while running is replaced by a new one with a higher epoch however soon its own
//! heartbeat runs again, and storage fences the old attempt's late writes (I3). An effect
//! the old attempt had dispatched is never guessed (I2): it is `reconciliation_required`
//! until `append`'s protocol looks it up in the sink, having fenced it at the resource
//! (`append_file`), so the old attempt's call — still running in this process — cannot land
//! after a rerun. No operator is needed: in the end every execution completes with each
//! step delivered exactly once (I1, I8).
//!
//! `OP_R06_SEED` replays a run.

use std::time::{Duration, Instant};

use openprogram::storage::{Event, EventReader, ExecutionId, ExecutionState, Store};
use rand::{Rng, SeedableRng};
use serde_json::Value;

use crate::kill9::{assert_no_duplicate, sink_lines};
use crate::served::{appending_turn, Served};
use crate::support::DEADLINE;

const TOKEN: &str = "r06-admin-token";
const LEASE_TTL: Duration = Duration::from_millis(300);
const EXECUTIONS: usize = 12;
const STEPS: usize = 8;
const STALLS: usize = 3;

#[test]
fn r06_an_owner_stopped_past_its_lease_is_fenced_and_nothing_is_delivered_twice() {
    let seed = std::env::var("OP_R06_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("R06 seed: {seed} (replay with OP_R06_SEED={seed})");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let (data, sink) = (dir.path().join("data"), dir.path().join("sink"));
    std::fs::write(&sink, "").expect("sink");
    let ttl = format!("{}ms", LEASE_TTL.as_millis());
    let server = Served::start(&data, TOKEN, &[], &["--lease-ttl", &ttl]);
    let call =
        |method: &str, path: &str, body: Option<Value>| server.call(method, path, body.as_ref());
    let (_, session) = call("POST", "/v1/sessions", None);
    let session = session["session_id"].as_str().expect("session").to_owned();
    let executions_path = format!("/v1/sessions/{session}/executions");
    let mut executions = Vec::new();
    for execution in 0..EXECUTIONS {
        let body = appending_turn(execution, STEPS, &sink, 40);
        let (status, started) = call("POST", &executions_path, Some(body));
        assert_eq!(status, 201, "{started}");
        executions.push(started["execution_id"].as_str().expect("id").to_owned());
    }

    for _ in 0..STALLS {
        std::thread::sleep(Duration::from_millis(rng.gen_range(50..250)));
        server.signal("-STOP");
        std::thread::sleep(LEASE_TTL * 3);
        server.signal("-CONT");
    }

    // To quiescence; the protocol resolves what the stalled attempts left unknown.
    let deadline = Instant::now() + DEADLINE;
    for (index, execution) in executions.iter().enumerate() {
        let path = format!("{executions_path}/{execution}");
        loop {
            let (status, snapshot) = call("GET", &path, None);
            assert_eq!(status, 200, "{snapshot}");
            match snapshot["state"].as_str() {
                Some("completed") => {
                    assert_eq!(snapshot["text"], format!("done {index}"));
                    break;
                }
                Some("queued" | "running" | "cancelling" | "reconciliation_required") => {}
                _ => panic!("I2/L1: {snapshot}"),
            }
            assert!(Instant::now() < deadline, "never completed: {snapshot}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let (_, metrics) = call("GET", "/metrics", None);
    let fenced = metrics
        .as_str()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("openprogram_fenced_writes_total"))
        })
        .unwrap_or("openprogram_fenced_writes_total ?")
        .to_owned();
    drop(server);

    assert_no_duplicate(&sink, "after the stalls");
    assert_eq!(
        sink_lines(&sink).len(),
        EXECUTIONS * STEPS,
        "I8: every step delivered"
    );
    let store = Store::open(&data).expect("reopen");
    let (mut takeovers, mut taken_over) = (0, 0);
    for execution in &executions {
        let id: ExecutionId = execution.parse().expect("execution id");
        let events = store.events_after(id, 0, usize::MAX).expect("events");
        // I3: once an epoch claimed the execution, no older attempt wrote to it.
        let mut newest = 0;
        // A takeover is a new attempt while the execution runs; once it waits for the
        // operator, the next attempt is the operator's reconcile activating it.
        let mut waits_for_operator = false;
        let mut replaced = false;
        for envelope in &events {
            match envelope.event {
                Event::AttemptStarted { epoch, .. } => {
                    if epoch > 1 && !waits_for_operator {
                        takeovers += 1;
                        replaced = true;
                    }
                    newest = newest.max(epoch);
                }
                Event::StateChanged {
                    state: ExecutionState::ReconciliationRequired,
                    ..
                } => waits_for_operator = true,
                Event::ControlApplied { .. } => waits_for_operator = false,
                _ => {}
            }
            assert!(
                envelope.writer_epoch == 0 || envelope.writer_epoch >= newest,
                "I3: a write of epoch {} after epoch {newest} claimed: {envelope:?}",
                envelope.writer_epoch
            );
        }
        taken_over += usize::from(replaced);
    }
    eprintln!(
        "R06: {STALLS} stalls of {} ms, {takeovers} takeovers of {taken_over} executions, \
         {fenced}",
        (LEASE_TTL * 3).as_millis()
    );
    // Every execution ran through at least one stall (each runs for longer than the gap
    // between two), and an attempt stopped past its lease is always replaced: its heartbeat
    // cannot extend a lapsed lease.
    assert_eq!(
        taken_over, EXECUTIONS,
        "executions taken over after {STALLS} stalls ({takeovers} takeovers)"
    );
}
