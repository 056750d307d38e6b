//! Real model providers (feature `providers`): an OpenAI-compatible chat-completions
//! provider (any base URL: OpenAI, vLLM, llama.cpp's server, Ollama, most gateways) and an
//! Anthropic Messages provider, behind the `Provider` trait.
//!
//! Every request is the execution's model effect: the actor records its outcome as the
//! decision's receipt, and a request cut off by a crash or a pause leaves nothing behind, so
//! it is regenerated from committed context. A provider therefore never shows a half
//! response as complete: a stream that ends before its final marker is an error, retried like
//! a dropped connection.
//!
//! Errors (E-6): timeouts, dropped connections, 408, 409, 429 and 5xx are retried with capped
//! exponential backoff and full jitter, honouring `Retry-After` (`retry-after-ms` too), within
//! the request's retry budget (`RetryPolicy`); anything else — a 4xx, a refusal, a response cut short (`length`, `content_filter`), a body that
//! does not parse, a call to a tool that was not offered — is a known model error: `Err` with
//! the provider's own message, which the machine records as the response and fails the
//! execution with. Never a fabricated reply.
//!
//! One tool call per decision: Anthropic requests carry `disable_parallel_tool_use` (OpenAI's
//! `parallel_tool_calls` is not sent: o-series models refuse it), and where a model returns
//! several, the first is the decision and the others are dropped (the committed context shows
//! the one call made, so the model asks again for what it still needs).
//!
//! The API key is read by the embedder (`ApiKey::from_env`) and held by the provider only: it
//! is sent in a request header, never stored, logged or shown (`ApiKey`'s `Debug` hides it;
//! an error text that echoes it is redacted before the execution records it).

mod anthropic;
mod config;
mod openai;
mod response;
mod sse;
mod transport;

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt as _;

use crate::agent::{Decision, ModelRequest, ModelUsage, Provider, ToolArgs};
use crate::deltas::DeltaSink;
pub use config::{Api, ApiKey, ProviderConfig};
use response::{clip, Response};
pub use transport::RetryPolicy;

/// A provider that calls a model over HTTP (`Api`).
#[derive(Debug, Clone)]
pub struct HttpProvider {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: ProviderConfig,
    client: reqwest::Client,
    endpoint: String,
}

impl HttpProvider {
    /// A provider for `config`; an error if its HTTP client cannot be built (no TLS roots).
    pub fn new(config: ProviderConfig) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .read_timeout(config.read_timeout)
            .build()
            .map_err(|error| format!("building the HTTP client: {error}"))?;
        let endpoint = match config.api {
            Api::OpenAi => format!("{}/chat/completions", config.base_url),
            Api::Anthropic => format!("{}/v1/messages", config.base_url),
        };
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                client,
                endpoint,
            }),
        })
    }

    pub fn config(&self) -> &ProviderConfig {
        &self.inner.config
    }
}

impl Provider for HttpProvider {
    fn decide(&self, request: ModelRequest) -> BoxFuture<'static, Result<Decision, String>> {
        let inner = self.inner.clone();
        async move { inner.decide(&request).await }.boxed()
    }

    /// K-2: the API, the model, the system text and the tools offered (as the model sees
    /// them). Not the endpoint, key, limits or timeouts: they change how it is reached, not
    /// what it decides.
    fn contract(&self) -> String {
        let config = &self.inner.config;
        let mut contract = format!("{}:{}", config.api.name(), config.model);
        contract.push_str(&format!(
            "\nsystem:{}",
            config.system.as_deref().unwrap_or("")
        ));
        for tool in &config.tools {
            let (name, description) = (&tool.name, &tool.description);
            contract.push_str(&format!(
                "\noffered:{name}:{description}:{}",
                tool.parameters
            ));
        }
        contract
    }
}

impl Inner {
    async fn decide(&self, request: &ModelRequest) -> Result<Decision, String> {
        let conversation = request.messages();
        let body = match self.config.api {
            Api::OpenAi => openai::request_body(&self.config, &conversation),
            Api::Anthropic => anthropic::request_body(&self.config, &conversation),
        };
        let headers = self.headers();
        let policy = &self.config.retry;
        let retries_left = policy
            .execution_retries
            .saturating_sub(request.used.retries);
        let mut retries = 0;
        let sent = transport::send(
            &self.client,
            &self.endpoint,
            &headers,
            &body,
            policy,
            retries_left,
            &mut retries,
            |response| self.read(response, &request.deltas),
        )
        .await;
        if retries > 0 {
            request.usage.record(ModelUsage {
                retries,
                ..ModelUsage::default()
            });
        }
        let response = sent.map_err(|error| self.error(&error))?;
        tracing::debug!(
            execution_id = %request.execution_id,
            input_tokens = response.usage.input,
            output_tokens = response.usage.output,
            "model response"
        );
        // Paid for whatever it decides, a refusal or a cut-off response included (E-6).
        if response.usage != response::Usage::default() {
            request.usage.record(ModelUsage {
                input_tokens: response.usage.input,
                output_tokens: response.usage.output,
                retries: 0,
            });
        }
        self.decision(response).map_err(|error| self.error(&error))
    }

    /// The error an execution records: named by its API, and never holding the key (a
    /// gateway may echo a request's headers in its error body).
    fn error(&self, error: &str) -> String {
        let error = format!("{} provider: {error}", self.config.api.name());
        match &self.config.api_key {
            Some(key) if !key.expose().is_empty() => error.replace(key.expose(), "[redacted]"),
            _ => error,
        }
    }

    fn headers(&self) -> Vec<(&'static str, String)> {
        let mut headers = vec![("content-type", "application/json".to_owned())];
        match (self.config.api, &self.config.api_key) {
            (Api::OpenAi, Some(key)) => {
                headers.push(("authorization", format!("Bearer {}", key.expose())));
            }
            (Api::Anthropic, key) => {
                headers.push(("anthropic-version", "2023-06-01".to_owned()));
                if let Some(key) = key {
                    headers.push(("x-api-key", key.expose().to_owned()));
                }
            }
            (Api::OpenAi, None) => {}
        }
        if self.config.stream {
            headers.push(("accept", "text/event-stream".to_owned()));
        }
        headers
    }

    /// Reads one response body: whole, or as a stream to its end, publishing its pieces to
    /// `deltas` as they arrive (each try starts them again).
    async fn read(
        &self,
        response: reqwest::Response,
        deltas: &DeltaSink,
    ) -> Result<Response, transport::Failure> {
        deltas.restart();
        // A server that ignores `stream` (or answers an error with 200) sends JSON.
        let json = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.starts_with("application/json"));
        match (self.config.api, self.config.stream && !json) {
            (Api::OpenAi, false) => openai::read_whole(response).await,
            (Api::OpenAi, true) => {
                transport::read_stream(response, openai::Stream::new(deltas.clone())).await
            }
            (Api::Anthropic, false) => anthropic::read_whole(response).await,
            (Api::Anthropic, true) => {
                transport::read_stream(response, anthropic::Stream::new(deltas.clone())).await
            }
        }
    }

    /// The decision a whole response makes: its first tool call (with the text said beside
    /// it), else its text; its reasoning blocks kept either way.
    fn decision(&self, response: Response) -> Result<Decision, String> {
        if let Some(refusal) = response.refusal {
            return Err(format!("the model refused: {refusal}"));
        }
        if !response::complete(response.stop_reason.as_deref()) {
            return Err(format!(
                "the response stopped before it was complete ({}, {} output tokens)",
                response.stop_reason.as_deref().unwrap_or_default(),
                response.usage.output
            ));
        }
        let dropped = response.tool_calls.len().saturating_sub(1);
        if let Some(call) = response.tool_calls.into_iter().next() {
            if dropped > 0 {
                tracing::debug!(
                    dropped,
                    "the model made several tool calls; the first is the decision"
                );
            }
            if !self.config.tools.iter().any(|spec| spec.name == call.name) {
                return Err(format!(
                    "the model called the tool `{}`, which it was not offered",
                    call.name
                ));
            }
            // No arguments (some servers send "" for a tool without parameters) are `{}`.
            let arguments = if call.arguments.trim().is_empty() {
                "{}".to_owned()
            } else {
                call.arguments.clone()
            };
            if !arguments.trim_start().starts_with('{') {
                return Err(format!(
                    "the model's arguments for the tool `{}` are not a JSON object: {}",
                    call.name,
                    clip(&arguments)
                ));
            }
            let args = ToolArgs::from_text(arguments).map_err(|error| {
                format!(
                    "the model's arguments for the tool `{}` are not JSON ({error}): {}",
                    call.name,
                    clip(&call.arguments)
                )
            })?;
            return Ok(Decision::tool(call.name, args)
                .with_text(response.text)
                .with_reasoning(response.reasoning));
        }
        if response.text.is_empty() {
            return Err("the model's response has neither text nor a tool call".into());
        }
        Ok(Decision::reply(response.text).with_reasoning(response.reasoning))
    }
}
