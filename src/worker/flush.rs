//! A flush (contract section 4): identity gate, planner-driven lanes, each answer
//! classified and its new state stored before anything later in its workspace is sent
//! (`worker::steps`), then the reports.

use super::http::{discard_body, header, identity, read_bounded, send, Deadline};
use super::{absolute, clients, now_ms, Inner, Trigger};
use crate::core::answer::{
    classify, expire, settle, AnswerBody, ReplayAnswer, Settlement, Verdict,
};
use crate::core::backoff::{Backoff, FlushEnd};
use crate::core::identity::Identity;
use crate::core::key::IdempotencyKey;
use crate::core::notify::Sent as SentKinds;
use crate::core::planner::{PlanItem, Replay};
use crate::core::record::{AttentionReason, Credentials, RecordId, RecordMeta};
use crate::core::route::{record_is_auth_route, replay_path};
use crate::protocol::{BlockedEntry, Outgoing};
use crate::store::{next, QueueItem, ReplayStep, StepDone};
use futures_channel::{mpsc, oneshot};
use std::collections::HashMap;
use std::rc::Rc;
use web_sys::{
    Headers, RequestCache, RequestCredentials, RequestInit, RequestRedirect, Response, ResponseType,
};

/// What a flush achieved, for `COMMAND_RESULT` and for the sync event.
#[derive(Debug, Clone, Default)]
pub struct FlushOutcome {
    pub replayed: usize,
    /// Why the flush did not run or did not reach the server (`None`: it ran).
    pub not_run: Option<String>,
    /// Work is left that a later trigger should retry.
    pub retry_later: bool,
}

/// A caller waiting for the flush after the running one: `seen` is how many records the
/// running flush had replayed when it asked.
pub(super) struct Waiter {
    tx: oneshot::Sender<FlushOutcome>,
    seen: usize,
}

/// Asks for a flush. One runs at a time; asking during one schedules exactly one more
/// after it, which every caller that asked meanwhile shares. A caller that joined is
/// answered with what the rerun replayed plus what the running flush replayed after it
/// asked: a page's `FLUSH_QUEUE` that meets a `sync` flush under way still counts the
/// records that flush delivered for it.
pub async fn request(inner: &Rc<Inner>, trigger: Trigger) -> FlushOutcome {
    let waiting = {
        let mut st = inner.flush.borrow_mut();
        if st.running {
            let (tx, rx) = oneshot::channel();
            let seen = st.replayed_now;
            st.again
                .get_or_insert_with(Vec::new)
                .push(Waiter { tx, seen });
            Some(rx)
        } else {
            st.running = true;
            st.replayed_now = 0;
            None
        }
    };
    if let Some(rx) = waiting {
        return rx.await.unwrap_or_default();
    }
    let first = run_in_chain(inner, trigger).await;
    if let Some(waiters) = next_waiters(inner) {
        // The rerun is kept alive by the events of the callers waiting for it.
        let inner = inner.clone();
        let mut waiters = carried(waiters, &first);
        wasm_bindgen_futures::spawn_local(async move {
            loop {
                let out = run_in_chain(&inner, Trigger::Page).await;
                for (tx, carry) in waiters {
                    let mut o = out.clone();
                    o.replayed += carry;
                    let _ = tx.send(o);
                }
                match next_waiters(&inner) {
                    Some(w) => waiters = carried(w, &out),
                    None => break,
                }
            }
        });
    }
    first
}

/// After a flush: the callers the next run serves, or `None` when nobody asked (flushing
/// stops). The next run is committed here, synchronously, so its count starts at 0 now: a
/// caller who joins while that run still waits for the queue's chain has seen none of it.
fn next_waiters(inner: &Inner) -> Option<Vec<Waiter>> {
    let mut st = inner.flush.borrow_mut();
    let next = st.again.take();
    match next {
        Some(_) => st.replayed_now = 0,
        None => st.running = false,
    }
    next
}

/// What the flush the waiters joined replayed after each asked.
fn carried(
    waiters: Vec<Waiter>,
    joined: &FlushOutcome,
) -> Vec<(oneshot::Sender<FlushOutcome>, usize)> {
    waiters
        .into_iter()
        .map(|w| (w.tx, joined.replayed.saturating_sub(w.seen)))
        .collect()
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

/// The identity a flush replays under: the account, its CSRF token, and how many times
/// it was checked in this flush (a stale-identity answer checks it again once).
struct Who {
    user: String,
    csrf: Option<String>,
    generation: u32,
}

/// One flush. Runs inside the chain.
async fn flush(inner: &Rc<Inner>, trigger: Trigger) -> FlushOutcome {
    let cfg = &inner.config;
    let store = &inner.store;
    let started = now_ms();
    let deadline = started + cfg.flush_budget_ms as u64;
    let max_hold = cfg.max_retry_after_ms as u64;
    let backoff = store
        .backoff()
        .await
        .unwrap_or_default()
        .clamped(started, max_hold);
    if !backoff.may_flush(trigger, started) {
        inner.retry_at(backoff);
        return not_run(
            "waiting: the server asked to retry later, or the last attempts failed",
            true,
        );
    }
    let me_url = absolute(&cfg.auth_me_path);
    let checked = identity(&me_url, None, cfg.attempt_timeout_ms).await;
    match &checked {
        Some(_) => inner.network_answered(),
        None => inner.network_failed(),
    }
    let (user, csrf) = match checked {
        None => {
            save_backoff(
                inner,
                backoff,
                backoff.after(FlushEnd::Transient, now_ms(), jitter(), max_hold),
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
    let items = match read_all(inner).await {
        Ok(items) => items,
        Err(e) => return not_run(format!("the queue could not be read: {e}"), true),
    };
    let mut metas: HashMap<RecordId, RecordMeta> = HashMap::new();
    let mut expired_now = 0;
    let mut first_expired: Option<RecordId> = None;
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
                        first_expired = first_expired.or(Some(m.id));
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
    // For the notification: what was sent, by kind, and the first record that now needs
    // a person (expired first).
    let mut sent_kinds = SentKinds::default();
    let mut first_attention = first_expired;
    if let Some(u) = &user {
        let mut who = Who {
            user: u.clone(),
            csrf,
            generation: 0,
        };
        let lanes = cfg.replay_concurrency as usize;
        let (tx, mut rx) = mpsc::unbounded::<Sent>();
        inner.open_steps();
        loop {
            if now_ms() >= deadline {
                replay.stop();
            }
            for id in replay.next_sends(lanes) {
                let first_send = metas.get(&id).is_some_and(|m| m.first_sent_at.is_none());
                let (inner, tx, csrf) = (inner.clone(), tx.clone(), who.csrf.clone());
                let generation = who.generation;
                wasm_bindgen_futures::spawn_local(async move {
                    let sent = send_one(&inner, id, csrf.as_deref(), first_send, generation).await;
                    let _ = tx.unbounded_send(sent);
                });
            }
            if replay.in_flight() == 0 {
                break;
            }
            let Some(sent) = next(&mut rx).await else {
                break;
            };
            if let Verdict::StaleIdentity { .. } = sent.verdict {
                if stale_identity(inner, &mut who, &sent).await {
                    // Sent again with the fresh token, in its place.
                    replay.retry(sent.id);
                    continue;
                }
            }
            end = worse(end, &sent.verdict);
            if sent.verdict == Verdict::Replayed {
                if let Some(m) = metas.get(&sent.id) {
                    sent_kinds.count(&m.method);
                }
            }
            if sent.attention.is_some() {
                first_attention = Some(first_attention.map_or(sent.id, |f| f.min(sent.id)));
            }
            replay.on_outcome(sent.id, &sent.verdict, sent.attention);
            inner.flush.borrow_mut().replayed_now = replay.replayed();
            if !sent.persisted {
                // Its new state is not stored: stop between records rather than let the
                // workspace move on past an unrecorded outcome.
                replay.stop();
            }
        }
        // Every new state is stored (or known not to be) before anything is reported.
        if !inner.steps_stored().await {
            replay.stop();
        }
    }
    save_backoff(
        inner,
        backoff,
        backoff.after(end, now_ms(), jitter(), max_hold),
    )
    .await;

    let blocked = replay
        .blocked()
        .into_iter()
        .map(|(id, reason)| BlockedEntry::of(id, metas.get(&id), reason, user.as_deref()))
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
    super::notify::after_flush(
        inner,
        trigger,
        user.as_deref(),
        &sent_kinds,
        attention,
        first_attention,
    )
    .await;
    FlushOutcome {
        replayed,
        not_run: None,
        retry_later: end != FlushEnd::Clean || replay.is_stopped(),
    }
}

/// Every stored value, with values under foreign keys given ids first so that they are
/// reported (`corrupt-record`) instead of counted but invisible.
pub(super) async fn read_all(inner: &Inner) -> Result<Vec<QueueItem>, crate::store::idb::IdbError> {
    let (items, foreign) = inner.store.read_queue().await?;
    if foreign == 0 {
        return Ok(items);
    }
    inner.store.rekey_foreign().await?;
    // The generation moved: the view reloads at its next use.
    inner.reload().await;
    Ok(inner.store.read_queue().await?.0)
}

/// A stale-identity answer (a CSRF 403, or 409 `account_mismatch`): whether the record
/// is to be sent again. The identity is checked again once per flush (a fresh
/// `/auth/me`, a fresh token); an answer to a request sent before that check is sent
/// again with the new token; one sent after it stops the flush, the record unchanged.
async fn stale_identity(inner: &Inner, who: &mut Who, sent: &Sent) -> bool {
    if sent.generation < who.generation {
        return true;
    }
    if who.generation > 0 {
        return false;
    }
    who.generation += 1;
    let cfg = &inner.config;
    match identity(&absolute(&cfg.auth_me_path), None, cfg.attempt_timeout_ms).await {
        Some(Identity::SignedIn { user, csrf }) if user == who.user => {
            who.csrf = csrf;
            true
        }
        // Signed out, another account, or unreachable: this flush's plan no longer
        // holds; the record waits, unchanged, for the next flush.
        _ => false,
    }
}

/// The backoff-relevant worst of a flush's outcomes.
fn worse(so_far: FlushEnd, v: &Verdict) -> FlushEnd {
    match (so_far, v) {
        (FlushEnd::RetryAfter(_), _) => so_far,
        (_, Verdict::RetryLater { after_ms }) => FlushEnd::RetryAfter(*after_ms),
        (_, Verdict::NetworkFailure | Verdict::ServerFailure { .. } | Verdict::InProgress) => {
            FlushEnd::Transient
        }
        _ => so_far,
    }
}

/// Persists the backoff state when a flush changed it (a strict write per flush
/// otherwise, for nothing), and keeps a live worker retrying on it.
async fn save_backoff(inner: &Rc<Inner>, old: Backoff, new: Backoff) {
    if new != old {
        let _ = inner.store.set_backoff(&new).await;
    }
    inner.retry_at(new);
}

fn jitter() -> f64 {
    js_sys::Math::random()
}

/// One record's replay, as the lane reports it back to the flush.
struct Sent {
    id: RecordId,
    verdict: Verdict,
    /// The reason it now needs a person, when its answer moved it there.
    attention: Option<AttentionReason>,
    /// `false`: the record could not be read or marked for sending, and the flush stops.
    persisted: bool,
    /// The identity check it was sent under.
    generation: u32,
}

fn credentials_mode(c: Credentials) -> RequestCredentials {
    match c {
        Credentials::Include => RequestCredentials::Include,
        Credentials::SameOrigin => RequestCredentials::SameOrigin,
        Credentials::Omit => RequestCredentials::Omit,
    }
}

/// The answer as `core::answer::classify` reads it, its body read within bounds.
async fn read_answer(response: Response, deadline: &Deadline) -> Verdict {
    let headers = response.headers();
    let retry_after = header(&headers, "Retry-After");
    let replayed = header(&headers, "Idempotent-Replayed")
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    let status = response.status();
    let opaque_redirect = response.type_() == ResponseType::Opaqueredirect;
    let body = if (200..300).contains(&status) || opaque_redirect {
        discard_body(&response);
        None
    } else {
        Some(read_bounded(&response, deadline).await)
    };
    let json = body.as_ref().and_then(|b| b.json());
    let answer_body = match (&json, &body) {
        (Some(v), _) => AnswerBody::Json(v),
        (None, Some(b)) if !b.text.is_empty() => AnswerBody::Text(&b.text),
        _ => AnswerBody::None,
    };
    classify(
        Some(ReplayAnswer {
            status,
            opaque_redirect,
            retry_after: retry_after.as_deref(),
            replayed,
            body: answer_body,
        }),
        now_ms(),
    )
}

/// Sends one record and persists what its answer means.
async fn send_one(
    inner: &Rc<Inner>,
    id: RecordId,
    csrf: Option<&str>,
    first_send: bool,
    generation: u32,
) -> Sent {
    let done = |verdict, attention, persisted| Sent {
        id,
        verdict,
        attention,
        persisted,
        generation,
    };
    let cfg = &inner.config;
    let begin = ReplayStep::Begin {
        id,
        now_ms: now_ms(),
        first_send,
    };
    let (meta, body) = match inner.replay_step(begin, None).await {
        Ok(StepDone::Begun(Some(found))) => found,
        // Gone (cleared) or unreadable since it was planned: nothing to send.
        Ok(_) => return done(Verdict::Replayed, None, true),
        Err(_) => return done(Verdict::NetworkFailure, None, false),
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
                    return done(Verdict::NetworkFailure, None, false);
                }
                k
            }
            None => return done(Verdict::NetworkFailure, None, false),
        },
    };
    let Ok(headers) = Headers::new() else {
        return done(Verdict::NetworkFailure, None, false);
    };
    // The page's own headers first (only those `replayHeaders` allows were stored, and
    // they are checked again here), then the ones the outbox owns.
    for (name, value) in &meta.headers {
        if cfg.stores_header(name) {
            let _ = headers.append(name, value);
        }
    }
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
    init.set_credentials(credentials_mode(meta.credentials));
    init.set_cache(RequestCache::NoStore);
    // A redirect is never followed: a 303 would turn the write into a GET that answers
    // 200, and a 307 to another origin would resend the body there (contract 4.4).
    init.set_redirect(RequestRedirect::Manual);
    if let Some(body) = &body {
        init.set_body(body);
    }
    drop(body);
    let url = absolute(&replay_path(&meta.path, cfg));
    let verdict = match send(&init, &url, cfg.attempt_timeout_ms, None).await {
        Err(_) => {
            inner.network_failed();
            classify(None, now_ms())
        }
        Ok((response, deadline)) => {
            inner.network_answered();
            let v = read_answer(response, &deadline).await;
            drop(deadline);
            v
        }
    };
    let settlement = settle(&meta, &verdict, cfg);
    let attention = settlement.moved_to_attention();
    let step = match settlement {
        Settlement::Unchanged => None,
        Settlement::Delete => Some((ReplayStep::Delete(id), inner.record_lane(&meta))),
        Settlement::Update(m) => Some((ReplayStep::Update(id, m.mutable_fields()), None)),
    };
    // Its new state is handed to the group commit and not awaited: the next record of
    // its lane may be handed out before it committed, as that record's own mark commits
    // after it (and fails if it failed); the flush waits for every step before it reports.
    if let Some((step, lane)) = step {
        inner.hand_over_step(step, lane);
    }
    done(verdict, attention, true)
}
