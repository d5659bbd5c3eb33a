//! `--auth bearer`: no cookie at all, access tokens that expire, a refresh route, and the
//! same writes, ledger and expected-account check as with cookies.

mod common;

use common::*;
use std::time::Duration;
use sw_outbox_server::{AuthMode, Config, Mode, RunningServer};

async fn bearer_server(token_ttl: Duration) -> RunningServer {
    start_config(Config {
        auth: AuthMode::Bearer,
        token_ttl,
        ..test_config(fast_settings(), Mode::Test)
    })
    .await
}

/// A signed-in bearer client: its tokens, no cookie, no CSRF token.
struct Tokens {
    access: String,
    refresh: String,
}

async fn sign_in(addr: std::net::SocketAddr, user: &str) -> (Resp, Tokens) {
    let body = format!(r#"{{"userId":"{user}","password":"{user}"}}"#);
    let resp = Client::anonymous(addr)
        .send("POST", "/api/auth/login", &[], Some(body.as_bytes()))
        .await;
    assert_eq!(resp.status, 200, "login {user}");
    let j = resp.json();
    let tokens = Tokens {
        access: j["accessToken"].as_str().expect("accessToken").to_owned(),
        refresh: j["refreshToken"].as_str().expect("refreshToken").to_owned(),
    };
    (resp, tokens)
}

async fn with_token(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: &str,
    extra: &[(&str, &str)],
    body: Option<&str>,
) -> Resp {
    let auth = format!("Bearer {token}");
    let mut headers = vec![("Authorization", auth.as_str())];
    if body.is_some() {
        headers.push(("Content-Type", "application/json"));
    }
    headers.extend_from_slice(extra);
    raw(addr, method, path, &headers, body.map(str::as_bytes))
        .await
        .expect("io")
        .expect("an answer")
}

#[tokio::test]
async fn sign_in_answers_tokens_and_no_cookie() {
    let srv = bearer_server(Duration::from_secs(60)).await;
    let (resp, t) = sign_in(srv.addr, "alice").await;
    assert!(resp.header("set-cookie").is_none(), "no cookie at all");
    let j = resp.json();
    assert_eq!(j["user"]["id"], "alice");
    assert_eq!(j["tokenType"], "Bearer");
    assert!(j["expiresAt"].as_i64().is_some_and(|e| e > 0));
    assert!(
        j.get("csrfToken").is_none(),
        "no CSRF token with a bearer token"
    );
    assert_ne!(t.access, t.refresh);

    let me = with_token(srv.addr, "GET", "/api/auth/me", &t.access, &[], None).await;
    assert_eq!(me.status, 200);
    assert_eq!(me.json()["user"]["id"], "alice");
    assert!(me.header("x-csrf-token").is_none());
    let anon = Client::anonymous(srv.addr).get("/api/auth/me").await;
    assert_eq!(anon.status, 401);
    assert_eq!(anon.header("www-authenticate"), Some("Bearer"));
    let wrong = with_token(srv.addr, "GET", "/api/auth/me", "not-a-token", &[], None).await;
    assert_eq!(wrong.status, 401);
    srv.shutdown().await;
}

#[tokio::test]
async fn a_write_needs_the_token_not_a_csrf_token_and_the_ledger_scopes_it_by_account() {
    let srv = bearer_server(Duration::from_secs(60)).await;
    let (_, t) = sign_in(srv.addr, "alice").await;
    let body = r#"{"title":"with a token"}"#;
    let key = [("Idempotency-Key", "bearer-key-0001")];
    let first = with_token(
        srv.addr,
        "POST",
        "/api/projects/p1/tasks",
        &t.access,
        &key,
        Some(body),
    )
    .await;
    assert_eq!(
        first.status,
        201,
        "{:?}",
        String::from_utf8_lossy(&first.body)
    );
    let again = with_token(
        srv.addr,
        "POST",
        "/api/projects/p1/tasks",
        &t.access,
        &key,
        Some(body),
    )
    .await;
    assert_eq!(again.status, 201);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.json()["id"], first.json()["id"]);
    let applied = applied(srv.addr).await;
    assert_eq!(applied.len(), 1, "applied once");
    assert_eq!(applied[0]["user"], "alice");

    let mismatch = with_token(
        srv.addr,
        "POST",
        "/api/notes",
        &t.access,
        &[("X-PM-Expected-Account", "bob")],
        Some(r#"{"text":"x"}"#),
    )
    .await;
    assert_eq!(
        (mismatch.status, mismatch.detail().as_str()),
        (409, "account_mismatch")
    );
    // A cookie means nothing in bearer mode.
    let cookie = Client {
        addr: srv.addr,
        cookie: Some(format!("sid={}", t.refresh)),
        csrf: None,
    };
    let r = cookie.post("/api/notes", None, r#"{"text":"x"}"#).await;
    assert_eq!((r.status, r.detail().as_str()), (401, "not_signed_in"));
    srv.shutdown().await;
}

#[tokio::test]
async fn an_expired_token_is_refused_as_such_and_a_refresh_gives_a_new_one() {
    let srv = bearer_server(Duration::from_secs(600)).await;
    let (_, t) = sign_in(srv.addr, "alice").await;
    let expired = control(srv.addr, "POST", "/__control/expire-tokens", Some("{}")).await;
    assert_eq!(expired["expired"], 1);
    for (method, path, body) in [
        ("GET", "/api/auth/me", None),
        ("GET", "/api/notes", None),
        ("POST", "/api/notes", Some(r#"{"text":"late"}"#)),
    ] {
        let r = with_token(srv.addr, method, path, &t.access, &[], body).await;
        assert_eq!(
            (r.status, r.detail().as_str()),
            (401, "token_expired"),
            "{method} {path}"
        );
        assert!(
            r.header("www-authenticate")
                .is_some_and(|h| h.contains("invalid_token")),
            "{method} {path}: {:?}",
            r.headers
        );
    }
    assert!(
        applied(srv.addr).await.is_empty(),
        "nothing applied with an expired token"
    );

    let refresh = format!(r#"{{"refreshToken":"{}"}}"#, t.refresh);
    let r = Client::anonymous(srv.addr)
        .send("POST", "/api/auth/refresh", &[], Some(refresh.as_bytes()))
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["user"]["id"], "alice");
    let fresh = r.json()["accessToken"].as_str().expect("token").to_owned();
    assert_ne!(fresh, t.access);
    let w = with_token(
        srv.addr,
        "POST",
        "/api/notes",
        &fresh,
        &[],
        Some(r#"{"text":"after"}"#),
    )
    .await;
    assert_eq!(w.status, 201);
    let bad = Client::anonymous(srv.addr)
        .send(
            "POST",
            "/api/auth/refresh",
            &[],
            Some(br#"{"refreshToken":"nope"}"#),
        )
        .await;
    assert_eq!(
        (bad.status, bad.detail().as_str()),
        (401, "invalid_refresh_token")
    );
    srv.shutdown().await;
}

#[tokio::test]
async fn tokens_expire_after_their_time() {
    let srv = bearer_server(Duration::from_millis(300)).await;
    let (_, t) = sign_in(srv.addr, "bob").await;
    assert_eq!(
        with_token(srv.addr, "GET", "/api/auth/me", &t.access, &[], None)
            .await
            .status,
        200
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let late = with_token(srv.addr, "GET", "/api/auth/me", &t.access, &[], None).await;
    assert_eq!(
        (late.status, late.detail().as_str()),
        (401, "token_expired")
    );
    srv.shutdown().await;
}

#[tokio::test]
async fn sign_out_revokes_the_session_and_its_tokens() {
    let srv = bearer_server(Duration::from_secs(60)).await;
    let (_, t) = sign_in(srv.addr, "alice").await;
    let out = with_token(srv.addr, "POST", "/api/auth/logout", &t.access, &[], None).await;
    assert_eq!(out.status, 200);
    assert!(out.header("set-cookie").is_none());
    assert_eq!(
        with_token(srv.addr, "GET", "/api/auth/me", &t.access, &[], None)
            .await
            .status,
        401
    );
    let refresh = format!(r#"{{"refreshToken":"{}"}}"#, t.refresh);
    let r = Client::anonymous(srv.addr)
        .send("POST", "/api/auth/refresh", &[], Some(refresh.as_bytes()))
        .await;
    assert_eq!(r.status, 401, "the refresh token went with the session");

    // With an expired access token, the refresh token in the body signs out.
    let (_, t) = sign_in(srv.addr, "alice").await;
    control(srv.addr, "POST", "/__control/expire-tokens", Some("{}")).await;
    let refresh = format!(r#"{{"refreshToken":"{}"}}"#, t.refresh);
    let out = with_token(
        srv.addr,
        "POST",
        "/api/auth/logout",
        &t.access,
        &[],
        Some(&refresh),
    )
    .await;
    assert_eq!(out.status, 200);
    let r = Client::anonymous(srv.addr)
        .send("POST", "/api/auth/refresh", &[], Some(refresh.as_bytes()))
        .await;
    assert_eq!(r.status, 401);
    srv.shutdown().await;
}

#[tokio::test]
async fn cookie_mode_has_no_refresh_route() {
    let srv = start(fast_settings()).await;
    let r = Client::anonymous(srv.addr)
        .send(
            "POST",
            "/api/auth/refresh",
            &[],
            Some(br#"{"refreshToken":"x"}"#),
        )
        .await;
    assert_eq!(r.status, 404);
    srv.shutdown().await;
}
