//! The dashboard: one page and its script and style, compiled into the
//! binary (`include_str!`), served at `/` on every node. The page reads the
//! admin API like any client; it holds no data of its own.
//!
//! The headers keep it to itself: a content security policy that allows
//! only this origin's script and style (no inline script, nothing from
//! elsewhere), no framing (the rollout buttons cannot be clickjacked), no
//! sniffing and no referrer. The admin token the page asks for stays in
//! the tab's session storage and travels as an `Authorization` header,
//! never a cookie, so another site cannot make the browser send it.

use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

const INDEX: &str = include_str!("../dashboard/index.html");
const SCRIPT: &str = include_str!("../dashboard/app.js");
const STYLE: &str = include_str!("../dashboard/style.css");

const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(POLICY),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // A new binary brings new assets: never serve a stale copy.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

pub(super) async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX)
}

pub(super) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

pub(super) async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}
