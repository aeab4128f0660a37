//! The service each connection runs: the router, with every request counted
//! in flight on the connection's slot from its head until its response has
//! been sent whole (an event stream is in flight as long as it lasts), the
//! peer address in `ConnectInfo`, request bodies cut at their deadline,
//! and only the probes on a reserve connection.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, Request, StatusCode, Version, header};
use axum::response::{IntoResponse, Response};
use axum::{BoxError, Json, Router};
use http_body::{Frame, SizeHint};
use serde_json::json;
use tower::ServiceExt;

use crate::slots::{Activity, InFlight};

/// What a reserve connection may ask for, and how a refusal names the cap.
#[derive(Clone, Copy)]
pub(super) struct ProbesOnly {
    pub probes: &'static [&'static str],
    pub cap_flag: &'static str,
    pub max_connections: usize,
}

#[derive(Clone)]
pub(super) struct Tracked {
    pub router: Router,
    pub activity: Activity,
    pub peer: SocketAddr,
    /// `Some` on a reserve connection.
    pub probes_only: Option<ProbesOnly>,
    pub body_timeout: Duration,
}

type Answer = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

impl<B> tower::Service<Request<B>> for Tracked
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Answer;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut request: Request<B>) -> Answer {
        let in_flight = self.activity.begin();
        // A reserve connection closes after its answer (HTTP/1; an idle
        // HTTP/2 one gives way to the next newcomer).
        let close = self.probes_only.is_some() && request.version() <= Version::HTTP_11;
        if let Some(only) = self.probes_only
            && !only.probes.contains(&request.uri().path())
        {
            let answer = busy(only, close);
            return Box::pin(std::future::ready(Ok(guarded(answer, in_flight))));
        }
        request.extensions_mut().insert(ConnectInfo(self.peer));
        let deadline = self.body_timeout;
        let request = request.map(|body| Body::new(Deadline::new(Body::new(body), deadline)));
        let router = self.router.clone();
        Box::pin(async move {
            let mut response = match router.oneshot(request).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            if close {
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Ok(guarded(response, in_flight))
        })
    }
}

/// The answer to anything but a probe on a reserve connection.
fn busy(only: ProbesOnly, close: bool) -> Response {
    let body = json!({
        "error": format!(
            "every one of the {} connections {} allows is busy; this connection answers only {}; retry shortly",
            only.max_connections,
            only.cap_flag,
            only.probes.join(" and ")
        ),
        "max_connections": only.max_connections,
    });
    let mut response = (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response();
    let headers = response.headers_mut();
    headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    if close {
        headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// `response` whose request stays in flight until its body is sent whole
/// or dropped.
fn guarded(response: Response, in_flight: InFlight) -> Response {
    response.map(|inner| {
        Body::new(Guarded {
            inner,
            _in_flight: in_flight,
        })
    })
}

/// A response body holding its request's [`InFlight`].
struct Guarded {
    inner: Body,
    _in_flight: InFlight,
}

impl HttpBody for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request body that fails once its deadline passes (the handler reading
/// it answers 400 and the connection closes).
struct Deadline {
    inner: Body,
    deadline: Pin<Box<tokio::time::Sleep>>,
    after: Duration,
}

impl Deadline {
    fn new(inner: Body, after: Duration) -> Deadline {
        Deadline {
            inner,
            deadline: Box::pin(tokio::time::sleep(after)),
            after,
        }
    }
}

impl HttpBody for Deadline {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Pending => {}
            Poll::Ready(frame) => return Poll::Ready(frame.map(|f| f.map_err(Into::into))),
        }
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Some(Err(format!(
                "the request body did not arrive within {:?}",
                self.after
            )
            .into()))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
