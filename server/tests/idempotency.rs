mod common;

use common::*;
use std::time::{Duration, Instant};
use sw_outbox_idempotency::KeyRule;
use tokio::io::AsyncWriteExt;

// Every case runs twice, as `sqlite::<case>` and `postgres::<case>`.
on_both_ledgers!(
    first_apply_then_replay_with_same_answer,
    keyless_writes_are_applied_each_time,
    invalid_keys_are_refused,
    strict_keys_keep_the_old_rule,
    key_reused_for_a_different_request,
    scope_is_per_account,
    client_errors_are_stored_and_replayed,
    duplicate_waits_for_a_running_first_attempt,
    in_progress_after_the_wait_bound,
    a_request_whose_client_hangs_up_is_applied_once_and_replayed,
    expired_entries_apply_again,
    expired_but_unpruned_entry_is_replaced,
);

async fn first_apply_then_replay_with_same_answer(backend: Backend) {
    let Some(srv) = start_on(backend, fast_settings()).await else {
        return;
    };
    let alice = Client::login(srv.addr, "alice").await;
    let k = key("replay");
    let first = alice
        .post("/api/projects/p1/tasks", Some(&k), r#"{"title":"once"}"#)
        .await;
    assert_eq!(first.status, 201);
    assert!(first.header("idempotent-replayed").is_none());
    let again = alice
        .post("/api/projects/p1/tasks", Some(&k), r#"{"title":"once"}"#)
        .await;
    assert_eq!(again.status, 201);
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.body, first.body);
    assert_eq!(again.header("location"), first.header("location"));
    assert!(again.header("location").is_some());
    assert_eq!(again.header("content-type"), Some("application/json"));

    let log = applied(srv.addr).await;
    assert_eq!(log.len(), 1, "applied once: {log:?}");
    assert_eq!(log[0]["key"], k.as_str());
    assert_eq!(
        alice.get("/api/projects/p1/tasks").await.json()["tasks"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );

    // A replay is still a write: it needs the session and the CSRF token.
    let mut no_csrf = alice.clone();
    no_csrf.csrf = None;
    let r = no_csrf
        .post("/api/projects/p1/tasks", Some(&k), r#"{"title":"once"}"#)
        .await;
    assert_eq!(r.status, 403);

    // 204 with no body replays as 204.
    let id = first.json()["id"].as_i64().expect("id");
    let dk = key("delete");
    let path = format!("/api/projects/p1/tasks/{id}");
    let d1 = alice
        .send("DELETE", &path, &[("Idempotency-Key", &dk)], None)
        .await;
    let d2 = alice
        .send("DELETE", &path, &[("Idempotency-Key", &dk)], None)
        .await;
    assert_eq!(
        (d1.status, d2.status),
        (204, 204),
        "not 404: the delete is not re-run"
    );
    assert_eq!(d2.header("idempotent-replayed"), Some("true"));
    assert_eq!(applied(srv.addr).await.len(), 2);
    srv.shutdown().await;
}

async fn keyless_writes_are_applied_each_time(backend: Backend) {
    let Some(srv) = start_on(backend, fast_settings()).await else {
        return;
    };
    let alice = Client::login(srv.addr, "alice").await;
    alice.post("/api/notes", None, r#"{"text":"a"}"#).await;
    let r = alice.post("/api/notes", None, r#"{"text":"a"}"#).await;
    assert!(r.header("idempotent-replayed").is_none());
    assert_eq!(applied(srv.addr).await.len(), 2);
    srv.shutdown().await;
}

/// Contract 2.2 (r2): any key of 1–255 visible ASCII characters is taken as it is.
async fn invalid_keys_are_refused(backend: Backend) {
    let Some(srv) = start_on(backend, fast_settings()).await else {
        return;
    };
    let alice = Client::login(srv.addr, "alice").await;
    let too_long = "a".repeat(256);
    for bad in [
        "",
        "has a space",
        "tab\there",
        too_long.as_str(),
        "caf\u{e9}",
    ] {
        let r = alice.post("/api/notes", Some(bad), r#"{"text":"x"}"#).await;
        assert_eq!(
            (r.status, r.detail().as_str()),
            (400, "idempotency_key_invalid"),
            "{bad:?}"
        );
    }
    assert!(applied(srv.addr).await.is_empty());
    let longest = "h".repeat(255);
    let hash = "9f".repeat(40);
    let page_keys = [
        "order_1234",
        "k:7f3e",
        "a",
        hash.as_str(),
        longest.as_str(),
        "!#$%&'*+.^`|~",
        "0b9f6c1e-8a9d-4c3e-9f2a-1d2c3b4a5e6f",
    ];
    for k in page_keys {
        let r = alice.post("/api/notes", Some(k), r#"{"text":"x"}"#).await;
        assert_eq!(r.status, 201, "{k}");
        let again = alice.post("/api/notes", Some(k), r#"{"text":"x"}"#).await;
        assert_eq!(again.header("idempotent-replayed"), Some("true"), "{k}");
    }
    let keys: Vec<String> = applied(srv.addr)
        .await
        .iter()
        .map(|a| a["key"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(keys, page_keys, "each applied once, its key unchanged");
    srv.shutdown().await;
}

/// `--strict-keys`: the earlier 22–64 `[A-Za-z0-9_-]` rule.
async fn strict_keys_keep_the_old_rule(backend: Backend) {
    let settings = fast().key_rule(KeyRule::Strict).build().expect("valid");
    let Some(srv) = start_on(backend, settings).await else {
        return;
    };
    let alice = Client::login(srv.addr, "alice").await;
    let long = "a".repeat(65);
    for bad in [
        "order_1234",
        "k:7f3e",
        "abcdefghijklmnopqrstu!",
        long.as_str(),
    ] {
        let r = alice.post("/api/notes", Some(bad), r#"{"text":"x"}"#).await;
        assert_eq!(
            (r.status, r.detail().as_str()),
            (400, "idempotency_key_invalid"),
            "{bad}"
        );
    }
    let r = alice
        .post(
            "/api/notes",
            Some("0b9f6c1e-8a9d-4c3e-9f2a-1d2c3b4a5e6f"),
            r#"{"text":"x"}"#,
        )
        .await;
    assert_eq!(r.status, 201);
    assert_eq!(applied(srv.addr).await.len(), 1);
    srv.shutdown().await;
}

async fn key_reused_for_a_different_request(backend: Backend) {
    let Some(srv) = start_on(backend, fast_settings()).await else {
        return;
    };
    let alice = Client::login(srv.addr, "alice").await;
    let k = key("reused");
    assert_eq!(
        alice
            .post("/api/projects/p1/tasks", Some(&k), r#"{"title":"a"}"#)
            .await
            .status,
        201
    );
    let other_body = alice
        .post("/api/projects/p1/tasks", Some(&k), r#"{"title":"b"}"#)
        .await;
    assert_eq!(
        (other_body.status, other_body.detail().as_str()),
        (422, "idempotency_key_reused")
    );
    let other_path = alice
        .post("/api/projects/p2/tasks", Some(&k), r#"{"title":"a"}"#)
        .await;
    assert_eq!(other_path.status, 422);
    let other_query = alice
        .post("/api/projects/p1/tasks?x=1", Some(&k), r#"{"title":"a"}"#)
        .await;
    assert_eq!(
        other_query.status, 422,
        "the query is part of the fingerprint"
    );
    let other_method = alice
        .send(
            "PUT",
            "/api/projects/p1/tasks",
            &[("Idempotency-Key", &k)],
            Some(br#"{"title":"a"}"#),
        )
        .await;
    assert_eq!(other_method.status, 422);
    assert_eq!(applied(srv.addr).await.len(), 1);
    srv.shutdown().await;
}

async fn scope_is_per_account(backend: Backend) {
    let Some(srv) = start_on(backend, fast_settings()).await else {
        return;
    };
    let alice = Client::login(srv.addr, "alice").await;
    let bob = Client::login(srv.addr, "bob").await;
    let k = key("scope");
    let a = alice
        .post("/api/notes", Some(&k), r#"{"text":"same"}"#)
        .await;
    let b = bob.post("/api/notes", Some(&k), r#"{"text":"same"}"#).await;
    assert_eq!((a.status, b.status), (201, 201));
    assert!(
        b.header("idempotent-replayed").is_none(),
        "bob never sees alice's answer"
    );
    assert_eq!(b.json()["owner"], "bob");
    // And a different body under bob's copy of the key is bob's business only.
    let b2 = bob.post("/api/notes", Some(&k), r#"{"text":"same"}"#).await;
    assert_eq!(b2.header("idempotent-replayed"), Some("true"));
    assert_eq!(b2.json()["owner"], "bob");
    assert_eq!(applied(srv.addr).await.len(), 2);
    srv.shutdown().await;
}

async fn client_errors_are_stored_and_replayed(backend: Backend) {
    let Some(srv) = start_on(backend, fast_settings()).await else {
        return;
    };
    let alice = Client::login(srv.addr, "alice").await;
    let k = key("fourxx");
    let r1 = alice
        .post("/api/projects/p1/tasks", Some(&k), r#"{"title":""}"#)
        .await;
    assert_eq!(r1.status, 400);
    let r2 = alice
        .post("/api/projects/p1/tasks", Some(&k), r#"{"title":""}"#)
        .await;
    assert_eq!(r2.status, 400);
    assert_eq!(r2.header("idempotent-replayed"), Some("true"));
    assert_eq!(r2.body, r1.body);

    // A 404 is stored too: creating the task later does not make the old key apply.
    let k404 = key("fourohfour");
    let p1 = alice
        .send(
            "PATCH",
            "/api/projects/p1/tasks/1",
            &[("Idempotency-Key", &k404)],
            Some(br#"{"done":true}"#),
        )
        .await;
    assert_eq!(p1.status, 404);
    alice
        .post(
            "/api/projects/p1/tasks",
            None,
            r#"{"title":"now task 1 exists"}"#,
        )
        .await;
    let p2 = alice
        .send(
            "PATCH",
            "/api/projects/p1/tasks/1",
            &[("Idempotency-Key", &k404)],
            Some(br#"{"done":true}"#),
        )
        .await;
    assert_eq!(p2.status, 404);
    assert_eq!(p2.header("idempotent-replayed"), Some("true"));
    let log = applied(srv.addr).await;
    assert_eq!(log.len(), 1, "only the keyless create: {log:?}");
    srv.shutdown().await;
}

async fn duplicate_waits_for_a_running_first_attempt(backend: Backend) {
    let Some(srv) = start_on(backend, fast_settings()).await else {
        return;
    };
    let alice = Client::login(srv.addr, "alice").await;
    faults(
        srv.addr,
        r#"[{"path":"/api/notes","kind":"delay","delayMs":150,"times":1}]"#,
    )
    .await;
    let k = key("waitok");
    let first = {
        let (alice, k) = (alice.clone(), k.clone());
        tokio::spawn(async move { alice.post("/api/notes", Some(&k), r#"{"text":"w"}"#).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let dup = alice.post("/api/notes", Some(&k), r#"{"text":"w"}"#).await;
    assert_eq!(dup.status, 201, "{:?}", String::from_utf8_lossy(&dup.body));
    assert_eq!(dup.header("idempotent-replayed"), Some("true"));
    let first = first.await.expect("join");
    assert_eq!(first.status, 201);
    assert!(first.header("idempotent-replayed").is_none());
    assert_eq!(dup.body, first.body);
    assert_eq!(applied(srv.addr).await.len(), 1);
    srv.shutdown().await;
}

async fn in_progress_after_the_wait_bound(backend: Backend) {
    let Some(srv) = start_on(backend, fast_settings()).await else {
        return;
    };
    let alice = Client::login(srv.addr, "alice").await;
    // Longer than stale_after (600 ms): only the heartbeat keeps the claim alive.
    faults(
        srv.addr,
        r#"[{"path":"/api/notes","kind":"delay","delayMs":1500,"times":1}]"#,
    )
    .await;
    let k = key("inprog");
    let first = {
        let (alice, k) = (alice.clone(), k.clone());
        tokio::spawn(async move {
            alice
                .post("/api/notes", Some(&k), r#"{"text":"slow"}"#)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let dup = alice
        .post("/api/notes", Some(&k), r#"{"text":"slow"}"#)
        .await;
    let waited = started.elapsed();
    assert_eq!(
        (dup.status, dup.detail().as_str()),
        (409, "idempotency_in_progress")
    );
    assert!(
        waited >= Duration::from_millis(280),
        "waited only {waited:?}"
    );

    // Past the stale bound, still alive thanks to the heartbeat: in progress, not unknown.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let dup = alice
        .post("/api/notes", Some(&k), r#"{"text":"slow"}"#)
        .await;
    assert_eq!(dup.detail(), "idempotency_in_progress");

    let first = first.await.expect("join");
    assert_eq!(first.status, 201);
    let after = alice
        .post("/api/notes", Some(&k), r#"{"text":"slow"}"#)
        .await;
    assert_eq!(after.header("idempotent-replayed"), Some("true"));
    assert_eq!(applied(srv.addr).await.len(), 1);
    srv.shutdown().await;
}

/// A client that hangs up mid-run (a phone losing signal): the claim is committed and the
/// route started, and it runs to its end all the same, and the client's retry gets its stored answer; the
/// write is applied once and never "outcome unknown".
async fn a_request_whose_client_hangs_up_is_applied_once_and_replayed(backend: Backend) {
    let Some(srv) = start_on(backend, fast_settings()).await else {
        return;
    };
    let alice = Client::login(srv.addr, "alice").await;
    faults(
        srv.addr,
        r#"[{"path":"/api/notes","kind":"delay","delayMs":1200,"times":1}]"#,
    )
    .await;
    let k = key("crash");
    let body = r#"{"text":"lost"}"#;

    // Send the request by hand, then hang up mid-run.
    let mut stream = tokio::net::TcpStream::connect(srv.addr)
        .await
        .expect("connect");
    let req = format!(
        "POST /api/notes HTTP/1.1\r\nHost: x\r\nCookie: {}\r\nX-CSRF-Token: {}\r\nIdempotency-Key: {k}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        alice.cookie.clone().unwrap_or_default(),
        alice.csrf.clone().unwrap_or_default(),
        body.len()
    );
    stream.write_all(req.as_bytes()).await.expect("write");
    // Once the key is claimed (the route starts right after, the 1.2 s delay inside it):
    // a client that leaves before that has its claim removed instead (claim_race.rs).
    for _ in 0..200 {
        if srv.app.ledger.entries().await.expect("count the ledger") > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    drop(stream);

    // Right after: the route still runs, so the key is in progress.
    let r = alice.post("/api/notes", Some(&k), body).await;
    assert_eq!(r.detail(), "idempotency_in_progress");
    // Once the route has finished (applied once): the retry gets its answer, replayed.
    let mut applied_now = Vec::new();
    for _ in 0..200 {
        applied_now = applied(srv.addr).await;
        if !applied_now.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        applied_now.len(),
        1,
        "the route ran to its end: {applied_now:?}"
    );
    let mut r = alice.post("/api/notes", Some(&k), body).await;
    for _ in 0..50 {
        if r.status != 409 {
            break;
        }
        // (Applied a moment before its answer is stored.)
        tokio::time::sleep(Duration::from_millis(50)).await;
        r = alice.post("/api/notes", Some(&k), body).await;
    }
    assert_eq!(r.status, 201, "{}", r.detail());
    assert_eq!(r.header("idempotent-replayed"), Some("true"));
    assert_eq!(applied(srv.addr).await.len(), 1, "never run again");
    assert_eq!(
        alice.get("/api/notes").await.json()["notes"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    srv.shutdown().await;
}

async fn expired_entries_apply_again(backend: Backend) {
    let t = fast()
        .key_ttl(Duration::from_millis(700))
        .prune_every(Duration::from_millis(50))
        .build()
        .expect("valid");
    let Some(srv) = start_on(backend, t).await else {
        return;
    };
    let alice = Client::login(srv.addr, "alice").await;
    let k = key("expiry");
    assert_eq!(
        alice
            .post("/api/notes", Some(&k), r#"{"text":"e"}"#)
            .await
            .status,
        201
    );
    let r = alice.post("/api/notes", Some(&k), r#"{"text":"e"}"#).await;
    assert_eq!(r.header("idempotent-replayed"), Some("true"));
    tokio::time::sleep(Duration::from_millis(800)).await;
    let r = alice.post("/api/notes", Some(&k), r#"{"text":"e"}"#).await;
    assert_eq!(r.status, 201);
    assert!(r.header("idempotent-replayed").is_none());
    assert_eq!(applied(srv.addr).await.len(), 2);
    // Expired entries are pruned as keyed writes come in: after another wait, one more
    // write leaves only itself in the ledger.
    tokio::time::sleep(Duration::from_millis(800)).await;
    alice
        .post("/api/notes", Some(&key("after")), r#"{"text":"f"}"#)
        .await;
    let mut left = u64::MAX;
    for _ in 0..100 {
        left = srv.app.ledger.entries().await.expect("entries");
        if left == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(left, 1);
    srv.shutdown().await;
}

async fn expired_but_unpruned_entry_is_replaced(backend: Backend) {
    // (The window must outlast the stale bound: the settings refuse otherwise.)
    let t = fast()
        .stale_after(Duration::from_millis(250))
        .key_ttl(Duration::from_millis(300))
        .prune_every(Duration::from_secs(3600))
        .build()
        .expect("valid");
    // Never pruned: only `begin` sees the expiry.
    let Some(srv) = start_on(backend, t).await else {
        return;
    };
    let alice = Client::login(srv.addr, "alice").await;
    let k = key("unpruned");
    assert_eq!(
        alice
            .post("/api/notes", Some(&k), r#"{"text":"1"}"#)
            .await
            .status,
        201
    );
    assert_eq!(
        alice
            .post("/api/notes", Some(&k), r#"{"text":"2"}"#)
            .await
            .status,
        422
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        alice
            .post("/api/notes", Some(&k), r#"{"text":"2"}"#)
            .await
            .status,
        201
    );
    srv.shutdown().await;
}

/// `--ledger` with a URL that asks for verified TLS (`sslmode=verify-full`, the test
/// server's authority as `sslrootcert`), in a table of its own (`--ledger-table`): writes
/// are claimed and replayed, and every connection the server keeps to the database is
/// encrypted.
#[tokio::test]
async fn postgres_ledger_over_verified_tls_in_a_table_of_its_own() {
    let Some(pg) = pg::server() else {
        return;
    };
    let db = pg.fresh_database_name().await;
    let mut config = test_config(fast_settings(), sw_outbox_server::Mode::Test);
    config.ledger = Some(pg.tls_url(&db));
    config.ledger_table = sw_outbox_idempotency::TableName::new("app_ledger").expect("name");
    let srv = start_config(config).await;
    let alice = Client::login(srv.addr, "alice").await;
    let k = key("tls");
    let first = alice.post("/api/notes", Some(&k), r#"{"text":"t"}"#).await;
    assert_eq!(first.status, 201);
    let again = alice.post("/api/notes", Some(&k), r#"{"text":"t"}"#).await;
    assert_eq!(again.header("idempotent-replayed"), Some("true"));
    assert_eq!(again.body, first.body);

    let (client, conn) = tokio_postgres::connect(&pg.url(&db), tokio_postgres::NoTls)
        .await
        .expect("connect");
    let task = tokio::spawn(conn);
    let rows = client
        .query(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
             WHERE a.datname = $1 AND a.pid <> pg_backend_pid()",
            &[&db],
        )
        .await
        .expect("pg_stat_ssl");
    let ssl: Vec<bool> = rows.iter().map(|r| r.get(0)).collect();
    assert!(!ssl.is_empty() && ssl.iter().all(|&s| s), "{ssl:?}");
    let n: i64 = client
        .query_one("SELECT count(*) FROM app_ledger", &[])
        .await
        .expect("the server's table")
        .get(0);
    assert_eq!(n, 1);
    drop(client);
    let _ = task.await;
    srv.shutdown().await;
}
