//! Requests and answers: sends bounded in time, answer bodies bounded in time and size,
//! identity checks, and the worker's own JSON answers.

use crate::core::first_attempt::SyntheticAnswer;
use crate::core::identity::{read_identity_answer, Identity, IdentityBody, MAX_IDENTITY_BODY};
use js_sys::{Array, Promise};
use serde_json::Value;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use web_sys::{
    AbortController, AbortSignal, Headers, ReadableStreamDefaultReader, Request, RequestCache,
    RequestCredentials, RequestInit, Response, ResponseInit, ResponseType,
};

use super::scope;

/// Enough of an answer body to classify any answer (contract 4.7): idempotency codes,
/// problem details and error pages are small; the rest is not read.
pub const MAX_ANSWER_BODY: usize = 64 * 1024;

/// A request in flight or an answer being read: when its timer fires at
/// `attemptTimeoutMs` it aborts the request's controller, which ends both. Dropping it
/// stops the timer.
pub struct Deadline {
    _timer: gloo_timers::callback::Timeout,
    /// Watched by [`read_bounded`] itself: WebKit does not always error a body's stream
    /// when its request is aborted after the headers came, so a stalled body would hold
    /// the queue (and the cross-version lock) past the deadline.
    signal: AbortSignal,
}

impl Deadline {
    /// A deadline `timeout_ms` from now of its own (for an answer not fetched here).
    pub fn after(timeout_ms: u32) -> Result<Deadline, JsValue> {
        let controller = AbortController::new()?;
        let signal = controller.signal();
        let timer = gloo_timers::callback::Timeout::new(timeout_ms, move || controller.abort());
        Ok(Deadline {
            _timer: timer,
            signal,
        })
    }

    /// A promise that settles once the deadline has passed or the request was aborted
    /// (with the abort event, or `null` if that had already happened).
    fn passed(&self) -> Promise {
        if self.signal.aborted() {
            return Promise::resolve(&JsValue::NULL);
        }
        let signal = self.signal.clone();
        Promise::new(&mut |resolve, _reject| {
            // The listener is `resolve` itself: no closure to keep alive or free.
            let _ = signal.add_event_listener_with_callback("abort", &resolve);
        })
    }
}

/// Sends a request that is aborted after `timeout_ms` (or by `controller`, which the
/// caller may abort too). `Err` is a network failure, the timeout or the abort: no
/// answer was seen. The [`Deadline`] keeps bounding the reading of the answer's body.
pub async fn send(
    init: &RequestInit,
    url: &str,
    timeout_ms: u32,
    controller: Option<AbortController>,
) -> Result<(Response, Deadline), JsValue> {
    let controller = match controller {
        Some(c) => c,
        None => AbortController::new()?,
    };
    init.set_signal(Some(&controller.signal()));
    let on_timeout = controller.clone();
    let timer = gloo_timers::callback::Timeout::new(timeout_ms, move || on_timeout.abort());
    let deadline = Deadline {
        _timer: timer,
        signal: controller.signal(),
    };
    // `fetch(url, init)`: a `Request` built here first would be built again (and its
    // body moved) by `fetch` itself, once per replay.
    let answer = JsFuture::from(scope().fetch_with_str_and_init(url, init)).await?;
    Ok((answer.unchecked_into(), deadline))
}

/// Plain network fetch of a page's request (reads, and requests that are not ours).
pub async fn fetch_request(request: &Request) -> Result<Response, JsValue> {
    JsFuture::from(scope().fetch_with_request(request))
        .await
        .map(JsCast::unchecked_into)
}

/// An answer body, read up to a size bound while its deadline lasts.
pub struct BoundedBody {
    pub text: String,
    /// The whole body arrived (not cut at the size bound, not stalled past the
    /// deadline, not failed).
    pub complete: bool,
    /// It was cut because it is longer than the bound (it did not stall or fail).
    pub too_large: bool,
}

impl BoundedBody {
    /// The body as JSON, when it arrived whole and is JSON. The browser parses it: the
    /// module carries no JSON parser of its own.
    pub fn json(&self) -> Option<Value> {
        if !self.complete || self.text.is_empty() {
            return None;
        }
        let parsed = js_sys::JSON::parse(&self.text).ok()?;
        crate::js::json_value(&parsed)
    }
}

/// Reads an answer's body, at most [`MAX_ANSWER_BODY`] bytes (see [`read_bounded_to`]).
pub async fn read_bounded(response: &Response, deadline: &Deadline) -> BoundedBody {
    read_bounded_to(response, deadline, MAX_ANSWER_BODY).await
}

/// Reads an answer's body, at most `limit` bytes; a server that sends its headers and
/// then stalls is cut off by the request's deadline: each read races it, so a read never
/// holds the queue for longer than `attemptTimeoutMs`, whether or not the engine errors
/// the stream on abort.
pub async fn read_bounded_to(
    response: &Response,
    deadline: &Deadline,
    limit: usize,
) -> BoundedBody {
    if let Some(read) = read_whole(response, deadline, limit).await {
        return read;
    }
    let mut bytes: Vec<u8> = Vec::new();
    let mut too_large = false;
    let Some(stream) = response.body() else {
        return BoundedBody {
            text: String::new(),
            complete: true,
            too_large,
        };
    };
    let reader: ReadableStreamDefaultReader = stream.get_reader().unchecked_into();
    let passed = deadline.passed();
    let complete = loop {
        let next = Promise::race(&Array::of2(&reader.read(), &passed));
        let Ok(step) = JsFuture::from(next).await else {
            break false;
        };
        // Whatever won the race, an aborted request's body is incomplete.
        if deadline.signal.aborted() {
            break false;
        }
        let done = js_sys::Reflect::get(&step, &"done".into())
            .map(|d| d.is_truthy())
            .unwrap_or(true);
        if done {
            break true;
        }
        let Ok(chunk) = js_sys::Reflect::get(&step, &"value".into()) else {
            break false;
        };
        let Some(chunk) = chunk.dyn_ref::<js_sys::Uint8Array>() else {
            break false;
        };
        let room = limit - bytes.len();
        let len = chunk.length() as usize;
        if len > room {
            bytes.extend_from_slice(&chunk.subarray(0, room as u32).to_vec());
            too_large = true;
            break false;
        }
        bytes.extend_from_slice(&chunk.to_vec());
    };
    if complete {
        reader.release_lock();
    } else {
        // Not awaited, and the lock is not released: a read may still be pending, and
        // the answer is dropped anyway.
        let _ = reader.cancel();
    }
    BoundedBody {
        text: String::from_utf8_lossy(&bytes).into_owned(),
        complete,
        too_large,
    }
}

/// A same-origin answer that says it is at most `limit` bytes and not compressed (its
/// headers are all visible, so a `Content-Length` is what will be read) is read in one
/// call, raced against its deadline: no reader, no read per chunk (most answers are
/// small, and this ran once per replayed record). `None`: read it chunk by chunk.
async fn read_whole(response: &Response, deadline: &Deadline, limit: usize) -> Option<BoundedBody> {
    if response.type_() != ResponseType::Basic || response.body_used() {
        return None;
    }
    let headers = response.headers();
    if header(&headers, "Content-Encoding").is_some() {
        return None;
    }
    let length: usize = header(&headers, "Content-Length")?.trim().parse().ok()?;
    if length > limit {
        return None;
    }
    let whole = response.array_buffer().ok()?;
    let next = Promise::race(&Array::of2(&whole, &deadline.passed()));
    let read = JsFuture::from(next).await;
    let bytes = match read {
        Ok(buf) if !deadline.signal.aborted() => buf
            .dyn_into::<js_sys::ArrayBuffer>()
            .ok()
            .map(|b| js_sys::Uint8Array::new(&b).to_vec()),
        _ => None,
    };
    Some(match bytes {
        // A body longer than it said cannot arrive whole; checked all the same.
        Some(b) if b.len() <= limit => BoundedBody {
            text: String::from_utf8_lossy(&b).into_owned(),
            complete: true,
            too_large: false,
        },
        _ => BoundedBody {
            text: String::new(),
            complete: false,
            too_large: false,
        },
    })
}

/// Stops reading an answer the outbox does not need (a 2xx replay): its connection is
/// let go at once.
pub fn discard_body(response: &Response) {
    if let Some(stream) = response.body() {
        let _ = stream.cancel();
    }
}

pub fn header(headers: &Headers, name: &str) -> Option<String> {
    headers.get(name).ok().flatten()
}

/// What an identity check came back with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentityAnswer {
    /// The server answered; `retry_after` is the answer's `Retry-After`, for a 429 or
    /// 503 that asks to wait.
    Answered {
        identity: Identity,
        retry_after: Option<String>,
    },
    /// No answer: a network failure, or the timeout before the headers came.
    Offline,
    /// The headers came, the body did not arrive whole within the timeout: the network
    /// answered, the check did not.
    Stalled,
}

impl IdentityAnswer {
    /// Whether the network answered at all (the known-offline fast path listens).
    pub fn network_answered(&self) -> bool {
        !matches!(self, IdentityAnswer::Offline)
    }

    pub fn identity(&self) -> Option<&Identity> {
        match self {
            IdentityAnswer::Answered { identity, .. } => Some(identity),
            _ => None,
        }
    }
}

/// `GET authMePath` with credentials and no cache; with `expected` set, the
/// expected-account header too, and with `authorization` (a bearer session's credential,
/// r3) the `Authorization` header. The CSRF token is the body's `csrfToken`, else the
/// `csrf_header` answer header (`csrfHeader`).
pub async fn identity(
    url: &str,
    expected: Option<(&str, &str)>,
    authorization: Option<&str>,
    timeout_ms: u32,
    csrf_header: &str,
) -> IdentityAnswer {
    let init = RequestInit::new();
    init.set_method("GET");
    init.set_credentials(RequestCredentials::Include);
    init.set_cache(RequestCache::NoStore);
    if expected.is_some() || authorization.is_some() {
        let Ok(headers) = Headers::new() else {
            return IdentityAnswer::Offline;
        };
        if let Some((name, owner)) = expected {
            if headers.set(name, owner).is_err() {
                return IdentityAnswer::Offline;
            }
        }
        if let Some(a) = authorization {
            if headers.set("Authorization", a).is_err() {
                return IdentityAnswer::Offline;
            }
        }
        init.set_headers(&headers);
    }
    match send(&init, url, timeout_ms, None).await {
        Ok((response, deadline)) => identity_of(&response, &deadline, csrf_header).await,
        Err(_) => IdentityAnswer::Offline,
    }
}

/// Reads an identity answer: its body up to 1 MiB (`MAX_IDENTITY_BODY`, contract 4.1
/// r3) within the deadline. A body cut at that bound is still an answer (never
/// offline); one that stalls is no identity.
pub async fn identity_of(
    response: &Response,
    deadline: &Deadline,
    csrf_header: &str,
) -> IdentityAnswer {
    let headers = response.headers();
    let csrf = header(&headers, csrf_header);
    let retry_after = header(&headers, "Retry-After");
    let status = response.status();
    let body = read_bounded_to(response, deadline, MAX_IDENTITY_BODY).await;
    let json = body.json();
    let read = match (&json, body.complete, body.too_large) {
        (Some(v), _, _) => IdentityBody::Json(v),
        (None, true, _) => IdentityBody::NotJson,
        (None, false, true) => IdentityBody::TooLarge,
        (None, false, false) => return IdentityAnswer::Stalled,
    };
    IdentityAnswer::Answered {
        identity: read_identity_answer(status, read, csrf.as_deref()),
        retry_after,
    }
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
