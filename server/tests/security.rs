//! The reference server's security duties, each as it is seen over HTTP: cookie attributes,
//! session expiry, the login throttle, the Origin / `Sec-Fetch-Site` check on writes, the
//! per-session write budget, and `Cache-Control: no-store` on API answers.

mod common;

use common::*;
use std::time::{Duration, Instant};
use sw_outbox_server::client::{parse_net, ForwardedHeader};
use sw_outbox_server::limits::WIDE_FACTOR;
use sw_outbox_server::{Config, Mode, Rate};

fn config(tweak: impl FnOnce(&mut Config)) -> Config {
    let mut c = test_config(fast_settings(), Mode::Test);
    tweak(&mut c);
    c
}

async fn login_raw(
    addr: std::net::SocketAddr,
    user: &str,
    password: &str,
    extra: &[(&str, &str)],
) -> Resp {
    let body = format!(r#"{{"userId":"{user}","password":"{password}"}}"#);
    Client::anonymous(addr)
        .send("POST", "/api/auth/login", extra, Some(body.as_bytes()))
        .await
}

#[tokio::test]
async fn cookies_are_httponly_strict_and_secure_over_https() {
    let srv = start(fast_settings()).await;
    let plain = login_raw(srv.addr, "bob", "bob", &[]).await;
    let cookie = plain.header("set-cookie").expect("cookie");
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=604800"] {
        assert!(cookie.contains(attr), "{cookie} lacks {attr}");
    }
    assert!(!cookie.contains("Secure"), "plain http: {cookie}");
    // Behind a TLS-terminating proxy.
    for header in [
        ("X-Forwarded-Proto", "https"),
        ("Forwarded", "for=10.0.0.1;proto=https"),
    ] {
        let r = login_raw(srv.addr, "bob", "bob", &[header]).await;
        let cookie = r.header("set-cookie").expect("cookie");
        assert!(cookie.contains("; Secure"), "{header:?}: {cookie}");
        assert!(cookie.contains("SameSite=Strict"));
    }
    let mut alice = Client::login(srv.addr, "alice").await;
    let out = alice.send("POST", "/api/auth/logout", &[], None).await;
    let cleared = out.header("set-cookie").expect("clearing cookie");
    assert!(
        cleared.starts_with("sid=;")
            && cleared.contains("Max-Age=0")
            && cleared.contains("SameSite=Strict"),
        "{cleared}"
    );
    alice.csrf = None;
    assert_eq!(alice.get("/api/auth/me").await.status, 401);
    srv.shutdown().await;

    // A configured https origin makes every cookie Secure.
    let srv = start_config(config(|c| c.origins = vec!["https://app.example".into()])).await;
    let r = login_raw(srv.addr, "bob", "bob", &[]).await;
    assert!(r.header("set-cookie").expect("cookie").contains("; Secure"));
    srv.shutdown().await;
}

#[tokio::test]
async fn sessions_end_when_idle_and_at_their_limit() {
    let srv = start_config(config(|c| {
        c.session_idle = Duration::from_millis(1000);
        c.session_max = Duration::from_millis(3000);
    }))
    .await;
    // Idle: unused past the bound, the session is gone, for reads and writes.
    let idle = Client::login(srv.addr, "alice").await;
    assert_eq!(idle.get("/api/auth/me").await.status, 200);
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert_eq!(idle.get("/api/auth/me").await.status, 401);
    let r = idle.post("/api/notes", None, r#"{"text":"late"}"#).await;
    assert_eq!((r.status, r.detail().as_str()), (401, "not_signed_in"));

    // In use, it lives past the idle bound, but not past its limit.
    let busy = Client::login(srv.addr, "bob").await;
    let signed_in = Instant::now();
    let mut last = 200;
    let mut seen_past_idle = false;
    while signed_in.elapsed() < Duration::from_millis(3300) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let at = signed_in.elapsed();
        last = busy.get("/api/auth/me").await.status;
        if at < Duration::from_millis(2000) {
            assert_eq!(last, 200, "used every 250 ms, alive at {at:?}");
            seen_past_idle |= at > Duration::from_millis(1000);
        }
    }
    assert!(seen_past_idle);
    assert_eq!(last, 401, "over after session_max however busy");
    assert!(applied(srv.addr).await.is_empty());
    srv.shutdown().await;
}

#[tokio::test]
async fn failed_logins_are_throttled_with_retry_after() {
    let srv = start_config(config(|c| {
        c.login_throttle = Rate {
            count: 3,
            per: Duration::from_millis(1500),
        }
    }))
    .await;
    for _ in 0..3 {
        let r = login_raw(srv.addr, "alice", "guess", &[]).await;
        assert_eq!(
            (r.status, r.detail().as_str()),
            (401, "invalid_credentials")
        );
    }
    // Throttled: even the right password is not tried, so guessing learns nothing.
    let r = login_raw(srv.addr, "alice", "alice", &[]).await;
    assert_eq!(
        (r.status, r.detail().as_str()),
        (429, "too_many_login_attempts")
    );
    assert!(r.header("set-cookie").is_none());
    let wait: u64 = r
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After seconds");
    assert!((1..=2).contains(&wait), "{wait}");
    // Counted per (account, client): the same client may still sign in to another
    // account (its client-wide bound is WIDE_FACTOR times higher).
    assert_eq!(login_raw(srv.addr, "bob", "bob", &[]).await.status, 200);
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(login_raw(srv.addr, "alice", "alice", &[]).await.status, 200);
    srv.shutdown().await;
}

/// A server behind a proxy on loopback (the tests' own address), throttling at `count`
/// failures per (account, client) in a minute.
async fn behind_proxy(count: u32, header: ForwardedHeader) -> sw_outbox_server::RunningServer {
    start_config(config(|c| {
        c.login_throttle = Rate {
            count,
            per: Duration::from_secs(60),
        };
        c.trusted_proxies = vec![parse_net("127.0.0.0/8").expect("net")];
        c.forwarded_header = header;
    }))
    .await
}

/// What the proxy adds for a client at `ip`, in the configured header.
fn via(header: ForwardedHeader, ip: &str) -> (&'static str, String) {
    match header {
        ForwardedHeader::XForwardedFor => ("X-Forwarded-For", ip.to_owned()),
        ForwardedHeader::Forwarded => ("Forwarded", format!("for={ip};proto=https")),
    }
}

#[tokio::test]
async fn behind_a_trusted_proxy_bad_attempts_lock_out_their_own_client_only() {
    for header in [ForwardedHeader::XForwardedFor, ForwardedHeader::Forwarded] {
        let srv = behind_proxy(3, header).await;
        let (name, attacker) = via(header, "203.0.113.66");
        let from_attacker = [(name, attacker.as_str())];
        for _ in 0..3 {
            let r = login_raw(srv.addr, "alice", "guess", &from_attacker).await;
            assert_eq!(r.status, 401, "{header:?}");
        }
        let r = login_raw(srv.addr, "alice", "alice", &from_attacker).await;
        assert_eq!(
            (r.status, r.detail().as_str()),
            (429, "too_many_login_attempts"),
            "{header:?}: the guessing client is held back"
        );
        // Everyone else behind the same proxy (one peer address) signs in as usual, to
        // the attacked account too.
        let (name, other) = via(header, "198.51.100.7");
        let from_other = [(name, other.as_str())];
        for user in ["alice", "bob"] {
            let r = login_raw(srv.addr, user, user, &from_other).await;
            assert_eq!(r.status, 200, "{header:?}: {user} from another client");
        }
        srv.shutdown().await;
    }
}

#[tokio::test]
async fn forwarding_headers_from_untrusted_peers_are_ignored() {
    // The proxy is elsewhere: a client on loopback that names a fresh address in every
    // attempt is still one client.
    let srv = start_config(config(|c| {
        c.login_throttle = Rate {
            count: 3,
            per: Duration::from_secs(60),
        };
        c.trusted_proxies = vec![parse_net("10.0.0.0/8").expect("net")];
    }))
    .await;
    for i in 0..3 {
        let forged = format!("192.0.2.{i}");
        let r = login_raw(srv.addr, "alice", "guess", &[("X-Forwarded-For", &forged)]).await;
        assert_eq!(r.status, 401);
    }
    let r = login_raw(
        srv.addr,
        "alice",
        "alice",
        &[("X-Forwarded-For", "192.0.2.99")],
    )
    .await;
    assert_eq!(r.status, 429);
    srv.shutdown().await;
}

#[tokio::test]
async fn an_account_is_locked_for_everyone_only_by_many_clients() {
    let header = ForwardedHeader::XForwardedFor;
    let srv = behind_proxy(2, header).await;
    let fail_from = |i: u32| {
        let addr = srv.addr;
        async move {
            let ip = format!("203.0.113.{i}");
            for _ in 0..2 {
                let r = login_raw(addr, "alice", "guess", &[("X-Forwarded-For", &ip)]).await;
                assert_eq!(r.status, 401, "client {i}");
            }
        }
    };
    for i in 0..WIDE_FACTOR - 1 {
        fail_from(i).await;
    }
    let fresh = [("X-Forwarded-For", "198.51.100.1")];
    assert_eq!(
        login_raw(srv.addr, "alice", "alice", &fresh).await.status,
        200,
        "failures from {} clients do not lock alice out",
        WIDE_FACTOR - 1
    );
    fail_from(WIDE_FACTOR - 1).await;
    let r = login_raw(
        srv.addr,
        "alice",
        "alice",
        &[("X-Forwarded-For", "198.51.100.2")],
    )
    .await;
    assert_eq!(r.status, 429, "failures from {WIDE_FACTOR} clients do");
    assert_eq!(login_raw(srv.addr, "bob", "bob", &fresh).await.status, 200);
    // One client spraying accounts is held back at the client-wide bound.
    let sprayer = [("X-Forwarded-For", "192.0.2.200")];
    for i in 0..2 * WIDE_FACTOR {
        let user = format!("user{i}");
        assert_eq!(
            login_raw(srv.addr, &user, "guess", &sprayer).await.status,
            401
        );
    }
    assert_eq!(
        login_raw(srv.addr, "bob", "bob", &sprayer).await.status,
        429
    );
    srv.shutdown().await;
}

#[tokio::test]
async fn writes_from_other_origins_are_refused() {
    let srv = start(fast_settings()).await;
    let alice = Client::login(srv.addr, "alice").await;
    let own = format!("http://{}", srv.addr);
    // What the worker and the demo page send, and what a non-browser client sends.
    let same = [("Origin", own.as_str()), ("Sec-Fetch-Site", "same-origin")];
    let k = key("origin");
    let mut h: Vec<(&str, &str)> = same.to_vec();
    h.push(("Idempotency-Key", &k));
    let r = alice
        .send("POST", "/api/notes", &h, Some(br#"{"text":"ok"}"#))
        .await;
    assert_eq!(r.status, 201);
    assert_eq!(
        alice
            .post("/api/notes", None, r#"{"text":"no headers"}"#)
            .await
            .status,
        201
    );
    // Another site's page, however it dresses the request.
    let k2 = key("foreign");
    for foreign in [
        &[("Origin", "http://evil.example")][..],
        &[("Origin", "null")],
        &[("Sec-Fetch-Site", "cross-site")],
        &[("Sec-Fetch-Site", "same-site"), ("Origin", own.as_str())],
        &[
            ("Origin", "https://evil.example"),
            ("Sec-Fetch-Site", "same-origin"),
        ],
    ] {
        let mut h: Vec<(&str, &str)> = foreign.to_vec();
        h.push(("Idempotency-Key", &k2));
        let r = alice
            .send("POST", "/api/notes", &h, Some(br#"{"text":"forged"}"#))
            .await;
        assert_eq!(
            (r.status, r.detail().as_str()),
            (403, "origin_refused"),
            "{foreign:?}"
        );
        let r = alice
            .send("DELETE", "/api/projects/p1/tasks/1", foreign, None)
            .await;
        assert_eq!(r.status, 403);
    }
    // Sign-in too (login CSRF); reads are not writes.
    let r = login_raw(
        srv.addr,
        "alice",
        "alice",
        &[("Origin", "http://evil.example")],
    )
    .await;
    assert_eq!(r.status, 403);
    assert!(r.header("set-cookie").is_none());
    let r = alice
        .send(
            "GET",
            "/api/notes",
            &[("Origin", "http://evil.example")],
            None,
        )
        .await;
    assert_eq!(r.status, 200);
    // Refused before the ledger: the key applies normally afterwards.
    let r = alice
        .post("/api/notes", Some(&k2), r#"{"text":"forged"}"#)
        .await;
    assert_eq!(r.status, 201);
    assert!(r.header("idempotent-replayed").is_none());
    let texts: Vec<String> = applied(srv.addr)
        .await
        .iter()
        .map(|a| a["body"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(texts.len(), 3, "{texts:?}");
    srv.shutdown().await;
}

#[tokio::test]
async fn each_session_has_a_write_budget() {
    let srv = start_config(config(|c| {
        c.write_budget = Rate {
            count: 3,
            per: Duration::from_secs(60),
        }
    }))
    .await;
    let alice = Client::login(srv.addr, "alice").await;
    for i in 0..3 {
        let r = alice
            .post(
                "/api/notes",
                Some(&key(&format!("budget{i}"))),
                r#"{"text":"b"}"#,
            )
            .await;
        assert_eq!(r.status, 201);
    }
    let k = key("over");
    let r = alice.post("/api/notes", Some(&k), r#"{"text":"b"}"#).await;
    assert_eq!(
        (r.status, r.detail().as_str()),
        (429, "write_budget_exceeded")
    );
    let wait: u64 = r
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!((1..=20).contains(&wait), "{wait}");
    // Reads are not writes; another session has its own budget.
    assert_eq!(alice.get("/api/notes").await.status, 200);
    let other = Client::login(srv.addr, "alice").await;
    let r = other.post("/api/notes", Some(&k), r#"{"text":"b"}"#).await;
    assert_eq!(r.status, 201, "the refused write claimed nothing");
    assert_eq!(applied(srv.addr).await.len(), 4);
    srv.shutdown().await;
}

#[tokio::test]
async fn api_answers_are_never_cached() {
    let srv = start(fast_settings()).await;
    let anon = Client::anonymous(srv.addr);
    let alice = Client::login(srv.addr, "alice").await;
    let k = key("nostore");
    let answers = vec![
        anon.get("/api/auth/me").await,
        login_raw(srv.addr, "bob", "bob", &[]).await,
        alice.get("/api/auth/me").await,
        alice.get("/api/projects/p1/tasks").await,
        alice
            .post("/api/projects/p1/tasks", Some(&k), r#"{"title":"t"}"#)
            .await,
        alice
            .post("/api/projects/p1/tasks", Some(&k), r#"{"title":"t"}"#)
            .await,
        alice
            .post("/api/notes", Some("bad key"), r#"{"text":"t"}"#)
            .await,
        alice.get("/api/nothing").await,
        anon.post("/api/notes", None, "{}").await,
    ];
    for r in &answers {
        assert_eq!(
            r.header("cache-control"),
            Some("no-store"),
            "{} {:?}",
            r.status,
            String::from_utf8_lossy(&r.body)
        );
    }
    assert_eq!(answers[5].header("idempotent-replayed"), Some("true"));
    faults(
        srv.addr,
        r#"[{"path":"/api/**","kind":"status","status":503}]"#,
    )
    .await;
    assert_eq!(
        alice.get("/api/notes").await.header("cache-control"),
        Some("no-store")
    );
    srv.shutdown().await;
}
