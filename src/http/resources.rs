//! J-1: `GET /v1/resources` (admin): the resource queue as SPEC §6 shows it — each resource
//! with its capacity, units in use, Jobs waiting (in the order they are served) and leases.

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Value};

use super::error::ApiError;
use super::Api;
use crate::{QueueReport, WAIT_BUCKETS_MS};

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

/// J-1: the queue's metrics in Prometheus text: per resource its capacity, units in use and
/// Jobs waiting; admissions, refused offers, expiries; the queue-wait histogram (seconds).
pub fn queue_metrics(report: &QueueReport) -> String {
    let mut text = String::new();
    let mut gauge = |name: &str, help: &str, value: &dyn Fn(&crate::ResourceView) -> f64| {
        text.push_str(&format!(
            "# HELP openprogram_{name} {help}\n# TYPE openprogram_{name} gauge\n"
        ));
        for resource in &report.resources {
            text.push_str(&format!(
                "openprogram_{name}{{resource=\"{}\"}} {}\n",
                resource.name,
                value(resource)
            ));
        }
    };
    gauge(
        "resource_capacity",
        "Units of the resource declared.",
        &|r| f64::from(r.capacity),
    );
    gauge(
        "resource_in_use",
        "Units of the resource leased to Jobs (held, or offered and not yet answered).",
        &|r| f64::from(r.in_use),
    );
    gauge(
        "resource_queued",
        "Jobs waiting for the resource (the queue's depth).",
        &|r| r.queued as f64,
    );
    let stats = &report.stats;
    for (name, help, value) in [
        (
            "job_admissions_total",
            "Leases committed by their Jobs.",
            stats.admissions,
        ),
        (
            "job_offers_refused_total",
            "Lease offers a Job did not take (it left the queue meanwhile, or was unreachable).",
            stats.refused,
        ),
        (
            "jobs_expired_total",
            "Jobs ended `expired` by their queue deadline.",
            stats.expired,
        ),
    ] {
        text.push_str(&format!(
            "# HELP openprogram_{name} {help}\n# TYPE openprogram_{name} counter\nopenprogram_{name} {value}\n"
        ));
    }
    let name = "job_queue_wait_seconds";
    text.push_str(&format!(
        "# HELP openprogram_{name} Time a Job waited in the queue before a lease, per admission.\n# TYPE openprogram_{name} histogram\n"
    ));
    let mut cumulative = 0;
    for (bound, count) in WAIT_BUCKETS_MS.iter().zip(&stats.wait_buckets) {
        cumulative += count;
        let le = *bound as f64 / 1000.0;
        text.push_str(&format!(
            "openprogram_{name}_bucket{{le=\"{le}\"}} {cumulative}\n"
        ));
    }
    text.push_str(&format!(
        "openprogram_{name}_bucket{{le=\"+Inf\"}} {}\nopenprogram_{name}_sum {}\nopenprogram_{name}_count {}\n",
        stats.admissions,
        stats.wait_sum.as_secs_f64(),
        stats.admissions
    ));
    text
}
