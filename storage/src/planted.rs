//! Planted bugs (RELIABILITY.md, "a harness needs planted-bug runs that must fail"): a
//! process started with `OP_PLANTED_BUG=NAME` carries one known defect, so that a
//! test can prove its harness catches it. `tests/it/planted.rs` runs each harness with its
//! bug and requires it to fail; a harness that passes with the bug in place has a blind spot.
//!
//! Like the failpoints (`failpoints.rs`), the switch is read from the environment rather
//! than compiled in by a feature, so the binary the harnesses drive is the one that ships.
//! Nothing is planted unless the variable names a bug; a process that plants one says so
//! on stderr.

use std::sync::OnceLock;

/// The known defects a harness must catch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bug {
    /// The committer acknowledges after sled's `flush()` alone, which ends in
    /// `sync_file_range` and is not durable: no fsync of the data file. Caught by R03.
    AckBeforeFsync,
    /// Storage accepts a write from an attempt whose epoch is older than the execution's
    /// newest: no fencing check (the version check still runs). Caught by S-2's fencing
    /// test, which writes as a stale attempt with the current version. In the runtime, the
    /// version check and the superseded actor's stop fence a stale attempt too (R05 passes
    /// with this bug): the epoch is the check of last resort.
    SkipFencing,
    /// Restart recovery runs the newest confirmed effect of every execution it takes over
    /// once more. Caught by R02.
    RerunConfirmed,
    /// A tool's reconcile protocol is not asked: an effect whose outcome is unknown is
    /// recorded confirmed. Caught by R01.
    FabricateReceipt,
    /// The resource queue leases one unit more than a resource's capacity (J-1). Caught by
    /// the Jobs property test's lease audit.
    OvercommitLease,
}

impl Bug {
    /// Every bug, with the name `OP_PLANTED_BUG` takes.
    pub const ALL: [(Bug, &'static str); 5] = [
        (Bug::AckBeforeFsync, "ack_before_fsync"),
        (Bug::SkipFencing, "skip_fencing"),
        (Bug::RerunConfirmed, "rerun_confirmed"),
        (Bug::FabricateReceipt, "fabricate_receipt"),
        (Bug::OvercommitLease, "overcommit_lease"),
    ];

    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(bug, _)| *bug == self)
            .map_or("", |(_, name)| name)
    }
}

static PLANTED: OnceLock<Option<Bug>> = OnceLock::new();

/// Whether this process carries `bug` (the environment is read once).
#[inline]
pub fn planted(bug: Bug) -> bool {
    *PLANTED.get_or_init(from_env) == Some(bug)
}

fn from_env() -> Option<Bug> {
    let name = std::env::var("OP_PLANTED_BUG").ok()?;
    match Bug::ALL.iter().find(|(_, known)| *known == name) {
        Some((bug, _)) => {
            eprintln!("openprogram: planted bug {name}: this process is defective on purpose");
            Some(*bug)
        }
        None => {
            eprintln!("openprogram: OP_PLANTED_BUG={name} names no bug; nothing planted");
            None
        }
    }
}

/// For the planted-bug tests: runs the test `name` of the current test binary alone, in a
/// child process with `bug` planted. `Ok` with the line that says why, if it failed as it
/// must — with `expected` in its output, the check the bug must break (a failure for any
/// other reason, such as a missing tool, is no proof); `Err` with its output otherwise.
/// `env`: more variables for the child (a harness's size or seed).
pub fn harness_fails(
    bug: &str,
    name: &str,
    expected: &str,
    env: &[(&str, &str)],
) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|error| format!("the test binary: {error}"))?;
    let output = std::process::Command::new(exe)
        .args([name, "--exact", "--include-ignored", "--test-threads=1"])
        .env("OP_PLANTED_BUG", bug)
        .envs(env.iter().copied())
        .output()
        .map_err(|error| format!("running {name}: {error}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    // The harness ran (it was not filtered out or ignored) and failed.
    if output.status.success() || !stdout.contains(&format!("test {name} ... FAILED")) {
        return Err(format!(
            "{name} did not fail with the planted bug {bug}:\n{stdout}\n{stderr}"
        ));
    }
    if !stdout.contains(expected) && !stderr.contains(expected) {
        return Err(format!(
            "{name} failed with the planted bug {bug}, but not at the check it must break \
             ({expected:?}):\n{stdout}\n{stderr}"
        ));
    }
    let reason = stdout
        .lines()
        .chain(stderr.lines())
        .find(|line| line.contains("panicked at") || line.starts_with("assertion"))
        .unwrap_or("(no panic line)");
    Ok(reason.to_owned())
}
