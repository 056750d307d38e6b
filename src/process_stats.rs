//! What `/proc` says of this process: CPU time and resident memory, for the load's report,
//! the parked bench and the server's `/metrics`. Linux only; elsewhere the readings are
//! unknown (`None` or 0).

use std::time::Duration;

/// CPU time this process has used so far, all threads, user and system
/// (`/proc/self/stat`); `None` where unknown.
pub fn process_cpu() -> Option<Duration> {
    cpu_of_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)
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
}
