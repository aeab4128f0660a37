//! HTTP transport of reservations: `POST /v1/reserve`, `/v1/commit` and
//! `/v1/release` (docs/cost-quotas.md), JSON in the field conventions of
//! `/v1/check`. Numbers are read from their JSON text, so that `-1`, `1.5`,
//! `1e400`, `"7"` and values past u64 are each refused naming the field
//! (a plain u64 field would fail inside the JSON parser, naming a column).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;

use super::grpc::reservations;
use super::service::{MAX_ENTRIES, Service};
use crate::proto::meridian::v1 as native;
use crate::store::reservation::ReservationError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonReserve {
    domain: String,
    #[serde(default)]
    rule: String,
    #[serde(default)]
    key: String,
    #[serde(default)]
    descriptor: Vec<JsonEntry>,
    estimate: Option<Box<RawValue>>,
    ttl_ms: Option<Box<RawValue>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    key: String,
    value: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonSettle {
    id: String,
    actual: Option<Box<RawValue>>,
}

/// `{"domain", "rule"+"key" | "descriptor", "estimate", "ttl_ms"}` → 200
/// admitted, 429 not (with Retry-After), 400 naming the field.
pub(super) async fn reserve(State(limiter): State<Arc<Service>>, body: Bytes) -> Response {
    let parsed: JsonReserve = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                None,
                format!("invalid reserve: {e}"),
            );
        }
    };
    if parsed.descriptor.len() > MAX_ENTRIES {
        return problem(
            StatusCode::BAD_REQUEST,
            Some("descriptor"),
            format!("{} entries, at most {MAX_ENTRIES}", parsed.descriptor.len()),
        );
    }
    let (estimate, ttl_ms) = match (
        whole("estimate", parsed.estimate.as_deref()),
        whole("ttl_ms", parsed.ttl_ms.as_deref()),
    ) {
        (Ok(e), Ok(t)) => (e, t),
        (Err(r), _) | (_, Err(r)) => return r,
    };
    let request = reservations::request(native::ReserveRequest {
        domain: parsed.domain,
        rule: parsed.rule,
        key: parsed.key,
        descriptor: parsed
            .descriptor
            .into_iter()
            .map(|e| native::Entry {
                key: e.key,
                value: e.value,
            })
            .collect(),
        estimate,
        ttl_ms,
    });
    match limiter.reserve(&request).await {
        Ok(answer) => {
            let wire = reservations::reserved(&answer);
            let mut headers = HeaderMap::new();
            let status = if wire.admitted {
                StatusCode::OK
            } else {
                headers.insert(
                    HeaderName::from_static("retry-after"),
                    HeaderValue::from(wire.retry_after_us.div_ceil(1_000_000)),
                );
                StatusCode::TOO_MANY_REQUESTS
            };
            let limits: Vec<_> = wire
                .limits
                .iter()
                .map(|l| json!({"limit": l.limit, "remaining": l.remaining, "reset_after_us": l.reset_after_us}))
                .collect();
            let body = json!({
                "admitted": wire.admitted,
                "matched": wire.matched,
                "id": wire.id,
                "rule": wire.rule,
                "retry_after_us": wire.retry_after_us,
                "reason": wire.reason,
                "limits": limits,
            });
            (status, headers, axum::Json(body)).into_response()
        }
        Err(e) => error(e),
    }
}

/// `{"id", "actual"}` → 200 with what was refunded or charged.
pub(super) async fn commit(State(limiter): State<Arc<Service>>, body: Bytes) -> Response {
    let parsed: JsonSettle = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                None,
                format!("invalid commit: {e}"),
            );
        }
    };
    let actual = match parsed.actual.as_deref() {
        None => {
            return problem(
                StatusCode::BAD_REQUEST,
                Some("actual"),
                "invalid actual: missing (the real cost; 0 to release everything)".to_owned(),
            );
        }
        Some(raw) => match whole("actual", Some(raw)) {
            Ok(a) => a,
            Err(r) => return r,
        },
    };
    settled(limiter.commit(&parsed.id, actual).await)
}

/// `{"id"}` → 200 with the whole estimate refunded.
pub(super) async fn release(State(limiter): State<Arc<Service>>, body: Bytes) -> Response {
    let parsed: JsonSettle = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return problem(
                StatusCode::BAD_REQUEST,
                None,
                format!("invalid release: {e}"),
            );
        }
    };
    if parsed.actual.is_some() {
        return problem(
            StatusCode::BAD_REQUEST,
            Some("actual"),
            "invalid actual: a release takes none (commit with an actual instead)".to_owned(),
        );
    }
    settled(limiter.release(&parsed.id).await)
}

fn settled(result: Result<crate::limiter::reserve::SettleAnswer, ReservationError>) -> Response {
    match result {
        Ok(answer) => {
            let wire = reservations::settled(&answer);
            let limits: Vec<_> = wire
                .limits
                .iter()
                .map(|l| json!({"limit": l.limit, "remaining": l.remaining, "refunded": l.refunded, "charged": l.charged}))
                .collect();
            axum::Json(json!({
                "replayed": wire.replayed,
                "released": wire.released,
                "estimate": wire.estimate,
                "actual": wire.actual,
                "refunded": wire.refunded,
                "charged": wire.charged,
                "uncharged": wire.uncharged,
                "limits": limits,
            }))
            .into_response()
        }
        Err(e) => error(e),
    }
}

/// A JSON number that is a whole number from 0 to u64::MAX, read from its
/// text (absent: 0, which the service refuses where 0 is wrong).
#[allow(clippy::result_large_err)]
fn whole(field: &'static str, raw: Option<&RawValue>) -> Result<u64, Response> {
    let Some(raw) = raw else { return Ok(0) };
    let text = raw.get().trim();
    let refuse = |why: &str| {
        let shown: String = text.chars().take(40).collect();
        problem(
            StatusCode::BAD_REQUEST,
            Some(field),
            format!("invalid {field} {shown}: {why}"),
        )
    };
    if text.starts_with('"') {
        return Err(refuse("must be a JSON number, not a string"));
    }
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(refuse("must be a whole number of 0 or more"));
    }
    text.parse::<u64>()
        .map_err(|_| refuse("too large (at most 10^15)"))
}

fn error(e: ReservationError) -> Response {
    let status = match &e {
        ReservationError::Expired { .. } => StatusCode::GONE,
        other => match reservations::code(other) {
            tonic::Code::InvalidArgument => StatusCode::BAD_REQUEST,
            tonic::Code::NotFound => StatusCode::NOT_FOUND,
            tonic::Code::FailedPrecondition => StatusCode::CONFLICT,
            tonic::Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            tonic::Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        },
    };
    let field = match &e {
        ReservationError::Invalid(i) => Some(i.field),
        _ => None,
    };
    problem(status, field, e.to_string())
}

fn problem(status: StatusCode, field: Option<&'static str>, message: String) -> Response {
    let body = match field {
        Some(field) => json!({ "error": message, "field": field }),
        None => json!({ "error": message }),
    };
    (status, axum::Json(body)).into_response()
}
