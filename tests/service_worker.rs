//! The browser shell inside a real service worker, with real IndexedDB
//! (`wasm-pack test --headless --chrome`).
#![cfg(target_arch = "wasm32")]

use js_sys::{Object, Reflect, Uint8Array};
use serde_json::Value;
use std::rc::Rc;
use sw_outbox::core::key::IdempotencyKey;
use sw_outbox::core::record::{AttentionReason, NewRecord, RecordId, RecordState, WriteParts};
use sw_outbox::core::route::Patterns;
use sw_outbox::store::{
    idb, EnqueueFailure, Generation, Pending, QueueItem, ReplayStep, StepDone, Store,
};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::*;
use web_sys::{
    Headers, IdbDatabase, IdbFactory, IdbObjectStoreParameters, Request, RequestInit, Response,
};

mod support;
use support::{command, get, js, unique};

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
    fn never_queue(&self, _: &str) -> bool {
        false
    }
}

fn key() -> IdempotencyKey {
    IdempotencyKey::mint().expect("random source")
}

fn pending(path: &str, owner: Option<&str>, body: &[u8]) -> Pending {
    Pending {
        record: NewRecord::new(
            "POST",
            path.into(),
            WriteParts {
                content_type: Some("application/json".into()),
                ..WriteParts::default()
            },
            body.len(),
            js_sys::Date::now() as u64,
            None,
            owner.map(Into::into),
            Defaults.workspace(path),
            key(),
        ),
        body: (!body.is_empty()).then(|| Uint8Array::from(body)),
        clears: 0,
    }
}

async fn open(name: &str) -> Store {
    Store::open(name, Rc::new(Defaults)).await.expect("opens")
}

/// Stores a batch as a worker with an up-to-date view would: expecting the database's
/// current generation.
async fn enqueue(
    store: &Store,
    batch: Vec<Pending>,
    max: u32,
) -> Vec<Result<RecordId, EnqueueFailure>> {
    let n = store.generation().await.expect("generation").n;
    let refs: Vec<&Pending> = batch.iter().collect();
    store.enqueue(&refs, max, &move || Some(n)).await.1
}

async fn queue(store: &Store) -> Vec<QueueItem> {
    let (items, foreign) = store.read_queue().await.expect("reads");
    assert_eq!(foreign, 0, "no value under a foreign key");
    items
}

async fn body_of(store: &Store, id: RecordId) -> Vec<u8> {
    store
        .body(id)
        .await
        .expect("reads")
        .map(|b| Uint8Array::new(&b).to_vec())
        .unwrap_or_default()
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

/// The reason `start` refuses a configuration.
async fn start_refusal(cfg: Value) -> String {
    match sw_outbox::worker::start(js(&cfg), JsValue::UNDEFINED).await {
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
    let ids = enqueue(
        &store,
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
    let got = records(queue(&store).await);
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].owner.as_deref(), Some("alice"));
    assert_eq!(got[0].workspace.as_deref(), Some("p1"));
    assert_eq!(got[0].body_len, body.len());
    assert_eq!(got[1].workspace, None);
    assert_eq!(got[2].owner, None);
    assert_eq!(got[2].path, "/projects/p2/tasks?x=1");
    assert_eq!(
        body_of(&store, ids[0]).await,
        body.to_vec(),
        "kept in its own store"
    );
    assert_eq!(
        body_of(&store, ids[1]).await,
        Vec::<u8>::new(),
        "no body stored"
    );
    let (meta, sent) = store
        .begin_send(ids[0], 4242, true)
        .await
        .expect("reads")
        .expect("exists");
    let bytes = Uint8Array::new(&sent.expect("body")).to_vec();
    assert_eq!(bytes, body.to_vec(), "exact body bytes");
    assert_eq!(meta.first_sent_at, Some(4242));
    let again = records(queue(&store).await);
    assert_eq!(
        again[0].attempts, 1,
        "begin_send marks the record in flight"
    );
    assert_eq!(again[0].first_sent_at, Some(4242), "the first send is kept");
    store.begin_send(ids[0], 9999, false).await.expect("reads");
    let again = records(queue(&store).await);
    assert_eq!(again[0].first_sent_at, Some(4242), "and never moved");
    assert_eq!(again[0].attempts, 2);
}

/// A flush's steps of one moment go in one transaction: marks, deletes and settles of
/// several lanes, each answered on its own, one generation change for the deletes.
#[wasm_bindgen_test]
async fn replay_steps_of_several_lanes_commit_together_and_answer_each() {
    let store = open(&unique("steps")).await;
    let ids: Vec<RecordId> = enqueue(
        &store,
        vec![
            pending("/projects/p1/tasks", Some("alice"), b"one"),
            pending("/projects/p2/tasks", Some("alice"), b"two"),
            pending("/projects/p3/tasks", Some("alice"), b"three"),
        ],
        10,
    )
    .await
    .into_iter()
    .map(|r| r.expect("stored"))
    .collect();
    let g0 = store.generation().await.expect("reads");
    let mut settled = records(queue(&store).await).remove(1);
    settled.state = RecordState::NeedsAttention(AttentionReason::Rejected);
    let (before, done) = store
        .replay_steps(vec![
            ReplayStep::Begin {
                id: ids[0],
                now_ms: 77,
                first_send: true,
            },
            ReplayStep::Update(ids[1], settled.mutable_fields()),
            ReplayStep::Delete(ids[2]),
            ReplayStep::Begin {
                id: RecordId(ids[2].0 + 100),
                now_ms: 77,
                first_send: true,
            },
            ReplayStep::Update(RecordId(ids[2].0 + 100), settled.mutable_fields()),
        ])
        .await
        .expect("one transaction commits");
    assert_eq!(
        before,
        Some(g0),
        "the deletes applied to the generation read"
    );
    assert_eq!(
        store.generation().await.expect("reads"),
        g0.next(false),
        "one change for the batch"
    );
    assert_eq!(done.len(), 5, "one answer per step, in order");
    match &done[0] {
        StepDone::Begun(Some((meta, Some(body)))) => {
            assert_eq!(meta.id, ids[0]);
            assert_eq!(meta.first_sent_at, Some(77));
            assert_eq!(Uint8Array::new(body).to_vec(), b"one".to_vec());
        }
        other => panic!("the first record is read with its body: {other:?}"),
    }
    assert!(matches!(done[1], StepDone::Updated(true)), "{:?}", done[1]);
    assert!(matches!(done[2], StepDone::Deleted), "{:?}", done[2]);
    assert!(
        matches!(done[3], StepDone::Begun(None)),
        "a record that is gone is not sent, and fails nothing else: {:?}",
        done[3]
    );
    assert!(matches!(done[4], StepDone::Updated(false)), "{:?}", done[4]);
    let left = records(queue(&store).await);
    assert_eq!(
        left.iter().map(|m| m.id).collect::<Vec<_>>(),
        ids[..2].to_vec()
    );
    assert_eq!(left[0].first_sent_at, Some(77), "the mark is stored");
    assert_eq!(left[0].attempts, 1);
    assert_eq!(
        left[1].state,
        RecordState::NeedsAttention(AttentionReason::Rejected),
        "the settle is stored"
    );
    assert_eq!(
        body_of(&store, ids[2]).await,
        Vec::<u8>::new(),
        "the body went with it"
    );
    assert_eq!(
        body_of(&store, ids[0]).await,
        b"one".to_vec(),
        "no body is rewritten"
    );
}

#[wasm_bindgen_test]
async fn the_queue_refuses_writes_beyond_max_records_and_keeps_the_earlier_ones() {
    let store = open(&unique("full")).await;
    let first = enqueue(
        &store,
        vec![pending("/notes", None, b"1"), pending("/notes", None, b"2")],
        3,
    )
    .await;
    assert!(first.iter().all(Result::is_ok));
    let second = enqueue(
        &store,
        vec![pending("/notes", None, b"3"), pending("/notes", None, b"4")],
        3,
    )
    .await;
    assert!(second[0].is_ok());
    assert_eq!(second[1], Err(EnqueueFailure::Full));
    let third = enqueue(&store, vec![pending("/notes", None, b"5")], 3).await;
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
    let got = records(queue(&store).await);
    assert_eq!(got.len(), 5, "no record lost");
    for (i, m) in got.iter().enumerate() {
        assert_eq!(m.owner, None, "old records become unknown-owner");
        assert_eq!(m.key, None);
        assert_eq!(m.state, RecordState::Queued);
        let want_ws = (i % 2 == 0).then(|| format!("w{i}"));
        assert_eq!(m.workspace, want_ws, "workspace derived from the path");
        assert_eq!(m.body_len, format!("{{\"n\":{i}}}").len());
        assert_eq!(m.first_sent_at, None, "a keyless record has no key window");
        assert_eq!(
            body_of(&store, m.id).await,
            format!("{{\"n\":{i}}}").into_bytes()
        );
    }
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
    enqueue(
        &store,
        vec![pending("/projects/a/tasks", Some("alice"), b"ok")],
        10,
    )
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
    enqueue(
        &store,
        vec![pending("/projects/a/tasks", Some("alice"), b"ok2")],
        10,
    )
    .await[0]
        .clone()
        .expect("stored");
    let items = queue(&store).await;
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

/// Issue 37, 3: `QUEUE_STATE` names the account of the session the worker holds, so a
/// page reloaded offline (which cannot ask `authMePath`) knows whose writes are pending:
/// a worker started on a database whose last `AUTH_SESSION` was alice's answers alice,
/// with alice's write listed in full; after a sign-out, null.
#[wasm_bindgen_test]
async fn list_queue_names_the_account_of_the_persisted_session() {
    let db = unique("listaccount");
    let store = open(&db).await;
    enqueue(&store, vec![pending("/notes", Some("alice"), b"a")], 10).await;
    store
        .set_session_user(Some("alice"))
        .await
        .expect("a session as an earlier worker persisted it");
    store.close();
    let o = outbox(&db, 1).await;
    let listed = command(&o, &js(&serde_json::json!({"type":"LIST_QUEUE"}))).await;
    assert_eq!(listed["type"], "QUEUE_STATE", "{listed}");
    assert_eq!(listed["account"], "alice", "{listed}");
    assert_eq!(listed["records"][0]["ownerId"], "alice", "{listed}");
    assert_eq!(listed["records"][0]["path"], "/notes", "{listed}");
    let out = command(
        &o,
        &js(&serde_json::json!({"type":"AUTH_SESSION","userId":null})),
    )
    .await;
    assert_eq!(out["ok"], true, "{out}");
    let listed = command(&o, &js(&serde_json::json!({"type":"LIST_QUEUE"}))).await;
    assert_eq!(listed["account"], Value::Null, "{listed}");
    assert!(
        listed
            .as_object()
            .is_some_and(|m| m.contains_key("account")),
        "null is said, not left out: {listed}"
    );
}

/// A bearer session's credential (r3) is persisted with the session only when given (the
/// worker gives it with `persistAuthorization`), read back after a reopen, and gone with a
/// sign-out, a cookie sign-in and a clear; without it, the session still says it is a
/// bearer one (a restarted worker then asks for the credential).
#[wasm_bindgen_test]
async fn a_bearer_sessions_credential_is_kept_only_when_given_and_goes_with_the_session() {
    use sw_outbox::core::credential::Authorization;
    use sw_outbox::store::SessionAuth;
    let name = unique("bearer");
    let a = open(&name).await;
    assert_eq!(
        a.session_auth().await.expect("reads"),
        SessionAuth::default()
    );
    let kept = SessionAuth {
        bearer: true,
        authorization: Some(Authorization::parse("Bearer kept.1").expect("valid")),
    };
    a.set_session(Some("alice"), &kept).await.expect("writes");
    a.close();
    let b = open(&name).await;
    assert_eq!(
        b.session_auth().await.expect("reads"),
        kept,
        "across a reopen"
    );
    assert_eq!(b.snapshot().await.expect("reads").auth, kept);
    let memory_only = SessionAuth {
        bearer: true,
        authorization: None,
    };
    b.set_session(Some("alice"), &memory_only)
        .await
        .expect("writes");
    assert_eq!(
        b.session_auth().await.expect("reads"),
        memory_only,
        "a bearer session without its credential stored"
    );
    b.set_session(Some("alice"), &kept).await.expect("writes");
    b.set_session_user(Some("alice")).await.expect("writes");
    assert_eq!(
        b.session_auth().await.expect("reads"),
        SessionAuth::default(),
        "a cookie sign-in replaces it"
    );
    b.set_session(Some("alice"), &kept).await.expect("writes");
    b.set_session(None, &kept).await.expect("writes");
    assert_eq!(
        b.session_auth().await.expect("reads"),
        SessionAuth::default(),
        "a sign-out carries none"
    );
    b.set_session(Some("alice"), &kept).await.expect("writes");
    b.clear_device().await.expect("clears");
    assert_eq!(
        b.session_auth().await.expect("reads"),
        SessionAuth::default()
    );
    assert_eq!(b.session_user().await.expect("reads"), None);
}

// ---- interception, through the exported Outbox -------------------------------------

async fn outbox(db: &str, timeout_ms: u32) -> sw_outbox::worker::Outbox {
    let cfg = serde_json::json!({"dbName": db, "attemptTimeoutMs": timeout_ms});
    sw_outbox::worker::start(js(&cfg), JsValue::UNDEFINED)
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

/// The attempt's 1 ms timeout must fire before the test runner's server answers; on a
/// loaded machine the server sometimes wins (a CI run saw its 404). An answered write is
/// passed through and stores nothing, which is checked too; a few tries, each on its own
/// database, find one whose attempt the timeout ended.
#[wasm_bindgen_test]
async fn a_write_without_an_answer_is_queued_and_the_202_names_its_record() {
    let body = big_body();
    let mut answered = Vec::new();
    for _ in 0..5 {
        let db = unique("intercept");
        let o = outbox(&db, 1).await;
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
        if status != 202 {
            assert_eq!(
                open(&db).await.count().await.expect("counts"),
                0,
                "an answered write is passed through, not queued: {status} {json}"
            );
            answered.push(status);
            continue;
        }
        assert_eq!(json["queued"], true);
        assert!(
            json["background"].is_boolean(),
            "r3: whether Background Sync took it: {json}"
        );
        let key = json["idempotencyKey"].as_str().expect("key").to_owned();
        assert!(IdempotencyKey::parse(&key).is_ok());
        let id = json["id"].as_u64().expect("id");
        let store = open(&db).await;
        let got = records(queue(&store).await);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].id, RecordId(id));
        assert_eq!(got[0].key.as_ref().map(|k| k.as_str()), Some(key.as_str()));
        assert_eq!(got[0].owner.as_deref(), Some("alice"));
        assert_eq!(got[0].workspace.as_deref(), Some("p9"));
        assert_eq!(got[0].path, "/projects/p9/tasks");
        assert_eq!(got[0].content_type.as_deref(), Some("application/json"));
        assert_eq!(got[0].body_len, body.len());
        assert!(got[0].first_sent_at.is_some(), "its first attempt went out");
        return;
    }
    panic!("every attempt was answered before its 1 ms timeout: {answered:?}");
}

#[wasm_bindgen_test]
async fn page_keys_of_any_sane_shape_are_kept_and_a_malformed_one_refused() {
    let db = unique("keys");
    let o = outbox(&db, 1).await;
    o.assume_network_failed_for_tests();
    let hash = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08f00dbabe";
    for page_key in [
        "page-key-0123456789abcdefgh",
        "order_1234",
        "k:7f3e",
        &hash[..72],
    ] {
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
    }
    let long = "k".repeat(256);
    let (status, json) = answer(
        &o,
        request(
            "POST",
            "/api/notes",
            &[("Idempotency-Key", &long)],
            Some(b"{}"),
        ),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(json["queued"], false);
    assert!(
        json["error"]
            .as_str()
            .is_some_and(|e| e.contains("1 to 255")),
        "{json}"
    );
    let store = open(&db).await;
    assert_eq!(
        store.count().await.expect("counts"),
        4,
        "the refused write is not stored"
    );
}

#[wasm_bindgen_test]
async fn an_oversized_body_that_cannot_go_through_is_refused_413_and_not_stored() {
    let db = unique("big");
    let cfg = serde_json::json!({"dbName": db, "maxBodyBytes": 1024});
    let o = sw_outbox::worker::start(js(&cfg), JsValue::UNDEFINED)
        .await
        .expect("start");
    // Not timing: the write is not attempted at all (a known-offline worker).
    o.assume_network_failed_for_tests();
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
    let url = |path: &str| request("GET", path, &[], None).url();
    assert_eq!(
        o.route_for_tests("GET", &url("/api/projects/1/tasks"), false),
        "read"
    );
    assert_eq!(
        o.route_for_tests("POST", &url("/elsewhere"), false),
        "not-ours"
    );
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
    // Every number is range-checked: a timer over 2^31 ms would fire at once.
    let err = start_refusal(serde_json::json!({"attemptTimeoutMs": 2_147_483_648u64})).await;
    assert!(err.contains("attemptTimeoutMs"), "{err}");
    let err = start_refusal(serde_json::json!({"neverQueuePattern": "("})).await;
    assert!(err.contains("neverQueuePattern"), "{err}");
}

#[wasm_bindgen_test]
fn these_tests_run_inside_a_service_worker() {
    let global = js_sys::global();
    assert!(
        global.is_instance_of::<web_sys::ServiceWorkerGlobalScope>(),
        "the shell's tests must run in a ServiceWorkerGlobalScope"
    );
}

/// The queue chain takes a Web Lock when the worker's global has `navigator.locks`;
/// every engine tested here has it (the README's browser table rests on this test).
#[wasm_bindgen_test]
fn the_worker_global_has_web_locks() {
    let navigator =
        Reflect::get(&js_sys::global(), &"navigator".into()).unwrap_or(JsValue::UNDEFINED);
    let locks = Reflect::get(&navigator, &"locks".into()).unwrap_or(JsValue::UNDEFINED);
    let request = Reflect::get(&locks, &"request".into()).unwrap_or(JsValue::UNDEFINED);
    assert!(
        request.is_function(),
        "navigator.locks.request is missing in this worker"
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
    assert!(enqueue(&store, batch, 100).await.iter().all(Result::is_ok));
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
    assert_eq!(adopted.expect("adopts").0, 50);
    let owners: Vec<Option<String>> = records(seen.expect("reads").0)
        .into_iter()
        .map(|m| m.owner)
        .collect();
    assert_eq!(owners.len(), 50);
    assert!(
        owners.iter().all(|o| o.is_none()) || owners.iter().all(|o| o.as_deref() == Some("alice")),
        "a concurrent reader saw a partial adoption: {owners:?}"
    );
    let after = records(queue(&reader).await);
    assert!(after.iter().all(|m| m.owner.as_deref() == Some("alice")));
}

/// Creates a version-2 database as the previous release wrote it: bodies inside the
/// records, no `bodies` store, no generation.
async fn make_v2(name: &str, values: Vec<JsValue>) {
    let open = factory().open_with_u32(name, 2).expect("open v2");
    let req = open.clone();
    let on_upgrade = Closure::<dyn FnMut()>::new(move || {
        let db: IdbDatabase = req.result().expect("db").unchecked_into();
        let params = IdbObjectStoreParameters::new();
        params.set_key_path(&"id".into());
        params.set_auto_increment(true);
        let store = db
            .create_object_store_with_optional_parameters("mutations", &params)
            .expect("store");
        store
            .create_index_with_str("timestamp", "timestamp")
            .expect("index");
        let params = IdbObjectStoreParameters::new();
        params.set_key_path(&"key".into());
        db.create_object_store_with_optional_parameters("session", &params)
            .expect("session");
        for v in &values {
            store.put(v).expect("put");
        }
    });
    open.set_onupgradeneeded(Some(on_upgrade.as_ref().unchecked_ref()));
    let db: IdbDatabase = idb::request(open.clone().into())
        .await
        .expect("opened")
        .unchecked_into();
    db.close();
}

fn v2_record(path: &str, owner: &str, body: &[u8], ts: u64) -> JsValue {
    let v = js(&serde_json::json!({
        "method": "POST", "path": path, "contentType": "application/json",
        "timestamp": ts, "ownerId": owner, "workspace": Defaults.workspace(path),
        "idempotencyKey": key().as_str(), "state": "queued", "attentionReason": null,
        "serverFailures": 0, "attempts": 1,
    }));
    Reflect::set(&v, &"body".into(), &Uint8Array::from(body).into()).expect("body");
    v
}

#[wasm_bindgen_test]
async fn a_version_2_database_moves_its_bodies_out_keeping_every_record() {
    let name = unique("v2");
    let values = (0..4)
        .map(|i| {
            v2_record(
                &format!("/projects/p{i}/tasks"),
                "alice",
                format!("body {i}").as_bytes(),
                1_000 + i,
            )
        })
        .collect();
    make_v2(&name, values).await;
    let store = open(&name).await;
    let got = records(queue(&store).await);
    assert_eq!(got.len(), 4, "no record lost");
    for (i, m) in got.iter().enumerate() {
        assert_eq!(m.owner.as_deref(), Some("alice"));
        assert_eq!(m.body_len, format!("body {i}").len());
        assert_eq!(
            body_of(&store, m.id).await,
            format!("body {i}").into_bytes()
        );
        assert_eq!(
            m.first_sent_at,
            Some(1_000 + i as u64),
            "a version-2 record is taken as sent when queued (the key window's safe side)"
        );
        assert_eq!(m.conflicts, 0);
    }
    // The metadata no longer carries the body.
    let (_, sent) = store
        .begin_send(got[0].id, 5, false)
        .await
        .expect("reads")
        .expect("exists");
    assert_eq!(
        Uint8Array::new(&sent.expect("body")).to_vec(),
        b"body 0".to_vec()
    );
    assert!(store.generation().await.expect("generation").n >= 1);
}

#[wasm_bindgen_test]
async fn a_value_under_a_foreign_key_becomes_a_discardable_corrupt_record() {
    let name = unique("foreign");
    let store = open(&name).await;
    enqueue(&store, vec![pending("/notes", Some("alice"), b"a")], 10).await[0]
        .clone()
        .expect("stored");
    for k in [JsValue::from_str("not-a-number"), JsValue::from_f64(1.5)] {
        let v = js(&serde_json::json!({"method":"POST","path":"/notes","timestamp":1}));
        Reflect::set(&v, &"id".into(), &k).expect("id");
        store.put_raw_for_tests(&v).await.expect("put");
    }
    assert_eq!(store.count().await.expect("counts"), 3);
    let (items, foreign) = store.read_queue().await.expect("reads");
    assert_eq!(
        (items.len(), foreign),
        (1, 2),
        "counted but not readable as records"
    );
    assert_eq!(store.rekey_foreign().await.expect("rekeys"), 2);
    let items = queue(&store).await;
    assert_eq!(items.len(), 3, "every stored value is now listed");
    let corrupt: Vec<RecordId> = items
        .iter()
        .filter_map(|i| match i {
            QueueItem::Corrupt(id, why) => {
                assert!(why.contains("not a record id"), "{why}");
                Some(*id)
            }
            QueueItem::Record(_) => None,
        })
        .collect();
    assert_eq!(corrupt.len(), 2);
    let (n, _) = store
        .rewrite_where(Some(corrupt[0]), |_| sw_outbox::store::Rewrite::Delete)
        .await
        .expect("discards");
    assert_eq!(n, 1);
    assert_eq!(store.count().await.expect("counts"), 2);
}

#[wasm_bindgen_test]
async fn the_generation_moves_with_every_change_a_worker_caches() {
    let store = open(&unique("gen")).await;
    let g0 = store.generation().await.expect("reads");
    let ids = enqueue(&store, vec![pending("/notes", Some("a"), b"1")], 10).await;
    let g1 = store.generation().await.expect("reads");
    assert_eq!(g1.n, g0.n + 1, "an enqueue");
    let id = ids[0].clone().expect("stored");
    let m = records(queue(&store).await).remove(0);
    store
        .write_fields(id, &m.mutable_fields())
        .await
        .expect("writes");
    assert_eq!(
        store.generation().await.expect("reads"),
        g1,
        "a settle caches nothing"
    );
    let before = store.set_session_user(Some("bob")).await.expect("writes");
    assert_eq!(before, g1);
    let before = store.delete(id).await.expect("deletes");
    assert_eq!(before.n, g1.n + 1);
    let (_, before) = store.clear_device().await.expect("clears");
    let after = store.generation().await.expect("reads");
    assert_eq!(
        after,
        before.next(true),
        "a clear counts as one change and one clear"
    );
    assert_eq!(after.clears, g0.clears + 1);
}

#[wasm_bindgen_test]
async fn a_batch_decided_on_a_stale_view_or_before_a_clear_is_never_stored() {
    let store = open(&unique("stale")).await;
    let now = store.generation().await.expect("reads").n;
    let batch = [pending("/notes", Some("alice"), b"x")];
    let refs: Vec<&Pending> = batch.iter().collect();
    let (applied, results) = store.enqueue(&refs, 10, &|| Some(now - 1)).await;
    assert_eq!(applied, None);
    assert_eq!(results, vec![Err(EnqueueFailure::Stale)]);
    let (_, results) = store.enqueue(&refs, 10, &|| None).await;
    assert_eq!(
        results,
        vec![Err(EnqueueFailure::Stale)],
        "an unknown view is stale too"
    );
    assert_eq!(store.count().await.expect("counts"), 0);
    // Decided before a clear (its clear count is the old one): refused, even under a
    // fresh view; one decided after the clear is stored.
    store.clear_device().await.expect("clears");
    let g: Generation = store.generation().await.expect("reads");
    let mut after = pending("/notes", Some("bob"), b"y");
    after.clears = g.clears;
    let mixed = [pending("/notes", Some("alice"), b"x"), after];
    let refs: Vec<&Pending> = mixed.iter().collect();
    let (applied, results) = store.enqueue(&refs, 10, &move || Some(g.n)).await;
    assert_eq!(applied, Some(g));
    assert_eq!(results[0], Err(EnqueueFailure::Cleared));
    assert!(results[1].is_ok());
    let left = records(queue(&store).await);
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].owner.as_deref(), Some("bob"));
}

/// A version that becomes active checks its view against the database even though it is
/// then its registration's only worker: the version it replaces may have queued writes
/// while this one was installed and waiting (seen in the WebKit chaos run: a write of a
/// lane with queued records was sent at once, and applied before them).
#[wasm_bindgen_test]
async fn activation_sees_the_writes_the_replaced_version_queued_while_this_one_waited() {
    let db = unique("activate");
    let o = outbox(&db, 1).await; // its view: an empty queue
    let registration = js_sys::global()
        .unchecked_into::<web_sys::ServiceWorkerGlobalScope>()
        .registration();
    assert!(
        registration.installing().is_none() && registration.waiting().is_none(),
        "this worker is its registration's only one, as a version just activated is"
    );
    // Meanwhile the version being replaced queues a write of alice's p1 lane.
    let replaced = open(&db).await;
    let ids = enqueue(
        &replaced,
        vec![pending(
            "/projects/p1/tasks",
            Some("alice"),
            b"{\"title\":\"1\"}",
        )],
        10,
    )
    .await;
    assert!(ids[0].is_ok(), "{ids:?}");
    JsFuture::from(o.handle_activate())
        .await
        .expect("activates");
    // A new write of that lane waits behind it: queued without a first attempt.
    let (status, json) = answer(
        &o,
        request(
            "POST",
            "/api/projects/p1/tasks",
            &[
                ("Content-Type", "application/json"),
                ("X-PM-Expected-Account", "alice"),
            ],
            Some(b"{\"title\":\"2\"}"),
        ),
    )
    .await;
    assert_eq!(status, 202, "{json}");
    let got = records(queue(&replaced).await);
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[1].owner.as_deref(), Some("alice"));
    assert_eq!(
        got[1].first_sent_at, None,
        "held back behind the replaced version's write of its lane, so never attempted"
    );
}

/// Sends a message to the outbox as a page would, and waits for its answer on a port.

#[wasm_bindgen_test]
async fn a_shared_reference_message_is_read_field_by_field_and_answered() {
    let o = outbox(&unique("hostile"), 1).await;
    // 2^40 paths in a few objects: converting it whole would never finish.
    let mut x = Object::new();
    for _ in 0..40 {
        let y = Object::new();
        Reflect::set(&y, &"a".into(), &x).expect("a");
        Reflect::set(&y, &"b".into(), &x).expect("b");
        x = y;
    }
    let msg = Object::new();
    Reflect::set(&msg, &"type".into(), &"LIST_QUEUE".into()).expect("type");
    Reflect::set(&msg, &"x".into(), &x).expect("x");
    let answer = command(&o, &msg).await;
    assert_eq!(answer["type"], "QUEUE_STATE", "{answer}");
    // The same graph where a command expects a field is refused, naming it.
    let msg = Object::new();
    Reflect::set(&msg, &"type".into(), &"AUTH_SESSION".into()).expect("type");
    Reflect::set(&msg, &"userId".into(), &x).expect("userId");
    let answer = command(&o, &msg).await;
    assert_eq!(answer["ok"], false, "{answer}");
    assert!(
        answer["reason"]
            .as_str()
            .is_some_and(|r| r.contains("userId")),
        "{answer}"
    );
    let ids = js_sys::Array::new();
    for _ in 0..100_000 {
        ids.push(&x);
    }
    let msg = Object::new();
    Reflect::set(&msg, &"type".into(), &"REBIND_RECORDS".into()).expect("type");
    Reflect::set(&msg, &"ownerId".into(), &"alice".into()).expect("owner");
    Reflect::set(&msg, &"ids".into(), &ids).expect("ids");
    let answer = command(&o, &msg).await;
    assert_eq!(answer["ok"], false, "{answer}");
    assert!(
        answer["reason"].as_str().is_some_and(|r| r.contains("ids")),
        "{answer}"
    );
}

/// `AUTH_SESSION`'s `authorization` (r3): a token longer than other fields are allowed is
/// read (up to 8192 characters, named past it); the session keeps the credential in
/// IndexedDB only with `persistAuthorization`, and says it is a bearer session either way.
#[wasm_bindgen_test]
async fn auth_session_takes_a_long_token_and_stores_it_only_when_configured_to() {
    use sw_outbox::core::credential::Authorization;
    use sw_outbox::store::SessionAuth;
    let token = format!("Bearer {}", "t".repeat(6000));
    for persist in [false, true] {
        let db = unique("bearer-session");
        let cfg = serde_json::json!({"dbName": db, "persistAuthorization": persist});
        let o = sw_outbox::worker::start(js(&cfg), JsValue::UNDEFINED)
            .await
            .unwrap_or_else(|e| panic!("start: {e:?}"));
        let answer = command(
            &o,
            &js(&serde_json::json!({"type":"AUTH_SESSION","userId":"alice","authorization":token})),
        )
        .await;
        assert_eq!(answer["ok"], true, "{answer}");
        let stored = open(&db).await.session_auth().await.expect("reads");
        let expected = SessionAuth {
            bearer: true,
            authorization: persist.then(|| Authorization::parse(&token).expect("valid")),
        };
        assert_eq!(stored, expected, "persistAuthorization {persist}");
        let too_long = format!("Bearer {}", "t".repeat(8200));
        let answer = command(
            &o,
            &js(&serde_json::json!({"type":"AUTH_SESSION","userId":"alice","authorization":too_long})),
        )
        .await;
        assert_eq!(answer["ok"], false, "{answer}");
        assert!(
            answer["reason"]
                .as_str()
                .is_some_and(|r| r.contains("authorization must be 1 to 8192")),
            "{answer}"
        );
        // A sign-out leaves no credential anywhere.
        let answer = command(
            &o,
            &js(&serde_json::json!({"type":"AUTH_SESSION","userId":null})),
        )
        .await;
        assert_eq!(answer["ok"], true, "{answer}");
        assert_eq!(
            open(&db).await.session_auth().await.expect("reads"),
            SessionAuth::default()
        );
    }
}

#[wasm_bindgen_test]
async fn abort_write_answers_affected_zero_when_nothing_is_in_flight() {
    let o = outbox(&unique("abort"), 1).await;
    let answer = command(
        &o,
        &js(&serde_json::json!({"type":"ABORT_WRITE","idempotencyKey":"k:1","requestId":"r"})),
    )
    .await;
    assert_eq!(
        answer,
        serde_json::json!({"type":"COMMAND_RESULT","command":"ABORT_WRITE","ok":true,"affected":0,"requestId":"r"})
    );
}

#[wasm_bindgen_test]
async fn an_account_id_that_cannot_be_a_header_value_is_refused() {
    let o = outbox(&unique("acct"), 1).await;
    for bad in ["J\u{f6}rg", "\u{1F600}"] {
        let answer = command(
            &o,
            &js(&serde_json::json!({"type":"AUTH_SESSION","userId":bad})),
        )
        .await;
        assert_eq!(answer["ok"], false, "{answer}");
    }
    let answer = command(
        &o,
        &js(&serde_json::json!({"type":"AUTH_SESSION","userId":"alice"})),
    )
    .await;
    assert_eq!(answer["ok"], true, "{answer}");
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

// ---- issue 27: error paths ---------------------------------------------------------

/// A `Uint8Array` whose buffer was transferred away: IndexedDB cannot clone it, so the
/// request that stores it throws at once (a synchronous failure in the middle of a
/// transaction's requests).
fn detached(bytes: &[u8]) -> Uint8Array {
    let detach = js_sys::Function::new_with_args(
        "u8",
        "const c = new MessageChannel(); c.port1.postMessage(null, [u8.buffer]); c.port1.close(); return u8;",
    );
    detach
        .call1(&JsValue::NULL, &Uint8Array::from(bytes))
        .expect("detaches")
        .unchecked_into()
}

/// Issue 27, 7: a batch whose last body cannot be stored commits nothing, not the
/// records before it (nor itself without its body): each write is told it was not
/// stored, and none of them is in the queue.
#[wasm_bindgen_test]
async fn a_batch_that_fails_midway_stores_none_of_it() {
    let store = open(&unique("midway")).await;
    let good = pending("/projects/p1/tasks", Some("alice"), b"kept?");
    let mut bad = pending("/projects/p1/tasks", Some("alice"), b"x");
    bad.body = Some(detached(b"never stored"));
    let results = enqueue(&store, vec![good, bad], 10).await;
    assert!(
        results
            .iter()
            .all(|r| matches!(r, Err(EnqueueFailure::Storage(_)))),
        "{results:?}"
    );
    assert_eq!(
        store.count().await.expect("counts"),
        0,
        "a write told 503 is never stored"
    );
    // The database is still usable.
    let ok = enqueue(&store, vec![pending("/notes", Some("alice"), b"y")], 10).await;
    assert!(ok[0].is_ok(), "{ok:?}");
}

/// Issue 27, 7: an edit whose new body cannot be stored changes nothing of the record
/// (not its key, not its state), rather than committing new metadata over the old body.
#[wasm_bindgen_test]
async fn an_edit_that_fails_midway_changes_nothing() {
    let store = open(&unique("editfail")).await;
    let id = enqueue(&store, vec![pending("/notes", Some("alice"), b"old")], 10).await[0]
        .clone()
        .expect("stored");
    let before = records(queue(&store).await).remove(0);
    let mut changed = before.clone();
    changed.key = Some(key());
    changed.content_type = Some("text/plain".into());
    let result = store
        .rewrite_where(Some(id), |_| {
            sw_outbox::store::Rewrite::Replace(
                changed.mutable_fields(),
                Some(detached(b"new body")),
            )
        })
        .await;
    assert!(
        result.is_err(),
        "the failure is reported: {:?}",
        result.map(|r| r.0)
    );
    let after = records(queue(&store).await).remove(0);
    assert_eq!(after.key, before.key, "the key was not changed");
    assert_eq!(after.content_type, before.content_type);
    assert_eq!(body_of(&store, id).await, b"old".to_vec());
}

/// Issue 27, 8: a value stored under a key at 2^53 (which exhausts the key generator)
/// cannot be re-keyed by the generator; it is re-keyed under a free id, listed as a
/// corrupt record and discardable, and LIST_QUEUE never fails on it.
#[wasm_bindgen_test]
async fn a_value_the_key_generator_cannot_re_key_is_listed_as_corrupt() {
    let db = unique("exhausted");
    let store = open(&db).await;
    let first = enqueue(&store, vec![pending("/notes", Some("alice"), b"a")], 10).await[0]
        .clone()
        .expect("stored");
    let v = js(&serde_json::json!({"method":"POST","path":"/notes","timestamp":1}));
    Reflect::set(
        &v,
        &"id".into(),
        &JsValue::from_f64(9_007_199_254_740_992.0),
    )
    .expect("id");
    store.put_raw_for_tests(&v).await.expect("put");
    let o = outbox(&db, 1).await;
    let listed = command(&o, &js(&serde_json::json!({"type":"LIST_QUEUE"}))).await;
    assert_eq!(listed["type"], "QUEUE_STATE", "{listed}");
    let records = listed["records"].as_array().expect("records");
    assert_eq!(records.len(), 2, "{listed}");
    assert_eq!(records[0]["id"], first.0);
    assert_eq!(records[1]["state"], "corrupt", "{listed}");
    let corrupt = records[1]["id"].as_u64().expect("an id");
    assert!(
        corrupt > first.0 && corrupt < 9_007_199_254_740_992,
        "{corrupt}"
    );
    let (n, _) = store
        .rewrite_where(Some(RecordId(corrupt)), |_| {
            sw_outbox::store::Rewrite::Delete
        })
        .await
        .expect("discards");
    assert_eq!(n, 1);
    assert_eq!(store.count().await.expect("counts"), 1);
}

/// Issue 27, 9: a session persisted before account ids were checked (r2), which cannot
/// be sent as a header value, is no session when read: a header-less write is queued
/// with an unknown owner instead of failing on the header.
#[wasm_bindgen_test]
async fn a_stored_session_that_cannot_be_a_header_value_is_no_session() {
    let db = unique("oldsession");
    let store = open(&db).await;
    store
        .set_session_user(Some("\u{1F600} emoji account"))
        .await
        .expect("stored as a pre-r2 worker would have");
    assert_eq!(store.session_user().await.expect("reads"), None);
    let o = outbox(&db, 1).await;
    o.assume_network_failed_for_tests();
    let (status, body) = answer(
        &o,
        request(
            "POST",
            "/api/notes",
            &[("Content-Type", "application/json")],
            Some(b"{}"),
        ),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let listed = records(queue(&store).await);
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].owner, None,
        "unknown owner, never the stored value"
    );
}

/// A made-up `GET authMePath` answer, read as a flush reads one.
async fn identity_of(
    status: u16,
    body: &str,
    headers: &[(&str, &str)],
    csrf_header: &str,
) -> String {
    let h = Headers::new().expect("headers");
    for (k, v) in headers {
        h.set(k, v).expect("header");
    }
    let init = web_sys::ResponseInit::new();
    init.set_status(status);
    init.set_headers(&h);
    let response = Response::new_with_opt_str_and_init(Some(body), &init).expect("response");
    sw_outbox::worker::identity_answer_for_tests(&response, csrf_header).await
}

/// Issue 27, 1: an identity answer is read up to 1 MiB: a large profile names the
/// account; one larger still is an answer (never "offline"), whose account is unknown.
/// Issue 27, 9: the CSRF token is read from the configured `csrfHeader`.
#[wasm_bindgen_test]
async fn a_large_identity_answer_is_read_and_the_token_comes_from_csrf_header() {
    let profile = "p".repeat(900 * 1024);
    let big = format!(r#"{{"user":{{"id":"alice","bio":"{profile}"}}}}"#);
    let read = identity_of(200, &big, &[("X-App-Csrf", "tok-1")], "X-App-Csrf").await;
    assert!(
        read.contains(r#"SignedIn { user: "alice", csrf: Some("tok-1") }"#),
        "{read}"
    );
    let read = identity_of(
        200,
        r#"{"user":{"id":"alice"}}"#,
        &[("X-CSRF-Token", "default")],
        "X-App-Csrf",
    )
    .await;
    assert!(
        read.contains("csrf: None"),
        "only the configured header: {read}"
    );
    let huge = format!(
        r#"{{"user":{{"id":"alice","bio":"{}"}}}}"#,
        "p".repeat(1100 * 1024)
    );
    let read = identity_of(200, &huge, &[], "X-CSRF-Token").await;
    assert!(
        read.contains("Unavailable { status: 200 }"),
        "an answer, not offline: {read}"
    );
}

/// The stored-record reader goes field by field (not through serde; issue 30): each
/// field reads back as stored, a BigInt as a number, absent, `undefined` and `null`
/// fields as unset, unknown fields are ignored, and the first mistyped field is named.
#[wasm_bindgen_test]
fn a_stored_value_is_read_field_by_field() {
    let v = Object::new();
    let set = |k: &str, x: JsValue| {
        Reflect::set(&v, &k.into(), &x).expect("set");
    };
    let pair = |a: &str, b: &str| js_sys::Array::of2(&a.into(), &b.into());
    set("method", "PATCH".into());
    set("path", "/projects/p1/tasks/1".into());
    set("timestamp", js_sys::BigInt::from(1_234u64).into());
    set("ownerId", "alice".into());
    set("contentType", JsValue::NULL);
    set("lastStatus", JsValue::UNDEFINED);
    set("attempts", 2.into());
    set("bodySize", 12.into());
    set("somethingElse", "ignored".into());
    let headers = js_sys::Array::of2(&pair("If-Match", "\"v1\""), &pair("X-Trace", "t"));
    // A pair's extra elements are ignored, as serde's tuples ignored them.
    headers
        .get(1)
        .unchecked_into::<js_sys::Array>()
        .push(&"extra".into());
    set("headers", headers.into());
    let read = |v: &Object| {
        sw_outbox::store::read_item(&JsValue::from_f64(7.0), v, &Defaults).expect("a record id")
    };
    match read(&v) {
        QueueItem::Record(m) => {
            assert_eq!(m.id, RecordId(7));
            assert_eq!(
                (m.method.as_str(), m.path.as_str()),
                ("PATCH", "/projects/p1/tasks/1")
            );
            assert_eq!(m.timestamp, 1_234, "a BigInt reads as its number");
            assert_eq!(m.owner.as_deref(), Some("alice"));
            assert_eq!(m.workspace.as_deref(), Some("p1"), "derived from the path");
            assert_eq!((m.content_type, m.last_status), (None, None));
            assert_eq!((m.attempts, m.body_len), (2, 12));
            assert_eq!(
                m.headers,
                vec![
                    ("If-Match".to_owned(), "\"v1\"".to_owned()),
                    ("X-Trace".to_owned(), "t".to_owned())
                ]
            );
        }
        QueueItem::Corrupt(_, why) => panic!("read as corrupt: {why}"),
    }
    for (field, bad, named) in [
        ("attempts", JsValue::from("two"), "a number"),
        ("ownerId", JsValue::from(5), "a string"),
        ("headers", JsValue::from("If-Match: x"), "pairs"),
        (
            "headers",
            js_sys::Array::of1(&pair("only", "").slice(0, 1)).into(),
            "pairs",
        ),
    ] {
        let copy = Object::assign(&Object::new(), &v);
        Reflect::set(&copy, &field.into(), &bad).expect("set");
        match read(&copy) {
            QueueItem::Corrupt(id, why) => {
                assert_eq!(id, RecordId(7));
                assert!(why.contains(field) && why.contains(named), "{field}: {why}");
            }
            QueueItem::Record(_) => panic!("{field} = {bad:?} read as a record"),
        }
    }
}

// ---- stops the worker retries itself (contract 4.8, r4) ----------------------------

/// A record of alice's in a fresh outbox whose identity check asks `auth_me_path` (the
/// test runner's server answers it: its page for `/`, 404 for the rest).
async fn outbox_with_a_record(
    name: &str,
    auth_me_path: &str,
    sync_tag: &str,
) -> sw_outbox::worker::Outbox {
    let db = unique(name);
    let cfg = serde_json::json!({"dbName": db, "authMePath": auth_me_path, "syncTag": sync_tag});
    let o = sw_outbox::worker::start(js(&cfg), JsValue::UNDEFINED)
        .await
        .unwrap_or_else(|e| panic!("start: {e:?}"));
    let store = open(&db).await;
    let stored = enqueue(
        &store,
        vec![pending("/projects/p1/tasks", Some("alice"), b"{}")],
        10,
    )
    .await;
    assert!(stored[0].is_ok(), "{stored:?}");
    o
}

/// r4: an identity check that names nobody (a captive portal's 200 page: here the test
/// server's own page as `authMePath`) stops the flush `signed-out`, and that stop has a
/// `retryAt` on the backoff schedule, no longer null: once the session or the network
/// is back, the queue does not wait for a reload.
#[wasm_bindgen_test]
async fn a_signed_out_stop_is_retried_on_the_backoff_schedule() {
    let o = outbox_with_a_record("signed-out", "/", &unique("signed-out")).await;
    let before = js_sys::Date::now();
    let flushed = command(&o, &js(&serde_json::json!({"type":"FLUSH_QUEUE"}))).await;
    assert_eq!(flushed["type"], "COMMAND_RESULT", "{flushed}");
    let listed = command(&o, &js(&serde_json::json!({"type":"LIST_QUEUE"}))).await;
    let delivery = &listed["delivery"];
    assert_eq!(delivery["stoppedBy"], "signed-out", "{listed}");
    let at = delivery["retryAt"]
        .as_f64()
        .unwrap_or_else(|| panic!("a signed-out stop is retried on a timer: {listed}"));
    assert!(
        at > before && at <= before + 5.0 * 60_000.0 + 60_000.0,
        "on the backoff schedule: {at} (now {before})"
    );
}

/// r4: a Background Sync whose last chance fails with work left is registered again
/// before its event ends — the browser gives it up, and the worker's own timer dies with
/// the worker. (Engines without Background Sync have nothing to register.)
#[wasm_bindgen_test]
async fn a_sync_that_gave_up_is_registered_again_before_its_event_ends() {
    let registration = web_sys::js_sys::global()
        .unchecked_into::<web_sys::ServiceWorkerGlobalScope>()
        .registration();
    let sync = Reflect::get(&registration, &"sync".into()).expect("reads");
    if sync.is_undefined() || sync.is_null() {
        return;
    }
    let tags = || async {
        let get = Reflect::get(&sync, &"getTags".into())
            .expect("getTags")
            .unchecked_into::<js_sys::Function>();
        let p = get
            .call0(&sync)
            .expect("calls")
            .unchecked_into::<js_sys::Promise>();
        let tags: js_sys::Array = JsFuture::from(p).await.expect("tags").unchecked_into();
        tags.iter()
            .filter_map(|t| t.as_string())
            .collect::<Vec<_>>()
    };
    let tag = unique("last-chance");
    let tag = tag.as_str();
    assert!(
        !tags().await.iter().any(|t| t == tag),
        "no sync of this tag before the test"
    );
    // The identity check answers 404: the flush stops (`identity-check`) with work left.
    let o = outbox_with_a_record("last-chance", "/no-such-identity-route", tag).await;
    let done = JsFuture::from(o.handle_sync(tag.into(), true)).await;
    assert!(done.is_err(), "the event fails: work is left");
    assert!(
        tags().await.iter().any(|t| t == tag),
        "registered again before the event that gave up ended"
    );
}

/// A read the page aborted (a browser that passes the page's abort on hands the worker a
/// request whose signal aborts) is not a network failure: the online write after it is
/// sent (the test server answers it 404, passed through), not queued unsent as if the
/// network were down.
#[wasm_bindgen_test]
async fn a_read_the_page_aborted_does_not_mark_the_network_down() {
    let o = outbox(&unique("aborted-read"), 15_000).await;
    let controller = web_sys::AbortController::new().expect("controller");
    let init = RequestInit::new();
    init.set_method("GET");
    init.set_signal(Some(&controller.signal()));
    let origin = web_sys::js_sys::global()
        .unchecked_into::<web_sys::ServiceWorkerGlobalScope>()
        .location()
        .origin();
    let read = Request::new_with_str_and_init(&format!("{origin}/api/projects/p1/tasks"), &init)
        .expect("request");
    controller.abort();
    let _ = JsFuture::from(o.handle_fetch(read, None)).await;
    let write = request(
        "POST",
        "/api/projects/p1/tasks",
        &[("Content-Type", "application/json")],
        Some(b"{\"title\":\"right after the abort\"}"),
    );
    let (status, body) = answer(&o, write).await;
    assert_eq!(
        status, 404,
        "sent, and the server's answer passed through, not queued as offline: {body}"
    );
}

/// The windows' accounts and the kept `MUTATION_SETTLED` reports (contract 5, r4; issue
/// 34, items 4 and 8a), in the `session` store of a real database: rows named, read back,
/// forgotten; reports kept newest-first per account, the accounts kept longest ago dropped
/// beyond the bound, taken once; `CLEAR_DEVICE` deletes both.
#[wasm_bindgen_test]
async fn windows_accounts_and_kept_reports_live_in_the_session_store() {
    use sw_outbox::core::windows::{KEPT_SETTLED_ACCOUNTS, KEPT_SETTLED_PER_ACCOUNT};
    use sw_outbox::store::Kept;
    let store = open(&unique("windows")).await;
    store
        .name_window("tab-a", Some("alice"))
        .await
        .expect("named");
    store
        .name_window("tab-b", Some("bob"))
        .await
        .expect("named");
    store.name_window("tab-b", None).await.expect("signed out");
    let mut named = store.named_windows().await.expect("read");
    named.sort_by(|a, b| a.client_id.cmp(&b.client_id));
    let named: Vec<(String, Option<String>)> =
        named.into_iter().map(|n| (n.client_id, n.user)).collect();
    assert_eq!(
        named,
        vec![
            ("tab-a".into(), Some("alice".into())),
            ("tab-b".into(), None)
        ]
    );
    store.forget_windows(&["tab-a"]).await.expect("forgotten");
    assert_eq!(store.named_windows().await.expect("read").len(), 1);

    // One account: the newest reports only.
    let report = |n: usize| JsValue::from_f64(n as f64);
    let many = (0..KEPT_SETTLED_PER_ACCOUNT + 5).map(report).collect();
    store
        .keep_settled(
            1,
            vec![Kept {
                account: "alice".into(),
                reports: many,
            }],
        )
        .await
        .expect("kept");
    // More accounts than kept: the ones kept longest ago go (alice, kept at 1, first).
    for i in 0..KEPT_SETTLED_ACCOUNTS {
        store
            .keep_settled(
                10 + i as u64,
                vec![Kept {
                    account: format!("user{i}"),
                    reports: vec![report(i)],
                }],
            )
            .await
            .expect("kept");
    }
    let accounts = store.kept_accounts().await.expect("read");
    assert_eq!(accounts.len(), KEPT_SETTLED_ACCOUNTS);
    assert!(!accounts.contains(&"alice".to_string()), "{accounts:?}");
    // Alice again, then taken: the newest of hers, once.
    let many = (0..KEPT_SETTLED_PER_ACCOUNT + 5).map(report).collect();
    store
        .keep_settled(
            100,
            vec![Kept {
                account: "alice".into(),
                reports: many,
            }],
        )
        .await
        .expect("kept");
    let taken = store.take_settled(&["alice".into()]).await.expect("taken");
    assert_eq!(taken.len(), 1);
    let got: Vec<f64> = taken[0].reports.iter().filter_map(|v| v.as_f64()).collect();
    assert_eq!(got.len(), KEPT_SETTLED_PER_ACCOUNT);
    assert_eq!(got[0], 5.0, "the oldest five went");
    assert!(store
        .take_settled(&["alice".into()])
        .await
        .expect("again")
        .is_empty());
    assert_eq!(
        store.kept_accounts().await.expect("read").len(),
        KEPT_SETTLED_ACCOUNTS - 1,
        "user0, kept longest ago, went when alice came back"
    );

    store.clear_device().await.expect("cleared");
    assert!(store.named_windows().await.expect("read").is_empty());
    assert!(store.kept_accounts().await.expect("read").is_empty());
}

/// Writes queued together share one Background Sync registration (where the API exists):
/// a write whose registration would go out while another's is still on its way joins
/// that one, which the browser answers after both were stored. Each 202 still says
/// whether a sync will deliver it. Counted by wrapping `registration.sync.register`.
#[wasm_bindgen_test]
async fn writes_queued_together_share_one_sync_registration() {
    let db = unique("syncjoin");
    let o = outbox(&db, 1).await;
    o.assume_network_failed_for_tests();
    let counter = js_sys::Function::new_no_args(
        "const sync = self.registration.sync;
         if (!sync) return null;
         const state = { calls: 0 };
         const register = sync.register;
         sync.register = function (...args) { state.calls += 1; return register.apply(this, args); };
         state.restore = () => { delete sync.register; };
         return state;",
    )
    .call0(&JsValue::NULL)
    .expect("wrapped");
    let n = 16;
    let answers = js_sys::Array::new();
    for i in 0..n {
        let r = request(
            "POST",
            &format!("/api/projects/p{}/tasks", i % 4),
            &[("X-PM-Expected-Account", "alice")],
            Some(b"{}"),
        );
        answers.push(&o.handle_fetch(r, None));
    }
    let all = JsFuture::from(js_sys::Promise::all(&answers))
        .await
        .expect("every write answered");
    let mut background = Vec::new();
    for resp in js_sys::Array::from(&all).iter() {
        let resp: Response = resp.unchecked_into();
        assert_eq!(resp.status(), 202);
        let text = JsFuture::from(resp.text().expect("text"))
            .await
            .expect("body")
            .as_string()
            .unwrap_or_default();
        let json: Value = serde_json::from_str(&text).expect("json");
        background.push(json["background"].as_bool().expect("background said"));
    }
    if counter.is_null() {
        // No Background Sync (Firefox, WebKit): none is claimed.
        assert!(background.iter().all(|b| !b), "{background:?}");
        return;
    }
    let calls = get(&counter, "calls").as_f64().expect("count") as usize;
    let _ = js_sys::Function::from(get(&counter, "restore")).call0(&JsValue::NULL);
    assert!(background.iter().all(|b| *b), "{background:?}");
    assert!(
        calls < n,
        "{calls} registrations for {n} writes queued together: they were not shared"
    );
}

/// A database created by a start's open is claimed in its creating transaction (issue 36,
/// the cold start: one commit instead of two); one that exists is not, and its claim
/// stays the start's own (`Store::claim`).
#[wasm_bindgen_test]
async fn a_database_created_by_an_open_is_claimed_in_the_same_transaction() {
    let (a, b) = ("https://app.test/a/", "https://app.test/b/");
    let name = unique("claimed-at-creation");
    let (store, claimed) = Store::open_claiming(&name, Rc::new(Defaults), Some(a))
        .await
        .expect("opens");
    assert!(claimed, "created here, so claimed here");
    assert!(!store.claim(b).await.expect("reads"), "a's claim is stored");
    assert!(store.claim(a).await.expect("reads"), "and a's own");
    store.close();
    let (again, claimed) = Store::open_claiming(&name, Rc::new(Defaults), Some(b))
        .await
        .expect("opens");
    assert!(!claimed, "it existed: not claimed by the open");
    assert!(!again.claim(b).await.expect("reads"), "still a's");
    again.close();
    let unclaimed = unique("created-unclaimed");
    let (store, claimed) = Store::open_claiming(&unclaimed, Rc::new(Defaults), None)
        .await
        .expect("opens");
    assert!(!claimed, "nothing to claim for");
    assert!(
        store.claim(b).await.expect("writes"),
        "free for the first claim"
    );
    store.close();
}
