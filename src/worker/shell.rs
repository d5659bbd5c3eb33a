//! The app shell's part that needs the outbox (contract 8, r2): after `CLEAR_DEVICE`
//! the precached shell is fetched again.
//!
//! The shell's answers themselves (network first, the precached copy when the network
//! fails or answers a server error: `core::shell`'s rule) are given by `www/sw.js`
//! without the module (r3: a cold start never makes a page wait for it); that JavaScript
//! is held to `core::shell` by tests/service_worker_route.rs.

use super::http::send;
use super::{scope, Inner};
use crate::core::shell;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use web_sys::{Cache, Response, ResponseInit};

/// After `CLEAR_DEVICE`: every `precache` entry of this build's cache is fetched again,
/// so that no page cached while the previous account was signed in survives the clear
/// (contract 8, r2). An entry that cannot be fetched now (offline) is deleted instead;
/// `www/sw.js` adds missing entries back at the worker's next start.
///
/// The copies are fetched first, each within `attemptTimeoutMs`, outside the origin's
/// caches lock; the cache is then checked, opened and written under that lock, as
/// `restoreShell` does (issue 34, 8e): never held across a fetch, never racing an
/// activation's cleanup.
pub(crate) async fn refresh(inner: &Inner) {
    let name = shell::cache_name(&inner.config.build);
    let mut fresh: Vec<(String, Option<Response>)> = Vec::new();
    for url in &inner.config.precache {
        let copy = fetch_copy(url, inner.config.attempt_timeout_ms).await;
        fresh.push((url.clone(), copy));
    }
    super::chain::under_web_lock(
        shell::CACHES_LOCK,
        Box::pin(async move { write_copies(&name, fresh).await }),
    )
    .await;
}

/// A fresh copy of `url` from the network (never the HTTP cache), read whole within
/// `timeout_ms`; `None` when it cannot be had now.
async fn fetch_copy(url: &str, timeout_ms: u32) -> Option<Response> {
    // `no-store`, not `reload`: Firefox's offline mode answers a `reload` from its
    // HTTP cache (seen), which would keep the previous account's copy.
    let init = web_sys::RequestInit::new();
    init.set_cache(web_sys::RequestCache::NoStore);
    let (response, deadline) = send(&init, url, timeout_ms, None).await.ok()?;
    if !response.ok() {
        return None;
    }
    let bytes = JsFuture::from(response.array_buffer().ok()?).await.ok()?;
    drop(deadline);
    let out = ResponseInit::new();
    out.set_status(response.status());
    out.set_status_text(&response.status_text());
    out.set_headers(&response.headers());
    Response::new_with_opt_buffer_source_and_init(Some(bytes.unchecked_ref()), &out).ok()
}

/// Writes the copies into the cache `name` when it still exists (under the caches lock).
async fn write_copies(name: &str, fresh: Vec<(String, Option<Response>)>) {
    let Ok(caches) = scope().caches() else { return };
    if JsFuture::from(caches.has(name)).await.ok() != Some(JsValue::TRUE) {
        return;
    }
    let Ok(cache) = JsFuture::from(caches.open(name)).await else {
        return;
    };
    let cache: Cache = cache.unchecked_into();
    for (url, copy) in fresh {
        let done = match copy {
            Some(response) => JsFuture::from(cache.put_with_str(&url, &response)).await,
            None => JsFuture::from(cache.delete_with_str(&url)).await,
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
