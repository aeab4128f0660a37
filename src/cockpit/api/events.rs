//! `GET /api/v1/events`: the dashboard's live updates as server-sent events.
//!
//! Every event is the node's latest update (`cockpit::live`): rendered
//! once per change for every listener, sent as `event: update`. A stream
//! that falls behind skips to the newest update. How many streams a node
//! serves, and how many of them requests without a token may hold in all
//! and per address, is `cockpit::viewers`; past a bound the request
//! gets 503 naming it. A wrong token counts as none, as on the other reads
//! without `--read-token-file`, but only after the wait, log line and count
//! of every refused token, so the seats kept for tokens are no quick oracle.
//! Streams end when the node shuts down; a dashboard reconnects by itself.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{ConnectInfo, FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::json;
use tokio_stream::wrappers::WatchStream;

use super::Api;
use super::auth::check_token;
use super::errors::ApiError;
use super::read::Read;
use crate::cockpit::viewers::{
    MAX_ANONYMOUS_EVENT_STREAMS, MAX_ANONYMOUS_EVENT_STREAMS_PER_PEER, MAX_EVENT_STREAMS, Refusal,
};

/// A comment line this often keeps proxies from closing an idle stream.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// Whether the request carries a right token (the admin token, or the
/// read token when one is set).
pub(super) struct Viewer {
    with_token: bool,
}

impl FromRequestParts<Api> for Viewer {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, api: &Api) -> Result<Viewer, Infallible> {
        if !parts.headers.contains_key(header::AUTHORIZATION) {
            return Ok(Viewer { with_token: false });
        }
        let mut accepted = vec![api.node.admin_token.as_str()];
        accepted.extend(api.read_token.as_deref());
        let with_token = check_token(parts, &accepted, "read").await.is_ok();
        Ok(Viewer { with_token })
    }
}

pub(super) async fn events(
    State(api): State<Api>,
    _read: Read,
    viewer: Viewer,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
) -> Response {
    let (updates, seat) = match api.live.subscribe(peer.ip(), viewer.with_token) {
        Ok(subscribed) => subscribed,
        Err(refusal) => return refused(refusal),
    };
    let stream = WatchStream::new(updates)
        .map(move |update| {
            // The seat lives as long as the stream.
            let _counted = &seat;
            Ok::<_, Infallible>(Event::default().event("update").data(&*update))
        })
        .take_until(api.live.closed());
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}

fn refused(refusal: Refusal) -> Response {
    let (message, bound, value) = match refusal {
        Refusal::Full => (
            format!(
                "{MAX_EVENT_STREAMS} event streams are open on this node already; retry later or open another node's dashboard"
            ),
            "max_event_streams",
            MAX_EVENT_STREAMS,
        ),
        Refusal::AnonymousFull => (
            format!(
                "{MAX_ANONYMOUS_EVENT_STREAMS} event streams without a token are open on this node already; enter the admin or read token in the dashboard to use the places kept for them"
            ),
            "max_anonymous_event_streams",
            MAX_ANONYMOUS_EVENT_STREAMS,
        ),
        Refusal::AnonymousPerPeer => (
            format!(
                "your address holds {MAX_ANONYMOUS_EVENT_STREAMS_PER_PEER} event streams without a token already; close one, or enter the admin or read token in the dashboard"
            ),
            "max_anonymous_event_streams_per_peer",
            MAX_ANONYMOUS_EVENT_STREAMS_PER_PEER,
        ),
    };
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message)
        .with(bound, json!(value))
        .into_response()
}
