//! Failpoints at the durable boundaries of RELIABILITY.md (B01–B14): a process started with
//! `OP_FAILPOINT=B05` (or `B05:3`, skipping the first 3 hits) aborts at that boundary, as a
//! crash there would leave the store; R01 (tests/it/r01_failpoints.rs) reopens it and checks
//! the invariants against an oracle outside the data dir.
//!
//! Why not the `fail` crate: its failpoints are compiled in or out by a cargo feature, and a
//! feature turned on for the tests through a dev-dependency is turned on for every bench
//! too (cargo unifies dev-dependency features for tests, examples and benches). Here a
//! boundary costs one relaxed atomic load while nothing is armed, in every build, so the
//! binary the tests drive is the binary that ships.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;

static ARMED: AtomicBool = AtomicBool::new(false);
static TARGET: OnceLock<(String, u64)> = OnceLock::new();
static HITS: AtomicU64 = AtomicU64::new(0);

/// Every boundary's name, as RELIABILITY.md numbers them. Where each sits here:
/// B01 a command received, nothing persisted (service) · B02 a group durable in the journal,
/// not applied to sled · B03 the group applied, no caller answered (committer) ·
/// B04 an attempt's claim durable, its lease actor not started · B05 `ToolDispatched`
/// durable, the tool not started · B06 `append`'s line written and fsynced, its response not
/// returned · B07 a tool's response in hand, its receipt not decided · B08 a group written
/// to the journal, not fdatasynced · B09 a group decided, nothing written · B10 sled made
/// durable behind the journal (the flusher), the acknowledged mark not yet recorded (S-7) —
/// B02, B08 and B09 are inside one group's commit, which must be atomic ·
/// B11 an admission's or command's outcome durable, its HTTP reply not sent · B12 a cancel
/// durable, the effect in flight not told · B13 inside startup recovery, one claim durable ·
/// B14 an OS process spawned, its identity not persisted.
pub const BOUNDARIES: [&str; 14] = [
    "B01", "B02", "B03", "B04", "B05", "B06", "B07", "B08", "B09", "B10", "B11", "B12", "B13",
    "B14",
];

/// Arms the failpoint `OP_FAILPOINT` names, if any (call once, at process start). Returns
/// what was armed.
pub fn arm_from_env() -> Option<(String, u64)> {
    let spec = std::env::var("OP_FAILPOINT").ok()?;
    let (name, skip) = match spec.split_once(':') {
        Some((name, skip)) => match skip.parse() {
            Ok(skip) => (name.to_owned(), skip),
            Err(_) => {
                eprintln!(
                    "openprogram: OP_FAILPOINT={spec}: the skip is not a number; nothing armed"
                );
                return None;
            }
        },
        None => (spec, 0),
    };
    if !BOUNDARIES.contains(&name.as_str()) {
        eprintln!("openprogram: OP_FAILPOINT={name} names no boundary; nothing armed");
        return None;
    }
    let armed = TARGET.get_or_init(|| (name, skip)).clone();
    ARMED.store(true, Ordering::Release);
    Some(armed)
}

/// Whether any failpoint is armed: the only cost of a boundary when none is.
#[inline]
pub fn armed() -> bool {
    ARMED.load(Ordering::Relaxed)
}

/// At boundary `name`: aborts the process if it is the armed one and its skips are spent.
#[cold]
pub fn hit(name: &str) {
    let Some((target, skip)) = TARGET.get() else {
        return;
    };
    if target != name || HITS.fetch_add(1, Ordering::AcqRel) < *skip {
        return;
    }
    eprintln!("openprogram: failpoint {name} reached: aborting");
    std::process::abort();
}

/// A durable boundary (RELIABILITY.md): `failpoint!("B02")`.
#[macro_export]
macro_rules! failpoint {
    ($name:literal) => {
        if $crate::failpoints::armed() {
            $crate::failpoints::hit($name)
        }
    };
}
