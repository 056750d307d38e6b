//! A throwaway PostgreSQL cluster for the tests that run on PostgreSQL: started once per
//! test process (`initdb` + `pg_ctl` in a temp dir, on a free loopback port, as the
//! `postgres` user when the tests run as root: initdb refuses root), one fresh database per
//! test. A watchdog process stops the cluster and removes its files when the test process
//! exits. `OP_TEST_POSTGRES=postgres://…` (a role that may create databases) uses a
//! running server instead.
//!
//! The server's programs are found in `OP_PG_BIN`, else in Debian's
//! `/usr/lib/postgresql/<newest>/bin`, else on `PATH`. Missing, every PostgreSQL test fails
//! and says how to install them (`apt-get install postgresql`); README's test command
//! reports them ignored instead, and `.ci/run` installs PostgreSQL and runs them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Why PostgreSQL tests are ignored by `cargo test` (the attribute's text says the same).
pub const NEEDS: &str = "needs PostgreSQL (apt-get install postgresql); run with \
                         `cargo test --workspace -- --include-ignored`";

struct Cluster {
    /// Connection parameters of the server, without a database name.
    base: String,
    /// The same as a URL (`postgres://user@host:port`), which `serve --store` takes.
    url: String,
    /// Where `createdb` is.
    bin: PathBuf,
}

static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();
static DATABASES: AtomicU64 = AtomicU64::new(0);

/// The URL (`postgres://…`) of a new, empty database for one test.
pub fn database() -> String {
    let cluster = match CLUSTER.get_or_init(start) {
        Ok(cluster) => cluster,
        Err(reason) => panic!("no PostgreSQL for this test: {reason}. {NEEDS}"),
    };
    let name = format!(
        "op_test_{}_{}",
        std::process::id(),
        DATABASES.fetch_add(1, Ordering::Relaxed)
    );
    if let Some(url) = std::env::var_os("OP_TEST_POSTGRES") {
        let url = url.to_string_lossy().into_owned();
        let status = Command::new(cluster.bin.join("psql"))
            .args([url.as_str(), "-q", "-c", &format!("CREATE DATABASE {name}")])
            .status()
            .expect("run psql");
        assert!(status.success(), "CREATE DATABASE {name} on {url}");
        let base = url.rsplit_once('/').map_or(url.as_str(), |(base, _)| base);
        return format!("{base}/{name}");
    }
    let status = Command::new(cluster.bin.join("createdb"))
        .args(cluster.base.split(' ').flat_map(|part| {
            let (key, value) = part.split_once('=').unwrap_or((part, ""));
            match key {
                "host" => vec!["-h".to_owned(), value.to_owned()],
                "port" => vec!["-p".to_owned(), value.to_owned()],
                "user" => vec!["-U".to_owned(), value.to_owned()],
                _ => Vec::new(),
            }
        }))
        .arg(&name)
        .status()
        .expect("run createdb");
    assert!(status.success(), "createdb {name}");
    format!("{}/{name}", cluster.url)
}

fn run_as(user: Option<&str>, program: &Path) -> Command {
    match user {
        Some(user) => {
            let mut command = Command::new("runuser");
            command.args(["-u", user, "--"]).arg(program);
            command
        }
        None => Command::new(program),
    }
}

/// The directory holding the server's programs.
fn bin_dir() -> Result<PathBuf, String> {
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
    on_path.ok_or_else(|| "PostgreSQL's pg_ctl and initdb were not found".to_owned())
}

fn start() -> Result<Cluster, String> {
    let bin = bin_dir()?;
    if std::env::var_os("OP_TEST_POSTGRES").is_some() {
        return Ok(Cluster {
            base: String::new(),
            url: String::new(),
            bin,
        });
    }
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).trim() == "0")
        .unwrap_or(false);
    let as_user = root.then_some("postgres");
    let dir = std::env::temp_dir().join(format!("op-pg-{}", std::process::id()));
    let data = dir.join("data");
    std::fs::create_dir_all(&dir).map_err(|error| format!("{}: {error}", dir.display()))?;
    if let Some(user) = as_user {
        let chown = Command::new("chown")
            .args(["-R", user])
            .arg(&dir)
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
    let options = format!(
        "-p {port} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200",
        dir.display()
    );
    let started = run_as(as_user, &bin.join("pg_ctl"))
        .args(["-w", "-D"])
        .arg(&data)
        .args(["-l"])
        .arg(dir.join("log"))
        .args(["-o", &options, "start"])
        .stdout(Stdio::null())
        .status()
        .map_err(|error| format!("pg_ctl start: {error}"))?;
    if !started.success() {
        return Err(format!(
            "pg_ctl start failed (see {})",
            dir.join("log").display()
        ));
    }
    // Stops the cluster and removes it once this test process is gone.
    let stop = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {as_user} '{pg_ctl}' -D '{data}' \
         -m immediate stop >/dev/null 2>&1; rm -rf '{dir}'",
        pid = std::process::id(),
        as_user = if root { "runuser -u postgres --" } else { "" },
        pg_ctl = bin.join("pg_ctl").display(),
        data = data.display(),
        dir = dir.display(),
    );
    Command::new("sh")
        .args(["-c", &stop])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|error| format!("the cluster's watchdog: {error}"))?;
    Ok(Cluster {
        base: format!("host=127.0.0.1 port={port} user=postgres"),
        url: format!("postgres://postgres@127.0.0.1:{port}"),
        bin,
    })
}
