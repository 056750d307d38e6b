//! A throwaway PostgreSQL cluster for the tests that run on PostgreSQL: started once per
//! test process (`initdb` + `pg_ctl` in a temp dir, on a free loopback port, as the
//! `postgres` user when the tests run as root: initdb refuses root), one fresh database per
//! test. A watchdog process stops the cluster and removes its files when the test process
//! exits. `OP_TEST_POSTGRES=postgres://…` (a role that may create databases) uses a
//! running server instead.
//!
//! The server's programs are found as `LocalPostgres::bin_dir` says. Missing, every
//! PostgreSQL test fails and says how to install them (`apt-get install postgresql`);
//! README's test command reports them ignored instead, and `.ci/run` installs PostgreSQL
//! and runs them.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use openprogram_storage::pg::local::LocalPostgres;

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

/// Runs one of PostgreSQL's client programs (`pg_dump`, `psql`) and checks it succeeded.
pub fn client_program(program: &str, args: &[&str]) {
    let bin = LocalPostgres::bin_dir().expect("PostgreSQL's programs");
    let output = Command::new(bin.join(program))
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("{program}: {error}"));
    assert!(
        output.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn start() -> Result<Cluster, String> {
    let bin = LocalPostgres::bin_dir()?;
    if std::env::var_os("OP_TEST_POSTGRES").is_some() {
        return Ok(Cluster {
            base: String::new(),
            url: String::new(),
            bin,
        });
    }
    let dir = std::env::temp_dir().join(format!("op-pg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|error| format!("{}: {error}", dir.display()))?;
    let server = LocalPostgres::start(&dir, 200)?;
    // Stops the cluster and removes it once this test process is gone.
    let stop = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {as_user} '{pg_ctl}' -D '{data}' \
         -m immediate stop >/dev/null 2>&1; rm -rf '{dir}'",
        pid = std::process::id(),
        as_user = if server.as_postgres_user() {
            "runuser -u postgres --"
        } else {
            ""
        },
        pg_ctl = server.bin().join("pg_ctl").display(),
        data = server.data_dir().display(),
        dir = dir.display(),
    );
    Command::new("sh")
        .args(["-c", &stop])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|error| format!("the cluster's watchdog: {error}"))?;
    let port = server.port();
    let url = server.url();
    server.detach();
    Ok(Cluster {
        base: format!("host=127.0.0.1 port={port} user=postgres"),
        url,
        bin,
    })
}
