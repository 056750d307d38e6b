//! Errors of the HTTP API: every failure is JSON `{"code", "message"}` with a status that
//! says whose fault it is (SPEC §6, I-2). Input never produces a 500: malformed bodies,
//! paths and queries are 400, a body over the limit 413, an unknown id or another session's
//! id 404 (X-1, indistinguishable), a stale version or a refused control 409.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, ResponseError};
use serde_json::{json, Map, Value};

use crate::Error;

/// A failed request, as the client sees it.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    /// The stable code (`Error::code`, or a command's refusal code).
    pub code: std::borrow::Cow<'static, str>,
    pub message: String,
    /// More fields merged into the body (a refused command carries its reply).
    pub extra: Map<String, Value>,
}

impl ApiError {
    pub fn new(
        status: StatusCode,
        code: impl Into<std::borrow::Cow<'static, str>>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            code: code.into(),
            message: message.into(),
            extra: Map::new(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    pub fn unauthorized() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong token: send `Authorization: Bearer TOKEN`",
        )
    }

    pub fn not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", "not found")
    }

    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("the request body exceeds the limit of {limit} bytes"),
        )
    }

    /// Adds fields to the body beside `code` and `message`.
    pub fn with(mut self, extra: Value) -> Self {
        if let Value::Object(fields) = extra {
            self.extra.extend(fields);
        }
        self
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        let mut body = self.extra.clone();
        body.insert("code".into(), json!(self.code));
        body.insert("message".into(), json!(self.message));
        HttpResponse::build(self.status).json(Value::Object(body))
    }
}

/// The library's errors, by their stable codes (`Error::code`).
impl From<Error> for ApiError {
    fn from(error: Error) -> Self {
        use openprogram_storage::Error as Storage;
        let status = match &error {
            Error::NotFound => return Self::not_found(),
            Error::UnknownFunction(_) => StatusCode::NOT_FOUND,
            Error::Purged(_) | Error::Storage(Storage::Purged(_)) => StatusCode::GONE,
            Error::ActiveExecutions(_) => StatusCode::CONFLICT,
            Error::Storage(Storage::UnknownExecution(_)) => return Self::not_found(),
            Error::InvalidRequest(_)
            | Error::UnknownField { .. }
            | Error::UnsupportedKind(_)
            | Error::UnknownKind(_)
            | Error::InvalidAnswer { .. }
            | Error::InvalidInput(_)
            | Error::UnknownResource(_)
            | Error::ExceedsCapacity { .. } => StatusCode::BAD_REQUEST,
            Error::Storage(Storage::PayloadTooLarge { .. }) => StatusCode::PAYLOAD_TOO_LARGE,
            Error::CommandConflict { .. }
            | Error::SessionBusy { .. }
            | Error::VersionConflict { .. }
            | Error::Fenced { .. }
            | Error::Storage(Storage::Quarantined { .. }) => StatusCode::CONFLICT,
            Error::HookMissing(_) => StatusCode::NOT_IMPLEMENTED,
            Error::HookFailed { .. } => StatusCode::BAD_GATEWAY,
            Error::Unavailable(_)
            | Error::Storage(Storage::Closed | Storage::FailStop(_) | Storage::Locked { .. }) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Error::Internal(_) | Error::Storage(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let mut api = Self::new(status, error.code(), error.to_string());
        match error {
            Error::VersionConflict { current } => {
                api.extra.insert("current_version".into(), json!(current));
            }
            Error::UnknownField { field, .. } | Error::InvalidAnswer { field, .. } => {
                api.extra.insert("field".into(), json!(field));
            }
            Error::SessionBusy { foreground, .. } => {
                api.extra.insert("foreground".into(), json!(foreground));
            }
            _ => {}
        }
        api
    }
}

/// A JSON body that does not parse, is not JSON, or is too large.
pub fn json_error(
    limit: usize,
) -> impl Fn(actix_web::error::JsonPayloadError, &HttpRequest) -> actix_web::Error + Clone {
    move |error, _request| {
        use actix_web::error::JsonPayloadError as Json;
        let api = match &error {
            Json::Overflow { .. } | Json::OverflowKnownLength { .. } => ApiError::too_large(limit),
            Json::Payload(actix_web::error::PayloadError::Overflow) => ApiError::too_large(limit),
            other => ApiError::bad_request(format!("malformed JSON body: {other}")),
        };
        api.into()
    }
}

/// A query string that does not parse (`after=abc`).
pub fn query_error(
    error: actix_web::error::QueryPayloadError,
    _request: &HttpRequest,
) -> actix_web::Error {
    ApiError::bad_request(format!("malformed query: {error}")).into()
}

/// A path that does not parse.
pub fn path_error(error: actix_web::error::PathError, _request: &HttpRequest) -> actix_web::Error {
    ApiError::bad_request(format!("malformed path: {error}")).into()
}

/// Routes that do not exist answer in the same JSON shape.
pub async fn no_route() -> HttpResponse {
    ApiError::not_found().error_response()
}
