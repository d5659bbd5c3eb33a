//! The answers the layer gives itself, and replays of stored answers.

use crate::body::IdempotencyBody;
use crate::ledger::StoredAnswer;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderName, HeaderValue, Response, StatusCode};
use serde_json::{json, Value};
use std::time::Duration;

/// Set on every answer that comes from the ledger instead of the route.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// The `detail` codes of the layer's own answers. The outbox reads 409 and 422 answers by
/// this field, so they are stable identifiers, not prose.
pub mod detail {
    /// 400: the key breaks the [`KeyRule`](crate::KeyRule), or two keys were sent.
    pub const KEY_INVALID: &str = "idempotency_key_invalid";
    /// 422: the key was used for another request.
    pub const KEY_REUSED: &str = "idempotency_key_reused";
    /// 409: the first attempt is still running.
    pub const IN_PROGRESS: &str = "idempotency_in_progress";
    /// 409: the first attempt stopped heartbeating; nobody knows whether it applied.
    pub const OUTCOME_UNKNOWN: &str = "idempotency_outcome_unknown";
    /// 409 with `status`: the write happened, its answer was not stored.
    pub const REPLAY_UNAVAILABLE: &str = "idempotency_replay_unavailable";
    /// 503: the ledger's lock or connection was not had in time.
    pub const LEDGER_BUSY: &str = "idempotency_ledger_busy";
    /// 503: the ledger holds its bound of unexpired entries.
    pub const LEDGER_FULL: &str = "idempotency_ledger_full";
    /// 500: the ledger failed.
    pub const LEDGER_ERROR: &str = "idempotency_ledger_error";
    /// 400: the request body broke off while the layer read it.
    pub const BODY_UNREADABLE: &str = "request_body_unreadable";
    /// 413 with `max_request_body`: a keyed write whose body is larger than the layer
    /// fingerprints; refused rather than run without idempotency.
    pub const BODY_TOO_LARGE: &str = "idempotency_body_too_large";
    /// 503 (transactional mode): the route's transaction, with the key's answer, did not
    /// commit. Nothing of it was applied unless the commit's own answer was lost; either
    /// way the retry is answered consistently (the stored answer, or a fresh single run).
    pub const NOT_COMMITTED: &str = "idempotency_not_committed";
}

pub(crate) fn json<B>(status: StatusCode, body: Value) -> Response<IdempotencyBody<B>> {
    let mut resp = Response::new(IdempotencyBody::full(body.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    resp
}

pub(crate) fn detail<B>(status: StatusCode, code: &str) -> Response<IdempotencyBody<B>> {
    json(status, json!({ "detail": code }))
}

/// 413: the keyed write's body is over `max_request_body`; says the bound and how to
/// raise it, since only the server's owner can.
pub(crate) fn body_too_large<B>(cap: usize) -> Response<IdempotencyBody<B>> {
    json(
        StatusCode::PAYLOAD_TOO_LARGE,
        json!({
            "detail": detail::BODY_TOO_LARGE,
            "max_request_body": cap,
            "message": format!(
                "a write with an Idempotency-Key may have a body of at most {cap} bytes: the \
                 idempotency layer fingerprints the body to tell a retry from another write. \
                 The server can raise the bound with \
                 Settings::builder().max_request_body(bytes)."
            ),
        }),
    )
}

/// 503 with `Retry-After` in whole seconds (rounded up, at least 1): the ledger could not
/// take the request now, and will then.
pub(crate) fn retry_later<B>(code: &str, after: Duration) -> Response<IdempotencyBody<B>> {
    let mut resp = detail(StatusCode::SERVICE_UNAVAILABLE, code);
    let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
    resp.headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(secs.max(1)));
    resp
}

/// What a route that panicked is stored as (and what a later copy of it gets).
pub(crate) fn internal_error_answer() -> StoredAnswer {
    StoredAnswer::new(
        500,
        vec![("content-type".into(), "application/json".into())],
        br#"{"detail":"Internal Server Error"}"#.to_vec(),
    )
}

/// A stored answer as sent on a replay (`replayed`) or as the first answer.
pub(crate) fn from_stored<B>(answer: StoredAnswer, replayed: bool) -> Response<IdempotencyBody<B>> {
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = match answer.body {
        Some(body) => {
            let mut resp = Response::new(IdempotencyBody::full(body));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_is_whole_seconds_rounded_up() {
        let r = |d| {
            retry_later::<()>(detail::LEDGER_FULL, d).headers()[RETRY_AFTER]
                .to_str()
                .unwrap()
                .to_owned()
        };
        assert_eq!(r(Duration::from_millis(1)), "1");
        assert_eq!(r(Duration::ZERO), "1");
        assert_eq!(r(Duration::from_millis(90_001)), "91");
        assert_eq!(r(Duration::from_secs(86_400)), "86400");
    }
}
