//! The app shell in the browser (contract section 9): navigations (and the precached
//! files of the shell itself) go to the network first; when it fails, or answers
//! 500/502/503/504, the copy precached at install in this build's cache answers
//! instead. Nothing is ever written to a cache here: API answers (and pages) are never
//! cached at run time.
//!
//! Every decision is `core::shell`'s, on plain values: a navigation `Request` cannot be
//! constructed inside a worker (only the browser makes them), so [`answer`] takes the
//! network's outcome and is what the service-worker tests exercise.

use super::fetch::locate;
use super::http::fetch_request;
use super::{scope, Inner};
use crate::core::shell::{self, NetworkOutcome, ShellRequest};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use web_sys::{Cache, Request, RequestMode, Response, ResponseInit};

/// The cached URL that answers this request when the network fails, `None` when the
/// request is not the shell's (decided synchronously, by `core::shell::fallback_for`).
pub(crate) fn fallback_for<'c>(inner: &'c Inner, request: &Request) -> Option<&'c str> {
    let (same_origin, path) = locate(request)?;
    let url = request.url();
    shell::fallback_for(
        &ShellRequest {
            navigate: request.mode() == RequestMode::Navigate,
            same_origin,
            method: &request.method(),
            path: &path,
            url: &url,
        },
        &inner.config,
    )
}

/// Whether the shell handles this request.
pub(crate) fn handles(inner: &Inner, request: &Request) -> bool {
    fallback_for(inner, request).is_some()
}

/// Network first; the cached copy when the network fails or answers a server error.
pub(crate) async fn handle(inner: &Inner, request: Request) -> Result<Response, JsValue> {
    let fallback = fallback_for(inner, &request).map(str::to_owned);
    let network = fetch_request(&request).await;
    match fallback {
        Some(url) => answer(network, &shell::cache_name(&inner.config.build), &url).await,
        None => network,
    }
}

/// The answer given what the network did: the network's own answer, or the cached
/// `url` from `cache_name` when `core::shell::use_shell` says so and that copy is
/// there. Without a cached copy the network's answer (or failure) stands.
pub async fn answer(
    network: Result<Response, JsValue>,
    cache_name: &str,
    url: &str,
) -> Result<Response, JsValue> {
    let outcome = match &network {
        Ok(r) => NetworkOutcome::Status(r.status()),
        Err(_) => NetworkOutcome::Failed,
    };
    if !shell::use_shell(outcome) {
        return network;
    }
    match cached(cache_name, url).await {
        Some(shell) => Ok(shell),
        None => network,
    }
}

/// The response stored under `url` in the cache `cache_name`, if that cache exists
/// (it is not created) and holds it.
pub async fn cached(cache_name: &str, url: &str) -> Option<Response> {
    let caches = scope().caches().ok()?;
    if JsFuture::from(caches.has(cache_name)).await.ok()? != JsValue::TRUE {
        return None;
    }
    let cache: Cache = JsFuture::from(caches.open(cache_name))
        .await
        .ok()?
        .unchecked_into();
    let found = JsFuture::from(cache.match_with_str(url)).await.ok()?;
    let response: Response = found.dyn_into().ok()?;
    if !response.redirected() {
        return Some(response);
    }
    // A response that followed a redirect may not answer a navigation (browsers refuse
    // it); the same bytes and headers in a fresh response may.
    let body = JsFuture::from(response.array_buffer().ok()?).await.ok()?;
    let init = ResponseInit::new();
    init.set_status(response.status());
    init.set_status_text(&response.status_text());
    init.set_headers(&response.headers());
    Response::new_with_opt_buffer_source_and_init(Some(body.unchecked_ref()), &init).ok()
}

/// After `CLEAR_DEVICE`: every `precache` entry of this build's cache is fetched again,
/// so that no page cached while the previous account was signed in survives the clear
/// (contract 8, r2). An entry that cannot be fetched now (offline) is deleted instead;
/// `www/sw.js` adds missing entries back at the worker's next start.
pub(crate) async fn refresh(inner: &Inner) {
    let name = shell::cache_name(&inner.config.build);
    let Ok(caches) = scope().caches() else { return };
    if JsFuture::from(caches.has(&name)).await.ok() != Some(JsValue::TRUE) {
        return;
    }
    let Ok(cache) = JsFuture::from(caches.open(&name)).await else {
        return;
    };
    let cache: Cache = cache.unchecked_into();
    for url in &inner.config.precache {
        // `no-store`, not `reload`: Firefox's offline mode answers a `reload` from its
        // HTTP cache (seen), which would keep the previous account's copy.
        let init = web_sys::RequestInit::new();
        init.set_cache(web_sys::RequestCache::NoStore);
        let fresh = match Request::new_with_str_and_init(url, &init) {
            Ok(req) => fetch_request(&req).await.ok().filter(Response::ok),
            Err(_) => None,
        };
        let done = match fresh {
            Some(response) => JsFuture::from(cache.put_with_str(url, &response)).await,
            None => JsFuture::from(cache.delete_with_str(url)).await,
        };
        if let Err(e) = done {
            web_sys::console::warn_1(
                &format!(
                    "sw-outbox: shell entry {url} not refreshed: {}",
                    super::describe(&e)
                )
                .into(),
            );
        }
    }
}
