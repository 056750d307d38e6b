//! Planted bugs (RELIABILITY.md: "a harness needs planted-bug runs that must fail"): each
//! harness runs once more, in a child process of this test binary, with a known bug planted
//! (`OP_PLANTED_BUG`, storage's `planted.rs`), and must fail there. A harness that passes
//! with its bug in place has a blind spot; the same harness passes in the suite without it.
//! The variable reaches the runtime in the child and every `serve` the harness starts.
//! (`skip_fencing` is storage's: `storage/tests/it/planted.rs`.)

/// Runs the test `name` of this binary alone with `bug` planted; panics unless it failed.
fn fails_with_planted_bug(bug: &str, name: &str, expected: &str, env: &[(&str, &str)]) {
    match openprogram::storage::planted::harness_fails(bug, name, expected, env) {
        Ok(reason) => eprintln!("planted {bug}: {name} failed as it must: {reason}"),
        Err(passed) => panic!("{passed}"),
    }
}

#[test]
fn planted_rerun_confirmed_fails_r02() {
    fails_with_planted_bug(
        "rerun_confirmed",
        "kill9::r02_kill9_loop_delivers_every_effect_exactly_once_with_the_original_ids",
        "I1: ",
        &[],
    );
}

/// The same bug under the kill loop on PostgreSQL (N-1): the harness sees it there too.
#[test]
#[ignore = "needs PostgreSQL (apt-get install postgresql); run with \
            `cargo test --workspace -- --include-ignored`"]
fn planted_rerun_confirmed_fails_n1_r02_on_postgres() {
    fails_with_planted_bug(
        "rerun_confirmed",
        "postgres::n1_r02_kill9_loop_on_postgres_delivers_every_effect_exactly_once",
        "I1: ",
        &[],
    );
}

/// R22 meets the bug only where a crash leaves a turn running with a confirmed effect
/// behind it: a seed and a size that make many such crashes.
#[test]
fn planted_rerun_confirmed_fails_r22() {
    fails_with_planted_bug(
        "rerun_confirmed",
        "r22_model::r22_random_commands_crashes_and_restarts_agree_with_the_model",
        "I1/I8: the sink received",
        &[
            ("R22_SEED", "665137692479895756"),
            ("R22_CASES", "200"),
            ("R22_ACTIONS", "30"),
        ],
    );
}

#[test]
fn planted_overcommit_lease_fails_the_jobs_property() {
    fails_with_planted_bug(
        "overcommit_lease",
        "jobs_property::j1_capacity_is_never_exceeded_by_a_thousand_jobs_under_random_controls",
        "over capacity",
        &[],
    );
}

#[test]
fn planted_fabricate_receipt_fails_r01() {
    fails_with_planted_bug(
        "fabricate_receipt",
        "r01_failpoints::r01_a_crash_at_each_boundary_of_the_effect_path_loses_and_repeats_nothing",
        "every step delivered once",
        &[],
    );
}

#[test]
#[ignore = "needs strace and eatmydata (beyond the Rust toolchain), as R03 does: `.ci/run` \
            installs them and runs it; or `apt-get install -y strace eatmydata` and \
            `cargo test --test it -- --include-ignored planted`"]
fn planted_ack_before_fsync_fails_r03() {
    fails_with_planted_bug(
        "ack_before_fsync",
        "r03_ack_after_fsync::r03_every_acknowledgement_follows_the_fsync_that_covers_it",
        "durable responses after/before fsync",
        &[],
    );
}
