//! A Web Lock held for as long as the worker wants it, not for one callback: the
//! origin-wide sign-in fence (`worker::barrier`) holds it across a flush, or across a
//! sign-in's round trip, and lets go of it from a message event. `chain::under_web_lock`
//! is the callback-shaped one for a queue operation.

use crate::channel::oneshot;
use js_sys::{Function, Object, Promise, Reflect};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::AbortController;

/// How the lock is wanted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Shared,
    Exclusive,
}

/// A requested Web Lock, released (or its request withdrawn) when dropped.
pub struct Hold {
    release: Option<Function>,
    abort: Option<AbortController>,
    granted: Rc<Cell<bool>>,
    waiting: Rc<RefCell<Option<oneshot::Sender<()>>>>,
}

/// `navigator.locks.request`, when this worker has it.
fn lock_manager() -> Option<(JsValue, Function)> {
    let locks = Reflect::get(&js_sys::global(), &"navigator".into())
        .and_then(|n| Reflect::get(&n, &"locks".into()))
        .ok()
        .filter(|l| !l.is_undefined() && !l.is_null())?;
    let request = Reflect::get(&locks, &"request".into())
        .ok()?
        .dyn_into::<Function>()
        .ok()?;
    Some((locks, request))
}

impl Hold {
    /// Whether this worker has Web Locks.
    pub fn available() -> bool {
        lock_manager().is_some()
    }

    /// Requests `name` in `mode`, with what resolves once it is granted (`Err` when the
    /// hold was dropped first); `None` where the worker has no Web Locks (then there is
    /// nothing to hold, and the caller goes on without the fence).
    pub fn request(name: &str, mode: Mode) -> Option<(Hold, oneshot::Receiver<()>)> {
        let (locks, request) = lock_manager()?;
        // The promise the lock's callback returns: the lock is held until it resolves.
        let mut resolve: Option<Function> = None;
        let held = Promise::new(&mut |res, _rej| resolve = Some(res));
        let granted = Rc::new(Cell::new(false));
        let (tx, rx) = oneshot::channel();
        let waiting = Rc::new(RefCell::new(Some(tx)));
        let (g, w) = (granted.clone(), waiting.clone());
        let callback = Closure::once_into_js(move |_lock: JsValue| -> Promise {
            g.set(true);
            if let Some(tx) = w.borrow_mut().take() {
                let _ = tx.send(());
            }
            held
        });
        let abort = AbortController::new().ok();
        let options = Object::new();
        let mode_name = match mode {
            Mode::Shared => "shared",
            Mode::Exclusive => "exclusive",
        };
        let _ = Reflect::set(&options, &"mode".into(), &mode_name.into());
        if let Some(a) = &abort {
            let _ = Reflect::set(&options, &"signal".into(), &a.signal());
        }
        let asked = request.call3(&locks, &JsValue::from_str(name), &options, &callback);
        match asked.ok().and_then(|p| p.dyn_into::<Promise>().ok()) {
            // A request withdrawn before its grant rejects (AbortError): expected, and
            // never an unhandled rejection.
            Some(p) => {
                let ignore = Closure::once_into_js(|_e: JsValue| {});
                if let Ok(catch) = Reflect::get(&p, &"catch".into()) {
                    let _ = catch.unchecked_into::<Function>().call1(&p, &ignore);
                }
            }
            None => return None,
        }
        let hold = Hold {
            release: resolve,
            abort,
            granted,
            waiting,
        };
        Some((hold, rx))
    }

    /// Whether the lock is held now.
    pub fn is_granted(&self) -> bool {
        self.granted.get()
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        // Withdrawn if still waiting (a grant that races the abort meets a promise that is
        // already resolved, and lets go at once); released if held.
        self.waiting.borrow_mut().take();
        if let Some(a) = &self.abort {
            if !self.granted.get() {
                a.abort();
            }
        }
        if let Some(release) = self.release.take() {
            let _ = release.call0(&JsValue::UNDEFINED);
        }
    }
}
