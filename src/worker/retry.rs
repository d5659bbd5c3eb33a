//! The live worker's own retries, in every engine (contract 2.6, r2; 4.8, r3): a write
//! queued while the user stays on a page is delivered without waiting for a reload, and
//! a flush that stopped is tried again at its `retryAt`, whether or not Background Sync
//! fires again (Chromium's gives up after a few attempts, and never fires while its
//! permission is blocked).
//!
//! One timer at a time, set for the earliest retry asked for. The timer does not keep a
//! worker alive by itself; the event that set it is kept alive for it when it is near
//! ([`KEEP_ALIVE_MS`]), so the first retries happen even when the page then falls
//! silent. A worker the browser stops anyway is started again by the next event (a page,
//! a sync), whose start flush takes over.

use super::{describe, now_ms, scope, Inner};
use crate::channel::oneshot;
use crate::core::backoff::BASE_MS;
use js_sys::Reflect;
use std::cell::RefCell;
use std::rc::Rc;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::future_to_promise;
use wasm_bindgen_futures::JsFuture;

/// A retry this near is waited for by the event that scheduled it.
pub const KEEP_ALIVE_MS: u64 = 25_000;

/// What the timer runs when it fires: a flush, given by the worker's start so that this
/// module knows nothing of flushes (a flush arms the timer; the timer never reaches back).
pub type OnFire = fn(Rc<Inner>) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>;

pub struct RetryTimer {
    armed: RefCell<Option<Armed>>,
    on_fire: OnFire,
}

impl RetryTimer {
    pub fn new(on_fire: OnFire) -> RetryTimer {
        RetryTimer {
            armed: RefCell::new(None),
            on_fire,
        }
    }
}

struct Armed {
    at: u64,
    _timer: gloo_timers::callback::Timeout,
    waiters: Vec<oneshot::Sender<()>>,
}

/// Whether the browser replays queued writes itself (Background Sync).
pub fn has_background_sync() -> bool {
    js_sys::Reflect::get(&scope().registration(), &"sync".into())
        .is_ok_and(|s| !s.is_undefined() && !s.is_null())
}

/// Registers a Background Sync where the API exists (Chromium); elsewhere the other
/// triggers carry the replay. Registering a tag that is pending already changes nothing;
/// one that gave up after its retries is registered anew. Whether a sync is registered
/// (r3: the 202's and `MUTATION_QUEUED`'s `background`: the write can be delivered with
/// no page of the site open).
pub(crate) async fn register_sync(tag: &str) -> bool {
    let registration = scope().registration();
    let Ok(sync) = Reflect::get(&registration, &"sync".into()) else {
        return false;
    };
    let Some(register) = Reflect::get(&sync, &"register".into())
        .ok()
        .and_then(|f| f.dyn_into::<js_sys::Function>().ok())
    else {
        return false;
    };
    let Ok(p) = register.call1(&sync, &JsValue::from_str(tag)) else {
        return false;
    };
    let Ok(p) = p.dyn_into::<js_sys::Promise>() else {
        return false;
    };
    match JsFuture::from(p).await {
        Ok(_) => true,
        Err(e) => {
            web_sys::console::warn_1(
                &format!("sw-outbox: sync not registered: {}", describe(&e)).into(),
            );
            false
        }
    }
}

impl Inner {
    /// The sync for a write just queued (its `background`). Not registered while a sync
    /// event is being handled: the browser would fire it again as soon as that one ends,
    /// waking the worker (a stopped one included) for a sync that meets the same network
    /// the write just failed on. That event's rejection has the browser retry it later;
    /// when it is not retried, `handle_sync` registers the sync as it ends.
    pub(crate) async fn sync_for_queued(&self) -> bool {
        if self.background_sync && self.syncs_firing.get() > 0 {
            self.sync_owed.set(true);
            return true;
        }
        // A registration already on its way was asked for after this write's commit
        // began and answers after it: the sync it registers finds this write stored.
        // Joining it spares the browser one registration per write (each one a round
        // trip and a write of the registration's storage in Chromium).
        let joined = self.sync_joining.borrow_mut().as_mut().map(|joining| {
            let (tx, rx) = crate::channel::oneshot::channel();
            joining.push(tx);
            rx
        });
        if let Some(rx) = joined {
            return rx.await.unwrap_or(false);
        }
        *self.sync_joining.borrow_mut() = Some(Vec::new());
        let registered = register_sync(&self.config.sync_tag).await;
        for joined in self.sync_joining.take().unwrap_or_default() {
            let _ = joined.send(registered);
        }
        registered
    }
}

/// Whether a new version of the worker is installing or waiting. A worker that is being
/// replaced holds no event open for a retry: the new version activates only once this
/// one has no event left, and it runs the queue itself (its start flush).
fn update_pending() -> bool {
    let registration = scope().registration();
    registration.installing().is_some() || registration.waiting().is_some()
}

impl Inner {
    /// A new version appeared (`updatefound`): the events kept open for a retry are let
    /// go at once (the timer stays armed while this worker lives).
    pub(crate) fn release_kept_alive(&self) {
        let waiters = self
            .retry
            .armed
            .borrow_mut()
            .as_mut()
            .map(|a| std::mem::take(&mut a.waiters))
            .unwrap_or_default();
        for w in waiters {
            let _ = w.send(());
        }
    }

    /// The last flush stopped waiting for a trigger (signed out, or a 401): a retry armed
    /// by an earlier flush is no longer wanted (it would only ask `/auth/me` again, or
    /// send a record a 401 held, without the sign-in it waits for).
    pub(crate) fn disarm_retry(&self) {
        let armed = self.retry.armed.borrow_mut().take();
        for w in armed.map(|a| a.waiters).unwrap_or_default() {
            let _ = w.send(());
        }
    }

    /// A write was just queued: a flush soon (after the backoff allows it), where the
    /// browser has no Background Sync to deliver it (with it, the sync registered for the
    /// write does).
    pub(crate) fn retry_soon(self: &Rc<Self>) -> Option<js_sys::Promise> {
        if self.background_sync {
            return None;
        }
        self.schedule_retry(now_ms() + BASE_MS)
    }

    /// A flush ended and asked to be tried again at `at` (its `retryAt`; `None`: it
    /// awaits a trigger, or nothing is left). The promise settles once that retry ran,
    /// when it is near enough for an event to wait for it.
    pub(crate) fn retry_when(self: &Rc<Self>, at: Option<u64>) -> Option<js_sys::Promise> {
        self.schedule_retry(at?.max(now_ms() + 1))
    }

    /// Arms the timer for `at` unless it is armed for earlier already. The promise
    /// settles once that retry ran; `None` when it is too far to keep an event open for.
    fn schedule_retry(self: &Rc<Self>, at: u64) -> Option<js_sys::Promise> {
        let (tx, rx) = oneshot::channel();
        {
            let mut armed = self.retry.armed.borrow_mut();
            match armed.as_mut() {
                Some(a) if a.at <= at => a.waiters.push(tx),
                _ => {
                    let delay = at.saturating_sub(now_ms()).min(u32::MAX as u64 / 2) as u32;
                    let me = self.clone();
                    let timer = gloo_timers::callback::Timeout::new(delay, move || {
                        let waiters = me
                            .retry
                            .armed
                            .borrow_mut()
                            .take()
                            .map(|a| a.waiters)
                            .unwrap_or_default();
                        let fire = (me.retry.on_fire)(me.clone());
                        wasm_bindgen_futures::spawn_local(async move {
                            fire.await;
                            for w in waiters {
                                let _ = w.send(());
                            }
                        });
                    });
                    let mut waiters = armed.take().map(|a| a.waiters).unwrap_or_default();
                    waiters.push(tx);
                    *armed = Some(Armed {
                        at,
                        _timer: timer,
                        waiters,
                    });
                }
            }
        }
        if at.saturating_sub(now_ms()) > KEEP_ALIVE_MS || update_pending() {
            return None;
        }
        Some(future_to_promise(async move {
            let _ = rx.await;
            Ok(JsValue::UNDEFINED)
        }))
    }
}
