//! An axum app whose `POST /api/orders` runs once per `Idempotency-Key`, however often a
//! client retries it.
//!
//!     cargo run -p sw-outbox-idempotency --example quickstart
//!     curl -i localhost:3000/api/orders -H 'x-user: alice' -H 'idempotency-key: order-1' -d 'two apples'
//!
//! Send the same curl twice: the second answer is the first one again, with
//! `idempotent-replayed: true`, and the order count stays at one. With another body the
//! key is refused (422); with another user, it is that user's own write.

use axum::extract::{Request, State};
use axum::http::{request::Parts, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use sw_outbox_idempotency::{IdempotencyLayer, Settings, SqliteLedger};

/// Who is signed in; your authentication puts it in the request.
#[derive(Clone)]
struct User(String);

/// Stands in for your authentication: the user is the `x-user` header.
async fn authenticate(mut req: Request, next: Next) -> Response {
    let user = req
        .headers()
        .get("x-user")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    match user {
        Some(name) => {
            req.extensions_mut().insert(User(name));
            next.run(req).await
        }
        None => StatusCode::UNAUTHORIZED.into_response(),
    }
}

/// The write that must not happen twice.
async fn create_order(
    State(orders): State<Arc<AtomicU64>>,
    Extension(user): Extension<User>,
    body: String,
) -> (StatusCode, Json<serde_json::Value>) {
    let id = orders.fetch_add(1, Ordering::SeqCst) + 1;
    let order = json!({ "id": id, "user": user.0, "items": body });
    (StatusCode::CREATED, Json(order))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().init();

    // The ledger: a SQLite file of its own (PgLedger for several instances).
    let ledger = Arc::new(SqliteLedger::open("idempotency.sqlite")?);
    // Keys live 24 hours after their write's last sign of life; the outbox's
    // `serverKeyTtlMs` must not be longer.
    let settings = Settings::builder()
        .key_ttl(Duration::from_secs(24 * 60 * 60))
        .build()?;
    // Keys are per account: the user `authenticate` put in the request.
    let idempotency = IdempotencyLayer::new(ledger, |req: &Parts| {
        req.extensions.get::<User>().map(|u| u.0.clone())
    })
    .with_settings(settings);

    let app = Router::new()
        .route("/api/orders", post(create_order))
        .layer(idempotency)
        // Authentication is added after the idempotency layer, so it runs first: the
        // layer then knows the account, and a request it refuses never reaches the
        // ledger. (Added before it, the layer sees no account, passes every keyed write
        // unprotected, and logs a warning saying so.)
        .layer(middleware::from_fn(authenticate))
        .with_state(Arc::new(AtomicU64::new(0)));

    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
