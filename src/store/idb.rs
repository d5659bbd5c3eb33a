//! Futures over IndexedDB requests and transactions, close to the platform.
//!
//! A request's continuation runs as a microtask of its `success` event, so the
//! transaction is still active and the next request may be made in it: awaiting one
//! request and then issuing another inside the same transaction is safe. A transaction
//! is done only when `complete` fires; a write is durable only then.

use crate::channel::oneshot;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{IdbRequest, IdbTransaction};

/// An IndexedDB failure, with the browser's own name for it (QuotaExceededError, …).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdbError {
    #[error("{0}")]
    Failed(String),
    #[error("transaction aborted: {0}")]
    Aborted(String),
    #[error("IndexedDB is not available in this context")]
    Unavailable,
}

/// Describes a thrown value or a `DOMException` in one line.
pub fn describe(v: &JsValue) -> String {
    if let Some(e) = v.dyn_ref::<web_sys::DomException>() {
        return dom_error(e);
    }
    if let Some(e) = v.dyn_ref::<js_sys::Error>() {
        return format!("{}: {}", String::from(e.name()), String::from(e.message()));
    }
    // Anything else as JSON: `{v:?}` would bring wasm-bindgen's debug printer into the
    // glue for a case that is rare.
    v.as_string()
        .or_else(|| js_sys::JSON::stringify(v).ok()?.as_string())
        .unwrap_or_else(|| "a value that is neither an error nor JSON".into())
}

/// `name: message` of the error a request or transaction carries.
pub fn dom_error(d: &web_sys::DomException) -> String {
    format!("{}: {}", d.name(), d.message())
}

pub fn failed(v: JsValue) -> IdbError {
    IdbError::Failed(describe(&v))
}

type Handler = Closure<dyn FnMut(web_sys::Event)>;

/// Resolves with a request's `result`, or fails with its `error`.
pub struct RequestFuture {
    request: IdbRequest,
    rx: oneshot::Receiver<Result<JsValue, IdbError>>,
    _handlers: (Handler, Handler),
}

/// Awaits one request.
pub fn request(request: IdbRequest) -> RequestFuture {
    let (tx, rx) = oneshot::channel();
    let tx = std::rc::Rc::new(std::cell::RefCell::new(Some(tx)));
    let (ok_tx, err_tx) = (tx.clone(), tx);
    let ok_req = request.clone();
    let ok: Handler = Closure::new(move |_e: web_sys::Event| {
        if let Some(tx) = ok_tx.borrow_mut().take() {
            let _ = tx.send(ok_req.result().map_err(failed));
        }
    });
    let err_req = request.clone();
    let err: Handler = Closure::new(move |e: web_sys::Event| {
        // Not prevented: an unhandled request error aborts its transaction, so a
        // transaction either commits whole or not at all.
        let _ = e;
        if let Some(tx) = err_tx.borrow_mut().take() {
            let why = match err_req.error() {
                Ok(Some(d)) => dom_error(&d),
                _ => "request failed".to_owned(),
            };
            let _ = tx.send(Err(IdbError::Failed(why)));
        }
    });
    request.set_onsuccess(Some(ok.as_ref().unchecked_ref()));
    request.set_onerror(Some(err.as_ref().unchecked_ref()));
    RequestFuture {
        request,
        rx,
        _handlers: (ok, err),
    }
}

impl Future for RequestFuture {
    type Output = Result<JsValue, IdbError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(IdbError::Aborted("request dropped".into()))))
    }
}

impl Drop for RequestFuture {
    fn drop(&mut self) {
        self.request.set_onsuccess(None);
        self.request.set_onerror(None);
    }
}

/// Resolves when a transaction commits (`complete`), or fails when it aborts (an
/// unhandled request error aborts it too).
pub struct TransactionFuture {
    tx: IdbTransaction,
    rx: oneshot::Receiver<Result<(), IdbError>>,
    _handlers: (Handler, Handler),
}

/// Awaits a transaction's end. Create it right after the transaction, before its first
/// request can finish.
pub fn done(tx: &IdbTransaction) -> TransactionFuture {
    let (sender, rx) = oneshot::channel();
    let sender = std::rc::Rc::new(std::cell::RefCell::new(Some(sender)));
    let s1 = sender.clone();
    let complete: Handler = Closure::new(move |_e: web_sys::Event| {
        if let Some(s) = s1.borrow_mut().take() {
            let _ = s.send(Ok(()));
        }
    });
    let (s2, t2) = (sender, tx.clone());
    let abort: Handler = Closure::new(move |_e: web_sys::Event| {
        if let Some(s) = s2.borrow_mut().take() {
            let why = match t2.error() {
                Some(d) => dom_error(&d),
                None => "aborted".to_owned(),
            };
            let _ = s.send(Err(IdbError::Aborted(why)));
        }
    });
    tx.set_oncomplete(Some(complete.as_ref().unchecked_ref()));
    tx.set_onabort(Some(abort.as_ref().unchecked_ref()));
    TransactionFuture {
        tx: tx.clone(),
        rx,
        _handlers: (complete, abort),
    }
}

impl Future for TransactionFuture {
    type Output = Result<(), IdbError>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(IdbError::Aborted("transaction dropped".into()))))
    }
}

impl Drop for TransactionFuture {
    fn drop(&mut self) {
        self.tx.set_oncomplete(None);
        self.tx.set_onabort(None);
    }
}
