//! Fetch interception (contract sections 1 and 2).

use super::http::{fetch_request, fetch_with_timeout, header, json_response};
use super::{clients, describe, now_ms, scope, Inner};
use crate::core::first_attempt::{
    capture_owner, check_queueable, choose_key, NotQueued, SyntheticAnswer,
};
use crate::core::key::IdempotencyKey;
use crate::core::lanes::Lane;
use crate::core::record::NewRecord;
use crate::core::route::{classify, RequestKind};
use crate::protocol::Outgoing;
use crate::store::{EnqueueFailure, Pending};
use js_sys::{Reflect, Uint8Array};
use std::rc::Rc;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::{future_to_promise, JsFuture};
use web_sys::{ExtendableEvent, Headers, Request, RequestInit, RequestMode, Response, Url};

pub const IDEMPOTENCY_KEY: &str = "Idempotency-Key";

/// Whether the request is same-origin, and its path with query.
pub fn locate(request: &Request) -> Option<(bool, String)> {
    let url = Url::new(&request.url()).ok()?;
    let here = scope().location().origin();
    Some((
        url.origin() == here,
        format!("{}{}", url.pathname(), url.search()),
    ))
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
        RequestKind::ApiRead => network_or_offline(&request).await,
        RequestKind::AuthRoute => {
            let headers = Headers::new_with_headers(&request.headers())?;
            headers.delete(IDEMPOTENCY_KEY)?;
            headers.delete(&inner.config.expected_account_header)?;
            let init = RequestInit::new();
            init.set_headers(&headers);
            let stripped = Request::new_with_request_and_init(&request, &init)?;
            network_or_offline(&stripped).await
        }
        RequestKind::Write {
            record_path,
            workspace,
        } => write(inner, request, record_path, workspace, event).await,
    }
}

/// Network only; a failed network is `503 {"error":"offline"}`.
async fn network_or_offline(request: &Request) -> Result<Response, JsValue> {
    match fetch_request(request).await {
        Ok(r) => Ok(r),
        Err(_) => json_response(&SyntheticAnswer::offline()),
    }
}

/// The first attempt of a write, and its queuing when no answer comes.
async fn write(
    inner: &Rc<Inner>,
    request: Request,
    record_path: String,
    workspace: Option<String>,
    event: Option<&ExtendableEvent>,
) -> Result<Response, JsValue> {
    let cfg = &inner.config;
    let headers = Headers::new_with_headers(&request.headers())?;
    let owner = capture_owner(
        header(&headers, &cfg.expected_account_header).as_deref(),
        inner.session_user().as_deref(),
    );
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
    let content_type = header(&headers, "Content-Type");
    // Registered on arrival: a later write of the lane waits for this one to settle.
    let lane = Lane::of(owner.as_deref(), workspace.as_deref());
    let turn = lane.clone().map(|l| inner.enter_lane(l));
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
        t.wait().await;
    }
    // An unresolved earlier write of its lane is ahead: queue behind it, unsent
    // (`core::lanes`); the usual triggers replay them in order.
    let behind = match &lane {
        Some(l) => inner.held_back(l).await,
        None => false,
    };
    if !behind {
        if let Ok(answer) = fetch_with_timeout(&init, &request.url(), cfg.attempt_timeout_ms).await
        {
            return Ok(answer);
        }
    }

    let body_len = body.as_ref().map_or(0, |b| b.length() as usize);
    if let Err(why) = check_queueable(body_len, cfg) {
        return json_response(&SyntheticAnswer::not_queued(&why));
    }
    let record = NewRecord::new(
        &request.method(),
        record_path,
        content_type,
        now_ms(),
        owner,
        workspace,
        key.clone(),
    );
    // The report names the record by the id its commit gives it.
    let mut report = Outgoing::Queued {
        id: crate::core::record::RecordId(0),
        method: record.method.clone(),
        path: record.path.clone(),
        workspace: record.workspace.clone(),
        owner_id: record.owner_id.clone(),
    };
    if let Some(l) = &lane {
        inner.lane_stored(l);
    }
    let stored = inner.enqueue(Pending { record, body });
    // Handed to the store in arrival order: the writes behind this one may go on.
    drop(turn);
    let stored = stored.await;
    if let (Err(_), Some(l)) = (&stored, &lane) {
        inner.lane_resolved(l);
    }
    match stored {
        Ok(id) => {
            if let Outgoing::Queued { id: slot, .. } = &mut report {
                *slot = id;
            }
            // The sync is registered before the 202 (as the contract lists it); the
            // report follows the answer.
            register_sync(&cfg.sync_tag).await;
            after_answer(event, async move {
                clients::broadcast(&report).await;
            })
            .await;
            json_response(&SyntheticAnswer::queued(id, &key))
        }
        Err(EnqueueFailure::Full) => {
            json_response(&SyntheticAnswer::not_queued(&NotQueued::Full {
                max: cfg.max_records,
            }))
        }
        Err(EnqueueFailure::Storage(e)) => {
            json_response(&SyntheticAnswer::not_queued(&NotQueued::Storage(e)))
        }
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

/// Registers a Background Sync where the API exists (Chromium); elsewhere the other
/// triggers carry the replay.
async fn register_sync(tag: &str) {
    let registration = scope().registration();
    let Ok(sync) = Reflect::get(&registration, &"sync".into()) else {
        return;
    };
    let Some(register) = Reflect::get(&sync, &"register".into())
        .ok()
        .and_then(|f| f.dyn_into::<js_sys::Function>().ok())
    else {
        return;
    };
    if let Ok(p) = register.call1(&sync, &JsValue::from_str(tag)) {
        if let Ok(p) = p.dyn_into::<js_sys::Promise>() {
            if let Err(e) = JsFuture::from(p).await {
                web_sys::console::warn_1(
                    &format!("sw-outbox: sync not registered: {}", describe(&e)).into(),
                );
            }
        }
    }
}
