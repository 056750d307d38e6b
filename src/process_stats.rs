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

/// One reading of this process's live threads: by thread id, its role (`thread_role`) and the
/// CPU time it has used so far; `None` where unknown. The time is `schedstat`'s nanoseconds
/// on a CPU where the kernel keeps them, else `stat`'s user and system ticks (10 ms each,
/// each rounded down: too coarse for a thread that ran a few milliseconds).
pub fn thread_cpu() -> Option<BTreeMap<u32, (&'static str, Duration)>> {
    let mut threads = BTreeMap::new();
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|name| name.parse().ok()) else {
            continue;
        };
        // A thread may end between the listing and the reads: it is skipped.
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let schedstat = std::fs::read_to_string(task.path().join("schedstat")).ok();
        let cpu = schedstat
            .as_deref()
            .and_then(cpu_of_schedstat)
            .or_else(|| cpu_of_stat(&stat));
        if let (Some(name), Some(cpu)) = (thread_name(&stat), cpu) {
            threads.insert(tid, (thread_role(name), cpu));
        }
    }
    Some(threads)
}

/// CPU time by thread role between two readings of `thread_cpu`: each thread's time since
/// the first reading (all of it for a thread started since), added to its role. What the
/// threads still live do not account for of the process's `cpu` (threads that ended
/// meanwhile, such as sled's idle IO threads) is added to `other`.
pub fn cpu_by_role(
    before: &BTreeMap<u32, (&'static str, Duration)>,
    after: &BTreeMap<u32, (&'static str, Duration)>,
    cpu: Duration,
) -> BTreeMap<&'static str, Duration> {
    let mut spent = BTreeMap::new();
    for (tid, (role, used)) in after {
        let earlier = before.get(tid).map(|(_, used)| *used).unwrap_or_default();
        *spent.entry(*role).or_insert(Duration::ZERO) += used.saturating_sub(earlier);
    }
    let unaccounted = cpu.saturating_sub(spent.values().sum());
    *spent.entry("other").or_insert(Duration::ZERO) += unaccounted;
    spent
}

/// The time on a CPU of a `/proc/PID/task/TID/schedstat` line: its first field, in ns.
fn cpu_of_schedstat(schedstat: &str) -> Option<Duration> {
    let nanos = schedstat.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(nanos))
}

/// What a thread of this runtime does, from its name (as Linux keeps it, cut to 15 bytes):
/// `actors` (the actix system and its arbiters), `committer` (the store's one writer),
/// `sled_io` (sled's IO pool, writing its log buffers), `tokio` (a tokio runtime's workers
/// and blocking threads: under `openprogram load` the load driver, and any tool that runs
/// blocking work), and `other`.
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
    fn q1_schedstat_gives_nanoseconds_on_a_cpu() {
        assert_eq!(
            cpu_of_schedstat("1838163 120 70\n"),
            Some(Duration::from_nanos(1_838_163))
        );
        assert_eq!(cpu_of_schedstat(""), None);
        assert_eq!(cpu_of_schedstat("x 1 2"), None);
    }

    #[test]
    fn q1_cpu_by_role_adds_each_threads_own_time_and_leaves_the_rest_to_other() {
        let ms = Duration::from_millis;
        let before = BTreeMap::from([(1, ("actors", ms(100))), (2, ("sled_io", ms(50)))]);
        // Thread 2 ended (its 30 ms since `before` are only in the process total); thread 3
        // started; thread 1 ran 40 ms more.
        let after = BTreeMap::from([(1, ("actors", ms(140))), (3, ("sled_io", ms(5)))]);
        let spent = cpu_by_role(&before, &after, ms(75));
        assert_eq!(spent["actors"], ms(40));
        assert_eq!(spent["sled_io"], ms(5));
        assert_eq!(spent["other"], ms(30));
    }

    #[test]
    fn q1_this_process_reads_its_threads_by_role() {
        let Some(before) = thread_cpu() else {
            return; // not Linux: nothing to read
        };
        // The test harness names its threads after the tests, so this thread is `other`.
        let other = |after: &BTreeMap<u32, (&'static str, Duration)>| {
            cpu_by_role(&before, after, Duration::ZERO)
                .get("other")
                .copied()
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut work = 0u64;
        loop {
            let after = thread_cpu().unwrap_or_default();
            if other(&after) > Some(Duration::ZERO) {
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
