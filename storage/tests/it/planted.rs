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
