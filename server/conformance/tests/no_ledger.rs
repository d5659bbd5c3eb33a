//! The check must be able to fail: a server with sessions but no idempotency ledger (every
//! copy of a write runs), no CSRF token, no expected-account check, and a redirect to a
//! sign-in page for a signed-out `/auth/me`, as many frameworks do by default.

mod support;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use support::{conformance, expected};

#[derive(Clone, Default)]
struct Items(Arc<Mutex<Vec<Value>>>);

fn user(headers: &HeaderMap) -> Option<String> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok()?.strip_prefix("Bearer "))
        .map(str::to_owned);
    if bearer.is_some() {
        return bearer;
    }
    headers
        .get(header::COOKIE)?
        .to_str()
        .ok()?
        .split(';')
        .find_map(|c| c.trim().strip_prefix("sid="))
        .map(str::to_owned)
}

async fn login(Json(body): Json<Value>) -> Response {
    let (Some(id), Some(pw)) = (body["userId"].as_str(), body["password"].as_str()) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    if id != pw {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let cookie = format!("sid={id}; Path=/; HttpOnly");
    (
        [(header::SET_COOKIE, cookie)],
        Json(json!({ "user": { "id": id } })),
    )
        .into_response()
}

async fn me(headers: HeaderMap) -> Response {
    match user(&headers) {
        Some(id) => Json(json!({ "user": { "id": id } })).into_response(),
        None => (StatusCode::FOUND, [(header::LOCATION, "/login")]).into_response(),
    }
}

async fn create(State(items): State<Items>, headers: HeaderMap, body: String) -> Response {
    if user(&headers).is_none() {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({ "detail": "not_signed_in" })),
        )
            .into_response();
    }
    // Slow enough that raced copies overlap.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let mut items = items.0.lock().unwrap_or_else(|e| e.into_inner());
    let item = json!({ "id": items.len() + 1, "body": body });
    items.push(item.clone());
    (StatusCode::CREATED, Json(item)).into_response()
}

async fn list(State(items): State<Items>) -> Response {
    let items = items.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Json(json!({ "items": items })).into_response()
}

async fn start() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let app = Router::new()
        .route("/api/auth/login", post(login))
        .route("/api/auth/me", get(me))
        .route("/api/items", get(list).post(create))
        .with_state(Items::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, task)
}

#[tokio::test]
async fn a_server_without_a_ledger_fails_the_duties_that_keep_writes_single() {
    let (addr, task) = start().await;
    let run = conformance(
        addr,
        &[
            "--user",
            "carol",
            "--password",
            "carol",
            "--write",
            "POST /api/items",
            "--count",
            "/api/items",
            "--count-pointer",
            "/items",
            "--key-probe",
            "1s",
            "--key-ttl",
            "1h",
            "--second-user",
            "erin",
            "--second-password",
            "erin",
            "--json",
        ],
    )
    .await;
    assert_eq!(
        run.outcomes(),
        expected(&[
            ("auth-me", "fail"),
            ("replay", "fail"),
            ("concurrent-repeat", "fail"),
            ("key-reuse", "fail"),
            // No ledger: nothing to leak between accounts; the second account's write ran.
            ("keys-per-account", "pass"),
            ("expected-account", "not-supported"),
            ("csrf", "not-supported"),
            ("signed-out-write", "pass"),
            ("key-window", "fail"),
            ("page-keys", "pass"),
        ]),
        "{}",
        run.explain()
    );
    assert_eq!(run.status, Some(1), "a failed duty fails the run");
    let replay = run.finding("replay");
    assert!(
        replay["server"]
            .as_str()
            .is_some_and(|s| s.ends_with("ran 2 times")),
        "{replay}"
    );
    assert!(run.finding("auth-me")["outbox"]
        .as_str()
        .is_some_and(|s| s.contains("signed out, it answers 302")));
    task.abort();
}

#[tokio::test]
async fn without_a_count_route_or_a_replay_marker_nothing_is_claimed() {
    // No count route and no Idempotent-Replayed marker: a replay cannot be told from a
    // second run, so those duties say "not checked" rather than pass.
    let (addr, task) = start().await;
    let run = conformance(
        addr,
        &[
            "--user",
            "carol",
            "--password",
            "carol",
            "--write",
            "POST /api/items",
            "--no-count",
            "--key-probe",
            "1s",
            "--second-user",
            "erin",
            "--second-password",
            "erin",
            "--json",
        ],
    )
    .await;
    let outcomes = run.outcomes();
    for duty in [
        "replay",
        "key-window",
        "concurrent-repeat",
        "keys-per-account",
    ] {
        assert_eq!(outcomes[duty], "not-checked", "{duty}: {}", run.explain());
    }
    // A 2xx to another request under a used key is wrong whether or not it ran: a lost
    // write (the first answer replayed) or the key naming two writes.
    assert_eq!(outcomes["key-reuse"], "fail", "{}", run.explain());
    assert_eq!(
        run.status,
        Some(1),
        "auth-me still fails: {}",
        run.explain()
    );
    task.abort();
}

#[tokio::test]
async fn a_bearer_token_instead_of_a_cookie_sign_in() {
    let (addr, task) = start().await;
    let run = conformance(
        addr,
        &[
            "--bearer",
            "dave",
            "--account",
            "dave",
            "--write",
            "POST /api/items",
            "--count",
            "/api/items",
            "--count-pointer",
            "/items",
            "--key-probe",
            "1s",
            "--second-bearer",
            "erin",
            "--json",
        ],
    )
    .await;
    let me = run.finding("auth-me");
    assert!(
        me["server"]
            .as_str()
            .is_some_and(|s| s.contains("signed in: 200 user.id \"dave\"")),
        "{}",
        run.explain()
    );
    assert_eq!(
        run.outcomes()["replay"],
        "fail",
        "the token's writes were counted"
    );
    assert_eq!(
        run.outcomes()["signed-out-write"],
        "pass",
        "sent without the token"
    );
    let second = run.finding("keys-per-account");
    assert_eq!(second["outcome"], "pass", "{}", run.explain());
    assert!(
        second["server"]
            .as_str()
            .is_some_and(|s| s.starts_with("erin sent dave's key")),
        "the second token's account, read from /auth/me: {second}"
    );
    let run = conformance(addr, &["--bearer", "dave"]).await;
    assert_eq!(
        run.status,
        Some(2),
        "--bearer needs --account: {}",
        run.explain()
    );
    task.abort();
}
