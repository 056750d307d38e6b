//! A-1 / R05: a stale attempt is fenced. The first attempt's worker freezes (its arbiter
//! thread blocks inside the provider, as a SIGSTOPped process would) before it commits; its
//! lease lapses; a new attempt is claimed with a higher epoch; when the old one wakes, its
//! write comes back `Fenced` and its actor stops. Only the new attempt's work is recorded.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::FutureExt;
use openprogram::actors::execution::machine::Decision;
use openprogram::agent::{ModelRequest, Provider, Scripted};
use openprogram::storage::{Event, SessionId};
use openprogram::{Runtime, StartRequest};

use crate::support::*;

/// The scripted provider, except that its first call freezes the calling thread.
struct FreezeFirstCall {
    frozen: AtomicBool,
    freeze: Duration,
}

impl Provider for FreezeFirstCall {
    fn decide(&self, request: ModelRequest) -> BoxFuture<'static, Result<Decision, String>> {
        if !self.frozen.swap(true, Ordering::SeqCst) {
            std::thread::sleep(self.freeze);
        }
        Scripted.decide(request).boxed()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r05_a_stale_attempt_is_fenced_and_stops() {
    let dir = tempfile::tempdir().expect("tempdir");
    let ttl = Duration::from_millis(150);
    let provider = Arc::new(FreezeFirstCall {
        frozen: AtomicBool::new(false),
        freeze: ttl * 8,
    });
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .provider(provider)
        .lease_ttl(ttl)
        .open()
        .expect("open");
    let session = SessionId::new();
    let request = StartRequest {
        message: "test".into(),
        script: vec![echo("a"), reply("done")],
        ..Default::default()
    };
    let execution = runtime
        .start_execution(session, request)
        .await
        .expect("start")
        .execution_id;
    // Wait until the frozen attempt's lease has lapsed and a new attempt takes over.
    let started = Instant::now();
    let reclaimed = loop {
        let reclaimed = runtime.reclaim_lapsed_attempts().await.expect("reclaim");
        if !reclaimed.is_empty() {
            break reclaimed;
        }
        assert!(started.elapsed() < DEADLINE, "the lease never lapsed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(reclaimed, vec![execution]);
    let done = loop {
        let snapshot = runtime
            .snapshot(session, execution)
            .await
            .expect("snapshot");
        if snapshot.state == "completed" {
            break snapshot;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "never completed: {snapshot:#?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(done.text, "done");
    assert_eq!(done.attempt, 2);
    let events = runtime.events(session, execution, 0).expect("events");
    let epochs: Vec<u64> = events
        .iter()
        .filter_map(|e| match e.event {
            Event::AttemptStarted { epoch, .. } => Some(epoch),
            _ => None,
        })
        .collect();
    assert_eq!(epochs, vec![1, 2]);
    // Every decision and tool result was written by the new attempt: the frozen one's
    // decision was fenced, never recorded.
    for envelope in &events {
        if matches!(
            envelope.event,
            Event::ModelDecided { .. } | Event::ToolFinished { .. }
        ) {
            assert_eq!(envelope.writer_epoch, 2, "{envelope:?}");
        }
    }
    assert_eq!(
        count(&events, |e| matches!(e, Event::ModelDecided { .. })),
        2
    );
    // The fenced actor stopped and the finished one released itself.
    while runtime.live_executions() > 0 {
        assert!(
            started.elapsed() < DEADLINE,
            "{} actors still live",
            runtime.live_executions()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    runtime.shutdown();
}
