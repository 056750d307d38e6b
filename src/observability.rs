//! `serve --log-format text|json` and `--otlp-endpoint URL` (issue 36): the server's log lines go
//! to stderr (level from `RUST_LOG`, default none; its `openprogram: …` progress lines always), and
//! with an endpoint its spans — execution, attempt, step, model call, tool call, commit, each with
//! its ids (I-5) — go to an OpenTelemetry collector over OTLP/HTTP (protobuf), batched on the
//! exporter's own thread. Spans still buffered when `serve` stops in order are flushed then.

use std::io::IsTerminal as _;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::layer::Layered;
use tracing_subscriber::registry::Registry;
use tracing_subscriber::{EnvFilter, Layer as _};

use crate::{Error, Result};

#[derive(Debug, Clone, Default, clap::Args)]
pub struct ObservabilityArgs {
    /// Log lines on stderr as `text` (default) or `json` (one object per line). The level
    /// comes from RUST_LOG (default: only serve's progress lines; RUST_LOG=warn adds warnings).
    #[arg(long, value_parser = ["text", "json"], default_value = "text")]
    pub log_format: String,
    /// Export spans to this OpenTelemetry collector over OTLP/HTTP (protobuf), such as
    /// http://127.0.0.1:4318 (spans go to /v1/traces under it).
    #[arg(long)]
    pub otlp_endpoint: Option<String>,
    /// The share of executions whose spans are exported, 0 to 1 (default 1: all). Decided
    /// once per execution's trace: a sampled execution's spans are all there.
    #[arg(long, requires = "otlp_endpoint", default_value_t = 1.0, value_parser = ratio)]
    pub otlp_sample: f64,
}

fn ratio(text: &str) -> std::result::Result<f64, String> {
    match text.parse::<f64>() {
        Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(ratio),
        _ => Err(format!("`{text}` is not a share between 0 and 1")),
    }
}

/// The target of `serve`'s progress lines: always logged, whatever RUST_LOG says of the rest.
const PROGRESS: &str = "openprogram_progress";

/// The log filter when RUST_LOG sets none: nothing but the progress lines, so that stderr reads
/// as it always has (tools read its first line); `RUST_LOG=warn` shows the runtime's warnings.
const DEFAULT_FILTER: &str = "off";

/// Whether log lines are JSON (`--log-format json`).
static JSON: AtomicBool = AtomicBool::new(false);

/// One of `serve`'s progress lines (`openprogram: …` on stderr): as it is, or, under
/// `--log-format json`, a log event like every other line.
pub fn say(line: impl AsRef<str>) {
    let line = line.as_ref();
    match JSON.load(Ordering::Relaxed) {
        true => {
            tracing::info!(target: PROGRESS, "{}", line.trim_start_matches("openprogram: "))
        }
        false => eprintln!("{line}"),
    }
}

/// What must outlive the server: the span exporter, flushed when dropped.
#[must_use = "dropping it flushes and stops the span exporter"]
#[derive(Debug)]
pub struct Observability {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Observability {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            if let Err(error) = provider.shutdown() {
                eprintln!("openprogram: flushing spans to the collector failed: {error}");
            }
        }
    }
}

impl ObservabilityArgs {
    /// Installs the process's subscriber. A usage error (an endpoint that is no URL) is
    /// `InvalidRequest` (exit 2).
    pub fn init(&self) -> Result<Observability> {
        let filter = || {
            let filter = EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
            match format!("{PROGRESS}=info").parse() {
                Ok(progress) => filter.add_directive(progress),
                Err(_) => filter,
            }
        };
        JSON.store(self.log_format == "json", Ordering::Relaxed);
        let logs = match self.log_format.as_str() {
            "json" => tracing_subscriber::fmt::layer()
                .json()
                .with_writer(std::io::stderr)
                .with_filter(filter())
                .boxed(),
            _ => tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal())
                .with_filter(filter())
                .boxed(),
        };
        let (spans, provider) = match &self.otlp_endpoint {
            None => (None, None),
            Some(endpoint) => {
                let provider = provider(endpoint)?;
                // The runtime samples whole executions itself: one left out makes no span.
                openprogram_actors::telemetry::set_span_sample(self.otlp_sample);
                use opentelemetry::trace::TracerProvider as _;
                let tracer = provider.tracer("openprogram");
                // Spans of the runtime at info and above, whatever RUST_LOG says of logs.
                let layer = tracing_opentelemetry::layer()
                    .with_tracer(tracer)
                    .with_filter(EnvFilter::new("info"));
                (Some(layer), Some(provider))
            }
        };
        tracing::dispatcher::set_global_default(dispatch(logs, spans.map(tracing_subscriber::Layer::boxed)))
            .map_err(|error| Error::Unavailable(format!("installing the logger: {error}")))?;
        Ok(Observability { provider })
    }
}

/// The logs' layer, over the registry.
type Logs = Box<dyn tracing_subscriber::Layer<Registry> + Send + Sync>;
/// The spans' layer, over the logs'.
type Spans = Box<dyn tracing_subscriber::Layer<Layered<Logs, Registry>> + Send + Sync>;

/// The process's subscriber: the logs, and the spans when they are exported. Not `.with` an
/// `Option` of the spans: a `None` layer says it wants every span, so each of the runtime's
/// spans would be made and dropped for no layer (a seventh of an actor thread's time under
/// load).
fn dispatch(logs: Logs, spans: Option<Spans>) -> tracing::Dispatch {
    let logged = tracing_subscriber::registry().with(logs);
    match spans {
        Some(spans) => tracing::Dispatch::new(logged.with(spans)),
        None => tracing::Dispatch::new(logged),
    }
}

/// The OTLP/HTTP exporter for `endpoint` (a base URL, or the full `…/v1/traces`).
fn provider(endpoint: &str) -> Result<opentelemetry_sdk::trace::SdkTracerProvider> {
    use opentelemetry_otlp::WithExportConfig as _;
    let url = reqwest_url(endpoint)?;
    let traces = match url.trim_end_matches('/') {
        full if full.ends_with("/v1/traces") => full.to_owned(),
        base => format!("{base}/v1/traces"),
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(traces)
        .build()
        .map_err(|error| Error::Unavailable(format!("the OTLP exporter: {error}")))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name("openprogram")
        .build();
    Ok(opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_resource(resource)
        .with_batch_exporter(exporter)
        .build())
}

/// `endpoint` if it is an http(s) URL.
fn reqwest_url(endpoint: &str) -> Result<String> {
    let usage = || {
        Error::InvalidRequest(format!(
            "--otlp-endpoint: `{endpoint}` is not an http or https URL"
        ))
    };
    let (scheme, rest) = endpoint.split_once("://").ok_or_else(usage)?;
    if !matches!(scheme, "http" | "https") || rest.is_empty() {
        return Err(usage());
    }
    Ok(endpoint.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn i5_no_span_is_made_when_no_layer_takes_spans() {
        let logs = || {
            let layer = tracing_subscriber::fmt::layer().with_writer(std::io::sink);
            let filter = EnvFilter::new(format!("{DEFAULT_FILTER},{PROGRESS}=info"));
            layer.with_filter(filter).boxed()
        };
        let step = || tracing::info_span!(target: "openprogram_actors::execution", "step");
        let quiet = dispatch(logs(), None);
        tracing::dispatcher::with_default(&quiet, || assert!(step().is_disabled()));
        let spans = tracing_subscriber::fmt::layer().with_writer(std::io::sink);
        let exported = dispatch(logs(), Some(spans.with_filter(EnvFilter::new("info")).boxed()));
        tracing::dispatcher::with_default(&exported, || assert!(!step().is_disabled()));
    }
}
