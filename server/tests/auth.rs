mod common;

use common::*;

#[tokio::test]
async fn login_me_logout() {
    let srv = start(fast_settings()).await;
    let anon = Client::anonymous(srv.addr);
    let me = anon.get("/api/auth/me").await;
    assert_eq!(me.status, 401);
    assert!(me.json()["user"].is_null());

    let bad = anon
        .send(
            "POST",
            "/api/auth/login",
            &[],
            Some(br#"{"userId":"alice","password":"bob"}"#),
        )
        .await;
    assert_eq!(bad.status, 401);
    assert!(bad.header("set-cookie").is_none());
    let unknown = anon
        .send(
            "POST",
            "/api/auth/login",
            &[],
            Some(br#"{"userId":"eve","password":"eve"}"#),
        )
        .await;
    assert_eq!(unknown.status, 401);
    let garbage = anon
        .send("POST", "/api/auth/login", &[], Some(b"{nope"))
        .await;
    assert_eq!(garbage.status, 400);

    let alice = Client::login(srv.addr, "alice").await;
    let csrf = alice.csrf.clone().expect("csrf token");
    assert!(csrf.len() >= 32);
    let me = alice.get("/api/auth/me").await;
    assert_eq!(me.status, 200);
    assert_eq!(me.json()["user"]["id"], "alice");
    assert_eq!(me.json()["csrfToken"], csrf.as_str());
    assert_eq!(me.header("x-csrf-token"), Some(csrf.as_str()));

    // Each session gets its own token.
    let alice2 = Client::login(srv.addr, "alice").await;
    assert_ne!(alice2.csrf, alice.csrf);
    assert_ne!(alice2.cookie, alice.cookie);

    let out = alice.send("POST", "/api/auth/logout", &[], None).await;
    assert_eq!(out.status, 200);
    assert_eq!(out.json()["ok"], true);
    let cleared = out.header("set-cookie").expect("clearing cookie");
    assert!(
        cleared.starts_with("sid=;") && cleared.contains("Max-Age=0"),
        "{cleared}"
    );
    assert_eq!(
        alice.get("/api/auth/me").await.status,
        401,
        "session is gone"
    );
    assert_eq!(
        alice2.get("/api/auth/me").await.status,
        200,
        "other session unaffected"
    );
    srv.shutdown().await;
}

#[tokio::test]
async fn writes_need_session_and_csrf() {
    let srv = start(fast_settings()).await;
    let anon = Client::anonymous(srv.addr);
    let r = anon.post("/api/notes", None, r#"{"text":"x"}"#).await;
    assert_eq!((r.status, r.detail().as_str()), (401, "not_signed_in"));

    let alice = Client::login(srv.addr, "alice").await;
    let mut no_csrf = alice.clone();
    no_csrf.csrf = None;
    let r = no_csrf.post("/api/notes", None, r#"{"text":"x"}"#).await;
    assert_eq!((r.status, r.detail().as_str()), (403, "csrf_failed"));
    let mut wrong = alice.clone();
    wrong.csrf = Some("0".repeat(64));
    let r = wrong.post("/api/notes", None, r#"{"text":"x"}"#).await;
    assert_eq!((r.status, r.detail().as_str()), (403, "csrf_failed"));
    // Another session's token is not this session's token.
    let bob = Client::login(srv.addr, "bob").await;
    let mut crossed = alice.clone();
    crossed.csrf = bob.csrf.clone();
    let r = crossed.post("/api/notes", None, r#"{"text":"x"}"#).await;
    assert_eq!(r.status, 403);

    assert!(applied(srv.addr).await.is_empty(), "nothing applied");
    let r = alice.post("/api/notes", None, r#"{"text":"x"}"#).await;
    assert_eq!(r.status, 201);
    assert_eq!(applied(srv.addr).await.len(), 1);
    srv.shutdown().await;
}

#[tokio::test]
async fn account_mismatch() {
    let srv = start(fast_settings()).await;
    let alice = Client::login(srv.addr, "alice").await;
    let me = alice
        .send(
            "GET",
            "/api/auth/me",
            &[("X-PM-Expected-Account", "bob")],
            None,
        )
        .await;
    assert_eq!(me.status, 409);
    assert_eq!(me.json()["detail"], "account_mismatch");
    assert_eq!(me.json()["user"]["id"], "alice");
    let me = alice
        .send(
            "GET",
            "/api/auth/me",
            &[("X-PM-Expected-Account", "alice")],
            None,
        )
        .await;
    assert_eq!(me.status, 200);

    let k = key("mismatch");
    let r = alice
        .send(
            "POST",
            "/api/notes",
            &[("X-PM-Expected-Account", "bob"), ("Idempotency-Key", &k)],
            Some(br#"{"text":"for bob"}"#),
        )
        .await;
    assert_eq!((r.status, r.detail().as_str()), (409, "account_mismatch"));
    assert!(applied(srv.addr).await.is_empty());
    // The refused attempt claimed nothing: the same key applies once the account matches.
    let r = alice
        .send(
            "POST",
            "/api/notes",
            &[("X-PM-Expected-Account", "alice"), ("Idempotency-Key", &k)],
            Some(br#"{"text":"for bob"}"#),
        )
        .await;
    assert_eq!(r.status, 201);
    assert!(r.header("idempotent-replayed").is_none());
    srv.shutdown().await;
}
