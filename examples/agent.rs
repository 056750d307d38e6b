//! An agent on a real model: the OpenAI-compatible provider and a tool of your own.
//!
//! ```text
//! OPENAI_BASE_URL=http://127.0.0.1:8080/v1 OPENAI_MODEL=qwen2.5 \
//!     cargo run --example agent -- "What is the weather in Lisbon?"
//! ```
//!
//! Any chat-completions server with tool calls will do: llama.cpp's `llama-server`, vLLM,
//! Ollama (`http://127.0.0.1:11434/v1`), a gateway, or OpenAI itself (`OPENAI_BASE_URL`
//! unset, `OPENAI_API_KEY` set). The model may call the `weather` tool below; every call and
//! every model request is an effect with a receipt, so the turn survives a crash of this
//! process (with a `data_dir` that outlives it: here `OPENPROGRAM_DATA`, else a temporary
//! directory). Prints the reply, the receipts and the tokens used.

use std::sync::Arc;
use std::time::Duration;

use openprogram::agent::{BoxFuture, FutureExt, Recovery, Tool, ToolCall, ToolResult};
use openprogram::providers::{Api, ApiKey, HttpProvider, ProviderConfig};
use openprogram::storage::SessionId;
use openprogram::{Runtime, StartRequest};
use serde_json::{json, Value};

/// A read-only lookup: safe to run again after a crash, so `Idempotent`. Its description
/// and parameters are what the model is told.
struct Weather;

impl Tool for Weather {
    fn name(&self) -> &str {
        "weather"
    }

    fn recovery(&self) -> Recovery {
        Recovery::Idempotent
    }

    fn description(&self) -> String {
        "Today's weather in a city.".into()
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        })
    }

    fn call(&self, call: ToolCall) -> BoxFuture<'static, ToolResult> {
        let city = call.args["city"].as_str().map(str::to_owned);
        async move {
            let city = city.ok_or("missing `city`")?;
            Ok(format!("sunny and 21 °C in {city}"))
        }
        .boxed()
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let message = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "What is the weather in Lisbon?".into());
    let model = std::env::var("OPENAI_MODEL").unwrap_or_else(|_| "gpt-4o-mini".into());
    let mut config = ProviderConfig::new(Api::OpenAi, model)
        .system("You are brief. Use the tools you are given.")
        .tool(openprogram::agent::ToolSpec::of(&Weather));
    if let Ok(url) = std::env::var("OPENAI_BASE_URL") {
        config = config.base_url(url);
    }
    if std::env::var_os("OPENAI_API_KEY").is_some() {
        config = config.api_key(ApiKey::from_env("OPENAI_API_KEY")?);
    }
    let temporary = tempfile::tempdir()?;
    let data = std::env::var_os("OPENPROGRAM_DATA")
        .map_or_else(|| temporary.path().to_owned(), Into::into);
    let runtime = Runtime::builder()
        .data_dir(data)
        .provider(Arc::new(HttpProvider::new(config)?))
        .tool(Arc::new(Weather))
        .open()?;
    let session = SessionId::new();
    let started = runtime
        .start_execution(
            session,
            StartRequest {
                message,
                ..Default::default()
            },
        )
        .await?;
    let snapshot = loop {
        let snapshot = runtime.snapshot(session, started.execution_id).await?;
        if !matches!(snapshot.state, "queued" | "running") {
            break snapshot;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!("{}: {}", snapshot.state, snapshot.text);
    for receipt in &snapshot.receipts {
        println!(
            "  {} {} {}",
            receipt.effect_id, receipt.tool, receipt.status
        );
    }
    println!(
        "tokens: {} in, {} out",
        snapshot.usage.input_tokens, snapshot.usage.output_tokens
    );
    runtime.shutdown().await;
    Ok(())
}
