//! The multi-node fault loop (N-2, N-3): `nodes` nodes (`serve --node-id nI --store
//! postgres://…`, each on its own port) share one PostgreSQL database; executions whose
//! steps append to the oracle's sink are admitted round robin across them. Every 0.5–3 s
//! (seeded) a random node is killed with SIGKILL and, down for up to three leases, started
//! again under the same id and port; or stopped with SIGSTOP past its lease and continued.
//! Survivors take over its running executions once its lease lapses; a stalled node's late
//! writes are fenced. Counted as `kill_loop` counts (I1, I3, I4, I7, I8, L1), with how long
//! after a fault the survivors' takeovers came (fault → claim, the lease's lapse included).

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use openprogram_storage::{Event, EventEnvelope};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::cluster::free_port;
use crate::soak::kill_loop::{
    admit, await_completion, harness, held, percentiles, sessions, unreadable, Admitted,
    KillLoopOptions, Server, Setup,
};
use crate::soak::oracle::Tally;

/// What is done to a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// SIGKILL, then the node starts again (a new incarnation under the same id).
    Kill,
    /// SIGSTOP for twice the lease, then SIGCONT: the node resumes as if nothing happened,
    /// finds its executions taken over and its writes fenced, and exits (lease lost). Not
    /// yet clean (see ARCHITECTURE.md, "Several nodes"): an `append` the stalled node had in
    /// flight can land after a survivor's reconciliation found it absent and ran it again.
    Stop,
}

#[derive(Debug, Clone)]
pub struct ClusterLoopOptions {
    /// The binary, seed, executions, steps, `cycles` (the faults), sleeps, and `store`
    /// (required: a `postgres://…` database the nodes share).
    pub base: KillLoopOptions,
    pub nodes: usize,
    pub fault: Fault,
    /// Time between faults, drawn in this range (ms).
    pub interval_ms: (u64, u64),
    /// The nodes' `--lease-ttl` (ms).
    pub lease_ttl_ms: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ClusterLoopReport {
    pub seed: u64,
    pub nodes: usize,
    pub fault: Fault,
    pub faults: usize,
    pub executions: usize,
    pub steps: usize,
    #[serde(flatten)]
    pub tally: Tally,
    pub unfinished: usize,
    pub reconciled: usize,
    pub quarantined: usize,
    pub violations: Vec<String>,
    /// Attempts that claimed an execution another attempt had run (takeovers by survivors,
    /// claims by a restarted node, lapsed local attempts).
    pub claims: usize,
    /// Nodes that exited by themselves (their lease lost, N-2) and were started again.
    pub revived: usize,
    /// Claims by a node other than the one last faulted (a survivor's takeover), and the time
    /// from that fault to the claim (ms): the lease's lapse, the next takeover round, the
    /// claim's commit.
    pub takeovers: usize,
    pub takeover_after_fault_ms_p50: f64,
    pub takeover_after_fault_ms_max: f64,
    pub lease_ttl_ms: u64,
    pub wall_s: f64,
}

impl ClusterLoopReport {
    pub fn clean(&self) -> bool {
        held(
            &self.tally,
            self.unfinished,
            self.quarantined,
            &self.violations,
        )
    }
}

/// One node: its id, port, directory, and the server running as it (if any).
struct Node {
    id: String,
    listen: String,
    server: Option<Server>,
    starts: usize,
    /// The owner ids of its incarnations, oldest first.
    owners: Vec<String>,
}

impl Node {
    fn start(
        &mut self,
        options: &ClusterLoopOptions,
        root: &Path,
        token: &str,
    ) -> Result<(), String> {
        let extra = [
            "--node-id".to_owned(),
            self.id.clone(),
            "--lease-ttl".to_owned(),
            format!("{}ms", options.lease_ttl_ms),
        ];
        // The port was just freed by a kill: a few tries while the system lets it go.
        let mut last = String::new();
        for _ in 0..50 {
            let log = root.join(format!("{}-{}.log", self.id, self.starts));
            self.starts += 1;
            let data = root.join(&self.id);
            match Server::start(&options.base, &data, token, log, &self.listen, &extra) {
                Ok(server) => {
                    // The incarnation it runs as: the owner of the attempts it claims.
                    let health = server.call("GET", "/health", None)?;
                    if let Some(owner) = health["owner_id"].as_str() {
                        self.owners.push(owner.to_owned());
                    }
                    self.server = Some(server);
                    return Ok(());
                }
                Err(error) => last = error,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("node {} would not start: {last}", self.id))
    }

    /// Starts the node again if its process ended by itself (a node that lost its lease
    /// exits, N-2). Returns whether it did.
    fn revive(
        &mut self,
        options: &ClusterLoopOptions,
        root: &Path,
        token: &str,
    ) -> Result<bool, String> {
        let exited = self
            .server
            .as_mut()
            .is_none_or(|server| server.child.try_wait().ok().flatten().is_some());
        if exited {
            self.server = None;
            self.start(options, root, token)?;
        }
        Ok(exited)
    }

    fn signal(&self, signal: &str) {
        if let Some(server) = &self.server {
            // By pid: the child this harness started.
            let _ = Command::new("kill")
                .args([signal, &server.child.id().to_string()])
                .status();
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

/// The nodes of a run, the directory they live in, and the token they share.
struct Cluster<'a> {
    options: &'a ClusterLoopOptions,
    setup: Setup,
    nodes: Vec<Node>,
    /// Nodes that exited by themselves and were started again.
    revived: usize,
}

impl<'a> Cluster<'a> {
    fn start(options: &'a ClusterLoopOptions, rng: &mut StdRng) -> Result<Self, String> {
        let mut cluster = Self {
            options,
            setup: Setup::new(rng)?,
            nodes: Vec::new(),
            revived: 0,
        };
        for index in 0..options.nodes {
            let mut node = Node {
                id: format!("n{index}"),
                listen: format!(
                    "127.0.0.1:{}",
                    free_port().map_err(|e| harness(format!("a free port: {e}")))?
                ),
                server: None,
                starts: 0,
                owners: Vec::new(),
            };
            node.start(options, cluster.setup.root.path(), &cluster.setup.token)?;
            cluster.nodes.push(node);
        }
        Ok(cluster)
    }

    fn server(&self, index: usize) -> Result<&Server, String> {
        let node = &self.nodes[index % self.nodes.len()];
        node.server
            .as_ref()
            .ok_or_else(|| format!("node {} is not running", node.id))
    }

    /// Admits every execution, round robin across the nodes.
    fn admit(&self, rng: &mut StdRng) -> Result<Vec<Admitted>, String> {
        let base = &self.options.base;
        let sessions = sessions(self.server(0)?, base.executions)?;
        let scripts = self.setup.scripts(base, rng);
        admit(|index| self.server(index), &sessions, scripts, 1)
    }

    fn revive(&mut self) -> Result<(), String> {
        for node in &mut self.nodes {
            let revived = node.revive(self.options, self.setup.root.path(), &self.setup.token)?;
            self.revived += usize::from(revived);
        }
        Ok(())
    }

    /// One fault on a random node; returns when it happened and to which node.
    fn fault(&mut self, rng: &mut StdRng) -> Result<(u64, usize), String> {
        let options = self.options;
        let victim = rng.gen_range(0..self.nodes.len());
        let at_ms = now_ms();
        let node = &mut self.nodes[victim];
        match options.fault {
            Fault::Kill => {
                // SIGKILL, reaped. Down for up to three leases: the survivors take over some
                // of its executions, the restarted node (a new incarnation) claims the rest.
                node.server = None;
                let down = rng.gen_range(0..=3 * options.lease_ttl_ms);
                std::thread::sleep(Duration::from_millis(down));
                node.start(options, self.setup.root.path(), &self.setup.token)?;
            }
            Fault::Stop => {
                node.signal("-STOP");
                std::thread::sleep(Duration::from_millis(2 * options.lease_ttl_ms));
                node.signal("-CONT");
            }
        }
        Ok((at_ms, victim))
    }

    /// The `ask`-th read of `path`, from the nodes in turn; a node that exited meanwhile
    /// is started again every fifty reads.
    fn read(&mut self, ask: usize, path: &str) -> Result<serde_json::Value, String> {
        if ask.is_multiple_of(50) {
            self.revive()?;
        }
        Ok(self
            .server(ask)
            .and_then(|server| server.call("GET", path, None))
            .unwrap_or_else(unreadable))
    }

    fn stop(&mut self) {
        for node in &mut self.nodes {
            if let Some(server) = node.server.take() {
                server.stop();
            }
        }
    }

    /// The node each incarnation (owner id) ran as.
    fn node_of_owner(&self) -> HashMap<String, usize> {
        let nodes = self.nodes.iter().enumerate();
        nodes
            .flat_map(|(index, node)| node.owners.iter().map(move |owner| (owner.clone(), index)))
            .collect()
    }
}

/// Runs the loop; `progress` is told each fault.
pub fn run(
    options: &ClusterLoopOptions,
    progress: impl Fn(usize),
) -> Result<ClusterLoopReport, String> {
    let base = &options.base;
    if base.store.is_none() || options.nodes == 0 {
        return Err("the cluster loop needs a postgres:// store and at least one node".into());
    }
    let mut rng = StdRng::seed_from_u64(base.seed);
    let mut cluster = Cluster::start(options, &mut rng)?;
    let admitted = cluster.admit(&mut rng)?;

    let mut faults = Vec::new();
    for cycle in 0..base.cycles {
        let (low, high) = options.interval_ms;
        std::thread::sleep(Duration::from_millis(rng.gen_range(low..=high.max(low))));
        cluster.revive()?;
        faults.push(cluster.fault(&mut rng)?);
        progress(cycle + 1);
    }

    // Quiescence: every execution completes, with its ids (L1, I7), read from any node.
    let mut violations = Vec::new();
    let mut ask = 0usize;
    let unfinished = await_completion(&admitted, &mut violations, |path| {
        ask += 1;
        cluster.read(ask, path)
    })?;
    cluster.stop();

    let mut claims = Claims {
        node_of_owner: cluster.node_of_owner(),
        faults,
        claims: 0,
        takeover_gaps_ms: Vec::new(),
    };
    let setup = &cluster.setup;
    let (tally, quarantined, reconciled) = setup.check(
        base,
        setup.root.path(),
        &admitted,
        &mut violations,
        |events| claims.count(events),
    )?;
    let takeovers = claims.takeover_gaps_ms.len();
    let (p50, _, max) = percentiles(&mut claims.takeover_gaps_ms);
    Ok(ClusterLoopReport {
        seed: base.seed,
        nodes: options.nodes,
        fault: options.fault,
        faults: base.cycles,
        executions: base.executions,
        steps: base.steps,
        tally,
        unfinished,
        reconciled,
        quarantined,
        violations,
        claims: claims.claims,
        revived: cluster.revived,
        takeovers,
        takeover_after_fault_ms_p50: p50,
        takeover_after_fault_ms_max: max,
        lease_ttl_ms: options.lease_ttl_ms,
        wall_s: setup.wall_s(),
    })
}

/// The claims found in the store: every `AttemptStarted` after the first, and for those by
/// another node than the one last faulted (a survivor's takeover), the time since the fault.
struct Claims {
    node_of_owner: HashMap<String, usize>,
    /// When each fault happened (ms since the epoch) and to which node, oldest first.
    faults: Vec<(u64, usize)>,
    claims: usize,
    takeover_gaps_ms: Vec<f64>,
}

impl Claims {
    fn count(&mut self, events: &[EventEnvelope]) {
        for envelope in events {
            let Event::AttemptStarted {
                epoch, owner_id, ..
            } = envelope.event
            else {
                continue;
            };
            if epoch == 1 {
                continue;
            }
            self.claims += 1;
            let claimer = self.node_of_owner.get(&owner_id.to_string());
            let fault = self
                .faults
                .iter()
                .rev()
                .find(|(at, _)| *at <= envelope.at_ms);
            if let (Some(claimer), Some((at, victim))) = (claimer, fault) {
                if claimer != victim {
                    self.takeover_gaps_ms.push((envelope.at_ms - at) as f64);
                }
            }
        }
    }
}

/// The test's and README's sizes: `faults` faults of `fault` on 3 nodes, 300 executions of appends
/// with sleeps of 200–1,500 ms between them, as many as keep the executions running until the last
/// fault (so that the faults land on work in progress), a fault every 0.5–3 s, leases of 2 s.
pub fn options(
    binary: std::path::PathBuf,
    store: String,
    seed: u64,
    fault: Fault,
    faults: usize,
) -> ClusterLoopOptions {
    let steps = (faults * 2).max(8);
    ClusterLoopOptions {
        base: KillLoopOptions {
            binary,
            seed,
            executions: 300,
            steps,
            cycles: faults,
            kill_after_ms: (0, 0),
            sleep_ms: (200, 1_500),
            admit_concurrency: 1,
            store: Some(store),
        },
        nodes: 3,
        fault,
        interval_ms: (500, 3_000),
        lease_ttl_ms: 2_000,
    }
}
