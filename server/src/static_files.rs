//! Static files from `--www`, through tower-http's `ServeDir` (path traversal, ranges,
//! `HEAD`, conditional requests and MIME types are its business), plus what the worker
//! needs on top: `Cache-Control: no-cache` everywhere (the service worker and the WASM
//! change on every build, and a stale `sw.js` is the classic PWA trap),
//! `Service-Worker-Allowed: /` on scripts, and the MIME types a worker cannot do without
//! pinned (`application/wasm` for streaming compilation, `text/javascript` for scripts).

use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::middleware::{from_fn, Next};
use axum::response::Response;
use axum::Router;
use std::path::Path;
use tower_http::services::ServeDir;

pub fn service(www: &Path) -> Router {
    Router::new()
        .fallback_service(ServeDir::new(www).append_index_html_on_directories(true))
        .layer(from_fn(worker_headers))
}

fn pinned_type(path: &str) -> Option<&'static str> {
    let ext = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase())?;
    match ext.as_str() {
        "wasm" => Some("application/wasm"),
        "js" | "mjs" => Some("text/javascript"),
        "webmanifest" => Some("application/manifest+json"),
        _ => None,
    }
}

async fn worker_headers(req: Request, next: Next) -> Response {
    let path = req.uri().path().to_owned();
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-cache"));
    if resp.status().is_success() {
        if let Some(t) = pinned_type(&path) {
            let h = resp.headers_mut();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(t));
            if t == "text/javascript" {
                h.insert("service-worker-allowed", HeaderValue::from_static("/"));
            }
        }
    }
    resp
}
