//! The kill -9 loop (RELIABILITY.md R02, and R24 at 10,000 executions): `openprogram serve`
//! runs executions whose steps append to a sink outside the data dir (the oracle), is killed
//! with SIGKILL at random moments and started again `cycles` times, then runs to quiescence.
//! Counted against the oracle and the reopened store: deliveries, duplicates (I1), lost steps
//! (I8), executions never completed (L1), changed ids (I7), an effect dispatched twice by one
//! epoch (I4), a write by an older epoch after a newer one claimed (I3), reconciled effects,
//! quarantined executions, each start's time to the end of its recovery, and peak RSS.
//! Synchronous (child processes, a blocking HTTP client); on sled, or PostgreSQL (N-1).

use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use openprogram_storage::{Control, Event, EventEnvelope, EventReader, ExecutionId, Store};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{json, Value};

use crate::http::client::{Failure, Target};
use crate::soak::oracle::{tally, Tally};

#[derive(Debug, Clone)]
pub struct KillLoopOptions {
    /// The `openprogram` binary to run as the server.
    pub binary: PathBuf,
    pub seed: u64,
    pub executions: usize,
    /// Appends per execution, each followed by a sleep drawn from `sleep_ms`.
    pub steps: usize,
    pub cycles: usize,
    /// How long each server lives before its kill, drawn in this range (ms).
    pub kill_after_ms: (u64, u64),
    pub sleep_ms: (u64, u64),
    /// Clients admitting the executions at once.
    pub admit_concurrency: usize,
    /// N-1: the servers' `--store` (a `postgres://…` database); `None`: sled in the run's
    /// directory.
    pub store: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct KillLoopReport {
    pub seed: u64,
    pub cycles: usize,
    pub executions: usize,
    pub steps: usize,
    #[serde(flatten)]
    pub tally: Tally,
    /// Executions not completed at the end (L1).
    pub unfinished: usize,
    pub reconciled: usize,
    pub quarantined: usize,
    /// Broken invariants other than the tally's (I3, I4, I7), the first few.
    pub violations: Vec<String>,
    /// Starts whose recovery ended before their kill, and the time from spawn to the end of
    /// startup recovery (ms).
    pub recoveries: usize,
    pub recovery_ms_p50: f64,
    pub recovery_ms_p99: f64,
    pub recovery_ms_max: f64,
    pub peak_rss_mib: f64,
    pub wall_s: f64,
}

impl KillLoopReport {
    /// Whether every invariant held.
    pub fn clean(&self) -> bool {
        held(
            &self.tally,
            self.unfinished,
            self.quarantined,
            &self.violations,
        )
    }
}

/// Whether a loop's counts show every invariant held (I1, I8, L1, and the violations').
pub(crate) fn held(
    tally: &Tally,
    unfinished: usize,
    quarantined: usize,
    violations: &[String],
) -> bool {
    tally.duplicates == 0
        && tally.lost == 0
        && unfinished == 0
        && quarantined == 0
        && violations.is_empty()
}

const TOKEN_LEN: usize = 32;
const VIOLATIONS_KEPT: usize = 20;

/// A harness's own failure (a file, a thread), told apart from what a server answered.
pub(crate) fn harness(error: impl std::fmt::Display) -> String {
    format!("harness: {error}")
}

/// What both loops start from: their directory, the oracle's sink in it, the token their
/// servers share and when the run began.
pub(crate) struct Setup {
    pub(crate) root: tempfile::TempDir,
    sink: PathBuf,
    pub(crate) token: String,
    started: Instant,
}

impl Setup {
    /// The token is the seeded draws' first.
    pub(crate) fn new(rng: &mut StdRng) -> Result<Self, String> {
        let started = Instant::now();
        let root = tempfile::tempdir().map_err(harness)?;
        let sink = root.path().join("sink");
        std::fs::write(&sink, "").map_err(harness)?;
        let token = (0..TOKEN_LEN)
            .map(|_| char::from(b'a' + rng.gen_range(0..26u8)))
            .collect();
        Ok(Self {
            root,
            sink,
            token,
            started,
        })
    }

    /// Each execution's script of appends to the sink with sleeps between them, in order.
    pub(crate) fn scripts(&self, options: &KillLoopOptions, rng: &mut StdRng) -> Vec<Value> {
        (0..options.executions)
            .map(|index| script(index, options, &self.sink, rng))
            .collect()
    }

    pub(crate) fn wall_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// Once the last server stopped: the store (`data`, or `options.store`) reopened and
    /// every admitted execution's events checked (I3, I4), each also handed to `each`; the
    /// violations cut to the first few; the sink counted against every line expected (I1,
    /// I8). Returns (tally, quarantined, reconciled effects).
    pub(crate) fn check(
        &self,
        options: &KillLoopOptions,
        data: &Path,
        admitted: &[Admitted],
        violations: &mut Vec<String>,
        mut each: impl FnMut(&[EventEnvelope]),
    ) -> Result<(Tally, usize, usize), String> {
        let reopening = |e: openprogram_storage::Error| format!("reopening the store: {e}");
        let store: Box<dyn EventReader> = match &options.store {
            Some(url) => Box::new(openprogram_storage::pg::PgStore::open(url).map_err(reopening)?),
            None => Box::new(Store::open(data).map_err(reopening)?),
        };
        let mut reconciled = 0;
        for execution in admitted {
            let Some(id) = execution.reply["execution_id"].as_str() else {
                continue;
            };
            let id: ExecutionId = id.parse().map_err(|e| format!("an execution id: {e}"))?;
            let events = store
                .events_after(id, 0, usize::MAX)
                .map_err(|e| format!("events of {id}: {e}"))?;
            reconciled += check_events(id, &events, violations);
            each(&events);
        }
        violations.truncate(VIOLATIONS_KEPT);
        let expected: Vec<String> = (0..options.executions)
            .flat_map(|index| (0..options.steps).map(move |step| line(index, step)))
            .collect();
        let tally = tally(&self.sink, &expected);
        Ok((tally, store.quarantined().len(), reconciled))
    }
}

/// A server this harness started, killed by pid on drop.
pub(crate) struct Server {
    pub(crate) child: Child,
    target: Target,
    stderr: PathBuf,
    spawned: Instant,
}

impl Server {
    /// `serve` listening on `listen` with `token`, its stderr in `log`, and `extra`
    /// arguments (a node's id and lease).
    pub(crate) fn start(
        options: &KillLoopOptions,
        data: &Path,
        token: &str,
        log: PathBuf,
        listen: &str,
        extra: &[String],
    ) -> Result<Self, String> {
        let stderr = std::fs::File::create(&log).map_err(harness)?;
        let spawned = Instant::now();
        let store = options
            .store
            .iter()
            .flat_map(|store| ["--store", store.as_str()]);
        let mut child = Command::new(&options.binary)
            .args(["serve", "--listen", listen, "--token", token, "--data"])
            .arg(data)
            .args(store)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("harness: spawn {}: {e}", options.binary.display()))?;
        let mut url = String::new();
        if let Some(stdout) = child.stdout.take() {
            let _ = std::io::BufReader::new(stdout).read_line(&mut url);
        }
        let target = Target {
            url: url.trim().to_owned(),
            token: token.to_owned(),
        };
        let server = Self {
            child,
            target,
            stderr: log,
            spawned,
        };
        match server.target.url.starts_with("http://") {
            true => Ok(server),
            false => Err(format!(
                "serve printed no URL; its stderr: {}",
                std::fs::read_to_string(&server.stderr).unwrap_or_default()
            )),
        }
    }

    /// Whether its startup recovery has ended (serve says so on stderr).
    fn recovered(&self) -> bool {
        std::fs::read_to_string(&self.stderr).is_ok_and(|log| log.contains("startup recovery:"))
    }

    /// The peak resident memory so far (VmHWM), in MiB.
    fn peak_rss_mib(&self) -> f64 {
        let process = self.child.id().to_string();
        crate::process_stats::status_kib(&process, "VmHWM:") as f64 / 1024.0
    }

    /// A JSON call with the run's token: the answer's body, or the error the server named.
    pub(crate) fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Value, String> {
        let failed = |(Failure::Usage(message) | Failure::Failed(message))| {
            format!("{method} {path}: {message}")
        };
        self.target.call(method, path, body).map_err(failed)
    }

    /// SIGTERM, waiting for the orderly shutdown; SIGKILL after a minute.
    pub(crate) fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill(); // by pid: the child this harness started
        let _ = self.child.wait();
    }
}

/// An admitted execution, its session, and the ids it must keep (I7).
#[derive(Debug, Clone)]
pub(crate) struct Admitted {
    index: usize,
    session: String,
    reply: Value,
}

/// Turns admitted into one session: a session runs one turn at a time (C-2), so the second
/// waits in its session's line, across the kills, until the first ended.
const TURNS_PER_SESSION: usize = 2;

/// Creates a session for every `TURNS_PER_SESSION` executions; execution `i` goes to
/// session `i / TURNS_PER_SESSION`.
pub(crate) fn sessions(server: &Server, executions: usize) -> Result<Vec<String>, String> {
    (0..executions.div_ceil(TURNS_PER_SESSION))
        .map(|_| {
            let session = server.call("POST", "/v1/sessions", None)?;
            match session["session_id"].as_str() {
                Some(id) => Ok(id.to_owned()),
                None => Err(format!("creating a session: {session}")),
            }
        })
        .collect()
}

/// Runs the loop; `progress` is told each kill.
pub fn run(options: &KillLoopOptions, progress: impl Fn(usize)) -> Result<KillLoopReport, String> {
    let mut rng = StdRng::seed_from_u64(options.seed);
    let setup = Setup::new(&mut rng)?;
    let data = setup.root.path().join("data");
    let start = |n: usize| {
        let log = setup.root.path().join(format!("serve-{n}.log"));
        Server::start(options, &data, &setup.token, log, "127.0.0.1:0", &[])
    };

    let mut server = start(0)?;
    let sessions = sessions(&server, options.executions)?;
    let scripts = setup.scripts(options, &mut rng);
    let admitted = admit(
        |_| Ok(&server),
        &sessions,
        scripts,
        options.admit_concurrency,
    )?;

    let mut recovery_ms = Vec::new();
    let mut peak_rss_mib: f64 = 0.0;
    for cycle in 0..options.cycles {
        let (low, high) = options.kill_after_ms;
        let kill_at = Instant::now() + Duration::from_millis(rng.gen_range(low..=high.max(low)));
        let mut recovered = cycle == 0; // the first server recovered nothing
        while Instant::now() < kill_at {
            if !recovered && server.recovered() {
                recovered = true;
                recovery_ms.push(server.spawned.elapsed().as_secs_f64() * 1e3);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        peak_rss_mib = peak_rss_mib.max(server.peak_rss_mib());
        drop(server); // SIGKILL
        server = start(cycle + 1)?;
        progress(cycle + 1);
    }
    // The last server is not killed: its recovery counts once it ends (on a slow hour
    // every kill may land inside a recovery).
    if options.cycles > 0 {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !server.recovered() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        if server.recovered() {
            recovery_ms.push(server.spawned.elapsed().as_secs_f64() * 1e3);
        }
    }

    // Quiescence: every execution completes, with its ids (L1, I7).
    let mut violations = Vec::new();
    let unfinished = await_completion(&admitted, &mut violations, |path| {
        // A transient error (a slow answer) is asked again until the deadline.
        Ok(server.call("GET", path, None).unwrap_or_else(unreadable))
    })?;
    peak_rss_mib = peak_rss_mib.max(server.peak_rss_mib());
    server.stop();

    let (tally, quarantined, reconciled) =
        setup.check(options, &data, &admitted, &mut violations, |_| {})?;
    let (p50, p99, max) = percentiles(&mut recovery_ms);
    Ok(KillLoopReport {
        seed: options.seed,
        cycles: options.cycles,
        executions: options.executions,
        steps: options.steps,
        tally,
        unfinished,
        reconciled,
        quarantined,
        violations,
        recoveries: recovery_ms.len(),
        recovery_ms_p50: p50,
        recovery_ms_p99: p99,
        recovery_ms_max: max,
        peak_rss_mib,
        wall_s: setup.wall_s(),
    })
}

/// A read that failed, as a snapshot of no state: asked again until the execution completes
/// or stalls.
pub(crate) fn unreadable(error: String) -> Value {
    json!({"state": "unreadable", "error": error})
}

/// Asks `snapshot(path)` for each execution until it completed with its reply and ids (L1, I7);
/// returns how many never did. An execution is given up on when it made no progress (no node
/// showed a newer `version`) for `STALL` — judged by progress, not by a clock set for the
/// loop's work, so a slow or loaded machine does not fail the run, while one that is stuck does.
/// `snapshot` turns a transient failure into a snapshot of no state; an `Err` is the harness's own.
pub(crate) fn await_completion(
    admitted: &[Admitted],
    violations: &mut Vec<String>,
    mut snapshot: impl FnMut(&str) -> Result<Value, String>,
) -> Result<usize, String> {
    const STALL: Duration = Duration::from_secs(120);
    let mut unfinished = 0;
    for execution in admitted {
        let id = execution.reply["execution_id"].as_str().unwrap_or_default();
        let path = format!("/v1/sessions/{}/executions/{id}", execution.session);
        let (mut newest, mut moved) = (0, Instant::now());
        loop {
            let snapshot = snapshot(&path)?;
            if snapshot["state"] == "completed" {
                if snapshot["text"] != format!("done {}", execution.index) {
                    violations.push(format!("{id}: reply {}", snapshot["text"]));
                }
                for field in ["turn_id", "reply_message_id", "user_message_id"] {
                    if snapshot[field] != execution.reply[field] {
                        violations.push(format!("I7: {id}: {field} changed"));
                    }
                }
                break;
            }
            // The newest version any node showed: a node may answer from an older view.
            if let Some(version) = snapshot["version"].as_u64().filter(|v| *v > newest) {
                (newest, moved) = (version, Instant::now());
            }
            if moved.elapsed() > STALL {
                unfinished += 1;
                violations.push(format!(
                    "L1: {id} made no progress for {} s: {snapshot}",
                    STALL.as_secs()
                ));
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(unfinished)
}

fn line(execution: usize, step: usize) -> String {
    format!("e{execution}-s{step}")
}

fn script(index: usize, options: &KillLoopOptions, sink: &Path, rng: &mut StdRng) -> Value {
    let mut script = Vec::new();
    for step in 0..options.steps {
        script.push(json!({"tool": "append", "args": {"path": sink, "line": line(index, step)}}));
        let (low, high) = options.sleep_ms;
        script.push(json!({"tool": "sleep", "args": {"ms": rng.gen_range(low..=high.max(low))}}));
    }
    script.push(json!({"reply": format!("done {index}")}));
    json!({"message": "soak", "script": script, "max_iterations": script.len()})
}

/// Admits every execution (201, acknowledged) into its session through `server(index)`,
/// `concurrency` clients at once.
pub(crate) fn admit<'s>(
    server: impl Fn(usize) -> Result<&'s Server, String> + Sync,
    sessions: &[String],
    scripts: Vec<Value>,
    concurrency: usize,
) -> Result<Vec<Admitted>, String> {
    let jobs: Vec<(usize, Value)> = scripts.into_iter().enumerate().collect();
    let chunk = jobs.len().div_ceil(concurrency.max(1)).max(1);
    let server = &server;
    std::thread::scope(|scope| {
        let clients: Vec<_> = jobs
            .chunks(chunk)
            .map(|jobs| {
                scope.spawn(move || {
                    jobs.iter()
                        .map(|(index, body)| {
                            let session = &sessions[index / TURNS_PER_SESSION];
                            let path = format!("/v1/sessions/{session}/executions");
                            let reply = server(*index)?.call("POST", &path, Some(body))?;
                            Ok(Admitted {
                                index: *index,
                                session: session.clone(),
                                reply,
                            })
                        })
                        .collect::<Result<Vec<_>, String>>()
                })
            })
            .collect();
        let mut admitted = Vec::new();
        for client in clients {
            let joined = client.join();
            admitted.extend(joined.unwrap_or_else(|_| Err("an admission client panicked".into()))?);
        }
        Ok(admitted)
    })
}

/// I4 and I3 over one execution's events; returns its effects reconciled.
fn check_events(id: ExecutionId, events: &[EventEnvelope], violations: &mut Vec<String>) -> usize {
    let mut dispatches: HashMap<_, usize> = HashMap::new();
    let mut newest_epoch = 0;
    let mut reconciled = 0;
    for envelope in events {
        match &envelope.event {
            Event::ToolDispatched { effect_id, .. } => {
                *dispatches
                    .entry((*effect_id, envelope.writer_epoch))
                    .or_default() += 1;
            }
            Event::AttemptStarted { epoch, .. } => newest_epoch = newest_epoch.max(*epoch),
            Event::ControlApplied {
                control: Control::Reconcile { .. },
                ..
            } => reconciled += 1,
            _ => {}
        }
        if envelope.writer_epoch != 0 && envelope.writer_epoch < newest_epoch {
            violations.push(format!(
                "I3: {id}: seq {} written by epoch {} after epoch {newest_epoch} claimed",
                envelope.seq, envelope.writer_epoch
            ));
        }
    }
    for ((effect, epoch), count) in dispatches {
        if count > 1 {
            violations.push(format!(
                "I4: {id}: {effect} dispatched {count} times by epoch {epoch}"
            ));
        }
    }
    reconciled
}

/// (p50, p99, max) of `values`, zeros when empty.
pub(crate) fn percentiles(values: &mut [f64]) -> (f64, f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    values.sort_by(f64::total_cmp);
    // To a tenth of a millisecond: the poll that sees a recovery end runs every 2 ms.
    let tenth = |value: f64| (value * 10.0).round() / 10.0;
    let at = |q: f64| tenth(values[((values.len() - 1) as f64 * q).round() as usize]);
    (at(0.5), at(0.99), tenth(values[values.len() - 1]))
}
