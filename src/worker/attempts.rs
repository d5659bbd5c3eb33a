//! First attempts a page may still abort (contract 2.8, r2): from a write's arrival
//! until it is handed to the store, `ABORT_WRITE {idempotencyKey}` (or the page's own
//! `AbortSignal`, where the browser forwards it to `event.request.signal`) aborts it,
//! and nothing is queued. Once handed to the store the write is queued whatever the page
//! does.

use super::Inner;
use crate::core::key::IdempotencyKey;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{AbortController, AbortSignal};

struct Live {
    ticket: u64,
    key: IdempotencyKey,
    controller: AbortController,
    aborted: Rc<Cell<bool>>,
}

#[derive(Default)]
pub struct Attempts {
    live: RefCell<Vec<Live>>,
    next: Cell<u64>,
}

/// One write's first attempt while it may be aborted; dropping it (the write was
/// answered or handed to the store) ends that.
pub struct Attempt {
    inner: Rc<Inner>,
    ticket: u64,
    /// Aborts the network request of the first attempt.
    pub controller: AbortController,
    aborted: Rc<Cell<bool>>,
    /// Keeps the listener on the page's forwarded signal alive.
    _on_page_abort: Option<(AbortSignal, Closure<dyn FnMut()>)>,
}

impl Attempt {
    /// Whether the page gave up on this write.
    pub fn aborted(&self) -> bool {
        self.aborted.get()
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if let Some((signal, handler)) = &self._on_page_abort {
            let _ = signal
                .remove_event_listener_with_callback("abort", handler.as_ref().unchecked_ref());
        }
        self.inner
            .attempts
            .live
            .borrow_mut()
            .retain(|l| l.ticket != self.ticket);
    }
}

impl Inner {
    /// Registers a write's first attempt under its key, listening to the page's signal
    /// when the browser forwarded one.
    pub(crate) fn begin_attempt(
        self: &Rc<Self>,
        key: &IdempotencyKey,
        page_signal: Option<AbortSignal>,
    ) -> Result<Attempt, JsValue> {
        let controller = AbortController::new()?;
        let aborted = Rc::new(Cell::new(false));
        let ticket = self.attempts.next.get();
        self.attempts.next.set(ticket + 1);
        self.attempts.live.borrow_mut().push(Live {
            ticket,
            key: key.clone(),
            controller: controller.clone(),
            aborted: aborted.clone(),
        });
        let on_page_abort = match page_signal {
            Some(signal) if signal.aborted() => {
                aborted.set(true);
                None
            }
            Some(signal) => {
                let (flag, c) = (aborted.clone(), controller.clone());
                let handler: Closure<dyn FnMut()> = Closure::new(move || {
                    flag.set(true);
                    c.abort();
                });
                signal
                    .add_event_listener_with_callback("abort", handler.as_ref().unchecked_ref())?;
                Some((signal, handler))
            }
            None => None,
        };
        Ok(Attempt {
            inner: self.clone(),
            ticket,
            controller,
            aborted,
            _on_page_abort: on_page_abort,
        })
    }

    /// `ABORT_WRITE`: aborts every first attempt under `key` still abortable; returns
    /// how many.
    pub(crate) fn abort_attempts(&self, key: &IdempotencyKey) -> u64 {
        let live = self.attempts.live.borrow();
        let mut n = 0;
        for l in live.iter().filter(|l| &l.key == key && !l.aborted.get()) {
            l.aborted.set(true);
            l.controller.abort();
            n += 1;
        }
        n
    }
}
