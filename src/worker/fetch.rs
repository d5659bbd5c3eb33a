//! Fetch interception (contract sections 1 and 2).

use super::batcher::Stored;
use super::http::{fetch_request, header, json_response, send};
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

pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";

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
/// known-offline fast path what the network does.
async fn network_or_offline(inner: &Rc<Inner>, request: &Request) -> Result<Response, JsValue> {
    match fetch_request(request).await {
        Ok(r) => {
            inner.network_answered();
            Ok(r)
        }
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

/// The first attempt of a write, and its queuing when no answer comes.
async fn write(
    inner: &Rc<Inner>,
    request: Request,
    record_path: String,
    workspace: Option<String>,
    never_queue: bool,
    event: Option<&ExtendableEvent>,
) -> Result<Response, JsValue> {
    let cfg = &inner.config;
    let headers = Headers::new_with_headers(&request.headers())?;
    // Decided on a view no staler than the database (another worker may have switched
    // the account or queued a write of this lane: `worker::view`).
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
        Err(refusal) => return json_response(&SyntheticAnswer::refused(&refusal)),
    };
    headers.set(IDEMPOTENCY_KEY, key.as_str())?;
    if let Some(o) = &owner {
        headers.set(&cfg.expected_account_header, o)?;
    }
    let parts = WriteParts {
        content_type: header(&headers, "Content-Type"),
        headers: replay_headers(&request.headers(), cfg),
        credentials: credentials_of(&request),
    };
    // Registered on arrival: a later write of the lane waits for this one to settle,
    // and the page may abort it until it is handed to the store.
    let lane = Lane::of(owner.as_deref(), workspace.as_deref());
    let turn = lane.clone().map(|l| inner.enter_lane(l));
    let attempt = inner.begin_attempt(&key, Some(request.signal()))?;
    // The exact bytes: kept for the queue, and sent as the body of the first attempt.
    let buffer = JsFuture::from(request.array_buffer()?).await?;
    let body = Uint8Array::new(&buffer);
    let body = (body.length() > 0).then_some(body);

    let init = RequestInit::new();
    init.set_method(&request.method());
    init.set_headers(&headers);
    if let Some(b) = &body {
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
    if let Some(t) = &turn {
        if t.wait().await {
            // The earlier writes took their time: look at the database again.
            inner.fresh().await;
        }
    }
    if attempt.aborted() {
        return aborted();
    }
    // An unresolved earlier write of its lane is ahead: queue behind it, unsent
    // (`core::lanes`); the usual triggers replay them in order.
    let behind = lane.as_ref().is_some_and(|l| inner.held_back(l));
    if behind && never_queue {
        return json_response(&SyntheticAnswer::not_queued(&NotQueued::NeverQueuedBehind));
    }
    // The known-offline fast path (`worker::offline`): after the network failed, a write
    // is queued without an attempt that can only fail, until the network answers again.
    // A never-queued write is always attempted: it cannot be queued.
    let skip = behind || (inner.known_offline() && !never_queue);
    let mut first_sent_at = None;
    if !skip {
        first_sent_at = Some(now_ms());
        match send(
            &init,
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
                    return Ok(answer);
                }
                super::http::discard_body(&answer);
            }
            Err(_) if attempt.aborted() => return aborted(),
            Err(_) => inner.network_failed(),
        }
    }
    if never_queue {
        return json_response(&SyntheticAnswer::not_queued(&NotQueued::NeverQueued));
    }
    let body_len = body.as_ref().map_or(0, |b| b.length() as usize);
    if let Err(why) = check_queueable(body_len, cfg) {
        return json_response(&SyntheticAnswer::not_queued(&why));
    }
    if attempt.aborted() {
        return aborted();
    }
    let record = NewRecord::new(
        &request.method(),
        record_path,
        parts,
        body_len,
        now_ms(),
        first_sent_at,
        owner,
        workspace,
        key.clone(),
    );
    let (method, path, workspace) = (
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
    // Handed to the store in arrival order: from here the write is queued whatever the
    // page does, and the writes behind it may go on.
    drop(attempt);
    drop(turn);
    match stored.await {
        Ok(Stored { id, owner }) => {
            // The sync is registered before the 202 (as the contract lists it); the
            // report follows the answer. Both say whether it was (r3: `background`).
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
            json_response(&SyntheticAnswer::queued(id, &key, background))
        }
        Err(EnqueueFailure::Full) => {
            json_response(&SyntheticAnswer::not_queued(&NotQueued::Full {
                max: cfg.max_records,
            }))
        }
        Err(EnqueueFailure::Cleared) => {
            json_response(&SyntheticAnswer::not_queued(&NotQueued::Cleared))
        }
        Err(EnqueueFailure::Storage(e)) => {
            json_response(&SyntheticAnswer::not_queued(&NotQueued::Storage(e)))
        }
        Err(EnqueueFailure::Stale) => json_response(&SyntheticAnswer::not_queued(
            &NotQueued::Storage("the outbox's database kept changing".into()),
        )),
    }
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
