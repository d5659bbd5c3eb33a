//! The browser shell inside a real service worker, with real IndexedDB
//! (`wasm-pack test --headless --chrome`).
#![cfg(target_arch = "wasm32")]

use js_sys::{Object, Reflect, Uint8Array};
use serde_json::Value;
use std::rc::Rc;
use sw_outbox::core::key::IdempotencyKey;
use sw_outbox::core::record::{NewRecord, RecordId, RecordState};
use sw_outbox::core::route::Patterns;
use sw_outbox::store::{idb, EnqueueFailure, Pending, QueueItem, Store};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::*;
use web_sys::{
    Headers, IdbDatabase, IdbFactory, IdbObjectStoreParameters, Request, RequestInit, Response,
};

wasm_bindgen_test_configure!(run_in_service_worker);

/// The default patterns, as the worker compiles them.
struct Defaults;
impl Patterns for Defaults {
    fn is_auth_route(&self, p: &str) -> bool {
        let l = p.to_ascii_lowercase();
        l == "/api/auth" || l.starts_with("/api/auth/") || l.starts_with("/api/auth?")
    }
    fn workspace(&self, p: &str) -> Option<String> {
        let rest = p.strip_prefix("/projects/")?;
        let seg: String = rest
            .chars()
            .take_while(|c| !matches!(c, '/' | '?' | '#'))
            .collect();
        (!seg.is_empty()).then_some(seg)
    }
}

fn unique(name: &str) -> String {
    format!("{name}-{}", js_sys::Math::random().to_bits())
}

fn key() -> IdempotencyKey {
    IdempotencyKey::mint().expect("random source")
}

fn pending(path: &str, owner: Option<&str>, body: &[u8]) -> Pending {
    Pending {
        record: NewRecord::new(
            "POST",
            path.into(),
            Some("application/json".into()),
            js_sys::Date::now() as u64,
            owner.map(Into::into),
            Defaults.workspace(path),
            key(),
        ),
        body: (!body.is_empty()).then(|| Uint8Array::from(body)),
    }
}

async fn open(name: &str) -> Store {
    Store::open(name, Rc::new(Defaults)).await.expect("opens")
}

fn records(items: Vec<QueueItem>) -> Vec<sw_outbox::core::record::RecordMeta> {
    items
        .into_iter()
        .map(|i| match i {
            QueueItem::Record(m) => m,
            QueueItem::Corrupt(id, why) => panic!("record {id} unexpectedly corrupt: {why}"),
        })
        .collect()
}

/// A JSON value as the page (or `sw.js`) would pass it.
fn js(v: &Value) -> JsValue {
    v.serialize(&serde_wasm_bindgen::Serializer::json_compatible())
        .expect("js")
}

/// The reason `start` refuses a configuration.
async fn start_refusal(cfg: Value) -> String {
    match sw_outbox::worker::start(js(&cfg)).await {
        Ok(_) => panic!("must refuse {cfg}"),
        Err(e) => e.as_string().unwrap_or_default(),
    }
}

fn factory() -> IdbFactory {
    Reflect::get(&js_sys::global(), &"indexedDB".into())
        .expect("indexedDB")
        .unchecked_into()
}

#[wasm_bindgen_test]
async fn a_batch_is_stored_whole_in_id_order_with_exact_bytes() {
    let store = open(&unique("batch")).await;
    let body = br#"{"title":"caf\xc3\xa9"}"#;
    let ids = store
        .enqueue(
            vec![
                pending("/projects/p1/tasks", Some("alice"), body),
                pending("/notes", Some("alice"), b""),
                pending("/projects/p2/tasks?x=1", None, b"x"),
            ],
            100,
        )
        .await;
    let ids: Vec<RecordId> = ids.into_iter().map(|r| r.expect("stored")).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids ascend: {ids:?}");
    let got = records(store.read_queue().await.expect("reads"));
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].owner.as_deref(), Some("alice"));
    assert_eq!(got[0].workspace.as_deref(), Some("p1"));
    assert_eq!(got[0].body_len, body.len());
    assert_eq!(got[1].workspace, None);
    assert_eq!(got[2].owner, None);
    assert_eq!(got[2].path, "/projects/p2/tasks?x=1");
    let (_, value) = store
        .begin_send(ids[0])
        .await
        .expect("reads")
        .expect("exists");
    let bytes = Uint8Array::new(&sw_outbox::store::body_bytes(&value).expect("body")).to_vec();
    assert_eq!(bytes, body.to_vec(), "exact body bytes");
    let again = records(store.read_queue().await.expect("reads"));
    assert_eq!(
        again[0].attempts, 1,
        "begin_send marks the record in flight"
    );
}

#[wasm_bindgen_test]
async fn the_queue_refuses_writes_beyond_max_records_and_keeps_the_earlier_ones() {
    let store = open(&unique("full")).await;
    let first = store
        .enqueue(
            vec![pending("/notes", None, b"1"), pending("/notes", None, b"2")],
            3,
        )
        .await;
    assert!(first.iter().all(Result::is_ok));
    let second = store
        .enqueue(
            vec![pending("/notes", None, b"3"), pending("/notes", None, b"4")],
            3,
        )
        .await;
    assert!(second[0].is_ok());
    assert_eq!(second[1], Err(EnqueueFailure::Full));
    let third = store.enqueue(vec![pending("/notes", None, b"5")], 3).await;
    assert_eq!(third, vec![Err(EnqueueFailure::Full)]);
    assert_eq!(store.count().await.expect("counts"), 3);
}

/// Creates a version-1 database: only `mutations`, plain records with a JSON-string
/// body and no owner, workspace or key.
async fn make_v1(name: &str, values: &[Value]) {
    let open = factory().open_with_u32(name, 1).expect("open v1");
    let values: Vec<JsValue> = values.iter().map(js).collect();
    let req = open.clone();
    let on_upgrade = Closure::<dyn FnMut()>::new(move || {
        let db: IdbDatabase = req.result().expect("db").unchecked_into();
        let params = IdbObjectStoreParameters::new();
        params.set_key_path(&"id".into());
        params.set_auto_increment(true);
        let store = db
            .create_object_store_with_optional_parameters("mutations", &params)
            .expect("store");
        for v in &values {
            store.add(v).expect("add");
        }
    });
    open.set_onupgradeneeded(Some(on_upgrade.as_ref().unchecked_ref()));
    let db: IdbDatabase = idb::request(open.clone().into())
        .await
        .expect("opened")
        .unchecked_into();
    db.close();
}

use serde::Serialize;

#[wasm_bindgen_test]
async fn a_version_1_database_is_upgraded_in_place_keeping_every_record() {
    let name = unique("v1");
    let v1: Vec<Value> = (0..5)
        .map(|i| {
            serde_json::json!({
                "method": "POST",
                "path": if i % 2 == 0 { format!("/projects/w{i}/tasks") } else { "/notes".into() },
                "body": format!("{{\"n\":{i}}}"),
                "contentType": "application/json",
                "timestamp": 1_700_000_000_000u64 + i,
            })
        })
        .collect();
    make_v1(&name, &v1).await;
    let store = open(&name).await;
    let got = records(store.read_queue().await.expect("reads"));
    assert_eq!(got.len(), 5, "no record lost");
    for (i, m) in got.iter().enumerate() {
        assert_eq!(m.owner, None, "old records become unknown-owner");
        assert_eq!(m.key, None);
        assert_eq!(m.state, RecordState::Queued);
        let want_ws = (i % 2 == 0).then(|| format!("w{i}"));
        assert_eq!(m.workspace, want_ws, "workspace derived from the path");
        assert_eq!(m.body_len, format!("{{\"n\":{i}}}").len());
    }
    // The body is now bytes in storage, not a string.
    let (_, value) = store
        .begin_send(got[0].id)
        .await
        .expect("reads")
        .expect("exists");
    let body = Reflect::get(&value, &"body".into()).expect("body");
    assert!(
        body.is_instance_of::<Uint8Array>(),
        "body upgraded to bytes"
    );
    assert_eq!(Uint8Array::new(&body).to_vec(), br#"{"n":0}"#.to_vec());
    // And the session store exists.
    store
        .set_session_user(Some("alice"))
        .await
        .expect("session store");
}

#[wasm_bindgen_test]
async fn a_corrupt_record_is_reported_and_blocks_nothing_else() {
    let name = unique("corrupt");
    let store = open(&name).await;
    store
        .enqueue(vec![pending("/projects/a/tasks", Some("alice"), b"ok")], 10)
        .await[0]
        .clone()
        .expect("stored");
    // Write a value with the wrong field types straight into the store.
    let raw = Store::open(&name, Rc::new(Defaults))
        .await
        .expect("second connection");
    let bad = Object::new();
    Reflect::set(&bad, &"method".into(), &5.into()).expect("set");
    Reflect::set(&bad, &"path".into(), &JsValue::from(js_sys::Array::new())).expect("set");
    raw.put_raw_for_tests(&bad).await.expect("put");
    store
        .enqueue(
            vec![pending("/projects/a/tasks", Some("alice"), b"ok2")],
            10,
        )
        .await[0]
        .clone()
        .expect("stored");
    let items = store.read_queue().await.expect("reads without throwing");
    assert_eq!(items.len(), 3);
    assert!(matches!(items[0], QueueItem::Record(_)));
    assert!(
        matches!(&items[1], QueueItem::Corrupt(_, why) if why.contains("method") || why.contains("string"))
    );
    assert!(matches!(items[2], QueueItem::Record(_)));
}

#[wasm_bindgen_test]
async fn the_session_survives_reopening() {
    let name = unique("session");
    let a = open(&name).await;
    assert_eq!(a.session_user().await.expect("reads"), None);
    a.set_session_user(Some("alice")).await.expect("writes");
    a.close();
    let b = open(&name).await;
    assert_eq!(
        b.session_user().await.expect("reads").as_deref(),
        Some("alice")
    );
    b.set_session_user(None).await.expect("writes");
    assert_eq!(b.session_user().await.expect("reads"), None);
}

// ---- interception, through the exported Outbox -------------------------------------

async fn outbox(db: &str, timeout_ms: u32) -> sw_outbox::worker::Outbox {
    let cfg = serde_json::json!({"dbName": db, "attemptTimeoutMs": timeout_ms});
    sw_outbox::worker::start(js(&cfg))
        .await
        .unwrap_or_else(|e| panic!("start: {e:?}"))
}

fn request(method: &str, path: &str, headers: &[(&str, &str)], body: Option<&[u8]>) -> Request {
    let h = Headers::new().expect("headers");
    for (k, v) in headers {
        h.set(k, v).expect("header");
    }
    let init = RequestInit::new();
    init.set_method(method);
    init.set_headers(&h);
    if let Some(b) = body {
        init.set_body(&Uint8Array::from(b));
    }
    let origin = web_sys::js_sys::global()
        .unchecked_into::<web_sys::ServiceWorkerGlobalScope>()
        .location()
        .origin();
    Request::new_with_str_and_init(&format!("{origin}{path}"), &init).expect("request")
}

async fn answer(o: &sw_outbox::worker::Outbox, r: Request) -> (u16, Value) {
    let resp: Response = JsFuture::from(o.handle_fetch(r, None))
        .await
        .expect("answers")
        .unchecked_into();
    let status = resp.status();
    let text = JsFuture::from(resp.text().expect("text"))
        .await
        .expect("body")
        .as_string()
        .unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// A body large enough that no loopback server answers it within 1 ms: the attempt is
/// aborted by its timeout, which is the "no answer within attemptTimeoutMs" path.
fn big_body() -> Vec<u8> {
    let mut b = b"{\"title\":\"".to_vec();
    b.extend(std::iter::repeat_n(b'x', 900 * 1024));
    b.extend(b"\"}");
    b
}

#[wasm_bindgen_test]
async fn a_write_without_an_answer_is_queued_and_the_202_names_its_record() {
    let db = unique("intercept");
    let o = outbox(&db, 1).await;
    let body = big_body();
    let (status, json) = answer(
        &o,
        request(
            "POST",
            "/api/projects/p9/tasks",
            &[
                ("Content-Type", "application/json"),
                ("X-PM-Expected-Account", "alice"),
            ],
            Some(&body),
        ),
    )
    .await;
    assert_eq!(status, 202, "{json}");
    assert_eq!(json["queued"], true);
    let key = json["idempotencyKey"].as_str().expect("key").to_owned();
    assert!(IdempotencyKey::parse(&key).is_ok());
    let id = json["id"].as_u64().expect("id");
    let store = open(&db).await;
    let got = records(store.read_queue().await.expect("reads"));
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, RecordId(id));
    assert_eq!(got[0].key.as_ref().map(|k| k.as_str()), Some(key.as_str()));
    assert_eq!(got[0].owner.as_deref(), Some("alice"));
    assert_eq!(got[0].workspace.as_deref(), Some("p9"));
    assert_eq!(got[0].path, "/projects/p9/tasks");
    assert_eq!(got[0].content_type.as_deref(), Some("application/json"));
    assert_eq!(got[0].body_len, body.len());
}

#[wasm_bindgen_test]
async fn a_page_key_is_kept_and_a_malformed_one_refused() {
    let db = unique("keys");
    let o = outbox(&db, 1).await;
    let page_key = "page-key-0123456789abcdefgh";
    let (status, json) = answer(
        &o,
        request(
            "PUT",
            "/api/notes/1",
            &[("Idempotency-Key", page_key)],
            Some(&big_body()),
        ),
    )
    .await;
    assert_eq!(status, 202, "{json}");
    assert_eq!(json["idempotencyKey"], page_key);
    let (status, json) = answer(
        &o,
        request(
            "POST",
            "/api/notes",
            &[("Idempotency-Key", "short")],
            Some(b"{}"),
        ),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(json["queued"], false);
    let store = open(&db).await;
    assert_eq!(
        store.count().await.expect("counts"),
        1,
        "the refused write is not stored"
    );
}

#[wasm_bindgen_test]
async fn an_oversized_body_that_cannot_go_through_is_refused_413_and_not_stored() {
    let db = unique("big");
    let cfg = serde_json::json!({"dbName": db, "attemptTimeoutMs": 1, "maxBodyBytes": 1024});
    let o = sw_outbox::worker::start(js(&cfg)).await.expect("start");
    let (status, json) = answer(&o, request("POST", "/api/notes", &[], Some(&big_body()))).await;
    assert_eq!(status, 413, "{json}");
    assert_eq!(json["queued"], false);
    assert_eq!(open(&db).await.count().await.expect("counts"), 0);
}

#[wasm_bindgen_test]
async fn any_http_answer_passes_through_unchanged_and_nothing_is_queued() {
    let db = unique("through");
    let o = outbox(&db, 15_000).await;
    // The test server answers this path with an error status: passed back as is.
    let (status, _) = answer(
        &o,
        request("POST", "/api/projects/1/tasks", &[], Some(b"{}")),
    )
    .await;
    assert!(
        (400..600).contains(&status),
        "the server's own answer, got {status}"
    );
    assert_eq!(open(&db).await.count().await.expect("counts"), 0);
}

#[wasm_bindgen_test]
async fn auth_routes_and_reads_are_never_queued_and_requests_outside_are_not_ours() {
    let db = unique("auth");
    let o = outbox(&db, 1).await;
    let (status, _) = answer(
        &o,
        request("POST", "/api/auth/login", &[], Some(&big_body())),
    )
    .await;
    assert_ne!(status, 202, "auth routes are never queued");
    assert!(o.intercepts(&request("GET", "/api/projects/1/tasks", &[], None)));
    assert!(!o.intercepts(&request("POST", "/elsewhere", &[], Some(b"x"))));
    assert_eq!(open(&db).await.count().await.expect("counts"), 0);
}

#[wasm_bindgen_test]
async fn an_invalid_configuration_is_refused_naming_the_field() {
    let err = start_refusal(serde_json::json!({"replayConcurrency": 0})).await;
    assert!(err.contains("replayConcurrency"), "{err}");
    let err = start_refusal(serde_json::json!({"workspacePattern": "("})).await;
    assert!(err.contains("workspacePattern"), "{err}");
    // A misspelt field is not silently ignored.
    let err = start_refusal(serde_json::json!({"replayConcurency": 2})).await;
    assert!(err.contains("replayConcurency"), "{err}");
}

#[wasm_bindgen_test]
fn these_tests_run_inside_a_service_worker() {
    let global = js_sys::global();
    assert!(
        global.is_instance_of::<web_sys::ServiceWorkerGlobalScope>(),
        "the shell's tests must run in a ServiceWorkerGlobalScope"
    );
}

#[wasm_bindgen_test]
async fn an_adoption_is_one_transaction_a_concurrent_reader_sees_all_or_none() {
    use sw_outbox::store::Rewrite;
    let name = unique("adopt");
    let store = open(&name).await;
    let batch = (0..50)
        .map(|i| pending(&format!("/projects/w{}/tasks", i % 3), None, b"{}"))
        .collect();
    assert!(store.enqueue(batch, 100).await.iter().all(Result::is_ok));
    let reader = open(&name).await;
    let adopt = store.rewrite_where(None, |item| match item {
        QueueItem::Record(m) if m.owner.is_none() => {
            let mut m = m.clone();
            m.owner = Some("alice".into());
            Rewrite::Fields(m.mutable_fields())
        }
        _ => Rewrite::Keep,
    });
    // Started while the adoption runs: IndexedDB orders the two transactions, so the
    // reader sees the queue before or after the adoption, never half of it.
    let read = reader.read_queue();
    let (adopted, seen) = futures_join(adopt, read).await;
    assert_eq!(adopted.expect("adopts"), 50);
    let owners: Vec<Option<String>> = records(seen.expect("reads"))
        .into_iter()
        .map(|m| m.owner)
        .collect();
    assert_eq!(owners.len(), 50);
    assert!(
        owners.iter().all(|o| o.is_none()) || owners.iter().all(|o| o.as_deref() == Some("alice")),
        "a concurrent reader saw a partial adoption: {owners:?}"
    );
    let after = records(reader.read_queue().await.expect("reads"));
    assert!(after.iter().all(|m| m.owner.as_deref() == Some("alice")));
}

/// Polls two futures to completion together (no futures-util in the crate).
async fn futures_join<A: std::future::Future, B: std::future::Future>(
    a: A,
    b: B,
) -> (A::Output, B::Output) {
    let mut a = Box::pin(a);
    let mut b = Box::pin(b);
    let (mut ra, mut rb) = (None, None);
    std::future::poll_fn(|cx| {
        if ra.is_none() {
            if let std::task::Poll::Ready(v) = a.as_mut().poll(cx) {
                ra = Some(v);
            }
        }
        if rb.is_none() {
            if let std::task::Poll::Ready(v) = b.as_mut().poll(cx) {
                rb = Some(v);
            }
        }
        if ra.is_some() && rb.is_some() {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    (ra.expect("a done"), rb.expect("b done"))
}
