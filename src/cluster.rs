//! `openprogram cluster --nodes N` (N-2, N-3): a throwaway PostgreSQL (`LocalPostgres`) and
//! N `serve --store postgres://… --node-id nK` children on loopback ports, each with its own
//! data directory and log, until SIGINT or SIGTERM. A node that exits meanwhile (one that
//! lost its lease exits 75) is started again, as a process supervisor would; at the end the
//! nodes stop in order (SIGTERM), then the database, and the directory goes unless `--dir`
//! named it. Once every node answers, stdout gets one JSON line — `{"store", "token",
//! "cpu_per_node", "nodes": [{"id", "url", "log", "pid"}]}` — for scripts; stderr says the
//! same for a person. `--cpu-per-node` caps each node at a share of a core (`cpu_cap.rs`),
//! PostgreSQL left uncapped, as if each node ran on a machine of its own.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use openprogram_storage::pg::local::LocalPostgres;
use serde_json::{json, Value};

use crate::cpu_cap::CpuCap;

/// How long a node may take to start listening, and to stop after SIGTERM.
const NODE_TIMEOUT: Duration = Duration::from_secs(60);

/// `openprogram cluster`'s arguments.
#[derive(Debug, clap::Args)]
pub struct ClusterArgs {
    /// How many nodes (1–16).
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// The admin token of every node (else OPENPROGRAM_TOKEN, else a random one, printed).
    #[arg(long)]
    pub token: Option<String>,
    /// The nodes' lease (`serve --lease-ttl`), such as 2s.
    #[arg(long)]
    pub lease_ttl: Option<String>,
    /// Keep the database, data and logs here (default: a temporary directory, removed).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Cap each node at this share of one core (0.3: 30%), as if each ran on a small
    /// machine of its own; the database is not capped. Needs root (cgroup v1 `cpu`).
    #[arg(long, value_name = "CORES")]
    pub cpu_per_node: Option<f64>,
    /// A setting of the database server, such as
    /// shared_preload_libraries=pg_stat_statements (repeatable).
    #[arg(long, value_name = "NAME=VALUE")]
    pub pg_setting: Vec<String>,
}

impl ClusterArgs {
    /// The options, with this binary as the nodes' and the token resolved.
    pub fn options(mut self) -> Result<ClusterOptions, String> {
        let binary =
            std::env::current_exe().map_err(|error| format!("cannot find this binary: {error}"))?;
        let token = self
            .token
            .take()
            .or_else(|| std::env::var("OPENPROGRAM_TOKEN").ok())
            .unwrap_or_else(|| format!("{:032x}", rand::random::<u128>()));
        // Refused here, before a database starts, rather than by every node.
        if let Some(share) = self.cpu_per_node {
            CpuCap::check(share)?;
        }
        if token.trim().len() < crate::serve::TOKEN_CHARS_MIN {
            return Err(format!(
                "a token must have at least {} characters",
                crate::serve::TOKEN_CHARS_MIN
            ));
        }
        Ok(ClusterOptions {
            binary,
            token,
            args: self,
        })
    }
}

/// The flags resolved: this binary as the nodes' binary, and the token they share.
#[derive(Debug)]
pub struct ClusterOptions {
    pub binary: PathBuf,
    pub token: String,
    /// The rest as given: how many nodes, their lease, their directory.
    pub args: ClusterArgs,
}

/// One node: `serve` as a child, stopped when dropped (also on a panic's unwinding).
struct Node {
    id: String,
    listen: String,
    child: Option<Child>,
    /// When a node that is not running may be started again.
    retry_at: Instant,
    /// Its share of a core (`--cpu-per-node`), dropped after the node has stopped.
    cap: Option<CpuCap>,
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Node {
    fn data(&self, dir: &Path) -> PathBuf {
        dir.join(&self.id)
    }

    fn log(&self, dir: &Path) -> PathBuf {
        dir.join(format!("{}.log", self.id))
    }

    fn url(&self) -> String {
        format!("http://{}", self.listen)
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts `serve` and waits until it listens (its first stdout line).
    fn start(&mut self, options: &ClusterOptions, dir: &Path, store: &str) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log(dir))
            .map_err(|error| format!("{}: {error}", self.log(dir).display()))?;
        let mut command = Command::new(&options.binary);
        command
            .args(["serve", "--listen", &self.listen, "--token", &options.token])
            .args(["--store", store, "--node-id", &self.id, "--data"])
            .arg(self.data(dir));
        if let Some(ttl) = &options.args.lease_ttl {
            command.args(["--lease-ttl", ttl]);
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|error| format!("starting {}: {error}", options.binary.display()))?;
        if let Some(Err(error)) = self.cap.as_ref().map(|cap| cap.join(child.id())) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(error);
        }
        // Its first line, read on a thread of its own so that a node that never says it
        // listens is given up after NODE_TIMEOUT; the rest is drained there, so it never
        // blocks on a full pipe.
        let (told, heard) = std::sync::mpsc::channel();
        if let Some(stdout) = child.stdout.take() {
            std::thread::spawn(move || {
                let mut stdout = std::io::BufReader::new(stdout);
                let mut url = String::new();
                let _ = stdout.read_line(&mut url);
                let _ = told.send(url);
                std::io::copy(&mut stdout, &mut std::io::sink())
            });
        }
        let url = heard.recv_timeout(NODE_TIMEOUT).unwrap_or_default();
        if url.trim().is_empty() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "node {} did not start (see {})",
                self.id,
                self.log(dir).display()
            ));
        }
        self.child = Some(child);
        Ok(())
    }

    /// Whether its process ended by itself, with how.
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok().flatten()?;
        self.child = None;
        Some(status)
    }

    /// SIGTERM (the orderly shutdown); SIGKILL after `NODE_TIMEOUT`.
    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = rustix::process::Pid::from_child(&child);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let deadline = Instant::now() + NODE_TIMEOUT;
        while child.try_wait().ok().flatten().is_none() {
            if Instant::now() >= deadline {
                eprintln!("openprogram: node {} did not stop in time; killed", self.id);
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.wait();
    }
}

/// Runs the cluster until SIGINT or SIGTERM.
pub fn run(options: &ClusterOptions) -> Result<(), String> {
    if options.args.nodes == 0 || options.args.nodes > 16 {
        return Err("--nodes must be between 1 and 16".into());
    }
    let stop = stop_flag()?;
    let (dir, remove) = match &options.args.dir {
        Some(dir) => (dir.clone(), false),
        None => (
            std::env::temp_dir().join(format!("openprogram-cluster-{}", std::process::id())),
            true,
        ),
    };
    // Not a private temp dir: the database may run as the `postgres` user, who must reach its
    // directory inside. Absolute: the server resolves its socket directory from its data directory.
    let dir = std::fs::create_dir_all(dir.join("postgres"))
        .and_then(|()| dir.canonicalize())
        .map_err(|error| format!("{}: {error}", dir.display()))?;
    let pg_dir = dir.join("postgres");
    eprintln!("openprogram: starting PostgreSQL in {}", pg_dir.display());
    let result = LocalPostgres::start_with(
        &pg_dir,
        100 + 20 * options.args.nodes as u32,
        &options.args.pg_setting,
    ).and_then(
        |mut postgres| {
            let served = serve_nodes(options, &dir, &postgres, &stop);
            eprintln!("openprogram: stopping PostgreSQL");
            // The nodes' failure, if any, says more than the database's.
            let stopped = postgres.stop();
            served.and(stopped)
        },
    );
    if remove {
        if let Err(error) = std::fs::remove_dir_all(&dir) {
            eprintln!("openprogram: removing {}: {error}", dir.display());
        }
    }
    result
}

fn serve_nodes(
    options: &ClusterOptions,
    dir: &Path,
    postgres: &LocalPostgres,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<(), String> {
    let store = postgres.create_database("openprogram")?;
    share_session_key(dir, options.args.nodes)?;
    let mut nodes = Vec::with_capacity(options.args.nodes);
    for index in 1..=options.args.nodes {
        let port = free_port().map_err(|error| format!("a free port: {error}"))?;
        let id = format!("n{index}");
        let cap = match options.args.cpu_per_node {
            Some(share) => {
                let name = format!("openprogram-{}-{id}", std::process::id());
                Some(CpuCap::new(&name, share)?)
            }
            None => None,
        };
        nodes.push(Node {
            id,
            listen: format!("127.0.0.1:{port}"),
            child: None,
            retry_at: Instant::now(),
            cap,
        });
    }
    let started = nodes
        .iter_mut()
        .try_for_each(|node| node.start(options, dir, &store));
    if let Err(error) = started {
        nodes.iter_mut().for_each(Node::stop);
        return Err(error);
    }
    println!("{}", describe(options, dir, &store, &nodes));
    eprintln!("openprogram: {} nodes on {store}", nodes.len());
    for node in &nodes {
        let (id, url, log) = (&node.id, node.url(), node.log(dir));
        eprintln!("  {id}  {url}  (log {})", log.display());
    }
    let urls: Vec<_> = nodes.iter().map(Node::url).collect();
    eprintln!("  token: {}", options.token);
    eprintln!(
        "  try: openprogram load --url {} --token {} --executions 300 --steps 20",
        urls.join(","),
        options.token
    );
    eprintln!("  stop with Ctrl-C");

    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(200));
        for node in &mut nodes {
            if let Some(status) = node.exited() {
                eprintln!("openprogram: node {} exited ({status})", node.id);
            }
            let down = node.child.is_none() && Instant::now() >= node.retry_at;
            if !down || stop.load(std::sync::atomic::Ordering::SeqCst) {
                continue;
            }
            eprintln!("openprogram: starting node {} again", node.id);
            if let Err(error) = node.start(options, dir, &store) {
                // Tried again a little later (its port may still be held).
                node.retry_at = Instant::now() + Duration::from_secs(2);
                eprintln!("openprogram: {error}");
            }
        }
    }
    eprintln!("openprogram: stopping the nodes");
    for node in &nodes {
        if let Some(cap) = &node.cap {
            let held = cap.throttling();
            let (id, throttled, periods) = (&node.id, held.throttled, held.periods);
            eprintln!("  {id}: held back at its CPU cap in {throttled} of {periods} periods since it started");
        }
    }
    std::thread::scope(|scope| {
        for node in &mut nodes {
            scope.spawn(|| node.stop());
        }
    });
    Ok(())
}

/// The line for scripts: the store, the token, the CPU cap and each node.
fn describe(options: &ClusterOptions, dir: &Path, store: &str, nodes: &[Node]) -> Value {
    let described: Vec<_> = nodes
        .iter()
        .map(|node| {
            json!({
                "id": node.id,
                "url": node.url(),
                "log": node.log(dir).display().to_string(),
                "pid": node.pid(),
            })
        })
        .collect();
    json!({
        "store": store,
        "token": options.token,
        "cpu_per_node": options.args.cpu_per_node,
        "nodes": described,
    })
}

/// A free loopback port (bound, read, released: a node binds it next).
pub(crate) fn free_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// One session key for every node (`DIR/nK/session.key`), so a session token one node
/// handed out is good on all of them.
fn share_session_key(dir: &Path, nodes: usize) -> Result<(), String> {
    let first = dir.join("n1");
    let failed = |error: std::io::Error| format!("the nodes' session key: {error}");
    std::fs::create_dir_all(&first).map_err(failed)?;
    crate::http::auth::load_or_create_session_key(&first).map_err(failed)?;
    for index in 2..=nodes {
        let data = dir.join(format!("n{index}"));
        std::fs::create_dir_all(&data).map_err(failed)?;
        std::fs::copy(first.join("session.key"), data.join("session.key")).map_err(failed)?;
    }
    Ok(())
}

/// A flag set at the first SIGINT or SIGTERM (a thread of its own waits for them).
fn stop_flag() -> Result<std::sync::Arc<std::sync::atomic::AtomicBool>, String> {
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|error| format!("signals: {error}"))?;
    let signals = runtime
        .block_on(async { crate::serve::stop_signal() })
        .map_err(|error| error.to_string())?;
    let set = std::sync::Arc::clone(&flag);
    std::thread::Builder::new()
        .name("openprogram-cluster-signals".into())
        .spawn(move || {
            runtime.block_on(signals);
            set.store(true, std::sync::atomic::Ordering::SeqCst);
        })
        .map_err(|error| format!("signals: {error}"))?;
    Ok(flag)
}
