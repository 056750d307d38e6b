//! What a new attempt does with an execution another attempt left behind (E-4, A-1).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use openprogram::actors::execution::machine::Recovery;
use openprogram::agent::{Tool, ToolCall};
use openprogram::storage::{Event, SessionId};
use openprogram::{CommandRequest, Runtime, StartRequest};

use crate::support::*;

/// An External tool that never finishes: the worker "dies" while it is in flight.
struct Hang {
    calls: AtomicUsize,
}

impl Tool for Hang {
    fn name(&self) -> &str {
        "hang"
    }
    fn recovery(&self) -> Recovery {
        Recovery::External
    }
    fn call(&self, _call: ToolCall) -> BoxFuture<'static, Result<String, String>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        futures::future::pending().boxed()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e4_an_external_effect_left_in_flight_becomes_unknown_and_never_runs_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let hang = Arc::new(Hang {
        calls: AtomicUsize::new(0),
    });
    let session = SessionId::new();
    let execution = {
        let runtime = Runtime::builder()
            .data_dir(dir.path())
            .tool(hang.clone())
            .open()
            .expect("open");
        let request = StartRequest {
            message: "test".into(),
            script: vec![
                serde_json::json!({"tool": "hang", "args": {}}),
                reply("never"),
            ],
            ..Default::default()
        };
        let execution = runtime
            .start_execution(session, request)
            .await
            .expect("start")
            .execution_id;
        let started = std::time::Instant::now();
        while hang.calls.load(Ordering::SeqCst) == 0 {
            assert!(started.elapsed() < DEADLINE, "the tool never started");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        runtime.shutdown();
        execution
    };
    // A new runtime: the execution is still `running` in storage, its effect dispatched.
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .tool(hang.clone())
        .open()
        .expect("reopen");
    assert_eq!(
        runtime
            .snapshot(session, execution)
            .await
            .expect("snapshot")
            .state,
        "running"
    );
    let steer = CommandRequest {
        command_id: openprogram::storage::CommandId::new(),
        kind: "steer".into(),
        expected_version: None,
        text: Some("hello".into()),
    };
    if let Err(error) = runtime.command(session, execution, steer).await {
        for e in runtime.events(session, execution, 0).expect("events") {
            eprintln!("{} {:?}", e.seq, e.event);
        }
        panic!("steer: {error:?}");
    }
    let started = std::time::Instant::now();
    let snapshot = loop {
        let snapshot = runtime
            .snapshot(session, execution)
            .await
            .expect("snapshot");
        if snapshot.state == "reconciliation_required" {
            break snapshot;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "never flagged for reconciliation: {snapshot:#?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    };
    assert!(
        snapshot
            .receipts
            .iter()
            .any(|r| r.tool == "hang" && r.status == "unknown"),
        "{:?}",
        snapshot.receipts
    );
    assert_eq!(
        hang.calls.load(Ordering::SeqCst),
        1,
        "an External effect is never repeated"
    );
    let events = runtime.events(session, execution, 0).expect("events");
    let epochs: Vec<u64> = events
        .iter()
        .filter_map(|e| match e.event {
            Event::AttemptStarted { epoch, .. } => Some(epoch),
            _ => None,
        })
        .collect();
    assert_eq!(epochs, vec![1, 2]);
    runtime.shutdown();
}
