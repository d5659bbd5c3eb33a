//! A live worker retries on its own backoff schedule where the browser has no
//! Background Sync (Firefox, Safari): a write queued while the user stays on a page is
//! delivered without waiting for a reload (contract 2.6, r2).
//!
//! One timer at a time, set for when the backoff next allows an automatic flush. The
//! timer does not keep a worker alive by itself; the event that set it is kept alive
//! for it when it is near ([`KEEP_ALIVE_MS`]), so the first retries happen even when the
//! page then falls silent. A worker the browser stops anyway is started again by the
//! page's next event, whose start flush takes over.

use super::{flush, now_ms, scope, Inner, Trigger};
use crate::core::backoff::{Backoff, BASE_MS};
use futures_channel::oneshot;
use std::cell::RefCell;
use std::rc::Rc;
use wasm_bindgen::prelude::*;
use wasm_bindgen_futures::future_to_promise;

/// A retry this near is waited for by the event that scheduled it.
pub const KEEP_ALIVE_MS: u64 = 25_000;

#[derive(Default)]
pub struct RetryTimer {
    armed: RefCell<Option<Armed>>,
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

impl Inner {
    /// A write was just queued: a flush soon (after the backoff allows it).
    pub(crate) fn retry_soon(self: &Rc<Self>) -> Option<js_sys::Promise> {
        self.schedule_retry(now_ms() + BASE_MS)
    }

    /// A flush ended with `backoff`: after a transient failure, retry when it allows.
    pub(crate) fn retry_at(self: &Rc<Self>, backoff: Backoff) {
        if backoff.failures > 0 {
            let _ = self.schedule_retry(backoff.next_automatic().max(now_ms() + 1));
        }
    }

    /// Arms the timer for `at` unless it is armed for earlier already. The promise
    /// settles once that retry ran; `None` where Background Sync does this instead.
    fn schedule_retry(self: &Rc<Self>, at: u64) -> Option<js_sys::Promise> {
        if self.background_sync {
            return None;
        }
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
                        wasm_bindgen_futures::spawn_local(async move {
                            flush::request(&me, Trigger::Retry).await;
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
        if at.saturating_sub(now_ms()) > KEEP_ALIVE_MS {
            return None;
        }
        Some(future_to_promise(async move {
            let _ = rx.await;
            Ok(JsValue::UNDEFINED)
        }))
    }
}
