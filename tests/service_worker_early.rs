//! The database opened early (issue 36), inside a real service worker
//! (`wasm-pack test --headless --chrome`, `--firefox`, `--safari`): `www/sw.js` opens the
//! database at its first evaluation and reads a start's rows while the module is
//! instantiated, and the start adopts both (`worker::early`). The part of sw.js between
//! its `early database: begin` and `end` lines is evaluated here on its own, with the
//! generated block it reads, and its result handed to `worker::start` as sw.js hands it.
//!
//! A start that adopts them sees what a start that opens and reads itself sees; a
//! database that does not exist yet (or needs an upgrade) is left to the module, which
//! creates it with its schema; a connection to another database is not used.
#![cfg(target_arch = "wasm32")]

use serde_json::{json, Value};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::*;
use web_sys::{Headers, Request, RequestInit, Response, ServiceWorkerGlobalScope};

mod support;
use support::{get, js, part_of_sw_js, unique};

wasm_bindgen_test_configure!(run_in_service_worker);

/// sw.js's early part, evaluated on its own: `{ openEarly, readEarly }`.
fn early_part() -> JsValue {
    let generated = part_of_sw_js("generated from Rust");
    let part = part_of_sw_js("early database");
    js_sys::Function::new_no_args(&format!(
        "{generated}\n{part}\nreturn {{ openEarly, readEarly }};"
    ))
    .call0(&JsValue::NULL)
    .expect("the early part of sw.js evaluates on its own")
}

async fn call(part: &JsValue, f: &str, arg: &JsValue) -> JsValue {
    let f: js_sys::Function = get(part, f).unchecked_into();
    let p = f.call1(&JsValue::NULL, arg).expect("call");
    JsFuture::from(js_sys::Promise::resolve(&p))
        .await
        .expect("sw.js's early functions never reject")
}

/// What sw.js hands a start for database `name`: its connection and rows, or null.
async fn handover(name: &str) -> JsValue {
    let part = early_part();
    let db = call(&part, "openEarly", &name.into()).await;
    if db.is_null() {
        return db;
    }
    call(&part, "readEarly", &db).await
}

fn config(db: &str) -> JsValue {
    js(&json!({"dbName": db, "attemptTimeoutMs": 1}))
}

async fn start(db: &str, early: JsValue) -> sw_outbox::worker::Outbox {
    sw_outbox::worker::start(config(db), early)
        .await
        .unwrap_or_else(|e| panic!("start: {e:?}"))
}

fn write(path: &str) -> Request {
    let h = Headers::new().expect("headers");
    h.set("Content-Type", "application/json").expect("header");
    let init = RequestInit::new();
    init.set_method("POST");
    init.set_headers(&h);
    init.set_body(&JsValue::from_str("{\"title\":\"t\"}"));
    let origin = js_sys::global()
        .unchecked_into::<ServiceWorkerGlobalScope>()
        .location()
        .origin();
    Request::new_with_str_and_init(&format!("{origin}{path}"), &init).expect("request")
}

/// A write queued as after a network failure: its status.
async fn queue_one(o: &sw_outbox::worker::Outbox, path: &str) -> u16 {
    o.assume_network_failed_for_tests();
    let resp: Response = JsFuture::from(o.handle_fetch(write(path), None))
        .await
        .expect("answers")
        .unchecked_into();
    resp.status()
}

async fn command(o: &sw_outbox::worker::Outbox, data: Value) -> Value {
    support::command(o, &js(&data)).await
}

async fn listed(o: &sw_outbox::worker::Outbox) -> Value {
    let l = command(o, json!({"type": "LIST_QUEUE"})).await;
    assert_eq!(l["type"], "QUEUE_STATE", "{l}");
    l
}

/// A database with alice's session and two queued writes, made by a start of its own.
async fn a_database_in_use() -> String {
    let db = unique("early");
    let o = start(&db, JsValue::UNDEFINED).await;
    let out = command(&o, json!({"type": "AUTH_SESSION", "userId": "alice"})).await;
    assert_eq!(out["ok"], true, "{out}");
    assert_eq!(queue_one(&o, "/api/projects/p1/tasks").await, 202);
    assert_eq!(queue_one(&o, "/api/projects/p2/tasks").await, 202);
    db
}

#[wasm_bindgen_test]
async fn a_start_on_what_sw_js_opened_and_read_sees_what_its_own_reading_sees() {
    let db = a_database_in_use().await;
    let early = handover(&db).await;
    assert!(
        !early.is_null(),
        "an existing database at the module's version is opened"
    );
    let rows = get(&early, "rows");
    assert!(rows.is_object(), "and its rows read");
    assert_eq!(
        js_sys::Array::from(&get(&rows, "all")).length(),
        2,
        "every record, in the one read"
    );
    let adopted = listed(&start(&db, early).await).await;
    let own = listed(&start(&db, JsValue::UNDEFINED).await).await;
    assert_eq!(adopted["account"], "alice", "{adopted}");
    assert_eq!(
        adopted["records"].as_array().map(Vec::len),
        Some(2),
        "{adopted}"
    );
    assert_eq!(adopted, own);
    // The adopting outbox goes on using the connection: it queues and lists a third.
    let o = start(&db, handover(&db).await).await;
    assert_eq!(queue_one(&o, "/api/projects/p3/tasks").await, 202);
    assert_eq!(
        listed(&o).await["records"].as_array().map(Vec::len),
        Some(3)
    );
}

#[wasm_bindgen_test]
async fn a_database_that_does_not_exist_yet_is_left_to_the_module() {
    let db = unique("early-new");
    assert!(
        handover(&db).await.is_null(),
        "nothing to adopt: the upgrade is the module's"
    );
    // Had sw.js created it (at the module's version, without the module's stores), the
    // module would find nothing to upgrade and could not store this write.
    let o = start(&db, JsValue::UNDEFINED).await;
    assert_eq!(queue_one(&o, "/api/projects/p1/tasks").await, 202);
    assert_eq!(
        listed(&o).await["records"].as_array().map(Vec::len),
        Some(1)
    );
}

#[wasm_bindgen_test]
async fn a_connection_to_another_database_is_not_used() {
    let db = a_database_in_use().await;
    let other = a_database_in_use().await;
    let o = start(&db, handover(&other).await).await;
    assert_eq!(queue_one(&o, "/api/projects/p3/tasks").await, 202);
    assert_eq!(
        listed(&o).await["records"].as_array().map(Vec::len),
        Some(3),
        "its own database's two and the new one"
    );
    let theirs = listed(&start(&other, JsValue::UNDEFINED).await).await;
    assert_eq!(
        theirs["records"].as_array().map(Vec::len),
        Some(2),
        "{theirs}"
    );
}
