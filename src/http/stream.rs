//! `GET …/events/stream?after=SEQ`: an execution's events as Server-Sent Events, resumable
//! (I-2, B-6). Each event carries `id: SEQ`; a reconnecting client sends `Last-Event-ID`
//! (which wins over `after`). A cursor past the newest event (a store that was reset, a
//! cursor kept too long) is no error: one `resync` event names the newest seq, the stream
//! continues from there and the client reloads the snapshot. A comment keeps idle
//! connections alive. The events an execution's actor commits on this node reach its stream
//! as they commit (`Runtime::follow`), without a read of the store; the stream reads the
//! store when they do not follow its cursor (another writer, another node, a watcher that
//! fell behind), in bounded pages while catching up, and once per `poll` when nothing came.
//!
//! E-3: between them, the pieces of a model response streaming in on this node go out as
//! `event: delta` frames without an `id` (not stored, they move no cursor): `{"effect_id",
//! "kind": "text"|"reasoning", "offset", "text"}`; offset 0 after others means the request
//! was made again. The decision's event holds the whole response; a reconnect gets that.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::header;
use actix_web::web::Bytes;
use actix_web::{web, HttpRequest, HttpResponse};
use openprogram_actors::deltas::DeltaWatch;
use openprogram_actors::watchers::{CommitWatch, Watch};
use openprogram_storage::EventEnvelope;
use openprogram_storage::{ExecutionId, SessionId};
use serde_json::json;
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::api::{event_json, EventsQuery};
use super::error::ApiError;
use super::Api;

/// How many idle polls a stream waits while its execution's actor pushes what it commits.
const PUSHED_POLL_FACTOR: u32 = 5;

/// Events read per store read while catching up.
const STREAM_PAGE_LEN_MAX: usize = 256;

/// A stream's first frame: how long a client waits before it reconnects (ms).
const RETRY: &[u8] = b"retry: 1000\n\n";

pub async fn events_stream(
    api: web::Data<Api>,
    request: HttpRequest,
    path: web::Path<(String, String)>,
    query: web::Query<EventsQuery>,
) -> Result<HttpResponse, ApiError> {
    let (session, execution) = api.execution(&request, &path)?;
    let after = last_event_id(&request).unwrap_or(query.after);
    // Unknown or another session's execution: 404 now, not an empty stream.
    let following = api.runtime.follow(session, execution)?;
    let last_seq = following.last_seq;
    let source = Source::Execution { session, execution };
    let watches = Some((following.deltas, following.commits));
    let mut stream = Stream::new(api.into_inner(), source, after, watches);
    if after > last_seq {
        stream.queued.push_back(frame(
            Some(last_seq),
            Some("resync"),
            &json!({"after": after, "last_seq": last_seq, "reason": "cursor past the newest event"}),
        ));
        stream.cursor = last_seq;
    }
    Ok(stream.respond())
}

/// Issue 36: `GET /debug/log/stream[?after=POSITION]` (admin): the global log as SSE, `id:`
/// the position (`Last-Event-ID` wins over `after`; neither: from its end); what the page's
/// overview follows to stay live.
pub async fn log_stream(
    api: web::Data<Api>,
    request: HttpRequest,
    query: web::Query<LogStreamQuery>,
) -> Result<HttpResponse, ApiError> {
    api.tokens.authorize_admin(&request)?;
    let cursor = match last_event_id(&request).or(query.after) {
        Some(after) => after,
        // No cursor: from now on.
        None => api.runtime.store().log_end().map_err(crate::Error::from)?,
    };
    Ok(Stream::new(api.into_inner(), Source::Log, cursor, None).respond())
}

/// The query of `GET /debug/log/stream`: without `after` (or `Last-Event-ID`), from the log's end.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogStreamQuery {
    after: Option<u64>,
}

/// What a stream follows.
enum Source {
    /// One execution's events; the cursor is a seq.
    Execution {
        session: SessionId,
        execution: ExecutionId,
    },
    /// The global log (admin); the cursor is a position.
    Log,
}

struct Stream {
    api: Arc<Api>,
    source: Source,
    /// The seq of the last event sent.
    cursor: u64,
    queued: VecDeque<Bytes>,
    keepalive_at: Instant,
    /// When the store is read next.
    poll_at: Instant,
    /// E-3: streamed model output on this node (`None` once its channel closed).
    deltas: Option<DeltaWatch>,
    /// The events the execution's actor commits on this node (`None` once closed).
    commits: Option<CommitWatch>,
}

impl Stream {
    fn new(
        api: Arc<Api>,
        source: Source,
        cursor: u64,
        watches: Option<(DeltaWatch, CommitWatch)>,
    ) -> Self {
        let (deltas, commits) = watches.unzip();
        Self {
            api,
            source,
            cursor,
            queued: VecDeque::from([Bytes::from_static(RETRY)]),
            keepalive_at: Instant::now(),
            poll_at: Instant::now(),
            deltas,
            commits,
        }
    }

    /// The response sending this stream's chunks until it ends.
    fn respond(self) -> HttpResponse {
        event_stream(futures::stream::unfold(self, |mut stream| async move {
            let bytes = stream.next().await?;
            Some((Ok::<_, actix_web::Error>(bytes), stream))
        }))
    }

    /// The next chunk to send; `None` ends the stream (the execution is gone).
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if let Some(bytes) = self.queued.pop_front() {
                self.keepalive_at = Instant::now() + self.api.keepalive;
                return Some(bytes);
            }
            if Instant::now() >= self.poll_at {
                self.poll_at = Instant::now() + self.api.poll;
                let read = match &self.source {
                    Source::Execution { session, execution } => self.api.runtime.events_page(
                        *session,
                        *execution,
                        self.cursor,
                        STREAM_PAGE_LEN_MAX,
                    ),
                    Source::Log => self
                        .api
                        .runtime
                        .store()
                        .log_after(self.cursor, STREAM_PAGE_LEN_MAX)
                        .map_err(crate::Error::from),
                };
                self.queue_deltas();
                match read {
                    Ok(events) if !events.is_empty() => {
                        let full = events.len() >= STREAM_PAGE_LEN_MAX;
                        self.queue_events(&events);
                        // Catching up: the next page at once.
                        if full {
                            self.poll_at = Instant::now();
                        }
                        continue;
                    }
                    Ok(_) => {}
                    Err(crate::Error::NotFound | crate::Error::Purged(_)) => return None,
                    // A failed read is retried at the next poll; the client keeps its data (B-6).
                    Err(error) => tracing::warn!(%error, "event stream read failed"),
                }
            }
            if Instant::now() >= self.keepalive_at {
                self.queued
                    .push_back(Bytes::from_static(b": keep-alive\n\n"));
                continue;
            }
            let until = self.poll_at.min(self.keepalive_at);
            tokio::select! {
                () = tokio::time::sleep_until(until) => {}
                received = recv(&mut self.deltas) => match received {
                    Ok(delta) => self.queued.push_back(frame(None, Some("delta"), &json!(*delta))),
                    // Missed pieces: the decision's event holds the whole response.
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::debug!(missed, "a slow event stream missed model deltas");
                    }
                    Err(broadcast::error::RecvError::Closed) => self.deltas = None,
                },
                received = recv(&mut self.commits) => match received {
                    Ok(events) => self.committed(&events),
                    // Missed events: the store has them.
                    Err(broadcast::error::RecvError::Lagged(_)) => self.poll_at = Instant::now(),
                    Err(broadcast::error::RecvError::Closed) => self.commits = None,
                },
            }
        }
    }

    /// Events the execution's actor committed: sent if they follow the cursor; else the store
    /// is read now for what is between. While they come, the store is read only after
    /// `PUSHED_POLL_FACTOR` polls without them: another writer's event waits at most that
    /// long, or until the actor's next commit shows the gap.
    fn committed(&mut self, events: &[EventEnvelope]) {
        let first = events.first().map_or(u64::MAX, |envelope| envelope.seq);
        if first > self.cursor + 1 {
            self.poll_at = Instant::now();
            return;
        }
        self.queue_deltas();
        let new: Vec<&EventEnvelope> = events
            .iter()
            .filter(|envelope| envelope.seq > self.cursor)
            .collect();
        for envelope in new {
            self.cursor = envelope.seq;
            self.queued
                .push_back(frame(Some(self.cursor), None, &event_json(envelope)));
        }
        self.poll_at = Instant::now() + self.api.poll * PUSHED_POLL_FACTOR;
    }

    /// A piece is published before its decision commits: every piece of a decision just read
    /// is in the channel now, and goes out before it.
    fn queue_deltas(&mut self) {
        while let Some(Ok(delta)) = self.deltas.as_mut().map(DeltaWatch::try_recv) {
            self.queued
                .push_back(frame(None, Some("delta"), &json!(*delta)));
        }
    }

    /// Events read from the store, after the cursor, in order.
    fn queue_events(&mut self, events: &[EventEnvelope]) {
        for envelope in events {
            self.cursor = match self.source {
                Source::Execution { .. } => envelope.seq,
                Source::Log => envelope.position,
            };
            self.queued
                .push_back(frame(Some(self.cursor), None, &event_json(envelope)));
        }
    }
}

/// The next message of `watch`; never, without one.
async fn recv<T: ?Sized + Send + Sync>(
    watch: &mut Option<Watch<T>>,
) -> Result<Arc<T>, broadcast::error::RecvError> {
    match watch {
        Some(watch) => watch.recv().await,
        None => std::future::pending().await,
    }
}

/// The cursor a reconnecting client sends (it wins over `after`).
fn last_event_id(request: &HttpRequest) -> Option<u64> {
    request
        .headers()
        .get("Last-Event-ID")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok())
}

/// A response streaming `body` as Server-Sent Events, never buffered by a proxy.
fn event_stream(
    body: impl futures::Stream<Item = Result<Bytes, actix_web::Error>> + 'static,
) -> HttpResponse {
    HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "text/event-stream"))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"))
        .streaming(body)
}

/// One SSE frame. `data` is one line of JSON (JSON never contains a raw newline).
fn frame(id: Option<u64>, event: Option<&str>, data: &serde_json::Value) -> Bytes {
    let mut text = String::new();
    if let Some(id) = id {
        text.push_str(&format!("id: {id}\n"));
    }
    if let Some(event) = event {
        text.push_str(&format!("event: {event}\n"));
    }
    text.push_str(&format!("data: {data}\n\n"));
    Bytes::from(text)
}

/// How often an idle stream reads the store, unless configured.
pub const POLL_DEFAULT: Duration = Duration::from_millis(200);

/// How long a stream stays silent before a keep-alive comment, unless configured.
pub const KEEPALIVE_DEFAULT: Duration = Duration::from_secs(15);

#[derive(Debug, serde::Deserialize)]
pub struct SessionQuery {
    /// A global log position: the cursor of the session stream.
    #[serde(default)]
    pub after: u64,
}

/// `GET /v1/sessions/{sid}/stream?after=POSITION` (B-6): the session's events as SSE, `id:`
/// the global position (`Last-Event-ID` wins over `after`), with an `event:
/// session_reload` frame right after each committed terminal outcome.
pub async fn session_stream(
    api: web::Data<Api>,
    request: HttpRequest,
    path: web::Path<String>,
    query: web::Query<SessionQuery>,
) -> Result<HttpResponse, ApiError> {
    let session = api.session(&request, &path)?;
    let state = SessionStream {
        api: api.into_inner(),
        session,
        cursor: last_event_id(&request).unwrap_or(query.after),
        queued: VecDeque::from([Bytes::from_static(RETRY)]),
        keepalive_at: Instant::now(),
    };
    let body = futures::stream::unfold(state, |mut stream| async move {
        let bytes = stream.next().await;
        Some((Ok::<_, actix_web::Error>(bytes), stream))
    });
    Ok(event_stream(body))
}

struct SessionStream {
    api: Arc<Api>,
    session: SessionId,
    /// The position of the last entry sent.
    cursor: u64,
    queued: VecDeque<Bytes>,
    keepalive_at: Instant,
}

impl SessionStream {
    async fn next(&mut self) -> Bytes {
        loop {
            if let Some(bytes) = self.queued.pop_front() {
                self.keepalive_at = Instant::now() + self.api.keepalive;
                return bytes;
            }
            match self
                .api
                .runtime
                .session_feed(self.session, self.cursor, STREAM_PAGE_LEN_MAX)
            {
                Ok(feed) => {
                    // Past what other sessions wrote, too: the next read starts there.
                    let moved = feed.scanned_through > self.cursor;
                    self.cursor = self.cursor.max(feed.scanned_through);
                    let entries = feed.entries;
                    for (index, entry) in entries.iter().enumerate() {
                        let kind = (entry.kind == "session_reload").then_some("session_reload");
                        // A terminal event and its reload share a position: only the reload
                        // carries the id, so a reconnect between them never skips it.
                        let reload_follows = entries
                            .get(index + 1)
                            .is_some_and(|next| next.kind == "session_reload");
                        let id = (!reload_follows).then_some(entry.position);
                        let data = serde_json::to_value(entry).unwrap_or_default();
                        self.queued.push_back(frame(id, kind, &data));
                    }
                    if entries.is_empty() && moved {
                        // Nothing of this session, but the log was read further: tell the
                        // client, so a reconnect does not read those events again.
                        let data = json!({"position": self.cursor});
                        self.queued
                            .push_back(frame(Some(self.cursor), Some("cursor"), &data));
                    }
                    if !entries.is_empty() || moved {
                        continue;
                    }
                }
                // A failed read is retried at the next poll; the client keeps its data (B-6).
                Err(error) => tracing::warn!(%error, "session stream read failed"),
            }
            let now = Instant::now();
            if now >= self.keepalive_at {
                self.queued
                    .push_back(Bytes::from_static(b": keep-alive\n\n"));
                continue;
            }
            tokio::time::sleep(self.api.poll.min(self.keepalive_at - now)).await;
        }
    }
}
