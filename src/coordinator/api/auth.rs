//! What a write passes before its handler looks at it: the body, read within
//! its size limit, and the admin bearer token.

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use serde::Deserialize;
use tokio_stream::StreamExt;

use super::Api;
use super::errors::ApiError;

/// Largest request body accepted (a whole rule set); larger gets 413.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// How much of an oversized body is read and dropped so the client gets its
/// 413; beyond this the connection is simply closed.
const DRAIN_LIMIT_BYTES: usize = 64 * 1024 * 1024;

/// Checks `Authorization: Bearer <admin token>`.
pub(super) fn authorize(api: &Api, headers: &HeaderMap) -> Result<(), ApiError> {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let Some(given) = given else {
        return Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "writes need an `Authorization: Bearer <admin token>` header",
        ));
    };
    // Compare every byte so the time taken does not reveal a matching prefix.
    let expected = api.node.admin_token.as_bytes();
    let same = given.len() == expected.len()
        && given
            .bytes()
            .zip(expected)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0;
    if same {
        Ok(())
    } else {
        Err(ApiError::new(StatusCode::UNAUTHORIZED, "wrong admin token"))
    }
}

/// Reads a request body of at most [`MAX_BODY_BYTES`]. A larger body is
/// still read (and dropped) up to [`DRAIN_LIMIT_BYTES`] before the 413: a
/// server that answers without reading the body closes the connection under
/// the client, which then sees a reset instead of the JSON error.
pub(super) async fn read_body(body: Body) -> Result<Bytes, ApiError> {
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
        if total <= MAX_BODY_BYTES {
            kept.extend_from_slice(&chunk);
        } else if total > DRAIN_LIMIT_BYTES {
            break;
        }
    }
    if total > MAX_BODY_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body is larger than {MAX_BODY_BYTES} bytes"),
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
