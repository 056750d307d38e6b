//! `cargo bench --bench context`: what assembling a model request's context costs as a
//! conversation grows (E-8). One branch of `CONTEXT_TURNS` turns (default 1000) is built
//! with the scripted provider, each turn a tool call (`echo`) and a reply, answering the one
//! before. The runtime is closed, and on the store alone the bench times, for a new turn
//! answering turn k (`CONTEXT_AT`, default `1,100,1000`):
//! - `cold`: reading its branch with nothing cached (after a restart, or on another node):
//!   the session's graph, then each turn on the path replayed;
//! - `warm`: the same read with the parent's branch cached (`BranchCache`), as after the
//!   parent ended on this node: what every turn of a conversation pays;
//! - `form`: writing the branch into the messages both provider APIs are written from (the
//!   request's body minus its serialization), for scale.
//!
//! Each is the median and range of `CONTEXT_READS` reads (default 21). Prints a table,
//! then one JSON line per k. Nothing is asserted: it measures.

use std::sync::Arc;
use std::time::{Duration, Instant};

use openprogram::actors::context_read::{load, BranchCache};
use openprogram::agent::{AgentInput, ModelRequest};
use openprogram::storage::{MessageId, SessionId, Store};
use openprogram::{Runtime, StartRequest};
use serde_json::json;

/// The `openprogram` binary's allocator (see `src/main.rs`), so that this bench measures what
/// the binary runs.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn env_list(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect()
}

/// Median, lowest and highest, in ms.
fn summary(samples: &mut [Duration]) -> (f64, f64, f64) {
    samples.sort();
    let ms = |at: usize| samples[at].as_secs_f64() * 1e3;
    (ms(samples.len() / 2), ms(0), ms(samples.len() - 1))
}

/// Builds the branch; the reply message id of each turn, oldest first.
fn build(dir: &std::path::Path, session: SessionId, turns: usize) -> Vec<MessageId> {
    let threads = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let runtime = Runtime::builder()
        .data_dir(dir)
        .open()
        .expect("open runtime");
    let mut replies = Vec::with_capacity(turns);
    let building = Instant::now();
    threads.block_on(async {
        for n in 0..turns {
            let request = StartRequest {
                message: format!("turn {n}: find the next file"),
                parent_message_id: replies.last().copied(),
                script: vec![
                    json!({"tool": "echo", "args": {"text": format!("file-{n}.log")}}).into(),
                    json!({"reply": format!("file-{n}.log is the one.")}).into(),
                ],
                ..Default::default()
            };
            let started = runtime
                .start_execution(session, request)
                .await
                .expect("start");
            runtime
                .wait_finished(session, started.execution_id)
                .await
                .expect("finished");
            replies.push(started.reply_message_id);
            if (n + 1) % 100 == 0 {
                eprintln!(
                    "built {} turns in {:.1} s",
                    n + 1,
                    building.elapsed().as_secs_f64()
                );
            }
        }
    });
    eprintln!(
        "built {turns} turns in {:.1} s",
        building.elapsed().as_secs_f64()
    );
    threads.block_on(runtime.shutdown());
    replies
}

fn main() {
    let turns = env_list("CONTEXT_TURNS", "1000")
        .first()
        .copied()
        .unwrap_or(1000);
    let at = env_list("CONTEXT_AT", "1,100,1000");
    let reads = env_list("CONTEXT_READS", "21")
        .first()
        .copied()
        .unwrap_or(21)
        .max(1);
    let dir = tempfile::tempdir().expect("tempdir");
    let session = SessionId::new();
    let replies = build(dir.path(), session, turns);
    let store = Store::open(dir.path()).expect("open the store");
    println!(
        "{:>6} {:>24} {:>24} {:>24}",
        "turn k", "cold ms (min-max)", "warm ms (min-max)", "form ms (min-max)"
    );
    for k in at.into_iter().filter(|k| (1..=turns).contains(k)) {
        let parent = Some(replies[k - 1]);
        let (mut cold, mut warm, mut form) = (Vec::new(), Vec::new(), Vec::new());
        let mut entries = 0;
        for _ in 0..reads {
            let cache = BranchCache::default();
            let started = Instant::now();
            let loaded = load(&store, &cache, session, parent, None).expect("cold read");
            cold.push(started.elapsed());
            let started = Instant::now();
            let again = load(&store, &cache, session, parent, None).expect("warm read");
            warm.push(started.elapsed());
            entries = again.earlier.len();
            let request = ModelRequest {
                execution_id: openprogram::storage::ExecutionId::new(),
                effect_id: openprogram::storage::EffectId::new(),
                input: Arc::new(AgentInput {
                    message: "continue".into(),
                    ..AgentInput::default()
                }),
                context: Arc::default(),
                earlier: loaded.earlier,
                left_out: 0,
                iterations: 0,
                used: Default::default(),
                usage: Default::default(),
                deltas: Default::default(),
            };
            let started = Instant::now();
            let messages = request.messages();
            form.push(started.elapsed());
            assert!(
                messages.len() >= 2 * entries,
                "the branch's turns are in the form"
            );
        }
        let (cold, warm, form) = (summary(&mut cold), summary(&mut warm), summary(&mut form));
        let range =
            |(median, low, high): (f64, f64, f64)| format!("{median:.3} ({low:.3}-{high:.3})");
        println!(
            "{:>6} {:>24} {:>24} {:>24}",
            k,
            range(cold),
            range(warm),
            range(form)
        );
        println!(
            "{}",
            json!({
                "bench": "context", "turns": turns, "k": k, "earlier": entries, "reads": reads,
                "cold_ms": cold.0, "cold_min_ms": cold.1, "cold_max_ms": cold.2,
                "warm_ms": warm.0, "warm_min_ms": warm.1, "warm_max_ms": warm.2,
                "form_ms": form.0, "form_min_ms": form.1, "form_max_ms": form.2,
            })
        );
    }
}
