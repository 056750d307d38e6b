//! R22 (RELIABILITY.md), model-based, small: random scripts and random commands — every
//! control kind, duplicates, reused ids, stale versions — with crashes and restarts, on the
//! runtime and on an in-memory model of SPEC's rules; after every action state, reply text,
//! open wait and the sink's lines must agree. The harness is `openprogram::soak::model_check`,
//! which `openprogram soak` runs large. A divergence prints the seed and the shrunk history.
//! `R22_SEED` replays a run; `R22_CASES` and `R22_ACTIONS` size it.

use openprogram::soak::model_check::{run, ModelOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r22_random_commands_crashes_and_restarts_agree_with_the_model() {
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let options = ModelOptions {
        seed: env("R22_SEED").unwrap_or_else(rand::random),
        cases: env("R22_CASES").unwrap_or(24),
        actions_per_case: env("R22_ACTIONS").unwrap_or(20) as usize,
    };
    let seed = options.seed;
    eprintln!("R22 seed: {seed} (replay with R22_SEED={seed}), {options:?}");
    let report = run(options, |_| {}).await;
    if let Some(divergence) = &report.divergence {
        panic!("R22 divergence (R22_SEED={seed}): {divergence}");
    }
    eprintln!(
        "R22: {} cases, {} actions, {} crashes, no divergence",
        report.cases, report.actions, report.crashes
    );
    assert_eq!(report.cases, options.cases, "{report:?}");
}
