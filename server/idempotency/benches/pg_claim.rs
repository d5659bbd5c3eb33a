//! How many claims a second one process gets from the PostgreSQL ledger, by pool: the
//! numbers behind the crate README's choice of sqlx's `PgPool`.
//!
//! `cargo bench -p sw-outbox-idempotency --bench pg_claim [-- --claims N --tasks N --prefill N --rounds N]`
//!
//! A throwaway PostgreSQL (as the tests start one), a pool of 16 connections, `--tasks`
//! concurrent requests each claiming new keys (claim, then store an answer: the two ledger
//! transactions of every keyed write), in a table that already holds `--prefill` entries.
//! Three ways, alternated, `--rounds` rounds each (5) after a warm-up; the median is
//! printed:
//!
//! - `PgLedger (sqlx PgPool)`: the crate as shipped (each call in a task of its own);
//! - `sqlx PgPool, inline`: the same statements on the same pool, awaited in place;
//! - `tokio-postgres + deadpool`: the same statements on tokio-postgres behind a
//!   deadpool-postgres pool (prepared statements cached per connection), the other common
//!   pool of axum apps (and what this crate used before).
//!
//! Timings are printed, never asserted.

#[path = "../tests/support/pg.rs"]
mod pg;

use sha2::{Digest, Sha256};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;
use sw_outbox_idempotency::{
    Begin, ClaimRequest, ClaimToken, Fingerprint, Ledger, PgLedger, Scope, StoredAnswer,
};

const POOL: u32 = 16;
const BEGIN: &str = "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = 2000";
const NOW_MS: &str = "(extract(epoch from statement_timestamp()) * 1000)::bigint";

fn insert_sql() -> String {
    format!(
        "INSERT INTO idempotency (account, idem_key, method, path, body_sha256, claim_token,
             state, created_ms, heartbeat_ms)
         VALUES ($1, $2, $3, $4, $5, $6, 'running', {NOW_MS}, {NOW_MS})
         ON CONFLICT (account, idem_key) DO NOTHING"
    )
}

fn complete_sql() -> String {
    format!(
        "UPDATE idempotency SET state = 'completed', status = $4, headers = $5, body = $6,
             heartbeat_ms = {NOW_MS}
         WHERE account = $1 AND idem_key = $2 AND claim_token = $3 AND state = 'running'"
    )
}

/// PgLedger's check of the row bound: the planner's estimate when far below it, else an
/// exact count.
const COUNT: &str = "SELECT CASE
        WHEN c.reltuples >= 0 AND c.reltuples < $1::bigint::float8 / 2
             AND $1::bigint::float8 - c.reltuples > 10000 THEN -1
        ELSE (SELECT count(*) FROM idempotency)
    END
    FROM pg_class c WHERE c.oid = to_regclass('\"idempotency\"')";

struct Args {
    claims: usize,
    tasks: usize,
    prefill: usize,
    rounds: usize,
    /// The row bound the claims are made under (`--max-rows`, default a million: far
    /// above the table, so the planner's estimate stands in for the count).
    max_rows: i64,
}

fn args() -> Args {
    let mut a = Args {
        claims: 3000,
        tasks: 16,
        prefill: 0,
        rounds: 5,
        max_rows: 1_000_000,
    };
    let argv: Vec<String> = std::env::args().collect();
    for w in argv.windows(2) {
        let n = w[1].parse().ok();
        match (w[0].as_str(), n) {
            ("--claims", Some(n)) => a.claims = n,
            ("--tasks", Some(n)) => a.tasks = n,
            ("--prefill", Some(n)) => a.prefill = n,
            ("--rounds", Some(n)) => a.rounds = n,
            ("--max-rows", Some(n)) => a.max_rows = n as i64,
            _ => {}
        }
    }
    a
}

/// One way of claiming and completing a key.
#[derive(Clone)]
enum Way {
    Ledger(Arc<PgLedger>, i64),
    SqlxInline(sqlx::PgPool, i64),
    Deadpool(deadpool_postgres::Pool, i64),
}

impl Way {
    fn name(&self) -> &'static str {
        match self {
            Way::Ledger(..) => "PgLedger (sqlx PgPool)",
            Way::SqlxInline(..) => "sqlx PgPool, inline",
            Way::Deadpool(..) => "tokio-postgres + deadpool",
        }
    }

    async fn write(&self, key: &str) {
        let sha: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        let token = format!("token-{key}");
        let headers = r#"[["content-type","application/json"]]"#;
        match self {
            Way::Ledger(l, max_rows) => {
                let scope = Scope::new("bench", key);
                let claim = ClaimRequest::new(
                    scope.clone(),
                    Fingerprint::new("POST", "/api/x", sha),
                    ClaimToken(token.clone()),
                )
                .with_max_rows(*max_rows as u64, None);
                assert_eq!(l.begin(&claim).await.expect("begin"), Begin::Claimed);
                let answer = StoredAnswer::new(
                    201,
                    vec![("content-type".into(), "application/json".into())],
                    b"{}".to_vec(),
                );
                l.complete(&scope, &ClaimToken(token), &answer)
                    .await
                    .expect("complete");
            }
            Way::SqlxInline(pool, max_rows) => {
                let mut conn = pool.acquire().await.expect("acquire");
                let mut tx = sqlx::Connection::begin_with(&mut *conn, BEGIN)
                    .await
                    .expect("begin");
                let n = sqlx::query(&insert_sql())
                    .bind("bench")
                    .bind(key)
                    .bind("POST")
                    .bind("/api/x")
                    .bind(&sha[..])
                    .bind(&token)
                    .execute(&mut *tx)
                    .await
                    .expect("insert")
                    .rows_affected();
                assert_eq!(n, 1);
                let _: i64 = sqlx::query_scalar(COUNT)
                    .bind(*max_rows)
                    .fetch_one(&mut *tx)
                    .await
                    .expect("count");
                tx.commit().await.expect("commit");
                let mut tx = sqlx::Connection::begin_with(&mut *conn, BEGIN)
                    .await
                    .expect("begin");
                sqlx::query(&complete_sql())
                    .bind("bench")
                    .bind(key)
                    .bind(&token)
                    .bind(201i32)
                    .bind(headers)
                    .bind(&b"{}"[..])
                    .execute(&mut *tx)
                    .await
                    .expect("complete");
                tx.commit().await.expect("commit");
            }
            Way::Deadpool(pool, max_rows) => {
                let client = pool.get().await.expect("get");
                client.batch_execute(BEGIN).await.expect("begin");
                let insert = client.prepare_cached(&insert_sql()).await.expect("prepare");
                let sha_ref: &[u8] = &sha;
                let n = client
                    .execute(
                        &insert,
                        &[&"bench", &key, &"POST", &"/api/x", &sha_ref, &token],
                    )
                    .await
                    .expect("insert");
                assert_eq!(n, 1);
                let count = client.prepare_cached(COUNT).await.expect("prepare");
                let _: i64 = client
                    .query_one(&count, &[max_rows])
                    .await
                    .expect("count")
                    .get(0);
                client.batch_execute("COMMIT").await.expect("commit");
                client.batch_execute(BEGIN).await.expect("begin");
                let complete = client
                    .prepare_cached(&complete_sql())
                    .await
                    .expect("prepare");
                let body: &[u8] = b"{}";
                client
                    .execute(
                        &complete,
                        &[&"bench", &key, &token, &201i32, &headers, &body],
                    )
                    .await
                    .expect("complete");
                client.batch_execute("COMMIT").await.expect("commit");
            }
        }
    }
}

/// Claims/s of `claims` writes by `tasks` concurrent requests.
async fn round(way: &Way, tag: &str, a: &Args) -> f64 {
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..a.tasks {
        let (way, next, tag, claims) = (way.clone(), next.clone(), tag.to_owned(), a.claims);
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= claims {
                    break;
                }
                way.write(&format!("{tag}-{i}")).await;
            }
        }));
    }
    for t in tasks {
        t.await.expect("join");
    }
    a.claims as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main]
async fn main() {
    let a = args();
    let server = pg::server().expect("PostgreSQL for the bench");
    let url = server.fresh_database().await;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(POOL)
        .connect(&url)
        .await
        .expect("sqlx pool");
    let ledger = PgLedger::new(pool.clone());
    ledger.migrate().await.expect("migrate");
    if a.prefill > 0 {
        sqlx::query(&format!(
            "INSERT INTO idempotency (account, idem_key, method, path, body_sha256,
                 claim_token, state, created_ms, heartbeat_ms, status, headers, body)
             SELECT 'prefill', 'k' || g, 'POST', '/api/x', '\\x00', 't', 'completed',
                 {NOW_MS}, {NOW_MS}, 201, '[]', '\\x7b7d'
             FROM generate_series(1, $1) g"
        ))
        .bind(a.prefill as i64)
        .execute(&pool)
        .await
        .expect("prefill");
        sqlx::query("VACUUM ANALYZE idempotency")
            .execute(&pool)
            .await
            .expect("vacuum");
    }
    let config: tokio_postgres::Config = url.parse().expect("url");
    let manager = deadpool_postgres::Manager::from_config(
        config,
        tokio_postgres::NoTls,
        deadpool_postgres::ManagerConfig {
            recycling_method: deadpool_postgres::RecyclingMethod::Fast,
        },
    );
    let deadpool = deadpool_postgres::Pool::builder(manager)
        .max_size(POOL as usize)
        .build()
        .expect("deadpool");
    let ways = [
        Way::Ledger(Arc::new(ledger), a.max_rows),
        Way::SqlxInline(pool.clone(), a.max_rows),
        Way::Deadpool(deadpool, a.max_rows),
    ];
    println!(
        "claim + complete of new keys: {} writes per round, {} concurrent, pool of {POOL}, \
         {} entries already in the table, bound {}",
        a.claims, a.tasks, a.prefill, a.max_rows
    );
    // A warm-up round each (connections opened, statements prepared), then `--rounds`.
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); ways.len()];
    for r in 0..=a.rounds {
        for (w, way) in ways.iter().enumerate() {
            let rate = round(way, &format!("r{r}w{w}"), &a).await;
            if r > 0 {
                rates[w].push(rate);
            }
        }
        // Keep the table at its prefilled size between rounds.
        sqlx::query("DELETE FROM idempotency WHERE account = 'bench'")
            .execute(&pool)
            .await
            .expect("clean");
    }
    for (way, mut r) in ways.iter().zip(rates) {
        r.sort_by(f64::total_cmp);
        println!(
            "  {:<28} {:>7.0} writes/s (median of {}; rounds {})",
            way.name(),
            r[r.len() / 2],
            r.len(),
            r.iter()
                .map(|x| format!("{x:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}
