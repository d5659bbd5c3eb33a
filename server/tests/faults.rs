mod common;

use common::*;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn network_down_drops_api_connections_without_an_answer() {
    let srv = start(fast_timings()).await;
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
    let srv = start(fast_timings()).await;
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
    let srv = start(fast_timings()).await;
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
    let srv = start(fast_timings()).await;
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
    let srv = start(fast_timings()).await;
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
    let srv = start(fast_timings()).await;
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
    let srv = start(fast_timings()).await;
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
    let srv = start(fast_timings()).await;
    faults(srv.addr, r#"[{"path":"/api/notes","kind":"refuse"}]"#).await;
    for bad in [
        r#"{"rules":[{"path":"/api/**","kind":"explode"}]}"#,
        r#"{"rules":[{"path":"/api/**","kind":"status","status":1000}]}"#,
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
