mod common;

use common::*;
use sw_outbox_server::Mode;

#[tokio::test]
async fn tasks_crud_per_account_and_project() {
    let srv = start(fast_settings()).await;
    let alice = Client::login(srv.addr, "alice").await;
    let bob = Client::login(srv.addr, "bob").await;

    let r = alice
        .post("/api/projects/p1/tasks", None, r#"{"title":"one"}"#)
        .await;
    assert_eq!(r.status, 201);
    let t = r.json();
    assert_eq!(t["projectId"], "p1");
    assert_eq!(t["title"], "one");
    assert_eq!(t["owner"], "alice");
    let id = t["id"].as_i64().expect("id");
    assert_eq!(
        r.header("location"),
        Some(format!("/api/projects/p1/tasks/{id}").as_str())
    );
    alice
        .post("/api/projects/p1/tasks", None, r#"{"title":"two"}"#)
        .await;
    alice
        .post(
            "/api/projects/p2/tasks",
            None,
            r#"{"title":"other project"}"#,
        )
        .await;
    bob.post("/api/projects/p1/tasks", None, r#"{"title":"bob's"}"#)
        .await;

    let list = alice.get("/api/projects/p1/tasks").await;
    assert_eq!(list.status, 200);
    let titles: Vec<_> = list.json()["tasks"]
        .as_array()
        .expect("tasks")
        .iter()
        .map(|t| t["title"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(titles, ["one", "two"]);

    let p = alice
        .send(
            "PATCH",
            &format!("/api/projects/p1/tasks/{id}"),
            &[],
            Some(br#"{"done":true}"#),
        )
        .await;
    assert_eq!(p.status, 200);
    assert_eq!(p.json()["done"], true);
    assert_eq!(p.json()["title"], "one");
    let p = bob
        .send(
            "PATCH",
            &format!("/api/projects/p1/tasks/{id}"),
            &[],
            Some(br#"{"done":true}"#),
        )
        .await;
    assert_eq!(p.status, 404, "bob cannot touch alice's task");
    let p = alice
        .send(
            "PATCH",
            &format!("/api/projects/p1/tasks/{id}"),
            &[],
            Some(br#"{"done":"yes"}"#),
        )
        .await;
    assert_eq!(p.status, 400);

    let d = alice
        .send("DELETE", &format!("/api/projects/p1/tasks/{id}"), &[], None)
        .await;
    assert_eq!(d.status, 204);
    let d = alice
        .send("DELETE", &format!("/api/projects/p1/tasks/{id}"), &[], None)
        .await;
    assert_eq!(d.status, 404);
    assert_eq!(
        alice.get("/api/projects/p1/tasks").await.json()["tasks"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );

    let bad = alice
        .post("/api/projects/p1/tasks", None, r#"{"title":5}"#)
        .await;
    assert_eq!(bad.status, 400);
    assert_eq!(
        Client::anonymous(srv.addr)
            .get("/api/projects/p1/tasks")
            .await
            .status,
        401
    );

    // applied: every data change in order, nothing for refused or 404 writes.
    let log = applied(srv.addr).await;
    let methods: Vec<_> = log
        .iter()
        .map(|e| e["method"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(methods, ["POST", "POST", "POST", "POST", "PATCH", "DELETE"]);
    assert_eq!(log[0]["user"], "alice");
    assert_eq!(log[0]["path"], "/api/projects/p1/tasks");
    assert_eq!(log[0]["body"], r#"{"title":"one"}"#);
    assert!(log[0]["key"].is_null());
    assert_eq!(log[3]["user"], "bob");
    let seqs: Vec<_> = log.iter().map(|e| e["seq"].as_i64().unwrap_or(0)).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]));
    srv.shutdown().await;
}

#[tokio::test]
async fn notes_are_account_level() {
    let srv = start(fast_settings()).await;
    let alice = Client::login(srv.addr, "alice").await;
    let bob = Client::login(srv.addr, "bob").await;
    let r = alice.post("/api/notes", None, r#"{"text":"hello"}"#).await;
    assert_eq!(r.status, 201);
    assert_eq!(r.json()["text"], "hello");
    assert_eq!(r.json()["owner"], "alice");
    assert!(r.json()["id"].is_i64());
    assert_eq!(
        alice.get("/api/notes").await.json()["notes"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    assert_eq!(
        bob.get("/api/notes").await.json()["notes"]
            .as_array()
            .map(Vec::len),
        Some(0)
    );
    assert_eq!(alice.get("/api/nothing-here").await.status, 404);
    srv.shutdown().await;
}

#[tokio::test]
async fn static_files() {
    let srv = start(fast_settings()).await;
    let c = Client::anonymous(srv.addr);
    let index = c.get("/").await;
    assert_eq!(index.status, 200);
    assert_eq!(index.header("cache-control"), Some("no-cache"));
    // Test mode: no keep-alive, so a dropped connection is never a reused one.
    assert_eq!(index.header("connection"), Some("close"));
    assert!(index
        .header("content-type")
        .unwrap_or("")
        .starts_with("text/html"));
    assert_eq!(c.get("/index.html").await.body, index.body);
    let sw = c.get("/sw.js").await;
    assert_eq!(sw.header("content-type"), Some("text/javascript"));
    assert_eq!(sw.header("service-worker-allowed"), Some("/"));
    assert_eq!(sw.header("cache-control"), Some("no-cache"));
    assert_eq!(sw.body, b"self.x = 1;");
    let module = c.get("/app.mjs").await;
    assert_eq!(module.header("content-type"), Some("text/javascript"));
    let wasm = c.get("/pkg/app.wasm").await;
    assert_eq!(wasm.header("content-type"), Some("application/wasm"));
    assert_eq!(wasm.header("cache-control"), Some("no-cache"));
    assert_eq!(wasm.body, b"\0asm\x01\0\0\0");
    let manifest = c.get("/manifest.webmanifest").await;
    assert_eq!(
        manifest.header("content-type"),
        Some("application/manifest+json")
    );
    let head = c.send("HEAD", "/sw.js", &[], None).await;
    assert_eq!((head.status, head.body.len()), (200, 0));
    assert_eq!(head.header("content-length"), Some("11"));
    assert_eq!(c.get("/missing.js").await.status, 404);
    assert_eq!(c.get("/../../etc/passwd").await.status, 404);
    assert_eq!(c.get("/%2e%2e/%2e%2e/etc/passwd").await.status, 404);
    assert_eq!(c.get("/pkg/..%2f..%2f..%2fetc%2fpasswd").await.status, 404);
    assert_ne!(
        c.send("POST", "/index.html", &[], Some(b"x")).await.status,
        200,
        "static files are read-only"
    );
    srv.shutdown().await;
}

/// A deploy that rewrites a file within the same second (same length, same mtime) is
/// still a change: validators come from the bytes, so the browser's revalidation of
/// `sw.js` gets the new file instead of a 304, and date conditions are ignored.
#[tokio::test]
async fn static_validators_follow_the_bytes_not_the_file_time() {
    let config = test_config(fast_settings(), Mode::Test);
    let www = config.www.clone();
    let srv = start_config(config).await;
    let c = Client::anonymous(srv.addr);

    let first = c.get("/sw.js").await;
    assert_eq!(first.status, 200);
    assert_eq!(first.header("last-modified"), None, "no date validator");
    let tag = first.header("etag").expect("an ETag").to_owned();
    assert!(
        tag.starts_with('"') && tag.ends_with('"') && tag.len() == 34,
        "{tag}"
    );

    let same = c
        .send("GET", "/sw.js", &[("If-None-Match", &tag)], None)
        .await;
    assert_eq!((same.status, same.body.len()), (304, 0));
    assert_eq!(same.header("etag"), Some(tag.as_str()));
    assert_eq!(same.header("cache-control"), Some("no-cache"));
    let listed = format!("\"other\", W/{tag}");
    let weak = c
        .send("GET", "/sw.js", &[("If-None-Match", &listed)], None)
        .await;
    assert_eq!(weak.status, 304, "a list, compared weakly");

    // The next deploy: same length, the file's time put back to the old one.
    let path = www.join("sw.js");
    let mtime = std::fs::metadata(&path)
        .and_then(|m| m.modified())
        .expect("mtime");
    std::fs::write(&path, "self.x = 2;").expect("write");
    std::fs::File::options()
        .write(true)
        .open(&path)
        .and_then(|f| f.set_modified(mtime))
        .expect("set mtime");
    let far_future = "Fri, 01 Jan 2100 00:00:00 GMT";
    let changed = c
        .send(
            "GET",
            "/sw.js",
            &[("If-None-Match", &tag), ("If-Modified-Since", far_future)],
            None,
        )
        .await;
    assert_eq!(changed.status, 200, "a changed file is never 304");
    assert_eq!(changed.body, b"self.x = 2;");
    assert_ne!(changed.header("etag"), Some(tag.as_str()));
    assert_eq!(changed.header("content-type"), Some("text/javascript"));

    // Ranges still work; under an If-Range the whole file is sent.
    let part = c
        .send("GET", "/sw.js", &[("Range", "bytes=0-3")], None)
        .await;
    assert_eq!((part.status, part.body.as_slice()), (206, &b"self"[..]));
    let whole = c
        .send(
            "GET",
            "/sw.js",
            &[("Range", "bytes=0-3"), ("If-Range", &tag)],
            None,
        )
        .await;
    assert_eq!(
        (whole.status, whole.body.as_slice()),
        (200, &b"self.x = 2;"[..])
    );
    let head = c.send("HEAD", "/sw.js", &[], None).await;
    assert_eq!((head.status, head.header("last-modified")), (200, None));

    // Past the hashing bound a file has no validator: sent whole, every time.
    std::fs::write(www.join("big.bin"), vec![7u8; (16 << 20) + 1]).expect("write");
    let big = c.get("/big.bin").await;
    assert_eq!((big.status, big.body.len()), (200, (16 << 20) + 1));
    assert_eq!(
        (big.header("etag"), big.header("last-modified")),
        (None, None)
    );
    srv.shutdown().await;
}

#[tokio::test]
async fn control_routes_absent_in_prod_and_only_for_the_own_origin() {
    let prod = start_with(fast_settings(), Mode::Prod).await;
    let r = Client::anonymous(prod.addr)
        .send("POST", "/__control/network", &[], Some(br#"{"down":true}"#))
        .await;
    assert_ne!(r.status, 200);
    let r = Client::anonymous(prod.addr).get("/__control/applied").await;
    assert_eq!(r.status, 404);
    prod.shutdown().await;

    let srv = start(fast_settings()).await;
    let c = Client::anonymous(srv.addr);
    let own = format!("http://{}", srv.addr);
    // Node (no Origin) and the demo's own page (same origin) drive it.
    let r = c.get("/__control/applied").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), None);
    assert_eq!(r.header("cache-control"), Some("no-store"));
    let r = c
        .send(
            "POST",
            "/__control/faults",
            &[("Origin", &own), ("Sec-Fetch-Site", "same-origin")],
            Some(br#"{"rules":[]}"#),
        )
        .await;
    assert_eq!(r.status, 200);
    // Any other site is refused, reads included, and no preflight is granted.
    for headers in [
        &[("Origin", "http://other.example")][..],
        &[("Sec-Fetch-Site", "cross-site")],
        &[("Origin", "null")],
    ] {
        let r = c
            .send("POST", "/__control/reset", headers, Some(b"{}"))
            .await;
        assert_eq!(
            (r.status, r.detail().as_str()),
            (403, "origin_refused"),
            "{headers:?}"
        );
        assert_eq!(r.header("access-control-allow-origin"), None);
        let r = c.send("GET", "/__control/requests", headers, None).await;
        assert_eq!(r.status, 403);
    }
    let pre = c
        .send(
            "OPTIONS",
            "/__control/faults",
            &[
                ("Origin", "http://other.example"),
                ("Access-Control-Request-Method", "POST"),
                ("Access-Control-Request-Private-Network", "true"),
            ],
            None,
        )
        .await;
    assert_ne!(pre.status / 100, 2, "no preflight grant");
    assert_eq!(pre.header("access-control-allow-origin"), None);
    assert_eq!(pre.header("access-control-allow-private-network"), None);
    // DNS rebinding: a page of rebound.example (resolving to 127.0.0.1) is "same origin"
    // with itself, but its Host is not this server's.
    let r = c
        .send(
            "POST",
            "/__control/network",
            &[
                ("Host", "rebound.example"),
                ("Origin", "http://rebound.example"),
            ],
            Some(br#"{"down":true}"#),
        )
        .await;
    assert_eq!(r.status, 403);
    assert_eq!(
        control(srv.addr, "GET", "/__control/network", None).await["down"],
        false
    );
    assert_eq!(c.get("/__control/nothing").await.status, 404);
    srv.shutdown().await;
}

#[tokio::test]
async fn requests_log_and_reset() {
    let srv = start(fast_settings()).await;
    let alice = Client::login(srv.addr, "alice").await;
    let k = key("reqlog");
    alice
        .send(
            "POST",
            "/api/notes",
            &[("Idempotency-Key", &k), ("X-PM-Expected-Account", "alice")],
            Some(br#"{"text":"a"}"#),
        )
        .await;
    control(
        srv.addr,
        "POST",
        "/__control/network",
        Some(r#"{"down":true}"#),
    )
    .await;
    assert!(alice
        .try_send("GET", "/api/notes", &[], None)
        .await
        .expect("io")
        .is_none());
    control(
        srv.addr,
        "POST",
        "/__control/network",
        Some(r#"{"down":false}"#),
    )
    .await;

    let log = control(srv.addr, "GET", "/__control/requests", None).await;
    let reqs = log["requests"].as_array().expect("requests");
    assert_eq!(reqs.len(), 3, "{reqs:?}");
    assert_eq!(reqs[0]["path"], "/api/auth/login");
    assert!(reqs[0]["user"].is_null());
    assert_eq!(reqs[1]["method"], "POST");
    assert_eq!(reqs[1]["key"], k.as_str());
    assert_eq!(reqs[1]["expectedAccount"], "alice");
    assert_eq!(
        reqs[1]["csrf"],
        alice.csrf.clone().unwrap_or_default().as_str()
    );
    assert_eq!(reqs[1]["user"], "alice");
    assert_eq!(reqs[1]["status"], 201);
    assert!(
        reqs[2]["status"].is_null(),
        "dropped connection has no status"
    );
    assert!(reqs[0]["seq"].as_u64() < reqs[1]["seq"].as_u64());

    faults(srv.addr, r#"[{"path":"/api/**","kind":"refuse"}]"#).await;
    control(
        srv.addr,
        "POST",
        "/__control/network",
        Some(r#"{"down":true}"#),
    )
    .await;
    control(srv.addr, "POST", "/__control/reset", Some("{}")).await;
    // After reset: network up, no faults, no data, no sessions, empty logs, no ledger.
    assert_eq!(alice.get("/api/auth/me").await.status, 401);
    assert!(applied(srv.addr).await.is_empty());
    let alice = Client::login(srv.addr, "alice").await;
    let r = alice.post("/api/notes", Some(&k), r#"{"text":"a"}"#).await;
    assert_eq!(r.status, 201);
    assert!(r.header("idempotent-replayed").is_none(), "ledger cleared");
    assert_eq!(r.json()["id"], 1, "ids restart after reset");
    let log = control(srv.addr, "GET", "/__control/requests", None).await;
    assert_eq!(
        log["requests"].as_array().map(Vec::len),
        Some(3),
        "me, login, post since the reset"
    );
    srv.shutdown().await;
}
