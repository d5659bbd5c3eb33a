mod common;

use common::*;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn network_down_drops_api_connections_without_an_answer() {
    let srv = start(fast_settings()).await;
    let alice = Client::login(srv.addr, "alice").await;
    control(
        srv.addr,
        "POST",
        "/__control/network",
        Some(r#"{"down":true}"#),
    )
    .await;

    // Raw TCP: the server closes without writing a single byte.
    let mut s = tokio::net::TcpStream::connect(srv.addr)
        .await
        .expect("connect");
    s.write_all(b"GET /api/auth/me HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut buf = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(2), s.read_to_end(&mut buf)).await;
    match read {
        Ok(Ok(0)) | Ok(Err(_)) => {}
        Ok(Ok(n)) => panic!("got {n} bytes: {:?}", String::from_utf8_lossy(&buf)),
        Err(_) => panic!("connection was left open instead of dropped"),
    }
    assert!(buf.is_empty());

    let r = alice
        .try_send("POST", "/api/notes", &[], Some(br#"{"text":"x"}"#))
        .await
        .expect("io");
    assert!(r.is_none(), "write must see a network error, got {r:?}");
    // Static files and control keep working.
    assert_eq!(alice.get("/").await.status, 200);
    let state = control(srv.addr, "GET", "/__control/network", None).await;
    assert_eq!(state["down"], true);
    assert!(applied(srv.addr).await.is_empty());

    control(
        srv.addr,
        "POST",
        "/__control/network",
        Some(r#"{"down":false}"#),
    )
    .await;
    assert_eq!(
        alice
            .post("/api/notes", None, r#"{"text":"x"}"#)
            .await
            .status,
        201
    );
    srv.shutdown().await;
}

#[tokio::test]
async fn refuse_drops_before_the_route_and_times_limits_it() {
    let srv = start(fast_settings()).await;
    let alice = Client::login(srv.addr, "alice").await;
    faults(
        srv.addr,
        r#"[{"path":"/api/projects/*/tasks","method":"post","kind":"refuse","times":2}]"#,
    )
    .await;
    let k = key("refuse");
    for _ in 0..2 {
        let r = alice
            .try_send(
                "POST",
                "/api/projects/p1/tasks",
                &[("Idempotency-Key", &k)],
                Some(br#"{"title":"t"}"#),
            )
            .await
            .expect("io");
        assert!(r.is_none());
    }
    // Other paths and methods are not hit.
    assert_eq!(alice.get("/api/projects/p1/tasks").await.status, 200);
    assert_eq!(
        alice
            .post("/api/notes", None, r#"{"text":"n"}"#)
            .await
            .status,
        201
    );
    // Refused before the claim: the same key now applies normally.
    let r = alice
        .post("/api/projects/p1/tasks", Some(&k), r#"{"title":"t"}"#)
        .await;
    assert_eq!(r.status, 201);
    assert!(r.header("idempotent-replayed").is_none());
    let log = applied(srv.addr).await;
    assert_eq!(log.len(), 2);
    let rules = control(srv.addr, "GET", "/__control/faults", None).await;
    assert_eq!(rules["rules"][0]["remaining"], 0);
    srv.shutdown().await;
}

#[tokio::test]
async fn drop_after_commit_is_the_lost_response() {
    let srv = start(fast_settings()).await;
    let alice = Client::login(srv.addr, "alice").await;
    faults(
        srv.addr,
        r#"[{"path":"/api/**","kind":"drop-after-commit","times":1}]"#,
    )
    .await;
    let k = key("lostresp");
    let r = alice
        .try_send(
            "POST",
            "/api/notes",
            &[("Idempotency-Key", &k)],
            Some(br#"{"text":"d"}"#),
        )
        .await
        .expect("io");
    assert!(r.is_none(), "no answer: {r:?}");
    let log = applied(srv.addr).await;
    assert_eq!(log.len(), 1, "the write did happen");
    // The retry gets the stored answer and nothing is applied twice.
    let r = alice.post("/api/notes", Some(&k), r#"{"text":"d"}"#).await;
    assert_eq!(r.status, 201);
    assert_eq!(r.header("idempotent-replayed"), Some("true"));
    assert_eq!(r.json()["text"], "d");
    assert_eq!(applied(srv.addr).await.len(), 1);
    srv.shutdown().await;
}

#[tokio::test]
async fn hang_never_answers() {
    let srv = start(fast_settings()).await;
    let alice = Client::login(srv.addr, "alice").await;
    faults(
        srv.addr,
        r#"[{"path":"/api/notes","kind":"hang","times":1}]"#,
    )
    .await;
    let attempt = alice.try_send("POST", "/api/notes", &[], Some(br#"{"text":"h"}"#));
    let r = tokio::time::timeout(Duration::from_millis(600), attempt).await;
    assert!(r.is_err(), "hang must not answer: {r:?}");
    // The server is not stuck: other requests go through, and the hung write did not run.
    assert_eq!(alice.get("/api/notes").await.status, 200);
    assert!(applied(srv.addr).await.is_empty());
    assert_eq!(
        alice
            .post("/api/notes", None, r#"{"text":"h"}"#)
            .await
            .status,
        201
    );
    srv.shutdown().await;
}

#[tokio::test]
async fn status_fault_with_retry_after() {
    let srv = start(fast_settings()).await;
    let alice = Client::login(srv.addr, "alice").await;
    faults(
        srv.addr,
        r#"[{"path":"/api/notes","method":"POST","kind":"status","status":503,"retryAfter":"2"},
            {"path":"/api/projects/**","kind":"status","status":429}]"#,
    )
    .await;
    let k = key("status");
    let r = alice.post("/api/notes", Some(&k), r#"{"text":"s"}"#).await;
    assert_eq!((r.status, r.detail().as_str()), (503, "injected"));
    assert_eq!(r.header("retry-after"), Some("2"));
    let r = alice
        .post("/api/projects/p/tasks", None, r#"{"title":"s"}"#)
        .await;
    assert_eq!(r.status, 429);
    assert!(r.header("retry-after").is_none());
    assert_eq!(
        alice.get("/api/notes").await.status,
        200,
        "GET is not a POST"
    );
    assert!(applied(srv.addr).await.is_empty());

    // Injected answers are not stored: once the fault is gone the key applies.
    faults(srv.addr, "[]").await;
    let r = alice.post("/api/notes", Some(&k), r#"{"text":"s"}"#).await;
    assert_eq!(r.status, 201);
    assert!(r.header("idempotent-replayed").is_none());
    srv.shutdown().await;
}

#[tokio::test]
async fn outcome_unknown_fault() {
    let srv = start(fast_settings()).await;
    let alice = Client::login(srv.addr, "alice").await;
    faults(
        srv.addr,
        r#"[{"path":"/api/notes","kind":"outcome-unknown"}]"#,
    )
    .await;
    let r = alice
        .post("/api/notes", Some(&key("unknown")), r#"{"text":"u"}"#)
        .await;
    assert_eq!(
        (r.status, r.detail().as_str()),
        (409, "idempotency_outcome_unknown")
    );
    assert!(applied(srv.addr).await.is_empty());
    srv.shutdown().await;
}

#[tokio::test]
async fn delay_fault_answers_late() {
    let srv = start(fast_settings()).await;
    let alice = Client::login(srv.addr, "alice").await;
    faults(
        srv.addr,
        r#"[{"path":"/api/notes","kind":"delay","delayMs":300}]"#,
    )
    .await;
    let started = Instant::now();
    let r = alice.post("/api/notes", None, r#"{"text":"late"}"#).await;
    assert_eq!(r.status, 201);
    assert!(started.elapsed() >= Duration::from_millis(290));
    srv.shutdown().await;
}

#[tokio::test]
async fn bad_rules_are_refused_and_keep_the_old_ones() {
    let srv = start(fast_settings()).await;
    faults(srv.addr, r#"[{"path":"/api/notes","kind":"refuse"}]"#).await;
    for bad in [
        r#"{"rules":[{"path":"/api/**","kind":"explode"}]}"#,
        r#"{"rules":[{"path":"/api/**","kind":"status","status":1000}]}"#,
        r#"{"rules":[{"path":"/api/**","kind":"redirect","status":200}]}"#,
        r#"{"rules":[{"path":"/api/**","kind":"status","detail":"a","body":"b"}]}"#,
        r#"{"rules":"nope"}"#,
    ] {
        let r = Client::anonymous(srv.addr)
            .send("POST", "/__control/faults", &[], Some(bad.as_bytes()))
            .await;
        assert_eq!(r.status, 400, "{bad}");
    }
    let rules = control(srv.addr, "GET", "/__control/faults", None).await;
    assert_eq!(rules["rules"].as_array().map(Vec::len), Some(1));
    srv.shutdown().await;
}

#[tokio::test]
async fn redirect_answers_without_the_route_or_the_ledger() {
    let srv = start(fast_settings()).await;
    let alice = Client::login(srv.addr, "alice").await;
    faults(
        srv.addr,
        r#"[{"path":"/api/notes","method":"POST","kind":"redirect","times":1},
            {"path":"/api/projects/**","kind":"redirect","status":308,"location":"https://sso.example/x?y=1","times":1}]"#,
    )
    .await;
    let k = key("redirect");
    let r = alice.post("/api/notes", Some(&k), r#"{"text":"r"}"#).await;
    assert_eq!((r.status, r.header("location")), (302, Some("/login")));
    let r = alice
        .post("/api/projects/p1/tasks", None, r#"{"title":"r"}"#)
        .await;
    assert_eq!(
        (r.status, r.header("location")),
        (308, Some("https://sso.example/x?y=1"))
    );
    assert!(applied(srv.addr).await.is_empty(), "no route ran");
    // The ledger was not touched: the same key applies normally now.
    let r = alice.post("/api/notes", Some(&k), r#"{"text":"r"}"#).await;
    assert_eq!(r.status, 201);
    assert!(r.header("idempotent-replayed").is_none());
    srv.shutdown().await;
}

#[tokio::test]
async fn status_with_a_detail_or_a_raw_body() {
    let srv = start(fast_settings()).await;
    let alice = Client::login(srv.addr, "alice").await;
    faults(
        srv.addr,
        r#"[{"path":"/api/notes","kind":"status","status":403,"detail":"csrf_failed","times":1},
            {"path":"/api/notes","kind":"status","status":409,"body":"<html><body>Conflict</body></html>","contentType":"text/html","times":1},
            {"path":"/api/notes","kind":"status","status":422,"body":"{\"type\":\"https://example.com/idempotency-key-reused\",\"status\":422}","contentType":"application/problem+json","times":1},
            {"path":"/api/notes","kind":"status","status":500,"body":"plain failure","times":1}]"#,
    )
    .await;
    let r = alice.post("/api/notes", None, r#"{"text":"s"}"#).await;
    assert_eq!(
        (r.status, r.json()),
        (403, serde_json::json!({"detail":"csrf_failed"}))
    );
    assert_eq!(r.header("content-type"), Some("application/json"));
    let r = alice.post("/api/notes", None, r#"{"text":"s"}"#).await;
    assert_eq!(
        (r.status, r.header("content-type")),
        (409, Some("text/html"))
    );
    assert_eq!(r.body, b"<html><body>Conflict</body></html>");
    let r = alice.post("/api/notes", None, r#"{"text":"s"}"#).await;
    assert_eq!(
        (r.status, r.header("content-type")),
        (422, Some("application/problem+json"))
    );
    assert_eq!(
        r.json()["type"],
        "https://example.com/idempotency-key-reused"
    );
    let r = alice.post("/api/notes", None, r#"{"text":"s"}"#).await;
    assert_eq!(
        (r.status, r.header("content-type")),
        (500, Some("text/plain; charset=utf-8"))
    );
    assert!(applied(srv.addr).await.is_empty());
    srv.shutdown().await;
}

/// `stored-status` stands in for the route inside the ledger: its answer is stored for the
/// key and replayed, `Retry-After` included, and the route never runs.
#[tokio::test]
async fn stored_status_is_replayed_with_its_retry_after() {
    let srv = start(fast_settings()).await;
    let alice = Client::login(srv.addr, "alice").await;
    faults(
        srv.addr,
        r#"[{"path":"/api/notes","kind":"stored-status","status":503,"detail":"db_down","retryAfter":"7","times":1},
            {"path":"/api/projects/*/tasks","kind":"stored-status","status":422,"body":"{\"title\":\"bad\"}","contentType":"application/problem+json","times":1}]"#,
    )
    .await;
    let k = key("stored");
    let first = alice.post("/api/notes", Some(&k), r#"{"text":"s"}"#).await;
    assert_eq!((first.status, first.detail().as_str()), (503, "db_down"));
    assert_eq!(first.header("retry-after"), Some("7"));
    assert!(first.header("idempotent-replayed").is_none());
    let again = alice.post("/api/notes", Some(&k), r#"{"text":"s"}"#).await;
    assert_eq!((again.status, again.detail().as_str()), (503, "db_down"));
    assert_eq!(again.header("retry-after"), Some("7"));
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    let k2 = key("stored422");
    alice
        .post("/api/projects/p1/tasks", Some(&k2), r#"{"title":"t"}"#)
        .await;
    let r = alice
        .post("/api/projects/p1/tasks", Some(&k2), r#"{"title":"t"}"#)
        .await;
    assert_eq!(
        (
            r.status,
            r.header("content-type"),
            r.header("idempotent-replayed")
        ),
        (422, Some("application/problem+json"), Some("true"))
    );
    assert!(applied(srv.addr).await.is_empty(), "the routes never ran");
    // Without a key there is nothing to store it under: it is just an answer.
    faults(
        srv.addr,
        r#"[{"path":"/api/notes","kind":"stored-status","status":500,"times":1}]"#,
    )
    .await;
    assert_eq!(
        alice
            .post("/api/notes", None, r#"{"text":"n"}"#)
            .await
            .status,
        500
    );
    assert_eq!(
        alice
            .post("/api/notes", None, r#"{"text":"n"}"#)
            .await
            .status,
        201
    );
    srv.shutdown().await;
}

/// Sends a request and reads until `want` has arrived; returns the stream, still open, and
/// what was read.
async fn read_until(
    addr: std::net::SocketAddr,
    request: String,
    want: &[u8],
) -> (tokio::net::TcpStream, Vec<u8>) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(want.len()).any(|w| w == want) {
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut chunk))
            .await
            .expect("the first bytes arrive")
            .expect("read");
        assert!(n > 0, "closed early: {:?}", String::from_utf8_lossy(&buf));
        buf.extend_from_slice(&chunk[..n]);
    }
    (s, buf)
}

#[tokio::test]
async fn stall_body_sends_the_start_and_never_the_rest() {
    let srv = start(fast_settings()).await;
    let alice = Client::login(srv.addr, "alice").await;
    faults(
        srv.addr,
        r#"[{"path":"/api/auth/me","method":"GET","kind":"stall-body","times":1},
            {"path":"/api/notes","method":"POST","kind":"stall-body","status":201,"body":"{\"id\":","times":1}]"#,
    )
    .await;
    let cookie = alice.cookie.clone().unwrap_or_default();
    let (mut me, head) = read_until(
        srv.addr,
        format!("GET /api/auth/me HTTP/1.1\r\nHost: x\r\nCookie: {cookie}\r\n\r\n"),
        br#"{"user":"#,
    )
    .await;
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("content-type: application/json"), "{head}");
    // Nothing more comes while the client waits.
    let mut more = [0u8; 64];
    let r = tokio::time::timeout(Duration::from_millis(500), me.read(&mut more)).await;
    assert!(r.is_err(), "the body must not go on: {r:?}");

    // On a write: the route does not run, and the ledger is not touched.
    let k = key("stall");
    let body = r#"{"text":"stalled"}"#;
    let (mut w, _) = read_until(
        srv.addr,
        format!(
            "POST /api/notes HTTP/1.1\r\nHost: x\r\nCookie: {cookie}\r\nX-CSRF-Token: {}\r\nIdempotency-Key: {k}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            alice.csrf.clone().unwrap_or_default(),
            body.len()
        ),
        br#"{"id":"#,
    )
    .await;
    let r = tokio::time::timeout(Duration::from_millis(300), w.read(&mut more)).await;
    assert!(r.is_err(), "{r:?}");
    drop((me, w));
    assert!(applied(srv.addr).await.is_empty());
    let r = alice.post("/api/notes", Some(&k), body).await;
    assert_eq!(r.status, 201);
    assert!(r.header("idempotent-replayed").is_none());
    // The server goes on serving.
    assert_eq!(alice.get("/api/auth/me").await.status, 200);
    srv.shutdown().await;
}

#[tokio::test]
async fn endless_body_goes_on_past_any_bound_until_the_client_leaves() {
    let srv = start(fast_settings()).await;
    let alice = Client::login(srv.addr, "alice").await;
    faults(
        srv.addr,
        r#"[{"path":"/api/notes","method":"POST","kind":"endless-body","status":422,"body":"<h1>idempotency key reused</h1>","contentType":"text/html","times":1}]"#,
    )
    .await;
    let cookie = alice.cookie.clone().unwrap_or_default();
    let k = key("endless");
    let body = r#"{"text":"endless"}"#;
    let (mut w, head) = read_until(
        srv.addr,
        format!(
            "POST /api/notes HTTP/1.1\r\nHost: x\r\nCookie: {cookie}\r\nX-CSRF-Token: {}\r\nIdempotency-Key: {k}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            alice.csrf.clone().unwrap_or_default(),
            body.len()
        ),
        b"<h1>idempotency key reused</h1>",
    )
    .await;
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 422"), "{head}");
    assert!(head.contains("content-type: text/html"), "{head}");
    // Far more than the 64 KiB an outbox reads, and still going.
    let mut total = head.len();
    let mut chunk = vec![0u8; 64 * 1024];
    while total < 1024 * 1024 {
        let n = tokio::time::timeout(Duration::from_secs(5), w.read(&mut chunk))
            .await
            .expect("the body goes on")
            .expect("read");
        assert!(n > 0, "the body ended after {total} bytes");
        total += n;
    }
    drop(w);
    // The route did not run, the ledger was not touched, and the server serves on.
    assert!(applied(srv.addr).await.is_empty());
    let r = alice.post("/api/notes", Some(&k), body).await;
    assert_eq!(r.status, 201);
    assert!(r.header("idempotent-replayed").is_none());
    srv.shutdown().await;
}

/// `/api/auth/me` (a GET, an auth route) is a fault target like any other.
#[tokio::test]
async fn faults_reach_auth_me() {
    let srv = start(fast_settings()).await;
    let alice = Client::login(srv.addr, "alice").await;
    faults(
        srv.addr,
        r#"[{"path":"/api/auth/me","method":"GET","kind":"status","status":503,"retryAfter":3,"times":1},
            {"path":"/api/auth/me","kind":"refuse","times":1},
            {"path":"/api/auth/me","kind":"redirect","status":302,"location":"/sso","times":1}]"#,
    )
    .await;
    let r = alice.get("/api/auth/me").await;
    assert_eq!((r.status, r.header("retry-after")), (503, Some("3")));
    let r = alice
        .try_send("GET", "/api/auth/me", &[], None)
        .await
        .expect("io");
    assert!(r.is_none(), "refused");
    let r = alice.get("/api/auth/me").await;
    assert_eq!((r.status, r.header("location")), (302, Some("/sso")));
    assert_eq!(alice.get("/api/auth/me").await.status, 200);
    srv.shutdown().await;
}
