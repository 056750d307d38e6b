//! S-3 with real processes: a child commits from 100 concurrent writers and prints each
//! acknowledgement; the parent SIGKILLs it at random moments, reopens the store and checks
//! that every acknowledged transition is there, seqs and positions are gap-free, nothing
//! unacknowledged is half-applied, and the by-state index agrees with every head. Children
//! materialize in small slices so kills land in partial materializations; a third of the
//! kills land early, during open and replay; the parent verifies (which cleanly closes the
//! store) only every other cycle, so most children start from a crashed store.
//! `OP_CRASH_SEED` replays a run, `OP_CRASH_CYCLES` makes it longer (soak).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use openprogram_storage::{Event, EventReader, ExecutionId, ExecutionState, Store};
use rand::{Rng, SeedableRng};

const WRITERS: u64 = 100;
const CYCLES_DEFAULT: u64 = 20;
/// Materialization slice and interval of the children: a materialization spans many groups.
const CHILD_SLICE_LEN: &str = "16";
const CHILD_INTERVAL_MS: &str = "20";
/// How often a child checks whether sled doubled, to copy it into a new generation (S-9).
const CHILD_COPY_CHECK_MS: &str = "10";
/// How long a child may take to open the store and say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

fn execution_of(writer: u64) -> ExecutionId {
    ExecutionId::from_uuid(uuid::Uuid::from_u128(u128::from(writer) + 1))
}

/// The state the crash writer gives its execution at `version` (see `crash_writer`).
fn state_at(version: u64) -> ExecutionState {
    match version {
        0 | 1 => ExecutionState::Queued,
        odd if odd % 2 == 1 => ExecutionState::Running,
        _ => ExecutionState::Paused,
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
}

/// Runs one child, SIGKILLs it `kill_after` past its ready line (or, if `early`, past its
/// start, ready or not) and returns the `(writer, version)` pairs it acknowledged.
fn run_and_kill(dir: &std::path::Path, kill_after: Duration, early: bool) -> Vec<(u64, u64)> {
    let mut child: Child = Command::new(env!("CARGO_BIN_EXE_storage-crash-writer"))
        .arg(dir)
        .arg(WRITERS.to_string())
        .arg(CHILD_SLICE_LEN)
        .arg(CHILD_INTERVAL_MS)
        .arg(CHILD_COPY_CHECK_MS)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the crash writer");
    let stdout = child.stdout.take().expect("piped stdout");
    let (lines_tx, lines_rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    if !early {
        let ready = lines_rx.recv_timeout(READY_TIMEOUT);
        if !matches!(&ready, Ok(line) if line.starts_with("ready")) {
            let _ = child.kill();
            let output = child.wait_with_output().expect("child output");
            panic!(
                "child not ready ({ready:?}): {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
    std::thread::sleep(kill_after);
    // The child only stops when killed; if it already exited, it failed.
    if let Some(status) = child.try_wait().expect("try_wait") {
        let output = child.wait_with_output().expect("child output");
        panic!(
            "child exited early with {status}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    child.kill().expect("SIGKILL the child");
    child.wait().expect("reap the child");
    reader.join().expect("reader thread");
    lines_rx
        .try_iter()
        .filter_map(|line| {
            let mut parts = line.split(' ');
            match (parts.next(), parts.next(), parts.next()) {
                (Some("ack"), Some(writer), Some(version)) => {
                    Some((writer.parse().ok()?, version.parse().ok()?))
                }
                _ => None, // the ready line, or a line cut by the kill
            }
        })
        .collect()
}

/// Every acknowledged version is present; each execution's events are exactly one per
/// version, gap-free, with the content its writer wrote; its state matches its version and
/// the by-state index lists it there; the global log is gap-free and holds exactly the
/// executions' events.
fn verify(store: &Store, acked: &HashMap<u64, u64>, seed: u64, cycle: u64) {
    let context = format!("seed {seed} cycle {cycle}");
    let mut n_events = 0usize;
    let mut expected_by_state: HashMap<ExecutionState, Vec<ExecutionId>> = HashMap::new();
    for writer in 0..WRITERS {
        let execution_id = execution_of(writer);
        let acked_version = acked.get(&writer).copied().unwrap_or(0);
        let head = store.head(execution_id).expect("head");
        let version = head.as_ref().map_or(0, |head| head.version);
        assert!(
            version >= acked_version,
            "{context}: writer {writer} acknowledged {acked_version}, store has {version}"
        );
        let events = store
            .events_after(execution_id, 0, usize::MAX)
            .expect("events");
        assert_eq!(
            events.len() as u64,
            version,
            "{context}: writer {writer} half-applied"
        );
        if let Some(head) = &head {
            assert_eq!(head.last_seq, version, "{context}: writer {writer}");
            assert_eq!(head.state, state_at(version), "{context}: writer {writer}");
            expected_by_state
                .entry(head.state)
                .or_default()
                .push(execution_id);
        }
        for (index, envelope) in events.iter().enumerate() {
            let seq = index as u64 + 1;
            assert_eq!(envelope.seq, seq, "{context}: writer {writer} seq gap");
            let Event::ModelDecided { decision, .. } = &envelope.event else {
                panic!("{context}: unexpected event {envelope:?}");
            };
            assert!(
                decision.starts_with(&format!("{writer}:{seq}:")),
                "{context}: {decision}"
            );
        }
        n_events += events.len();
    }
    let log = store.log_after(0, usize::MAX).expect("log");
    assert_eq!(
        log.len(),
        n_events,
        "{context}: global log and executions disagree"
    );
    for (index, envelope) in log.iter().enumerate() {
        assert_eq!(
            envelope.position,
            index as u64 + 1,
            "{context}: position gap"
        );
    }
    assert_eq!(store.durable_position(), n_events as u64, "{context}");
    assert!(
        store.quarantined().is_empty(),
        "{context}: {:?}",
        store.quarantined()
    );
    for state in [
        ExecutionState::Queued,
        ExecutionState::Running,
        ExecutionState::Paused,
    ] {
        let mut expected = expected_by_state.remove(&state).unwrap_or_default();
        expected.sort();
        let listed = store.executions_in_state(state).expect("by state");
        assert_eq!(listed, expected, "{context}: by-state index of {state}");
    }
}

#[test]
fn s3_acknowledged_transitions_survive_kill_9() {
    let seed = env_u64("OP_CRASH_SEED").unwrap_or_else(rand::random);
    let cycles = env_u64("OP_CRASH_CYCLES").unwrap_or(CYCLES_DEFAULT);
    eprintln!("s3 crash test: seed {seed}, {cycles} cycles (replay with OP_CRASH_SEED={seed})");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut acked: HashMap<u64, u64> = HashMap::new();
    let mut total_acks = 0usize;
    let started = Instant::now();
    for cycle in 0..cycles {
        let early = rng.gen_range(0..3) == 0;
        let kill_after = if early {
            Duration::from_millis(rng.gen_range(0..60))
        } else {
            Duration::from_millis(rng.gen_range(20..400))
        };
        let acks = run_and_kill(dir.path(), kill_after, early);
        total_acks += acks.len();
        for (writer, version) in acks {
            let entry = acked.entry(writer).or_insert(0);
            *entry = (*entry).max(version);
        }
        if cycle % 2 == 1 || cycle + 1 == cycles {
            let store = Store::open(dir.path()).expect("reopen after kill");
            verify(&store, &acked, seed, cycle);
        }
    }
    assert!(
        total_acks > 0,
        "seed {seed}: the children acknowledged nothing"
    );
    // The children copied sled into new generations (S-9) between the kills: the newest.
    let generation = std::fs::read_dir(dir.path().join("generations"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u64>().ok())
        .max()
        .unwrap_or(0);
    eprintln!(
        "s3 crash test: seed {seed}: {cycles} kills, {total_acks} acknowledgements verified, sled in generation {generation}, in {:.1?}",
        started.elapsed()
    );
    assert!(
        generation > 0 || cycles < 10,
        "seed {seed}: no child switched sled to a new generation: the kills tested no switch"
    );
}

#[test]
fn r07_second_process_is_refused_while_the_store_is_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let _store = Store::open(dir.path()).expect("open");
    let output = Command::new(env!("CARGO_BIN_EXE_storage-crash-writer"))
        .arg(dir.path())
        .arg("1")
        .output()
        .expect("run the crash writer");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("already open"), "{stderr}");
}

/// sled 0.34.7 picks an unfinished `snap.<lsn>.generating` file (left by a crash while it
/// writes a snapshot) when it opens, and refuses the store as corrupted (found by the kill -9
/// restart loop of the runtime's R02). The store removes such a file and opens, with
/// everything acknowledged before.
#[tokio::test]
async fn s3_a_crash_while_sled_writes_a_snapshot_leaves_a_store_that_opens() {
    let dir = tempfile::tempdir().expect("tempdir");
    let execution = {
        let store = Store::open(dir.path()).expect("open");
        let execution = crate::support::create(&store).await;
        crate::support::append(&store, execution, 1, "acknowledged").await;
        execution
    };
    let unfinished = dir.path().join("snap.FFFFFFFFFFFFFFFF.generating");
    std::fs::write(&unfinished, b"half a snapshot, no checksum").expect("write");
    let store = Store::open(dir.path()).expect("opens despite the unfinished snapshot");
    assert!(!unfinished.exists());
    let events = crate::support::all_events(&store, execution);
    assert_eq!(events.len(), 2, "{events:?}");
}

/// Starts the crash writer with a materialization interval far beyond its life, waits for
/// its ready line, lets it run `run_for`, SIGKILLs it; returns its acknowledgements.
fn run_unmaterialized(dir: &std::path::Path, writers: u64, run_for: Duration) -> usize {
    let mut child: Child = Command::new(env!("CARGO_BIN_EXE_storage-crash-writer"))
        .arg(dir)
        .arg(writers.to_string())
        .arg("32")
        .arg("600000")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the crash writer");
    let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    let ready = lines.next().expect("a line").expect("utf-8");
    assert!(ready.starts_with("ready"), "{ready}");
    std::thread::sleep(run_for);
    child.kill().expect("SIGKILL the child"); // by pid: the child this test started
    child.wait().expect("reap the child");
    lines
        .map_while(Result::ok)
        .filter(|line| line.starts_with("ack "))
        .count()
}

/// S-6 under repeated crashes: a run killed before its first materialization must not hand
/// the next open a longer tail. Open materializes the tail it replayed before it returns, so
/// a second short-lived run leaves only its own few transitions to replay (found by the
/// runtime's 1,000-kill soak, where starts grew slower and slower).
#[test]
fn s6_a_crash_before_the_first_materialization_does_not_grow_the_next_replay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = run_unmaterialized(dir.path(), 20, Duration::from_millis(300));
    assert!(first > 100, "the first run acknowledged only {first}");
    let second = run_unmaterialized(dir.path(), 1, Duration::from_millis(0));
    let store = Store::open(dir.path()).expect("reopen");
    let replayed = store.metrics().replayed_frames as usize;
    eprintln!(
        "s6: first run {first} acks, second {second}; replayed at the third open: {replayed}"
    );
    assert!(
        replayed <= second + 2,
        "the third open replayed {replayed} frames: the first run's tail ({first}) was never materialized"
    );
}
