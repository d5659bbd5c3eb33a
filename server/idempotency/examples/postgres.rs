//! The quickstart's app on PostgreSQL, as it runs behind a load balancer: the ledger on
//! the app's own sqlx pool (the one its handlers use), its table made by the app's start-up
//! (or by the app's migrations: `migrations/postgres/idempotency.sql`).
//!
//!     DATABASE_URL=postgres://app@127.0.0.1/app cargo run -p sw-outbox-idempotency \
//!         --example postgres --features postgres
//!     curl -i localhost:3000/api/orders -H 'x-user: alice' -H 'idempotency-key: order-1' -d 'two apples'
//!
//! Start it twice (`PORT=3001` for the second) and send copies of one write to both: it
//! is applied once. For TLS, add `?sslmode=verify-full&sslrootcert=ca.pem` to the URL and
//! build with a TLS feature (this crate's `postgres-rustls`, or your sqlx's own).

use axum::extract::{Request, State};
use axum::http::{request::Parts, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Json, Router};
use serde_json::json;
use sqlx::PgPool;
use std::sync::Arc;
use sw_outbox_idempotency::{IdempotencyLayer, PgLedger, TableName};

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

/// The write that must not happen twice, in the same database as the ledger.
async fn create_order(
    State(db): State<PgPool>,
    Extension(user): Extension<User>,
    body: String,
) -> Result<(StatusCode, Json<serde_json::Value>), StatusCode> {
    let id: i64 =
        sqlx::query_scalar("INSERT INTO orders (owner, items) VALUES ($1, $2) RETURNING id")
            .bind(&user.0)
            .bind(&body)
            .fetch_one(&db)
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

    // The ledger on the same pool, in a table of the app's naming.
    let ledger = PgLedger::new(db.clone()).with_table(TableName::new("idempotency_keys")?);
    ledger.migrate().await?;

    let idempotency = IdempotencyLayer::new(Arc::new(ledger), |req: &Parts| {
        req.extensions.get::<User>().map(|u| u.0.clone())
    });
    let app = Router::new()
        .route("/api/orders", post(create_order))
        .layer(idempotency)
        .layer(middleware::from_fn(authenticate))
        .with_state(db);

    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
