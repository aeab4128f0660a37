//! The dashboard: one page and its scripts and style, compiled into the
//! binary (`include_str!`), served at `/` on every node. The page reads the
//! admin API like any client; it holds no data of its own.
//!
//! The headers keep it to itself: a content security policy that allows
//! only this origin's script and style (no inline script, nothing from
//! elsewhere), no framing (the rollout buttons cannot be clickjacked), no
//! sniffing and no referrer. The admin token the page asks for stays in
//! the tab's session storage and travels as an `Authorization` header,
//! never a cookie, so another site cannot make the browser send it.

use axum::extract::Path;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::errors::ApiError;

const INDEX: &str = include_str!("../dashboard/index.html");

const SCRIPT: &str = "text/javascript; charset=utf-8";
const STYLE: &str = "text/css; charset=utf-8";

/// Every file under `/assets/`: its name, type and body. Only these are
/// served, looked up by name: the request never names a path on disk. The
/// scripts are classic scripts that `index.html` loads in order, one job
/// each (see `app.js`).
const ASSETS: &[(&str, &str, &str)] = &[
    ("style.css", STYLE, include_str!("../dashboard/style.css")),
    ("format.js", SCRIPT, include_str!("../dashboard/format.js")),
    ("api.js", SCRIPT, include_str!("../dashboard/api.js")),
    ("charts.js", SCRIPT, include_str!("../dashboard/charts.js")),
    (
        "history.js",
        SCRIPT,
        include_str!("../dashboard/history.js"),
    ),
    ("drills.js", SCRIPT, include_str!("../dashboard/drills.js")),
    ("panels.js", SCRIPT, include_str!("../dashboard/panels.js")),
    ("ledger.js", SCRIPT, include_str!("../dashboard/ledger.js")),
    ("usage.js", SCRIPT, include_str!("../dashboard/usage.js")),
    ("app.js", SCRIPT, include_str!("../dashboard/app.js")),
];

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

/// `GET /assets/{file}`: one of [`ASSETS`], or 404.
pub(super) async fn file(Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|(n, _, _)| *n == name) {
        Some((_, content_type, body)) => asset(content_type, body),
        None => ApiError::new(StatusCode::NOT_FOUND, format!("no asset {name}")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `/assets/` files `index.html` loads, in its order.
    fn loaded(kind: &str) -> Vec<&'static str> {
        let mut names = Vec::new();
        for part in INDEX.split("\"/assets/").skip(1) {
            let name = part.split('"').next().unwrap_or("");
            if name.ends_with(kind) {
                names.push(name);
            }
        }
        names
    }

    #[test]
    fn the_page_loads_every_script_served_and_only_those_in_their_order() {
        let scripts: Vec<&str> = ASSETS
            .iter()
            .filter(|(_, t, _)| *t == SCRIPT)
            .map(|(n, _, _)| *n)
            .collect();
        assert_eq!(loaded(".js"), scripts);
        assert_eq!(loaded(".css"), vec!["style.css"]);
        // Deferred, never inline: the policy allows only this origin's files.
        for name in scripts {
            let tag = format!("<script src=\"/assets/{name}\" defer></script>");
            assert!(INDEX.contains(&tag), "{tag}");
        }
        assert!(!INDEX.contains("<script>"), "no inline script");
        // app.js starts the page, so it comes last.
        assert_eq!(loaded(".js").last(), Some(&"app.js"));
    }

    #[tokio::test]
    async fn each_asset_is_served_with_the_policy_and_unknown_names_are_404() {
        for (name, content_type, body) in ASSETS {
            let response = file(Path(name.to_string())).await;
            assert_eq!(response.status(), StatusCode::OK, "{name}");
            let headers = response.headers();
            assert_eq!(headers[header::CONTENT_TYPE], *content_type, "{name}");
            assert_eq!(headers[header::CONTENT_SECURITY_POLICY], POLICY, "{name}");
            assert_eq!(headers[header::X_FRAME_OPTIONS], "DENY", "{name}");
            assert!(!body.is_empty(), "{name}");
        }
        for name in ["x.js", "../app.js", "index.html", "App.js", ""] {
            let response = file(Path(name.to_string())).await;
            assert_eq!(response.status(), StatusCode::NOT_FOUND, "{name:?}");
        }
    }
}
