//! J-1, J-2 under load: 1,000 concurrent Jobs asking for several resources, with random
//! pauses, continues (some raising a spent budget) and cancels while they run. Checked at
//! every committed transition by the lease audit of the whole log (`jobs::audit`): no
//! resource over its capacity, no lease released twice, no Job step without a lease; at the
//! end every Job ended and every lease was released exactly once. Randomized: the seed is
//! printed (`OP_SEED=N` replays one).

use openprogram::storage::ExecutionId;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::jobs::{audit_all_released, harness, start_job};
use crate::support::*;

const JOBS: usize = 1_000;
const CAPACITY: [(&str, u32); 2] = [("model", 8), ("gpu", 2)];

fn seed() -> u64 {
    let seed = std::env::var("OP_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("jobs property seed: {seed} (OP_SEED={seed} replays it)");
    seed
}

fn script(rng: &mut StdRng) -> Vec<Value> {
    let mut script: Vec<Value> = (0..rng.gen_range(1..4))
        .map(|step| {
            if rng.gen_bool(0.5) {
                echo(&format!("step {step}"))
            } else {
                sleep(rng.gen_range(1..6))
            }
        })
        .collect();
    script.push(reply("done"));
    script
}

fn job_body(rng: &mut StdRng) -> Value {
    let mut resources = serde_json::Map::new();
    resources.insert("model".into(), json!(rng.gen_range(1..4)));
    if rng.gen_bool(0.2) {
        resources.insert("gpu".into(), json!(1));
    }
    let mut body = json!({"resources": resources});
    if rng.gen_bool(0.2) {
        body["budget"] = json!({"steps": rng.gen_range(1..4)});
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn j1_capacity_is_never_exceeded_by_a_thousand_jobs_under_random_controls() {
    let seed = seed();
    let mut rng = StdRng::seed_from_u64(seed);
    let harness = harness(&CAPACITY);
    let mut jobs: Vec<ExecutionId> = Vec::with_capacity(JOBS);
    for _ in 0..JOBS {
        let script = script(&mut rng);
        let body = job_body(&mut rng);
        jobs.push(start_job(&harness, script, body).await);
    }
    // Random controls while they run: pause, continue (a spent budget raised half the
    // time), cancel. Refusals are fine (a Job ended or moved on); each must change nothing.
    for _ in 0..JOBS {
        let execution = jobs[rng.gen_range(0..jobs.len())];
        let body = match rng.gen_range(0..10) {
            0..=3 => json!({"kind": "pause"}),
            4..=7 if rng.gen_bool(0.5) => json!({"kind": "continue", "budget": {"steps": 100}}),
            4..=7 => json!({"kind": "continue"}),
            _ => json!({"kind": "cancel"}),
        };
        harness.send(execution, body).await;
        if rng.gen_bool(0.1) {
            let report = harness.runtime.resources().await.expect("the queue");
            for resource in &report.resources {
                assert!(
                    resource.in_use <= resource.capacity,
                    "seed {seed}: over capacity: {report:?}"
                );
            }
        }
    }
    // Then every Job is continued until it ends.
    for execution in &jobs {
        let ended = harness
            .wait_for(*execution, "an end, or a pause to continue", |snapshot| {
                matches!(snapshot.state, "completed" | "cancelled" | "paused")
            })
            .await;
        if ended.state == "paused" {
            let reply = harness
                .send(
                    *execution,
                    json!({"kind": "continue", "budget": {"steps": 100}}),
                )
                .await;
            assert_eq!(reply.status, "applied", "seed {seed}: {reply:?}");
        }
    }
    for execution in &jobs {
        harness
            .wait_for(*execution, "its end", |snapshot| {
                matches!(snapshot.state, "completed" | "cancelled")
            })
            .await;
    }
    let audit = audit_all_released(&harness, &CAPACITY);
    assert!(!audit.granted.is_empty(), "seed {seed}");
    let report = harness.runtime.resources().await.expect("the queue");
    for resource in &report.resources {
        assert_eq!(resource.in_use, 0, "seed {seed}: {report:?}");
        assert!(resource.waiting.is_empty(), "seed {seed}: {report:?}");
    }
    eprintln!(
        "jobs property: {} leases, peak {:?}, {} admissions",
        audit.granted.len(),
        audit.peak,
        report.stats.admissions
    );
}
