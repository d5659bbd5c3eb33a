//! The claim race (contract 10.3): a client that hangs up while its key is being claimed
//! (before, during or after the claim's commit) must not leave a claim that nothing runs.
//! Otherwise its retry waits, then meets "outcome unknown" for the key's whole lifetime,
//! although the write never ran.
//!
//! Hundreds of keyed writes over real sockets, each reset (RST) at a random instant after
//! it was sent, on both ledgers; then each key is sent again, once, normally. Every retry
//! must be answered 201 (the stored answer, or a fresh single run), and every write must
//! have run exactly once.

mod support;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::*;
use sw_outbox_idempotency::{IdempotencyLayer, Settings};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

on_both_ledgers!(resets_at_random_points_of_the_claim_leave_no_stuck_key);

const KEYS: usize = 300;
const AT_ONCE: usize = 8;
/// Resets land 0..MAX_DELAY_US after the request was written: across the claim's round
/// trips and its commit on both ledgers, and past the route's start (a claim takes 0.5–20 ms
/// on this machine, more under load).
const MAX_DELAY_US: u64 = 25_000;

/// How often each key's write ran.
type Runs = Arc<Mutex<HashMap<String, usize>>>;

async fn order(State(runs): State<Runs>, headers: HeaderMap, body: Bytes) -> (StatusCode, String) {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    *runs.lock().expect("runs").entry(key).or_default() += 1;
    (StatusCode::CREATED, format!("ordered {}", body.len()))
}

/// xorshift64*: the delays are random, and reproducible from the printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn request(key: &str) -> Vec<u8> {
    format!(
        "POST /orders HTTP/1.1\r\nHost: x\r\nX-User: alice\r\nIdempotency-Key: {key}\r\n\
         Content-Type: text/plain\r\nContent-Length: 4\r\n\r\npear"
    )
    .into_bytes()
}

/// Sends the write and resets the connection `delay` later, whatever was answered.
async fn send_then_reset(addr: std::net::SocketAddr, key: String, delay: Duration) {
    let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
        return;
    };
    if s.write_all(&request(&key)).await.is_err() {
        return;
    }
    if !delay.is_zero() {
        // Short waits spin on the runtime (its timer has a 1 ms grain); longer ones sleep.
        let until = tokio::time::Instant::now() + delay;
        if delay < Duration::from_millis(2) {
            while tokio::time::Instant::now() < until {
                tokio::task::yield_now().await;
            }
        } else {
            tokio::time::sleep(delay).await;
        }
    }
    let _ = s.set_zero_linger();
    drop(s);
}

/// Sends the write once more, normally; the answer's status line and body.
async fn retry(addr: std::net::SocketAddr, key: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let mut req = request(key);
    // The same request, closed after the answer.
    let at = req.windows(4).position(|w| w == b"\r\n\r\n").expect("head");
    req.splice(at..at, b"\r\nConnection: close".iter().copied());
    s.write_all(&req).await.expect("write");
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.expect("read");
    String::from_utf8_lossy(&buf).into_owned()
}

async fn resets_at_random_points_of_the_claim_leave_no_stuck_key(backend: Backend) {
    let Some((ledger, _place)) =
        ledger_with(backend, sw_outbox_idempotency::DEFAULT_LOCK_WAIT).await
    else {
        return;
    };
    // A stuck claim (committed, never run) reads "outcome unknown" once its heartbeat is
    // older than 600 ms; a copy meeting a route still running waits for it (10 s).
    let settings = Settings::builder()
        .in_progress_wait(Duration::from_secs(10))
        .in_progress_poll(Duration::from_millis(20))
        .heartbeat_every(Duration::from_millis(100))
        .stale_after(Duration::from_millis(600))
        .build()
        .expect("valid settings");
    let runs: Runs = Arc::default();
    let app = Router::new()
        .route("/orders", post(order))
        .with_state(runs.clone())
        .layer(
            IdempotencyLayer::new(as_ledger(&ledger), |r: &Parts| {
                r.headers.get("x-user")?.to_str().ok().map(str::to_owned)
            })
            .with_settings(settings),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let seed = std::env::var("CLAIM_RACE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                | 1
        });
    eprintln!("{backend:?}: CLAIM_RACE_SEED={seed}");
    let mut rng = Rng(seed);
    let keys: Vec<String> = (0..KEYS).map(|i| format!("race-{seed:x}-{i}")).collect();
    for batch in keys.chunks(AT_ONCE) {
        let sends: Vec<_> = batch
            .iter()
            .map(|key| {
                let delay = Duration::from_micros(rng.next() % (MAX_DELAY_US + 1));
                tokio::spawn(send_then_reset(addr, key.clone(), delay))
            })
            .collect();
        for s in sends {
            s.await.expect("send");
        }
    }
    // Past the stale bound: a claim that nothing runs now reads "outcome unknown".
    tokio::time::sleep(Duration::from_millis(900)).await;
    let ran_first = runs.lock().expect("runs").len();

    let mut stuck = Vec::new();
    for key in &keys {
        let answer = retry(addr, key).await;
        if !answer.starts_with("HTTP/1.1 201") {
            let first = answer.lines().next().unwrap_or("").to_owned();
            let body = answer.rsplit("\r\n\r\n").next().unwrap_or("").to_owned();
            stuck.push(format!("{key}: {first} {body}"));
        }
    }
    server.abort();
    let runs = runs.lock().expect("runs").clone();
    let twice: Vec<_> = runs.iter().filter(|(_, n)| **n > 1).collect();
    let never: Vec<_> = keys.iter().filter(|k| !runs.contains_key(*k)).collect();
    eprintln!(
        "{backend:?}: {KEYS} keys reset 0–{MAX_DELAY_US} µs after sending; stuck: {}, ran twice: {}, never ran: {}",
        stuck.len(),
        twice.len(),
        never.len()
    );
    assert!(
        stuck.is_empty(),
        "{} of {KEYS} keys stuck (seed {seed}):\n{}",
        stuck.len(),
        stuck.join("\n")
    );
    assert!(twice.is_empty(), "ran twice: {twice:?}");
    assert!(
        never.is_empty(),
        "every retry ran or replayed its write: {never:?}"
    );
    // Where the resets fell: writes that ran from their first copy (reset after the route
    // started), and writes that ran only on their retry (reset before).
    eprintln!(
        "{backend:?}: first copy ran for {ran_first} keys, only the retry for {}",
        KEYS - ran_first
    );
}
