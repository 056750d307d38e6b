//! N-3: a command for an execution another live node runs is forwarded to that node and its
//! answer (status and body) relayed as it is: the client sees the owner's accepted/applied
//! semantics whichever node it asked. One whose owner's lease lapsed, or that no attempt
//! runs, is decided here. The caller's `Authorization` goes to the owner over plain HTTP:
//! nodes belong on a trusted network. A forwarded request carries `X-OpenProgram-Forwarded`
//! and is never forwarded again: if another node runs the execution by then (ownership
//! moved, or a client set the header), it is answered `503 owner_moved`.

use std::time::Duration;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::Value;

use super::error::ApiError;

/// The header a forwarded request carries (the forwarding node's id).
pub const FORWARDED_HEADER: &str = "x-openprogram-forwarded";

/// How long a forwarded command may take at its owner.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether `request` was forwarded by another node.
pub fn is_forwarded(request: &HttpRequest) -> bool {
    request.headers().contains_key(FORWARDED_HEADER)
}

/// Sends `body` to the same path at `node_url` with the caller's credentials, and answers
/// what the owner answered. An owner that cannot be reached (it just died) is `503
/// owner_unreachable`: retrying with the same command id is safe (K-4), and once its lease
/// lapsed a survivor takes the execution over and decides it.
pub async fn forward(
    request: &HttpRequest,
    node_url: &str,
    from_node: &str,
    body: &Value,
) -> Result<HttpResponse, ApiError> {
    let url = format!("{}{}", node_url.trim_end_matches('/'), request.uri());
    let header = |name: &str| {
        let value = request.headers().get(name).and_then(|value| value.to_str().ok());
        value.unwrap_or_default().to_owned()
    };
    // A page signed in by its cookie (`signin.rs`) speaks with it on every node.
    let (authorization, cookie) = (header("authorization"), header("cookie"));
    let body = body.to_string();
    let from_node = from_node.to_owned();
    let target = url.clone();
    let answered = web::block(move || {
        let sent = ureq::post(&target)
            .set("Authorization", &authorization)
            .set("Cookie", &cookie)
            .set("Content-Type", "application/json")
            .set(FORWARDED_HEADER, &from_node)
            .timeout(FORWARD_TIMEOUT)
            .send_string(&body);
        match sent {
            Ok(response) | Err(ureq::Error::Status(_, response)) => {
                let status = response.status();
                response
                    .into_string()
                    .map(|text| (status, text))
                    .map_err(|error| error.to_string())
            }
            Err(error) => Err(error.to_string()),
        }
    })
    .await
    .map_err(|error| unreachable_owner(&url, &error.to_string()))?;
    let (status, text) = answered.map_err(|error| unreachable_owner(&url, &error))?;
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    Ok(HttpResponse::build(status)
        .content_type("application/json")
        .body(text))
}

/// A forwarded command whose execution another live node runs by the time it arrived (its
/// ownership moved, or the header was a client's): `503 owner_moved`, to be sent again.
pub fn owner_moved(url: &str) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "owner_moved",
        format!("the execution is run by the node at {url} now; retry with the same command_id"),
    )
}

fn unreachable_owner(url: &str, error: &str) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "owner_unreachable",
        format!(
            "the node running this execution did not answer ({url}: {error}); retry with the \
             same command_id"
        ),
    )
}
