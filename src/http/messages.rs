//! C-1: `GET /v1/sessions/{sid}/messages` — the session's transcript from the event log
//! (`openprogram_actors::conversation`): a page of messages (`after`, `limit`), one branch
//! (`branch`: an Activity `branch_id`), one assistant message read on from a seq
//! (`execution`, `after_seq`), or the messages changed after a log position
//! (`changed_after`; with the session stream, a cursor stream of changes); summaries in place
//! of what compactions replaced unless `originals=true` (C-3). Also the session itself
//! (`GET /v1/sessions/{sid}`: its name, turns and compactions) and `POST …/compact`.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::error::ApiError;
use super::Api;
use crate::MessagesQuery;

/// The query; an unknown field is refused.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Query {
    branch: Option<String>,
    after: Option<String>,
    limit: Option<usize>,
    execution: Option<String>,
    after_seq: Option<u64>,
    changed_after: Option<u64>,
    originals: Option<bool>,
}

pub async fn messages(
    api: web::Data<Api>,
    request: HttpRequest,
    path: web::Path<String>,
    query: web::Query<Query>,
) -> Result<HttpResponse, ApiError> {
    let session = api.session(&request, &path)?;
    let query = MessagesQuery {
        branch: id("branch", &query.branch)?,
        after: id("after", &query.after)?,
        limit: query.limit,
        execution: id("execution", &query.execution)?,
        after_seq: query.after_seq.unwrap_or(0),
        changed_after: query.changed_after,
        originals: query.originals.unwrap_or(false),
    };
    Ok(HttpResponse::Ok().json(api.runtime.messages(session, &query)?))
}

/// `GET /v1/sessions/{sid}`: the session's name, foreground turn, turns in line and compactions.
pub async fn session(
    api: web::Data<Api>,
    request: HttpRequest,
    path: web::Path<String>,
) -> Result<HttpResponse, ApiError> {
    let session = api.session(&request, &path)?;
    Ok(HttpResponse::Ok().json(api.runtime.session(session)?))
}

/// The body of `POST /v1/sessions/{sid}/compact`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactBody {
    /// The user or assistant message of the turn the compaction goes through.
    through: String,
}

/// `POST /v1/sessions/{sid}/compact` (C-3): the prefix through a turn replaced by the
/// compactor's summary; 201 with the compaction (the same one when asked again).
pub async fn compact(
    api: web::Data<Api>,
    request: HttpRequest,
    path: web::Path<String>,
    body: web::Json<CompactBody>,
) -> Result<HttpResponse, ApiError> {
    let session = api.session(&request, &path)?;
    let through = id("through", &Some(body.into_inner().through))?
        .ok_or_else(|| crate::Error::InvalidRequest("`through` is required".into()))?;
    let compaction = api.runtime.compact(session, through).await?;
    Ok(HttpResponse::Created().json(compaction))
}

/// An id field of the query, parsed.
fn id<T: std::str::FromStr>(field: &str, value: &Option<String>) -> Result<Option<T>, ApiError> {
    value
        .as_deref()
        .map(|text| {
            text.parse().map_err(|_| {
                ApiError::from(crate::Error::InvalidRequest(format!(
                    "`{field}`: `{text}` is not an id"
                )))
            })
        })
        .transpose()
}
