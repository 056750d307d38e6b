//! The HTTP API, the debug endpoint and the page (SPEC §6, I-2, I-3, X-1, X-2), on
//! actix-web. `serve` mounts it; tests mount `routes` in actix-web's test service.
//!
//! - `auth` — the admin token and the stateless session tokens;
//! - `api` — `/v1`: sessions, executions, snapshots, commands, events;
//! - `stream` — `/v1/…/events/stream`: Server-Sent Events with a resumable cursor;
//! - `debug` — `/debug/*`, `/metrics`, `/health`;
//! - `error` — JSON errors `{"code", "message"}` and their statuses;
//! - `client` — the HTTP client side of `openprogram ctl` and `inspect`;
//! - `client_select` — `inspect executions` across sessions, `inspect tail`, `ctl --where`;
//! - `demo` — what `serve --demo` seeds.
//!
//! Architecture invariant: the HTTP layer only calls the `Runtime` facade (and reads the
//! actors' directory for the debug endpoint); it never writes to the store itself, and UI
//! or client state never authorizes anything: every request carries its token.

pub mod api;
pub mod auth;
pub mod client;
pub mod client_select;
pub mod client_verbs;
pub mod client_words;
pub mod debug;
pub mod demo;
pub mod error;
pub mod forward;
pub mod messages;
pub mod resources;
pub mod signin;
pub mod stream;

use std::net::SocketAddr;
use std::time::Duration;

use actix_web::{web, App, HttpResponse, HttpServer};

use crate::Runtime;
pub use auth::Tokens;

/// The largest request body accepted, unless configured. Script payloads above it
/// answer 413.
pub const BODY_BYTES_MAX_DEFAULT: usize = 256 * 1024;

/// What every handler shares.
#[derive(Debug, Clone)]
pub struct Api {
    pub runtime: Runtime,
    pub tokens: Tokens,
    pub body_bytes_max: usize,
    /// How often an idle event stream reads the store.
    pub poll: Duration,
    /// How long an event stream stays silent before a keep-alive comment.
    pub keepalive: Duration,
    /// What `--demo` seeded, for `/debug/demo` (set once seeding is done).
    pub demo: Option<std::sync::Arc<std::sync::OnceLock<serde_json::Value>>>,
}

impl Api {
    pub fn new(runtime: Runtime, tokens: Tokens) -> Self {
        Self {
            runtime,
            tokens,
            body_bytes_max: BODY_BYTES_MAX_DEFAULT,
            poll: stream::POLL_DEFAULT,
            keepalive: stream::KEEPALIVE_DEFAULT,
            demo: None,
        }
    }
}

/// The routes, for `App::configure`.
pub fn routes(api: Api) -> impl FnOnce(&mut web::ServiceConfig) {
    move |config| {
        let limit = api.body_bytes_max;
        config
            .app_data(web::Data::new(api))
            .app_data(
                web::JsonConfig::default()
                    .limit(limit)
                    .content_type_required(false)
                    .error_handler(error::json_error(limit)),
            )
            .app_data(web::QueryConfig::default().error_handler(error::query_error))
            .app_data(web::PathConfig::default().error_handler(error::path_error))
            .route("/v1/sessions", web::post().to(api::create_session))
            .route("/v1/sessions/{sid}", web::delete().to(api::purge_session))
            .route("/v1/sessions/{sid}", web::get().to(messages::session))
            .route(
                "/v1/sessions/{sid}/compact",
                web::post().to(messages::compact),
            )
            .route(
                "/v1/sessions/{sid}/executions",
                web::post().to(api::start_execution),
            )
            .route(
                "/v1/sessions/{sid}/executions",
                web::get().to(api::list_executions),
            )
            .route("/v1/sessions/{sid}/activity", web::get().to(api::activity))
            .route(
                "/v1/sessions/{sid}/messages",
                web::get().to(messages::messages),
            )
            .route(
                "/v1/sessions/{sid}/stream",
                web::get().to(stream::session_stream),
            )
            .route(
                "/v1/sessions/{sid}/executions/{eid}",
                web::get().to(api::snapshot),
            )
            .route(
                "/v1/sessions/{sid}/executions/{eid}/commands",
                web::post().to(api::command),
            )
            .route(
                "/v1/sessions/{sid}/executions/{eid}/events",
                web::get().to(api::events),
            )
            .route(
                "/v1/sessions/{sid}/executions/{eid}/events/stream",
                web::get().to(stream::events_stream),
            )
            .route(
                "/v1/sessions/{sid}/commands/{cid}",
                web::get().to(api::command_status),
            )
            .route("/v1/resources", web::get().to(resources::resources))
            .route("/v1/functions", web::get().to(resources::functions))
            .route("/debug/actors", web::get().to(debug::actors))
            .route("/debug/actors/{id}", web::get().to(debug::actor))
            .route("/debug/log", web::get().to(debug::log))
            .route("/debug/log/stream", web::get().to(stream::log_stream))
            .route("/debug/nodes", web::get().to(debug::nodes))
            .route("/debug/executions", web::get().to(debug::executions))
            .route("/debug/overview", web::get().to(debug::overview))
            .route("/debug/figures", web::get().to(debug::figures))
            .route("/debug/demo", web::get().to(debug::demo))
            .route("/metrics", web::get().to(debug::metrics))
            .route("/health", web::get().to(debug::health))
            .route("/openapi.json", web::get().to(openapi))
            .route("/login", web::get().to(login))
            .route("/", web::get().to(page))
            .route("/page/{file}", web::get().to(page_asset))
            .default_service(web::to(error::no_route));
    }
}

/// The OpenAPI 3 document of this API, written by hand (`openapi.json` beside this file).
pub const OPENAPI_JSON: &str = include_str!("openapi.json");

async fn openapi() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(OPENAPI_JSON)
}

/// `GET /login?code=…` (`signin.rs`): the page signed in by a one-time link.
async fn login(api: web::Data<Api>, query: web::Query<signin::LoginQuery>) -> HttpResponse {
    signin::login(api.tokens.sign_in(), &query)
}

/// The page for people (`page/` beside this file), in the binary: its markup, styles and
/// scripts by name, with their content types. No data in them: the scripts read the API with
/// the token the user enters or the sign-in cookie.
const PAGE_FILES: &[(&str, &str, &str)] = &[
    ("index.html", "text/html; charset=utf-8", include_str!("page/index.html")),
    ("page.css", "text/css; charset=utf-8", include_str!("page/page.css")),
    ("core.js", JS, include_str!("page/core.js")),
    ("session.js", JS, include_str!("page/session.js")),
    ("decisions.js", JS, include_str!("page/decisions.js")),
    ("lanes.js", JS, include_str!("page/lanes.js")),
    ("execution.js", JS, include_str!("page/execution.js")),
    ("overview.js", JS, include_str!("page/overview.js")),
    ("composer.js", JS, include_str!("page/composer.js")),
    ("start.js", JS, include_str!("page/start.js")),
];
const JS: &str = "text/javascript; charset=utf-8";

/// `GET /`: the page.
async fn page() -> HttpResponse {
    page_file("index.html")
}

/// `GET /page/{file}`: one of the page's files; any other name is not found.
async fn page_asset(file: web::Path<String>) -> HttpResponse {
    page_file(&file)
}

fn page_file(name: &str) -> HttpResponse {
    let Some((_, content_type, body)) = PAGE_FILES.iter().find(|(file, ..)| *file == name) else {
        return HttpResponse::NotFound().json(serde_json::json!({
            "code": "not_found",
            "message": format!("the page has no file {name}"),
        }));
    };
    HttpResponse::Ok()
        .content_type(*content_type)
        // Only the page's own files run or style it (nothing inline, no third-party code),
        // and it is never framed by another site (clickjacking of Stop/Cancel).
        .insert_header((
            "Content-Security-Policy",
            "default-src 'self'; frame-ancestors 'none'",
        ))
        .insert_header(("X-Frame-Options", "DENY"))
        .insert_header(("X-Content-Type-Options", "nosniff"))
        // A new build's page is read at the next load.
        .insert_header(("Cache-Control", "no-cache"))
        .body(*body)
}

/// Binds `listen` and starts the server (two workers, signals left to `serve`). Returns
/// the server to await and the addresses it listens on.
pub fn start(api: Api, listen: &str) -> std::io::Result<(actix_web::dev::Server, Vec<SocketAddr>)> {
    let server = HttpServer::new(move || {
        App::new()
            .wrap(actix_web::middleware::from_fn(stopped_store))
            .wrap(actix_web::middleware::from_fn(token_first))
            .configure(routes(api.clone()))
    })
    .workers(2)
    .disable_signals()
    // Event streams never end by themselves: a stop closes them after this.
    .shutdown_timeout(1)
    .bind(listen)?;
    let addrs = server.addrs();
    Ok((server.run(), addrs))
}

/// Checks the token before anything reads the body: a request without a valid token gets
/// 401, never a 400 or 413 that would tell an anonymous client how its body was judged.
/// Handlers check again (the session's own rules, X-1); this only turns away early.
async fn token_first(
    request: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody + 'static>,
) -> Result<actix_web::dev::ServiceResponse<actix_web::body::BoxBody>, actix_web::Error> {
    use actix_web::ResponseError as _;
    let path = request.path().to_owned();
    let public = matches!(path.as_str(), "/" | "/health" | "/openapi.json" | "/login")
        || path.starts_with("/page/");
    let allowed = match request.app_data::<web::Data<Api>>() {
        _ if public => true,
        None => true,
        Some(api) => {
            let token = auth::bearer(request.request());
            match (token, path.strip_prefix("/v1/sessions/")) {
                // The page signed in (a cookie, never beside a token): as the admin token.
                (None, _) => api.tokens.sign_in().admits(request.request()),
                // A session's routes: its token or the admin's. A segment that is not a
                // session id as written (malformed, percent-encoded, `..`) reaches only the
                // admin (whose handler then answers 404).
                (Some(token), Some(rest)) => match rest.split('/').next().map(str::parse) {
                    Some(Ok(session)) => api.tokens.allows_session(token, session),
                    _ => api.tokens.is_admin(token),
                },
                (Some(token), None) => {
                    // Everything else that is a route needs the admin token; an unknown
                    // path is answered 404 by the handler.
                    let admin_only = path == "/v1/sessions"
                        || path == "/v1/resources"
                        || path == "/metrics"
                        || path.starts_with("/debug/");
                    !admin_only || api.tokens.is_admin(token)
                }
            }
        }
    };
    if allowed {
        return Ok(next.call(request).await?.map_into_boxed_body());
    }
    let response = error::ApiError::unauthorized().error_response();
    Ok(request.into_response(response))
}

/// Once the store has stopped (a write or fsync failed), a request that meets the storage
/// engine's error answers 503 `fail_stop` as the refused writes do, not a 500: sled
/// reorganises its index as it reads (a node split is a write), so even a read can need the
/// disk that failed.
async fn stopped_store(
    request: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody + 'static>,
) -> Result<actix_web::dev::ServiceResponse<actix_web::body::BoxBody>, actix_web::Error> {
    use actix_web::ResponseError as _;
    let api = request.app_data::<web::Data<Api>>().cloned();
    let response = next.call(request).await?.map_into_boxed_body();
    let storage_io = response
        .response()
        .error()
        .and_then(|error| error.as_error::<error::ApiError>())
        .is_some_and(|error| error.code == "storage_io");
    if !storage_io || api.and_then(|api| api.runtime.store().failure()).is_none() {
        return Ok(response);
    }
    let stopped = error::ApiError::new(
        actix_web::http::StatusCode::SERVICE_UNAVAILABLE,
        "fail_stop",
        "the store stopped after a failed write or fsync, and this request needed the disk \
         (the storage engine also writes as it reads); restart the process once the disk is \
         healthy",
    );
    let (request, _) = response.into_parts();
    Ok(actix_web::dev::ServiceResponse::new(
        request,
        stopped.error_response(),
    ))
}

/// Whether `listen` names only loopback addresses (X-2: anything else needs a token the
/// operator chose).
pub fn is_loopback(listen: &str) -> bool {
    use std::net::ToSocketAddrs as _;
    match listen.to_socket_addrs() {
        Ok(addrs) => {
            let addrs: Vec<_> = addrs.collect();
            !addrs.is_empty() && addrs.iter().all(|addr| addr.ip().is_loopback())
        }
        Err(_) => false,
    }
}
