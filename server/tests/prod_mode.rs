//! The reference server as it runs in production: no requests log (nothing can read it
//! there), a bounded one in the test modes, and slow or idle clients cut off (headers
//! that trickle in, a keep-alive connection that sits idle, a body that stalls).
//!
//! The waits below only bound how long a test waits for the server to act, so a server
//! that never acts fails instead of hanging; no test asserts how fast it acted.

mod common;

use common::*;
use std::net::SocketAddr;
use std::time::Duration;
use sw_outbox_server::{Config, Mode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest a test waits for the server to close a connection it should close.
const PATIENCE: Duration = Duration::from_secs(20);

fn config(mode: Mode, tweak: impl FnOnce(&mut Config)) -> Config {
    let mut c = test_config(fast_settings(), mode);
    tweak(&mut c);
    c
}

#[tokio::test]
async fn prod_keeps_no_requests_log() {
    let srv = start_config(config(Mode::Prod, |_| {})).await;
    let anon = Client::anonymous(srv.addr);
    for _ in 0..20 {
        assert_eq!(anon.get("/api/auth/me").await.status, 401);
    }
    let alice = Client::login(srv.addr, "alice").await;
    let r = alice
        .post("/api/notes", Some(&key("prodlog")), r#"{"text":"x"}"#)
        .await;
    assert_eq!(r.status, 201);
    assert_eq!(
        srv.app.control.logged(),
        0,
        "nothing can read the log in prod, so nothing (CSRF tokens included) is kept"
    );
    assert_eq!(anon.get("/__control/requests").await.status, 404);
    srv.shutdown().await;
}

#[tokio::test]
async fn the_test_modes_keep_the_newest_requests_only() {
    let srv = start_config(config(Mode::Test, |c| c.request_log = 3)).await;
    let anon = Client::anonymous(srv.addr);
    for i in 0..5 {
        assert_eq!(anon.get(&format!("/api/auth/me?n={i}")).await.status, 401);
    }
    let log = control(srv.addr, "GET", "/__control/requests", None).await;
    let paths: Vec<&str> = log["requests"]
        .as_array()
        .expect("requests")
        .iter()
        .map(|r| r["path"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        paths,
        ["/api/auth/me?n=2", "/api/auth/me?n=3", "/api/auth/me?n=4"]
    );
    assert_eq!(log["dropped"], 2);
    let seqs: Vec<u64> = log["requests"]
        .as_array()
        .expect("requests")
        .iter()
        .map(|r| r["seq"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(seqs, [3, 4, 5], "seq keeps counting past the bound");
    assert!(
        log["requests"][2]["status"] == 401,
        "statuses still filled in"
    );
    srv.shutdown().await;
}

/// Reads until the server closes the connection; `true` when it did within [`PATIENCE`].
async fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 4096];
    tokio::time::timeout(PATIENCE, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

#[tokio::test]
async fn headers_that_trickle_in_are_cut_off() {
    let srv = start_config(config(Mode::Prod, |c| {
        c.header_read_timeout = Duration::from_millis(400)
    }))
    .await;
    let mut stream = TcpStream::connect(srv.addr).await.expect("connect");
    stream
        .write_all(b"GET /api/auth/me HTTP/1.1\r\nHost: x\r\n")
        .await
        .expect("write");
    // One header byte every 100 ms, never ending the head: each byte is progress, so
    // only a bound on the whole head ends this. The sender stops on its own after
    // PATIENCE either way.
    let (mut reader, mut writer) = stream.into_split();
    let trickle = tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        while started.elapsed() < PATIENCE {
            if writer.write_all(b"X-Slow: a\r\n").await.is_err() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    });
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(PATIENCE, async {
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok();
    assert!(
        closed,
        "a head still arriving after the header timeout closes"
    );
    trickle.abort();
    // The server still serves everyone else.
    assert_eq!(
        Client::anonymous(srv.addr).get("/api/auth/me").await.status,
        401
    );
    srv.shutdown().await;
}

/// One keep-alive request on `stream`; returns the status.
async fn keep_alive_request(stream: &mut TcpStream, addr: SocketAddr) -> u16 {
    let req = format!("GET /api/auth/me HTTP/1.1\r\nHost: {addr}\r\n\r\n");
    stream.write_all(req.as_bytes()).await.expect("write");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = stream.read(&mut byte).await.expect("read");
        assert_eq!(n, 1, "connection closed mid-answer");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("content-length");
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body).await.expect("body");
    head.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status")
}

#[tokio::test]
async fn idle_keep_alive_connections_are_closed() {
    let srv = start_config(config(Mode::Prod, |c| {
        c.header_read_timeout = Duration::from_millis(400)
    }))
    .await;
    let mut stream = TcpStream::connect(srv.addr).await.expect("connect");
    // prod keeps connections alive: two requests on one connection...
    assert_eq!(keep_alive_request(&mut stream, srv.addr).await, 401);
    assert_eq!(keep_alive_request(&mut stream, srv.addr).await, 401);
    // ...then nothing: the idle connection is closed.
    assert!(
        closed_by_server(&mut stream).await,
        "an idle keep-alive connection is closed"
    );
    srv.shutdown().await;
}

#[tokio::test]
async fn a_connection_that_never_sends_is_closed() {
    let srv = start_config(config(Mode::Prod, |c| {
        c.header_read_timeout = Duration::from_millis(400)
    }))
    .await;
    let mut stream = TcpStream::connect(srv.addr).await.expect("connect");
    assert!(closed_by_server(&mut stream).await);
    srv.shutdown().await;
}

#[tokio::test]
async fn a_stalled_body_fails_the_request() {
    let srv = start_config(config(Mode::Test, |c| {
        c.body_read_timeout = Duration::from_millis(400)
    }))
    .await;
    let mut stream = TcpStream::connect(srv.addr).await.expect("connect");
    let head = format!(
        "POST /api/auth/login HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"userId\":",
        srv.addr
    );
    stream.write_all(head.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    let answered = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut buf)).await;
    assert!(answered.is_ok(), "the request ends while the body stalls");
    let text = String::from_utf8_lossy(&buf);
    assert!(
        text.starts_with("HTTP/1.1 408") && text.contains("body_timeout"),
        "{text}"
    );
    srv.shutdown().await;
}
