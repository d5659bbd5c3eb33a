//! The idempotency protocol: how a keyed write uses the [`Ledger`].
//!
//! 1. The key is validated (400 `idempotency_key_invalid`).
//! 2. [`Ledger::begin`] commits a running claim **before** the route runs. If the process
//!    dies mid-route, the claim survives and every retry learns that the outcome is unknown,
//!    instead of applying the write a second time.
//! 3. While the route runs, the claim's heartbeat is refreshed every `heartbeat_every`. The
//!    heartbeat runs inside the request's own future, so when the request is cancelled (the
//!    client disconnected and hyper dropped the handler) or the process dies, the heartbeat
//!    stops with it and the claim goes stale after `stale_after`.
//! 4. The answer (any status) is stored and the claim completed.
//!
//! A retry with the same key and fingerprint then gets the stored answer with
//! `Idempotent-Replayed: true`; while the first attempt runs it waits up to
//! `in_progress_wait` and then gets 409 `idempotency_in_progress`; if the first attempt's
//! heartbeat is stale it gets 409 `idempotency_outcome_unknown` (forever: the server cannot
//! know whether the write happened, so it must not guess). A different request under the
//! same key gets 422 `idempotency_key_reused`.

use crate::app::App;
use crate::http_util::{detail, now_ms, random_token, storage_error};
use crate::ledger::{Begin, ClaimToken, Fingerprint, Ledger, Scope, StoredAnswer};
use axum::body::{to_bytes, Body};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::Response;
use sha2::{Digest, Sha256};
use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;
use tokio::time::Instant;

/// Answers larger than this are stored with an empty body (the demo's never are).
pub const MAX_STORED_BODY: usize = 1024 * 1024;

/// 22–64 characters of `[A-Za-z0-9_-]`: long enough to be a random id (a base64url UUID is
/// 22), short enough to index, and free of characters that need escaping anywhere.
pub fn valid_key(key: &str) -> bool {
    (22..=64).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

pub fn fingerprint(method: &str, path_and_query: &str, body: &[u8]) -> Fingerprint {
    Fingerprint {
        method: method.to_owned(),
        path: path_and_query.to_owned(),
        body_sha256: Sha256::digest(body).into(),
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The stored answer as sent on a replay.
pub fn replay(answer: StoredAnswer) -> Response {
    let mut resp = Response::new(Body::from(answer.body));
    *resp.status_mut() = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::OK);
    let h = resp.headers_mut();
    if let Some(v) = answer
        .content_type
        .and_then(|v| HeaderValue::from_str(&v).ok())
    {
        h.insert(header::CONTENT_TYPE, v);
    }
    if let Some(v) = answer.location.and_then(|v| HeaderValue::from_str(&v).ok()) {
        h.insert(header::LOCATION, v);
    }
    h.insert("idempotent-replayed", HeaderValue::from_static("true"));
    resp
}

/// Runs `route` at most once per (account, key) within the expiry window.
pub async fn run<F>(app: &App, scope: Scope, fp: Fingerprint, route: F) -> Response
where
    F: Future<Output = Response>,
{
    let t = app.timings;
    let token = match random_token() {
        Ok(t) => ClaimToken(t),
        Err(e) => return storage_error(e),
    };
    let wait_until = Instant::now() + t.in_progress_wait;
    loop {
        let now = now_ms();
        match app
            .ledger
            .begin(&scope, &fp, &token, now, now - ms(t.expiry))
            .await
        {
            Err(e) => return storage_error(e),
            Ok(Begin::Reused) => {
                return detail(StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reused")
            }
            Ok(Begin::Completed(answer)) => return replay(answer),
            Ok(Begin::Running { heartbeat_ms }) => {
                if now_ms() - heartbeat_ms > ms(t.stale_after) {
                    return detail(StatusCode::CONFLICT, "idempotency_outcome_unknown");
                }
                if Instant::now() >= wait_until {
                    return detail(StatusCode::CONFLICT, "idempotency_in_progress");
                }
                tokio::time::sleep(t.in_progress_poll).await;
            }
            Ok(Begin::Claimed(_)) => break,
        }
    }

    // The route and the heartbeat share this future: cancelling one cancels both.
    let resp = tokio::select! {
        resp = route => resp,
        never = heartbeat(app.ledger.as_ref(), &scope, &token, t.heartbeat_every) => match never {},
    };

    let (parts, body) = resp.into_parts();
    let bytes = match to_bytes(body, usize::MAX).await {
        Ok(b) => b,
        Err(e) => {
            // The route ran but its answer is lost: store a 500 so retries do not re-run it.
            eprintln!("sw-outbox-server: reading a route's answer failed: {e}");
            let answer = StoredAnswer {
                status: 500,
                content_type: Some("application/json".into()),
                location: None,
                body: br#"{"detail":"answer_lost"}"#.to_vec(),
            };
            if let Err(e) = app.ledger.complete(&scope, &token, &answer).await {
                eprintln!("sw-outbox-server: {e}");
            }
            return replay_fresh(answer);
        }
    };
    let header_string = |name: header::HeaderName| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(|s| s.to_owned())
    };
    let answer = StoredAnswer {
        status: parts.status.as_u16(),
        content_type: header_string(header::CONTENT_TYPE),
        location: header_string(header::LOCATION),
        body: if bytes.len() <= MAX_STORED_BODY {
            bytes.to_vec()
        } else {
            Vec::new()
        },
    };
    if let Err(e) = app.ledger.complete(&scope, &token, &answer).await {
        // The claim stays running, stops heartbeating when we return, and retries get
        // "outcome unknown": the honest answer when the ledger cannot record the outcome.
        eprintln!("sw-outbox-server: completing a claim failed: {e}");
    }
    Response::from_parts(parts, Body::from(bytes))
}

/// A stored answer sent as a first answer (no replay header).
fn replay_fresh(answer: StoredAnswer) -> Response {
    let mut resp = replay(answer);
    resp.headers_mut().remove("idempotent-replayed");
    resp
}

async fn heartbeat(
    ledger: &dyn Ledger,
    scope: &Scope,
    token: &ClaimToken,
    every: Duration,
) -> Infallible {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await; // the first tick is immediate; the claim was just written
    loop {
        tick.tick().await;
        if let Err(e) = ledger.heartbeat(scope, token, now_ms()).await {
            eprintln!("sw-outbox-server: heartbeat failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn app() -> App {
        let config = Config {
            db: ":memory:".into(),
            ..Config::default()
        };
        App::open(&config).expect("app")
    }

    async fn body(resp: Response) -> Vec<u8> {
        to_bytes(resp.into_body(), usize::MAX)
            .await
            .expect("body")
            .to_vec()
    }

    /// Server errors are answers too: stored and replayed, never re-run (the route may have
    /// changed data before failing).
    #[tokio::test]
    async fn server_errors_are_stored_and_replayed() {
        let app = app();
        let runs = AtomicUsize::new(0);
        let scope = Scope {
            account: "alice".into(),
            key: "k".repeat(22),
        };
        let fp = fingerprint("POST", "/api/notes", b"{}");
        let route = || async {
            runs.fetch_add(1, Ordering::SeqCst);
            let mut r = detail(StatusCode::SERVICE_UNAVAILABLE, "db_down");
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("5"));
            r
        };
        let first = run(&app, scope.clone(), fp.clone(), route()).await;
        assert_eq!(first.status(), 503);
        assert!(first.headers().get("idempotent-replayed").is_none());
        let first_body = body(first).await;
        let again = run(&app, scope.clone(), fp.clone(), route()).await;
        assert_eq!(again.status(), 503);
        assert_eq!(
            again
                .headers()
                .get("idempotent-replayed")
                .map(|v| v.as_bytes()),
            Some(&b"true"[..])
        );
        assert_eq!(
            again
                .headers()
                .get(header::CONTENT_TYPE)
                .map(|v| v.as_bytes()),
            Some(&b"application/json"[..])
        );
        assert_eq!(body(again).await, first_body);
        assert_eq!(runs.load(Ordering::SeqCst), 1, "the route ran once");
    }

    #[tokio::test]
    async fn oversized_answers_are_stored_without_body() {
        let app = app();
        let scope = Scope {
            account: "bob".into(),
            key: "b".repeat(22),
        };
        let fp = fingerprint("POST", "/api/big", b"");
        let big = vec![b'x'; MAX_STORED_BODY + 1];
        let first = run(&app, scope.clone(), fp.clone(), async {
            Response::new(Body::from(big.clone()))
        })
        .await;
        assert_eq!(
            body(first).await.len(),
            MAX_STORED_BODY + 1,
            "the first answer is whole"
        );
        let again = run(&app, scope, fp, async { Response::new(Body::empty()) }).await;
        assert_eq!(again.status(), 200);
        assert!(body(again).await.is_empty());
    }

    #[test]
    fn key_shape() {
        assert!(valid_key("abcdefghijklmnopqrstuv"));
        assert!(valid_key(&"a".repeat(64)));
        assert!(valid_key("0b9f6c1e-8a9d-4c3e-9f2a-1d2c3b4a5e6f"));
        assert!(!valid_key(&"a".repeat(21)));
        assert!(!valid_key(&"a".repeat(65)));
        assert!(!valid_key("abcdefghijklmnopqrstu!"));
        assert!(!valid_key("abcdefghijk mnopqrstuvw"));
    }
}
