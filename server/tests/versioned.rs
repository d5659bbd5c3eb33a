//! Versioned tasks for lost-update tests: `version`, `ETag`, `If-Match` → 412.

mod common;

use common::*;

fn etag(r: &Resp) -> Option<&str> {
    r.header("etag")
}

#[tokio::test]
async fn versions_etags_and_preconditions() {
    let srv = start(fast_settings()).await;
    let alice = Client::login(srv.addr, "alice").await;
    let created = alice
        .post("/api/projects/p1/tasks", None, r#"{"title":"v"}"#)
        .await;
    assert_eq!((created.status, etag(&created)), (201, Some("\"1\"")));
    assert_eq!(created.json()["version"], 1);
    let id = created.json()["id"].as_i64().expect("id");
    let path = format!("/api/projects/p1/tasks/{id}");

    let got = alice.get(&path).await;
    assert_eq!((got.status, etag(&got)), (200, Some("\"1\"")));
    assert_eq!(got.json()["title"], "v");
    assert_eq!(
        alice.get("/api/projects/p2/tasks/1").await.status,
        404,
        "another project"
    );
    let bob = Client::login(srv.addr, "bob").await;
    assert_eq!(bob.get(&path).await.status, 404, "another account");

    let patch = |cond: Option<&'static str>, body: &'static str| {
        let alice = alice.clone();
        let path = path.clone();
        async move {
            let h: Vec<(&str, &str)> = cond.map(|c| ("If-Match", c)).into_iter().collect();
            alice.send("PATCH", &path, &h, Some(body.as_bytes())).await
        }
    };
    let r = patch(None, r#"{"done":true}"#).await;
    assert_eq!((r.status, etag(&r)), (200, Some("\"2\"")));
    assert_eq!(r.json()["version"], 2);

    // A stale version: 412, nothing changed, nothing applied.
    let before = applied(srv.addr).await.len();
    let r = patch(Some("\"1\""), r#"{"title":"lost update"}"#).await;
    assert_eq!(
        (r.status, r.detail().as_str()),
        (412, "precondition_failed")
    );
    let now = alice.get(&path).await;
    assert_eq!(
        (now.json()["title"].as_str(), now.json()["version"].as_i64()),
        (Some("v"), Some(2))
    );
    assert_eq!(applied(srv.addr).await.len(), before);
    // Strong comparison: a weak tag never matches; `*` matches any existing task.
    assert_eq!(patch(Some("W/\"2\""), r#"{"title":"w"}"#).await.status, 412);
    let r = patch(Some("\"2\""), r#"{"title":"v3"}"#).await;
    assert_eq!((r.status, etag(&r)), (200, Some("\"3\"")));
    let r = patch(Some("*"), r#"{"title":"v4"}"#).await;
    assert_eq!((r.status, etag(&r)), (200, Some("\"4\"")));
    let r = patch(Some("\"1\", \"4\""), r#"{"title":"v5"}"#).await;
    assert_eq!((r.status, etag(&r)), (200, Some("\"5\"")));
    let list = alice.get("/api/projects/p1/tasks").await;
    assert_eq!(list.json()["tasks"][0]["version"], 5);
    // No task: 404 before any precondition.
    let r = alice
        .send(
            "PATCH",
            "/api/projects/p1/tasks/999",
            &[("If-Match", "*")],
            Some(br#"{"done":true}"#),
        )
        .await;
    assert_eq!(r.status, 404);
    srv.shutdown().await;
}

/// A 412 is an answer like any other: stored for its key and replayed; a successful
/// keyed PATCH replays with its `ETag`.
#[tokio::test]
async fn precondition_failures_are_stored_in_the_ledger() {
    let srv = start(fast_settings()).await;
    let alice = Client::login(srv.addr, "alice").await;
    let created = alice
        .post("/api/projects/p1/tasks", None, r#"{"title":"v"}"#)
        .await;
    let path = format!("/api/projects/p1/tasks/{}", created.json()["id"]);
    let stale = key("stale");
    let send = |k: String, cond: &'static str, body: &'static str| {
        let (alice, path) = (alice.clone(), path.clone());
        async move {
            alice
                .send(
                    "PATCH",
                    &path,
                    &[("If-Match", cond), ("Idempotency-Key", &k)],
                    Some(body.as_bytes()),
                )
                .await
        }
    };
    let r = send(stale.clone(), "\"7\"", r#"{"title":"x"}"#).await;
    assert_eq!(r.status, 412);
    let again = send(stale.clone(), "\"7\"", r#"{"title":"x"}"#).await;
    assert_eq!(
        (again.status, again.header("idempotent-replayed")),
        (412, Some("true"))
    );
    assert_eq!(again.detail(), "precondition_failed");

    let good = key("good");
    let r = send(good.clone(), "\"1\"", r#"{"title":"y"}"#).await;
    assert_eq!((r.status, etag(&r)), (200, Some("\"2\"")));
    let replay = send(good, "\"1\"", r#"{"title":"y"}"#).await;
    assert_eq!((replay.status, etag(&replay)), (200, Some("\"2\"")));
    assert_eq!(replay.header("idempotent-replayed"), Some("true"));
    assert_eq!(alice.get(&path).await.json()["version"], 2, "applied once");
    srv.shutdown().await;
}
