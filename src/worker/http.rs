//! Requests and answers: the first attempt's timeout, replay requests built from
//! records, identity checks, and the worker's own JSON answers.

use crate::core::first_attempt::SyntheticAnswer;
use crate::core::identity::{read_identity, Identity};
use serde_json::Value;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use web_sys::{
    AbortController, Headers, Request, RequestCache, RequestCredentials, RequestInit, Response,
    ResponseInit,
};

use super::scope;

/// Sends a request, aborting it after `timeout_ms`. `Err` is a network failure or the
/// timeout: in both cases no answer was seen.
pub async fn fetch_with_timeout(
    init: &RequestInit,
    url: &str,
    timeout_ms: u32,
) -> Result<Response, JsValue> {
    let controller = AbortController::new()?;
    init.set_signal(Some(&controller.signal()));
    let request = Request::new_with_str_and_init(url, init)?;
    let timer = gloo_timers::callback::Timeout::new(timeout_ms, move || controller.abort());
    let answer = JsFuture::from(scope().fetch_with_request(&request)).await;
    drop(timer);
    answer.map(JsCast::unchecked_into)
}

/// Plain network fetch of a page's request (reads, and requests that are not ours).
pub async fn fetch_request(request: &Request) -> Result<Response, JsValue> {
    JsFuture::from(scope().fetch_with_request(request))
        .await
        .map(JsCast::unchecked_into)
}

/// The body of an answer as JSON, when it is JSON (error bodies carry the idempotency
/// codes). Reading consumes the answer; callers use it only for their own requests.
/// The browser parses it: the module carries no JSON parser of its own.
pub async fn json_body(response: &Response) -> Option<Value> {
    let parsed = JsFuture::from(response.json().ok()?).await.ok()?;
    crate::js::from_value(parsed).ok()
}

pub fn header(headers: &Headers, name: &str) -> Option<String> {
    headers.get(name).ok().flatten()
}

/// `GET authMePath` with credentials and no cache; with `expected` set, the
/// expected-account header too. `None` on a network failure.
pub async fn identity(
    url: &str,
    expected: Option<(&str, &str)>,
    timeout_ms: u32,
) -> Option<Identity> {
    let init = RequestInit::new();
    init.set_method("GET");
    init.set_credentials(RequestCredentials::Include);
    init.set_cache(RequestCache::NoStore);
    if let Some((name, owner)) = expected {
        let headers = Headers::new().ok()?;
        headers.set(name, owner).ok()?;
        init.set_headers(&headers);
    }
    let response = fetch_with_timeout(&init, url, timeout_ms).await.ok()?;
    let csrf = header(&response.headers(), "X-CSRF-Token");
    let status = response.status();
    let body = json_body(&response).await;
    Some(read_identity(status, body.as_ref(), csrf.as_deref()))
}

/// A JSON answer made up by the worker, written by the browser's `JSON.stringify` (the
/// same bytes as serde_json's compact form for these bodies).
pub fn json_response(answer: &SyntheticAnswer) -> Result<Response, JsValue> {
    let init = ResponseInit::new();
    init.set_status(answer.status);
    let headers = Headers::new()?;
    headers.set("Content-Type", "application/json")?;
    headers.set("Cache-Control", "no-store")?;
    init.set_headers(&headers);
    let body = crate::js::to_value(&answer.body).map_err(|e| JsValue::from_str(&e.to_string()))?;
    let text = js_sys::JSON::stringify(&body)?;
    Response::new_with_opt_str_and_init(text.as_string().as_deref(), &init)
}
