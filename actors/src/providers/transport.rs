//! One model request over HTTP with its retries (E-6): which failures are retried, how long
//! to wait, and when to give up.

use std::future::Future;
use std::time::Duration;

use reqwest::StatusCode;

use super::response::{clip, Response};
use super::sse;

/// How a model request is retried: at most `max_retries` times after the first try, each wait
/// drawn at random below an exponential bound (`initial_backoff` doubled per retry, at most
/// `max_backoff`: "full jitter"), or exactly what the server asked for in `Retry-After`; and
/// never waiting more than `max_wait` in all for one request. An execution's model calls
/// together retry at most `execution_retries` times (its retry budget, counted from its
/// recorded `ModelUsage`), so a flaky endpoint cannot keep one execution retrying call after
/// call. A request that exhausts either fails its execution with the last error.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    pub max_retries: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
    pub max_wait: Duration,
    pub execution_retries: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_retries: 4,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(20),
            max_wait: Duration::from_secs(60),
            execution_retries: 20,
        }
    }
}

impl RetryPolicy {
    /// No retries: the first failure is the answer.
    pub fn none() -> Self {
        Self {
            max_retries: 0,
            ..Self::default()
        }
    }

    /// The wait before retry number `retry` (0 for the first), without a `Retry-After`.
    fn backoff(&self, retry: u32) -> Duration {
        let bound = self
            .initial_backoff
            .saturating_mul(1u32.checked_shl(retry).unwrap_or(u32::MAX))
            .min(self.max_backoff);
        bound.mul_f64(unit_random())
    }
}

/// Why one try failed.
#[derive(Debug)]
pub(super) enum Failure {
    /// Worth another try: a timeout, a dropped connection, a cut-off stream, 408/409/429/5xx.
    Retry {
        reason: String,
        /// What the server asked for (`Retry-After`, `retry-after-ms`).
        after: Option<Duration>,
    },
    /// The answer: a 4xx, a body that does not parse, a model's error.
    Fatal(String),
}

impl Failure {
    pub(super) fn retry(reason: impl Into<String>) -> Self {
        Self::Retry {
            reason: reason.into(),
            after: None,
        }
    }
}

/// Posts `body` to `url` and reads the response with `read`, retrying as `policy` allows
/// and at most `retries_left` times (what is left of the execution's budget). Counts its
/// retries into `retries`, whatever the outcome.
#[allow(clippy::too_many_arguments)]
pub(super) async fn send<'a, F, Fut>(
    client: &reqwest::Client,
    url: &str,
    headers: &[(&'static str, String)],
    body: &serde_json::Value,
    policy: &RetryPolicy,
    retries_left: u32,
    retries: &mut u32,
    read: F,
) -> Result<Response, String>
where
    F: Fn(reqwest::Response) -> Fut,
    Fut: Future<Output = Result<Response, Failure>> + 'a,
{
    let body =
        serde_json::to_vec(body).map_err(|error| format!("encoding the request: {error}"))?;
    let mut waited = Duration::ZERO;
    let mut retry = 0u32;
    loop {
        *retries = retry;
        let tried = match try_once(client, url, headers, &body).await {
            Ok(response) => read(response).await,
            Err(failure) => Err(failure),
        };
        let (reason, after) = match tried {
            Ok(response) => return Ok(response),
            Err(Failure::Fatal(error)) => return Err(error),
            Err(Failure::Retry { reason, after }) => (reason, after),
        };
        if retry >= policy.max_retries {
            return Err(format!("{reason} (gave up after {} tries)", retry + 1));
        }
        if retry >= retries_left {
            return Err(format!(
                "{reason} (gave up after {} tries: the execution's retry budget of {} is spent)",
                retry + 1,
                policy.execution_retries
            ));
        }
        let wait = after.unwrap_or_else(|| policy.backoff(retry));
        if waited + wait > policy.max_wait {
            return Err(format!(
                "{reason} (gave up after {} tries: waiting {:.1} s more would pass the retry budget of {:.1} s)",
                retry + 1,
                wait.as_secs_f64(),
                policy.max_wait.as_secs_f64()
            ));
        }
        tracing::debug!(%reason, retry, wait_ms = wait.as_millis() as u64, "model request retried");
        tokio::time::sleep(wait).await;
        waited += wait;
        retry += 1;
    }
}

/// One try: a response with a success status, or why not.
async fn try_once(
    client: &reqwest::Client,
    url: &str,
    headers: &[(&'static str, String)],
    body: &[u8],
) -> Result<reqwest::Response, Failure> {
    let mut request = client.post(url).body(body.to_vec());
    for (name, value) in headers {
        let mut value = reqwest::header::HeaderValue::from_str(value)
            .map_err(|_| Failure::Fatal(format!("the {name} header is not valid")))?;
        // Kept out of the client's own debug output.
        value.set_sensitive(matches!(*name, "authorization" | "x-api-key"));
        request = request.header(*name, value);
    }
    let response = request.send().await.map_err(|error| {
        if error.is_builder() {
            Failure::Fatal(format!("the request could not be built: {error}"))
        } else {
            Failure::retry(describe(error))
        }
    })?;
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let after = retry_after(response.headers());
    // The body of an error response is read for its message, bounded.
    let text = read_bounded(response, 64 * 1024).await.unwrap_or_default();
    let message = error_message(&text);
    let error = format!("HTTP {}: {message}", status.as_u16());
    if retryable(status) {
        Err(Failure::Retry {
            reason: error,
            after,
        })
    } else {
        Err(Failure::Fatal(error))
    }
}

fn retryable(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 409 | 429) || status.is_server_error()
}

/// What a failed request's error says, without the URL's query (keys never go in URLs here,
/// but a gateway's might).
fn describe(error: reqwest::Error) -> String {
    let kind = if error.is_timeout() {
        "timed out"
    } else if error.is_connect() {
        "could not connect"
    } else if error.is_body() || error.is_decode() {
        "the response was cut off"
    } else {
        "the request failed"
    };
    let error = error.without_url();
    format!("{kind}: {error}")
}

/// The provider's own message in an error body (`{"error": {"message": …}}` in both APIs),
/// else the body itself, clipped.
fn error_message(body: &str) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_str(body).ok();
    let message = parsed.as_ref().and_then(|value| {
        value
            .pointer("/error/message")
            .or_else(|| value.get("error"))
            .or_else(|| value.get("message"))
            .and_then(|message| message.as_str())
    });
    match message {
        Some(message) => clip(message),
        None if body.trim().is_empty() => "(no body)".into(),
        None => clip(body.trim()),
    }
}

/// `retry-after-ms` (milliseconds), else `Retry-After` in seconds. An HTTP date is not read
/// (the backoff applies); a wait above an hour is taken as an hour, which the budget refuses.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let number = |name: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.trim().parse::<f64>().ok())
            .filter(|value| value.is_finite() && *value >= 0.0)
    };
    let seconds = number("retry-after-ms")
        .map(|ms| ms / 1000.0)
        .or_else(|| number("retry-after"))?;
    Some(Duration::from_secs_f64(seconds.min(3600.0)))
}

/// At most `limit` bytes of a response's body, as text.
pub(super) async fn read_bounded(
    mut response: reqwest::Response,
    limit: usize,
) -> Result<String, Failure> {
    let mut body = Vec::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|error| Failure::retry(describe(error)))?
    {
        let room = limit.saturating_sub(body.len());
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() >= limit {
            break;
        }
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The largest response body read, streamed or whole.
pub(super) const RESPONSE_BYTES_MAX: usize = 8 * 1024 * 1024;

/// A whole response body as JSON (and its text, for error messages); not JSON is `Fatal`.
pub(super) async fn read_json(
    response: reqwest::Response,
) -> Result<(serde_json::Value, String), Failure> {
    let body = read_bounded(response, RESPONSE_BYTES_MAX).await?;
    match serde_json::from_str(&body) {
        Ok(value) => Ok((value, body)),
        Err(error) => Err(Failure::Fatal(format!(
            "the response is not JSON ({error}): {}",
            clip(&body)
        ))),
    }
}

/// A streamed response, assembled event by event.
pub(super) trait Stream {
    /// Takes one event; true once the stream says it is done.
    fn take(&mut self, event: &sse::Event) -> Result<bool, Failure>;
    /// The response, if what arrived is whole (`ended`: `take` said the stream is done).
    fn finish(self, ended: bool) -> Option<Response>;
}

/// Reads a streamed body into `stream`, each event as it arrives, until `take` says the
/// stream is done or the body ends. The bytes read count against `RESPONSE_BYTES_MAX`; a
/// dropped connection, and a stream that ends before it is whole, is `Retry` (its pieces
/// are dropped).
pub(super) async fn read_stream(
    mut response: reqwest::Response,
    mut stream: impl Stream,
) -> Result<Response, Failure> {
    let mut parser = sse::Parser::default();
    let mut read = 0usize;
    let mut ended = false;
    'body: while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|error| Failure::retry(describe(error)))?
    {
        read += chunk.len();
        if read > RESPONSE_BYTES_MAX {
            return Err(Failure::Fatal(format!(
                "the response passed {RESPONSE_BYTES_MAX} bytes"
            )));
        }
        for event in parser.push(&chunk) {
            if stream.take(&event)? {
                ended = true;
                break 'body;
            }
        }
    }
    stream
        .finish(ended)
        .ok_or_else(|| Failure::retry("the response stream ended before it was complete"))
}

/// An event's data as JSON; not JSON is `Fatal`.
pub(super) fn event_json(event: &sse::Event) -> Result<serde_json::Value, Failure> {
    serde_json::from_str(&event.data).map_err(|error| {
        Failure::Fatal(format!(
            "a stream event is not JSON ({error}): {}",
            clip(&event.data)
        ))
    })
}

/// A number in [0, 1) from uuid's thread-local CSPRNG.
fn unit_random() -> f64 {
    // The low 53 bits: a v4 uuid's fixed version and variant bits are not among them.
    (uuid::Uuid::new_v4().as_u128() as u64 & ((1u64 << 53) - 1)) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e6_backoff_is_jittered_below_a_capped_exponential_bound() {
        let policy = RetryPolicy::default();
        for retry in 0..40 {
            let bound = Duration::from_millis(500)
                .saturating_mul(1u32.checked_shl(retry).unwrap_or(u32::MAX))
                .min(Duration::from_secs(20));
            for _ in 0..50 {
                assert!(policy.backoff(retry) <= bound, "retry {retry}");
            }
        }
        // Full jitter: waits spread over the whole range below the bound.
        let bound = Duration::from_millis(4000);
        let waits: Vec<Duration> = (0..200).map(|_| policy.backoff(3)).collect();
        assert!(waits.iter().any(|wait| *wait < bound / 4), "{waits:?}");
        assert!(waits.iter().any(|wait| *wait > bound * 3 / 4), "{waits:?}");
    }

    #[test]
    fn e6_retry_after_is_read_in_seconds_or_milliseconds() {
        let mut headers = reqwest::header::HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert("retry-after", "2".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(2)));
        headers.insert("retry-after-ms", "250".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(250)));
        headers.insert("retry-after-ms", "-1".parse().unwrap());
        headers.insert(
            "retry-after",
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&headers), None);
    }

    #[test]
    fn e6_an_error_body_gives_the_providers_message() {
        assert_eq!(
            error_message(r#"{"error": {"message": "model not found", "type": "x"}}"#),
            "model not found"
        );
        assert_eq!(error_message(""), "(no body)");
        assert_eq!(
            error_message("<html>bad gateway</html>"),
            "<html>bad gateway</html>"
        );
    }
}
