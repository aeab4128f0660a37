//! How a read is served: from this node's applied state (`"consistency":
//! "local"`), or with `?consistent=true` after a quorum confirmed this node
//! leads (`"linearizable"`). A follower asked for a consistent read relays
//! it to the leader once and returns the leader's answer as is.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};

use super::auth::check_token;
use super::errors::ApiError;
use super::{Api, is_relayed};
use crate::coordinator::node::{FORWARDED_HEADER, ReadError};
use crate::coordinator::raft::Member;
use crate::coordinator::raft::storage::Applied;

/// The extractor every read handler starts from. Its rejection is a whole
/// answer: the leader's, when the read was relayed, or a 503 when this node
/// cannot serve a consistent read.
pub(super) struct Read {
    /// `"local"` or `"linearizable"`; each read echoes it in its body so a
    /// client sees which guarantee it got.
    pub consistency: &'static str,
    /// The applied state, taken once after the read mode was settled, so a
    /// handler renders one snapshot even while the state machine applies
    /// entries meanwhile (a cheap `Arc` clone, no lock held).
    pub state: Arc<Applied>,
}

impl FromRequestParts<Api> for Read {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, api: &Api) -> Result<Read, Response> {
        if let Some(read_token) = &api.read_token {
            let accepted = [read_token.as_str(), api.node.admin_token.as_str()];
            check_token(parts, &accepted, "read")
                .await
                .map_err(IntoResponse::into_response)?;
        }
        let consistency = read_mode(api, &parts.uri, &parts.headers).await?;
        Ok(Read {
            consistency,
            state: api.node.applied.borrow().clone(),
        })
    }
}

fn wants_consistent(uri: &Uri) -> bool {
    uri.query().is_some_and(|q| {
        q.split('&')
            .any(|kv| kv == "consistent=true" || kv == "consistent=1")
    })
}

/// `Ok(consistency)` to answer locally, or the answer to send instead.
async fn read_mode(api: &Api, uri: &Uri, headers: &HeaderMap) -> Result<&'static str, Response> {
    if !wants_consistent(uri) {
        return Ok("local");
    }
    match api.node.linearizable().await {
        Ok(()) => Ok("linearizable"),
        // A relayed read that lands on a non-leader (leadership moved in
        // between) is not relayed again: the client retries instead.
        Err(ReadError::NotLeader(Some(leader))) if !is_relayed(headers) => {
            Err(relay_read(api, &leader, uri).await)
        }
        Err(e) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("cannot serve a consistent read here: {e}; retry"),
        )
        .into_response()),
    }
}

async fn relay_read(api: &Api, leader: &Member, uri: &Uri) -> Response {
    match relay_get(api, leader, uri, None).await {
        Ok(response) => response,
        Err(e) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("leader unreachable for a consistent read: {e}; retry"),
        )
        .into_response(),
    }
}

/// Sends this GET (same path and query) to the leader, marked as relayed,
/// and returns the leader's answer as is; `Err` when the leader could not be
/// reached or its answer not read, or not within `deadline` (else the
/// node's client timeout).
pub(super) async fn relay_get(
    api: &Api,
    leader: &Member,
    uri: &Uri,
    deadline: Option<std::time::Duration>,
) -> Result<Response, String> {
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let url = format!("{}{path}", api.node.transport.url(&leader.http_addr));
    let mut request = api.node.http.get(url);
    if let Some(deadline) = deadline {
        request = request.timeout(deadline);
    }
    let response = request
        .header(FORWARDED_HEADER, "1")
        // Nodes share the admin token; it also passes a read token check.
        .bearer_auth(&api.node.admin_token)
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status =
        StatusCode::from_u16(response.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let bytes = response
        .bytes()
        .await
        .map_err(|e| format!("reading leader answer: {e}"))?;
    Ok((status, [(header::CONTENT_TYPE, "application/json")], bytes).into_response())
}
