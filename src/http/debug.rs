//! The debug endpoint (I-3), admin token only: live actors, the global log, executions
//! from the by-state index, Prometheus metrics; and `/health`, which needs no token.
//!
//! Every live actor describes itself (`Describe`): the supervisor, each execution, the
//! attempt lease it holds, each managed process — kind, id, the arbiter thread it runs on,
//! messages handled, a state summary. It shows nothing it would have to guess: actix does
//! not expose a mailbox's depth, so `mailbox_len` is `null`.

use std::time::Duration;

use actix_web::{web, HttpRequest, HttpResponse};
use openprogram_actors::describe::ActorSummary;
use openprogram_actors::inspect::Described;
use openprogram_storage::ExecutionState;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::error::ApiError;
use super::Api;

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
    if let Some(reason) = store.failure() {
        return HttpResponse::ServiceUnavailable().json(json!({
            "status": "fail_stop",
            "code": "fail_stop",
            "message": format!("the store stopped acknowledging after a failed write: {reason}; restart the process once the disk is healthy"),
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
        .unwrap_or_else(|_| {
            Err(crate::Error::Unavailable(
                "busy (recovery or shutdown)".into(),
            ))
        });
    match supervisor {
        Ok(summary) => actors.push(view(summary)),
        Err(error) => actors.push(unanswered(
            "supervisor",
            "supervisor".into(),
            error.to_string(),
        )),
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

/// An actor's own account, as the endpoint shows it. actix does not expose a mailbox's
/// depth, so `mailbox_len` stays `null` rather than a guess.
fn view(summary: ActorSummary) -> ActorView {
    ActorView {
        kind: summary.kind,
        id: summary.id,
        arbiter: Some(summary.arbiter),
        mailbox_len: None,
        handled: Some(summary.handled),
        state: summary.state,
    }
}

#[derive(Debug, Deserialize)]
pub struct LogQuery {
    #[serde(default)]
    pub after: u64,
    #[serde(default)]
    pub limit: Option<usize>,
}

/// `GET /debug/log?after=POSITION`: the global log, oldest first.
pub async fn log(
    api: web::Data<Api>,
    request: HttpRequest,
    query: web::Query<LogQuery>,
) -> Result<HttpResponse, ApiError> {
    api.tokens.authorize_admin(&request)?;
    let limit = query
        .limit
        .unwrap_or(LOG_PAGE_LEN_MAX)
        .clamp(1, LOG_PAGE_LEN_MAX);
    let events = api
        .runtime
        .store()
        .log_after(query.after, limit)
        .map_err(crate::Error::from)?;
    let body: Vec<serde_json::Value> = events.iter().map(super::api::event_json).collect();
    Ok(HttpResponse::Ok().json(body))
}

/// `GET /debug/executions`: executions in a non-terminal state, from the by-state index
/// (S-6), with their session; and quarantined ones (S-4). Ended executions are not indexed
/// and not listed.
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
    let store = api.runtime.store();
    let counters = store.metrics();
    let inspect = api.runtime.inspect();
    let mut text = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
        text.push_str(&format!(
            "# HELP openprogram_{name} {help}\n# TYPE openprogram_{name} {kind}\n"
        ));
        for (labels, value) in samples {
            text.push_str(&format!("openprogram_{name}{labels} {value}\n"));
        }
    };
    let one = |value: u64| vec![(String::new(), value as f64)];
    metric(
        "commits_total",
        "counter",
        "Transitions committed (acknowledged after fsync).",
        &one(counters.transitions),
    );
    metric(
        "steps_total",
        "counter",
        "Steps committed: model decisions and tool results, each with its checkpoint.",
        &one(inspect.steps()),
    );
    let (parked, replayed) = inspect.state_loads();
    metric(
        "state_loads_total",
        "counter",
        "Execution states loaded for an activation or a read: from a parked state kept in \
         memory, or by replaying the execution's events.",
        &[
            ("{from=\"parked\"}".to_owned(), parked as f64),
            ("{from=\"replay\"}".to_owned(), replayed as f64),
        ],
    );
    metric(
        "process_cpu_seconds_total",
        "counter",
        "CPU time of the server process, all threads, user and system.",
        &[(
            String::new(),
            crate::process_stats::process_cpu().map_or(0.0, |cpu| cpu.as_secs_f64()),
        )],
    );
    metric(
        "process_peak_resident_bytes",
        "gauge",
        "The server process's peak resident memory (VmHWM).",
        &[(
            String::new(),
            crate::process_stats::peak_rss_mib() * 1024.0 * 1024.0,
        )],
    );
    metric(
        "committer_queue_depth",
        "gauge",
        "Transitions waiting for the committer: its mailbox depth.",
        &one(counters.queued),
    );
    metric(
        "group_commits_total",
        "counter",
        "Group commits written.",
        &one(counters.groups),
    );
    metric(
        "fsyncs_total",
        "counter",
        "fsyncs of the store's data file.",
        &one(counters.fsyncs),
    );
    metric(
        "fenced_writes_total",
        "counter",
        "Writes refused because a newer attempt holds the execution (a stale owner, A-1).",
        &one(counters.fenced),
    );
    metric(
        "fsync_seconds_total",
        "counter",
        "Time spent in fsync.",
        &[(String::new(), counters.fsync_micros_total as f64 / 1e6)],
    );
    metric(
        "flush_seconds_total",
        "counter",
        "Time spent in sled's flush(), which writes its buffers and waits for them, before each fsync.",
        &[(String::new(), counters.flush_micros_total as f64 / 1e6)],
    );
    metric(
        "committer_busy_seconds_total",
        "counter",
        "Time the committer spent on group commits (validate, write, flush, fsync, answer); its rate near 1 means the store limits throughput.",
        &[(String::new(), counters.group_micros_total as f64 / 1e6)],
    );
    metric(
        "materializations_total",
        "counter",
        "Materialization slices written.",
        &one(counters.materializations),
    );
    metric(
        "replayed_frames",
        "gauge",
        "Log frames replayed when the store was opened.",
        &one(counters.replayed_frames),
    );
    metric(
        "live_actors",
        "gauge",
        "Live actors by kind.",
        &[
            (
                "{kind=\"execution\"}".into(),
                inspect.live_executions() as f64,
            ),
            ("{kind=\"process\"}".into(), inspect.live_processes() as f64),
            (
                "{kind=\"supervisor\"}".into(),
                f64::from(u8::from(api.runtime.supervisor_running())),
            ),
        ],
    );
    let mut by_state = Vec::new();
    for state in ExecutionState::ALL
        .into_iter()
        .filter(|state| !state.is_terminal())
    {
        let count = store
            .executions_in_state(state)
            .map_err(crate::Error::from)?
            .len();
        by_state.push((format!("{{state=\"{}\"}}", state.as_str()), count as f64));
    }
    metric(
        "executions",
        "gauge",
        "Executions by non-terminal state (ended executions are not indexed).",
        &by_state,
    );
    metric(
        "quarantined_executions",
        "gauge",
        "Executions refused for corrupted records (S-4).",
        &one(store.quarantined().len() as u64),
    );
    Ok(HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(text))
}
