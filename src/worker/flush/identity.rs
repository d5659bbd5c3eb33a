//! A flush's identity (contract 4.1): who is signed in, asked only once no session
//! change is open and answered after the last one settled (the sign-in barrier, 4.5
//! end); the re-checks a session change or a stale-identity answer earns in the middle
//! of a flush.

use super::send::Sent;
use crate::channel::oneshot;
use crate::core::backoff::FlushEnd;
use crate::core::barrier::Checked;
use crate::core::credential::{Bearer, Credential};
use crate::core::delivery::{identity_unavailable, StopReason};
use crate::core::identity::Identity;
use crate::core::record::RecordId;
use crate::worker::barrier::Held as Fence;
use crate::worker::http::{identity, IdentityAnswer};
use crate::worker::{absolute, now_ms, Inner};
use std::collections::HashSet;
use std::rc::Rc;

/// The identity a flush replays under: the account, its CSRF token, the sign-in
/// barrier's token of the check that named it, how many times it was checked again in
/// this flush, and the records whose one re-check a stale-identity answer earns was
/// spent (r4: once per record, not once per flush).
pub(super) struct Who {
    pub user: String,
    pub csrf: Option<String>,
    /// A bearer session's credential (r3): this account's replays carry it.
    pub credential: Option<Credential>,
    pub checked: Checked,
    pub generation: u32,
    pub rechecked: HashSet<RecordId>,
}

/// An identity check of a flush.
pub(super) enum Check {
    SignedIn(Who),
    SignedOut,
    /// No identity could be read: the flush stops (contract 4.1, 4.8).
    Stopped(Stop),
}

/// Why a flush stopped before it read the queue, and what follows.
pub(super) struct Stop {
    pub stop: StopReason,
    pub end: FlushEnd,
    pub why: String,
    /// The account whose credential the pages are asked for (`AUTH_NEEDED`, r3) once
    /// the stop is stored, so that the `AUTH_SESSION` answering it finds the stop it
    /// resumes.
    pub ask: Option<String>,
}

/// Checks who is signed in, once no session change is open, and only as an answer to a
/// request sent after the last one was settled (a sign-in seen while `/auth/me` was on
/// its way voids it: checked again). Stops with `budget` when the deadline passes first.
pub(super) async fn check(inner: &Rc<Inner>, deadline: u64) -> Check {
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
        let credential = match inner.bearer() {
            Bearer::Missing { user } => {
                return Check::Stopped(Stop {
                    stop: StopReason::Unauthorized,
                    end: FlushEnd::Clean,
                    why: format!("the credential of {user} is needed: AUTH_NEEDED was sent"),
                    ask: Some(user),
                })
            }
            Bearer::Held(c) => Some(c),
            Bearer::Cookie => None,
        };
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
        // The sign-in barrier: the check counts only if no sign-in is seen before its
        // answer (`replay_allowed` below).
        let Some(checked) = inner.identity_check_begins() else {
            continue;
        };
        let answer = ask(inner, credential.as_ref()).await;
        if !inner.replay_allowed(checked) {
            continue;
        }
        return read(inner, answer, checked, credential);
    }
}

/// `GET authMePath`, with the bearer credential when the session has one; the answer
/// tells the known-offline fast path whether the network answered.
async fn ask(inner: &Rc<Inner>, credential: Option<&Credential>) -> IdentityAnswer {
    let cfg = &inner.config;
    let answer = identity(
        &absolute(&cfg.auth_me_path),
        None,
        credential.map(|c| c.authorization.as_str()),
        cfg.attempt_timeout_ms,
        &cfg.csrf_header,
    )
    .await;
    if answer.network_answered() {
        inner.network_answered();
    } else {
        inner.network_failed();
    }
    answer
}

/// What an identity answer means for the flush (contract 4.1).
fn read(
    inner: &Inner,
    answer: IdentityAnswer,
    checked: Checked,
    credential: Option<Credential>,
) -> Check {
    let stopped = |stop, end, why: String, ask| {
        Check::Stopped(Stop {
            stop,
            end,
            why,
            ask,
        })
    };
    let (identity, retry_after) = match answer {
        IdentityAnswer::Offline => {
            return stopped(
                StopReason::Offline,
                FlushEnd::Transient,
                "the identity check failed: offline".into(),
                None,
            )
        }
        IdentityAnswer::Stalled => {
            return stopped(
                StopReason::IdentityCheck,
                FlushEnd::Transient,
                "the identity check's answer did not arrive in time".into(),
                None,
            )
        }
        IdentityAnswer::Answered {
            identity,
            retry_after,
        } => (identity, retry_after),
    };
    match identity {
        Identity::SignedIn { user, csrf } => Check::SignedIn(Who {
            user,
            csrf,
            credential,
            checked,
            generation: 0,
            rechecked: HashSet::new(),
        }),
        // The server did not take the credential (expired): the pages are asked for a
        // new one, and the flush resumes when it comes (r3, 4.1). Not "signed out":
        // nothing is reported `no-session`.
        Identity::SignedOut if credential.is_some() => {
            let user = credential.as_ref().map_or("", |c| c.user.as_str());
            inner.credential_refused(credential.as_ref().map(|c| &c.authorization));
            stopped(
                StopReason::Unauthorized,
                FlushEnd::Clean,
                format!("the server refused the credential of {user}: AUTH_NEEDED was sent"),
                Some(user.to_owned()),
            )
        }
        Identity::SignedOut => Check::SignedOut,
        Identity::Unavailable { status } => stopped(
            StopReason::IdentityCheck,
            identity_unavailable(status, retry_after.as_deref(), now_ms()),
            format!("the identity check answered {status}"),
            None,
        ),
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
pub(super) enum Recheck {
    /// The same account: go on with the fresh token.
    Same,
    /// Another account, or nobody: this flush's plan no longer holds.
    Changed { signed_out: bool },
    /// No identity: the flush stops (with the account whose credential is asked for).
    Failed(StopReason, FlushEnd, Option<String>),
}

/// Checks the identity again (after a session change, or a stale-identity answer).
pub(super) async fn recheck(inner: &Rc<Inner>, who: &mut Who, deadline: u64) -> Recheck {
    who.generation += 1;
    match check(inner, deadline).await {
        Check::SignedIn(fresh) if fresh.user == who.user => {
            who.csrf = fresh.csrf;
            who.checked = fresh.checked;
            who.credential = fresh.credential;
            Recheck::Same
        }
        Check::SignedIn(_) => Recheck::Changed { signed_out: false },
        Check::SignedOut => Recheck::Changed { signed_out: true },
        Check::Stopped(Stop { stop, end, ask, .. }) => Recheck::Failed(stop, end, ask),
    }
}

/// A stale-identity answer (a CSRF 403, or 409 `account_mismatch`): `None` when the
/// record is to be sent again, else what the re-check found. An answer to a request sent
/// before the last identity check is sent again with that check's token; the first
/// answer after one earns the record its one re-check (r4: once per record, so a server
/// that rotates its token on every request gets a fresh one for each record: a fresh
/// `/auth/me`, a fresh token); the record's answer after its re-check stops the flush,
/// the record unchanged (a 403 is already `rejected` by then: `after_recheck`).
pub(super) async fn stale_identity(
    inner: &Rc<Inner>,
    who: &mut Who,
    sent: &Sent,
    deadline: u64,
) -> Option<Recheck> {
    if sent.generation < who.generation {
        return None;
    }
    if !who.rechecked.insert(sent.id) {
        return Some(Recheck::Failed(
            StopReason::AccountMismatch,
            FlushEnd::Transient,
            None,
        ));
    }
    match recheck(inner, who, deadline).await {
        Recheck::Same => None,
        other => Some(other),
    }
}
