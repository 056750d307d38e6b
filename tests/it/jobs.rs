//! Jobs through the resource queue (J-1, J-2): admission, leases, pause and continue,
//! cancel, budgets, queue deadlines, the ids a Job keeps. Every test ends with the lease
//! audit of the whole log (`audit`): no resource ever over its capacity at any committed
//! transition, every lease released exactly once.

use std::collections::{BTreeMap, HashMap};

use openprogram::storage::{Event, EventReader, ExecutionId, ExecutionState, LeaseId};
use openprogram::{Runtime, StartRequest};
use serde_json::{json, Value};

use crate::support::*;

/// A runtime on a fresh store declaring `resources`.
pub fn harness(resources: &[(&str, u32)]) -> Harness {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut builder = Runtime::builder().data_dir(dir.path());
    for (name, capacity) in resources {
        builder = builder.resource(*name, *capacity);
    }
    Harness::with_runtime(builder.open().expect("open runtime"), dir)
}

/// A start body's `job` as the library takes it.
pub fn job(value: Value) -> Option<openprogram::JobRequest> {
    Some(serde_json::from_value(value).expect("a job body"))
}

/// Admits an agent turn running `script` as a Job asking for `job`.
pub async fn start_job(harness: &Harness, script: Vec<Value>, job_body: Value) -> ExecutionId {
    harness
        .runtime
        .start_execution(
            harness.session,
            StartRequest {
                message: "a job".into(),
                script: elements(script),
                job: job(job_body),
                ..Default::default()
            },
        )
        .await
        .expect("start a job")
        .execution_id
}

/// Resources by name, with the amount of each.
type Amounts = Vec<(String, u32)>;

/// What the whole log says about leases.
#[derive(Debug, Default)]
pub struct Audit {
    /// Leases granted, with their Job and resources, in log order.
    pub granted: Vec<(LeaseId, ExecutionId, Amounts)>,
    /// Releases, in log order, with their reason.
    pub released: Vec<(LeaseId, String)>,
    /// The most of each resource in use at once.
    pub peak: BTreeMap<String, u32>,
    /// Steps (decisions, tool results) a Job committed while it held no lease.
    pub steps_without_lease: usize,
}

/// J-1, J-2: replays the global log, one committed transition after another: fails if a
/// resource is ever leased above `capacity` or a lease released twice or never granted; no
/// Job may commit a step without a lease.
pub fn audit(store: &dyn EventReader, capacity: &[(&str, u32)]) -> Audit {
    let capacity: HashMap<&str, u32> = capacity.iter().copied().collect();
    let mut audit = Audit::default();
    let mut in_use: BTreeMap<String, u32> = BTreeMap::new();
    let mut live: HashMap<LeaseId, Vec<(String, u32)>> = HashMap::new();
    let mut holding: HashMap<ExecutionId, LeaseId> = HashMap::new();
    let mut jobs: std::collections::HashSet<ExecutionId> = Default::default();
    let mut after = 0;
    loop {
        let page = store.log_after(after, 10_000).expect("read the log");
        let Some(last) = page.last() else { break };
        after = last.position;
        for envelope in &page {
            let job = envelope.execution_id;
            match &envelope.event {
                Event::JobQueued { .. } => {
                    jobs.insert(job);
                }
                Event::LeaseGranted {
                    lease_id,
                    resources,
                    ..
                } => {
                    assert!(
                        live.insert(*lease_id, resources.clone()).is_none(),
                        "lease {lease_id} granted twice"
                    );
                    assert!(
                        holding.insert(job, *lease_id).is_none(),
                        "{job} holds two leases at once"
                    );
                    for (name, amount) in resources {
                        let used = in_use.entry(name.clone()).or_insert(0);
                        *used += amount;
                        let cap = capacity.get(name.as_str()).copied().unwrap_or(0);
                        assert!(
                            *used <= cap,
                            "{name} over capacity at position {}: {used} > {cap}",
                            envelope.position
                        );
                        let peak = audit.peak.entry(name.clone()).or_insert(0);
                        *peak = (*peak).max(*used);
                    }
                    audit.granted.push((*lease_id, job, resources.clone()));
                }
                Event::LeaseReleased {
                    lease_id, reason, ..
                } => {
                    let resources = live.remove(lease_id).unwrap_or_else(|| {
                        panic!("lease {lease_id} released twice or never granted")
                    });
                    assert_eq!(
                        holding.remove(&job),
                        Some(*lease_id),
                        "{job} released a lease it did not hold"
                    );
                    for (name, amount) in resources {
                        *in_use.get_mut(&name).expect("granted") -= amount;
                    }
                    audit.released.push((*lease_id, reason.clone()));
                }
                Event::ModelDecided { .. }
                | Event::ToolFinished { .. }
                | Event::StepFinished { .. }
                    if jobs.contains(&job) && !holding.contains_key(&job) =>
                {
                    audit.steps_without_lease += 1;
                }
                _ => {}
            }
        }
    }
    audit
}

/// The audit of a harness's store, checked to end with nothing held.
pub fn audit_all_released(harness: &Harness, capacity: &[(&str, u32)]) -> Audit {
    let audit = audit(harness.runtime.store().as_ref(), capacity);
    assert_eq!(
        audit.granted.len(),
        audit.released.len(),
        "every lease granted is released exactly once: {audit:#?}"
    );
    assert_eq!(audit.steps_without_lease, 0, "no Job steps without a lease");
    audit
}

fn leases_of(events: &[openprogram::storage::EventEnvelope]) -> Vec<String> {
    events
        .iter()
        .filter_map(|envelope| match &envelope.event {
            Event::LeaseGranted { .. } => Some("granted".to_owned()),
            Event::LeaseReleased { reason, .. } => Some(format!("released:{reason}")),
            _ => None,
        })
        .collect()
}

/// J-1: Jobs wait their turn for a resource of capacity 1, one runs at a time, in admission
/// order; a waiting Job shows its place in line; each runs under a lease released in its
/// final transition.
#[tokio::test]
async fn j1_jobs_wait_their_turn_and_run_one_at_a_time_under_a_lease() {
    let harness = harness(&[("model", 1)]);
    let body = json!({"resources": {"model": 1}});
    let first = start_job(&harness, vec![sleep(150), reply("one")], body.clone()).await;
    let second = start_job(&harness, vec![echo("two"), reply("two")], body.clone()).await;
    let third = start_job(&harness, vec![echo("three"), reply("three")], body).await;
    harness.wait_for_state(first, "running").await;
    let waiting = harness
        .wait_for(third, "its place in line", |snapshot| {
            snapshot.job.as_ref().and_then(|job| job.queue_position) == Some(2)
        })
        .await;
    assert_eq!(waiting.state, "queued");
    assert_eq!(
        waiting.capabilities,
        vec!["pause", "steer", "cancel", "set_policy"]
    );
    let job = waiting.job.expect("a job view");
    assert_eq!(job.job_id, third, "job_id is execution_id");
    assert_eq!(job.lease_id, None);
    assert_eq!(job.admitted_at_ms, None);
    let reports = harness.runtime.resources().await.expect("the queue");
    let model = &reports.resources[0];
    assert_eq!(
        (model.name.as_str(), model.capacity, model.in_use),
        ("model", 1, 1)
    );
    assert_eq!(model.waiting, vec![second, third]);
    for execution in [first, second, third] {
        let done = harness.wait_for_state(execution, "completed").await;
        let job = done.job.expect("a job view");
        assert!(
            job.admitted_at_ms.is_some() && job.lease_id.is_none(),
            "{job:?}"
        );
        // A decision, the tool's result, the decision to reply.
        assert_eq!(job.budget_used.steps, 3, "{job:?}");
        assert_eq!(
            leases_of(&harness.events(execution)),
            vec!["granted", "released:completed"]
        );
    }
    let audit = audit_all_released(&harness, &[("model", 1)]);
    let order: Vec<ExecutionId> = audit.granted.iter().map(|(_, job, _)| *job).collect();
    assert_eq!(order, vec![first, second, third], "admission order");
}

/// J-1: a Job asks for several resources at once and gets all or none; a Job that cannot
/// run yet keeps the resources it asks for from the Jobs behind it.
#[tokio::test]
async fn j1_admission_is_all_or_nothing_across_resources() {
    let capacity = [("model", 2), ("gpu", 1)];
    let harness = harness(&capacity);
    let both = start_job(
        &harness,
        vec![sleep(100), reply("both")],
        json!({"resources": {"model": 1, "gpu": 1}}),
    )
    .await;
    let gpu = start_job(
        &harness,
        vec![reply("gpu")],
        json!({"resources": {"gpu": 1}}),
    )
    .await;
    let model = start_job(
        &harness,
        vec![reply("model")],
        json!({"resources": {"model": 1}}),
    )
    .await;
    for execution in [both, gpu, model] {
        harness.wait_for_state(execution, "completed").await;
    }
    let audit = audit_all_released(&harness, &capacity);
    assert_eq!(audit.peak.get("gpu"), Some(&1));
    assert!(audit.peak.get("model").is_some_and(|peak| *peak <= 2));
}

/// J-1 lifecycle: a Pause releases the lease (the next Job runs), Continue puts the Job
/// back in line, it runs again and its final transition releases its second lease.
#[tokio::test]
async fn j1_pause_releases_the_lease_and_continue_queues_it_again() {
    let harness = harness(&[("model", 1)]);
    let body = json!({"resources": {"model": 1}});
    let paused = start_job(
        &harness,
        vec![sleep(100), sleep(100), reply("paused one")],
        body.clone(),
    )
    .await;
    harness.wait_for_state(paused, "running").await;
    let other = start_job(&harness, vec![sleep(200), reply("other")], body).await;
    let reply = harness.command(paused, "pause", None).await;
    assert_eq!(reply.status, "applied", "{reply:?}");
    harness.wait_for_state(paused, "paused").await;
    harness.wait_for_state(other, "running").await;
    let reply = harness.command(paused, "continue", None).await;
    assert_eq!(reply.status, "applied", "{reply:?}");
    let queued = harness.snapshot(paused).await;
    assert_eq!(
        queued.state, "queued",
        "waits for the running Job: {queued:?}"
    );
    harness.wait_for_state(paused, "completed").await;
    harness.wait_for_state(other, "completed").await;
    assert_eq!(
        leases_of(&harness.events(paused)),
        vec![
            "granted",
            "released:paused",
            "granted",
            "released:completed"
        ]
    );
    audit_all_released(&harness, &[("model", 1)]);
}

/// J-1: Cancel of a queued Job removes it from the queue; it never held anything. A paused
/// Job holds nothing either.
#[tokio::test]
async fn j1_cancel_of_a_queued_job_removes_it_and_it_holds_nothing() {
    let harness = harness(&[("model", 1)]);
    let body = json!({"resources": {"model": 1}});
    let running = start_job(&harness, vec![sleep(200), reply("r")], body.clone()).await;
    harness.wait_for_state(running, "running").await;
    let queued = start_job(&harness, vec![reply("never")], body.clone()).await;
    let paused = start_job(&harness, vec![reply("later")], body).await;
    assert_eq!(
        harness.command(paused, "pause", None).await.status,
        "applied"
    );
    assert_eq!(
        harness.command(queued, "cancel", None).await.status,
        "applied"
    );
    let cancelled = harness.wait_for_state(queued, "cancelled").await;
    assert!(cancelled.job.expect("job").admitted_at_ms.is_none());
    harness.wait_for_state(running, "completed").await;
    // The queue hears of the release after the commit that made it: waited for, bounded.
    let started = std::time::Instant::now();
    let report = loop {
        let report = harness.runtime.resources().await.expect("the queue");
        if report.resources[0].in_use == 0 || started.elapsed() > DEADLINE {
            break report;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    assert_eq!(report.resources[0].in_use, 0, "{report:?}");
    assert!(report.resources[0].waiting.is_empty(), "{report:?}");
    assert!(leases_of(&harness.events(queued)).is_empty());
    assert!(leases_of(&harness.events(paused)).is_empty());
    assert_eq!(harness.snapshot(paused).await.state, "paused");
    audit_all_released(&harness, &[("model", 1)]);
}

/// J-1 budgets: `budget.steps` is charged per step under a lease; spent, the Job pauses
/// `budget_exhausted` and gives its lease back; Continue without more budget is refused
/// (`budget_exhausted`, nothing changes); Continue with a raised budget queues it again.
#[tokio::test]
async fn j1_a_spent_step_budget_pauses_the_job_and_a_raised_one_continues_it() {
    let harness = harness(&[("model", 1)]);
    let script = vec![echo("1"), echo("2"), echo("3"), reply("done")];
    let execution = start_job(
        &harness,
        script,
        json!({"resources": {"model": 1}, "budget": {"steps": 3, "wall_ms": 600_000}}),
    )
    .await;
    let paused = harness.wait_for_state(execution, "paused").await;
    assert_eq!(paused.pause_reason.as_deref(), Some("budget_exhausted"));
    let job = paused.job.clone().expect("job");
    assert_eq!(job.budget_used.steps, 3, "{job:?}");
    assert_eq!(job.lease_id, None, "the lease goes back with the pause");
    let refused = harness.command(execution, "continue", None).await;
    assert_eq!(refused.status, "rejected", "{refused:?}");
    assert_eq!(refused.code.as_deref(), Some("budget_exhausted"));
    let step = harness.command(execution, "step", None).await;
    assert_eq!(step.code.as_deref(), Some("budget_exhausted"));
    assert_eq!(harness.snapshot(execution).await.version, paused.version);
    let raised = harness
        .send(
            execution,
            json!({"kind": "continue", "budget": {"steps": 10}}),
        )
        .await;
    assert_eq!(raised.status, "applied", "{raised:?}");
    let done = harness.wait_for_state(execution, "completed").await;
    let budget = done.job.expect("job").budget;
    // The limit given is raised; the one not given stays.
    assert_eq!((budget.steps, budget.wall_ms), (Some(10), Some(600_000)));
    assert_eq!(
        leases_of(&harness.events(execution)),
        vec![
            "granted",
            "released:paused",
            "granted",
            "released:completed"
        ]
    );
    // A budget belongs to Jobs only.
    let agent = harness.start_paused(vec![reply("x")]).await;
    let refused = harness
        .send(agent, json!({"kind": "continue", "budget": {"steps": 1}}))
        .await;
    assert_eq!(refused.code.as_deref(), Some("jobs_only"));
    audit_all_released(&harness, &[("model", 1)]);
}

/// J-1: `budget.wall_ms` is charged only while the Job holds its lease: a Job that waited
/// in line longer than its whole wall budget still runs, and pauses `budget_exhausted`
/// once it held its lease that long.
#[tokio::test]
async fn j1_the_wall_budget_is_charged_only_under_a_lease() {
    let harness = harness(&[("model", 1)]);
    let blocker = start_job(
        &harness,
        vec![sleep(300), reply("b")],
        json!({"resources": {"model": 1}}),
    )
    .await;
    harness.wait_for_state(blocker, "running").await;
    let budgeted = start_job(
        &harness,
        vec![
            echo("first"),
            sleep(150),
            sleep(150),
            sleep(150),
            reply("never"),
        ],
        json!({"resources": {"model": 1}, "budget": {"wall_ms": 200}}),
    )
    .await;
    let paused = harness.wait_for_state(budgeted, "paused").await;
    assert_eq!(paused.pause_reason.as_deref(), Some("budget_exhausted"));
    let job = paused.job.expect("job");
    assert!(job.budget_used.steps >= 2, "it ran after waiting: {job:?}");
    assert!(job.budget_used.wall_ms >= 200, "{job:?}");
    let queued_for = job.admitted_at_ms.expect("admitted") - job.queued_at_ms;
    assert!(
        queued_for >= 200,
        "it waited longer than its budget: {job:?}"
    );
    audit_all_released(&harness, &[("model", 1)]);
}

/// J-1: a Job not leased within `queue_deadline_ms` ends `expired`, never run; Cancel is all
/// it offers then.
#[tokio::test]
async fn j1_a_passed_queue_deadline_ends_the_job_expired_never_run() {
    let harness = harness(&[("model", 1)]);
    let blocker = start_job(
        &harness,
        vec![sleep(1500), reply("b")],
        json!({"resources": {"model": 1}}),
    )
    .await;
    harness.wait_for_state(blocker, "running").await;
    let late = start_job(
        &harness,
        vec![reply("never")],
        json!({"resources": {"model": 1}, "queue_deadline_ms": 100}),
    )
    .await;
    let expired = harness.wait_for_state(late, "expired").await;
    assert_eq!(expired.capabilities, vec!["cancel"]);
    assert!(leases_of(&harness.events(late)).is_empty(), "never leased");
    assert_eq!(
        harness.command(late, "cancel", None).await.status,
        "applied"
    );
    harness.wait_for_state(blocker, "completed").await;
    audit_all_released(&harness, &[("model", 1)]);
}

/// J-1: what a Job may ask for is checked before anything is stored.
#[tokio::test]
async fn j1_unknown_resources_and_amounts_above_capacity_are_refused() {
    let harness = harness(&[("model", 2)]);
    for (body, code) in [
        (json!({"resources": {"gpu": 1}}), "unknown_resource"),
        (json!({"resources": {"model": 3}}), "exceeds_capacity"),
        (json!({"resources": {}}), "invalid_request"),
    ] {
        let refused = harness
            .runtime
            .start_execution(
                harness.session,
                StartRequest {
                    message: "x".into(),
                    job: job(body.clone()),
                    ..Default::default()
                },
            )
            .await
            .expect_err("refused");
        assert_eq!(refused.code(), code, "{body}");
    }
    assert!(harness
        .runtime
        .executions(harness.session)
        .await
        .expect("list")
        .is_empty());
}

/// J-2: a Job owns its user and assistant message ids from admission: the same through a
/// pause, a continue and its end, and its reply is the one message it names.
#[tokio::test]
async fn j2_a_job_keeps_the_message_ids_it_was_admitted_with() {
    let harness = harness(&[("model", 1)]);
    let started = harness
        .runtime
        .start_execution(
            harness.session,
            StartRequest {
                message: "a job".into(),
                script: elements(vec![sleep(100), reply("kept")]),
                job: job(json!({"resources": {"model": 1}})),
                ..Default::default()
            },
        )
        .await
        .expect("start");
    let execution = started.execution_id;
    harness.wait_for_state(execution, "running").await;
    harness.command(execution, "pause", None).await;
    harness.wait_for_state(execution, "paused").await;
    harness.command(execution, "continue", None).await;
    let done = harness.wait_for_state(execution, "completed").await;
    assert_eq!(done.user_message_id, started.user_message_id);
    assert_eq!(done.reply_message_id, started.reply_message_id);
    assert_eq!(done.turn_id, started.turn_id);
    assert_eq!(done.text, "kept");
}

/// J-1: a durable function runs as a Job too: its steps only under a lease.
#[tokio::test]
async fn j1_a_function_execution_runs_as_a_job() {
    let harness = harness(&[("model", 1)]);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("steps.log");
    let started = harness
        .runtime
        .start_function(
            harness.session,
            openprogram::FunctionStart {
                function: "steps".into(),
                input: json!({"count": 3, "path": path}),
                job: job(json!({"resources": {"model": 1}, "budget": {"steps": 2}})),
                ..Default::default()
            },
        )
        .await
        .expect("start");
    let execution = started.started.execution_id;
    let paused = harness.wait_for_state(execution, "paused").await;
    assert_eq!(paused.pause_reason.as_deref(), Some("budget_exhausted"));
    harness
        .send(
            execution,
            json!({"kind": "continue", "budget": {"steps": 5}}),
        )
        .await;
    harness.wait_for_state(execution, "completed").await;
    assert_eq!(
        std::fs::read_to_string(&path)
            .expect("lines")
            .lines()
            .count(),
        3
    );
    audit_all_released(&harness, &[("model", 1)]);
}

/// J-1: Retry of a Job makes a new Job: paused, like every child (K-2), with what the
/// original asked for and its budget unspent; continued, it waits for and runs under a lease
/// of its own.
#[tokio::test]
async fn j1_k3_a_retry_of_a_job_is_a_new_job_the_queue_runs_without_a_continue() {
    let harness = harness(&[("model", 1)]);
    let original = start_job(
        &harness,
        vec![echo("a"), reply("first")],
        json!({"resources": {"model": 1}, "budget": {"steps": 10}}),
    )
    .await;
    harness.wait_for_state(original, "completed").await;
    let reply = harness.command(original, "retry", None).await;
    assert_eq!(reply.status, "applied", "{reply:?}");
    let child = reply.execution_id.expect("a child");
    // K-3: not paused like an agent's child: it follows its scheduler, the queue.
    let done = harness.wait_for_state(child, "completed").await;
    let job = done.job.expect("a Job");
    assert_eq!(job.job_id, child);
    let original = harness.snapshot(original).await.job.expect("a Job");
    assert_eq!(
        job.budget.steps,
        Some(10),
        "the original's budget, unspent at first"
    );
    assert_eq!(
        job.budget_used.steps, original.budget_used.steps,
        "the same steps again"
    );
    let paused = harness.events(child).iter().any(|envelope| {
        matches!(&envelope.event, Event::StateChanged { state, .. } if *state == ExecutionState::Paused)
    });
    assert!(!paused, "a Job's retry never waits paused");
    assert_eq!(
        leases_of(&harness.events(child)),
        vec!["granted", "released:completed"]
    );
    audit_all_released(&harness, &[("model", 1)]);
}
