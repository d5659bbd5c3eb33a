//! The app shell's part that needs the outbox (contract 8, r2): after `CLEAR_DEVICE`
//! the precached shell is fetched again.
//!
//! The shell's answers themselves (network first, the precached copy when the network
//! fails or answers a server error: `core::shell`'s rule) are given by `www/sw.js`
//! without the module (r3: a cold start never makes a page wait for it); that JavaScript
//! is held to `core::shell` by tests/service_worker_route.rs.

use super::http::fetch_request;
use super::{scope, Inner};
use crate::core::shell;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use web_sys::{Cache, Request, Response};

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
