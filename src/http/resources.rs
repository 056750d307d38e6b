//! What a start can ask for (admin): `GET /v1/resources`, the resource queue as SPEC §6 shows
//! it — each resource with its capacity, units in use, Jobs waiting (in the order they are
//! served) and leases (J-1); `GET /v1/functions`, the durable functions with their revisions
//! (F-1).

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Value};

use super::error::ApiError;
use super::Api;
use crate::QueueReport;

/// The resources of a queue report, as the HTTP contract has them.
pub fn resources_json(report: &QueueReport) -> Value {
    Value::Array(
        report
            .resources
            .iter()
            .map(|resource| {
                json!({
                    "name": resource.name,
                    "capacity": resource.capacity,
                    "in_use": resource.in_use,
                    "queued": resource.queued,
                    "leases": resource.leases.iter().map(|(lease, amount)| json!({
                        "lease_id": lease.lease_id,
                        "job_id": lease.job_id,
                        // The attempt's fencing epoch; null while the offer is unanswered.
                        "attempt": lease.epoch,
                        "amount": amount,
                    })).collect::<Vec<_>>(),
                    "waiting": resource.waiting,
                })
            })
            .collect(),
    )
}

/// `GET /v1/resources` (admin).
pub async fn resources(
    api: web::Data<Api>,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    api.tokens.authorize_admin(&request)?;
    let report = api.runtime.resources().await?;
    Ok(HttpResponse::Ok().json(resources_json(&report)))
}

/// `GET /v1/functions` (admin): `[{"name", "revisions": [1, 2]}]`, by name.
pub async fn functions(
    api: web::Data<Api>,
    request: HttpRequest,
) -> Result<HttpResponse, ApiError> {
    api.tokens.authorize_admin(&request)?;
    let functions = api.runtime.functions().into_iter();
    let functions = functions.map(|(name, revisions)| json!({"name": name, "revisions": revisions}));
    Ok(HttpResponse::Ok().json(functions.collect::<Vec<_>>()))
}
