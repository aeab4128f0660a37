//! What a request passes before its handler looks at it: the bearer token,
//! checked from the headers first, then the body, read within its size
//! limit and deadline.

use std::net::SocketAddr;
use std::sync::LazyLock;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use metrics::counter;
use serde::Deserialize;
use tokio_stream::StreamExt;

use super::Api;
use super::errors::ApiError;
use crate::algorithm::{Algorithm, Params};
use crate::coordinator::drill::Actor;
use crate::store::{Limit, MemoryStore};

/// Largest request body accepted (a whole rule set); larger gets 413.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Largest body of a bulk override import, and of a write a follower
/// forwards to the leader (which may carry such an import): 100,000 rows
/// of CSV take about 5 MB, their forwarded change as JSON about 25 MB.
pub const MAX_BULK_BODY_BYTES: usize = 48 * 1024 * 1024;

/// How much of an oversized body is read and dropped so the client gets its
/// 413; beyond this the connection is simply closed.
const DRAIN_LIMIT_BYTES: usize = 64 * 1024 * 1024;

/// A failed token check answers only after this long: a guesser gets a
/// handful of tries per second per connection, and the connection cap bounds
/// the connections.
pub const AUTH_FAILURE_DELAY: Duration = Duration::from_millis(500);

/// Refused tokens one address may send per second (burst as many): past
/// it, a request is answered 429 without its token being compared, so
/// concurrent requests over HTTP/2 no longer multiply the guesses the
/// [`AUTH_FAILURE_DELAY`] allows (one address measured ~560 a second).
pub const REFUSALS_PER_SECOND: i64 = 20;

/// Addresses whose refusals are counted at once (an IPv6 client by its
/// /64). A budget refills within a second, so its entry goes soon after;
/// with every place taken by recent refusers, a new address is throttled
/// until one frees.
pub const REFUSAL_ADDRESSES: usize = 10_000;

/// Each address's refusals, one token bucket per address in Meridian's own
/// memory store. One admin API per process: the budget is the process's.
static REFUSALS: LazyLock<Option<(MemoryStore, Limit)>> = LazyLock::new(|| {
    let params = Params::new(
        Algorithm::TokenBucket,
        REFUSALS_PER_SECOND,
        Duration::from_secs(1),
        Some(REFUSALS_PER_SECOND),
    )
    .ok()?;
    let limit = Limit {
        rule: "admin_refusals".into(),
        params,
    };
    Some((MemoryStore::with_capacity(REFUSAL_ADDRESSES), limit))
});

/// Whether `peer` may have another token compared; charging one refusal
/// when `charge`.
fn refusal_budget(peer: Option<std::net::IpAddr>, charge: bool) -> bool {
    let (Some(peer), Some((store, limit))) = (peer, REFUSALS.as_ref()) else {
        return true;
    };
    let key = crate::slots::peer_group(peer).to_string();
    let now = crate::clock::now_unix_us();
    let decided = if charge {
        store.check_at(limit, &key, 1, now)
    } else {
        store.peek_at(limit, &key, now)
    };
    decided.is_ok_and(|d| d.allowed && (charge || d.remaining > 0))
}

/// A request body must arrive within this long once its headers did (a slow
/// body otherwise holds a connection, and its buffer, indefinitely).
pub const BODY_DEADLINE: Duration = Duration::from_secs(10);

/// A request that carries the admin token: checked from the headers alone,
/// before anything reads the body.
pub(super) struct Admin;

impl FromRequestParts<Api> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, api: &Api) -> Result<Admin, ApiError> {
        check_token(parts, &[api.node.admin_token.as_str()], "admin").await?;
        Ok(Admin)
    }
}

/// The body of an admin write, read (within `LIMIT` bytes, by default
/// [`MAX_BODY_BYTES`], and [`BODY_DEADLINE`]) only after the headers proved
/// the admin token.
pub(super) struct AdminBody<const LIMIT: usize = MAX_BODY_BYTES>(pub Bytes);

impl<const LIMIT: usize> FromRequest<Api> for AdminBody<LIMIT> {
    type Rejection = ApiError;

    async fn from_request(request: Request, api: &Api) -> Result<AdminBody<LIMIT>, ApiError> {
        let (mut parts, body) = request.into_parts();
        check_token(&mut parts, &[api.node.admin_token.as_str()], "admin").await?;
        match tokio::time::timeout(BODY_DEADLINE, read_body(body, LIMIT)).await {
            Ok(bytes) => Ok(AdminBody(bytes?)),
            Err(_) => Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {}s",
                    BODY_DEADLINE.as_secs()
                ),
            )),
        }
    }
}

/// Checks `Authorization: Bearer <token>` against `accepted`. A refusal is
/// logged with the peer and the route, counted in
/// `meridian_coordinator_auth_failures_total{kind, reason}` and answered
/// after [`AUTH_FAILURE_DELAY`].
pub(super) async fn check_token(
    parts: &mut Parts,
    accepted: &[&str],
    kind: &'static str,
) -> Result<(), ApiError> {
    let given = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let peer_addr = parts
        .extensions
        .get::<ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0);
    // An address out of refusals gets no comparison at all (a right token
    // too: telling it apart would answer the guess), and no log line.
    if given.is_some() && !refusal_budget(peer_addr.map(|p| p.ip()), false) {
        counter!("meridian_coordinator_auth_failures_total", "kind" => kind, "reason" => "throttled")
            .increment(1);
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "too many refused tokens from this address: at most {REFUSALS_PER_SECOND} a second"
            ),
        )
        .retry_after(1));
    }
    let refusal = match given {
        None => {
            let what = if kind == "admin" { "writes" } else { "reads" };
            let message = format!("{what} need an `Authorization: Bearer <{kind} token>` header");
            ("missing", message)
        }
        Some(given) if accepted.iter().any(|t| same(given, t)) => return Ok(()),
        Some(_) => ("wrong", format!("wrong {kind} token")),
    };
    if given.is_some() {
        refusal_budget(peer_addr.map(|p| p.ip()), true);
    }
    let peer = peer_addr.map(|p| p.to_string()).unwrap_or_default();
    tracing::warn!(%peer, path = %parts.uri.path(), reason = refusal.0, "{kind} request refused");
    counter!("meridian_coordinator_auth_failures_total", "kind" => kind, "reason" => refusal.0)
        .increment(1);
    tokio::time::sleep(AUTH_FAILURE_DELAY).await;
    Err(ApiError::new(StatusCode::UNAUTHORIZED, refusal.1))
}

/// Compares every byte, so the time taken does not reveal a matching prefix.
fn same(given: &str, expected: &str) -> bool {
    given.len() == expected.len()
        && given
            .bytes()
            .zip(expected.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

/// Reads a request body of at most `limit` bytes. A larger body is still
/// read (and dropped) up to [`DRAIN_LIMIT_BYTES`] before the 413: a server
/// that answers without reading the body closes the connection under the
/// client, which then sees a reset instead of the JSON error.
async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let mut stream = body.into_data_stream();
    let mut kept = Vec::new();
    let mut total = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("reading the request body: {e}"),
            )
        })?;
        total = total.saturating_add(chunk.len());
        if total <= limit {
            kept.extend_from_slice(&chunk);
        } else if total > DRAIN_LIMIT_BYTES.max(limit) {
            break;
        }
    }
    if total > limit {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body is larger than {limit} bytes"),
        ));
    }
    Ok(Bytes::from(kept))
}

/// Decodes a body read by [`read_body`]; a malformed one is a 400 naming the
/// serde error (unknown field, wrong type, position).
pub(super) fn parse_json<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))
}

/// Header naming the operator (ctl sends `$USER`): recorded, not verified.
pub const OPERATOR_HEADER: &str = "x-meridian-operator";

/// Longest operator name kept, in bytes.
const MAX_OPERATOR_BYTES: usize = 64;

/// Who is asking: the admin token's fingerprint (the token itself is never
/// stored), the client's address, and the operator name it gave.
pub(super) fn actor(api: &Api, headers: &HeaderMap, peer: &SocketAddr) -> Actor {
    let digest = ring::digest::digest(&ring::digest::SHA256, api.node.admin_token.as_bytes());
    let fingerprint: String = digest.as_ref()[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let operator = headers
        .get(OPERATOR_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.chars()
                .filter(|c| !c.is_control())
                .take(MAX_OPERATOR_BYTES)
                .collect::<String>()
        })
        .filter(|v| !v.is_empty());
    Actor {
        credential: format!("admin token sha256:{fingerprint}"),
        from: peer.to_string(),
        operator,
    }
}
