//! The `http` tool (feature `providers`): a model's or a script's HTTP request to a
//! host the embedder allowed, as an `External` effect.
//!
//! `http {method, url, headers?, body?, timeout_ms?}` → `{status, headers, body,
//! truncated, body_error?}` as JSON text, for any status (a 404 or a 500 is the server's
//! answer, shown to the model, not a tool failure).
//!
//! Honest effects: every request carries the call's effect id as its
//! `Idempotency-Key`, so a server that honours the header makes a request sent again after
//! reconciliation safe. What the tool cannot know, it never guesses:
//! - refused before anything was sent (bad arguments, a host not allowed, no connection) →
//!   a `failed` receipt;
//! - the request went out and no answer came (a timeout, a connection dropped) →
//!   `ToolError::Unknown`: an `unknown` receipt, which waits for an operator's `reconcile`
//!   (K-1) and is never sent again blindly — after a crash mid-call too (the call was
//!   dispatched, so the restart finds it `unknown`);
//! - an answer's status arrived but its body was lost → the status stands (`body_error`).
//!
//! Nothing is reachable by default: the embedder lists the hosts (`HttpTool::new`; `serve
//! --http-allow`), and a call may not set `Host`, `Proxy-*` or framing headers. Redirects are
//! not followed (a redirect could lead anywhere); a 3xx is answered as it is. A response body
//! past `response_bytes_max` is cut (`truncated`). A request whose `timeout_ms` passes before
//! its connection was made is `unknown` too: the client cannot tell that moment from a
//! request sent and unanswered, and an unknown is never guessed.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt as _;
use serde_json::{json, Value};

use crate::agent::{Recovery, Tool, ToolCall, ToolError, ToolResult};

/// The header that carries the effect id.
pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";

/// The `http` tool. Clone it freely: clones share one connection pool.
#[derive(Debug, Clone)]
pub struct HttpTool {
    client: reqwest::Client,
    allow: Vec<HostRule>,
    response_bytes_max: usize,
    timeout: Duration,
}

/// A host the tool may reach: `host` (any port), `host:port`, or `*.domain` (any subdomain).
#[derive(Debug, Clone, PartialEq, Eq)]
struct HostRule {
    host: String,
    port: Option<u16>,
}

impl HostRule {
    fn parse(rule: &str) -> Result<Self, String> {
        let rule = rule.trim().to_ascii_lowercase();
        let bad = || format!("`{rule}` is not a host, host:port or *.domain");
        // An IPv6 literal keeps its brackets, as a URL's host does.
        let (host, port) = match rule.rsplit_once(':') {
            Some((host, port))
                if !host.is_empty() && (!host.contains(':') || host.ends_with(']')) =>
            {
                (
                    host.to_owned(),
                    Some(port.parse::<u16>().map_err(|_| bad())?),
                )
            }
            _ => (rule.clone(), None),
        };
        let valid = |c: char| c.is_ascii_alphanumeric() || "-.[]:*".contains(c);
        let bare_ipv6 = host.contains(':') && !host.starts_with('[');
        if host.is_empty() || !host.chars().all(valid) || host[1..].contains('*') || bare_ipv6 {
            return Err(bad());
        }
        Ok(Self { host, port })
    }

    fn allows(&self, host: &str, port: u16) -> bool {
        let host_matches = match self.host.strip_prefix("*.") {
            Some(domain) => host
                .strip_suffix(domain)
                .is_some_and(|sub| sub.ends_with('.') && sub.len() > 1),
            None => host == self.host,
        };
        host_matches && self.port.is_none_or(|allowed| allowed == port)
    }
}

/// Headers a call may not set (names are lower-case in `HeaderName`).
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
];

/// The longest a request may take, whatever its `timeout_ms` asks for.
const TIMEOUT_MAX: Duration = Duration::from_secs(300);

impl HttpTool {
    /// A tool that may reach exactly `allow` (each `host`, `host:port` or `*.domain`);
    /// refused if a rule does not parse or the HTTP client cannot be built.
    pub fn new<S: AsRef<str>>(allow: impl IntoIterator<Item = S>) -> Result<Self, String> {
        let allow = allow
            .into_iter()
            .map(|rule| HostRule::parse(rule.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|error| format!("building the HTTP client: {error}"))?;
        Ok(Self {
            client,
            allow,
            response_bytes_max: 256 * 1024,
            timeout: Duration::from_secs(30),
        })
    }

    /// Response bodies past this many bytes are cut (default 256 KiB).
    pub fn response_bytes_max(mut self, bytes: usize) -> Self {
        self.response_bytes_max = bytes;
        self
    }

    /// A request's timeout when its arguments name none (default 30 s, at most 300 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.min(TIMEOUT_MAX);
        self
    }

    /// The request `args` ask for, or why it is refused (nothing sent).
    fn request(&self, call: &ToolCall) -> Result<reqwest::RequestBuilder, String> {
        let args = &call.args;
        let method = args["method"]
            .as_str()
            .unwrap_or("GET")
            .to_ascii_uppercase();
        let method = reqwest::Method::from_bytes(method.as_bytes())
            .map_err(|_| format!("`{method}` is not an HTTP method"))?;
        let url = args["url"]
            .as_str()
            .ok_or("missing string argument `url`")?;
        let url = reqwest::Url::parse(url).map_err(|error| format!("`{url}`: {error}"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!("`{}`: only http and https URLs", url.scheme()));
        }
        let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
        let port = url.port_or_known_default().unwrap_or(0);
        if !self.allow.iter().any(|rule| rule.allows(&host, port)) {
            return Err(format!(
                "host_not_allowed: {host}:{port} is not on the http tool's allow-list"
            ));
        }
        let timeout = match args.get("timeout_ms") {
            None => self.timeout,
            Some(ms) => ms
                .as_u64()
                .filter(|&ms| ms > 0)
                .map(|ms| Duration::from_millis(ms).min(TIMEOUT_MAX))
                .ok_or("`timeout_ms` must be a positive integer")?,
        };
        let mut request = self.client.request(method, url).timeout(timeout);
        let mut content_type = false;
        match args.get("headers") {
            None | Some(Value::Null) => {}
            Some(Value::Object(headers)) => {
                for (name, value) in headers {
                    let value = value
                        .as_str()
                        .ok_or_else(|| format!("header `{name}` must be a string"))?;
                    let header = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                        .map_err(|_| format!("`{name}` is not a header name"))?;
                    let value = reqwest::header::HeaderValue::from_str(value)
                        .map_err(|_| format!("header `{name}` has a value HTTP cannot carry"))?;
                    if header.as_str().eq_ignore_ascii_case(IDEMPOTENCY_KEY) {
                        continue; // The effect's own key is the only one sent.
                    }
                    // The allow-list judges the URL: a `Host` of the model's own would reach
                    // another site behind an allowed one, and framing headers would break
                    // the request apart.
                    if RESERVED_HEADERS.contains(&header.as_str())
                        || header.as_str().starts_with("proxy-")
                    {
                        return Err(format!("header `{name}` is set by the tool, not the call"));
                    }
                    content_type |= header == reqwest::header::CONTENT_TYPE;
                    request = request.header(header, value);
                }
            }
            Some(_) => return Err("`headers` must be an object of strings".into()),
        }
        request = request.header(IDEMPOTENCY_KEY, call.effect_id.to_string());
        match args.get("body") {
            None | Some(Value::Null) => {}
            Some(Value::String(text)) => request = request.body(text.clone()),
            Some(body) => {
                if !content_type {
                    request = request.header(reqwest::header::CONTENT_TYPE, "application/json");
                }
                request = request.body(body.to_string());
            }
        }
        Ok(request)
    }
}

impl Tool for HttpTool {
    fn name(&self) -> &str {
        "http"
    }

    fn recovery(&self) -> Recovery {
        Recovery::External
    }

    fn description(&self) -> String {
        "Sends an HTTP request to an allowed host and returns the response's status, headers and body.".into()
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "method": {"type": "string", "description": "GET (default), POST, PUT, PATCH, DELETE, …"},
                "url": {"type": "string", "description": "an http or https URL"},
                "headers": {"type": "object", "additionalProperties": {"type": "string"}},
                "body": {"description": "a string sent as it is, or JSON sent as application/json"},
                "timeout_ms": {"type": "integer", "minimum": 1},
            },
            "required": ["url"],
        })
    }

    fn call(&self, call: ToolCall) -> BoxFuture<'static, ToolResult> {
        let request = self.request(&call);
        let limit = self.response_bytes_max;
        async move {
            let request = request?;
            let response = match request.send().await {
                Ok(response) => response,
                // No connection was made: nothing was sent.
                Err(error) if error.is_connect() || error.is_builder() => {
                    return Err(ToolError::Failed(format!(
                        "the request was not sent: {}",
                        chain(&error)
                    )))
                }
                Err(error) => {
                    return Err(ToolError::Unknown(format!(
                        "the request may have been sent; no answer came: {}",
                        chain(&error)
                    )))
                }
            };
            Ok(answer(response, limit).await.to_string())
        }
        .boxed()
    }
}

/// The answer as the tool's output: its status stands even if its body is lost.
async fn answer(mut response: reqwest::Response, limit: usize) -> Value {
    let status = response.status().as_u16();
    let mut headers = BTreeMap::<String, String>::new();
    for (name, value) in response.headers() {
        let value = String::from_utf8_lossy(value.as_bytes());
        headers
            .entry(name.as_str().to_owned())
            .and_modify(|joined| {
                joined.push_str(", ");
                joined.push_str(&value);
            })
            .or_insert_with(|| value.into_owned());
    }
    let mut body = Vec::new();
    let mut truncated = false;
    let mut body_error = None;
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = limit.saturating_sub(body.len());
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
                if chunk.len() > room {
                    truncated = true;
                    break;
                }
            }
            Ok(None) => break,
            Err(error) => {
                body_error = Some(chain(&error));
                break;
            }
        }
    }
    let mut answer = json!({
        "status": status,
        "headers": headers,
        "body": String::from_utf8_lossy(&body),
        "truncated": truncated,
    });
    if let Some(error) = body_error {
        answer["body_error"] = json!(error);
    }
    answer
}

/// An error with its causes, which say what actually failed (reqwest's own text is terse).
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn x_host_rules_allow_exactly_what_they_name() {
        let rule = |text: &str| HostRule::parse(text).expect(text);
        assert!(rule("api.example.com").allows("api.example.com", 443));
        assert!(rule("API.example.com").allows("api.example.com", 80));
        assert!(!rule("api.example.com").allows("example.com", 443));
        assert!(!rule("api.example.com").allows("api.example.com.evil.net", 443));
        assert!(rule("127.0.0.1:8080").allows("127.0.0.1", 8080));
        assert!(!rule("127.0.0.1:8080").allows("127.0.0.1", 8081));
        assert!(rule("*.example.com").allows("a.b.example.com", 443));
        assert!(!rule("*.example.com").allows("example.com", 443));
        assert!(!rule("*.example.com").allows("evilexample.com", 443));
        assert!(rule("[::1]:9000").allows("[::1]", 9000));
        assert!(rule("[::1]").allows("[::1]", 1));
        for bad in ["", "a b", "host:port", "a.*.com", "host:99999", "::1"] {
            assert!(HostRule::parse(bad).is_err(), "{bad:?} parsed");
        }
    }
}
