//! A throwaway PostgreSQL server on loopback, for `openprogram cluster` and the tests: a
//! cluster made by `initdb` in a directory of the caller's, started by `pg_ctl` on a free
//! port with its socket in that directory, stopped when dropped. As root it runs as the
//! `postgres` user (initdb refuses root).
//!
//! The server's programs are found in `OP_PG_BIN`, else in Debian's
//! `/usr/lib/postgresql/<newest>/bin`, else on `PATH`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// What `LocalPostgres` fails with: what went wrong, in words (with the log's path when the
/// server wrote one).
pub type Failure = String;

/// A running throwaway server. Dropped, it stops (fast shutdown).
#[derive(Debug)]
pub struct LocalPostgres {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    /// `Some("postgres")` when the server runs as that user (this process is root).
    as_user: Option<&'static str>,
    running: bool,
}

impl LocalPostgres {
    /// The directory holding the server's programs (`pg_ctl`, `initdb`, `createdb`).
    pub fn bin_dir() -> Result<PathBuf, Failure> {
        if let Some(dir) = std::env::var_os("OP_PG_BIN") {
            return Ok(PathBuf::from(dir));
        }
        let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|entry| {
                let version = entry.file_name().to_string_lossy().parse().ok()?;
                let bin = entry.path().join("bin");
                bin.join("pg_ctl").exists().then_some((version, bin))
            })
            .collect();
        versions.sort();
        if let Some((_, bin)) = versions.pop() {
            return Ok(bin);
        }
        let on_path = std::env::var_os("PATH")
            .and_then(|path| std::env::split_paths(&path).find(|dir| dir.join("pg_ctl").exists()));
        on_path.ok_or_else(|| {
            "PostgreSQL's pg_ctl and initdb were not found (apt-get install postgresql, or set \
             OP_PG_BIN)"
                .to_owned()
        })
    }

    /// Makes a cluster in `dir` (which must exist and be empty of a cluster) and starts it
    /// on a free loopback port. `max_connections` bounds the clients it admits.
    pub fn start(dir: &Path, max_connections: u32) -> Result<Self, Failure> {
        Self::start_with(dir, max_connections, &[])
    }

    /// `start`, with server settings (`name=value`, as `postgres -c` takes them) added.
    pub fn start_with(
        dir: &Path,
        max_connections: u32,
        settings: &[String],
    ) -> Result<Self, Failure> {
        // `pg_ctl -o` hands the options to a shell: letters, digits and `_.,:/-` only.
        let plain = |c: char| c.is_ascii_alphanumeric() || "_.,:/-".contains(c);
        let bad = settings.iter().find(|setting| {
            let (name, value) = setting.split_once('=').unwrap_or(("", ""));
            name.is_empty() || !name.chars().chain(value.chars()).all(plain)
        });
        if let Some(bad) = bad {
            return Err(format!(
                "a server setting is name=value, of letters, digits and _.,:/- only: {bad:?}"
            ));
        }
        let bin = Self::bin_dir()?;
        let root = Command::new("id")
            .arg("-u")
            .output()
            .map(|output| String::from_utf8_lossy(&output.stdout).trim() == "0")
            .unwrap_or(false);
        let as_user = root.then_some("postgres");
        let data = dir.join("data");
        if let Some(user) = as_user {
            let chown = Command::new("chown")
                .args(["-R", user])
                .arg(dir)
                .status()
                .map_err(|error| format!("chown: {error}"))?;
            if !chown.success() {
                return Err(format!(
                    "chown -R {user} {} failed (is there a postgres user?)",
                    dir.display()
                ));
            }
        }
        let initdb = run_as(as_user, &bin.join("initdb"))
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "-D",
            ])
            .arg(&data)
            .stdout(Stdio::null())
            .status()
            .map_err(|error| format!("initdb: {error}"))?;
        if !initdb.success() {
            return Err("initdb failed".into());
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .map_err(|error| format!("a free port: {error}"))?
            .port();
        let mut options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c max_connections={max_connections}",
            dir.display()
        );
        for setting in settings {
            options.push_str(&format!(" -c {setting}"));
        }
        let log = dir.join("log");
        let started = run_as(as_user, &bin.join("pg_ctl"))
            .args(["-w", "-D"])
            .arg(&data)
            .arg("-l")
            .arg(&log)
            .args(["-o", &options, "start"])
            .stdout(Stdio::null())
            .status()
            .map_err(|error| format!("pg_ctl start: {error}"))?;
        if !started.success() {
            // `-w` gave up waiting: the server may run all the same.
            let _ = run_as(as_user, &bin.join("pg_ctl"))
                .args(["-m", "immediate", "-D"])
                .arg(&data)
                .arg("stop")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            return Err(format!("pg_ctl start failed (see {})", log.display()));
        }
        Ok(Self {
            bin,
            data,
            port,
            as_user,
            running: true,
        })
    }

    /// The server's URL without a database: `postgres://postgres@127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn bin(&self) -> &Path {
        &self.bin
    }

    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    /// Whether the server runs as the `postgres` user (this process is root).
    pub fn as_postgres_user(&self) -> bool {
        self.as_user.is_some()
    }

    /// Creates the database `name` and returns its URL.
    pub fn create_database(&self, name: &str) -> Result<String, Failure> {
        let port = self.port.to_string();
        let status = Command::new(self.bin.join("createdb"))
            .args(["-h", "127.0.0.1", "-p", &port, "-U", "postgres", name])
            .status()
            .map_err(|error| format!("createdb: {error}"))?;
        if !status.success() {
            return Err(format!("createdb {name} failed"));
        }
        Ok(format!("{}/{name}", self.url()))
    }

    /// Stops the server (fast shutdown: clients are disconnected).
    pub fn stop(&mut self) -> Result<(), Failure> {
        if !std::mem::take(&mut self.running) {
            return Ok(());
        }
        let stopped = run_as(self.as_user, &self.bin.join("pg_ctl"))
            .args(["-w", "-m", "fast", "-D"])
            .arg(&self.data)
            .arg("stop")
            .stdout(Stdio::null())
            .status()
            .map_err(|error| format!("pg_ctl stop: {error}"))?;
        match stopped.success() {
            true => Ok(()),
            false => Err("pg_ctl stop failed".into()),
        }
    }

    /// Leaves the server running when this value is dropped (a test process's shared
    /// cluster, stopped by a watchdog of its own).
    pub fn detach(mut self) {
        self.running = false;
    }
}

impl Drop for LocalPostgres {
    fn drop(&mut self) {
        if let Err(error) = self.stop() {
            tracing::error!(%error, "stopping the throwaway PostgreSQL");
        }
    }
}

/// `program` run as `user` (through `runuser`), or as this process's user.
pub fn run_as(user: Option<&str>, program: &Path) -> Command {
    match user {
        Some(user) => {
            let mut command = Command::new("runuser");
            command.args(["-u", user, "--"]).arg(program);
            command
        }
        None => Command::new(program),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn n4_a_server_setting_that_is_not_name_equals_value_is_refused_before_anything_starts() {
        let dir = tempfile::tempdir().expect("tempdir");
        for bad in ["work_mem", "work_mem=1 -c fsync=off", "a=$(id)", "=1"] {
            let refused = LocalPostgres::start_with(dir.path(), 10, &[bad.to_owned()]);
            assert!(
                refused
                    .as_ref()
                    .is_err_and(|error| error.contains("name=value")),
                "{bad}: {refused:?}"
            );
        }
        assert!(!dir.path().join("data").exists(), "nothing was made");
    }
}
