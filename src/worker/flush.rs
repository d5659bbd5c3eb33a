//! A flush (contract section 4): identity gate, planner-driven lanes, each answer
//! classified and persisted before its workspace moves on, then the reports.

use super::http::{fetch_with_timeout, header, identity, json_body};
use super::{absolute, clients, now_ms, Inner, Trigger};
use crate::core::answer::{classify, expire, settle, ReplayAnswer, Settlement, Verdict};
use crate::core::backoff::{Backoff, FlushEnd};
use crate::core::identity::Identity;
use crate::core::key::IdempotencyKey;
use crate::core::planner::{PlanItem, Replay};
use crate::core::record::{RecordId, RecordMeta, RecordState};
use crate::core::route::{record_is_auth_route, replay_path};
use crate::protocol::{BlockedEntry, Outgoing};
use crate::store::{body_bytes, next, QueueItem};
use futures_channel::{mpsc, oneshot};
use std::collections::HashMap;
use std::rc::Rc;
use web_sys::{Headers, RequestCache, RequestCredentials, RequestInit};

/// What a flush achieved, for `COMMAND_RESULT` and for the sync event.
#[derive(Debug, Clone, Default)]
pub struct FlushOutcome {
    pub replayed: usize,
    /// Why the flush did not run or did not reach the server (`None`: it ran).
    pub not_run: Option<String>,
    /// Work is left that a later trigger should retry.
    pub retry_later: bool,
}

/// Asks for a flush. One runs at a time; asking during one schedules exactly one more
/// after it, which every caller that asked meanwhile shares.
pub async fn request(inner: &Rc<Inner>, trigger: Trigger) -> FlushOutcome {
    let waiting = {
        let mut st = inner.flush.borrow_mut();
        if st.running {
            let (tx, rx) = oneshot::channel();
            st.again.get_or_insert_with(Vec::new).push(tx);
            Some(rx)
        } else {
            st.running = true;
            None
        }
    };
    if let Some(rx) = waiting {
        return rx.await.unwrap_or_default();
    }
    let first = run_in_chain(inner, trigger).await;
    let again = inner.flush.borrow_mut().again.take();
    match again {
        None => inner.flush.borrow_mut().running = false,
        Some(waiters) => {
            // The rerun is kept alive by the events of the callers waiting for it.
            let inner = inner.clone();
            wasm_bindgen_futures::spawn_local(async move {
                let mut waiters = waiters;
                loop {
                    let out = run_in_chain(&inner, Trigger::Page).await;
                    for w in waiters {
                        let _ = w.send(out.clone());
                    }
                    let next = inner.flush.borrow_mut().again.take();
                    match next {
                        Some(w) => waiters = w,
                        None => {
                            inner.flush.borrow_mut().running = false;
                            break;
                        }
                    }
                }
            });
        }
    }
    first
}

async fn run_in_chain(inner: &Rc<Inner>, trigger: Trigger) -> FlushOutcome {
    let me = inner.clone();
    inner
        .in_chain(Box::pin(async move { flush(&me, trigger).await }))
        .await
}

fn not_run(why: impl Into<String>, retry_later: bool) -> FlushOutcome {
    FlushOutcome {
        replayed: 0,
        not_run: Some(why.into()),
        retry_later,
    }
}

/// One flush. Runs inside the chain.
async fn flush(inner: &Rc<Inner>, trigger: Trigger) -> FlushOutcome {
    let cfg = &inner.config;
    let store = &inner.store;
    let started = now_ms();
    let deadline = started + cfg.flush_budget_ms as u64;
    let backoff = store.backoff().await.unwrap_or_default();
    if !backoff.may_flush(trigger, started) {
        return not_run(
            "waiting: the server asked to retry later, or the last attempts failed",
            true,
        );
    }
    let me_url = absolute(&cfg.auth_me_path);
    let (user, csrf) = match identity(&me_url, None, cfg.attempt_timeout_ms).await {
        None => {
            save_backoff(
                inner,
                backoff,
                backoff.after(FlushEnd::Transient, now_ms(), jitter()),
            )
            .await;
            return not_run("the identity check failed: offline", true);
        }
        Some(Identity::Unavailable { status }) => {
            return not_run(format!("the identity check answered {status}"), true);
        }
        Some(Identity::SignedOut) => (None, None),
        Some(Identity::SignedIn { user, csrf }) => (Some(user), csrf),
    };
    let items = match store.read_queue().await {
        Ok(items) => items,
        Err(e) => return not_run(format!("the queue could not be read: {e}"), true),
    };
    let mut metas: HashMap<RecordId, RecordMeta> = HashMap::new();
    let mut expired_now = 0;
    let mut plan = Vec::with_capacity(items.len());
    // Consumed, not cloned: the flush holds one copy of each record's metadata.
    for item in items {
        match item {
            QueueItem::Record(mut m) => {
                if let Some(expired) = expire(&m, started, cfg) {
                    if store
                        .write_fields(m.id, &expired.mutable_fields())
                        .await
                        .is_ok()
                    {
                        m = expired;
                        expired_now += 1;
                    }
                }
                let auth = record_is_auth_route(&m.path, cfg, &*inner.patterns);
                plan.push(PlanItem::of(&m, auth));
                metas.insert(m.id, m);
            }
            QueueItem::Corrupt(id, _) => plan.push(PlanItem::corrupt(id)),
        }
    }
    let total = plan.len();
    let mut replay = Replay::new(plan, user.clone());
    let mut end = FlushEnd::Clean;
    if user.is_some() {
        let lanes = cfg.replay_concurrency as usize;
        let (tx, mut rx) = mpsc::unbounded::<Sent>();
        loop {
            if now_ms() >= deadline {
                replay.stop();
            }
            for id in replay.next_sends(lanes) {
                let (inner, tx, csrf) = (inner.clone(), tx.clone(), csrf.clone());
                wasm_bindgen_futures::spawn_local(async move {
                    let _ = tx.unbounded_send(send_one(&inner, id, csrf.as_deref()).await);
                });
            }
            if replay.in_flight() == 0 {
                break;
            }
            let Some(sent) = next(&mut rx).await else {
                break;
            };
            end = worse(end, &sent.verdict);
            replay.on_outcome(sent.id, &sent.verdict, sent.moved_to_attention);
            if !sent.persisted {
                // Its new state is not stored: stop between records rather than let the
                // workspace move on past an unrecorded outcome.
                replay.stop();
            }
        }
    }
    save_backoff(inner, backoff, backoff.after(end, now_ms(), jitter())).await;

    let blocked = replay
        .blocked()
        .into_iter()
        .map(|(id, reason)| {
            let m = metas.get(&id);
            BlockedEntry {
                id,
                method: m.map(|m| m.method.clone()),
                path: m.map(|m| m.path.clone()),
                owner_id: m.and_then(|m| m.owner.clone()),
                workspace: m.and_then(|m| m.workspace.clone()),
                reason,
            }
        })
        .collect();
    clients::broadcast(&Outgoing::Blocked { blocked }).await;
    let replayed = replay.replayed();
    let remaining = store.count().await.ok().map(|n| n as usize);
    clients::broadcast(&Outgoing::flush_summary(
        replayed,
        remaining,
        total.saturating_sub(replayed),
    ))
    .await;
    let attention = replay.moved_to_attention() + expired_now;
    super::notify::after_flush(inner, trigger, user.as_deref(), replayed, attention).await;
    FlushOutcome {
        replayed,
        not_run: None,
        retry_later: end != FlushEnd::Clean || replay.is_stopped(),
    }
}

/// The backoff-relevant worst of a flush's outcomes.
fn worse(so_far: FlushEnd, v: &Verdict) -> FlushEnd {
    match (so_far, v) {
        (FlushEnd::RetryAfter(_), _) => so_far,
        (_, Verdict::RetryLater { after_ms }) => FlushEnd::RetryAfter(*after_ms),
        (_, Verdict::NetworkFailure | Verdict::ServerFailure { .. }) => FlushEnd::Transient,
        _ => so_far,
    }
}

/// Persists the backoff state when a flush changed it (a strict write per flush
/// otherwise, for nothing).
async fn save_backoff(inner: &Inner, old: Backoff, new: Backoff) {
    if new != old {
        let _ = inner.store.set_backoff(&new).await;
    }
}

fn jitter() -> f64 {
    js_sys::Math::random()
}

/// One record's replay, as the lane reports it back to the flush.
struct Sent {
    id: RecordId,
    verdict: Verdict,
    moved_to_attention: bool,
    /// Whether the record's new state reached IndexedDB.
    persisted: bool,
}

/// Sends one record and persists what its answer means.
async fn send_one(inner: &Rc<Inner>, id: RecordId, csrf: Option<&str>) -> Sent {
    let done = |verdict, moved_to_attention, persisted| Sent {
        id,
        verdict,
        moved_to_attention,
        persisted,
    };
    let cfg = &inner.config;
    let (meta, value) = match inner.store.begin_send(id).await {
        Ok(Some(found)) => found,
        // Gone (cleared) or unreadable since it was planned: nothing to send.
        Ok(None) => return done(Verdict::Replayed, false, true),
        Err(_) => return done(Verdict::NetworkFailure, false, false),
    };
    let key = match &meta.key {
        Some(k) => k.clone(),
        None => match IdempotencyKey::mint_opt() {
            Some(k) => {
                let mut m = meta.clone();
                m.key = Some(k.clone());
                if inner
                    .store
                    .write_fields(id, &m.mutable_fields())
                    .await
                    .is_err()
                {
                    return done(Verdict::NetworkFailure, false, false);
                }
                k
            }
            None => return done(Verdict::NetworkFailure, false, false),
        },
    };
    let Ok(headers) = Headers::new() else {
        return done(Verdict::NetworkFailure, false, false);
    };
    let _ = headers.set(super::fetch::IDEMPOTENCY_KEY, key.as_str());
    if let Some(owner) = &meta.owner {
        let _ = headers.set(&cfg.expected_account_header, owner);
    }
    if let Some(t) = csrf {
        let _ = headers.set(&cfg.csrf_header, t);
    }
    if let Some(ct) = &meta.content_type {
        let _ = headers.set("Content-Type", ct);
    }
    let init = RequestInit::new();
    init.set_method(&meta.method);
    init.set_headers(&headers);
    init.set_credentials(RequestCredentials::Include);
    init.set_cache(RequestCache::NoStore);
    if let Some(body) = body_bytes(&value) {
        init.set_body(&body);
    }
    drop(value);
    let url = absolute(&replay_path(&meta.path, cfg));
    let verdict = match fetch_with_timeout(&init, &url, cfg.attempt_timeout_ms).await {
        Err(_) => classify(None, now_ms()),
        Ok(response) => {
            let retry_after = header(&response.headers(), "Retry-After");
            let status = response.status();
            let body = if (200..300).contains(&status) {
                None
            } else {
                json_body(&response).await
            };
            classify(
                Some(ReplayAnswer {
                    status,
                    retry_after: retry_after.as_deref(),
                    body: body.as_ref(),
                }),
                now_ms(),
            )
        }
    };
    let (moved, persisted) = match settle(&meta, &verdict, cfg) {
        Settlement::Delete => {
            let deleted = inner.store.delete(id).await.is_ok();
            if let Some(lane) = inner.record_lane(&meta).filter(|_| deleted) {
                inner.lane_resolved(&lane);
            }
            (false, deleted)
        }
        Settlement::Unchanged => (false, true),
        Settlement::Update(m) => (
            matches!(m.state, RecordState::NeedsAttention(_)),
            inner
                .store
                .write_fields(id, &m.mutable_fields())
                .await
                .is_ok(),
        ),
    };
    done(verdict, moved, persisted)
}
