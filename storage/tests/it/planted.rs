//! Planted bugs (RELIABILITY.md): the storage harness that must catch `skip_fencing` runs
//! once more in a child process of this test binary with the bug planted, and must fail
//! there (see `openprogram_storage::planted`; the runtime's harnesses: tests/it/planted.rs).

use openprogram_storage::planted::harness_fails;

#[test]
fn planted_skip_fencing_fails_s2() {
    let name = "s2_transitions::s2_fenced_writer_is_rejected_and_newer_epoch_claims";
    // The stale attempt's write with the current version must come back `Fenced`.
    match harness_fails("skip_fencing", name, "right: Fenced", &[]) {
        Ok(reason) => eprintln!("planted skip_fencing: {name} failed as it must: {reason}"),
        Err(passed) => panic!("{passed}"),
    }
}

/// Issue 51: the commit rule is one (`commit.rs`), so a bug planted in it fails the
/// conformance suite on sled and on PostgreSQL alike.
#[test]
fn planted_skip_fencing_fails_the_conformance_suite_on_sled() {
    planted_skip_fencing_fails_conformance_on("sled");
}

#[test]
#[ignore = "needs PostgreSQL (apt-get install postgresql); run with \
            `cargo test --workspace -- --include-ignored`"]
fn planted_skip_fencing_fails_the_conformance_suite_on_postgres() {
    planted_skip_fencing_fails_conformance_on("postgres");
}

fn planted_skip_fencing_fails_conformance_on(backend: &str) {
    let name =
        format!("conformance::{backend}::s2_a_fenced_writer_is_refused_and_a_newer_epoch_claims");
    match harness_fails("skip_fencing", &name, "right: Fenced", &[]) {
        Ok(reason) => eprintln!("planted skip_fencing: {name} failed as it must: {reason}"),
        Err(passed) => panic!("{passed}"),
    }
}
