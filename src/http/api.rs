//! The session-scoped API under `/v1` (SPEC §6, I-2): sessions, executions, snapshots, commands,
//! command status and events. Every handler checks the token against the session in its path first
//! the library then answers another session's ids as not found.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use openprogram_storage::{CommandId, EventEnvelope, ExecutionId, SessionId, VersionPolicy};
use std::collections::BTreeMap;

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::error::ApiError;
use super::Api;
use crate::{Command, Error, FunctionStart, StartRequest};

/// The most events one `GET …/events` returns; a client pages on with `after`.
pub const EVENTS_PAGE_LEN_MAX: usize = 1000;

/// `POST /v1/sessions` (admin): a new session and its own token.
pub async fn create_session(
    api: web::Data<Api>,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    api.tokens.authorize_admin(&request)?;
    let session_id = SessionId::new();
    Ok(HttpResponse::Created().json(json!({
        "session_id": session_id,
        "token": api.tokens.session_token(session_id),
    })))
}

/// The body of `POST /v1/sessions/{sid}/executions` for `"kind": "function"` (F-1).
#[derive(Debug, Deserialize)]
pub struct FunctionBody {
    pub function: String,
    #[serde(default)]
    pub input: Value,
    pub policy: Option<String>,
    /// A registered revision to run instead of the newest.
    pub revision: Option<u32>,
    #[serde(default)]
    pub start_paused: bool,
    /// J-1: admit it as a background Job.
    pub job: Option<crate::JobRequest>,
    /// K-7: its own restart window: `-1`, `0` or a duration.
    #[serde(
        default,
        deserialize_with = "openprogram_actors::admission::restart_window_field"
    )]
    pub restart_window: Option<openprogram_storage::RestartWindow>,
}

impl FunctionBody {
    const FIELDS: [&'static str; 8] = [
        "kind",
        "function",
        "input",
        "policy",
        "revision",
        "start_paused",
        "job",
        "restart_window",
    ];
}

/// What a start body asks for: an agent turn's body is the library's own `StartRequest`.
#[derive(Debug)]
pub enum Start {
    Agent(StartRequest),
    Function(FunctionBody),
}

/// a field a start body does not have, named by its path.
fn unknown_field(field: String) -> ApiError {
    Error::UnknownField {
        message: format!("a start body has no field `{field}`"),
        field,
    }
    .into()
}

/// a field a start body of its kind does not have, refused before anything is stored.
fn refuse_unknown_fields(
    fields: &BTreeMap<String, IgnoredAny>,
    known: &[&str],
) -> Result<(), ApiError> {
    let unknown = fields.keys().find(|field| !known.contains(&field.as_str()));
    unknown.map_or(Ok(()), |field| Err(unknown_field(field.clone())))
}

/// X-3 inside a start body's `job` (J-1): a field it does not have is `unknown_field`,
/// named by its path (`job.priority`, `job.budget.tokens`).
fn refuse_unknown_job_fields(raw: &RawValue) -> Result<(), ApiError> {
    #[derive(Deserialize)]
    struct Outer {
        job: Option<Value>,
    }
    let Ok(Outer {
        job: Some(Value::Object(fields)),
    }) = serde_json::from_str(raw.get())
    else {
        return Ok(());
    };
    for (name, value) in fields {
        match name.as_str() {
            "resources" | "queue_deadline_ms" => {}
            "budget" => {
                if let Value::Object(budget) = value {
                    if let Some(other) = budget
                        .keys()
                        .find(|key| !["steps", "wall_ms"].contains(&key.as_str()))
                    {
                        return Err(unknown_field(format!("job.budget.{other}")));
                    }
                }
            }
            other => return Err(unknown_field(format!("job.{other}"))),
        }
    }
    Ok(())
}

impl Start {
    /// Every field an agent's start body may carry (X-3: anything else is `unknown_field`).
    const AGENT_FIELDS: [&'static str; 9] = [
        "kind",
        "message",
        "parent_message_id",
        "script",
        "max_iterations",
        "start_paused",
        "job",
        "when_busy",
        "restart_window",
    ];

    /// Reads a start body (SPEC §6), refusing what this build does not understand
    /// before anything is stored: a field it does not know, a kind the contract names but
    /// this build does not run (`unsupported_kind`), or none the contract names.
    fn read(raw: &RawValue) -> Result<Start, ApiError> {
        /// The kind alone: a body of a kind not built is refused as that, whatever it holds.
        #[derive(Deserialize)]
        struct Kind {
            kind: Option<String>,
        }
        let fields: BTreeMap<String, IgnoredAny> =
            serde_json::from_str(raw.get()).map_err(|error| {
                ApiError::bad_request(format!("a start body is a JSON object: {error}"))
            })?;
        let malformed = |error: serde_json::Error| {
            ApiError::bad_request(format!("malformed start body: {error}"))
        };
        let kind: Kind = serde_json::from_str(raw.get()).map_err(malformed)?;
        refuse_unknown_job_fields(raw)?;
        match kind.kind.as_deref() {
            None | Some("agent") => {
                refuse_unknown_fields(&fields, &Self::AGENT_FIELDS)?;
                serde_json::from_str(raw.get())
                    .map(Start::Agent)
                    .map_err(malformed)
            }
            Some("function") => {
                refuse_unknown_fields(&fields, &FunctionBody::FIELDS)?;
                let body: FunctionBody = serde_json::from_str(raw.get()).map_err(malformed)?;
                match body.policy.as_deref().map(VersionPolicy::parse) {
                    Some(None) => Err(ApiError::bad_request(format!(
                        "`{}` is not a version policy: keep_original or use_latest",
                        body.policy.as_deref().unwrap_or_default()
                    ))),
                    _ => Ok(Start::Function(body)),
                }
            }
            Some(kind @ "job") => Err(Error::UnsupportedKind(format!(
                "`{kind}` is no execution kind to start: a Job is an `agent` or `function` body with a `job` object"
            ))
            .into()),
            Some(other) => Err(Error::UnknownKind(format!(
                "`{other}` is not an execution kind: this build starts `agent` and `function` executions"
            ))
            .into()),
        }
    }
}

pub async fn start_execution(
    api: web::Data<Api>,
    request: HttpRequest,
    path: web::Path<String>,
    body: web::Json<Box<RawValue>>,
) -> Result<HttpResponse, ApiError> {
    let session = api.session(&request, &path)?;
    let reply = match Start::read(&body)? {
        Start::Agent(start) => {
            let reply = api.runtime.start_execution(session, start).await?;
            // C-2: steered into the running turn: nothing was created.
            if reply.steered.is_some() {
                return Ok(HttpResponse::Accepted().json(reply));
            }
            json!(reply)
        }
        Start::Function(body) => {
            let start = FunctionStart {
                function: body.function,
                input: body.input,
                policy: body.policy.as_deref().and_then(VersionPolicy::parse),
                revision: body.revision,
                start_paused: body.start_paused,
                job: body.job,
                restart_window: body.restart_window,
            };
            json!(api.runtime.start_function(session, start).await?)
        }
    };
    // B11: the admission is durable, its reply not yet delivered.
    openprogram_storage::failpoint!("B11");
    Ok(HttpResponse::Created().json(reply))
}

/// `GET /v1/sessions/{sid}/executions`: the snapshots of the session's executions.
pub async fn list_executions(
    api: web::Data<Api>,
    request: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let session = api.session(&request, &path)?;
    Ok(HttpResponse::Ok().json(api.runtime.executions(session).await?))
}

/// `DELETE /v1/sessions/{sid}` (S-8): purges a session whose executions have all ended
/// (`409 active_executions` otherwise); its executions answer `410 purged` from then on.
pub async fn purge_session(
    api: web::Data<Api>,
    request: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let session = api.session(&request, &path)?;
    let purged = api.runtime.purge_session(session).await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({
        "session_id": session,
        "purged": purged,
    })))
}

/// `GET /v1/sessions/{sid}/activity` (B-2..B-5): branches in three sections.
pub async fn activity(
    api: web::Data<Api>,
    request: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let session = api.session(&request, &path)?;
    Ok(HttpResponse::Ok().json(api.runtime.activity(session)?))
}

pub async fn snapshot(
    api: web::Data<Api>,
    request: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let (session, execution) = api.execution(&request, &path)?;
    Ok(HttpResponse::Ok().json(api.runtime.snapshot(session, execution).await?))
}

/// `POST …/commands`: 202 with the reply when the command was applied; 409 with the same
/// reply fields and the refusal's code (`version_conflict`, `not_available`, ...) when it
/// was rejected, so that a retry of the same `command_id` gets the same answer either way
/// (K-4). A body the runtime does not understand is a 400 and nothing is stored.
pub async fn command(
    api: web::Data<Api>,
    request: HttpRequest,
    path: web::Path<(String, String)>,
    body: web::Json<Value>,
) -> Result<HttpResponse, ApiError> {
    let (session, execution) = api.execution(&request, &path)?;
    let command = Command::from_json(&body)?;
    // N-3: the node running it decides it.
    if let Some(node) = api.runtime.node() {
        if let Some(owner) = api.runtime.owner_elsewhere(execution)? {
            // Forwarded once only; a request that says it was forwarded (or claims to be)
            // never makes this node claim an execution another live node runs.
            if super::forward::is_forwarded(&request) {
                return Err(super::forward::owner_moved(&owner));
            }
            return super::forward::forward(&request, &owner, &node.node_id, &body).await;
        }
    }
    let reply = api.runtime.command(session, execution, command).await?;
    // B11: the command's outcome is durable, its reply not yet delivered.
    openprogram_storage::failpoint!("B11");
    if reply.status == "rejected" {
        let reason = reply.reason.clone().unwrap_or_default();
        let code = reply
            .code
            .clone()
            .unwrap_or_else(|| "command_rejected".into());
        let fields = serde_json::to_value(&reply).unwrap_or(Value::Null);
        return Err(ApiError::new(StatusCode::CONFLICT, code, reason).with(fields));
    }
    Ok(HttpResponse::Accepted().json(reply))
}

pub async fn command_status(
    api: web::Data<Api>,
    request: HttpRequest,
    path: web::Path<(String, String)>,
) -> Result<HttpResponse, ApiError> {
    let session = api.session(&request, &path.0)?;
    let command: CommandId = path.1.parse().map_err(|_| ApiError::not_found())?;
    Ok(HttpResponse::Ok().json(api.runtime.command_status(session, command)?))
}

/// `?after=SEQ&limit=N`: where a page of events or the log begins, and how long it is.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct EventsQuery {
    pub after: u64,
    pub limit: Option<usize>,
}

impl EventsQuery {
    /// `limit` within 1..=`max`; `max` when absent.
    pub fn page_len(&self, max: usize) -> usize {
        self.limit.unwrap_or(max).clamp(1, max)
    }
}

pub async fn events(
    api: web::Data<Api>,
    request: HttpRequest,
    path: web::Path<(String, String)>,
    query: web::Query<EventsQuery>,
) -> Result<HttpResponse, ApiError> {
    let (session, execution) = api.execution(&request, &path)?;
    let limit = query.page_len(EVENTS_PAGE_LEN_MAX);
    let events = api
        .runtime
        .events_page(session, execution, query.after, limit)?;
    Ok(events_json(&events))
}

/// 200 with `events` as the API shows them.
pub fn events_json(events: &[EventEnvelope]) -> HttpResponse {
    HttpResponse::Ok().json(events.iter().map(event_json).collect::<Vec<_>>())
}

/// An event as the API shows it: `seq`, `position`, `at_ms`, `type`, the writer's epoch,
/// and the event's own fields beside them.
pub fn event_json(envelope: &EventEnvelope) -> Value {
    let mut body = serde_json::Map::new();
    if let Ok(Value::Object(outer)) = serde_json::to_value(&envelope.event) {
        // Externally tagged: `{"Variant": {fields}}`.
        for (_, inner) in outer {
            if let Value::Object(fields) = inner {
                body.extend(fields);
            }
        }
    }
    body.insert("execution_id".into(), json!(envelope.execution_id));
    body.insert("seq".into(), json!(envelope.seq));
    body.insert("position".into(), json!(envelope.position));
    body.insert("at_ms".into(), json!(envelope.at_ms));
    body.insert("writer_epoch".into(), json!(envelope.writer_epoch));
    body.insert("type".into(), json!(envelope.event.type_name()));
    Value::Object(body)
}

impl Api {
    /// The session of the path, if the request's token reaches it (else 401).
    pub fn session(&self, request: &HttpRequest, raw: &str) -> Result<SessionId, ApiError> {
        let signed_in = || self.tokens.sign_in().admits(request);
        if super::auth::bearer(request).is_none() && !signed_in() {
            return Err(ApiError::unauthorized());
        }
        // A malformed id matches no session token: only the admin learns it is unknown.
        let Ok(session) = raw.parse::<SessionId>() else {
            self.tokens.authorize_admin(request)?;
            return Err(ApiError::not_found());
        };
        self.tokens.authorize_session(request, session)?;
        Ok(session)
    }

    /// The session and execution of the path (`/v1/sessions/{sid}/executions/{eid}/…`).
    pub fn execution(
        &self,
        request: &HttpRequest,
        path: &(String, String),
    ) -> Result<(SessionId, ExecutionId), ApiError> {
        let session = self.session(request, &path.0)?;
        let execution = path.1.parse().map_err(|_| ApiError::not_found())?;
        Ok((session, execution))
    }
}
