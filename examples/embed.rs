//! Embedding the runtime in a tokio program with a tool of your own.
//!
//! `cargo run --example embed` starts an agent turn whose scripted model calls the custom
//! `weather` tool, then prints the snapshot and the event log. The data lives in a
//! temporary directory; point `data_dir` at a real one to keep it.

use std::sync::Arc;

use openprogram::agent::{BoxFuture, FutureExt, Recovery, Tool, ToolCall};
use openprogram::storage::SessionId;
use openprogram::{Command, CommandBody, Runtime, StartRequest};
use serde_json::json;

/// A read-only lookup: safe to run again after a crash, so `Idempotent`.
struct Weather;

impl Tool for Weather {
    fn name(&self) -> &str {
        "weather"
    }

    fn recovery(&self) -> Recovery {
        Recovery::Idempotent
    }

    fn call(&self, call: ToolCall) -> BoxFuture<'static, openprogram::agent::ToolResult> {
        let city = call
            .args
            .get("city")
            .and_then(|city| city.as_str())
            .map(str::to_owned);
        async move {
            let city = city.ok_or("missing `city`")?;
            Ok(format!("sunny in {city}"))
        }
        .boxed()
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    // README: begin (README.md shows the lines up to "README: end"; a test compares them)
    let runtime = Runtime::builder()
        .data_dir(dir.path()) // the sled store; opening it resumes unfinished work
        .tool(Arc::new(Weather)) // beside the built-ins; .provider(..) replaces the scripted one
        .open()?; // Send + Sync + Clone, usable from any tokio runtime
    let session = SessionId::new();
    let request = StartRequest {
        message: "What is the weather in Lisbon?".into(),
        script: vec![
            json!({"tool": "weather", "args": {"city": "Lisbon"}}).into(),
            json!({"reply": "It is sunny in Lisbon."}).into(),
        ],
        ..Default::default()
    };
    let id = runtime
        .start_execution(session, request)
        .await?
        .execution_id;
    let pause = Command::new(CommandBody::Pause); // a new command_id; a typed body per kind
    let reply = runtime.command(session, id, pause).await?; // applied, or rejected with a code
    let snapshot = runtime.snapshot(session, id).await?; // state, receipts, waits, controls
    let events = runtime.events(session, id, 0)?; // the event log after seq 0

    // README: end
    println!(
        "pause {}: {} at {} events",
        reply.status,
        snapshot.state,
        events.len()
    );
    let resume = Command::new(CommandBody::continue_());
    runtime.command(session, id, resume).await?;
    // Poll until the turn ends (a real service would follow its events instead).
    let snapshot = loop {
        let snapshot = runtime.snapshot(session, id).await?;
        if matches!(snapshot.state, "completed" | "failed" | "cancelled") {
            break snapshot;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    println!("{}", serde_json::to_string_pretty(&snapshot)?);
    for envelope in runtime.events(session, id, 0)? {
        println!(
            "{:>3} {:>4} {}",
            envelope.seq,
            envelope.position,
            envelope.event.type_name()
        );
    }
    runtime.shutdown().await; // running work pauses for the next start
    Ok(())
}
