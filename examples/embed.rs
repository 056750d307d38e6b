//! Embedding the runtime in a tokio program with a tool of your own.
//!
//! `cargo run --example embed` starts an agent turn whose scripted model calls the custom
//! `weather` tool, then prints the snapshot and the event log. The data lives in a
//! temporary directory; point `data_dir` at a real one to keep it.

use std::sync::Arc;

use openprogram::agent::{BoxFuture, FutureExt, Recovery, Tool, ToolCall};
use openprogram::storage::SessionId;
use openprogram::{Runtime, StartRequest};
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
    let runtime = Runtime::builder()
        .data_dir(dir.path())
        .tool(Arc::new(Weather))
        .open()?;
    let session = SessionId::new();
    let started = runtime
        .start_execution(
            session,
            StartRequest {
                message: "What is the weather in Lisbon?".into(),
                script: vec![
                    json!({"tool": "weather", "args": {"city": "Lisbon"}}).into(),
                    json!({"reply": "It is sunny in Lisbon."}).into(),
                ],
                ..Default::default()
            },
        )
        .await?;
    // Poll until the turn ends (a real service would stream events instead).
    let snapshot = loop {
        let snapshot = runtime.snapshot(session, started.execution_id).await?;
        if matches!(snapshot.state, "completed" | "failed" | "cancelled") {
            break snapshot;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    println!("{}", serde_json::to_string_pretty(&snapshot)?);
    for envelope in runtime.events(session, started.execution_id, 0)? {
        println!(
            "{:>3} {:>4} {}",
            envelope.seq,
            envelope.position,
            envelope.event.type_name()
        );
    }
    runtime.shutdown().await;
    Ok(())
}
