//! Static files from `--www`, through tower-http's `ServeDir` (path traversal, ranges,
//! `HEAD` and MIME types are its business), plus what the worker
//! needs on top: `Cache-Control: no-cache` everywhere (the service worker and the WASM
//! change on every build, and a stale `sw.js` is the classic PWA trap),
//! `Service-Worker-Allowed: /` on scripts, the MIME types a worker cannot do without
//! pinned (`application/wasm` for streaming compilation, `text/javascript` for scripts),
//! and validators taken from the bytes served instead of the file's time.
//!
//! Why not `Last-Modified`: it has one-second resolution. A file rewritten within the
//! second of the copy a browser holds (a deploy right after the previous one; seen in the
//! bundler test, where a rebuild follows the first build within a second or two) is answered
//! `304` to the browser's revalidation. The update check of `sw.js` and of the scripts it
//! imports then finds nothing new, and no later check can, since the browser keeps sending
//! the same date: the deploy is missed until the file changes again. A strong `ETag` that
//! hashes the body makes `304` mean the same bytes.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{from_fn, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use sha2::{Digest, Sha256};
use std::path::Path;
use tower_http::services::ServeDir;

pub fn service(www: &Path) -> Router {
    Router::new()
        .fallback_service(ServeDir::new(www).append_index_html_on_directories(true))
        .layer(from_fn(content_validators))
        .layer(from_fn(worker_headers))
}

/// The largest file given an `ETag`: hashing means holding it whole in memory. A larger
/// one (the site's media, not the worker's files) is sent without a validator, so it is
/// always sent whole: never stale, only not revalidated.
const MAX_HASHED: usize = 16 << 20;

/// Replaces `ServeDir`'s date validators with a content `ETag` (see the module's doc).
/// Date conditions are taken off the request, so `ServeDir` answers in full; a `Range`
/// under `If-Range` is dropped too (its validator is ours now, which `ServeDir` cannot
/// check, and a full answer is what a failed `If-Range` gets anyway). `HEAD` answers
/// carry no validator: hashing needs the body, which `HEAD` does not read.
async fn content_validators(mut req: Request, next: Next) -> Response {
    let h = req.headers_mut();
    let if_none_match = h.remove(header::IF_NONE_MATCH);
    h.remove(header::IF_MODIFIED_SINCE);
    h.remove(header::IF_UNMODIFIED_SINCE);
    if h.remove(header::IF_RANGE).is_some() {
        h.remove(header::RANGE);
    }
    let get = req.method() == Method::GET;
    let mut resp = next.run(req).await;
    resp.headers_mut().remove(header::LAST_MODIFIED);
    let length = resp
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    let hashable = length.is_some_and(|n| n <= MAX_HASHED);
    if !get || resp.status() != StatusCode::OK || !hashable {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let bytes = match axum::body::to_bytes(body, MAX_HASHED).await {
        Ok(b) => b,
        Err(_) => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    };
    let etag = content_etag(&bytes);
    if if_none_match.is_some_and(|v| etag_matches(&v, &etag)) {
        let mut not_modified = Response::new(Body::empty());
        *not_modified.status_mut() = StatusCode::NOT_MODIFIED;
        not_modified.headers_mut().insert(header::ETAG, etag);
        return not_modified;
    }
    parts.headers.insert(header::ETAG, etag);
    Response::from_parts(parts, Body::from(bytes))
}

/// A strong validator: the first 128 bits of the body's SHA-256, quoted.
fn content_etag(body: &[u8]) -> HeaderValue {
    let digest = Sha256::digest(body);
    let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
    HeaderValue::from_str(&format!("\"{hex}\"")).unwrap_or(HeaderValue::from_static("\"\""))
}

/// `If-None-Match` (RFC 9110 13.1.2): `*`, or a list of tags compared weakly.
fn etag_matches(if_none_match: &HeaderValue, etag: &HeaderValue) -> bool {
    let Ok(list) = if_none_match.to_str() else {
        return false;
    };
    let ours = etag.as_bytes();
    list.split(',')
        .map(str::trim)
        .any(|tag| tag == "*" || tag.strip_prefix("W/").unwrap_or(tag).as_bytes() == ours)
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
