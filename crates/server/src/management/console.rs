//! The web console: a single page of plain HTML, CSS and JavaScript embedded in the binary (no
//! build step, nothing fetched from the internet), served at `/` and `/console/...`. The assets
//! need no login; the page asks for a broker user and calls the `/api` routes with HTTP basic
//! auth, so every piece of data it shows passes the API's authentication. See docs/management.md.

use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

/// The page itself.
const INDEX_HTML: &str = include_str!("console/index.html");
/// The application (hash routes `#/overview`, `#/queues`, ...).
const APP_JS: &str = include_str!("console/app.js");
/// The detail pages (exchange, connection, channel) and the queue page's consumers and chart,
/// kept beside app.js so each script stays readable.
const PAGES_JS: &str = include_str!("console/pages.js");
/// The cluster page (nodes, metadata group, quorum shards) and a quorum queue's replica facts.
const CLUSTER_JS: &str = include_str!("console/cluster.js");
/// The style sheet.
const STYLE_CSS: &str = include_str!("console/style.css");
/// The tab icon.
const FAVICON_SVG: &str = include_str!("console/favicon.svg");

/// Only this origin's scripts, styles and API; no inline script, no framing.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
     connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The console's routes (no state, no authentication: the API calls carry the credentials).
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|| async { asset("index.html") }))
        .route("/console", get(|| async { asset("index.html") }))
        .route("/console/", get(|| async { asset("index.html") }))
        .route("/console/{file}", get(|axum::extract::Path(file): axum::extract::Path<String>| async move { asset(&file) }))
        .route("/favicon.ico", get(|| async { asset("favicon.svg") }))
}

/// One embedded file with its content type, or 404.
fn asset(file: &str) -> Response {
    let (body, content_type) = match file {
        "index.html" => (INDEX_HTML, "text/html; charset=utf-8"),
        "app.js" => (APP_JS, "text/javascript; charset=utf-8"),
        "pages.js" => (PAGES_JS, "text/javascript; charset=utf-8"),
        "cluster.js" => (CLUSTER_JS, "text/javascript; charset=utf-8"),
        "style.css" => (STYLE_CSS, "text/css; charset=utf-8"),
        "favicon.svg" => (FAVICON_SVG, "image/svg+xml"),
        _ => return (StatusCode::NOT_FOUND, "Not Found").into_response(),
    };
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // The assets change with the binary; revalidating keeps an upgraded broker's page current.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(HeaderName::from_static("referrer-policy"), HeaderValue::from_static("no-referrer"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assets_have_types_and_unknown_files_are_404() {
        let page = asset("index.html");
        assert_eq!(page.status(), StatusCode::OK);
        assert_eq!(page.headers()[header::CONTENT_TYPE], "text/html; charset=utf-8");
        assert_eq!(asset("app.js").headers()[header::CONTENT_TYPE], "text/javascript; charset=utf-8");
        assert_eq!(asset("../mod.rs").status(), StatusCode::NOT_FOUND);
        assert!(INDEX_HTML.contains("/console/app.js"));
        assert!(INDEX_HTML.contains("/console/pages.js"));
        assert_eq!(asset("pages.js").headers()[header::CONTENT_TYPE], "text/javascript; charset=utf-8");
        assert!(INDEX_HTML.contains("/console/cluster.js"));
        assert_eq!(asset("cluster.js").headers()[header::CONTENT_TYPE], "text/javascript; charset=utf-8");
    }
}
