//! The route rule's two statements side by side, inside a real service worker
//! (`wasm-pack test --headless --chrome`, `--firefox`, `--safari`): `core::route::owner`
//! (through the started module, with the browser's own URL parser and RegExp) and its
//! JavaScript mirror in `www/sw.js` (`swOutboxRoute`, which decides before the module has
//! loaded, contract 1, r3). The mirror is the part of sw.js between its `route: begin`
//! and `route: end` lines, evaluated here on its own. They must agree on every route
//! class: same origin or not, `apiPrefix`, methods, auth routes, navigations with and
//! without a shell, the API base itself, odd and encoded URLs, queries and fragments.
//!
//! The answers that part gives without the module are checked too, with real Cache
//! Storage: the shell's (network first, the build's cached copy after a failure or a
//! server error; `core::shell`), a read's offline answer (`SyntheticAnswer::offline`),
//! and a write's while the module cannot start (503, never claimed queued).
#![cfg(target_arch = "wasm32")]

use serde_json::{json, Value};
use sw_outbox::core::config::Config;
use sw_outbox::core::first_attempt::SyntheticAnswer;
use sw_outbox::core::shell::{cache_name, is_page, use_shell, NetworkOutcome};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use wasm_bindgen_test::*;
use web_sys::{Cache, Headers, Request, Response, ResponseInit, ServiceWorkerGlobalScope};

mod support;
use support::{get, js, part_of_sw_js, unique};

wasm_bindgen_test_configure!(run_in_service_worker);

const SHELL: &str = "<!doctype html><title>shell</title><p>the cached shell";

fn scope() -> ServiceWorkerGlobalScope {
    js_sys::global().unchecked_into()
}

fn origin() -> String {
    scope().location().origin()
}

/// The route part of sw.js, evaluated on its own with the generated block it reads
/// (tests/sw_rules.rs writes that block from the Rust); its functions by name.
fn mirror() -> JsValue {
    let generated = part_of_sw_js("generated from Rust");
    let part = part_of_sw_js("route");
    js_sys::Function::new_no_args(&format!(
        "{generated}\n{part}\nreturn {{ swOutboxRoute, CONFIG_DEFAULTS, SHELL_STATUSES, isPage, shellAnswer, \
         networkOrOffline, notStarted, withoutOutboxHeaders }};"
    ))
    .call0(&JsValue::NULL)
    .expect("the route part of sw.js evaluates on its own")
}

fn call(f: &JsValue, args: &[JsValue]) -> JsValue {
    let f: &js_sys::Function = f.unchecked_ref();
    f.apply(&JsValue::NULL, &args.iter().collect::<js_sys::Array>())
        .expect("call")
}

async fn settle(p: JsValue) -> Result<JsValue, JsValue> {
    JsFuture::from(js_sys::Promise::resolve(&p)).await
}

async fn outbox(config: &Value) -> Result<sw_outbox::worker::Outbox, String> {
    sw_outbox::worker::start(js(config), JsValue::UNDEFINED)
        .await
        .map_err(|e| e.as_string().unwrap_or_default())
}

/// What the mirror says, in `route_for_tests`' words.
fn mirror_says(route: &JsValue, method: &str, url: &str, navigate: bool) -> String {
    let r = call(
        route,
        &[method.into(), url.into(), JsValue::from_bool(navigate)],
    );
    if r.is_null() {
        "not-ours".into()
    } else if let Some(kind) = r.as_string() {
        kind
    } else {
        format!(
            "shell {}",
            get(&r, "shell").as_string().expect("a shell URL")
        )
    }
}

/// Every URL class the rule must tell apart, as the browser hands them to a fetch
/// listener (absolute, normalised) plus a few it never would (unparsable).
fn urls() -> Vec<String> {
    let o = origin();
    let rel = [
        "/",
        "/index.html",
        "/INDEX.HTM",
        "/start",
        "/app.js",
        "/app.js?v=1",
        "/app.js#part",
        "/app.css",
        "/offline.html",
        "/projects/p1?tab=2",
        "/api",
        "/api?x=1",
        "/api/",
        "/api//x",
        "/api/notes",
        "/api/projects/1/tasks?x=1",
        "/api/projects/a%20b/tasks",
        "/api/projects/\u{fc}/tasks",
        "/api/auth",
        "/api/auth/",
        "/api/auth?next=/",
        "/api/auth/login",
        "/api/AUTH/me",
        "/api/authors",
        "/api/login",
        "/api/refresh?x=1",
        "/api/tokenizer",
        "/login",
        "/LOGIN",
        "/login.html",
        "/oauth/callback?code=1",
        "/accounts/logout/",
        "/API/notes",
        "/apiary",
        "/api%2Fnotes",
        "/%61pi/notes",
        "/api/../index.html",
        "/?next=/api/notes",
        "/v1/api/things",
        "/v1/api/login",
        "/v1/api",
        "/v1/apix",
    ];
    let mut out: Vec<String> = rel
        .iter()
        .map(|p| web_sys::Url::new_with_base(p, &o).expect("url").href())
        .collect();
    out.extend(
        [
            "https://other.example/api/notes",
            "https://other.example/",
            "http://127.0.0.1:1/api/notes",
            "https://cdn.example/lib.js",
            "data:text/plain,hi",
            "not a url",
            "",
        ]
        .map(String::from),
    );
    out.push(format!("blob:{o}/0a1b"));
    out.push(format!("{o}/api/notes").replacen("http", "HTTP", 1));
    out
}

const METHODS: [&str; 10] = [
    "GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE", "patch", "get", "PROPFIND",
];

/// The configurations the rule reads differently: the default, shells chosen in each
/// way, a prefix and auth pattern of the site's, the whole origin as the API, a prefix
/// with a doubled slash, precache entries of other origins and with queries.
fn configs() -> Vec<Value> {
    let o = origin();
    let u = |p: &str| format!("{o}{p}");
    vec![
        json!({}),
        json!({ "precache": [u("/"), u("/app.js"), u("/index.html")] }),
        json!({ "precache": [u("/app.css"), u("/start"), u("/app.js?v=1")] }),
        json!({ "precache": [u("/"), u("/offline.html")], "shellUrl": u("/offline.html") }),
        json!({ "precache": [u("/app.js"), "https://cdn.example/lib.js"] }),
        json!({ "apiPrefix": "/v1/api/", "authRoutePattern": "^/v1/api/(login|logout)", "precache": [u("/")] }),
        json!({ "apiPrefix": "/" , "precache": [u("/")] }),
        json!({ "apiPrefix": "/api//", "precache": [u("/index.html")] }),
    ]
}

#[wasm_bindgen_test]
async fn the_mirror_decides_every_route_class_as_the_rust_rule_does() {
    let m = mirror();
    let make = get(&m, "swOutboxRoute");
    let mut checked = 0;
    for config in configs() {
        let mut with_db = config.clone();
        with_db["dbName"] = unique("route").into();
        let o = outbox(&with_db).await.expect("the module starts");
        let route = call(&make, &[js(&config), origin().into()]);
        for url in urls() {
            for method in METHODS {
                for navigate in [false, true] {
                    let rust = o.route_for_tests(method, &url, navigate);
                    let js = mirror_says(&route, method, &url, navigate);
                    assert_eq!(
                        js, rust,
                        "{method} {url:?} navigate={navigate} under {config}"
                    );
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, configs().len() * urls().len() * METHODS.len() * 2);
}

#[wasm_bindgen_test]
async fn the_rule_tells_the_classes_apart() {
    // The agreement above could hold for a rule that says the same of everything: a few
    // classes, spelled out.
    let o = origin();
    let config =
        json!({ "dbName": unique("route"), "precache": [format!("{o}/"), format!("{o}/app.js")] });
    let out = outbox(&config).await.expect("starts");
    let at = |m, p: &str, nav| out.route_for_tests(m, &format!("{o}{p}"), nav);
    assert_eq!(at("POST", "/api/notes", false), "write");
    assert_eq!(at("PATCH", "/api/projects/1/tasks/2", false), "write");
    assert_eq!(at("GET", "/api/notes", false), "read");
    assert_eq!(at("POST", "/api/auth/login", false), "auth");
    assert_eq!(at("GET", "/api/auth/login", true), "auth");
    assert_eq!(at("GET", "/projects/p1", true), format!("shell {o}/"));
    assert_eq!(at("GET", "/app.js", false), format!("shell {o}/app.js"));
    assert_eq!(at("GET", "/other.js", false), "not-ours");
    assert_eq!(at("GET", "/api", true), "not-ours");
    assert_eq!(at("POST", "/form", true), "not-ours");
    // r4: the default pattern's sign-ins, under the prefix and outside it (observed).
    assert_eq!(at("POST", "/api/login", false), "auth");
    assert_eq!(at("POST", "/api/refresh", false), "auth");
    assert_eq!(at("POST", "/login", true), "observe");
    assert_eq!(at("GET", "/oauth/callback?code=1", true), "observe");
    assert_eq!(at("POST", "/api/tokenizer", false), "write");
    assert_eq!(
        out.route_for_tests("POST", "https://other.example/api/notes", false),
        "not-ours"
    );
}

#[wasm_bindgen_test]
fn the_mirrors_defaults_and_statuses_are_the_rusts() {
    let m = mirror();
    let d = Config::default();
    let defaults = get(&m, "CONFIG_DEFAULTS");
    assert_eq!(get(&defaults, "apiPrefix").as_string(), Some(d.api_prefix));
    assert_eq!(
        get(&defaults, "authRoutePattern").as_string(),
        Some(d.auth_route_pattern)
    );
    assert_eq!(
        get(&defaults, "expectedAccountHeader").as_string(),
        Some(d.expected_account_header)
    );
    let statuses: js_sys::Array = get(&m, "SHELL_STATUSES").unchecked_into();
    for s in 0..=599u16 {
        assert_eq!(
            statuses.includes(&JsValue::from(s), 0),
            use_shell(NetworkOutcome::Status(s)),
            "status {s}"
        );
    }
    let page = get(&m, "isPage");
    for u in [
        "/",
        "./",
        ".",
        "/index.html",
        "/INDEX.HTM",
        "/app/shell",
        "https://a.example",
        "https://a.example/",
        "https://a.example/start?x=1.js",
        "/app.js",
        "/app.css",
        "./icon.svg",
        "https://a.example/m.webmanifest",
        "/a.b/c",
        "/a/b.c#d",
        "",
    ] {
        assert_eq!(
            call(&page, &[u.into()]).as_bool(),
            Some(is_page(u)),
            "{u:?}"
        );
    }
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

async fn text(r: JsValue) -> (u16, String) {
    let r: Response = r.unchecked_into();
    let status = r.status();
    let body = JsFuture::from(r.text().expect("text"))
        .await
        .expect("body")
        .as_string()
        .unwrap_or_default();
    (status, body)
}

/// A real network failure: nothing listens on the discard port.
fn failed_fetch() -> JsValue {
    scope().fetch_with_str("http://127.0.0.1:9/page").into()
}

async fn shell_answer(network: JsValue, cache: &str, url: &str) -> Result<JsValue, JsValue> {
    let f = get(&mirror(), "shellAnswer");
    settle(call(&f, &[network, cache.into(), url.into()])).await
}

fn ok(r: Response) -> JsValue {
    js_sys::Promise::resolve(&r).into()
}

#[wasm_bindgen_test]
async fn a_failed_navigation_is_answered_from_the_builds_cache() {
    let url = format!("{}/", origin());
    let name = populate(&unique("b"), &url).await;
    assert!(
        settle(failed_fetch()).await.is_err(),
        "the discard port must refuse"
    );
    let answer = shell_answer(failed_fetch(), &name, &url).await;
    let (status, body) = text(answer.expect("the shell")).await;
    assert_eq!((status, body.as_str()), (200, SHELL));
}

#[wasm_bindgen_test]
async fn server_errors_fall_back_and_other_answers_pass_through() {
    let url = format!("{}/index.html", origin());
    let name = populate(&unique("b"), &url).await;
    for s in [500, 502, 503, 504] {
        let answer = shell_answer(ok(response(s, "down")), &name, &url).await;
        let (status, body) = text(answer.expect("answers")).await;
        assert_eq!((status, body.as_str()), (200, SHELL), "after a {s}");
    }
    for s in [200, 404, 501] {
        let answer = shell_answer(ok(response(s, "the server's")), &name, &url).await;
        let (status, body) = text(answer.expect("answers")).await;
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
    assert!(shell_answer(failed_fetch(), &current, &url).await.is_err());
    let answer = shell_answer(ok(response(503, "down")), &current, &url).await;
    let (status, body) = text(answer.expect("answers")).await;
    assert_eq!((status, body.as_str()), (503, "down"));
    assert!(
        !has_cache(&current).await,
        "looking does not create the cache"
    );
    // The right cache without that URL: the same.
    let name = populate(&unique("b"), &format!("{}/other.html", origin())).await;
    let answer = shell_answer(ok(response(502, "bad gateway")), &name, &url).await;
    assert_eq!(text(answer.expect("answers")).await.0, 502);
}

#[wasm_bindgen_test]
async fn answers_without_the_module_have_the_modules_shapes() {
    let m = mirror();
    // A read whose network fails: the module's own offline answer.
    let read = Request::new_with_str("http://127.0.0.1:9/api/notes").expect("request");
    let answer = settle(call(&get(&m, "networkOrOffline"), &[read.into()]))
        .await
        .expect("answers");
    let (status, body) = text(answer).await;
    let offline = SyntheticAnswer::offline();
    assert_eq!(status, offline.status);
    assert_eq!(
        serde_json::from_str::<Value>(&body).expect("JSON"),
        offline.body
    );
    // A write while the module cannot start: 503, not queued, with the reason.
    let refused = call(&get(&m, "notStarted"), &["IndexedDB refused".into()]);
    let (status, body) = text(refused).await;
    assert_eq!(status, 503);
    let body: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(body["queued"], json!(false));
    let error = body["error"].as_str().expect("an error text");
    assert!(
        error.contains("could not start") && error.contains("IndexedDB refused"),
        "{error}"
    );
    assert_eq!(body, SyntheticAnswer::not_started("IndexedDB refused").body);
    // A reason holding `$&` or the slot itself is written as it is.
    let odd = call(&get(&m, "notStarted"), &["$& {why}".into()]);
    let (_, body) = text(odd).await;
    let body: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(body, SyntheticAnswer::not_started("$& {why}").body);
}

#[wasm_bindgen_test]
fn an_auth_request_loses_the_outboxs_headers_and_only_those() {
    let m = mirror();
    let strip = get(&m, "withoutOutboxHeaders");
    let headers = Headers::new().expect("headers");
    for (k, v) in [
        ("Idempotency-Key", "k1"),
        ("X-PM-Expected-Account", "alice"),
        ("X-Account", "bob"),
        ("X-CSRF-Token", "t"),
    ] {
        headers.set(k, v).expect("header");
    }
    let init = web_sys::RequestInit::new();
    init.set_method("POST");
    init.set_headers(&headers);
    let url = format!("{}/api/auth/login", origin());
    let request = Request::new_with_str_and_init(&url, &init).expect("request");
    let has = |r: &JsValue, name: &str| {
        r.unchecked_ref::<Request>()
            .headers()
            .has(name)
            .expect("has")
    };
    let request: JsValue = request.into();
    let default = call(&strip, &[request.clone(), js(&json!({}))]);
    assert!(!has(&default, "Idempotency-Key"));
    assert!(!has(&default, "X-PM-Expected-Account"));
    assert!(has(&default, "X-Account") && has(&default, "X-CSRF-Token"));
    let custom = call(
        &strip,
        &[request, js(&json!({"expectedAccountHeader": "X-Account"}))],
    );
    assert!(!has(&custom, "X-Account") && !has(&custom, "Idempotency-Key"));
    assert!(has(&custom, "X-PM-Expected-Account"));
}
