//! K-3, K-4 (issue 28), model-based: for every control kind in every reachable state,
//! (a) the kind is among the snapshot's capabilities exactly when the runtime accepts it
//! (a fresh command id, the current version, valid arguments); (b) a rejection leaves the
//! snapshot, version, events and capabilities exactly as they were, its record alone says
//! `rejected`, and the version read before it still commands; (c) an accepted command does
//! what SPEC's control table says. States are built through the library on a real store,
//! with restarts (the runtime halted and the store reopened) between steps, chosen by a
//! seeded generator: `K3_SEED=N` replays a run, `K3_CASES=N` runs N rounds over every state
//! (default 1). A state is one line in `STATES`; a control kind is checked as soon as
//! `CommandKind` has it.
//!
//! `cancelling` is not here: in the runtime it lasts only until the effect in flight is
//! aborted (immediately). The machine-level property (`machine/sim.rs`, R10) checks (a) in
//! every state the seeded simulation reaches, `cancelling` among them.

use futures::FutureExt;
use rand::seq::SliceRandom;
use rand::Rng;

use crate::k3_states::*;
use crate::k3_world::{Build, World};
use crate::support::{echo, reply};

/// Every reachable state the properties are checked in: one line each.
const STATES: &[(&str, Build)] = &[
    ("running a tool", |w| running_a_tool(w).boxed()),
    ("running, pause requested", |w| pause_requested(w).boxed()),
    ("stepping through a tool", |w| stepping(w).boxed()),
    ("paused at admission", |w| paused_at_start(w).boxed()),
    ("paused after a step", |w| paused_after_step(w).boxed()),
    ("waiting on an approval", |w| waiting_on_approval(w).boxed()),
    ("waiting on a structured question", |w| {
        waiting_on_a_question(w).boxed()
    }),
    ("paused, its wait expired", |w| wait_expired(w).boxed()),
    ("completed, a session grant given", |w| granted(w).boxed()),
    ("asking a live question", |w| asking_live(w).boxed()),
    ("ended with its process running", |w| {
        process_running(w).boxed()
    }),
    ("reconciliation required", |w| {
        reconciliation_required(w).boxed()
    }),
    ("completed, reply only", |w| {
        ended(w, vec![reply("done")], None).boxed()
    }),
    ("completed with tool steps", |w| {
        ended(w, vec![echo("a"), echo("b"), reply("done")], None).boxed()
    }),
    ("failed at its iteration limit", |w| {
        ended(w, vec![echo("a"), echo("b"), reply("never")], Some(1)).boxed()
    }),
    ("cancelled", |w| cancelled(w).boxed()),
    ("expired", |w| expired(w).boxed()),
    ("a fork child", |w| child(w, "fork").boxed()),
    ("a retry child", |w| child(w, "retry").boxed()),
    ("a function paused at admission", |w| {
        function_paused_at_start(w).boxed()
    }),
    ("a function running a step", |w| function_running(w).boxed()),
    ("a function completed", |w| function_completed(w).boxed()),
    ("a function cancelled", |w| function_cancelled(w).boxed()),
    ("a Job queued behind another", |w| queued_job(w).boxed()),
    ("a Job paused, its budget spent", |w| {
        budget_paused_job(w).boxed()
    }),
    ("a Job expired in the queue", |w| expired_job(w).boxed()),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k3_capabilities_are_exactly_what_is_accepted_and_a_rejection_changes_nothing() {
    let seed = std::env::var("K3_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen::<u64>());
    let rounds: usize = std::env::var("K3_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(1);
    eprintln!("k3 property: seed {seed} (replay with K3_SEED={seed}), {rounds} round(s)");
    let mut world = World::new(seed);
    for round in 0..rounds {
        let mut states: Vec<&(&str, Build)> = STATES.iter().collect();
        states.shuffle(&mut world.rng);
        for (name, build) in states {
            let case = format!("seed {seed}, round {round}, {name}");
            world.check_state(&case, *build).await;
        }
    }
    world.finish();
}
