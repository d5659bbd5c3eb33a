//! Fetch interception (contract sections 1 and 2).

use super::attempts::Attempt;
use super::batcher::Stored;
use super::http::{fetch_request, header, json_response, send};
use super::lanes::Turn;
use super::{clients, now_ms, scope, Inner};
use crate::core::first_attempt::{
    capture_owner, check_queueable, choose_key, NotQueued, SyntheticAnswer,
};
use crate::core::key::IdempotencyKey;
use crate::core::lanes::Lane;
use crate::core::record::{Credentials, NewRecord, WriteParts};
use crate::core::route::{classify, RequestKind};
use crate::protocol::Outgoing;
use crate::store::{EnqueueFailure, Pending};
use js_sys::Uint8Array;
use std::rc::Rc;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::{future_to_promise, JsFuture};
use web_sys::{
    ExtendableEvent, Headers, Request, RequestCredentials, RequestInit, RequestMode, Response, Url,
};

pub const IDEMPOTENCY_KEY: &str = crate::core::key::IDEMPOTENCY_KEY_HEADER;

/// Whether the request is same-origin, and its path with query.
pub fn locate(request: &Request) -> Option<(bool, String)> {
    locate_url(&request.url())
}

/// Whether a URL is of this worker's origin, and its path with query (as the browser's
/// URL parser gives them: `new URL(u).pathname + search`).
pub fn locate_url(url: &str) -> Option<(bool, String)> {
    let url = Url::new(url).ok()?;
    let here = scope().location().origin();
    Some((
        url.origin() == here,
        format!("{}{}", url.pathname(), url.search()),
    ))
}

/// Whether a request is to an auth route (contract 1), decided synchronously.
pub fn is_auth_route(inner: &Inner, request: &Request) -> bool {
    locate(request).is_some_and(|(same_origin, path)| {
        classify(
            &request.method(),
            same_origin,
            &path,
            &inner.config,
            &*inner.patterns,
        ) == RequestKind::AuthRoute
    })
}

pub async fn handle(
    inner: &Rc<Inner>,
    request: Request,
    event: Option<&ExtendableEvent>,
) -> Result<Response, JsValue> {
    let Some((same_origin, path)) = locate(&request) else {
        return fetch_request(&request).await;
    };
    match classify(
        &request.method(),
        same_origin,
        &path,
        &inner.config,
        &*inner.patterns,
    ) {
        RequestKind::Passthrough => fetch_request(&request).await,
        RequestKind::ApiRead => network_or_offline(inner, &request).await,
        RequestKind::AuthRoute => {
            let headers = Headers::new_with_headers(&request.headers())?;
            headers.delete(IDEMPOTENCY_KEY)?;
            headers.delete(&inner.config.expected_account_header)?;
            let init = RequestInit::new();
            init.set_headers(&headers);
            let stripped = Request::new_with_request_and_init(&request, &init)?;
            network_or_offline(inner, &stripped).await
        }
        RequestKind::Write {
            record_path,
            workspace,
            never_queue,
        } => write(inner, request, record_path, workspace, never_queue, event).await,
    }
}

/// Network only; a failed network is `503 {"error":"offline"}`. Either tells the
/// known-offline fast path what the network does — but a read the page aborted (in a
/// browser that passes the page's abort to the worker) says nothing of the network: it
/// is not taken for a failure, or the online writes after it would be queued unsent.
async fn network_or_offline(inner: &Rc<Inner>, request: &Request) -> Result<Response, JsValue> {
    match fetch_request(request).await {
        Ok(r) => {
            inner.network_answered();
            Ok(r)
        }
        Err(_) if request.signal().aborted() => aborted(),
        Err(_) => {
            inner.network_failed();
            json_response(&SyntheticAnswer::offline())
        }
    }
}

/// The page's headers a replay carries (`replayHeaders`, never credentials, the CSRF
/// header or hop-by-hop headers: `Config::stores_header`), in the page's order.
fn replay_headers(headers: &Headers, cfg: &crate::core::config::Config) -> Vec<(String, String)> {
    let Ok(Some(entries)) = js_sys::try_iter(headers) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|pair| {
            let pair: js_sys::Array = pair.dyn_into().ok()?;
            Some((pair.get(0).as_string()?, pair.get(1).as_string()?))
        })
        .filter(|(name, _)| cfg.stores_header(name))
        .collect()
}

fn credentials_of(request: &Request) -> Credentials {
    match request.credentials() {
        RequestCredentials::Omit => Credentials::Omit,
        RequestCredentials::SameOrigin => Credentials::SameOrigin,
        _ => Credentials::Include,
    }
}

/// What the worker answers a write the page gave up on (it is gone; the page saw its
/// own AbortError).
fn aborted() -> Result<Response, JsValue> {
    Ok(Response::error())
}

/// The first attempt of a write, and its queuing when no answer comes (contract 2), as
/// four steps: [`decide`] (identity, key, lane), [`attempt`] (the request, unless its
/// lane or the known-offline state says it can only queue), [`queue`] (stored durably,
/// never claimed queued otherwise) and [`answer`] (the 202 and its report).
async fn write(
    inner: &Rc<Inner>,
    request: Request,
    record_path: String,
    workspace: Option<String>,
    never_queue: bool,
    event: Option<&ExtendableEvent>,
) -> Result<Response, JsValue> {
    let decided = match decide(inner, &request, workspace.as_deref()).await? {
        Ok(decided) => decided,
        Err(refused) => return refused,
    };
    let (body, first_sent_at) = match attempt(inner, &request, &decided, never_queue).await? {
        Attempted::Answer(answer) => return answer,
        Attempted::Queue {
            body,
            first_sent_at,
        } => (body, first_sent_at),
    };
    if never_queue {
        return json_response(&SyntheticAnswer::not_queued(&NotQueued::NeverQueued));
    }
    let record = NewRecord::new(
        &request.method(),
        record_path,
        decided.parts.clone(),
        body.as_ref().map_or(0, |b| b.length() as usize),
        now_ms(),
        first_sent_at,
        decided.owner.clone(),
        workspace,
        decided.key.clone(),
    );
    match queue(inner, decided, record, body).await {
        Ok((queued, key)) => answer(inner, queued, &key, event).await,
        Err(refused) => refused,
    }
}

/// What a write was decided to be before anything is sent: its owner, its key, the
/// parts a replay needs, its turn in its lane and its abortable attempt.
struct Decided {
    headers: Headers,
    owner: Option<String>,
    /// The owner came from the persisted session, not from the page.
    owner_from_session: bool,
    key: IdempotencyKey,
    parts: WriteParts,
    lane: Option<Lane>,
    turn: Option<Turn>,
    attempt: Attempt,
    /// The view's count of `CLEAR_DEVICE`s: a write decided before a clear is not stored.
    clears: u64,
}

/// Decided on a view no staler than the database (another worker may have switched the
/// account or queued a write of this lane: `worker::view`): the owner (2.1), the key
/// (2.2; a refused key is answered here: the inner `Err`), both set on the request, and
/// the write's place in its lane, registered on arrival.
async fn decide(
    inner: &Rc<Inner>,
    request: &Request,
    workspace: Option<&str>,
) -> Result<Result<Decided, Result<Response, JsValue>>, JsValue> {
    let cfg = &inner.config;
    let headers = Headers::new_with_headers(&request.headers())?;
    inner.fresh().await;
    let clears = inner.view_clears();
    let page_owner = header(&headers, &cfg.expected_account_header);
    let owner_from_session = page_owner.as_deref().is_none_or(|o| o.trim().is_empty());
    let owner = capture_owner(page_owner.as_deref(), inner.session_user().as_deref());
    let key = match choose_key(
        header(&headers, IDEMPOTENCY_KEY).as_deref(),
        IdempotencyKey::mint_opt,
    ) {
        Ok(k) => k,
        Err(refusal) => return Ok(Err(json_response(&SyntheticAnswer::refused(&refusal)))),
    };
    headers.set(IDEMPOTENCY_KEY, key.as_str())?;
    if let Some(o) = &owner {
        headers.set(&cfg.expected_account_header, o)?;
    }
    let parts = WriteParts {
        content_type: header(&headers, "Content-Type"),
        headers: replay_headers(&request.headers(), cfg),
        credentials: credentials_of(request),
    };
    // Registered on arrival: a later write of the lane waits for this one to settle,
    // and the page may abort it until it is handed to the store.
    let lane = Lane::of(owner.as_deref(), workspace);
    let turn = lane.clone().map(|l| inner.enter_lane(l));
    let attempt = inner.begin_attempt(&key, Some(request.signal()))?;
    Ok(Ok(Decided {
        headers,
        owner,
        owner_from_session,
        key,
        parts,
        lane,
        turn,
        attempt,
        clears,
    }))
}

/// What the first attempt came to.
enum Attempted {
    /// What the page gets now: the server's answer, an abort, or a refusal.
    Answer(Result<Response, JsValue>),
    /// No answer to pass on: the write is to be queued (with the exact bytes, and when
    /// it was sent, if it was).
    Queue {
        body: Option<Uint8Array>,
        first_sent_at: Option<u64>,
    },
}

/// The first attempt (2.3, 2.4, 2.7): the exact bytes read, the request re-created; once
/// the earlier writes of its lane settled, sent — unless one of them is still unresolved
/// (queued behind it, unsent) or the network is known to be down (`worker::offline`).
async fn attempt(
    inner: &Rc<Inner>,
    request: &Request,
    decided: &Decided,
    never_queue: bool,
) -> Result<Attempted, JsValue> {
    let attempt = &decided.attempt;
    // The exact bytes: kept for the queue, and sent as the body of the first attempt.
    let buffer = JsFuture::from(request.array_buffer()?).await?;
    let body = Uint8Array::new(&buffer);
    let body = (body.length() > 0).then_some(body);
    let init = first_request(request, &decided.headers, body.as_ref());
    if let Some(t) = &decided.turn {
        if t.wait().await {
            // The earlier writes took their time: look at the database again.
            inner.fresh().await;
        }
    }
    if attempt.aborted() {
        return Ok(Attempted::Answer(aborted()));
    }
    // An unresolved earlier write of its lane is ahead: queue behind it, unsent
    // (`core::lanes`); the usual triggers replay them in order.
    let behind = decided.lane.as_ref().is_some_and(|l| inner.held_back(l));
    if behind && never_queue {
        return Ok(Attempted::Answer(json_response(
            &SyntheticAnswer::not_queued(&NotQueued::NeverQueuedBehind),
        )));
    }
    // The known-offline fast path (`worker::offline`): after the network failed, a write
    // is queued without an attempt that can only fail, until the network answers again.
    // A never-queued write is always attempted: it cannot be queued.
    let skip = behind || (inner.known_offline() && !never_queue);
    if skip {
        return Ok(Attempted::Queue {
            body,
            first_sent_at: None,
        });
    }
    let first_sent_at = Some(now_ms());
    if let Some(answer) = send_first(inner, request, &init, attempt, never_queue).await {
        return Ok(Attempted::Answer(answer));
    }
    Ok(Attempted::Queue {
        body,
        first_sent_at,
    })
}

/// Sends the first attempt: the answer the page gets, or `None` when the write is to be
/// queued (no answer in time, a network failure, or a gateway's status in
/// `queueStatuses`, r3).
async fn send_first(
    inner: &Rc<Inner>,
    request: &Request,
    init: &RequestInit,
    attempt: &Attempt,
    never_queue: bool,
) -> Option<Result<Response, JsValue>> {
    let cfg = &inner.config;
    match send(
        init,
        &request.url(),
        cfg.attempt_timeout_ms,
        Some(attempt.controller.clone()),
    )
    .await
    {
        Ok((answer, _deadline)) => {
            inner.network_answered();
            // A gateway's 502/503/504 (`queueStatuses`, r3) is queued as a network
            // failure would be, unless the server's ledger says it stored it; a
            // never-queued write gets it as it is.
            let replayed = header(&answer.headers(), "Idempotent-Replayed")
                .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
            if never_queue || !cfg.queues_answer(answer.status(), replayed) {
                return Some(Ok(answer));
            }
            super::http::discard_body(&answer);
            None
        }
        Err(_) if attempt.aborted() => Some(aborted()),
        Err(_) => {
            inner.network_failed();
            None
        }
    }
}

/// The request as the page made it, with the outbox's headers and the exact bytes.
fn first_request(request: &Request, headers: &Headers, body: Option<&Uint8Array>) -> RequestInit {
    let init = RequestInit::new();
    init.set_method(&request.method());
    init.set_headers(headers);
    if let Some(b) = body {
        init.set_body(b);
    }
    init.set_credentials(request.credentials());
    init.set_cache(request.cache());
    init.set_redirect(request.redirect());
    // A form submission arrives as a navigation, which cannot be re-created as such.
    let mode = request.mode();
    init.set_mode(if mode == RequestMode::Navigate {
        RequestMode::SameOrigin
    } else {
        mode
    });
    init
}

/// Queues the write (2.4, 2.5): refused with a reason when it cannot be stored (too
/// big, the queue full, storage failing, a clear in between), never claimed queued;
/// handed to the store in arrival order, after which it is queued whatever the page
/// does, and the writes behind it in its lane may go on. With its key.
async fn queue(
    inner: &Rc<Inner>,
    decided: Decided,
    record: NewRecord,
    body: Option<Uint8Array>,
) -> Result<(Queued, IdempotencyKey), Result<Response, JsValue>> {
    let cfg = &inner.config;
    let body_len = body.as_ref().map_or(0, |b| b.length() as usize);
    if let Err(why) = check_queueable(body_len, cfg) {
        return Err(json_response(&SyntheticAnswer::not_queued(&why)));
    }
    if decided.attempt.aborted() {
        return Err(aborted());
    }
    let Decided {
        key,
        owner_from_session,
        attempt,
        turn,
        clears,
        ..
    } = decided;
    let report = (
        record.method.clone(),
        record.path.clone(),
        record.workspace.clone(),
    );
    let stored = inner.enqueue(
        Pending {
            record,
            body,
            clears,
        },
        owner_from_session,
    );
    drop(attempt);
    drop(turn);
    let not_queued = |why: NotQueued| Err(json_response(&SyntheticAnswer::not_queued(&why)));
    match stored.await {
        Ok(stored) => Ok((Queued { stored, report }, key)),
        Err(EnqueueFailure::Full) => not_queued(NotQueued::Full {
            max: cfg.max_records,
        }),
        Err(EnqueueFailure::Cleared) => not_queued(NotQueued::Cleared),
        Err(EnqueueFailure::Storage(e)) => not_queued(NotQueued::Storage(e)),
        Err(EnqueueFailure::Stale) => not_queued(NotQueued::Storage(
            "the outbox's database kept changing".into(),
        )),
    }
}

/// A stored write, with what its `MUTATION_QUEUED` names (method, path, workspace).
struct Queued {
    stored: Stored,
    report: (String, String, Option<String>),
}

/// The page's answer to a queued write (2.4, 2.6): the sync registered before the 202
/// (as the contract lists it); the report follows the answer. Both say whether it was
/// (r3: `background`).
async fn answer(
    inner: &Rc<Inner>,
    queued: Queued,
    key: &IdempotencyKey,
    event: Option<&ExtendableEvent>,
) -> Result<Response, JsValue> {
    let Queued {
        stored: Stored { id, owner },
        report: (method, path, workspace),
    } = queued;
    let background = inner.sync_for_queued().await;
    let report = Outgoing::Queued {
        id,
        method,
        path,
        workspace,
        owner_id: owner.clone(),
        background,
    };
    if let (Some(retry), Some(e)) = (inner.retry_soon(), event) {
        // Without Background Sync the worker retries itself; this event keeps it
        // alive for the first retry.
        let _ = e.wait_until(&retry);
    }
    // To the windows of its account only (contract 5, r4).
    let me = inner.clone();
    after_answer(event, async move {
        clients::to_owner(&me, owner.as_deref(), &report).await;
    })
    .await;
    json_response(&SyntheticAnswer::queued(id, key, background))
}

/// Runs `work` after the answer when the fetch event can keep the worker alive for it
/// (the page does not need the `MUTATION_QUEUED` report to know its write is safe, and
/// sending it is one more browser round trip), else before it.
async fn after_answer(
    event: Option<&ExtendableEvent>,
    work: impl std::future::Future<Output = ()> + 'static,
) {
    let done = future_to_promise(async move {
        work.await;
        Ok(JsValue::UNDEFINED)
    });
    let kept = event.is_some_and(|e| e.wait_until(&done).is_ok());
    if !kept {
        let _ = JsFuture::from(done).await;
    }
}
