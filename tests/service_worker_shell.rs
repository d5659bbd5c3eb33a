//! The app shell inside a real service worker, with real Cache Storage
//! (`wasm-pack test --headless --chrome`).
//!
//! Limit: a navigation `Request` (mode `navigate`) cannot be constructed in a worker —
//! only the browser makes them — so `Outbox::intercepts`' navigation branch is covered by
//! the host tests of `core::shell` and by tests/e2e/app-shell.test.mjs. Here the answer
//! part is tested on plain values: what the network did (a real failed fetch, or a
//! response with a status) and a cache named like the build's.
#![cfg(target_arch = "wasm32")]

use serde::Serialize;
use sw_outbox::core::shell::cache_name;
use sw_outbox::worker::shell::{answer, cached};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::*;
use web_sys::{Cache, Headers, Request, Response, ResponseInit, ServiceWorkerGlobalScope};

wasm_bindgen_test_configure!(run_in_service_worker);

const SHELL: &str = "<!doctype html><title>shell</title><p>the cached shell";

fn scope() -> ServiceWorkerGlobalScope {
    js_sys::global().unchecked_into()
}

fn origin() -> String {
    scope().location().origin()
}

fn unique(name: &str) -> String {
    format!("{name}-{}", js_sys::Math::random().to_bits())
}

fn response(status: u16, body: &str) -> Response {
    let init = ResponseInit::new();
    init.set_status(status);
    let headers = Headers::new().expect("headers");
    headers
        .set("Content-Type", "text/html; charset=utf-8")
        .expect("header");
    init.set_headers(&headers);
    Response::new_with_opt_str_and_init(Some(body), &init).expect("response")
}

/// A cache named like a build's, holding the shell under `url`.
async fn populate(build: &str, url: &str) -> String {
    let name = cache_name(build);
    let caches = scope().caches().expect("caches");
    let cache: Cache = JsFuture::from(caches.open(&name))
        .await
        .expect("opens")
        .unchecked_into();
    JsFuture::from(cache.put_with_str(url, &response(200, SHELL)))
        .await
        .expect("puts");
    name
}

async fn has_cache(name: &str) -> bool {
    JsFuture::from(scope().caches().expect("caches").has(name))
        .await
        .expect("has")
        == JsValue::TRUE
}

async fn text(r: Response) -> (u16, String) {
    let status = r.status();
    let body = JsFuture::from(r.text().expect("text"))
        .await
        .expect("body")
        .as_string()
        .unwrap_or_default();
    (status, body)
}

/// A real network failure: nothing listens on the discard port.
async fn failed_fetch() -> Result<Response, JsValue> {
    JsFuture::from(scope().fetch_with_str("http://127.0.0.1:9/page"))
        .await
        .map(JsCast::unchecked_into)
}

#[wasm_bindgen_test]
async fn a_failed_navigation_is_answered_from_the_builds_cache() {
    let url = format!("{}/", origin());
    let build = unique("b");
    let name = populate(&build, &url).await;
    let network = failed_fetch().await;
    assert!(network.is_err(), "the discard port must refuse");
    let (status, body) = text(answer(network, &name, &url).await.expect("the shell")).await;
    assert_eq!(status, 200);
    assert_eq!(body, SHELL);
}

#[wasm_bindgen_test]
async fn server_errors_fall_back_and_other_answers_pass_through() {
    let url = format!("{}/index.html", origin());
    let name = populate(&unique("b"), &url).await;
    for s in [500, 502, 503, 504] {
        let (status, body) = text(
            answer(Ok(response(s, "down")), &name, &url)
                .await
                .expect("answers"),
        )
        .await;
        assert_eq!((status, body.as_str()), (200, SHELL), "after a {s}");
    }
    for s in [200, 404, 501] {
        let (status, body) = text(
            answer(Ok(response(s, "the server's")), &name, &url)
                .await
                .expect("answers"),
        )
        .await;
        assert_eq!(
            (status, body.as_str()),
            (s, "the server's"),
            "a {s} is the page's"
        );
    }
}

#[wasm_bindgen_test]
async fn without_this_builds_shell_the_network_answer_stands() {
    let url = format!("{}/", origin());
    // An older build's cache holds a shell; this build's has none.
    populate(&unique("old"), &url).await;
    let current = cache_name(&unique("new"));
    assert!(answer(failed_fetch().await, &current, &url).await.is_err());
    let (status, body) = text(
        answer(Ok(response(503, "down")), &current, &url)
            .await
            .expect("answers"),
    )
    .await;
    assert_eq!((status, body.as_str()), (503, "down"));
    assert!(
        !has_cache(&current).await,
        "looking does not create the cache"
    );
    // The right cache without that URL: the same.
    let name = populate(&unique("b"), &format!("{}/other.html", origin())).await;
    assert!(cached(&name, &url).await.is_none());
}

async fn outbox(config: serde_json::Value) -> Result<sw_outbox::worker::Outbox, String> {
    let cfg = config
        .serialize(&serde_wasm_bindgen::Serializer::json_compatible())
        .expect("js");
    sw_outbox::worker::start(cfg)
        .await
        .map_err(|e| e.as_string().unwrap_or_default())
}

#[wasm_bindgen_test]
async fn only_precached_files_are_intercepted_and_shell_url_must_be_precached() {
    let root = format!("{}/", origin());
    let o = outbox(serde_json::json!({
        "dbName": unique("shell"),
        "precache": [root.clone(), format!("{}/app.js", origin())],
    }))
    .await
    .expect("starts");
    // A page's fetch (mode cors, not a navigation) of a file outside precache is not
    // intercepted.
    assert!(
        !o.intercepts(&Request::new_with_str(&format!("{}/other.js", origin())).expect("request"))
    );
    // A precached file of the shell is: network first. The test server has no such
    // file; its 404 is not a reason to fall back, so it passes through.
    let asset = Request::new_with_str(&format!("{}/app.js", origin())).expect("request");
    assert!(o.intercepts(&asset));
    let r: Response = JsFuture::from(o.handle_fetch(asset, None))
        .await
        .expect("answers")
        .unchecked_into();
    assert_eq!(r.status(), 404);
    let err = match outbox(serde_json::json!({
        "dbName": unique("shell"),
        "precache": [root],
        "shellUrl": format!("{}/offline.html", origin()),
    }))
    .await
    {
        Ok(_) => panic!("a shellUrl outside precache must be refused"),
        Err(e) => e,
    };
    assert!(err.contains("shellUrl"), "{err}");
}
