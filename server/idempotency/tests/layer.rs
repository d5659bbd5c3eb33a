//! The layer on a plain axum app (not the reference server): one `.layer(…)` line, and
//! every state of the ledger reached through HTTP requests, on both ledgers.

mod support;

use axum::body::{to_bytes, Body, Bytes};
use axum::extract::State;
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use futures_util::{FutureExt, StreamExt};
use serde_json::{json, Value};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::*;
use sw_outbox_idempotency::{
    ClaimRequest, ClaimToken, Fingerprint, IdempotencyLayer, KeyRule, Scope, Settings,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::ServiceExt;

on_both_ledgers!(
    first_answer_then_replays,
    stored_headers_are_replayed_and_no_others,
    keys_are_checked_by_the_rule,
    a_key_reused_for_another_request,
    a_duplicate_waits_for_the_running_first_attempt,
    in_progress_after_the_wait_and_alive_past_the_stale_bound,
    a_cancelled_request_runs_to_its_end_and_its_retry_gets_the_answer,
    crash_window_a_claim_left_by_a_dead_process,
    an_answer_over_the_bound_is_stored_as_its_status,
    a_keyed_body_over_the_bound_is_refused_not_run,
    the_content_type_is_part_of_the_fingerprint,
    a_panicking_route_stores_500_and_the_panic_goes_on,
    a_busy_ledger_answers_503_retry_after_1,
    a_full_ledger_answers_503_and_forgets_no_key,
    expired_keys_apply_again_and_are_pruned,
    over_real_http,
    a_streamed_answer_is_passed_on_as_it_comes_and_stored_as_its_status,
);

/// What the routes count: how often each started and finished; and the gate a streaming
/// route waits at before its last chunk.
#[derive(Clone, Default)]
struct Counts {
    started: Arc<AtomicUsize>,
    finished: Arc<AtomicUsize>,
    gate: Arc<tokio::sync::Notify>,
}

impl Counts {
    fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }
    fn finished(&self) -> usize {
        self.finished.load(Ordering::SeqCst)
    }
}

#[derive(Clone)]
struct AppState {
    counts: Counts,
    big: usize,
}

async fn order(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let n = s.counts.started.fetch_add(1, Ordering::SeqCst) + 1;
    let sleep = headers
        .get("x-sleep-ms")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(sleep)).await;
    s.counts.finished.fetch_add(1, Ordering::SeqCst);
    let mut resp = (
        StatusCode::CREATED,
        axum::Json(json!({ "order": n, "body": String::from_utf8_lossy(&body) })),
    )
        .into_response();
    resp.headers_mut().insert(
        "location",
        HeaderValue::from_str(&format!("/orders/{n}")).unwrap(),
    );
    resp
}

async fn report(State(s): State<AppState>) -> Response {
    s.counts.started.fetch_add(1, Ordering::SeqCst);
    let mut resp = "a,b\n1,2\n".into_response();
    let h = resp.headers_mut();
    h.insert("content-type", HeaderValue::from_static("text/csv"));
    h.insert(
        "content-disposition",
        HeaderValue::from_static("attachment; filename=\"r.csv\""),
    );
    h.insert("x-not-stored", HeaderValue::from_static("1"));
    resp
}

async fn unavailable(State(s): State<AppState>) -> Response {
    s.counts.started.fetch_add(1, Ordering::SeqCst);
    let mut resp = (
        StatusCode::SERVICE_UNAVAILABLE,
        axum::Json(json!({ "detail": "db_down" })),
    )
        .into_response();
    resp.headers_mut()
        .insert("retry-after", HeaderValue::from_static("4"));
    resp
}

async fn big(State(s): State<AppState>) -> Response {
    s.counts.started.fetch_add(1, Ordering::SeqCst);
    vec![b'x'; s.big].into_response()
}

async fn length(State(s): State<AppState>, body: Bytes) -> Response {
    s.counts.started.fetch_add(1, Ordering::SeqCst);
    body.len().to_string().into_response()
}

/// Answers at once without reading the request body.
async fn unread(State(s): State<AppState>) -> Response {
    s.counts.started.fetch_add(1, Ordering::SeqCst);
    "ok".into_response()
}

async fn boom(State(s): State<AppState>) -> Response {
    s.counts.started.fetch_add(1, Ordering::SeqCst);
    panic!("the route failed");
}

/// A streamed answer: its first chunk at once, the last one only when the test opens the
/// gate (so "the handler finishes" after the client read the first chunk, or never).
fn gated_stream(
    s: &AppState,
    content_type: &'static str,
    first: &'static str,
    last: &'static str,
) -> Response {
    s.counts.started.fetch_add(1, Ordering::SeqCst);
    let (gate, counts) = (s.counts.gate.clone(), s.counts.clone());
    let first =
        futures_util::stream::once(async move { Ok::<_, std::io::Error>(Bytes::from(first)) });
    let last = futures_util::stream::once(async move {
        gate.notified().await;
        counts.finished.fetch_add(1, Ordering::SeqCst);
        Ok::<_, std::io::Error>(Bytes::from(last))
    });
    let mut resp = Body::from_stream(first.chain(last)).into_response();
    resp.headers_mut()
        .insert("content-type", HeaderValue::from_static(content_type));
    resp
}

async fn events(State(s): State<AppState>) -> Response {
    gated_stream(&s, "text/event-stream", "data: one\n\n", "data: two\n\n")
}

async fn stream(State(s): State<AppState>) -> Response {
    gated_stream(
        &s,
        "application/x-ndjson",
        "{\"part\":1}\n",
        "{\"part\":2}\n",
    )
}

async fn count(State(s): State<AppState>) -> String {
    s.counts.started.fetch_add(1, Ordering::SeqCst);
    "counted".into()
}

/// A plain axum app, as a user of the crate writes one. The account is whatever the app's
/// authentication decided; here, an `x-user` header.
fn plain_app(ledger: &TestLedger, settings: Settings) -> (Router, Counts) {
    let counts = Counts::default();
    let state = AppState {
        counts: counts.clone(),
        big: settings.max_stored_answer() + 1,
    };
    let router = Router::new()
        .route("/orders", post(order).delete(order).get(count))
        .route("/report", post(report))
        .route("/unavailable", post(unavailable))
        .route("/big", post(big))
        .route("/length", post(length))
        .route("/unread", post(unread))
        .route("/panic", post(boom))
        .route("/events", post(events))
        .route("/stream", post(stream))
        .with_state(state)
        .layer(
            IdempotencyLayer::new(as_ledger(ledger), |r: &Parts| {
                r.headers.get("x-user")?.to_str().ok().map(str::to_owned)
            })
            .with_settings(settings),
        );
    (router, counts)
}

struct Answer {
    status: u16,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
    fn detail(&self) -> String {
        self.json()["detail"].as_str().unwrap_or("").to_owned()
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    fn replayed(&self) -> bool {
        self.header("idempotent-replayed") == Some("true")
    }
}

fn request(method: &str, path: &str, headers: &[(&str, &str)], body: Body) -> Request<Body> {
    let mut b = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(body).expect("request")
}

async fn call(app: &Router, req: Request<Body>) -> Answer {
    let resp = app.clone().oneshot(req).await.expect("infallible");
    let (parts, body) = resp.into_parts();
    Answer {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: to_bytes(body, usize::MAX).await.expect("answer body"),
    }
}

/// POST `path` as `user` with `key` (when given) and `body`.
async fn post_as(app: &Router, user: &str, key: Option<&str>, path: &str, body: &str) -> Answer {
    let mut h = vec![("x-user", user)];
    if let Some(k) = key {
        h.push(("idempotency-key", k));
    }
    call(app, request("POST", path, &h, Body::from(body.to_owned()))).await
}

async fn first_answer_then_replays(backend: Backend) {
    let Some(ledger) = ledger_on(backend).await else {
        return;
    };
    let (app, counts) = plain_app(&ledger, fast_settings());
    let first = post_as(&app, "alice", Some("order-1"), "/orders", "two apples").await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    let again = post_as(&app, "alice", Some("order-1"), "/orders", "two apples").await;
    assert_eq!(again.status, 201);
    assert!(again.replayed());
    assert_eq!(again.body, first.body);
    assert_eq!(again.header("location"), Some("/orders/1"));
    assert_eq!(again.header("content-type"), Some("application/json"));
    assert_eq!(counts.started(), 1, "the route ran once");

    // The scope is (account, key): bob's identical key is bob's own write.
    let bob = post_as(&app, "bob", Some("order-1"), "/orders", "two apples").await;
    assert_eq!((bob.status, bob.replayed()), (201, false));
    assert_eq!(bob.json()["order"], 2);
    // No key, no account, or not a write: the route runs every time.
    post_as(&app, "alice", None, "/orders", "x").await;
    post_as(&app, "alice", None, "/orders", "x").await;
    let anonymous = call(
        &app,
        request(
            "POST",
            "/orders",
            &[("idempotency-key", "order-1")],
            Body::from("x"),
        ),
    )
    .await;
    assert!(!anonymous.replayed());
    let h = [("x-user", "alice"), ("idempotency-key", "order-1")];
    for _ in 0..2 {
        assert!(!call(&app, request("GET", "/orders", &h, Body::empty()))
            .await
            .replayed());
    }
    assert_eq!(counts.started(), 2 + 2 + 1 + 2);
    // DELETE is a write like the others.
    let d = [("x-user", "alice"), ("idempotency-key", "delete-1")];
    call(&app, request("DELETE", "/orders", &d, Body::empty())).await;
    let d2 = call(&app, request("DELETE", "/orders", &d, Body::empty())).await;
    assert!(d2.replayed());
    assert_eq!(counts.started(), 8);
}

async fn stored_headers_are_replayed_and_no_others(backend: Backend) {
    let Some(ledger) = ledger_on(backend).await else {
        return;
    };
    let (app, counts) = plain_app(&ledger, fast_settings());
    let r1 = post_as(&app, "alice", Some("report"), "/report", "").await;
    assert_eq!(
        r1.header("x-not-stored"),
        Some("1"),
        "the first answer is whole"
    );
    let r2 = post_as(&app, "alice", Some("report"), "/report", "").await;
    assert!(r2.replayed());
    assert_eq!(r2.header("content-type"), Some("text/csv"));
    assert_eq!(
        r2.header("content-disposition"),
        Some("attachment; filename=\"r.csv\"")
    );
    assert_eq!(r2.header("x-not-stored"), None);
    assert_eq!(r2.body, r1.body);

    // A server error is an answer too: stored with its Retry-After, never run again.
    let u1 = post_as(&app, "alice", Some("unavailable"), "/unavailable", "").await;
    let u2 = post_as(&app, "alice", Some("unavailable"), "/unavailable", "").await;
    assert_eq!((u1.status, u2.status), (503, 503));
    assert!(u2.replayed());
    assert_eq!(u2.header("retry-after"), Some("4"));
    assert_eq!(u2.detail(), "db_down");
    assert_eq!(counts.started(), 2);
}

async fn keys_are_checked_by_the_rule(backend: Backend) {
    let Some(ledger) = ledger_on(backend).await else {
        return;
    };
    let (app, counts) = plain_app(&ledger, fast_settings());
    let long = "k".repeat(256);
    for bad in ["", long.as_str(), "has space"] {
        let r = post_as(&app, "alice", Some(bad), "/orders", "x").await;
        assert_eq!(
            (r.status, r.detail().as_str()),
            (400, "idempotency_key_invalid"),
            "{bad:?}"
        );
    }
    let twice = call(
        &app,
        request(
            "POST",
            "/orders",
            &[
                ("x-user", "alice"),
                ("idempotency-key", "a"),
                ("idempotency-key", "b"),
            ],
            Body::from("x"),
        ),
    )
    .await;
    assert_eq!(twice.status, 400, "two keys are no key");
    assert_eq!(counts.started(), 0);
    let hash = "f".repeat(80);
    for good in [
        "order_1234",
        "k:7f3e",
        hash.as_str(),
        "0b9f6c1e-8a9d-4c3e-9f2a-1d2c3b4a5e6f",
    ] {
        let r = post_as(&app, "alice", Some(good), "/orders", "x").await;
        assert_eq!(r.status, 201, "{good}");
        assert!(post_as(&app, "alice", Some(good), "/orders", "x")
            .await
            .replayed());
    }
    assert_eq!(counts.started(), 4);

    let strict = fast().key_rule(KeyRule::Strict).build().expect("valid");
    let (app, _) = plain_app(&ledger, strict);
    let r = post_as(&app, "alice", Some("order_1234"), "/orders", "x").await;
    assert_eq!(
        (r.status, r.detail().as_str()),
        (400, "idempotency_key_invalid")
    );
    let r = post_as(
        &app,
        "alice",
        Some("7d4c1e2a-0b9f-4c3e-9f2a-1d2c3b4a5e6f"),
        "/orders",
        "y",
    )
    .await;
    assert_eq!(r.status, 201);
}

async fn a_key_reused_for_another_request(backend: Backend) {
    let Some(ledger) = ledger_on(backend).await else {
        return;
    };
    let (app, counts) = plain_app(&ledger, fast_settings());
    assert_eq!(
        post_as(&app, "alice", Some("reuse"), "/orders", "a")
            .await
            .status,
        201
    );
    for (method, path, body) in [
        ("POST", "/orders", "b"),
        ("POST", "/orders?x=1", "a"),
        ("POST", "/report", "a"),
        ("DELETE", "/orders", "a"),
    ] {
        let h = [("x-user", "alice"), ("idempotency-key", "reuse")];
        let r = call(&app, request(method, path, &h, Body::from(body))).await;
        assert_eq!(
            (r.status, r.detail().as_str()),
            (422, "idempotency_key_reused"),
            "{method} {path} {body}"
        );
    }
    assert_eq!(counts.started(), 1);
}

fn slow(ms: u64) -> String {
    ms.to_string()
}

async fn post_slow(app: &Router, key: &str, ms: u64) -> Answer {
    let ms = slow(ms);
    let h = [
        ("x-user", "alice"),
        ("idempotency-key", key),
        ("x-sleep-ms", ms.as_str()),
    ];
    call(app, request("POST", "/orders", &h, Body::from("slow"))).await
}

async fn a_duplicate_waits_for_the_running_first_attempt(backend: Backend) {
    let Some(ledger) = ledger_on(backend).await else {
        return;
    };
    let (app, counts) = plain_app(&ledger, fast_settings());
    let first = {
        let app = app.clone();
        tokio::spawn(async move { post_slow(&app, "wait", 150).await })
    };
    while counts.started() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let dup = post_slow(&app, "wait", 150).await;
    let first = first.await.expect("join");
    assert_eq!((first.status, first.replayed()), (201, false));
    assert_eq!(
        (dup.status, dup.replayed()),
        (201, true),
        "{}",
        dup.detail()
    );
    assert_eq!(dup.body, first.body);
    assert_eq!(counts.started(), 1);
}

async fn in_progress_after_the_wait_and_alive_past_the_stale_bound(backend: Backend) {
    let Some(ledger) = ledger_on(backend).await else {
        return;
    };
    let (app, counts) = plain_app(&ledger, fast_settings());
    // Longer than stale_after (600 ms): only the heartbeat keeps the claim alive.
    let first = {
        let app = app.clone();
        tokio::spawn(async move { post_slow(&app, "long", 1500).await })
    };
    while counts.started() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let dup = post_slow(&app, "long", 1500).await;
    assert_eq!(
        (dup.status, dup.detail().as_str()),
        (409, "idempotency_in_progress")
    );
    tokio::time::sleep(Duration::from_millis(700)).await;
    let dup = post_slow(&app, "long", 1500).await;
    assert_eq!(
        dup.detail(),
        "idempotency_in_progress",
        "alive, not unknown"
    );
    let first = first.await.expect("join");
    assert_eq!(first.status, 201);
    assert!(post_slow(&app, "long", 1500).await.replayed());
    assert_eq!(counts.started(), 1);
}

/// A client that goes away mid-route (hyper drops the request's future when its
/// connection closes): the claim is committed and the route started, and it runs to its
/// end anyway, so its answer is stored and the client's retry gets it, instead of
/// "outcome unknown". (One that goes away before its route started has its claim removed
/// instead: claim_race.rs.)
async fn a_cancelled_request_runs_to_its_end_and_its_retry_gets_the_answer(backend: Backend) {
    let Some(ledger) = ledger_on(backend).await else {
        return;
    };
    let (app, counts) = plain_app(&ledger, fast_settings());
    {
        let first = post_slow(&app, "cut", 1200);
        tokio::pin!(first);
        // Cut off once the route has started (its 1.2 s sleep under way).
        let started = async {
            while counts.started() == 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        tokio::select! {
            _ = &mut first => panic!("the first attempt answered before it was cut off"),
            _ = started => {}
        }
    }
    assert_eq!((counts.started(), counts.finished()), (1, 0));
    // Right after: the route still runs, so the key is in progress (the wait is 300 ms).
    assert_eq!(
        post_slow(&app, "cut", 0).await.detail(),
        "idempotency_in_progress"
    );
    // Past the stale bound (600 ms) it is still alive: its heartbeat goes on.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_ne!(
        post_slow(&app, "cut", 0).await.detail(),
        "idempotency_outcome_unknown",
        "a route left running is not unknown"
    );
    // Once it ended: its answer, replayed; the route ran once.
    for _ in 0..200 {
        if counts.finished() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        (counts.started(), counts.finished()),
        (1, 1),
        "ran to its end"
    );
    let r = post_slow(&app, "cut", 0).await;
    assert_eq!(r.status, 201);
    assert!(r.replayed(), "the stored answer");
    assert_eq!(
        (counts.started(), counts.finished()),
        (1, 1),
        "never run again"
    );
}

/// The crash window, as a process that died after committing its claim: the claim is there,
/// nobody heartbeats it.
async fn crash_window_a_claim_left_by_a_dead_process(backend: Backend) {
    let Some(ledger) = ledger_on(backend).await else {
        return;
    };
    let scope = Scope::new("alice", "orphan");
    let fp = Fingerprint::new("POST", "/orders", sha256(b"slow"));
    let claimed = ledger
        .begin(&ClaimRequest::new(
            scope,
            fp,
            ClaimToken("dead process".into()),
        ))
        .await
        .expect("claim");
    assert_eq!(claimed, sw_outbox_idempotency::Begin::Claimed);
    // Nobody heartbeats it: past the stale bound (600 ms) it is a dead process's claim.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (app, counts) = plain_app(&ledger, fast_settings());
    let r = post_slow(&app, "orphan", 0).await;
    assert_eq!(
        (r.status, r.detail().as_str()),
        (409, "idempotency_outcome_unknown")
    );
    assert_eq!(counts.started(), 0);
}

fn sha256(b: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(b).into()
}

async fn an_answer_over_the_bound_is_stored_as_its_status(backend: Backend) {
    let Some(ledger) = ledger_on(backend).await else {
        return;
    };
    let settings = fast().max_stored_answer(1000).build().expect("valid");
    let (app, counts) = plain_app(&ledger, settings);
    let first = post_as(&app, "alice", Some("big"), "/big", "").await;
    assert_eq!(
        (first.status, first.body.len()),
        (200, 1001),
        "the first answer is whole"
    );
    let again = post_as(&app, "alice", Some("big"), "/big", "").await;
    assert_eq!(
        (again.status, again.detail().as_str()),
        (409, "idempotency_replay_unavailable")
    );
    assert_eq!(again.json()["status"], 200, "what the write answered");
    assert!(again.replayed());
    assert_eq!(counts.started(), 1, "and it did not run again");
}

/// Fail closed (contract 10.4): a keyed write whose body the layer cannot fingerprint is
/// refused with 413 naming the bound and how to raise it, never run unprotected (before:
/// it passed through, and each copy ran again). Without a key it is the app's as ever.
async fn a_keyed_body_over_the_bound_is_refused_not_run(backend: Backend) {
    let Some(ledger) = ledger_on(backend).await else {
        return;
    };
    let settings = fast().max_request_body(1000).build().expect("valid");
    let (app, counts) = plain_app(&ledger, settings);
    let body = "b".repeat(1001);
    for _ in 0..2 {
        let r = post_as(&app, "alice", Some("huge"), "/length", &body).await;
        assert_eq!(r.status, 413, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.detail(), "idempotency_body_too_large");
        assert_eq!(r.json()["max_request_body"], 1000);
        let message = r.json()["message"].as_str().unwrap_or("").to_owned();
        assert!(message.contains("1000 bytes"), "{message}");
        assert!(
            message.contains("max_request_body("),
            "how to raise it: {message}"
        );
    }
    assert_eq!(counts.started(), 0, "never run");
    // Without a key, no idempotency is asked for: the route gets the whole body.
    let r = post_as(&app, "alice", None, "/length", &body).await;
    assert_eq!((r.status, r.body.as_ref()), (200, b"1001".as_ref()));
    let at_bound = "b".repeat(1000);
    post_as(&app, "alice", Some("at-bound"), "/length", &at_bound).await;
    assert!(
        post_as(&app, "alice", Some("at-bound"), "/length", &at_bound)
            .await
            .replayed()
    );
    assert_eq!(counts.started(), 2);

    // A body that never ends: refused at the bound, without waiting for the rest.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    tx.send(Ok(Bytes::from(vec![b'c'; 600])))
        .await
        .expect("send");
    tx.send(Ok(Bytes::from(vec![b'c'; 600])))
        .await
        .expect("send");
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let h = [("x-user", "alice"), ("idempotency-key", "endless")];
    let answered = tokio::time::timeout(
        Duration::from_secs(10),
        call(
            &app,
            request("POST", "/unread", &h, Body::from_stream(stream)),
        ),
    )
    .await
    .expect("answered while the body was still open");
    assert_eq!(answered.status, 413);
    drop(tx);
    // A declared length over the bound is not even read.
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let h = [
        ("x-user", "alice"),
        ("idempotency-key", "declared"),
        ("content-length", "5000"),
    ];
    let answered = tokio::time::timeout(
        Duration::from_secs(10),
        call(
            &app,
            request("POST", "/unread", &h, Body::from_stream(stream)),
        ),
    )
    .await
    .expect("answered before any byte arrived");
    assert_eq!(answered.status, 413);
    drop(tx);
    assert_eq!(counts.started(), 2, "neither ran");
}

/// `Content-Type` is part of the fingerprint (contract 10.1): the same bytes as another
/// type are another request (before: the first answer was replayed to it).
async fn the_content_type_is_part_of_the_fingerprint(backend: Backend) {
    let Some(ledger) = ledger_on(backend).await else {
        return;
    };
    let (app, counts) = plain_app(&ledger, fast_settings());
    let send = |ct: &'static str| {
        let app = app.clone();
        async move {
            let h = [
                ("x-user", "alice"),
                ("idempotency-key", "typed"),
                ("content-type", ct),
            ];
            call(&app, request("POST", "/orders", &h, Body::from("a=1"))).await
        }
    };
    assert_eq!(send("application/x-www-form-urlencoded").await.status, 201);
    let same = send("Application/X-WWW-Form-URLencoded").await;
    assert!(same.replayed(), "the same type, however it is spelled");
    let other = send("text/plain").await;
    assert_eq!(
        (other.status, other.detail().as_str()),
        (422, "idempotency_key_reused")
    );
    assert_eq!(counts.started(), 1);
}

async fn a_panicking_route_stores_500_and_the_panic_goes_on(backend: Backend) {
    let Some(ledger) = ledger_on(backend).await else {
        return;
    };
    let (app, counts) = plain_app(&ledger, fast_settings());
    let h = [("x-user", "alice"), ("idempotency-key", "boom")];
    let first = AssertUnwindSafe(
        app.clone()
            .oneshot(request("POST", "/panic", &h, Body::empty())),
    )
    .catch_unwind()
    .await;
    assert!(first.is_err(), "the panic reached the caller");
    let later = call(&app, request("POST", "/panic", &h, Body::empty())).await;
    assert_eq!(later.status, 500);
    assert!(later.replayed());
    assert_eq!(later.json(), json!({ "detail": "Internal Server Error" }));
    assert_eq!(counts.started(), 1, "the route is not run again");
}

async fn a_busy_ledger_answers_503_retry_after_1(backend: Backend) {
    let Some((ledger, place)) = ledger_with(backend, Duration::from_millis(200)).await else {
        return;
    };
    let (app, counts) = plain_app(&ledger, fast_settings());
    let holder: Box<dyn std::any::Any + Send> = match &place {
        Place::Sqlite(file) => {
            let conn = rusqlite::Connection::open(&file.0).expect("second connection");
            conn.execute_batch("BEGIN IMMEDIATE")
                .expect("hold the write lock");
            Box::new(std::sync::Mutex::new(conn))
        }
        Place::Postgres(url) => {
            let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .expect("second connection");
            let task = tokio::spawn(conn);
            client
                .batch_execute("BEGIN; LOCK TABLE idempotency IN ACCESS EXCLUSIVE MODE")
                .await
                .expect("hold the table lock");
            Box::new((client, task))
        }
    };
    let r = post_as(&app, "alice", Some("busy"), "/orders", "x").await;
    assert_eq!(
        (r.status, r.detail().as_str()),
        (503, "idempotency_ledger_busy")
    );
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(counts.started(), 0);
    drop(holder);
    let mut status = 0;
    for _ in 0..50 {
        status = post_as(&app, "alice", Some("busy"), "/orders", "x")
            .await
            .status;
        if status != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(status, 201);
    assert_eq!(counts.started(), 1);
}

/// At its bound the ledger refuses new keys (503, `Retry-After` of when the oldest entry
/// expires, the route not run) and forgets none it holds: their retries are still replays.
async fn a_full_ledger_answers_503_and_forgets_no_key(backend: Backend) {
    let Some(ledger) = ledger_on(backend).await else {
        return;
    };
    let settings = fast()
        .max_rows(3)
        .in_progress_wait(Duration::from_millis(50))
        .build()
        .expect("valid");
    let (app, counts) = plain_app(&ledger, settings);
    for k in ["first", "second"] {
        assert_eq!(
            post_as(&app, "alice", Some(k), "/orders", "slow")
                .await
                .status,
            201
        );
    }
    // A running claim holds its place too.
    let running = {
        let app = app.clone();
        tokio::spawn(async move { post_slow(&app, "third", 400).await })
    };
    while counts.started() < 3 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let full = |r: &Answer, who: &str| {
        assert_eq!(
            (r.status, r.detail().as_str()),
            (503, "idempotency_ledger_full"),
            "{who}"
        );
        let after: u64 = r
            .header("retry-after")
            .and_then(|v| v.parse().ok())
            .expect("Retry-After in seconds");
        assert!(
            (3000..=3600).contains(&after),
            "the oldest entry expires in about the key window (1 h): {after}"
        );
    };
    for who in ["alice", "bob"] {
        full(
            &post_as(&app, who, Some("fourth"), "/orders", "x").await,
            who,
        );
    }
    assert_eq!(running.await.expect("join").status, 201);
    // Completed, every entry is still inside its window: still full.
    full(
        &post_as(&app, "alice", Some("fourth"), "/orders", "x").await,
        "after",
    );
    // Every key inside its window is still replayed, never run again.
    for k in ["first", "second", "third"] {
        let r = post_slow(&app, k, 400).await;
        assert_eq!((r.status, r.replayed()), (201, true), "{k}");
    }
    assert_eq!(counts.started(), 3);
    assert_eq!(ledger.entries().await.expect("entries"), 3);
}

async fn expired_keys_apply_again_and_are_pruned(backend: Backend) {
    let Some(ledger) = ledger_on(backend).await else {
        return;
    };
    let settings = fast()
        .key_ttl(Duration::from_millis(700))
        .prune_every(Duration::from_millis(10))
        .build()
        .expect("valid");
    let (app, counts) = plain_app(&ledger, settings);
    assert_eq!(
        post_as(&app, "alice", Some("ttl"), "/orders", "1")
            .await
            .status,
        201
    );
    assert_eq!(
        post_as(&app, "alice", Some("ttl"), "/orders", "2")
            .await
            .status,
        422
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    // Expired: the key is free again, for any request.
    let r = post_as(&app, "alice", Some("ttl"), "/orders", "2").await;
    assert_eq!((r.status, r.replayed()), (201, false));
    assert_eq!(counts.started(), 2);
    // Another wait, another request: the layer prunes what expired in the background.
    tokio::time::sleep(Duration::from_millis(800)).await;
    post_as(&app, "alice", Some("later"), "/orders", "3").await;
    let mut left = u64::MAX;
    for _ in 0..100 {
        left = ledger.entries().await.expect("len");
        if left == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(left, 1, "only the fresh entry is left");
}

/// The same app served by axum over a real socket.
async fn over_real_http(backend: Backend) {
    let Some(ledger) = ledger_on(backend).await else {
        return;
    };
    let (app, counts) = plain_app(&ledger, fast_settings());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let mut bodies = Vec::new();
    for _ in 0..2 {
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(
            b"POST /orders HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-User: alice\r\n\
              Idempotency-Key: over-http\r\nContent-Length: 4\r\n\r\npear",
        )
        .await
        .expect("write");
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.expect("read");
        bodies.push(String::from_utf8_lossy(&buf).into_owned());
    }
    server.abort();
    assert!(bodies[0].starts_with("HTTP/1.1 201"), "{}", bodies[0]);
    assert!(!bodies[0]
        .to_ascii_lowercase()
        .contains("idempotent-replayed"));
    assert!(bodies[1].starts_with("HTTP/1.1 201"), "{}", bodies[1]);
    assert!(bodies[1]
        .to_ascii_lowercase()
        .contains("idempotent-replayed: true"));
    assert!(
        bodies[1].ends_with(r#"{"body":"pear","order":1}"#),
        "{}",
        bodies[1]
    );
    assert_eq!(counts.started(), 1);
}

/// Two replicas (two apps, each with its own `PgLedger` pool on one database) take copies
/// of the same writes at the same moment: each write runs once, and every copy gets its
/// first answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_replicas_run_each_route_once() {
    const KEYS: usize = 30;
    const COPIES: usize = 8;
    let Some(server) = pg::server() else {
        return;
    };
    let url = server.fresh_database().await;
    // Long enough that no copy gives up while the first attempt runs.
    let settings = Settings::builder()
        .in_progress_wait(Duration::from_secs(20))
        .in_progress_poll(Duration::from_millis(10))
        .build()
        .expect("valid");
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let ledger: TestLedger =
            Arc::new(pg_ledger(&url, sw_outbox_idempotency::DEFAULT_LOCK_WAIT).await);
        replicas.push(plain_app(&ledger, settings.clone()));
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(KEYS * COPIES));
    let mut tasks = Vec::new();
    for k in 0..KEYS {
        for c in 0..COPIES {
            let app = replicas[c % 2].0.clone();
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                let key = format!("race-{k}");
                barrier.wait().await;
                (k, post_slow(&app, &key, 30).await)
            }));
        }
    }
    let mut first: Vec<Vec<Bytes>> = vec![Vec::new(); KEYS];
    let mut all: Vec<Vec<Bytes>> = vec![Vec::new(); KEYS];
    for t in tasks {
        let (k, a) = t.await.expect("join");
        assert_eq!(a.status, 201, "key {k}: {}", a.detail());
        if !a.replayed() {
            first[k].push(a.body.clone());
        }
        all[k].push(a.body);
    }
    let runs: usize = replicas.iter().map(|(_, c)| c.started()).sum();
    assert_eq!(runs, KEYS, "each write ran once");
    for k in 0..KEYS {
        assert_eq!(first[k].len(), 1, "key {k}: one first answer");
        assert!(
            all[k].iter().all(|b| *b == first[k][0]),
            "key {k}: one answer for all"
        );
    }
}

/// An SSE route and a plain streamed one (no length): over a real socket the client reads
/// the first chunk while the handler has not finished (it waits for the test), and a retry
/// gets 409 `idempotency_replay_unavailable` with the status: the write happened once, its
/// answer was not stored.
async fn a_streamed_answer_is_passed_on_as_it_comes_and_stored_as_its_status(backend: Backend) {
    let Some(ledger) = ledger_on(backend).await else {
        return;
    };
    let (app, counts) = plain_app(&ledger, fast_settings());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move { axum::serve(listener, app.clone()).await });
    for (n, (path, first, last)) in [
        ("/events", "data: one", "data: two"),
        ("/stream", "{\"part\":1}", "{\"part\":2}"),
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("stream-{n}");
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-User: alice\r\n\
             Idempotency-Key: {key}\r\nContent-Length: 0\r\n\r\n"
        );
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(request.as_bytes()).await.expect("write");
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        tokio::time::timeout(Duration::from_secs(10), async {
            while !String::from_utf8_lossy(&seen).contains(first) {
                let n = s.read(&mut buf).await.expect("read");
                assert!(n > 0, "closed before the first chunk");
                seen.extend_from_slice(&buf[..n]);
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{path}: the first chunk did not arrive while the handler ran"));
        assert_eq!(counts.finished(), n, "{path}: the handler has not finished");
        assert!(!String::from_utf8_lossy(&seen).contains(last));
        counts.gate.notify_one();
        s.read_to_end(&mut seen).await.expect("read the rest");
        let text = String::from_utf8_lossy(&seen);
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.contains(last), "{text}");
        assert_eq!(counts.finished(), n + 1);

        let mut retry = tokio::net::TcpStream::connect(addr).await.expect("connect");
        retry.write_all(request.as_bytes()).await.expect("write");
        let mut again = Vec::new();
        retry.read_to_end(&mut again).await.expect("read");
        let again = String::from_utf8_lossy(&again).to_ascii_lowercase();
        assert!(again.starts_with("http/1.1 409"), "{again}");
        assert!(again.contains("idempotent-replayed: true"), "{again}");
        assert!(
            again.ends_with(r#"{"detail":"idempotency_replay_unavailable","status":200}"#),
            "{again}"
        );
        assert_eq!(counts.started(), n + 1, "{path}: the route ran once");
    }
    server.abort();
}

/// The layer around a plain tower service whose request and response bodies are not
/// axum's (http-body-util's `Full` in, a `StreamBody` or `Full` out): keyed writes are
/// claimed, stored and replayed all the same.
#[tokio::test]
async fn any_body_types_in_and_out() {
    use http_body_util::{BodyExt, Full, StreamBody};
    use sw_outbox_idempotency::IdempotencyBody;
    use tower::{service_fn, Layer as _};
    type Out = http_body_util::Either<
        Full<Bytes>,
        StreamBody<
            futures_util::stream::Iter<
                std::vec::IntoIter<Result<http_body::Frame<Bytes>, std::io::Error>>,
            >,
        >,
    >;
    let ledger: TestLedger =
        Arc::new(sw_outbox_idempotency::SqliteLedger::open(":memory:").expect("ledger"));
    let runs = Arc::new(AtomicUsize::new(0));
    let inner = {
        let runs = runs.clone();
        service_fn(
            move |req: axum::http::Request<IdempotencyBody<Full<Bytes>>>| {
                let runs = runs.clone();
                async move {
                    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    let streamed = req.uri().path() == "/stream";
                    let body = req.into_body().collect().await.expect("body").to_bytes();
                    let text = format!("run {n}: {}", String::from_utf8_lossy(&body));
                    let out: Out = if streamed {
                        let frames = vec![Ok(http_body::Frame::data(Bytes::from(text)))];
                        http_body_util::Either::Right(StreamBody::new(futures_util::stream::iter(
                            frames,
                        )))
                    } else {
                        http_body_util::Either::Left(Full::new(Bytes::from(text)))
                    };
                    Ok::<_, std::convert::Infallible>(axum::http::Response::new(out))
                }
            },
        )
    };
    let svc = IdempotencyLayer::new(as_ledger(&ledger), |_: &Parts| Some("alice".to_owned()))
        .with_settings(fast_settings())
        .layer(inner);
    let send = |path: &'static str, key: &'static str| {
        let svc = svc.clone();
        async move {
            let req = axum::http::Request::post(path)
                .header("idempotency-key", key)
                .body(Full::new(Bytes::from_static(b"pear")))
                .expect("request");
            let resp = svc.oneshot(req).await.expect("infallible");
            let replayed = resp.headers().contains_key("idempotent-replayed");
            let status = resp.status().as_u16();
            let body = resp.into_body().collect().await.expect("answer").to_bytes();
            (status, replayed, body)
        }
    };
    assert_eq!(
        send("/full", "k1").await,
        (200, false, Bytes::from("run 1: pear"))
    );
    assert_eq!(
        send("/full", "k1").await,
        (200, true, Bytes::from("run 1: pear"))
    );
    assert_eq!(
        send("/stream", "k2").await,
        (200, false, Bytes::from("run 2: pear"))
    );
    let (status, replayed, body) = send("/stream", "k2").await;
    assert_eq!((status, replayed), (409, true));
    assert_eq!(
        body,
        r#"{"detail":"idempotency_replay_unavailable","status":200}"#
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    let _: fn(IdempotencyBody<Out>) = |_| {};
}
