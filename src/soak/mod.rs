//! `openprogram soak`: the long versions of the fault harnesses (RELIABILITY.md), with one JSON
//! summary — R02 (the kill -9 loop, 1,000 kills), R22 (the model-based test, large) and R24 (10,000
//! executions under a crash loop). `cargo test` runs the same harnesses small (tests/it/kill9.rs,
//! tests/it/r22_model.rs). README's reliability table quotes a run committed under `benches/`.

pub mod cluster_loop;
pub mod kill_loop;
pub mod model;
pub mod model_check;
pub mod oracle;

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

use kill_loop::{KillLoopOptions, KillLoopReport};
use model_check::{ModelOptions, ModelReport};

/// What a soak runs; `None` skips a harness.
#[derive(Debug, Clone)]
pub struct SoakOptions {
    /// The `openprogram` binary the kill loops run as their server.
    pub binary: PathBuf,
    pub seed: u64,
    pub r02: Option<KillLoopOptions>,
    pub r22: Option<ModelOptions>,
    pub r24: Option<KillLoopOptions>,
}

impl SoakOptions {
    /// RELIABILITY.md's soak sizes: R02 with `kills` kills of 50 executions (their work grows with
    /// the kills, so the kills keep landing on work in progress), R22 with `cases` cases of 30
    /// actions, R24 with `r24_executions` executions of 10 appends and 20 kills.
    pub fn new(
        binary: PathBuf,
        seed: u64,
        kills: usize,
        cases: u64,
        r24_executions: usize,
    ) -> Self {
        let r02 = KillLoopOptions {
            binary: binary.clone(),
            seed,
            executions: 50,
            steps: (8 * kills / 20).max(8),
            cycles: kills,
            kill_after_ms: (50, 500),
            sleep_ms: (20, 250),
            admit_concurrency: 4,
            store: None,
        };
        // A server lives 6–12 s: recovering 10,000 executions while they run takes ~7 s here, so
        // most kills come after a recovery, and some during one. Each execution sleeps ~17 s in all
        // between its appends, so the kills keep landing on thousands of executions in flight.
        let r24 = KillLoopOptions {
            executions: r24_executions,
            steps: 10,
            cycles: 20,
            kill_after_ms: (6_000, 12_000),
            sleep_ms: (500, 3_000),
            admit_concurrency: 32,
            seed: seed.wrapping_add(24),
            ..r02.clone()
        };
        Self {
            binary,
            seed,
            r02: (kills > 0).then_some(r02),
            r22: (cases > 0).then_some(ModelOptions {
                seed: seed.wrapping_add(22),
                cases,
                actions_per_case: 30,
            }),
            r24: (r24_executions > 0).then_some(r24),
        }
    }
}

/// One soak run's summary.
#[derive(Debug, Clone, Serialize)]
pub struct SoakReport {
    pub seed: u64,
    pub r02: Option<KillLoopReport>,
    pub r22: Option<ModelReport>,
    pub r24: Option<KillLoopReport>,
    /// Every invariant held in every harness that ran.
    pub clean: bool,
    pub wall_s: f64,
}

/// Runs the harnesses in turn. `progress(harness, done, of)` reports each kill or case.
/// Needs a multi-thread tokio runtime: the kill loops block (`block_in_place`).
pub async fn run(
    options: &SoakOptions,
    progress: impl Fn(&str, u64, u64),
) -> Result<SoakReport, String> {
    let started = Instant::now();
    let kill_loop = |name: &str, options: &Option<KillLoopOptions>| {
        let run = |options: &KillLoopOptions| {
            let cycles = options.cycles as u64;
            kill_loop::run(options, |done| progress(name, done as u64, cycles))
        };
        tokio::task::block_in_place(|| options.as_ref().map(run).transpose())
    };
    let r02 = kill_loop("R02", &options.r02)?;
    let r22 = match options.r22 {
        Some(r22) => Some(model_check::run(r22, |done| progress("R22", done, r22.cases)).await),
        None => None,
    };
    let r24 = kill_loop("R24", &options.r24)?;
    let clean = r02.as_ref().is_none_or(KillLoopReport::clean)
        && r22.as_ref().is_none_or(|r22| r22.divergences == 0)
        && r24.as_ref().is_none_or(KillLoopReport::clean);
    Ok(SoakReport {
        seed: options.seed,
        r02,
        r22,
        r24,
        clean,
        wall_s: started.elapsed().as_secs_f64(),
    })
}
