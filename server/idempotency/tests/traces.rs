//! What a team sees in its logs (contract 10.4): the first keyed write with no account is
//! logged as a likely misconfiguration (authentication inside the layer), and the layer's
//! own answers are traced at debug level with the key's account and route.
//!
//! Each test runs on a current-thread runtime with a capturing subscriber as the thread's
//! default, so the layer's tasks (spawned on the same thread) log into it.

mod support;

use axum::body::Body;
use axum::extract::Request;
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::*;
use sw_outbox_idempotency::{IdempotencyLayer, SqliteLedger};

// (`pool` and `pg` come from `support`.)
use tower::ServiceExt;

/// Everything logged, as text.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().expect("log"))
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

fn capture(level: tracing::Level) -> (Captured, tracing::subscriber::DefaultGuard) {
    let log = Captured::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    (log, tracing::subscriber::set_default(subscriber))
}

#[derive(Clone)]
struct User(String);

async fn authenticate(mut req: Request, next: Next) -> Response {
    let user = req
        .headers()
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    match user {
        Some(u) => {
            req.extensions_mut().insert(User(u));
            next.run(req).await
        }
        None => StatusCode::UNAUTHORIZED.into_response(),
    }
}

/// Set by the "held" write when its route starts; it then waits until `RELEASED`.
static STARTED: AtomicBool = AtomicBool::new(false);
static RELEASED: AtomicBool = AtomicBool::new(false);

async fn order(body: String) -> (StatusCode, String) {
    if body == "held" {
        STARTED.store(true, Ordering::SeqCst);
        while !RELEASED.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    (StatusCode::CREATED, format!("ordered {body}"))
}

fn account(r: &Parts) -> Option<String> {
    r.extensions.get::<User>().map(|u| u.0.clone())
}

async fn send(app: &Router, key: &str, body: &'static str) -> (u16, String) {
    let req = axum::http::Request::builder()
        .method("POST")
        .uri("/orders")
        .header("x-user", "alice")
        .header("idempotency-key", key)
        .body(Body::from(body))
        .expect("request");
    let resp = app.clone().oneshot(req).await.expect("infallible");
    let status = resp.status().as_u16();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .expect("body");
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The common axum mistake: authentication added before the layer, so it runs inside it
/// and the layer sees no account. Every keyed write then runs unprotected; the first one
/// says so, once, at warn level.
#[tokio::test]
async fn a_keyed_write_with_no_account_is_logged_once_as_a_misconfiguration() {
    let (log, _guard) = capture(tracing::Level::INFO);
    let ledger = Arc::new(SqliteLedger::open(":memory:").expect("ledger"));
    let app = Router::new()
        .route("/orders", post(order))
        .layer(middleware::from_fn(authenticate))
        .layer(IdempotencyLayer::new(ledger, account).with_settings(fast_settings()));
    for _ in 0..3 {
        assert_eq!(send(&app, "k1", "pear").await.0, 201, "ran unprotected");
    }
    let warnings: Vec<_> = log
        .lines()
        .into_iter()
        .filter(|l| l.contains("WARN"))
        .collect();
    assert_eq!(warnings.len(), 1, "once: {warnings:?}");
    assert!(
        warnings[0].contains("no account") && warnings[0].contains("authentication"),
        "{}",
        warnings[0]
    );
    assert!(warnings[0].contains("path=/orders"), "{}", warnings[0]);
}

/// Replays, 409s, 422s and a full ledger, each traced at debug level with the account
/// and the route.
#[tokio::test]
async fn the_layers_answers_are_traced_with_account_and_route() {
    let (log, _guard) = capture(tracing::Level::DEBUG);
    let ledger = Arc::new(SqliteLedger::open(":memory:").expect("ledger"));
    let settings = fast().max_rows(3).build().expect("settings");
    let app = Router::new()
        .route("/orders", post(order))
        .layer(IdempotencyLayer::new(ledger, account).with_settings(settings))
        .layer(middleware::from_fn(authenticate));
    assert_eq!(send(&app, "k1", "pear").await.0, 201);
    assert_eq!(send(&app, "k1", "pear").await.0, 201, "a replay");
    assert_eq!(send(&app, "k1", "plum").await.0, 422);
    let held = tokio::spawn({
        let app = app.clone();
        async move { send(&app, "k2", "held").await }
    });
    while !STARTED.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The first copy runs until released; the copy waits 300 ms for it, then 409.
    assert_eq!(send(&app, "k2", "held").await.0, 409);
    RELEASED.store(true, Ordering::SeqCst);
    assert_eq!(held.await.expect("join").0, 201);
    assert_eq!(send(&app, "k3", "fig").await.0, 201);
    assert_eq!(send(&app, "k4", "kiwi").await.0, 503, "full");
    let traced: Vec<String> = log
        .lines()
        .into_iter()
        .filter(|l| l.contains("answered from the ledger"))
        .collect();
    let of = |what: &str| {
        traced
            .iter()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no trace of {what}: {traced:#?}"))
            .clone()
    };
    for line in [
        of("what=\"replayed\""),
        of("idempotency_key_reused"),
        of("idempotency_in_progress"),
        of("idempotency_ledger_full"),
    ] {
        assert!(line.contains("DEBUG"), "{line}");
        assert!(line.contains("account=alice"), "{line}");
        assert!(line.contains("route=POST /orders"), "{line}");
    }
}

/// `migrate()` runs at every start: on a table that exists it is silent (PostgreSQL's
/// "already exists, skipping" notices, which sqlx logs at info level, are not asked for).
#[tokio::test]
async fn migrate_is_quiet_when_the_table_exists() {
    let Some(server) = pg::server() else {
        return;
    };
    let url = server.fresh_database().await;
    let ledger = sw_outbox_idempotency::PgLedger::new(pool(&url).await);
    ledger.migrate().await.expect("first start");
    let (log, guard) = capture(tracing::Level::TRACE);
    ledger.migrate().await.expect("second start");
    ledger.migrate().await.expect("third start");
    drop(guard);
    let notices: Vec<String> = log
        .lines()
        .into_iter()
        .filter(|l| l.contains("notice") || l.contains("already exists"))
        .collect();
    assert!(notices.is_empty(), "{notices:#?}");
}
