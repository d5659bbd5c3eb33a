//! The PostgreSQL app in transactional mode: the order is written in the transaction that
//! holds the key's claim, and the layer stores the answer in it and commits once, after the
//! handler returns. Kill the process at any instant: the order and the key's answer were
//! committed together or not at all, so a retry gets the answer or runs the order once,
//! never "outcome unknown".
//!
//!     DATABASE_URL=postgres://app@127.0.0.1/app cargo run -p sw-outbox-idempotency \
//!         --example transactional --features postgres
//!     curl -i localhost:3000/api/orders -H 'x-user: alice' -H 'idempotency-key: order-1' -d 'two apples'

use axum::extract::Request;
use axum::http::{request::Parts, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use serde_json::json;
use sw_outbox_idempotency::{ClaimTransaction, IdempotencyLayer, PgLedger};

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

/// The write, in the claim's transaction: `tx.conn()` is its connection. The handler
/// never commits; the layer does, with the answer.
async fn create_order(
    Extension(tx): Extension<ClaimTransaction>,
    Extension(user): Extension<User>,
    body: String,
) -> Result<(StatusCode, Json<serde_json::Value>), StatusCode> {
    let mut conn = tx
        .conn()
        .await
        .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
    let id: i64 =
        sqlx::query_scalar("INSERT INTO orders (owner, items) VALUES ($1, $2) RETURNING id")
            .bind(&user.0)
            .bind(&body)
            .fetch_one(&mut *conn)
            .await
            .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
    Ok((
        StatusCode::CREATED,
        Json(json!({ "id": id, "user": user.0, "items": body })),
    ))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().init();
    let url = std::env::var("DATABASE_URL")?;
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .connect(&url)
        .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS orders (id BIGSERIAL PRIMARY KEY, owner TEXT, items TEXT)",
    )
    .execute(&db)
    .await?;
    let ledger = PgLedger::new(db);
    ledger.migrate().await?;

    // Keys are per account, as with the plain layer.
    let idempotency = IdempotencyLayer::transactional(ledger, |req: &Parts| {
        req.extensions.get::<User>().map(|u| u.0.clone())
    });
    let app = Router::new()
        .route("/api/orders", post(create_order))
        .layer(idempotency)
        // Added after the idempotency layer, so it runs first (see the quickstart).
        .layer(middleware::from_fn(authenticate));

    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
