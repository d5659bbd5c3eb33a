//! Each failure under the duty that failed (contract 10.6): a server that remembers every
//! key (never runs a write twice) but answers every repeat with a bare 409 fails the
//! replay duty, not the key window, which it keeps. (Before: the key-window duty read the
//! 409 after `--key-probe` as "the key was forgotten".)

mod support;

use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use support::conformance;

#[derive(Clone, Default)]
struct Server {
    keys: Arc<Mutex<HashSet<String>>>,
    items: Arc<Mutex<Vec<Value>>>,
}

async fn login(Json(body): Json<Value>) -> Response {
    let id = body["userId"].as_str().unwrap_or("").to_owned();
    let cookie = format!("sid={id}; Path=/; HttpOnly");
    (
        [(header::SET_COOKIE, cookie)],
        Json(json!({ "user": { "id": id } })),
    )
        .into_response()
}

fn user(headers: &HeaderMap) -> Option<String> {
    headers
        .get(header::COOKIE)?
        .to_str()
        .ok()?
        .split(';')
        .find_map(|c| c.trim().strip_prefix("sid="))
        .map(str::to_owned)
}

async fn me(headers: HeaderMap) -> Response {
    match user(&headers) {
        Some(id) => Json(json!({ "user": { "id": id } })).into_response(),
        None => (StatusCode::UNAUTHORIZED, Json(json!({ "user": null }))).into_response(),
    }
}

/// Runs each key once; every repeat, whatever it is, gets a bare 409.
async fn create(State(s): State<Server>, headers: HeaderMap, body: String) -> Response {
    let Some(account) = user(&headers) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(|k| format!("{account}/{k}"));
    if let Some(k) = key {
        if !s.keys.lock().expect("keys").insert(k) {
            return (StatusCode::CONFLICT, "Conflict").into_response();
        }
    }
    let mut items = s.items.lock().expect("items");
    let item = json!({ "id": items.len() + 1, "body": body });
    items.push(item.clone());
    (StatusCode::CREATED, Json(item)).into_response()
}

async fn list(State(s): State<Server>) -> Response {
    let items = s.items.lock().expect("items").clone();
    Json(json!({ "items": items })).into_response()
}

#[tokio::test]
async fn a_remembered_key_answered_409_fails_replay_not_the_key_window() {
    let app = Router::new()
        .route("/api/auth/login", post(login))
        .route("/api/auth/me", get(me))
        .route("/api/items", get(list).post(create))
        .with_state(Server::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
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
            "--json",
        ],
    )
    .await;
    let outcomes = run.outcomes();
    assert_eq!(outcomes["key-window"], "pass", "{}", run.explain());
    assert_eq!(outcomes["replay"], "fail", "{}", run.explain());
    let window = run.finding("key-window");
    assert!(
        window["notes"]
            .as_array()
            .is_some_and(|n| n.iter().any(|n| n
                .as_str()
                .is_some_and(|n| n.contains("reported under replay")))),
        "{window}"
    );
    let replay = run.finding("replay");
    assert!(
        replay["notes"]
            .as_array()
            .is_some_and(|n| n.iter().any(|n| n
                .as_str()
                .is_some_and(|n| n.contains("seen in the key-window check")))),
        "{replay}"
    );
    task.abort();
}
