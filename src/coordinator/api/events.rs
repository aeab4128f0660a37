//! `GET /api/v1/events`: the dashboard's live updates as server-sent events.
//!
//! Every event is the node's latest update (`coordinator::live`): rendered
//! once per change for every listener, sent as `event: update`. A stream
//! that falls behind skips to the newest update. At most
//! [`MAX_EVENT_STREAMS`] streams at once; the next gets 503 with the cap.
//! Streams end when the node shuts down; a dashboard reconnects by itself.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::json;
use tokio_stream::wrappers::WatchStream;

use super::Api;
use super::errors::ApiError;
use super::read::Read;
use crate::coordinator::live::MAX_EVENT_STREAMS;

/// A comment line this often keeps proxies from closing an idle stream.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

pub(super) async fn events(State(api): State<Api>, _read: Read) -> Response {
    let Some((updates, permit)) = api.live.subscribe() else {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{MAX_EVENT_STREAMS} event streams are open on this node already; retry later or open another node's dashboard"),
        )
        .with("max_event_streams", json!(MAX_EVENT_STREAMS))
        .into_response();
    };
    let stream = WatchStream::new(updates)
        .map(move |update| {
            // The permit lives as long as the stream.
            let _counted = &permit;
            Ok::<_, Infallible>(Event::default().event("update").data(&*update))
        })
        .take_until(api.live.closed());
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}
