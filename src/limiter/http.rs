//! HTTP transport: `POST /v1/check` (JSON), plus `/metrics`, `/healthz` and
//! `/readyz` for operators.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::grpc::native_decision;
use super::service::{NativeCheck, Service};
use crate::proto::meridian::v1 as native;

/// Request bodies larger than this are refused with 413.
pub const MAX_BODY: usize = 1 << 20;

/// What the HTTP handlers share: the service and the metrics exporter.
#[derive(Clone)]
pub struct HttpState {
    /// The same service the gRPC transports use.
    pub limiter: Arc<Service>,
    /// Renders `/metrics` (the Prometheus recorder installed at start-up).
    pub metrics: PrometheusHandle,
}

pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/v1/check", post(check))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(state)
}

/// One check in JSON; the same fields as the native gRPC `Check`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonCheck {
    domain: String,
    #[serde(default)]
    rule: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    descriptor: Vec<JsonEntry>,
    #[serde(default)]
    cost: u64,
    #[serde(default)]
    check_only: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    key: String,
    value: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonBatch {
    checks: Vec<JsonCheck>,
}

/// The native `Decision`, as JSON.
#[derive(Debug, Serialize)]
struct JsonDecision {
    allowed: bool,
    matched: bool,
    limit: u64,
    remaining: u64,
    reset_after_us: u64,
    retry_after_us: u64,
    delay_us: u64,
    rule: String,
    shadow_denied: bool,
    reason: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    error: String,
}

impl From<native::Decision> for JsonDecision {
    fn from(d: native::Decision) -> Self {
        JsonDecision {
            allowed: d.allowed,
            matched: d.matched,
            limit: d.limit,
            remaining: d.remaining,
            reset_after_us: d.reset_after_us,
            retry_after_us: d.retry_after_us,
            delay_us: d.delay_us,
            rule: d.rule,
            shadow_denied: d.shadow_denied,
            reason: d.reason,
            error: d.error,
        }
    }
}

fn bad_request(message: impl std::fmt::Display) -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(json!({ "error": message.to_string() })),
    )
        .into_response()
}

/// One check object, or `{"checks": [...]}` for a batch. 200 when every check
/// is allowed, 429 when any is denied, 400 for malformed input.
async fn check(State(state): State<HttpState>, body: Bytes) -> Response {
    let value: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return bad_request(format!("invalid JSON: {e}")),
    };
    let batch = value.get("checks").is_some();
    let parsed = if batch {
        serde_json::from_value::<JsonBatch>(value).map(|b| b.checks)
    } else {
        serde_json::from_value::<JsonCheck>(value).map(|c| vec![c])
    };
    let checks: Vec<NativeCheck> = match parsed {
        Ok(checks) => checks.into_iter().map(native_check).collect(),
        Err(e) => return bad_request(format!("invalid check: {e}")),
    };
    let results = match state.limiter.check_batch(&checks).await {
        Ok(r) => r,
        Err(e) => return bad_request(e),
    };
    let decisions: Vec<native::Decision> = results.iter().map(native_decision).collect();
    if !batch
        && let Some(error) = decisions
            .first()
            .map(|d| &d.error)
            .filter(|e| !e.is_empty())
    {
        return bad_request(error);
    }
    let denied = decisions.iter().any(|d| !d.allowed && d.error.is_empty());
    let status = if denied {
        StatusCode::TOO_MANY_REQUESTS
    } else {
        StatusCode::OK
    };
    let headers = rate_limit_headers(&decisions);
    let body = if batch {
        let decisions: Vec<JsonDecision> = decisions.into_iter().map(Into::into).collect();
        json!({ "decisions": decisions })
    } else {
        let decision = decisions.into_iter().next().map(JsonDecision::from);
        json!(decision)
    };
    (status, headers, axum::Json(body)).into_response()
}

fn native_check(c: JsonCheck) -> NativeCheck {
    NativeCheck {
        domain: c.domain,
        rule: c.rule,
        key: c.key,
        descriptor: c.descriptor.into_iter().map(|e| (e.key, e.value)).collect(),
        cost: c.cost,
        check_only: c.check_only,
    }
}

/// RateLimit-Limit/-Remaining/-Reset (seconds) of the tightest matched check,
/// and Retry-After (seconds) when it is denied.
fn rate_limit_headers(decisions: &[native::Decision]) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let tightest = decisions
        .iter()
        .filter(|d| d.matched && d.limit > 0)
        .min_by_key(|d| (d.allowed, d.remaining));
    let Some(d) = tightest else {
        return headers;
    };
    let mut put = |name: &'static str, value: u64| {
        headers.insert(HeaderName::from_static(name), HeaderValue::from(value));
    };
    put("ratelimit-limit", d.limit);
    put("ratelimit-remaining", d.remaining);
    put("ratelimit-reset", d.reset_after_us.div_ceil(1_000_000));
    if !d.allowed {
        put("retry-after", d.retry_after_us.div_ceil(1_000_000));
    }
    headers
}

async fn metrics(State(state): State<HttpState>) -> String {
    state.limiter.engine.report_gauges();
    state.metrics.render()
}

/// Ready when the store answers.
async fn ready(State(state): State<HttpState>) -> Response {
    match state.limiter.engine.store().ping().await {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("store unreachable: {e}\n"),
        )
            .into_response(),
    }
}
