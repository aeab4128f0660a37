//! The admin HTTP API (JSON), `/healthz`, `/readyz` and `/metrics`.
//!
//! Every answer is JSON; errors are `{"error": "...", ...}` (`errors.rs`).
//! Writes need `Authorization: Bearer <admin token>` (`auth.rs`) and are
//! forwarded to the leader (`write.rs`, `node.rs`). Reads answer from this
//! node's applied state unless `?consistent=true` (`read.rs`).
//!
//! One file per resource: `rules.rs` (its diffs computed and kept by
//! `rule_diffs.rs`), `regions.rs`, `overrides.rs`, `resets.rs`, `allocations.rs`,
//! `history.rs`, `ledger.rs`, `usage.rs`, `cluster.rs`, `events.rs`; the dashboard's page is
//! `dashboard.rs`; the route table below names every endpoint.

mod allocations;
mod auth;
mod cluster;
mod dashboard;
mod drills;
mod errors;
mod events;
mod history;
mod ledger;
mod listener;
mod overrides;
mod read;
mod ready;
mod regions;
mod resets;
mod rule_diffs;
mod rules;
mod usage;
mod write;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::json;

pub use self::listener::{AdminListenerArgs, serve_admin};
pub use self::rule_diffs::RuleDiffs;

use self::errors::ApiError;
use super::live::Live;
use crate::coordinator::allocator::Allocator;
use crate::coordinator::node::{FORWARDED_HEADER, Node};

/// What every handler shares. Cloned per request, which is cheap (`Arc`s, a
/// handle and a number); nothing in it is locked by the API.
#[derive(Clone)]
pub struct Api {
    /// Raft, the applied state reads are served from, and the write path.
    pub node: Arc<Node>,
    /// For what only the allocator knows and the applied state does not
    /// hold: the pods heard and the keys tracked (`/allocations`, `/leases`).
    pub allocator: Arc<Allocator>,
    /// The dashboard's history and live updates (`/api/v1/history`,
    /// `/api/v1/events`).
    pub live: Arc<Live>,
    /// Renders `/metrics`.
    pub prometheus: PrometheusHandle,
    /// `--shared-rule-floor`: see `validation::validate`.
    pub shared_rule_floor: f64,
    /// `--read-token-file`: when set, every read needs it (or the admin
    /// token); `None` leaves reads open.
    pub read_token: Option<String>,
    /// Rule diffs computed and kept (`/api/v1/rules/diff`), one node's worth.
    pub diffs: Arc<RuleDiffs>,
}

/// The admin API's routes, with request latency recorded per route.
pub fn router(api: Api) -> Router {
    Router::new()
        .route("/", get(dashboard::index))
        .route("/assets/{file}", get(dashboard::file))
        .route("/healthz", get(healthz))
        .route("/readyz", get(ready::readyz))
        .route("/metrics", get(prometheus))
        .route("/api/v1/rules", get(rules::get_rules).put(rules::put_rules))
        .route("/api/v1/rules/versions", get(rules::list_versions))
        .route("/api/v1/rules/versions/{n}", get(rules::get_version))
        .route("/api/v1/rules/diff", get(rules::diff))
        .route("/api/v1/rules/rollback", post(rules::rollback))
        .route("/api/v1/rules/rollout", post(rules::rollout))
        .route("/api/v1/regions", get(regions::list_regions))
        .route(
            "/api/v1/regions/{name}",
            get(regions::get_region)
                .put(regions::put_region)
                .delete(regions::delete_region),
        )
        .route(
            "/api/v1/drills",
            get(drills::list_drills).post(drills::start_drill),
        )
        .route("/api/v1/drills/{id}", get(drills::get_drill))
        .route("/api/v1/drills/{id}/stop", post(drills::stop_drill))
        .route("/api/v1/drills/{id}/report", get(drills::get_report))
        .route(
            "/api/v1/overrides",
            get(overrides::list_overrides)
                .put(overrides::put_override)
                .delete(overrides::delete_override),
        )
        .route(
            "/api/v1/overrides/import",
            post(overrides::import_overrides),
        )
        .route(
            "/api/v1/resets",
            get(resets::list_resets).post(resets::start_reset),
        )
        .route("/api/v1/resets/{id}", get(resets::get_reset))
        .route("/api/v1/allocations", get(allocations::get_allocations))
        .route("/api/v1/leases", get(allocations::get_leases))
        .route("/api/v1/history", get(history::get_history))
        .route("/api/v1/ledger", get(ledger::get_ledger))
        .route("/api/v1/usage", get(usage::get_usage))
        .route("/api/v1/usage/top", get(usage::get_top))
        .route("/api/v1/events", get(events::events))
        .route("/api/v1/cluster", get(cluster::cluster))
        .route("/api/v1/cluster/nodes", post(cluster::add_node))
        .route("/api/v1/cluster/nodes/{id}", delete(cluster::remove_node))
        .route(
            "/api/v1/internal/write",
            put(cluster::internal_write).post(cluster::internal_write),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .route_layer(middleware::from_fn(record_latency))
        // `auth::read_body` enforces the limit itself, so the client gets a
        // JSON 413 instead of axum's plain-text one.
        .layer(DefaultBodyLimit::disable())
        .with_state(api)
}

/// Whether another node relayed this request: such a request is never
/// relayed again, so two nodes that each think the other leads cannot
/// bounce it between them.
fn is_relayed(headers: &HeaderMap) -> bool {
    headers.contains_key(FORWARDED_HEADER)
}

async fn record_latency(path: Option<MatchedPath>, request: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = request.method().to_string();
    let route = path.map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let response = next.run(request).await;
    metrics::histogram!(
        "meridian_coordinator_api_request_seconds",
        "method" => method,
        "route" => route,
        "status" => response.status().as_u16().to_string(),
    )
    .record(start.elapsed().as_secs_f64());
    response
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no route for {}", uri.path()),
    )
}

async fn method_not_allowed(uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method not allowed on {}", uri.path()),
    )
}

/// `GET /healthz`: 200 while Raft runs, whoever leads.
async fn healthz(State(api): State<Api>) -> Response {
    let metrics = api.node.raft.metrics().borrow().clone();
    let status = if metrics.running_state.is_ok() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({
        "status": if status == StatusCode::OK { "ok" } else { "raft stopped" },
        "reason": metrics.running_state.as_ref().err().map(|fatal| fatal.to_string()),
        "node_id": api.node.id,
        "leader": metrics.current_leader,
        "term": metrics.current_term,
    });
    (status, Json(body)).into_response()
}

/// `GET /metrics`: the Prometheus text format.
async fn prometheus(State(api): State<Api>) -> Response {
    // Overrides held in this node's applied state, expired ones not yet
    // dropped included (they go with the next override change).
    let overrides = api.node.applied.borrow().registry.overrides.by_id.len();
    metrics::gauge!("meridian_overrides").set(overrides as f64);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        api.prometheus.render(),
    )
        .into_response()
}
