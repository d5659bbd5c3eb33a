//! Transactional mode (contract 10.5) as a user would fear it: the server process killed
//! (SIGKILL) at random points of a route that writes in the claim's transaction, hundreds
//! of times, against a real PostgreSQL. Every retry gets either the stored answer or a
//! fresh single run, the app's own table shows each write exactly once, and nothing ever
//! answers "outcome unknown".
//!
//! The server is this test binary, run again as a child process (`child_server`, which
//! does nothing unless `SW_OUTBOX_TX_CHILD` names a database), so that it can be killed
//! like a real one: its connections to PostgreSQL die with it.

mod support;

use axum::extract::{Extension, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use serde_json::json;
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::*;
use sw_outbox_idempotency::{ClaimTransaction, IdempotencyLayer, PgLedger, Settings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The child's database URL; unset in the test run itself.
const CHILD: &str = "SW_OUTBOX_TX_CHILD";
/// `plain` runs the child with the plain layer instead (to see this test fail there).
const CHILD_MODE: &str = "SW_OUTBOX_TX_CHILD_MODE";

const ROUNDS: usize = 200;
/// Requests per round: the keys left unanswered by the last kill first, then new ones.
const PER_ROUND: usize = 6;
/// The kill lands 0..KILL_WITHIN_MS after the round's requests were sent: before their
/// claims, inside their routes, around their commits, after their answers (a round's
/// writes take 5–150 ms here, under load).
const KILL_WITHIN_MS: u64 = 150;

const INSERT: &str = "INSERT INTO orders (idem_key, items) VALUES ($1, $2) RETURNING id";

/// The route: one write of its own, in the claim's transaction (with the plain layer,
/// on the pool), then a pause of 0–9 ms (the body's first byte) so that kills land
/// inside the route too.
async fn create_order(
    State(pool): State<sqlx::PgPool>,
    tx: Option<Extension<ClaimTransaction>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let inserted: Result<i64, String> = match tx {
        Some(Extension(tx)) => match tx.conn().await {
            Ok(mut conn) => sqlx::query_scalar(INSERT)
                .bind(&key)
                .bind(&body)
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        },
        None => sqlx::query_scalar(INSERT)
            .bind(&key)
            .bind(&body)
            .fetch_one(&pool)
            .await
            .map_err(|e| e.to_string()),
    };
    let id = match inserted {
        Ok(id) => id,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
    };
    let pause = body.bytes().next().map_or(0, |b| u64::from(b % 10));
    tokio::time::sleep(Duration::from_millis(pause)).await;
    (StatusCode::CREATED, axum::Json(json!({ "order": id }))).into_response()
}

/// The server, when run as the child; otherwise nothing.
#[test]
fn child_server() {
    let Ok(url) = std::env::var(CHILD) else {
        return;
    };
    let plain = std::env::var(CHILD_MODE).is_ok_and(|m| m == "plain");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .connect(&url)
            .await
            .expect("pool");
        // Connections opened before it listens, as a server that has been up a while.
        let warm: Vec<_> = (0..4)
            .map(|_| {
                let pool = pool.clone();
                tokio::spawn(async move { sqlx::query("SELECT 1").execute(&pool).await })
            })
            .collect();
        for w in warm {
            w.await.expect("join").expect("warm the pool");
        }
        let settings = Settings::builder()
            .in_progress_wait(Duration::from_secs(10))
            .in_progress_poll(Duration::from_millis(20))
            .heartbeat_every(Duration::from_millis(100))
            .stale_after(Duration::from_millis(600))
            .build()
            .expect("settings");
        let account = |r: &Parts| r.headers.get("x-user")?.to_str().ok().map(str::to_owned);
        let ledger = PgLedger::new(pool.clone());
        let layer = if plain {
            IdempotencyLayer::new(std::sync::Arc::new(ledger), account)
        } else {
            IdempotencyLayer::transactional(ledger, account)
        };
        let app = Router::new()
            .route("/orders", post(create_order))
            .with_state(pool)
            .layer(layer.with_settings(settings));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        println!("listening {}", listener.local_addr().expect("addr").port());
        axum::serve(listener, app).await.expect("serve");
    });
}

/// Starts the child server; its port.
fn start(url: &str, mode: &str) -> (Child, u16) {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "child_server", "--nocapture", "--test-threads=1"])
        .env(CHILD, url)
        .env(CHILD_MODE, mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the child server");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let port = loop {
        let line = lines
            .next()
            .expect("the child printed its port")
            .expect("read the child");
        // The harness's "test child_server ... " has no line end of its own.
        if let Some((_, p)) = line.split_once("listening ") {
            break p.trim().parse().expect("a port");
        }
    };
    // The rest of its output is not read; keep the pipe drained so it never blocks.
    std::thread::spawn(move || for _ in lines {});
    (child, port)
}

/// One answer as the client saw it.
#[derive(Clone, Debug)]
struct Seen {
    status: u16,
    replayed: bool,
    body: String,
}

async fn send(port: u16, key: &str, items: &str) -> Option<Seen> {
    // A copy that meets a live claim waits for it (10 s at most, the server's wait).
    tokio::time::timeout(Duration::from_secs(30), send_once(port, key, items))
        .await
        .expect("an answer or a dropped connection within 30 s")
}

async fn send_once(port: u16, key: &str, items: &str) -> Option<Seen> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let req = format!(
        "POST /orders HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-User: alice\r\n\
         Idempotency-Key: {key}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{items}",
        items.len()
    );
    s.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let replayed = head
        .to_ascii_lowercase()
        .contains("\r\nidempotent-replayed: true");
    Some(Seen {
        status,
        replayed,
        body: body.to_owned(),
    })
}

/// Each key's body (its first byte sets the route's pause).
fn items(i: usize) -> String {
    format!("{}-apples", i % 10)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_at_random_points_every_write_applies_once_and_nothing_is_unknown() {
    let Some(server) = pg::server() else {
        return;
    };
    let url = server.fresh_database().await;
    let pool = support::pool(&url).await;
    PgLedger::new(pool.clone())
        .migrate()
        .await
        .expect("migrate");
    sqlx::query("CREATE TABLE orders (id BIGSERIAL PRIMARY KEY, idem_key TEXT NOT NULL, items TEXT NOT NULL)")
        .execute(&pool)
        .await
        .expect("the app's table");
    let mode = std::env::var(CHILD_MODE).unwrap_or_default();
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(7)
        | 1;
    let mut rng = seed;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };

    let mut seen: HashMap<String, Vec<Seen>> = HashMap::new();
    let mut unanswered: Vec<(String, String)> = Vec::new();
    let mut key_n = 0;
    let started = std::time::Instant::now();
    let rounds = std::env::var("TX_KILL_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(ROUNDS);
    let mut starting = Duration::ZERO;
    for _ in 0..rounds {
        let t0 = std::time::Instant::now();
        let (mut child, port) = start(&url, &mode);
        starting += t0.elapsed();
        let take = unanswered.len().min(PER_ROUND);
        let mut batch: Vec<(String, String)> = unanswered.drain(..take).collect();
        while batch.len() < PER_ROUND {
            batch.push((format!("k{key_n}"), items(key_n)));
            key_n += 1;
        }
        let sends: Vec<_> = batch
            .iter()
            .map(|(k, body)| {
                let (k, body) = (k.clone(), body.clone());
                tokio::spawn(async move { send(port, &k, &body).await })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(next() % (KILL_WITHIN_MS + 1))).await;
        child.kill().expect("SIGKILL the server");
        child.wait().expect("reap the server");
        let t1 = std::time::Instant::now();
        for ((key, body), s) in batch.into_iter().zip(sends) {
            match s.await.expect("join") {
                Some(answer) => seen.entry(key).or_default().push(answer),
                None => unanswered.push((key, body)),
            }
        }
        if std::env::var("TX_KILL_DEBUG").is_ok() {
            eprintln!(
                "round: start {:?}, sends after the kill {:?}, unanswered {}",
                t0.elapsed(),
                t1.elapsed(),
                unanswered.len()
            );
        }
    }
    let kills_took = started.elapsed();
    // A last server, not killed: every key not answered yet is sent until it is.
    let (mut child, port) = start(&url, &mode);
    for (key, body) in std::mem::take(&mut unanswered) {
        let answer = send(port, &key, &body).await.expect("answered");
        seen.entry(key).or_default().push(answer);
    }
    child.kill().expect("stop the last server");
    child.wait().expect("reap");

    let mut unknown = Vec::new();
    let mut not_created = Vec::new();
    let mut differing = Vec::new();
    let (mut replays, mut answers) = (0, 0);
    for (key, all) in &seen {
        answers += all.len();
        replays += all.iter().filter(|a| a.replayed).count();
        for a in all {
            if a.body.contains("idempotency_outcome_unknown") {
                unknown.push(format!("{key}: {} {}", a.status, a.body));
            } else if a.status != 201 {
                not_created.push(format!("{key}: {} {}", a.status, a.body));
            }
        }
        if all.iter().any(|a| a.body != all[0].body) {
            differing.push(format!("{key}: {all:?}"));
        }
    }
    let rows: Vec<(String, i64)> =
        sqlx::query_as("SELECT idem_key, count(*) FROM orders GROUP BY idem_key")
            .fetch_all(&pool)
            .await
            .expect("the app's table");
    let per_key: HashMap<String, i64> = rows.into_iter().collect();
    let twice: Vec<_> = per_key.iter().filter(|(_, n)| **n != 1).collect();
    let missing: Vec<_> = (0..key_n)
        .map(|i| format!("k{i}"))
        .filter(|k| !per_key.contains_key(k))
        .collect();
    eprintln!(
        "{rounds} kills in {kills_took:?} ({starting:?} starting servers) (seed {seed}): {key_n} keys, {answers} answers ({replays} replayed), \
         outcome unknown {}, other than 201 {}, answers differing {}, applied other than once {}, never applied {}",
        unknown.len(),
        not_created.len(),
        differing.len(),
        twice.len(),
        missing.len()
    );
    assert!(
        unknown.is_empty(),
        "\"outcome unknown\":\n{}",
        unknown.join("\n")
    );
    assert!(
        not_created.is_empty(),
        "not 201:\n{}",
        not_created.join("\n")
    );
    assert!(
        differing.is_empty(),
        "one key, two answers:\n{}",
        differing.join("\n")
    );
    assert!(twice.is_empty(), "applied other than once: {twice:?}");
    assert!(missing.is_empty(), "never applied: {missing:?}");
    assert_eq!(seen.len(), key_n, "every key answered");
}
