//! The answers the layer gives itself, and replays of stored answers.

use crate::ledger::StoredAnswer;
use axum_core::body::Body;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderName, HeaderValue, Response, StatusCode};
use serde_json::{json, Value};

/// Set on every answer that comes from the ledger instead of the route.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// The `detail` codes of the layer's own answers. The outbox reads 409 and 422 answers by
/// this field, so they are stable identifiers, not prose.
pub mod detail {
    pub const KEY_INVALID: &str = "idempotency_key_invalid";
    pub const KEY_REUSED: &str = "idempotency_key_reused";
    pub const IN_PROGRESS: &str = "idempotency_in_progress";
    pub const OUTCOME_UNKNOWN: &str = "idempotency_outcome_unknown";
    pub const REPLAY_UNAVAILABLE: &str = "idempotency_replay_unavailable";
    pub const LEDGER_BUSY: &str = "idempotency_ledger_busy";
    pub const LEDGER_FULL: &str = "idempotency_ledger_full";
    pub const LEDGER_ERROR: &str = "idempotency_ledger_error";
    pub const BODY_UNREADABLE: &str = "request_body_unreadable";
}

pub(crate) fn json(status: StatusCode, body: Value) -> Response<Body> {
    let mut resp = Response::new(Body::from(body.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

pub(crate) fn detail(status: StatusCode, code: &str) -> Response<Body> {
    json(status, json!({ "detail": code }))
}

/// 503 with `Retry-After: 1`: the ledger could not take the request now, and will soon.
pub(crate) fn retry_soon(code: &str) -> Response<Body> {
    let mut resp = detail(StatusCode::SERVICE_UNAVAILABLE, code);
    resp.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from_static("1"));
    resp
}

/// What a route that panicked is stored as (and what a later copy of it gets).
pub(crate) fn internal_error_answer() -> StoredAnswer {
    StoredAnswer {
        status: 500,
        headers: vec![("content-type".into(), "application/json".into())],
        body: Some(br#"{"detail":"Internal Server Error"}"#.to_vec()),
    }
}

/// A stored answer as sent on a replay (`replayed`) or as the first answer.
pub(crate) fn from_stored(answer: StoredAnswer, replayed: bool) -> Response<Body> {
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = match answer.body {
        Some(body) => {
            let mut resp = Response::new(Body::from(body));
            *resp.status_mut() = status;
            for (name, value) in &answer.headers {
                if let (Ok(n), Ok(v)) = (
                    HeaderName::from_bytes(name.as_bytes()),
                    HeaderValue::from_str(value),
                ) {
                    resp.headers_mut().append(n, v);
                }
            }
            resp
        }
        // Stored without its body: the write did happen (with this status), but its answer
        // cannot be given again.
        None => json(
            StatusCode::CONFLICT,
            json!({ "detail": detail::REPLAY_UNAVAILABLE, "status": answer.status }),
        ),
    };
    if replayed {
        resp.headers_mut()
            .insert(REPLAYED_HEADER, HeaderValue::from_static("true"));
    }
    resp
}
