//! What the layer costs a route: an axum route that does one write of its own (an INSERT),
//! served over loopback, without the layer and with it, on SQLite and on PostgreSQL (the
//! plain layer and transactional mode), one instance and two (two apps on one database,
//! the load split between them). Every request is a keyed POST with a fresh key.
//!
//! `cargo bench -p sw-outbox-idempotency --bench layer [-- --seconds N --clients N]`
//!
//! Printed per setting: requests a second, p50 and p99 latency, and the ratios of each to
//! the bare route of the same database and instance count, measured in the same run;
//! then the PostgreSQL round trips of one new key and of one replay, counted by a proxy in
//! front of the database (each `Sync` or simple `Query` message the client sends is one
//! round trip). Timings are printed, never asserted.

#[path = "../tests/support/pg.rs"]
mod pg;

use axum::extract::{Extension, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use sw_outbox_idempotency::{ClaimTransaction, IdempotencyLayer, PgLedger, SqliteLedger};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

struct Args {
    seconds: u64,
    clients: usize,
}

fn args() -> Args {
    let mut a = Args {
        seconds: 4,
        clients: 16,
    };
    let argv: Vec<String> = std::env::args().collect();
    for w in argv.windows(2) {
        match w[0].as_str() {
            "--seconds" => a.seconds = w[1].parse().unwrap_or(a.seconds),
            "--clients" => a.clients = w[1].parse().unwrap_or(a.clients),
            _ => {}
        }
    }
    a
}

/// Where the route writes.
#[derive(Clone)]
enum Db {
    Sqlite(Arc<Mutex<rusqlite::Connection>>),
    Pg(sqlx::PgPool),
}

fn key_of(h: &HeaderMap) -> String {
    h.get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// The route: one INSERT of its own (in the claim's transaction when there is one).
async fn order(
    State(db): State<Db>,
    tx: Option<Extension<ClaimTransaction>>,
    headers: HeaderMap,
    body: String,
) -> (StatusCode, String) {
    let key = key_of(&headers);
    let id: Result<i64, String> = match (&db, tx) {
        (Db::Sqlite(conn), _) => {
            let conn = conn.clone();
            tokio::task::spawn_blocking(move || {
                let c = conn.lock().map_err(|e| e.to_string())?;
                c.execute(
                    "INSERT INTO orders (idem_key, items) VALUES (?1, ?2)",
                    rusqlite::params![key, body],
                )
                .map_err(|e| e.to_string())?;
                Ok(c.last_insert_rowid())
            })
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r)
        }
        (Db::Pg(_), Some(Extension(tx))) => match tx.conn().await {
            Ok(mut conn) => sqlx::query_scalar(
                "INSERT INTO orders (idem_key, items) VALUES ($1, $2) RETURNING id",
            )
            .bind(&key)
            .bind(&body)
            .fetch_one(&mut *conn)
            .await
            .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        },
        (Db::Pg(pool), None) => {
            sqlx::query_scalar("INSERT INTO orders (idem_key, items) VALUES ($1, $2) RETURNING id")
                .bind(&key)
                .bind(&body)
                .fetch_one(pool)
                .await
                .map_err(|e| e.to_string())
        }
    };
    match id {
        Ok(id) => (StatusCode::CREATED, format!("{{\"order\":{id}}}")),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

fn account(r: &Parts) -> Option<String> {
    r.headers.get("x-user")?.to_str().ok().map(str::to_owned)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Layer {
    Bare,
    Plain,
    Transactional,
}

async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

fn sqlite_file(tag: &str) -> String {
    std::env::temp_dir()
        .join(format!(
            "sw-outbox-bench-{tag}-{}.sqlite",
            std::process::id()
        ))
        .to_string_lossy()
        .into_owned()
}

/// One instance of the app on SQLite: its own connection to the data file, and (with the
/// layer) its own ledger connection, as a process of its own would have.
fn sqlite_app(data: &str, ledger: &str, layer: Layer) -> Router {
    let conn = rusqlite::Connection::open(data).expect("data file");
    conn.pragma_update(None, "journal_mode", "WAL")
        .expect("wal");
    conn.pragma_update(None, "synchronous", "FULL")
        .expect("sync");
    conn.busy_timeout(Duration::from_secs(5)).expect("busy");
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, idem_key TEXT, items TEXT)",
    )
    .expect("orders");
    let router = Router::new()
        .route("/orders", post(order))
        .with_state(Db::Sqlite(Arc::new(Mutex::new(conn))));
    match layer {
        Layer::Bare => router,
        _ => {
            let l = SqliteLedger::open(ledger).expect("ledger");
            router.layer(IdempotencyLayer::new(Arc::new(l), account))
        }
    }
}

async fn pg_app(url: &str, layer: Layer) -> Router {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .connect(url)
        .await
        .expect("pool");
    let router = Router::new()
        .route("/orders", post(order))
        .with_state(Db::Pg(pool.clone()));
    let ledger = PgLedger::new(pool);
    match layer {
        Layer::Bare => router,
        Layer::Plain => router.layer(IdempotencyLayer::new(Arc::new(ledger), account)),
        Layer::Transactional => router.layer(IdempotencyLayer::transactional(ledger, account)),
    }
}

async fn pg_database(server: &pg::PgServer) -> String {
    let url = server.fresh_database().await;
    let pool = sqlx::PgPool::connect(&url).await.expect("pool");
    PgLedger::new(pool.clone())
        .migrate()
        .await
        .expect("migrate");
    sqlx::query("CREATE TABLE orders (id BIGSERIAL PRIMARY KEY, idem_key TEXT, items TEXT)")
        .execute(&pool)
        .await
        .expect("orders");
    url
}

static KEYS: AtomicU64 = AtomicU64::new(0);

fn request(key: &str) -> Vec<u8> {
    format!(
        "POST /orders HTTP/1.1\r\nHost: x\r\nX-User: alice\r\nIdempotency-Key: {key}\r\n\
         Content-Type: text/plain\r\nContent-Length: 10\r\n\r\ntwo apples"
    )
    .into_bytes()
}

/// One keep-alive request: its status.
async fn exchange(s: &mut TcpStream, req: &[u8], buf: &mut Vec<u8>) -> u16 {
    s.write_all(req).await.expect("write");
    buf.clear();
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk).await.expect("read");
        assert!(n > 0, "the server closed the connection");
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if buf.len() >= end + 4 + len {
            return head
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
        }
    }
}

struct Measured {
    per_second: f64,
    p50: Duration,
    p99: Duration,
}

/// `clients` keep-alive connections spread over `addrs`, each sending keyed POSTs with
/// fresh keys one after another, for `seconds` (after a one-second warm-up).
async fn load(addrs: &[SocketAddr], clients: usize, seconds: u64) -> Measured {
    let run = |d: Duration, record: bool| {
        let addrs = addrs.to_vec();
        async move {
            let until = Instant::now() + d;
            let tasks: Vec<_> = (0..clients)
                .map(|c| {
                    let addr = addrs[c % addrs.len()];
                    tokio::spawn(async move {
                        let mut s = TcpStream::connect(addr).await.expect("connect");
                        let _ = s.set_nodelay(true);
                        let mut buf = Vec::new();
                        let mut times = Vec::new();
                        while Instant::now() < until {
                            let key = format!("b{}", KEYS.fetch_add(1, Ordering::Relaxed));
                            let t0 = Instant::now();
                            let status = exchange(&mut s, &request(&key), &mut buf).await;
                            assert_eq!(status, 201, "{}", String::from_utf8_lossy(&buf));
                            if record {
                                times.push(t0.elapsed());
                            }
                        }
                        times
                    })
                })
                .collect();
            let mut all = Vec::new();
            for t in tasks {
                all.extend(t.await.expect("client"));
            }
            all
        }
    };
    run(Duration::from_secs(1), false).await;
    let started = Instant::now();
    let mut times = run(Duration::from_secs(seconds), true).await;
    let took = started.elapsed();
    times.sort();
    let at = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)];
    Measured {
        per_second: times.len() as f64 / took.as_secs_f64(),
        p50: at(0.50),
        p99: at(0.99),
    }
}

/// A proxy to PostgreSQL that counts the client's round trips: each `Sync` (extended
/// protocol) or `Query` (simple protocol) message ends one.
async fn counting_proxy(target: SocketAddr, trips: Arc<AtomicU64>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = TcpStream::connect(target).await else {
                continue;
            };
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut sr, &mut cw).await;
            });
            let trips = trips.clone();
            tokio::spawn(async move {
                // The startup message has no type byte; every later one does.
                let mut started = false;
                let mut pending: Vec<u8> = Vec::new();
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = cr.read(&mut buf).await {
                    if n == 0 || sw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                    pending.extend_from_slice(&buf[..n]);
                    loop {
                        let head = if started { 5 } else { 4 };
                        if pending.len() < head {
                            break;
                        }
                        let at = head - 4;
                        let len = u32::from_be_bytes([
                            pending[at],
                            pending[at + 1],
                            pending[at + 2],
                            pending[at + 3],
                        ]) as usize;
                        let total = at + len;
                        if pending.len() < total {
                            break;
                        }
                        if started && matches!(pending[0], b'S' | b'Q') {
                            trips.fetch_add(1, Ordering::Relaxed);
                        }
                        // An SSLRequest is answered with one byte; the startup follows.
                        let ssl_request = !started && len == 8;
                        started = started || !ssl_request;
                        pending.drain(..total);
                    }
                }
            });
        }
    });
    addr
}

async fn send_one(addr: SocketAddr, key: &str) -> u16 {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let mut buf = Vec::new();
    exchange(&mut s, &request(key), &mut buf).await
}

/// Round trips of one new key and of its replay, through the counting proxy, after a
/// warm-up (pool connections open, the background prune done).
async fn round_trips(server: &pg::PgServer, layer: Layer) -> (u64, u64) {
    let url = pg_database(server).await;
    let trips = Arc::new(AtomicU64::new(0));
    let proxy = counting_proxy(
        SocketAddr::from(([127, 0, 0, 1], server.port)),
        trips.clone(),
    )
    .await;
    let db = url
        .rsplit('/')
        .next()
        .and_then(|d| d.split('?').next())
        .unwrap_or("")
        .to_owned();
    let proxied = format!("postgres://postgres@{proxy}/{db}?sslmode=disable");
    let addr = serve(pg_app(&proxied, layer).await).await;
    for i in 0..20 {
        send_one(addr, &format!("warm-{i}")).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = trips.load(Ordering::Relaxed);
    assert_eq!(send_one(addr, "counted").await, 201);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let fresh = trips.load(Ordering::Relaxed) - before;
    let before = trips.load(Ordering::Relaxed);
    assert_eq!(send_one(addr, "counted").await, 201);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let replay = trips.load(Ordering::Relaxed) - before;
    (fresh, replay)
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let a = args();
    let server = pg::server().expect("a PostgreSQL server (SW_OUTBOX_SKIP_PG is set)");
    println!(
        "keyed POSTs with fresh keys, {} clients (keep-alive), {} s per setting after 1 s of warm-up",
        a.clients, a.seconds
    );
    println!(
        "| setting | instances | requests/s | p50 ms | p99 ms | requests/s vs bare | p50 vs bare | p99 vs bare |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for instances in [1usize, 2] {
        let mut bare_sqlite: Option<Measured> = None;
        let mut bare_pg: Option<Measured> = None;
        let settings: [(&str, bool, Layer); 5] = [
            ("SQLite, bare route", false, Layer::Bare),
            ("SQLite, plain layer", false, Layer::Plain),
            ("PostgreSQL, bare route", true, Layer::Bare),
            ("PostgreSQL, plain layer", true, Layer::Plain),
            ("PostgreSQL, transactional", true, Layer::Transactional),
        ];
        for (name, on_pg, layer) in settings {
            let mut addrs = Vec::new();
            let tag = format!("{instances}-{}", KEYS.load(Ordering::Relaxed));
            let (data, ledger) = (
                sqlite_file(&format!("data-{tag}")),
                sqlite_file(&format!("ledger-{tag}")),
            );
            let url = if on_pg {
                Some(pg_database(server).await)
            } else {
                None
            };
            for _ in 0..instances {
                let app = match &url {
                    Some(u) => pg_app(u, layer).await,
                    None => sqlite_app(&data, &ledger, layer),
                };
                addrs.push(serve(app).await);
            }
            let m = load(&addrs, a.clients, a.seconds).await;
            let bare = if on_pg {
                &mut bare_pg
            } else {
                &mut bare_sqlite
            };
            let ratios = match bare.as_ref() {
                Some(b) => format!(
                    "{:.2} | {:.2} | {:.2}",
                    m.per_second / b.per_second,
                    m.p50.as_secs_f64() / b.p50.as_secs_f64(),
                    m.p99.as_secs_f64() / b.p99.as_secs_f64()
                ),
                None => "1 | 1 | 1".into(),
            };
            println!(
                "| {name} | {instances} | {:.0} | {} | {} | {ratios} |",
                m.per_second,
                ms(m.p50),
                ms(m.p99)
            );
            if layer == Layer::Bare {
                *bare = Some(m);
            }
            for f in [&data, &ledger] {
                for suffix in ["", "-wal", "-shm"] {
                    let _ = std::fs::remove_file(format!("{f}{suffix}"));
                }
            }
        }
    }
    println!();
    println!("PostgreSQL round trips (the route's own INSERT included: 1 of them)");
    println!("| setting | new key | replay |");
    println!("|---|---|---|");
    for (name, layer) in [
        ("bare route", Layer::Bare),
        ("plain layer", Layer::Plain),
        ("transactional", Layer::Transactional),
    ] {
        let (fresh, replay) = round_trips(server, layer).await;
        println!("| {name} | {fresh} | {replay} |");
    }
}
