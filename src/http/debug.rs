//! The debug endpoint (I-3), admin token only: live actors, the global log, executions
//! from the by-state index, Prometheus metrics; and `/health`, which needs no token.
//!
//! Every live actor describes itself (`Describe`): the supervisor, each execution, the
//! attempt lease it holds, each managed process — kind, id, the arbiter thread it runs on,
//! messages handled and waiting in its mailbox, a state summary. An actor that did not
//! answer in time shows `null` for what only it knows.

use std::time::Duration;

use actix_web::{web, HttpRequest, HttpResponse};
use openprogram_actors::describe::ActorSummary;
use openprogram_actors::inspect::Described;
use openprogram_storage::ExecutionState;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::api::EventsQuery;
use super::error::ApiError;
use super::Api;

mod metrics;

/// How long one actor may take to describe itself before it is listed as busy.
const ACTOR_ANSWER_TIMEOUT: Duration = Duration::from_secs(1);

/// The most log events one `GET /debug/log` returns.
const LOG_PAGE_LEN_MAX: usize = 1000;

/// One live actor (SPEC §6 `/debug/actors`).
#[derive(Debug, Clone, Serialize)]
pub struct ActorView {
    pub kind: &'static str,
    pub id: String,
    pub arbiter: Option<String>,
    pub mailbox_len: Option<u64>,
    pub handled: Option<u64>,
    pub state: String,
}

/// `200 {"status": "ok"|"stopping"}`, or `503 {"status": "fail_stop", "code": "fail_stop",
/// "message"}` once a write or fsync failed: the store acknowledges nothing more until the
/// process restarts (S-3), and a load balancer should take this node out.
pub async fn health(api: web::Data<Api>) -> HttpResponse {
    let store = api.runtime.store();
    let counters = store.metrics();
    let owner_id = store.incarnation().owner_id;
    if store.failure().is_some() {
        // No token here: the reason (it names the data directory) is for authenticated
        // callers, each refused write carries it.
        return HttpResponse::ServiceUnavailable().json(json!({
            "status": "fail_stop",
            "code": "fail_stop",
            "message": "the store stopped acknowledging after a failed write or fsync; restart the process once the disk is healthy",
            "owner_id": owner_id,
            "transitions": counters.transitions,
        }));
    }
    HttpResponse::Ok().json(json!({
        "status": if api.runtime.supervisor_running() { "ok" } else { "stopping" },
        "owner_id": owner_id,
        "transitions": counters.transitions,
    }))
}

pub async fn actors(api: web::Data<Api>, request: HttpRequest) -> Result<HttpResponse, ApiError> {
    api.tokens.authorize_admin(&request)?;
    Ok(HttpResponse::Ok().json(list_actors(&api).await))
}

pub async fn actor(
    api: web::Data<Api>,
    request: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    api.tokens.authorize_admin(&request)?;
    let wanted = path.into_inner();
    let found = list_actors(&api)
        .await
        .into_iter()
        .find(|actor| actor.id == wanted)
        .ok_or_else(ApiError::not_found)?;
    Ok(HttpResponse::Ok().json(found))
}

async fn list_actors(api: &Api) -> Vec<ActorView> {
    let mut actors = Vec::new();
    let unanswered = |kind: &'static str, id: String, error: String| ActorView {
        kind,
        id,
        arbiter: None,
        mailbox_len: None,
        handled: None,
        state: format!("did not answer: {error}"),
    };
    // The committer is a thread with a bounded queue, not an actor: its queue is the one
    // mailbox whose depth can be read.
    let counters = api.runtime.store().metrics();
    actors.push(ActorView {
        kind: "committer",
        id: "committer".into(),
        arbiter: Some("openprogram-committer".into()),
        mailbox_len: Some(counters.queued),
        handled: Some(counters.transitions),
        state: format!(
            "{} groups, {} fsyncs, {} materializations",
            counters.groups, counters.fsyncs, counters.materializations
        ),
    });
    // Its mailbox is busy for the whole of a startup recovery or a shutdown: bounded.
    let supervisor = tokio::time::timeout(ACTOR_ANSWER_TIMEOUT, api.runtime.describe_supervisor())
        .await
        .map_err(|_| crate::Error::Unavailable("busy (recovery or shutdown)".into()).to_string());
    let queue = tokio::time::timeout(ACTOR_ANSWER_TIMEOUT, api.runtime.describe_queue())
        .await
        .map_err(|_| "busy".to_owned());
    for (kind, answer) in [("supervisor", supervisor), ("resource_queue", queue)] {
        actors.push(match answer {
            Ok(Ok(summary)) => view(summary),
            Ok(Err(error)) => unanswered(kind, kind.into(), error.to_string()),
            Err(busy) => unanswered(kind, kind.into(), busy),
        });
    }
    // Asked all at once: N busy actors cost one timeout, not N.
    for described in api
        .runtime
        .inspect()
        .describe_actors(ACTOR_ANSWER_TIMEOUT)
        .await
    {
        actors.push(match described {
            Described::Answered(summary) => view(summary),
            Described::Unanswered { kind, id, error } => unanswered(kind, id, error),
        });
    }
    actors
}

/// An actor's own account, as the endpoint shows it.
fn view(summary: ActorSummary) -> ActorView {
    ActorView {
        kind: summary.kind,
        id: summary.id,
        arbiter: Some(summary.arbiter),
        mailbox_len: Some(summary.mailbox_len),
        handled: Some(summary.handled),
        state: summary.state,
    }
}

/// N-2: `GET /debug/nodes`: the nodes sharing the store, their leases (by the database's
/// clock) and how many running executions each owns; a store of one process lists none.
pub async fn nodes(api: web::Data<Api>, request: HttpRequest) -> Result<HttpResponse, ApiError> {
    api.tokens.authorize_admin(&request)?;
    Ok(HttpResponse::Ok().json(api.runtime.nodes()?))
}

/// `GET /debug/log?after=POSITION`: the global log, oldest first.
pub async fn log(
    api: web::Data<Api>,
    request: HttpRequest,
    query: web::Query<EventsQuery>,
) -> Result<HttpResponse, ApiError> {
    api.tokens.authorize_admin(&request)?;
    let limit = query.page_len(LOG_PAGE_LEN_MAX);
    let events = api
        .runtime
        .store()
        .log_after(query.after, limit)
        .map_err(crate::Error::from)?;
    Ok(super::api::events_json(&events))
}

/// The query of `GET /debug/overview`; an unknown field is refused.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverviewQuery {
    state: Option<String>,
    kind: Option<String>,
    session: Option<String>,
    /// Admitted within this long (`30m`, `12h`, `7d`).
    since: Option<String>,
    /// Any id: of an execution, session, effect, wait, command or process.
    id: Option<String>,
    /// Words of its request (an agent turn's message, a function's name and input).
    text: Option<String>,
    limit: Option<usize>,
}

/// Issue 36: `GET /debug/overview`: executions across sessions, filtered, needs attention
/// first (`crate::overview`).
pub async fn overview(
    api: web::Data<Api>,
    request: HttpRequest,
    query: web::Query<OverviewQuery>,
) -> Result<HttpResponse, ApiError> {
    api.tokens.authorize_admin(&request)?;
    let invalid = |message: String| ApiError::from(crate::Error::InvalidRequest(message));
    let state = known("state", &query.state, crate::overview::parse_state)?;
    let kind = known("kind", &query.kind, crate::overview::parse_kind)?;
    let session = match &query.session {
        None => None,
        Some(session) => Some(
            session
                .parse()
                .map_err(|_| invalid(format!("`{session}` is no session id")))?,
        ),
    };
    let since_ms = match &query.since {
        None => None,
        Some(since) => {
            let age = crate::overview::parse_duration(since).map_err(invalid)?;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            Some(now.saturating_sub(age).as_millis() as u64)
        }
    };
    let filter = crate::overview::OverviewFilter {
        state,
        kind,
        session,
        since_ms,
        id: query.id.clone(),
        text: (query.text.as_deref().map(str::trim))
            .filter(|text| !text.is_empty())
            .map(str::to_owned),
        limit: query.limit.unwrap_or(100),
    };
    // Store reads, a search's up to thousands: off the server's two workers.
    let runtime = api.runtime.clone();
    let rows = web::block(move || runtime.overview(&filter))
        .await
        .map_err(|error| crate::Error::Unavailable(error.to_string()))??;
    Ok(HttpResponse::Ok().json(json!({ "executions": rows })))
}

/// `GET /debug/figures` (admin): the recent figures the page draws as charts.
pub async fn figures(api: web::Data<Api>, request: HttpRequest) -> Result<HttpResponse, ApiError> {
    api.tokens.authorize_admin(&request)?;
    let every_ms = openprogram_actors::figures::EVERY.as_millis() as u64;
    Ok(HttpResponse::Ok().json(json!({"every_ms": every_ms, "samples": api.runtime.figures()})))
}

/// A filter's value as `parse` reads it; one it does not know is `invalid_request`.
fn known<T>(
    field: &str,
    value: &Option<String>,
    parse: fn(&str) -> Option<T>,
) -> Result<Option<T>, ApiError> {
    let unknown = |value: &str| crate::Error::InvalidRequest(format!("unknown {field} `{value}`"));
    let parse = |value: &String| parse(value).ok_or_else(|| unknown(value).into());
    value.as_ref().map(parse).transpose()
}

/// `GET /debug/executions`: executions in a non-terminal state, from the by-state index (S-6), with
/// their session; and quarantined ones (S-4). Ended executions are not indexed and not listed.
pub async fn executions(
    api: web::Data<Api>,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    api.tokens.authorize_admin(&request)?;
    let store = api.runtime.store();
    let mut rows = Vec::new();
    for state in ExecutionState::ALL
        .into_iter()
        .filter(|state| !state.is_terminal())
    {
        for execution_id in store
            .executions_in_state(state)
            .map_err(crate::Error::from)?
        {
            if let Ok(Some(head)) = store.head(execution_id) {
                rows.push(json!({
                    "execution_id": execution_id,
                    "session_id": head.session_id,
                    "state": head.state.as_str(),
                    "version": head.version,
                }));
            }
        }
    }
    let sessions: Vec<_> = store
        .sessions()
        .map_err(crate::Error::from)?
        .into_iter()
        .map(|(session_id, executions)| json!({"session_id": session_id, "executions": executions}))
        .collect();
    let quarantined: Vec<_> = store
        .quarantined()
        .into_iter()
        .map(|(execution_id, reason)| json!({"execution_id": execution_id, "reason": reason}))
        .collect();
    Ok(HttpResponse::Ok().json(json!({
        "executions": rows,
        "sessions": sessions,
        "quarantined": quarantined,
    })))
}

/// `GET /debug/demo`: what `serve --demo` seeded (sessions, their tokens, executions).
pub async fn demo(api: web::Data<Api>, request: HttpRequest) -> Result<HttpResponse, ApiError> {
    api.tokens.authorize_admin(&request)?;
    let seeded = api
        .demo
        .as_ref()
        .and_then(|demo| demo.get().cloned())
        .ok_or_else(ApiError::not_found)?;
    Ok(HttpResponse::Ok().json(seeded))
}

/// `GET /metrics`: Prometheus text format, names `openprogram_*`.
pub async fn metrics(api: web::Data<Api>, request: HttpRequest) -> Result<HttpResponse, ApiError> {
    api.tokens.authorize_admin(&request)?;
    let text = metrics::text(&api.runtime).await?;
    Ok(HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(text))
}
