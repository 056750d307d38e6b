//! A share of a core for a process and the threads it starts: a cgroup v1 `cpu` group with a
//! CFS quota (`cpu.cfs_quota_us` per `cpu.cfs_period_us`). `openprogram cluster
//! --cpu-per-node` caps each node with one, so that on one machine the nodes, not the
//! machine, are the limit, as they would be on machines of their own (issue 52's scale-out
//! bench). Needs root and the controller mounted at `/sys/fs/cgroup/cpu`.

use std::path::PathBuf;

const ROOT: &str = "/sys/fs/cgroup/cpu";
/// The CFS period: the quota is a share of it.
const PERIOD_US: u64 = 100_000;

/// A cgroup with a CPU quota, removed when dropped (once its processes have ended).
#[derive(Debug)]
pub struct CpuCap {
    dir: PathBuf,
}

/// How much the processes in a group ran and were held back, from its `cpu.stat`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Throttling {
    /// Periods in which the group ran.
    pub periods: u64,
    /// Periods in which it used its whole quota and waited.
    pub throttled: u64,
}

impl CpuCap {
    /// Whether a group of `share` of a core (0.01–64) can be made here: the share in range,
    /// the cgroup v1 `cpu` controller mounted at `/sys/fs/cgroup/cpu`, and the right to
    /// write there (root).
    pub fn check(share: f64) -> Result<(), String> {
        if !(0.01..=64.0).contains(&share) {
            return Err(format!(
                "a CPU share must be between 0.01 and 64 cores, not {share}"
            ));
        }
        let period = PathBuf::from(ROOT).join("cpu.cfs_period_us");
        let writable = std::fs::OpenOptions::new().write(true).open(&period);
        writable.map(drop).map_err(|error| {
            format!("capping CPU needs root and the cgroup v1 cpu controller at {ROOT} ({}: {error})", period.display())
        })
    }

    /// A new group `name` allowed `share` of a core (see `check`).
    pub fn new(name: &str, share: f64) -> Result<Self, String> {
        Self::check(share)?;
        let dir = PathBuf::from(ROOT).join(name);
        let shown = dir.display().to_string();
        let needs = |error: std::io::Error| format!("making the CPU group {shown}: {error}");
        std::fs::create_dir(&dir).map_err(needs)?;
        let cap = Self { dir };
        let quota = (share * PERIOD_US as f64).round() as u64;
        cap.write("cpu.cfs_period_us", &PERIOD_US.to_string())
            .and_then(|()| cap.write("cpu.cfs_quota_us", &quota.to_string()))
            .map_err(needs)?;
        Ok(cap)
    }

    /// Moves process `pid` with every thread it has into the group; the threads it starts
    /// later are in it too.
    pub fn join(&self, pid: u32) -> Result<(), String> {
        self.write("cgroup.procs", &pid.to_string())
            .map_err(|error| format!("moving process {pid} into {}: {error}", self.dir.display()))
    }

    /// What `cpu.stat` says so far (zeros if it cannot be read).
    pub fn throttling(&self) -> Throttling {
        let text = std::fs::read_to_string(self.dir.join("cpu.stat")).unwrap_or_default();
        let field = |name: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
                .unwrap_or(0)
        };
        Throttling {
            periods: field("nr_periods"),
            throttled: field("nr_throttled"),
        }
    }

    fn write(&self, file: &str, value: &str) -> std::io::Result<()> {
        std::fs::write(self.dir.join(file), value)
    }
}

impl Drop for CpuCap {
    fn drop(&mut self) {
        // Fails while a process is still in it; the group is then left for the next run.
        if let Err(error) = std::fs::remove_dir(&self.dir) {
            eprintln!("openprogram: removing {}: {error}", self.dir.display());
        }
    }
}
