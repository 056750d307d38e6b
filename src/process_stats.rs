//! What `/proc` says of this process: CPU time and resident memory, for the load's report,
//! the parked bench and the server's `/metrics`. Linux only; elsewhere the readings are
//! unknown (`None` or 0).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// CPU time this process has used so far, all threads, user and system
/// (`/proc/self/stat`); `None` where unknown.
pub fn process_cpu() -> Option<Duration> {
    cpu_of_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// Bytes written so far to the block device that holds `dir` (the sectors written of
/// `/sys/dev/block/MAJOR:MINOR/stat`): what reached the device, from every process. Not
/// `/proc/self/io`'s `write_bytes`, which counts a page cache folio whole when a write dirties
/// part of it: the journal's frames overwrite zeros cached in large folios, and were counted
/// ten times over. `None` where unknown (no block device of its own, not Linux).
pub fn disk_written(dir: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let device = std::fs::metadata(dir).ok()?.dev();
    let (major, minor) = (rustix::fs::major(device), rustix::fs::minor(device));
    let stat = std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/stat")).ok()?;
    let sectors: u64 = stat.split_whitespace().nth(6)?.parse().ok()?;
    Some(sectors * 512)
}

/// One thread in a reading of `thread_times`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadTimes {
    /// What the thread does (`thread_role`).
    pub role: &'static str,
    /// Time on a CPU so far.
    pub cpu: Duration,
    /// Time runnable but waiting for a CPU so far (the scheduler's run queue); `None` where
    /// the kernel keeps no `schedstat` (or keeps it switched off: it then says `0 0 0`).
    pub waited: Option<Duration>,
}

/// One reading of this process's live threads, by thread id; `None` where unknown. The CPU time is
/// `schedstat`'s nanoseconds where the kernel keeps them, else `stat`'s user and system ticks (10
/// ms each, each rounded down: too coarse for a thread that ran a few milliseconds).
pub fn thread_times() -> Option<BTreeMap<u32, ThreadTimes>> {
    let mut threads = BTreeMap::new();
    let has_schedstat = std::path::Path::new("/proc/self/schedstat").exists();
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let Some(tid) = task.file_name().to_str().and_then(|name| name.parse().ok()) else {
            continue;
        };
        // A thread may end between the listing and the reads: it is skipped.
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let schedstat = match std::fs::read_to_string(task.path().join("schedstat")) {
            Ok(schedstat) => Some(schedstat),
            // It ended since: skipped, as above (its times are only in the process's).
            Err(_) if has_schedstat => continue,
            Err(_) => None,
        };
        let (cpu, waited) = match schedstat.as_deref().and_then(times_of_schedstat) {
            Some((cpu, waited)) => (Some(cpu), Some(waited)),
            None => (cpu_of_stat(&stat), None),
        };
        if let (Some(name), Some(cpu)) = (thread_name(&stat), cpu) {
            let role = thread_role(name);
            threads.insert(tid, ThreadTimes { role, cpu, waited });
        }
    }
    Some(threads)
}

/// CPU time by thread role between two readings of `thread_times`: each thread's time since
/// the first reading (all of it for a thread started since), added to its role. What the
/// threads still live do not account for of the process's `cpu` (threads that ended
/// meanwhile, such as sled's idle IO threads) is added to `other`.
pub fn cpu_by_role(
    before: &BTreeMap<u32, ThreadTimes>,
    after: &BTreeMap<u32, ThreadTimes>,
    cpu: Duration,
) -> BTreeMap<&'static str, Duration> {
    let mut spent = BTreeMap::new();
    for (tid, times) in after {
        let earlier = before.get(tid).map(|times| times.cpu).unwrap_or_default();
        *spent.entry(times.role).or_insert(Duration::ZERO) += times.cpu.saturating_sub(earlier);
    }
    let unaccounted = cpu.saturating_sub(spent.values().sum());
    *spent.entry("other").or_insert(Duration::ZERO) += unaccounted;
    spent
}

/// Time spent waiting for a CPU by thread role between two readings of `thread_times`, summed over
/// the role's threads still live at the second (two threads of a role each waiting half the time
/// add up to all of it); a thread whose wait is unknown is left out, and `None` if no thread's is
/// known (no `schedstat`). A thread busy on a machine with fewer cores than runnable threads waits
/// here: when it is the committer, every commit waits with it.
pub fn waited_by_role(
    before: &BTreeMap<u32, ThreadTimes>,
    after: &BTreeMap<u32, ThreadTimes>,
) -> Option<BTreeMap<&'static str, Duration>> {
    let mut waited = BTreeMap::new();
    for (tid, times) in after {
        let Some(now) = times.waited else {
            continue;
        };
        let earlier = before.get(tid).and_then(|times| times.waited);
        *waited.entry(times.role).or_insert(Duration::ZERO) +=
            now.saturating_sub(earlier.unwrap_or_default());
    }
    (!waited.is_empty()).then_some(waited)
}

/// A `/proc/PID/task/TID/schedstat` line: time on a CPU and time waiting on a run queue (its
/// first two fields, in ns).
fn times_of_schedstat(schedstat: &str) -> Option<(Duration, Duration)> {
    let mut fields = schedstat.split_whitespace().map(|field| field.parse().ok());
    let (cpu, waited) = (fields.next()??, fields.next()??);
    // A kernel built with schedstat but with it switched off says `0 0 0` for every thread.
    if cpu == 0 && waited == 0 {
        return None;
    }
    Some((Duration::from_nanos(cpu), Duration::from_nanos(waited)))
}

/// What a thread of this runtime does, from its name (as Linux keeps it, cut to 15 bytes): `actors`
/// (the actix system and its arbiters), `committer` (the store's one writer), `sled_io` (sled's IO
/// pool, writing its log buffers), `tokio` (a tokio runtime's workers and blocking threads: under
/// `openprogram load` the load driver, and any tool that runs blocking work), and `other`.
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
    status_kib("self", "VmRSS:")
}

/// A `kB` field of `/proc/PROCESS/status`, `self` or a pid (0 where unknown).
pub(crate) fn status_kib(process: &str, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{process}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The peak resident memory of this process, from `/proc/self/status` (0 where unknown).
pub fn peak_rss_mib() -> f64 {
    status_kib("self", "VmHWM:") as f64 / 1024.0
}

/// The process's CPU and its threads' times at a start. The threads are read inside the
/// process's readings, so that their sum stays within it.
pub(crate) struct Readings {
    cpu: Option<Duration>,
    threads: Option<BTreeMap<u32, ThreadTimes>>,
    /// The store's directory, and what its device had written.
    disk: (PathBuf, Option<u64>),
}

/// What the process spent since its `Readings`: CPU in all and by thread role, and each
/// role's wait for a CPU.
pub(crate) struct Spent {
    pub cpu: Option<Duration>,
    pub roles: Option<BTreeMap<&'static str, Duration>>,
    pub waited: Option<BTreeMap<&'static str, Duration>>,
    /// Bytes written to the store's device (`disk_written`).
    pub written: Option<u64>,
}

impl Readings {
    /// Readings now, the disk's of the device that holds `dir`.
    pub(crate) fn now(dir: &Path) -> Self {
        let cpu = process_cpu();
        Self {
            cpu,
            threads: thread_times(),
            disk: (dir.to_path_buf(), disk_written(dir)),
        }
    }

    pub(crate) fn since(self) -> Spent {
        let threads_after = thread_times();
        let cpu = process_cpu()
            .zip(self.cpu)
            .map(|(after, before)| after.saturating_sub(before));
        let waited = self
            .threads
            .as_ref()
            .zip(threads_after.as_ref())
            .and_then(|(before, after)| waited_by_role(before, after));
        let roles = self
            .threads
            .zip(threads_after)
            .zip(cpu)
            .map(|((before, after), cpu)| cpu_by_role(&before, &after, cpu));
        let (dir, written_before) = self.disk;
        let written = disk_written(&dir)
            .zip(written_before)
            .map(|(after, before)| after.saturating_sub(before));
        Spent {
            cpu,
            roles,
            waited,
            written,
        }
    }
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
    fn q1_schedstat_gives_nanoseconds_on_a_cpu_and_waiting_for_one() {
        assert_eq!(
            times_of_schedstat("1838163 120 70\n"),
            Some((Duration::from_nanos(1_838_163), Duration::from_nanos(120)))
        );
        assert_eq!(times_of_schedstat(""), None);
        assert_eq!(times_of_schedstat("1838163"), None);
        assert_eq!(times_of_schedstat("x 1 2"), None);
        assert_eq!(times_of_schedstat("1 x 2"), None);
        assert_eq!(
            times_of_schedstat("0 0 0\n"),
            None,
            "schedstat switched off"
        );
    }

    fn times(role: &'static str, cpu_ms: u64, waited_ms: Option<u64>) -> ThreadTimes {
        ThreadTimes {
            role,
            cpu: Duration::from_millis(cpu_ms),
            waited: waited_ms.map(Duration::from_millis),
        }
    }

    #[test]
    fn q1_waits_for_a_cpu_add_up_by_role_over_the_threads_still_live() {
        let ms = Duration::from_millis;
        let before = BTreeMap::from([
            (1, times("actors", 100, Some(10))),
            (2, times("actors", 100, Some(20))),
            (3, times("committer", 50, Some(5))),
        ]);
        // Both arbiters waited 30 ms more; the committer 12; a new sled IO thread 4.
        let after = BTreeMap::from([
            (1, times("actors", 150, Some(40))),
            (2, times("actors", 150, Some(50))),
            (3, times("committer", 90, Some(17))),
            (4, times("sled_io", 1, Some(4))),
        ]);
        let waited = waited_by_role(&before, &after).expect("schedstat kept");
        assert_eq!(waited["actors"], ms(60));
        assert_eq!(waited["committer"], ms(12));
        assert_eq!(waited["sled_io"], ms(4));
        // A thread whose wait is unknown is left out; without schedstat nothing is known.
        let partly = BTreeMap::from([
            (1, times("actors", 150, None)),
            (3, times("committer", 90, Some(17))),
        ]);
        let waited = waited_by_role(&before, &partly).expect("the committer's is known");
        assert_eq!(waited.get("actors"), None);
        assert_eq!(waited["committer"], ms(12));
        let unknown = BTreeMap::from([(1, times("actors", 150, None))]);
        assert_eq!(waited_by_role(&before, &unknown), None);
    }

    #[test]
    fn q1_cpu_by_role_adds_each_threads_own_time_and_leaves_the_rest_to_other() {
        let ms = Duration::from_millis;
        let before = BTreeMap::from([
            (1, times("actors", 100, None)),
            (2, times("sled_io", 50, None)),
        ]);
        // Thread 2 ended (its 30 ms since `before` are only in the process total); thread 3
        // started; thread 1 ran 40 ms more.
        let after = BTreeMap::from([
            (1, times("actors", 140, None)),
            (3, times("sled_io", 5, None)),
        ]);
        let spent = cpu_by_role(&before, &after, ms(75));
        assert_eq!(spent["actors"], ms(40));
        assert_eq!(spent["sled_io"], ms(5));
        assert_eq!(spent["other"], ms(30));
    }

    #[test]
    fn q1_this_process_reads_its_threads_by_role() {
        let Some(before) = thread_times() else {
            return; // not Linux: nothing to read
        };
        // The test harness names its threads after the tests, so this thread is `other`.
        let other = |after: &BTreeMap<u32, ThreadTimes>| {
            cpu_by_role(&before, after, Duration::ZERO)
                .get("other")
                .copied()
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut work = 0u64;
        loop {
            let after = thread_times().unwrap_or_default();
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
