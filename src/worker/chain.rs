//! One queue operation at a time: a FIFO lock per worker, held across worker instances
//! (an old and a new worker during an update) through a Web Lock where the browser has
//! `navigator.locks`.

use crate::channel::oneshot;
use js_sys::{Function, Promise, Reflect};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::{future_to_promise, JsFuture};

/// A FIFO async lock: waiters are served in arrival order.
#[derive(Default)]
pub struct FifoLock {
    held: Cell<bool>,
    waiters: RefCell<VecDeque<oneshot::Sender<()>>>,
}

pub struct Guard<'a> {
    lock: &'a FifoLock,
}

impl FifoLock {
    pub async fn acquire(&self) -> Guard<'_> {
        if self.held.get() || !self.waiters.borrow().is_empty() {
            let (tx, rx) = oneshot::channel();
            self.waiters.borrow_mut().push_back(tx);
            // The holder hands the lock over by sending; a dropped sender cannot happen
            // while the lock lives, and would only mean the lock is free.
            let _ = rx.await;
        }
        self.held.set(true);
        Guard { lock: self }
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        // Ownership passes directly to the first waiter still waiting (`held` stays
        // true); one that gave up is skipped, so the ones behind it are not stranded.
        loop {
            let next = self.lock.waiters.borrow_mut().pop_front();
            match next {
                Some(tx) => {
                    if tx.send(()).is_ok() {
                        return;
                    }
                }
                None => {
                    self.lock.held.set(false);
                    return;
                }
            }
        }
    }
}

/// Runs `op` holding the Web Lock `name` when `navigator.locks` exists, else directly.
pub async fn under_web_lock<T: 'static>(name: &str, op: Pin<Box<dyn Future<Output = T>>>) -> T {
    let global = js_sys::global();
    let locks = Reflect::get(&global, &"navigator".into())
        .and_then(|n| Reflect::get(&n, &"locks".into()))
        .ok()
        .filter(|l| !l.is_undefined() && !l.is_null());
    let request = locks
        .as_ref()
        .and_then(|l| Reflect::get(l, &"request".into()).ok())
        .and_then(|f| f.dyn_into::<Function>().ok());
    let (Some(locks), Some(request)) = (locks, request) else {
        return op.await;
    };
    let slot: Rc<RefCell<Option<T>>> = Rc::new(RefCell::new(None));
    let op_cell = Rc::new(RefCell::new(Some(op)));
    let (slot2, op2) = (slot.clone(), op_cell.clone());
    let callback = Closure::once_into_js(move |_lock: JsValue| -> Promise {
        let op = op2.borrow_mut().take();
        future_to_promise(async move {
            if let Some(op) = op {
                let out = op.await;
                *slot2.borrow_mut() = Some(out);
            }
            Ok(JsValue::UNDEFINED)
        })
    });
    let granted = request
        .call2(&locks, &JsValue::from_str(name), &callback)
        .ok()
        .and_then(|p| p.dyn_into::<Promise>().ok());
    if let Some(p) = granted {
        let _ = JsFuture::from(p).await;
    }
    if let Some(out) = slot.borrow_mut().take() {
        return out;
    }
    // The lock could not be had (the request threw or was refused): run unlocked
    // rather than never; the per-worker chain still serialises this worker.
    let op = op_cell.borrow_mut().take();
    match op {
        Some(op) => op.await,
        None => unreachable_after_run(),
    }
}

/// The operation ran but its result was lost: impossible, as the slot is filled before
/// the callback's promise settles. Kept as a function so the reason is written down.
fn unreachable_after_run() -> ! {
    wasm_bindgen::throw_str("sw-outbox: a locked operation finished without a result")
}
