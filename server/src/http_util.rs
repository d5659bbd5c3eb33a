//! Small helpers shared by the route modules: JSON error bodies, header reading, the
//! "drop this connection" marker, random tokens and the wall clock.

use crate::limits::retry_after_secs;
use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Wall-clock milliseconds since the Unix epoch (sessions, throttles). The idempotency
/// ledger keeps its own times.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Marker put in a response's extensions by the pipeline when the connection must be closed
/// without any HTTP answer (network down, `refuse`, `drop-after-commit`). The connection loop
/// in [`crate::serve`] turns it into a service error, which makes hyper close the socket
/// without writing a byte: the browser's `fetch` sees a real network error, not a 5xx.
#[derive(Clone, Copy, Debug)]
pub struct DropConnection;

impl std::fmt::Display for DropConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped on purpose")
    }
}

impl std::error::Error for DropConnection {}

/// A response that [`crate::serve`] will never send.
pub fn drop_connection() -> Response {
    let mut resp = Response::new(Body::empty());
    resp.extensions_mut().insert(DropConnection);
    resp
}

/// A JSON response with the given body.
pub fn json_response(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

/// The error shape used everywhere: `{"detail":"<code>"}`. The worker classifies answers by
/// this field, so codes are stable identifiers, not prose.
pub fn detail(status: StatusCode, code: &str) -> Response {
    json_response(status, json!({ "detail": code }))
}

/// 429 with `Retry-After`: try again after `wait`.
pub fn too_many(code: &str, wait: Duration) -> Response {
    let mut resp = detail(StatusCode::TOO_MANY_REQUESTS, code);
    resp.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from(retry_after_secs(wait)),
    );
    resp
}

/// Reads a request body up to `max` bytes (bigger → 413 `body_too_large`; a body that
/// paused past the connection's body timeout → 408 `body_timeout`).
pub async fn read_body(body: Body, max: usize) -> Result<Bytes, Response> {
    axum::body::to_bytes(body, max).await.map_err(|e| {
        if caused_by_timeout(&e) {
            detail(StatusCode::REQUEST_TIMEOUT, "body_timeout")
        } else {
            detail(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large")
        }
    })
}

/// Whether a body error comes from [`crate::serve`]'s body read timeout.
fn caused_by_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if c.is::<tower_http::timeout::TimeoutError>() {
            return true;
        }
        cause = c.source();
    }
    false
}

/// 500 for a storage failure; the cause goes to stderr, not to the client.
pub fn storage_error(err: impl std::fmt::Display) -> Response {
    eprintln!("sw-outbox-server: storage error: {err}");
    detail(StatusCode::INTERNAL_SERVER_ERROR, "storage_error")
}

/// Parses a JSON request body; malformed input is the client's fault (400), never a panic.
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, Response> {
    serde_json::from_slice(body).map_err(|_| detail(StatusCode::BAD_REQUEST, "invalid_json"))
}

/// A header as a string, if present and valid visible ASCII.
pub fn header_str(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.to_owned())
}

/// Sets `Cache-Control` unless the route already chose one.
pub fn default_cache_control(resp: &mut Response, value: &'static str) {
    resp.headers_mut()
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static(value));
}

/// 32 random bytes from the OS, hex-encoded: session ids, CSRF tokens, claim tokens.
pub fn random_token() -> Result<String, getrandom::Error> {
    let mut buf = [0u8; 32];
    getrandom::fill(&mut buf)?;
    Ok(hex(&buf))
}

pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 15) as usize] as char);
    }
    out
}

/// Comparison whose time does not depend on where the strings differ, for CSRF tokens.
pub fn constant_time_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
