//! `cargo bench --bench history`: what one execution's history costs to read (issue 33).
//! For each length N (`HISTORY_STEPS`, default `100,1000,10000,100000`), one agent turn
//! takes N tool steps (`echo`, each a decision and a result, each durable), then opens an
//! approval and parks. The runtime is then reopened on the store (nothing of the execution
//! in memory), and the bench times, for that parked execution:
//! - a snapshot read, p50 and p99 of `HISTORY_READS` reads (default 20): what `GET
//!   …/executions/{eid}` costs;
//! - one page of events (100 after seq 0, and 100 at the end), p50;
//! - the answer to its wait: the command's call to its `applied` answer, which includes the
//!   activation of the parked execution (loading it, starting its actor) and one commit;
//! - and from the same call until the execution has finished: the actor reads the whole
//!   history before its next step (a model request carries the whole context, S-8), then
//!   takes one step.
//!
//! Prints a table, then one JSON line per length. Nothing is asserted: it measures.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::FutureExt as _;
use openprogram::actors::machine::{Decision, ToolArgs, Turn};
use openprogram::agent::{ModelRequest, Provider};
use openprogram::storage::{ExecutionId, SessionId};
use openprogram::{Command, CommandBody, Runtime, StartRequest, WaitRef};
use serde_json::json;

/// The `openprogram` binary's allocator (see `src/main.rs`), so that this bench measures what
/// the binary runs.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// `steps` `echo` calls, then an approval, then the reply.
struct LongTurn {
    steps: Arc<AtomicU32>,
}

impl Provider for LongTurn {
    fn decide(&self, request: ModelRequest) -> BoxFuture<'static, Result<Decision, String>> {
        let steps = self.steps.load(Ordering::Relaxed);
        let answered = request
            .context
            .iter()
            .any(|turn| matches!(turn, Turn::WaitResolved { .. }));
        let decision = if request.iterations < steps {
            Decision::tool(
                "echo".into(),
                ToolArgs::from(json!({"text": "x".repeat(200)})),
            )
        } else if !answered {
            Decision::Ask {
                prompt: "done?".into(),
                wait: None,
            }
        } else {
            Decision::reply("done".into())
        };
        futures::future::ready(Ok(decision)).boxed()
    }

    /// The built-in script's decisions: the same contract as `Scripted` (K-2).
    fn contract(&self) -> String {
        openprogram::agent::Provider::contract(&openprogram::agent::Scripted)
    }
}

fn env_list(name: &str, default: &str) -> Vec<u32> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect()
}

fn percentile(samples: &mut [Duration], quantile: f64) -> f64 {
    samples.sort();
    let at = ((samples.len() as f64 - 1.0) * quantile).round() as usize;
    samples[at].as_secs_f64() * 1e3
}

fn open(dir: &std::path::Path, steps: &Arc<AtomicU32>) -> Runtime {
    Runtime::builder()
        .data_dir(dir)
        .provider(Arc::new(LongTurn {
            steps: Arc::clone(steps),
        }))
        .open()
        .expect("open runtime")
}

fn main() {
    let lengths = env_list("HISTORY_STEPS", "100,1000,10000,100000");
    let reads = env_list("HISTORY_READS", "20")
        .first()
        .copied()
        .unwrap_or(20) as usize;
    let threads = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    println!(
        "{:>8} {:>10} {:>12} {:>12} {:>12} {:>12} {:>10} {:>12}",
        "steps",
        "build s",
        "snapshot p50",
        "snapshot p99",
        "page 1 p50",
        "last page",
        "answer ms",
        "finished ms"
    );
    let mut lines = Vec::new();
    for n in lengths {
        let dir = tempfile::tempdir().expect("tempdir");
        let steps = Arc::new(AtomicU32::new(n));
        let session = SessionId::new();
        let runtime = open(dir.path(), &steps);
        let started = Instant::now();
        let execution: ExecutionId = threads.block_on(async {
            let request = StartRequest {
                message: "a long turn".into(),
                max_iterations: Some(n + 2),
                ..Default::default()
            };
            let execution = runtime
                .start_execution(session, request)
                .await
                .expect("start")
                .execution_id;
            loop {
                let snapshot = runtime
                    .snapshot(session, execution)
                    .await
                    .expect("snapshot");
                if snapshot.state == "waiting" {
                    break execution;
                }
                assert!(snapshot.state == "running", "{snapshot:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        let built = started.elapsed();
        threads.block_on(runtime.shutdown());
        drop(runtime);
        // Reopened: nothing of the execution is in memory.
        let runtime = open(dir.path(), &steps);
        threads.block_on(runtime.recovery()).expect("recovery");
        let (mut snapshots, mut first_pages, mut last_pages) = (Vec::new(), Vec::new(), Vec::new());
        let last_seq = runtime.last_seq(session, execution).expect("last seq");
        for _ in 0..reads {
            let at = Instant::now();
            let snapshot = threads
                .block_on(runtime.snapshot(session, execution))
                .expect("snapshot");
            snapshots.push(at.elapsed());
            assert_eq!(snapshot.state, "waiting");
            let at = Instant::now();
            runtime
                .events_page(session, execution, 0, 100)
                .expect("first page");
            first_pages.push(at.elapsed());
            let at = Instant::now();
            runtime
                .events_page(session, execution, last_seq.saturating_sub(100), 100)
                .expect("last page");
            last_pages.push(at.elapsed());
        }
        let version = threads
            .block_on(runtime.snapshot(session, execution))
            .expect("snapshot")
            .version;
        let at = Instant::now();
        let answer = Command::new(CommandBody::Answer {
            wait: WaitRef::Pending,
            answer: "yes".into(),
            scope: openprogram::storage::AnswerScope::Operation,
        });
        let answered = threads
            .block_on(runtime.command(session, execution, answer.expecting(version)))
            .expect("answer");
        let answer_ms = at.elapsed().as_secs_f64() * 1e3;
        assert_eq!(answered.status, "applied", "{answered:?}");
        threads
            .block_on(runtime.wait_finished(session, execution))
            .expect("finished");
        let finished_ms = at.elapsed().as_secs_f64() * 1e3;
        let row = (
            percentile(&mut snapshots, 0.5),
            percentile(&mut snapshots, 0.99),
            percentile(&mut first_pages, 0.5),
            percentile(&mut last_pages, 0.5),
        );
        println!(
            "{:>8} {:>10.1} {:>12.3} {:>12.3} {:>12.3} {:>12.3} {:>10.3} {:>12.3}",
            n,
            built.as_secs_f64(),
            row.0,
            row.1,
            row.2,
            row.3,
            answer_ms,
            finished_ms
        );
        lines.push(json!({
            "steps": n,
            "events": last_seq,
            "build_s": built.as_secs_f64(),
            "snapshot_p50_ms": row.0,
            "snapshot_p99_ms": row.1,
            "first_page_p50_ms": row.2,
            "last_page_p50_ms": row.3,
            "answer_ms": answer_ms,
            "finished_ms": finished_ms,
        }));
        threads.block_on(runtime.shutdown());
    }
    for line in lines {
        println!("{line}");
    }
}
