//! S-7 and R15: the store knows what it acknowledged. A store whose files lost acknowledged history
//! refuses to open with an error naming what is missing; an explicit salvage opens what is
//! left and says what was lost; byte flips in sled's data file never make acknowledged
//! executions disappear without a word (the issue-29 defect: 194 of 200 answered 404).

use std::path::Path;

use openprogram_storage::{Error, EventReader, ExecutionId, Limits, Store};
use rand::{Rng, SeedableRng};

use crate::support::*;

/// Copies a closed store's directory (sled's files and ours).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// N executions of three transitions each, the store closed (everything materialized).
async fn executions(dir: &Path, n: usize) -> Vec<ExecutionId> {
    let store = Store::open(dir).expect("open");
    let mut ids = Vec::new();
    for _ in 0..n {
        let execution_id = create(&store).await;
        append(&store, execution_id, 1, &"x".repeat(300)).await;
        append(&store, execution_id, 2, "done").await;
        ids.push(execution_id);
    }
    ids
}

#[tokio::test]
async fn s7_a_store_that_lost_acknowledged_history_refuses_to_open_and_salvage_says_what() {
    let dir = tempfile::tempdir().expect("tempdir");
    let older = tempfile::tempdir().expect("tempdir");
    let first = executions(dir.path(), 5).await;
    copy_dir(dir.path(), older.path());
    let (later, acknowledged) = {
        let store = Store::open(dir.path()).expect("reopen");
        let later = create(&store).await;
        append(&store, first[0], 3, "more").await;
        (later, store.durable_position())
    };
    // sled's files as they were before the later writes, with the record of what was
    // acknowledged since: the store lost acknowledged history.
    std::fs::copy(
        dir.path().join("acknowledged"),
        older.path().join("acknowledged"),
    )
    .expect("copy");
    let refused = Store::open(older.path()).map(|_| ());
    let present = match refused {
        Err(Error::AcknowledgedLost {
            acknowledged_through,
            present_through,
        }) => {
            assert_eq!(acknowledged_through, acknowledged);
            assert!(present_through < acknowledged, "{present_through}");
            present_through
        }
        other => panic!("expected acknowledged_lost, got {other:?}"),
    };
    let message = Store::open(older.path())
        .map(|_| ())
        .expect_err("refused")
        .to_string();
    assert!(
        message.contains("--accept-loss") && message.contains(&acknowledged.to_string()),
        "{message}"
    );
    // Salvage opens what is left and says what was lost; later opens check against it.
    {
        let (store, report) =
            Store::open_salvaging(older.path(), Limits::default()).expect("salvage");
        let report = report.expect("a loss is reported");
        assert_eq!(report.acknowledged_through, Some(acknowledged));
        assert_eq!(report.present_through, present);
        assert_eq!(report.lost_positions, acknowledged - present);
        assert_eq!(
            store.head(later).expect("read"),
            None,
            "created in the lost positions"
        );
        for execution_id in &first {
            assert!(store.head(*execution_id).expect("read").is_some());
        }
    }
    Store::open(older.path()).expect("a salvaged store opens");
    // The undamaged store opens as it was.
    let store = Store::open(dir.path()).expect("open");
    assert_eq!(
        store.head(later).expect("read").map(|head| head.version),
        Some(1)
    );
    drop(store);
    // Opened to salvage, a healthy store reports nothing and opens as usual.
    let (_, report) = Store::open_salvaging(dir.path(), Limits::default()).expect("open");
    assert_eq!(report, None);
}

/// The defect as found: 64 random bytes flipped in the store's largest file. Each seeded run
/// either refuses to open with an error, or opens with every acknowledged execution readable
/// or listed as quarantined — never one silently missing.
#[tokio::test]
async fn s7_byte_flips_in_the_largest_file_never_lose_executions_silently() {
    let pristine = tempfile::tempdir().expect("tempdir");
    let ids = executions(pristine.path(), 200).await;
    let seed: u64 = std::env::var("OP_FLIP_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    let runs: u64 = std::env::var("OP_FLIP_RUNS")
        .ok()
        .and_then(|runs| runs.parse().ok())
        .unwrap_or(6);
    eprintln!("s7 byte flips: seed {seed} (replay with OP_FLIP_SEED={seed}), {runs} runs");
    let (mut refused, mut intact) = (0, 0);
    for run in 0..runs {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed.wrapping_add(run));
        let damaged = tempfile::tempdir().expect("tempdir");
        copy_dir(pristine.path(), damaged.path());
        let largest = std::fs::read_dir(damaged.path())
            .expect("read dir")
            .filter_map(|entry| entry.ok())
            .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_file()))
            .max_by_key(|entry| entry.metadata().map(|meta| meta.len()).unwrap_or(0))
            .expect("a file")
            .path();
        let mut bytes = std::fs::read(&largest).expect("read");
        for _ in 0..64 {
            let at = rng.gen_range(0..bytes.len());
            bytes[at] ^= 1 << rng.gen_range(0..8);
        }
        std::fs::write(&largest, &bytes).expect("write");
        let store = match Store::open(damaged.path()) {
            Err(error) => {
                refused += 1;
                eprintln!("run {run}: refused: {error} ({})", error.code());
                continue;
            }
            Ok(store) => store,
        };
        let quarantined: Vec<ExecutionId> =
            store.quarantined().into_iter().map(|(id, _)| id).collect();
        for execution_id in &ids {
            match store.head(*execution_id) {
                Ok(Some(head)) => assert_eq!(head.version, 3, "seed {seed}, run {run}"),
                Ok(None) => panic!("seed {seed}, run {run}: {execution_id} is silently gone"),
                Err(error) => assert!(
                    quarantined.contains(execution_id)
                        || error.code() == "quarantined"
                        || error.code() == "corrupted",
                    "seed {seed}, run {run}: {execution_id}: {error}"
                ),
            }
        }
        intact += 1;
    }
    eprintln!("s7 byte flips: {refused} refused, {intact} opened with nothing silently lost");
}

/// Every file of a closed store (sled's files and ours), seeded.
fn store_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)
        .expect("read dir")
        .filter_map(|entry| entry.ok())
    {
        let path = entry.path();
        if path.is_dir() {
            files.extend(store_files(&path));
        } else {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// R15: byte flips and truncation at random offsets of every file of the store (sled's data
/// file, its config and snapshots, our record of what was acknowledged). Each damaged copy
/// either refuses to open with an error (no panic), or opens with every acknowledged
/// execution readable at its acknowledged version or reported (quarantined, corrupted).
#[tokio::test]
async fn r15_damage_to_any_store_file_is_refused_or_reported_never_silent() {
    let pristine = tempfile::tempdir().expect("tempdir");
    let ids = executions(pristine.path(), 60).await;
    let seed: u64 = std::env::var("OP_FLIP_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| rand::thread_rng().gen());
    eprintln!("r15: seed {seed} (replay with OP_FLIP_SEED={seed})");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let files = store_files(pristine.path());
    let mut outcomes = Vec::new();
    for file in &files {
        let name = file
            .strip_prefix(pristine.path())
            .expect("inside")
            .display()
            .to_string();
        for truncate in [false, true] {
            let damaged = tempfile::tempdir().expect("tempdir");
            copy_dir(pristine.path(), damaged.path());
            let target = damaged.path().join(&name);
            let mut bytes = std::fs::read(&target).expect("read");
            if bytes.is_empty() {
                continue;
            }
            if truncate {
                bytes.truncate(rng.gen_range(0..bytes.len()));
            } else {
                for _ in 0..8 {
                    let at = rng.gen_range(0..bytes.len());
                    bytes[at] ^= 1 << rng.gen_range(0..8);
                }
            }
            std::fs::write(&target, &bytes).expect("write");
            let what = format!(
                "seed {seed}: {name} {}",
                if truncate { "truncated" } else { "flipped" }
            );
            let opened = std::panic::catch_unwind(|| Store::open(damaged.path()));
            let store = match opened {
                Err(_) => panic!("{what}: opening panicked"),
                Ok(Err(error)) => {
                    outcomes.push(format!("{what}: refused ({})", error.code()));
                    continue;
                }
                Ok(Ok(store)) => store,
            };
            let mut reported = 0;
            for execution_id in &ids {
                match store.head(*execution_id) {
                    Ok(Some(head)) => assert_eq!(head.version, 3, "{what}: {execution_id}"),
                    Ok(None) => panic!("{what}: {execution_id} is silently gone"),
                    Err(_) => reported += 1,
                }
            }
            outcomes.push(format!("{what}: opened, {reported} reported"));
        }
    }
    eprintln!("r15: {}", outcomes.join("; "));
}
