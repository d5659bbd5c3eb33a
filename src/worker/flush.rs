//! A flush (contract section 4): identity gate, planner-driven lanes, each answer
//! classified and its new state stored before anything later in its workspace is sent
//! (`worker::steps`), then the reports. Every stop is classified (`core::delivery`),
//! reported, persisted for `LIST_QUEUE`, and retried (r3, 4.8); no replay is sent while a
//! sign-in may be changing the session (`worker::barrier`, r3, 4.5 end).

use super::barrier::Held as Fence;
use super::http::{discard_body, header, identity, read_bounded, send, Deadline, IdentityAnswer};
use super::{absolute, clients, now_ms, Inner, Trigger};
use crate::channel::{mpsc, oneshot};
use crate::core::answer::{
    after_recheck, check_age, classify, replay_unavailable_status, settle, Age, AnswerBody,
    ReplayAnswer, Settlement, Verdict,
};
use crate::core::backoff::{Backoff, FlushEnd};
use crate::core::barrier::Checked;
use crate::core::content::is_textual;
use crate::core::credential::{Bearer, Credential};
use crate::core::delivery::{identity_unavailable, retry_at, Delivery, StopReason};
use crate::core::identity::Identity;
use crate::core::key::IdempotencyKey;
use crate::core::notify::Sent as SentKinds;
use crate::core::planner::{Decision, PlanItem, Replay};
use crate::core::record::{AttentionReason, Credentials, RecordId, RecordMeta, RecordState};
use crate::core::route::{record_is_auth_route, replay_path};
use crate::protocol::{BlockedEntry, Outgoing};
use crate::store::{next, QueueItem, ReplayStep, StepDone};
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
    /// Settles once the retry it scheduled ran, when that retry is near: the event that
    /// asked for the flush keeps the worker alive for it (`worker::retry`).
    pub keep_alive: Option<js_sys::Promise>,
    /// It sent pages a summary (`MUTATIONS_REPLAYED` or `MUTATIONS_PARTIAL`).
    pub reported: bool,
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
    // Only the active version of a registration flushes (4.5, r4): an installing or
    // waiting version's triggers, and the timers of a version being replaced, start
    // nothing.
    if !inner.is_active_version() {
        return not_run(
            "this worker is not its registration's active version",
            false,
        );
    }
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
        .in_chain(Box::pin(async move {
            let out = flush(&me, trigger).await;
            // Its identity holds no longer: the origin's fence is let go of (r4).
            me.replays_done();
            out
        }))
        .await
}

fn not_run(why: impl Into<String>, retry_later: bool) -> FlushOutcome {
    FlushOutcome {
        replayed: 0,
        not_run: Some(why.into()),
        retry_later,
        keep_alive: None,
        reported: false,
    }
}

/// The identity a flush replays under: the account, its CSRF token, the sign-in
/// barrier's token of the check that named it, how many times it was checked again in
/// this flush, and whether the one re-check a stale-identity answer earns was spent.
struct Who {
    user: String,
    csrf: Option<String>,
    /// A bearer session's credential (r3): this account's replays carry it.
    credential: Option<Credential>,
    checked: Checked,
    generation: u32,
    stale_rechecked: bool,
}

/// An identity check of a flush.
enum Check {
    SignedIn {
        user: String,
        csrf: Option<String>,
        checked: Checked,
        credential: Option<Credential>,
    },
    SignedOut,
    /// No identity could be read: the flush stops (contract 4.1, 4.8).
    Stopped(Stop),
}

/// Why a flush stopped before it read the queue, and what follows.
struct Stop {
    stop: StopReason,
    end: FlushEnd,
    why: String,
    /// The account whose credential the pages are asked for (`AUTH_NEEDED`, r3) once
    /// the stop is stored, so that the `AUTH_SESSION` answering it finds the stop it
    /// resumes.
    ask: Option<String>,
}

/// Checks who is signed in, once no session change is open, and only as an answer to a
/// request sent after the last one was settled (a sign-in seen while `/auth/me` was on
/// its way voids it: checked again). Stops with `budget` when the deadline passes first.
async fn check_identity(inner: &Rc<Inner>, deadline: u64) -> Check {
    let cfg = &inner.config;
    loop {
        if !settled_before(inner, deadline).await {
            return Check::Stopped(Stop {
                stop: StopReason::Budget,
                end: FlushEnd::Clean,
                why: "a sign-in was still under way when the flush's time ran out".into(),
                ask: None,
            });
        }
        // A bearer session whose credential this worker does not hold (restarted, with
        // `persistAuthorization` false): the pages are asked for it before anything is
        // replayed (r3), and the next `AUTH_SESSION` resumes (`unauthorized` awaits it).
        let bearer = inner.bearer();
        if let Bearer::Missing { user } = &bearer {
            return Check::Stopped(Stop {
                stop: StopReason::Unauthorized,
                end: FlushEnd::Clean,
                why: format!("the credential of {user} is needed: AUTH_NEEDED was sent"),
                ask: Some(user.clone()),
            });
        }
        // The origin's fence (r4): this worker's shared hold, which another worker's
        // sign-in waits for; a change raised while it is awaited sends it back to wait.
        match inner.hold_for_replays(deadline).await {
            Fence::Yes => {}
            Fence::Raised => continue,
            Fence::TimedOut => {
                return Check::Stopped(Stop {
                    stop: StopReason::Budget,
                    end: FlushEnd::Clean,
                    why: "a sign-in elsewhere in the origin was still under way when the flush's time ran out".into(),
                    ask: None,
                })
            }
        }
        let Some(checked) = inner.identity_check_begins() else {
            continue;
        };
        let credential = match &bearer {
            Bearer::Held(c) => Some(c.clone()),
            _ => None,
        };
        let answer = identity(
            &absolute(&cfg.auth_me_path),
            None,
            credential.as_ref().map(|c| c.authorization.as_str()),
            cfg.attempt_timeout_ms,
            &cfg.csrf_header,
        )
        .await;
        if answer.network_answered() {
            inner.network_answered();
        } else {
            inner.network_failed();
        }
        let (identity, retry_after) = match answer {
            IdentityAnswer::Offline => {
                return Check::Stopped(Stop {
                    stop: StopReason::Offline,
                    end: FlushEnd::Transient,
                    why: "the identity check failed: offline".into(),
                    ask: None,
                })
            }
            IdentityAnswer::Stalled => {
                return Check::Stopped(Stop {
                    stop: StopReason::IdentityCheck,
                    end: FlushEnd::Transient,
                    why: "the identity check's answer did not arrive in time".into(),
                    ask: None,
                })
            }
            IdentityAnswer::Answered {
                identity,
                retry_after,
            } => (identity, retry_after),
        };
        if !inner.replay_allowed(checked) {
            continue;
        }
        return match identity {
            Identity::SignedIn { user, csrf } => Check::SignedIn {
                user,
                csrf,
                checked,
                credential,
            },
            // The server did not take the credential (expired): the pages are asked for a
            // new one, and the flush resumes when it comes (r3, 4.1). Not "signed out":
            // nothing is reported `no-session`.
            Identity::SignedOut if credential.is_some() => {
                let user = credential.as_ref().map_or("", |c| c.user.as_str());
                inner.credential_refused(credential.as_ref().map(|c| &c.authorization));
                Check::Stopped(Stop {
                    stop: StopReason::Unauthorized,
                    end: FlushEnd::Clean,
                    why: format!(
                        "the server refused the credential of {user}: AUTH_NEEDED was sent"
                    ),
                    ask: Some(user.to_owned()),
                })
            }
            Identity::SignedOut => Check::SignedOut,
            Identity::Unavailable { status } => Check::Stopped(Stop {
                stop: StopReason::IdentityCheck,
                end: identity_unavailable(status, retry_after.as_deref(), now_ms()),
                why: format!("the identity check answered {status}"),
                ask: None,
            }),
        };
    }
}

/// Waits until no session change is open, or until `deadline`: whether it is settled.
async fn settled_before(inner: &Inner, deadline: u64) -> bool {
    let left = deadline.saturating_sub(now_ms());
    if left == 0 {
        return !inner.barrier_open();
    }
    // A callback timer and a oneshot (gloo's TimeoutFuture would bring futures-channel
    // back into the module); dropping `_timeout` clears the timer.
    let (fired, timer) = oneshot::channel::<()>();
    let _timeout =
        gloo_timers::callback::Timeout::new(left.min(i32::MAX as u64) as u32, move || {
            let _ = fired.send(());
        });
    let settled = inner.session_changes_settled();
    let mut timer = std::pin::pin!(timer);
    let mut settled = std::pin::pin!(settled);
    std::future::poll_fn(|cx| {
        use std::future::Future;
        if settled.as_mut().poll(cx).is_ready() {
            return std::task::Poll::Ready(true);
        }
        if timer.as_mut().poll(cx).is_ready() {
            return std::task::Poll::Ready(false);
        }
        std::task::Poll::Pending
    })
    .await
}

/// What a re-check of the identity in the middle of a flush found.
enum Recheck {
    /// The same account: go on with the fresh token.
    Same,
    /// Another account, or nobody: this flush's plan no longer holds.
    Changed { signed_out: bool },
    /// No identity: the flush stops (with the account whose credential is asked for).
    Failed(StopReason, FlushEnd, Option<String>),
}

/// Checks the identity again (after a session change, or a stale-identity answer).
async fn recheck(inner: &Rc<Inner>, who: &mut Who, deadline: u64) -> Recheck {
    who.generation += 1;
    match check_identity(inner, deadline).await {
        Check::SignedIn {
            user,
            csrf,
            checked,
            credential,
        } if user == who.user => {
            who.csrf = csrf;
            who.checked = checked;
            who.credential = credential;
            Recheck::Same
        }
        Check::SignedIn { .. } => Recheck::Changed { signed_out: false },
        Check::SignedOut => Recheck::Changed { signed_out: true },
        Check::Stopped(Stop { stop, end, ask, .. }) => Recheck::Failed(stop, end, ask),
    }
}

/// How a flush ended, as the shell acts on it.
struct Ending {
    stop: Option<StopReason>,
    end: FlushEnd,
    /// Records were left queued to be tried again (not a stop).
    held: bool,
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
        let mut out = not_run(
            "waiting: the server asked to retry later, or the last attempts failed",
            true,
        );
        out.keep_alive = inner.retry_when(Some(backoff.next_automatic().max(started + 1)));
        return out;
    }
    let (user, csrf, checked, credential) = match check_identity(inner, deadline).await {
        Check::SignedIn {
            user,
            csrf,
            checked,
            credential,
        } => (Some(user), csrf, Some(checked), credential),
        Check::SignedOut => (None, None, None, None),
        Check::Stopped(stop) => {
            return stopped_before_reading(inner, trigger, backoff, started, stop).await;
        }
    };
    let items = match read_all(inner).await {
        Ok(items) => items,
        Err(e) => {
            let stop = Stop {
                stop: StopReason::Storage,
                end: FlushEnd::Transient,
                why: format!("the queue could not be read: {e}"),
                ask: None,
            };
            return stopped_before_reading(inner, trigger, backoff, started, stop).await;
        }
    };
    let mut metas: HashMap<RecordId, RecordMeta> = HashMap::new();
    let mut expired_now = 0;
    let mut first_expired: Option<RecordId> = None;
    let mut unknown_age = Vec::new();
    let mut plan = Vec::with_capacity(items.len());
    // Consumed, not cloned: the flush holds one copy of each record's metadata.
    for item in items {
        match item {
            QueueItem::Record(mut m) => {
                match check_age(&m, started, cfg) {
                    Age::Sendable => {}
                    Age::Unknown => unknown_age.push(m.id),
                    Age::Expired(expired) => {
                        let stored = store
                            .write_fields(m.id, &expired.mutable_fields())
                            .await
                            .is_ok();
                        if stored {
                            expired_now += 1;
                            first_expired = first_expired.or(Some(m.id));
                        }
                        // Stored or not, it is never sent with its old key (r3: fails
                        // closed): it is planned, and reported, as what it now is.
                        m = *expired;
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
    // A clock behind a record's first send backs off like a transient failure: it is
    // tried again, but not every second while the clock is wrong.
    let mut ending = Ending {
        stop: None,
        end: if unknown_age.is_empty() {
            FlushEnd::Clean
        } else {
            FlushEnd::Transient
        },
        held: !unknown_age.is_empty(),
    };
    for id in unknown_age {
        replay.hold(id);
    }
    // Another identity than the flush's was met: its reports would describe the queue to
    // the wrong account, so they are left to the flush that follows at once.
    let mut identity_changed = false;
    let mut budget_spent = false;
    // For the notification: what was sent, by kind, and the first record that now needs
    // a person (expired first).
    let mut sent_kinds = SentKinds::default();
    let mut first_attention = first_expired;
    // What the server answered each replayed write (r3: `MUTATION_SETTLED`), by account.
    let mut settled: Vec<(String, Outgoing)> = Vec::new();
    // The credential a replay's 401 refused (r3): the pages are asked for a new one.
    let mut refused: Option<Credential> = None;
    // The account whose credential a re-check found refused or missing (r3).
    let mut ask_for: Option<String> = None;
    match (&user, checked) {
        (Some(u), Some(checked)) => {
            let mut who = Who {
                user: u.clone(),
                csrf,
                credential,
                checked,
                generation: 0,
                stale_rechecked: false,
            };
            let lanes = cfg.replay_concurrency as usize;
            let (tx, mut rx) = mpsc::unbounded::<Sent>();
            inner.open_steps();
            loop {
                if now_ms() >= deadline && !replay.is_stopped() {
                    replay.stop();
                    budget_spent = true;
                }
                // A session change since the identity was checked: nothing more is handed
                // out until the account is named again (r3, 4.5 end).
                if !replay.is_stopped() && !inner.replay_allowed(who.checked) {
                    match recheck(inner, &mut who, deadline).await {
                        Recheck::Same => {}
                        Recheck::Changed { signed_out } => {
                            replay.stop();
                            identity_changed = true;
                            ending.stop.get_or_insert(if signed_out {
                                StopReason::SignedOut
                            } else {
                                StopReason::IdentityCheck
                            });
                        }
                        Recheck::Failed(stop, end, ask) => {
                            ask_for = ask_for.or(ask);
                            replay.stop();
                            ending.stop.get_or_insert(stop);
                            ending.end = worst(ending.end, end);
                        }
                    }
                }
                for id in replay.next_sends(lanes) {
                    let first_send = metas.get(&id).is_some_and(|m| m.first_sent_at.is_none());
                    let lane = Lane {
                        csrf: who.csrf.clone(),
                        credential: who.credential.clone(),
                        first_send,
                        generation: who.generation,
                        final_stale: who.stale_rechecked,
                        checked: who.checked,
                    };
                    let (inner, tx) = (inner.clone(), tx.clone());
                    wasm_bindgen_futures::spawn_local(async move {
                        let sent = send_one(&inner, id, lane).await;
                        let _ = tx.unbounded_send(sent);
                    });
                }
                if replay.in_flight() == 0 {
                    break;
                }
                let Some(sent) = next(&mut rx).await else {
                    break;
                };
                match sent.held {
                    // Not sent: a sign-in was seen first. Back to its place; the loop
                    // checks the identity again before it is handed out anew.
                    Some(Held::SignIn) => {
                        replay.retry(sent.id);
                        continue;
                    }
                    Some(Held::Clock) => {
                        replay.hold(sent.id);
                        ending.held = true;
                        ending.end = worst(ending.end, FlushEnd::Transient);
                        continue;
                    }
                    // Gone: nothing to send; the next read of the queue shows what is left.
                    Some(Held::Gone) => {
                        replay.hold(sent.id);
                        continue;
                    }
                    None => {}
                }
                if let Verdict::StaleIdentity { .. } = sent.verdict {
                    match stale_identity(inner, &mut who, &sent, deadline).await {
                        None => {
                            // Sent again with the fresh identity, in its place.
                            replay.retry(sent.id);
                            continue;
                        }
                        Some(Recheck::Changed { .. }) => identity_changed = true,
                        Some(Recheck::Failed(stop, end, ask)) => {
                            ask_for = ask_for.or(ask);
                            ending.stop.get_or_insert(stop);
                            ending.end = worst(ending.end, end);
                        }
                        Some(Recheck::Same) => {}
                    }
                }
                ending.end = worst(ending.end, verdict_end(&sent.verdict));
                if let Some(stop) = StopReason::of_verdict(&sent.verdict) {
                    ending.stop.get_or_insert(stop);
                }
                if matches!(
                    sent.verdict,
                    Verdict::ServerFailure { .. } | Verdict::InProgress
                ) && sent.attention.is_none()
                {
                    ending.held = true;
                }
                if sent.verdict == Verdict::Replayed {
                    if let Some(m) = metas.get(&sent.id) {
                        sent_kinds.count(&m.method);
                    }
                }
                if let Some(answered) = sent.settled {
                    settled.push(answered.report(sent.id));
                }
                if sent.verdict == Verdict::SignedOut && sent.carried_credential {
                    refused = refused.or(who.credential.clone());
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
                    ending.stop.get_or_insert(StopReason::Storage);
                }
            }
            // Every new state is stored (or known not to be) before anything is reported.
            if !inner.steps_stored().await {
                replay.stop();
                ending.stop.get_or_insert(StopReason::Storage);
                // A replayed write whose deletion may not be stored is sent again, and its
                // answer (the server's ledger's) reported then.
                settled.clear();
            }
        }
        _ => {
            // Signed out: every record is reported `no-session`; nothing is sent.
            if total > 0 {
                ending.stop = Some(StopReason::SignedOut);
            }
        }
    }
    if budget_spent && ending.stop.is_none() && replay.decide().contains(&Decision::Wait) {
        ending.stop = Some(StopReason::Budget);
    }
    if let Some(stop) = ending.stop {
        ending.end = worst(ending.end, stop.flush_end());
    }
    let after = backoff.after(ending.end, now_ms(), jitter(), max_hold);
    let replayed = replay.replayed();
    let remaining = store.count().await.ok().map(|n| n as usize);
    let drained = remaining == Some(0);
    let retry = if drained {
        None
    } else {
        retry_at(ending.stop, ending.held, &after, now_ms())
    };
    let delivery = Delivery {
        stopped_by: ending.stop.filter(|_| !drained),
        retry_at: retry,
        last_attempt_at: Some(started),
    };
    save_flush_end(inner, backoff, after, delivery).await;

    // Each replayed write's answer, to its account's windows only (r3, contract 5); kept
    // for an account with no window open (r4).
    clients::settled(inner, settled).await;
    // Asked once the stop is stored: the `AUTH_SESSION` that answers finds what it resumes.
    if let Some(c) = &refused {
        inner.credential_refused(Some(&c.authorization));
        ask_for = ask_for.or(Some(c.user.clone()));
    }
    if let Some(user) = &ask_for {
        clients::ask_for_credential(inner, user).await;
    }
    if !identity_changed {
        // Each window sees the details of its own account's records only (r4: the
        // account it is on, not the flush's).
        let blocked = replay.blocked();
        clients::per_viewer(inner, |viewer| Outgoing::Blocked {
            blocked: blocked
                .iter()
                .map(|&(id, reason)| BlockedEntry::of(id, metas.get(&id), reason, viewer))
                .collect(),
        })
        .await;
    }
    clients::broadcast(&Outgoing::flush_summary(
        replayed,
        remaining,
        total.saturating_sub(replayed),
        delivery.stopped_by,
        delivery.retry_at,
    ))
    .await;
    if !identity_changed {
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
    }
    let keep_alive = after_stop(inner, trigger, &delivery, drained).await;
    if identity_changed {
        // Another account (or nobody) is signed in now: a flush under that identity
        // follows at once, with reports of its own (this one's are not that account's).
        let inner = inner.clone();
        wasm_bindgen_futures::spawn_local(async move {
            request(&inner, trigger).await;
        });
    }
    FlushOutcome {
        replayed,
        not_run: None,
        retry_later: !drained && (ending.stop.is_some() || ending.held || replay.is_stopped()),
        keep_alive,
        reported: true,
    }
}

/// A flush that stopped before it read the queue (the identity check, or the queue's
/// read, failed): the stop is persisted, reported (`MUTATIONS_PARTIAL` with `stoppedBy`
/// and `retryAt`, no `MUTATIONS_BLOCKED`: without an identity nothing can be said of the
/// records) and retried (contract 4.1, 4.8).
async fn stopped_before_reading(
    inner: &Rc<Inner>,
    trigger: Trigger,
    backoff: Backoff,
    started: u64,
    Stop {
        stop,
        end,
        why,
        ask,
    }: Stop,
) -> FlushOutcome {
    let after = backoff.after(
        end,
        now_ms(),
        jitter(),
        inner.config.max_retry_after_ms as u64,
    );
    let remaining = inner.store.count().await.ok().map(|n| n as usize);
    let drained = remaining == Some(0);
    let delivery = Delivery {
        stopped_by: (!drained).then_some(stop),
        retry_at: if drained {
            None
        } else {
            retry_at(Some(stop), false, &after, now_ms())
        },
        last_attempt_at: Some(started),
    };
    save_flush_end(inner, backoff, after, delivery).await;
    if let Some(user) = &ask {
        clients::ask_for_credential(inner, user).await;
    }
    if !drained {
        clients::broadcast(&Outgoing::flush_summary(
            0,
            remaining,
            1,
            delivery.stopped_by,
            delivery.retry_at,
        ))
        .await;
    }
    let keep_alive = after_stop(inner, trigger, &delivery, drained).await;
    let mut out = not_run(why, !drained);
    out.keep_alive = keep_alive;
    out.reported = !drained;
    out
}

/// After a flush that left work: the live worker's timer is armed for `retryAt` (every
/// engine, with or without Background Sync), and where Background Sync exists a sync is
/// registered again (one that gave up after its retries is gone) — except while a sync
/// event is being handled: its rejection already has the browser retry it, and a
/// registration made while it fires would fire again as soon as it ends (a loop of sync
/// events that never lets a new version activate).
async fn after_stop(
    inner: &Rc<Inner>,
    trigger: Trigger,
    delivery: &Delivery,
    drained: bool,
) -> Option<js_sys::Promise> {
    // A retry an earlier flush armed would only meet the same refusal without the
    // sign-in this stop waits for. (A drained queue keeps it: a write queued since the
    // queue was counted may have armed it.)
    if delivery.stopped_by.is_some_and(|s| s.awaits_trigger()) {
        inner.disarm_retry();
    }
    if drained {
        return None;
    }
    let sync_firing = trigger == Trigger::Sync || inner.syncs_firing.get() > 0;
    if delivery.retry_at.is_some() && !sync_firing && inner.background_sync {
        super::retry::register_sync(&inner.config.sync_tag).await;
    }
    inner.retry_when(delivery.retry_at)
}

/// Every stored value, with values under foreign keys given ids first so that they are
/// reported (`corrupt-record`) instead of counted but invisible. A re-keying that fails
/// never fails the read (issue 27, 8): the readable values are returned, and the
/// re-keying is tried again at the next read.
pub(super) async fn read_all(inner: &Inner) -> Result<Vec<QueueItem>, crate::store::idb::IdbError> {
    let (items, foreign) = inner.store.read_queue().await?;
    if foreign == 0 {
        return Ok(items);
    }
    if let Err(e) = inner.store.rekey_foreign().await {
        web_sys::console::warn_1(
            &format!(
                "sw-outbox: {foreign} stored values under foreign keys could not be given ids: {e}"
            )
            .into(),
        );
        return Ok(items);
    }
    // The generation moved: the view reloads at its next use.
    inner.reload().await;
    Ok(inner.store.read_queue().await?.0)
}

/// A stale-identity answer (a CSRF 403, or 409 `account_mismatch`): `None` when the
/// record is to be sent again, else what the re-check found. An answer to a request sent
/// before the last identity check is sent again with that check's token; the first
/// answer after one earns the flush's one re-check (a fresh `/auth/me`, a fresh token);
/// one sent after that re-check stops the flush, the record unchanged (a 403 is already
/// `rejected` by then: `after_recheck`).
async fn stale_identity(
    inner: &Rc<Inner>,
    who: &mut Who,
    sent: &Sent,
    deadline: u64,
) -> Option<Recheck> {
    if sent.generation < who.generation {
        return None;
    }
    if who.stale_rechecked {
        return Some(Recheck::Failed(
            StopReason::AccountMismatch,
            FlushEnd::Transient,
            None,
        ));
    }
    who.stale_rechecked = true;
    match recheck(inner, who, deadline).await {
        Recheck::Same => None,
        other => Some(other),
    }
}

/// The backoff-relevant side of one answer.
fn verdict_end(v: &Verdict) -> FlushEnd {
    match v {
        Verdict::RetryLater { after_ms } => FlushEnd::RetryAfter(*after_ms),
        Verdict::NetworkFailure | Verdict::ServerFailure { .. } | Verdict::InProgress => {
            FlushEnd::Transient
        }
        _ => FlushEnd::Clean,
    }
}

/// The worse of two ends for the backoff: a server's `Retry-After` over a transient
/// failure over a clean end.
fn worst(a: FlushEnd, b: FlushEnd) -> FlushEnd {
    match (a, b) {
        (FlushEnd::RetryAfter(_), _) => a,
        (_, FlushEnd::RetryAfter(_)) => b,
        (FlushEnd::Transient, _) | (_, FlushEnd::Transient) => FlushEnd::Transient,
        _ => FlushEnd::Clean,
    }
}

/// Persists the backoff (when the flush changed it) and the delivery state, in one
/// transaction.
async fn save_flush_end(inner: &Rc<Inner>, old: Backoff, new: Backoff, delivery: Delivery) {
    let changed = (new != old).then_some(&new);
    if let Err(e) = inner.store.set_flush_end(changed, &delivery).await {
        web_sys::console::warn_1(&format!("sw-outbox: delivery state not stored: {e}").into());
    }
}

fn jitter() -> f64 {
    js_sys::Math::random()
}

/// Why a record handed to its lane was not sent, though nothing failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// A sign-in was seen since the identity was checked.
    SignIn,
    /// Its age cannot be known: the clock reads earlier than its first send.
    Clock,
    /// It was not there (or no longer readable) when its lane took it.
    Gone,
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
    /// Not sent, and why.
    held: Option<Held>,
    /// A 2xx answer, for `MUTATION_SETTLED` (r3).
    settled: Option<Answered>,
    /// The request carried the session's credential (a 401 to it asks for a new one).
    carried_credential: bool,
}

/// A replayed write's 2xx answer as pages get it (r3, contract 5): its status, and its
/// body when it is text or JSON read whole within 64 KiB and the attempt's deadline.
struct Answered {
    key: String,
    owner: Option<String>,
    status: u16,
    content_type: Option<String>,
    body: Option<String>,
}

impl Answered {
    /// The report, with the account whose windows get it.
    fn report(self, id: RecordId) -> (String, Outgoing) {
        let account = self.owner.clone().unwrap_or_default();
        (
            account,
            Outgoing::Settled {
                id,
                idempotency_key: self.key,
                owner_id: self.owner,
                status: self.status,
                content_type: self.content_type,
                body: self.body,
            },
        )
    }
}

/// What a lane is given with its record: the identity it is sent under.
struct Lane {
    csrf: Option<String>,
    /// A bearer session's credential: sent with the records of its own account.
    credential: Option<Credential>,
    /// The record never left the worker (its mark is committed strictly).
    first_send: bool,
    generation: u32,
    /// The flush's one stale-identity re-check was made before it was handed out.
    final_stale: bool,
    checked: Checked,
}

fn credentials_mode(c: Credentials) -> RequestCredentials {
    match c {
        Credentials::Include => RequestCredentials::Include,
        Credentials::SameOrigin => RequestCredentials::SameOrigin,
        Credentials::Omit => RequestCredentials::Omit,
    }
}

/// The answer as `core::answer::classify` reads it, its body read within bounds; for a
/// 2xx, what pages are told of it (`MUTATION_SETTLED`, r3): the body is read only when
/// it is text or JSON, at most 64 KiB, within the attempt's deadline — a bigger,
/// binary, stalled or cut one is not given, and the write is settled all the same.
async fn read_answer(response: Response, deadline: &Deadline) -> (Verdict, Option<TwoXx>) {
    let headers = response.headers();
    let retry_after = header(&headers, "Retry-After");
    let replayed = header(&headers, "Idempotent-Replayed")
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    let status = response.status();
    let content_type = header(&headers, "Content-Type");
    let opaque_redirect = response.type_() == ResponseType::Opaqueredirect;
    let two_xx = (200..300).contains(&status) && !opaque_redirect;
    if two_xx {
        let body = if is_textual(content_type.as_deref()) {
            let read = read_bounded(&response, deadline).await;
            (read.complete && !read.text.is_empty()).then_some(read.text)
        } else {
            discard_body(&response);
            None
        };
        let verdict = classify(Some(ReplayAnswer::status(status)), now_ms());
        let answered = TwoXx {
            status,
            content_type: content_type.filter(|_| body.is_some()),
            body,
        };
        return (verdict, Some(answered));
    }
    let body = if opaque_redirect {
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
    let answer = ReplayAnswer {
        status,
        opaque_redirect,
        retry_after: retry_after.as_deref(),
        replayed,
        body: answer_body,
    };
    let verdict = classify(Some(answer), now_ms());
    // A ledger that kept only the status of a 2xx (`idempotency_replay_unavailable`):
    // settled with that status, no body.
    let stored = replay_unavailable_status(&answer)
        .filter(|_| verdict == Verdict::Replayed)
        .map(|status| TwoXx {
            status,
            content_type: None,
            body: None,
        });
    (verdict, stored)
}

/// A 2xx answer's status and readable body.
struct TwoXx {
    status: u16,
    content_type: Option<String>,
    body: Option<String>,
}

/// Sends one record and persists what its answer means.
async fn send_one(inner: &Rc<Inner>, id: RecordId, lane: Lane) -> Sent {
    let generation = lane.generation;
    let done = |verdict, attention, persisted| Sent {
        id,
        verdict,
        attention,
        persisted,
        generation,
        held: None,
        settled: None,
        carried_credential: false,
    };
    let held = |why| Sent {
        id,
        verdict: Verdict::NetworkFailure,
        attention: None,
        persisted: true,
        generation,
        held: Some(why),
        settled: None,
        carried_credential: false,
    };
    if !inner.replay_allowed(lane.checked) {
        return held(Held::SignIn);
    }
    let cfg = &inner.config;
    let begin = ReplayStep::Begin {
        id,
        now_ms: now_ms(),
        first_send: lane.first_send,
    };
    let (meta, body) = match inner.replay_step(begin, None).await {
        Ok(StepDone::Begun(Some(found))) => found,
        // Gone (cleared) or unreadable since it was planned: nothing sent, nothing counted.
        Ok(_) => return held(Held::Gone),
        Err(_) => return done(Verdict::NetworkFailure, None, false),
    };
    // The key window again, now that the record is in its lane (r3, 4.7): the flush may
    // have run long since it started, and the clock may have moved.
    match check_age(&meta, now_ms(), cfg) {
        Age::Sendable => {}
        Age::Unknown => return held(Held::Clock),
        Age::Expired(m) => {
            let reason = match m.state {
                RecordState::NeedsAttention(r) => r,
                RecordState::Queued => AttentionReason::KeyExpired,
            };
            inner.hand_over_step(ReplayStep::Update(id, m.mutable_fields()), None);
            let verdict = Verdict::Attention {
                reason,
                status: m.last_status.unwrap_or(0),
            };
            return done(verdict, Some(reason), true);
        }
    }
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
    if let Some(t) = &lane.csrf {
        let _ = headers.set(&cfg.csrf_header, t);
    }
    // The session's credential, for its own account's records only (r3); a page's own
    // `Authorization` is never stored, so this is the only one a replay carries.
    let authorization = lane
        .credential
        .as_ref()
        .and_then(|c| c.for_owner(meta.owner.as_deref()));
    let carried_credential =
        authorization.is_some_and(|a| headers.set("Authorization", a.as_str()).is_ok());
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
    // The sign-in barrier, right before `fetch()`: nothing is awaited between this check
    // and the request leaving (`send` calls `fetch` before its first await), so a
    // sign-in seen while this record was being marked stops it here (r3, 4.5 end).
    if !inner.replay_allowed(lane.checked) {
        return held(Held::SignIn);
    }
    let (verdict, two_xx) = match send(&init, &url, cfg.attempt_timeout_ms, None).await {
        Err(_) => {
            inner.network_failed();
            (classify(None, now_ms()), None)
        }
        Ok((response, deadline)) => {
            inner.network_answered();
            let v = read_answer(response, &deadline).await;
            drop(deadline);
            v
        }
    };
    // After the flush's one identity re-check, a 403 is the server's refusal (r3).
    let verdict = if lane.final_stale {
        after_recheck(verdict)
    } else {
        verdict
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
    let settled = two_xx
        .filter(|_| verdict == Verdict::Replayed)
        .map(|a| Answered {
            key: key.as_str().to_owned(),
            owner: meta.owner.clone(),
            status: a.status,
            content_type: a.content_type,
            body: a.body,
        });
    Sent {
        settled,
        carried_credential,
        ..done(verdict, attention, true)
    }
}
