//! What `/proc` says of this process: CPU time and resident memory, for the load's report,
//! the parked bench and the server's `/metrics`. Linux only; elsewhere the readings are
//! unknown (`None` or 0).

use std::collections::BTreeMap;
use std::time::Duration;

/// CPU time this process has used so far, all threads, user and system
/// (`/proc/self/stat`); `None` where unknown.
pub fn process_cpu() -> Option<Duration> {
    cpu_of_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// CPU time this process's live threads have used so far, summed by role (`thread_role`);
/// `None` where unknown. A thread that has ended is no longer listed: callers that compare
/// two readings count its time under none of the roles.
pub fn cpu_by_thread_role() -> Option<BTreeMap<&'static str, Duration>> {
    let mut by_role = BTreeMap::new();
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        // A thread may end between the listing and the read: it is skipped.
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        if let (Some(name), Some(cpu)) = (thread_name(&stat), cpu_of_stat(&stat)) {
            *by_role.entry(thread_role(name)).or_default() += cpu;
        }
    }
    Some(by_role)
}

/// CPU time by thread role between two readings. What the roles' live threads do not account
/// for of the process's `cpu` (threads that ended meanwhile) is added to `other`.
pub fn cpu_by_role(
    before: &BTreeMap<&'static str, Duration>,
    after: &BTreeMap<&'static str, Duration>,
    cpu: Duration,
) -> BTreeMap<&'static str, Duration> {
    let mut spent: BTreeMap<_, _> = after
        .iter()
        .map(|(role, after)| {
            let before = before.get(role).copied().unwrap_or_default();
            (*role, after.saturating_sub(before))
        })
        .collect();
    let unaccounted = cpu.saturating_sub(spent.values().sum());
    *spent.entry("other").or_default() += unaccounted;
    spent
}

/// What a thread of this runtime does, from its name (as Linux keeps it, cut to 15 bytes):
/// `actors` (the actix system and its arbiters), `committer` (the store's one writer),
/// `sled_io` (sled's IO pool, writing its log buffers), `tokio` (a tokio runtime's workers:
/// the load driver under `openprogram load`), and `other`.
pub fn thread_role(name: &str) -> &'static str {
    if name.starts_with("actix-rt") || name.starts_with("openprogram-act") {
        "actors"
    } else if name.starts_with("openprogram-com") {
        "committer"
    } else if name.starts_with("sled-io") {
        "sled_io"
    } else if name.starts_with("tokio-rt") {
        "tokio"
    } else {
        "other"
    }
}

/// The command name of a `/proc/PID/stat` line: between the first `(` and the last `)`.
fn thread_name(stat: &str) -> Option<&str> {
    stat.get(stat.find('(')? + 1..stat.rfind(')')?)
}

/// utime + stime of a `/proc/PID/stat` line.
fn cpu_of_stat(stat: &str) -> Option<Duration> {
    // Linux reports them in clock ticks of USER_HZ, 100 per second on every mainstream
    // architecture.
    const TICKS_PER_S: u64 = 100;
    // After the command name, which is in parentheses and may contain spaces: field 3 on.
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    let ticks = |index: usize| fields.get(index)?.parse::<u64>().ok();
    // utime and stime are fields 14 and 15 of the whole line.
    let total = ticks(11)?.checked_add(ticks(12)?)?;
    Some(Duration::from_millis(
        total.saturating_mul(1000 / TICKS_PER_S),
    ))
}

/// Resident memory of this process now, in KiB (0 where unknown).
pub fn rss_kib() -> u64 {
    proc_status_kib("VmRSS:")
}

/// A `kB` field of `/proc/self/status` (0 where unknown).
fn proc_status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The peak resident memory of this process, from `/proc/self/status` (0 where unknown).
pub fn peak_rss_mib() -> f64 {
    proc_status_kib("VmHWM:") as f64 / 1024.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q1_cpu_time_is_read_after_a_command_name_with_spaces_and_parentheses() {
        // pid (comm) state ppid ... utime=250 stime=75 ticks (fields 14 and 15).
        let stat = "4242 (load (x) 1) R 1 4242 4242 0 -1 4194304 900 0 0 0 250 75 0 0 20 0 9 0";
        assert_eq!(cpu_of_stat(stat), Some(Duration::from_millis(3_250)));
        assert_eq!(cpu_of_stat("4242 (truncated) R 1"), None);
        assert_eq!(cpu_of_stat("no parentheses at all"), None);
    }

    #[test]
    fn q1_threads_are_grouped_by_the_role_their_names_give() {
        let stat = "4243 (actix-rt|system) S 1 4242 4242 0 -1 4194368 9 0 0 0 120 30 0 0";
        assert_eq!(thread_name(stat), Some("actix-rt|system"));
        assert_eq!(thread_name("4243 (a (b) c) S"), Some("a (b) c"));
        assert_eq!(thread_name("no parentheses"), None);
        let roles = [
            ("actix-rt|system", "actors"),
            ("openprogram-act", "actors"),
            ("openprogram-com", "committer"),
            ("sled-io-3", "sled_io"),
            ("tokio-rt-worker", "tokio"),
            ("openprogram-tic", "other"),
            ("openprogram", "other"),
        ];
        for (name, role) in roles {
            assert_eq!(thread_role(name), role, "{name}");
        }
    }

    #[test]
    fn q1_this_process_reads_its_threads_by_role() {
        let Some(before) = cpu_by_thread_role() else {
            return; // not Linux: nothing to read
        };
        // The test harness names its threads after the tests, so this thread is `other`:
        // its work shows there, one clock tick (10 ms) at a time.
        let other = |by_role: &BTreeMap<&str, Duration>| by_role.get("other").copied();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut work = 0u64;
        loop {
            let after = cpu_by_thread_role().unwrap_or_default();
            if other(&after) > other(&before) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "10 s of work never showed: {before:?} {after:?}"
            );
            for _ in 0..1_000_000 {
                work = std::hint::black_box(work.wrapping_add(1));
            }
        }
    }
}
