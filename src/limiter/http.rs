//! HTTP transport: `POST /v1/check` (JSON), `/v1/reserve`, `/v1/commit`
//! and `/v1/release` (`http_reserve`), envoyproxy/ratelimit's
//! `POST /json` (an Envoy `RateLimitRequest` in proto3 JSON), plus
//! `/metrics`, `/healthz` and `/readyz` for operators. Its connections are
//! capped and timed by `crate::serve` with [`HttpListenerArgs`].

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::grpc::{native_decision, respond};
use super::rls_json;
use super::service::{MAX_ENTRIES, NativeCheck, Service};
use crate::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;
use crate::proto::meridian::v1 as native;

/// Request bodies larger than this are refused with 413.
pub const MAX_BODY: usize = 1 << 20;

/// What a reserve connection answers (see `crate::serve`): the probes.
pub const PROBES: &[&str] = &["/healthz", "/readyz"];

/// `--http-*` connection options of `meridian limiter`.
#[derive(clap::Args, Debug, Clone)]
pub struct HttpListenerArgs {
    /// Most connections the HTTP port holds at once, over all workers. When
    /// all are held, an idle one (no request in flight) is closed for the
    /// newcomer, from the address holding the most; when all are busy,
    /// /healthz and /readyz are still answered on a few reserve
    /// connections and other requests get 503. Memory: each connection
    /// reads at most a 64 KiB head and a 1 MiB body at a time.
    #[arg(long, default_value_t = 1024)]
    pub http_max_connections: usize,
    /// How long a connection gets for its first request head; one that has
    /// not sent it is closed.
    #[arg(long, default_value = "5s", value_parser = crate::rules::parse_duration)]
    pub http_header_timeout: Duration,
    /// How long a connection stays open with no request in flight.
    #[arg(long, default_value = "30s", value_parser = crate::rules::parse_duration)]
    pub http_idle_timeout: Duration,
    /// How long a request body may take to arrive after its head; a slower
    /// one is refused (400) and its connection closed.
    #[arg(long, default_value = "10s", value_parser = crate::rules::parse_duration)]
    pub http_body_timeout: Duration,
}

impl HttpListenerArgs {
    /// The bounds `crate::serve` applies.
    pub fn limits(&self) -> crate::serve::Limits {
        crate::serve::Limits {
            header_timeout: self.http_header_timeout,
            idle_timeout: self.http_idle_timeout,
            body_timeout: self.http_body_timeout,
        }
    }
}

/// What the HTTP handlers share: the service and the metrics exporter.
#[derive(Clone)]
pub struct HttpState {
    /// The same service the gRPC transports use.
    pub limiter: Arc<Service>,
    /// Renders `/metrics` (the Prometheus recorder installed at start-up).
    pub metrics: PrometheusHandle,
    /// `--response-headers`: `POST /json` answers carry RateLimit-* entries
    /// in `responseHeadersToAdd`, as the gRPC service's do.
    pub response_headers: bool,
}

/// The reservation handlers (`http_reserve`) need only the service.
impl axum::extract::FromRef<HttpState> for Arc<Service> {
    fn from_ref(state: &HttpState) -> Arc<Service> {
        state.limiter.clone()
    }
}

pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/v1/check", post(check))
        .route("/v1/reserve", post(super::http_reserve::reserve))
        .route("/v1/commit", post(super::http_reserve::commit))
        .route("/v1/release", post(super::http_reserve::release))
        .route("/json", post(envoy_json))
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

/// A body's checks, and whether it was a batch: one check object, or
/// `{"checks": [...]}`. The error
/// names the field or the line and column at fault. serde_json bounds
/// nesting (128 levels) before it could exhaust the stack.
fn parse_checks(body: &[u8]) -> Result<(Vec<JsonCheck>, bool), String> {
    // Parsed from the bytes straight into the structs, never through a
    // `Value` (which keeps the last of two equal keys): a duplicate field is
    // refused, naming it, with its line and column.
    let positioned = |e: serde_json::Error| {
        if e.is_data() {
            format!("invalid check: {e}")
        } else {
            format!("invalid JSON: {e}")
        }
    };
    let batch = match serde_json::from_slice::<Shape>(body) {
        Ok(shape) => shape.checks.is_some(),
        Err(e) if e.is_data() => false,
        Err(e) => return Err(positioned(e)),
    };
    let checks = if batch {
        serde_json::from_slice::<JsonBatch>(body).map(|b| b.checks)
    } else {
        serde_json::from_slice::<JsonCheck>(body).map(|c| vec![c])
    }
    .map_err(positioned)?;
    // Refused whole, as the docs say, not decided check by check.
    for (i, c) in checks.iter().enumerate() {
        if c.descriptor.len() > MAX_ENTRIES {
            let field = if batch {
                format!("checks[{i}].descriptor")
            } else {
                "descriptor".to_owned()
            };
            return Err(format!(
                "{field}: {} entries, at most {MAX_ENTRIES} (the request is refused whole)",
                c.descriptor.len()
            ));
        }
    }
    Ok((checks, batch))
}

/// A body's top level, skimmed (values skipped) to tell a batch from one
/// check before either is parsed.
#[derive(Deserialize)]
struct Shape {
    checks: Option<serde::de::IgnoredAny>,
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
    let (checks, batch) = match parse_checks(&body) {
        Ok(parsed) => parsed,
        Err(e) => return bad_request(e),
    };
    let checks: Vec<NativeCheck> = checks.into_iter().map(native_check).collect();
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

/// envoyproxy/ratelimit's `POST /json`: 200 with the response when every
/// descriptor is OK, 429 with it when any is OVER_LIMIT, 400 naming the
/// field for a body that is not a `RateLimitRequest` (or a request the
/// gRPC service refuses as INVALID_ARGUMENT). Bodies are bounded by
/// [`MAX_BODY`], descriptors by the service's own limits.
async fn envoy_json(State(state): State<HttpState>, body: Bytes) -> Response {
    let request = match rls_json::parse_request(&body) {
        Ok(request) => request,
        Err(e) => return bad_request(e),
    };
    let response = match respond(&state.limiter, state.response_headers, request).await {
        Ok(response) => response,
        Err(e) => return bad_request(e),
    };
    let status = if response.overall_code == Code::OverLimit as i32 {
        StatusCode::TOO_MANY_REQUESTS
    } else {
        StatusCode::OK
    };
    (status, axum::Json(rls_json::response_json(&response))).into_response()
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
    state.limiter.report_gauges();
    state.metrics.render()
}

/// Ready when the store answers.
async fn ready(State(state): State<HttpState>) -> Response {
    // Informational: a limiter on the wrong interval still serves checks.
    let global = &state.limiter.global;
    let reporting = if global.reports() {
        let (interval, source) = global.report_interval();
        // What global rules are enforced against: with no coordinator
        // answering, a restored table or nothing (every check denied).
        format!(
            "report interval: {} ({})\n{}\n",
            flag_text(interval),
            source.as_str(),
            global.allocation_status()
        )
    } else {
        String::new()
    };
    match state.limiter.engine.store().ping().await {
        Ok(()) => (StatusCode::OK, format!("ready\n{reporting}")).into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("store unreachable: {e}\n{reporting}"),
        )
            .into_response(),
    }
}

/// `1s`, `500ms`, `1.5s`: as the flags are written.
fn flag_text(d: std::time::Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1_000) {
        format!("{}s", ms / 1_000)
    } else if ms < 1_000 {
        format!("{ms}ms")
    } else {
        format!("{}s", ms as f64 / 1_000.0)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Every refusal says where: a field by name or a line and column.
    fn says_where(e: &str) -> bool {
        e.contains(" line ") && e.contains(" column ") || e.contains('`')
    }

    fn valid_body() -> impl Strategy<Value = String> {
        let check = (
            "[a-z]{0,8}",
            "[a-z|=%]{0,8}",
            "[a-z]{0,8}",
            0u64..1000,
            any::<bool>(),
        )
            .prop_map(|(domain, key, value, cost, check_only)| {
                json!({
                    "domain": domain,
                    "descriptor": [{"key": key, "value": value}],
                    "cost": cost,
                    "check_only": check_only,
                })
            });
        (prop::collection::vec(check, 1..4), any::<bool>()).prop_map(|(checks, batch)| {
            if batch {
                json!({ "checks": checks }).to_string()
            } else {
                checks[0].to_string()
            }
        })
    }

    #[test]
    fn type_errors_name_their_position_and_unknown_fields_their_name() {
        let e = parse_checks(br#"{"domain": "api", "cost": "ten"}"#).unwrap_err();
        assert!(e.contains("line 1 column"), "{e}");
        let e = parse_checks(br#"{"checks": [{"domain": "api", "kost": 1}]}"#).unwrap_err();
        assert!(e.contains("`kost`"), "{e}");
        // Deep nesting is an error, never a stack overflow: refused at the
        // first value of the wrong type (serde_json skips an unread value
        // without recursing, and bounds the depth of what it reads).
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let e = parse_checks(deep.as_bytes()).unwrap_err();
        assert!(e.contains("line 1 column"), "{e}");
        let deep = format!(
            r#"{{"checks": {}{}}}"#,
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        let e = parse_checks(deep.as_bytes()).unwrap_err();
        assert!(e.contains("line 1 column 13"), "{e}");
        let e = parse_checks(br#"{"domain": "api", "domain": "x"}"#).unwrap_err();
        assert!(e.contains("duplicate field `domain`"), "{e}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn random_bodies_never_panic_and_errors_say_where(body in prop::collection::vec(any::<u8>(), 0..256)) {
            if let Err(e) = parse_checks(&body) {
                prop_assert!(says_where(&e), "{e}");
            }
        }

        #[test]
        fn mutated_valid_bodies_never_panic_and_errors_say_where(
            body in valid_body(),
            edits in prop::collection::vec((any::<prop::sample::Index>(), prop::sample::select(
                &["", "{", "}", "[", "]", "\"", ",", ":", "1", "-1", "null", "true", "\\u0000", "\"x\":1,"][..]
            ), any::<bool>()), 0..4),
        ) {
            prop_assert!(parse_checks(body.as_bytes()).is_ok(), "valid: {body}");
            let mut text = body.into_bytes();
            for (at, insert, delete) in edits {
                let at = at.index(text.len() + 1);
                if delete && at < text.len() {
                    text.remove(at);
                }
                text.splice(at..at, insert.bytes());
            }
            if let Err(e) = parse_checks(&text) {
                prop_assert!(says_where(&e), "{e}: {}", String::from_utf8_lossy(&text));
            }
        }
    }
}
