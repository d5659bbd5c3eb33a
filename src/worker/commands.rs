//! Page commands (contract section 6): parsed into one enum, run in the chain, each
//! answered to its sender.

use super::clients::{self, ReplyTo};
use super::http::{identity, IdentityAnswer};
use super::{absolute, flush, Inner, Trigger};
use crate::core::credential::{sign_in_flushes, Authorization};
use crate::core::identity::{confirms, Identity};
use crate::core::key::IdempotencyKey;
use crate::core::lanes::Lane;
use crate::core::record::RecordId;
use crate::core::recovery::{
    adopt, checked_offline, edit, readable_by, recover, Edit, Found, Recovery, RecoveryRefused,
};
use crate::core::route::record_is_auth_route;
use crate::protocol::{
    parse_command, Command, Envelope, Limits, ListedRecord, Outgoing, RecordContent, RecoverAction,
};
use crate::store::{QueueItem, Rewrite, SessionAuth};
use js_sys::Uint8Array;
use serde_json::Value;
use std::cell::RefCell;
use std::rc::Rc;
use web_sys::ExtendableMessageEvent;

pub async fn handle(inner: &Rc<Inner>, event: &ExtendableMessageEvent) {
    let reply = ReplyTo::of(event);
    let limits = Limits {
        max_ids: inner.config.max_records as usize,
        max_body: inner.config.max_body_bytes,
    };
    let data: Value = super::message::read_message(&event.data(), limits);
    let env = match parse_command(&data, limits) {
        Ok(env) => env,
        Err(refusal) => return reply.send(&refusal.result()),
    };
    // An AUTH_SESSION stops replays from its arrival until it is persisted and the
    // account is named again (r3, 4.5 end).
    let changing = matches!(env.command, Command::AuthSession { .. })
        .then(|| inner.session_changing(inner.config.attempt_timeout_ms));
    let (answer, then_flush) = run(inner, &env, event).await;
    drop(changing);
    reply.send(&answer);
    if let Some(trigger) = then_flush {
        let outcome = flush::request(inner, trigger).await;
        if trigger == Trigger::Recovery && !outcome.reported {
            report_queue(inner).await;
        }
        keep_alive(event, &outcome);
    }
}

/// A report after a recovery whose flush sent none (r3: a cancel made offline, or inside
/// a server's `Retry-After` window, is followed by a report all the same, so every window
/// drops the write): the queue as it stands, with the stored delivery state.
async fn report_queue(inner: &Inner) {
    let remaining = inner.store.count().await.ok().map(|n| n as usize);
    let delivery = inner.store.delivery().await.unwrap_or_default();
    let drained = remaining == Some(0);
    clients::broadcast(&Outgoing::flush_summary(
        0,
        remaining,
        1,
        delivery.stopped_by.filter(|_| !drained),
        delivery.retry_at.filter(|_| !drained),
    ))
    .await;
}

/// Keeps the command's event (still open: `sw.js` waits for this handler) alive for the
/// retry its flush scheduled, when that is near.
fn keep_alive(event: &ExtendableMessageEvent, outcome: &flush::FlushOutcome) {
    if let Some(p) = &outcome.keep_alive {
        let _ = event.wait_until(p);
    }
}

/// Runs one command; returns its answer and the flush that follows, if one does.
async fn run(
    inner: &Rc<Inner>,
    env: &Envelope,
    event: &ExtendableMessageEvent,
) -> (Outgoing, Option<Trigger>) {
    match &env.command {
        Command::AuthSession {
            user,
            authorization,
        } => {
            let seq = inner.session_arrived(user.clone());
            let _turn = inner.session_writes.acquire().await;
            // The credential is the session's (r3): persisted with it only where the site
            // chose so, else held in memory; a sign-out or a cookie sign-in has none.
            let auth = SessionAuth {
                bearer: authorization.is_some(),
                authorization: authorization
                    .clone()
                    .filter(|_| inner.config.persist_authorization),
            };
            match inner.store.set_session(user.as_deref(), &auth).await {
                Ok(before) => {
                    inner.session_settled_as(
                        seq,
                        user.clone(),
                        authorization.clone(),
                        auth,
                        Some(before),
                    );
                    // This window's account, kept for the reports of one account
                    // (contract 5, r4), and what was kept for it meanwhile (8a).
                    if let Some(id) = clients::source_id(event) {
                        if let Err(e) = inner.store.name_window(&id, user.as_deref()).await {
                            web_sys::console::warn_1(
                                &format!("sw-outbox: the window's account not kept: {e}").into(),
                            );
                        }
                        if user.is_some() {
                            let on = clients::on_accounts(inner, clients::windows().await).await;
                            clients::deliver_kept(inner, &on).await;
                        }
                    }
                    let then = after_sign_in(inner, user, authorization.as_ref()).await;
                    (Outgoing::ok(env, None), then)
                }
                Err(e) => {
                    inner.session_settled_as(seq, user.clone(), None, auth, None);
                    (
                        Outgoing::failed(env, format!("the session could not be stored: {e}")),
                        None,
                    )
                }
            }
        }
        Command::AbortWrite { key } => (Outgoing::ok(env, Some(inner.abort_attempts(key))), None),
        Command::FlushQueue => {
            let out = flush::request(inner, Trigger::Page).await;
            keep_alive(event, &out);
            match out.not_run {
                None => (Outgoing::ok(env, Some(out.replayed as u64)), None),
                Some(why) => (Outgoing::failed(env, why), None),
            }
        }
        Command::ListQueue => {
            inner.session_settled().await;
            inner.fresh().await;
            // Another account's records are listed without their details (contract 5):
            // the asking window's account decides (r4), not the last session's.
            let viewer = clients::account_of_sender(inner, event)
                .await
                .viewer()
                .map(str::to_owned);
            // Values under foreign keys are given ids first, so the list shows every
            // stored value a page can be asked to discard (issue: counted but invisible).
            match flush::read_all(inner).await {
                Ok(items) => {
                    let records = items
                        .iter()
                        .map(|i| match i {
                            QueueItem::Record(m) => ListedRecord::of(m, viewer.as_deref()),
                            QueueItem::Corrupt(id, _) => ListedRecord::corrupt(*id),
                        })
                        .collect();
                    // As the last flush stored it: a restarted worker answers it too.
                    let delivery = if items.is_empty() {
                        Default::default()
                    } else {
                        inner.store.delivery().await.unwrap_or_default()
                    };
                    (
                        Outgoing::QueueState {
                            records,
                            delivery,
                            // The session's account as persisted (not the window's).
                            account: inner.session_user(),
                            request_id: env.request_id.clone(),
                        },
                        None,
                    )
                }
                Err(e) => (
                    Outgoing::failed(env, format!("the queue could not be read: {e}")),
                    None,
                ),
            }
        }
        Command::ClearDevice => {
            let me = inner.clone();
            let cleared = inner
                .in_chain(Box::pin(async move {
                    let (n, before) = me.store.clear_device().await?;
                    // The device's accounts (its windows' too) are gone with it.
                    // Writes still on their first attempt are fenced by the clear count.
                    me.committed(before, true, |v| v.cleared());
                    Ok::<u64, crate::store::idb::IdbError>(n)
                }))
                .await;
            match cleared {
                Ok(n) => {
                    // Nothing cached under the previous account survives (contract 8).
                    super::shell::refresh(inner).await;
                    clients::broadcast(&Outgoing::Blocked {
                        blocked: Vec::new(),
                    })
                    .await;
                    (Outgoing::ok(env, Some(n)), None)
                }
                Err(e) => (
                    Outgoing::failed(env, format!("the device could not be cleared: {e}")),
                    None,
                ),
            }
        }
        Command::SetNotifications { user, enabled } => {
            inner.session_settled().await;
            inner.fresh().await;
            if inner.session_user().as_deref() != Some(user.as_str()) {
                return (
                    Outgoing::failed(
                        env,
                        format!("{user} is not the account of the last AUTH_SESSION"),
                    ),
                    None,
                );
            }
            match inner.store.set_notifications(user, *enabled).await {
                Ok(()) => (Outgoing::ok(env, None), None),
                Err(e) => (
                    Outgoing::failed(env, format!("the choice could not be stored: {e}")),
                    None,
                ),
            }
        }
        Command::RebindRecords { owner, ids } => {
            let (me, owner, ids) = (inner.clone(), owner.clone(), ids.clone());
            let out = inner
                .in_chain(Box::pin(async move {
                    rebind(&me, &owner, ids.as_deref()).await
                }))
                .await;
            match out {
                Ok(n) => (
                    Outgoing::ok(env, Some(n)),
                    (n > 0).then_some(Trigger::Recovery),
                ),
                Err(why) => (Outgoing::failed(env, why), None),
            }
        }
        Command::RecoverRecord {
            id,
            owner,
            action,
            edit,
        } => {
            let (me, owner, id, action, edit) =
                (inner.clone(), owner.clone(), *id, *action, edit.clone());
            let out = inner
                .in_chain(Box::pin(async move {
                    recover_one(&me, id, &owner, action, edit.as_ref()).await
                }))
                .await;
            match out {
                Ok(()) => (Outgoing::ok(env, Some(1)), Some(Trigger::Recovery)),
                Err(why) => (Outgoing::failed(env, why), None),
            }
        }
        Command::ReadRecord { id, owner } => {
            let (me, owner, id) = (inner.clone(), owner.clone(), *id);
            let out = inner
                .in_chain(Box::pin(async move { read_one(&me, id, &owner).await }))
                .await;
            match out {
                Ok(record) => (
                    Outgoing::Record {
                        record,
                        request_id: env.request_id.clone(),
                    },
                    None,
                ),
                Err(why) => (Outgoing::failed(env, why), None),
            }
        }
    }
}

/// After an `AUTH_SESSION` was persisted: a flush when it names an account and the last
/// flush stopped because nobody was signed in (or a replay was refused as such, or the
/// credential was refused or missing: r3). A person just signed in: it goes before the
/// backoff (`core::delivery::StopReason::resumed_by_sign_in`). Not for the very credential the
/// server just refused (`core::credential::sign_in_flushes`).
async fn after_sign_in(
    inner: &Inner,
    user: &Option<String>,
    given: Option<&Authorization>,
) -> Option<Trigger> {
    user.as_ref()?;
    if !sign_in_flushes(given, inner.refused_credential().as_ref()) {
        return None;
    }
    let delivery = inner.store.delivery().await.ok()?;
    delivery
        .stopped_by
        .is_some_and(|s| s.resumed_by_sign_in())
        .then_some(Trigger::SignIn)
}

/// How a command's identity check confirmed `owner`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verified {
    /// A fresh `GET authMePath` named `owner`.
    Online,
    /// `authMePath` could not be reached and the persisted session is `owner`'s: enough
    /// for what changes or reveals nothing on the server (r3, `checked_offline`).
    Offline,
}

/// A fresh identity check naming `owner` as the expected account, with the session's
/// credential where it is a bearer session (a 401 to it asks the pages for a new one,
/// r3). When the server cannot be reached (a network failure or no answer in time: any
/// HTTP answer is the authority), `action` (`None`: `READ_RECORD`) may stand on the
/// persisted session instead (`core::recovery::checked_offline`).
async fn verify(
    inner: &Rc<Inner>,
    owner: &str,
    action: Option<RecoverAction>,
) -> Result<Verified, String> {
    let cfg = &inner.config;
    let url = absolute(&cfg.auth_me_path);
    let expected = Some((cfg.expected_account_header.as_str(), owner));
    let bearer = inner.bearer();
    let authorization = bearer.authorization().cloned();
    let checked = identity(
        &url,
        expected,
        authorization.as_ref().map(|a| a.as_str()),
        cfg.attempt_timeout_ms,
        &cfg.csrf_header,
    )
    .await;
    if checked.network_answered() {
        inner.network_answered();
    } else {
        inner.network_failed();
    }
    match (&checked, checked.identity()) {
        (_, Some(id)) if confirms(id, owner) => Ok(Verified::Online),
        (_, Some(Identity::SignedOut)) if bearer.needs_on_401().is_some() => {
            if let Some(user) = bearer.needs_on_401() {
                inner.credential_refused(authorization.as_ref());
                clients::ask_for_credential(inner, user).await;
            }
            Err(format!(
                "the server did not accept the session's credential for {owner}: AUTH_NEEDED was sent"
            ))
        }
        (_, Some(_)) => Err(format!("{owner} is not the signed-in account")),
        (IdentityAnswer::Stalled, None) => {
            Err("the identity check failed: its answer did not arrive in time".into())
        }
        _ if checked_offline(action, inner.session_user().as_deref(), owner) => {
            Ok(Verified::Offline)
        }
        _ => Err("the identity check failed: offline".into()),
    }
}

async fn rebind(inner: &Rc<Inner>, owner: &str, ids: Option<&[RecordId]>) -> Result<u64, String> {
    if verify(inner, owner, Some(RecoverAction::RetryNew)).await? != Verified::Online {
        return Err("the identity check failed: offline".into());
    }
    let cfg = &inner.config;
    let patterns = &*inner.patterns;
    let adopted_lanes: RefCell<Vec<Lane>> = RefCell::new(Vec::new());
    let (n, before) = inner
        .store
        .rewrite_where(None, |item| {
            let QueueItem::Record(m) = item else {
                return Rewrite::Keep;
            };
            let auth = record_is_auth_route(&m.path, cfg, patterns);
            match adopt(m, owner, ids, auth, IdempotencyKey::mint_opt) {
                Some(adopted) => {
                    adopted_lanes
                        .borrow_mut()
                        .extend(inner.record_lane(&adopted));
                    Rewrite::Fields(adopted.mutable_fields())
                }
                None => Rewrite::Keep,
            }
        })
        .await
        .map_err(|e| format!("the records could not be adopted: {e}"))?;
    // Owned now, they hold back later writes of their lanes.
    if let Some(before) = before {
        let lanes = adopted_lanes.into_inner();
        inner.committed(before, false, |v| {
            for l in &lanes {
                v.add_lane(l);
            }
        });
    }
    Ok(n)
}

/// `READ_RECORD`: the owner's record with its body, after a fresh identity check names
/// that owner (or, offline, the persisted session is the owner's: r3). Never another
/// account's, never a corrupt one's; a record of no known owner may be read by the
/// verified account without adopting it (r3).
async fn read_one(inner: &Rc<Inner>, id: RecordId, owner: &str) -> Result<RecordContent, String> {
    verify(inner, owner, None).await?;
    let found = inner
        .store
        .record(id)
        .await
        .map_err(|e| format!("the record could not be read: {e}"))?;
    match found {
        None => Err(RecoveryRefused::Missing(id).to_string()),
        Some((QueueItem::Corrupt(..), _)) => Err(format!(
            "record {id} is corrupt: it has no readable content (it can be discarded)"
        )),
        Some((QueueItem::Record(m), _)) if !readable_by(m.owner.as_deref(), owner) => {
            Err(RecoveryRefused::NotOwner(id).to_string())
        }
        Some((QueueItem::Record(m), body)) => {
            let bytes = body
                .map(|b| Uint8Array::new(&b).to_vec())
                .unwrap_or_default();
            Ok(RecordContent::of(&m, &bytes))
        }
    }
}

async fn recover_one(
    inner: &Rc<Inner>,
    id: RecordId,
    owner: &str,
    action: RecoverAction,
    change: Option<&Edit>,
) -> Result<(), String> {
    verify(inner, owner, Some(action)).await?;
    let max_body = inner.config.max_body_bytes;
    let refusal: RefCell<Option<String>> = RefCell::new(None);
    let discarded: RefCell<Option<Lane>> = RefCell::new(None);
    let mut seen = false;
    let (changed, before) = inner
        .store
        .rewrite_where(Some(id), |item| {
            seen = true;
            let (meta, found) = match item {
                QueueItem::Record(m) => (Some(m), Found::Record(m)),
                QueueItem::Corrupt(..) => (None, Found::Corrupt),
            };
            if let (RecoverAction::Edit, Some(change)) = (action, change) {
                return match edit(
                    id,
                    found,
                    owner,
                    change,
                    max_body,
                    super::now_ms(),
                    IdempotencyKey::mint_opt,
                ) {
                    Ok(m) => Rewrite::Replace(
                        m.mutable_fields(),
                        (!change.body.is_empty()).then(|| Uint8Array::from(&change.body[..])),
                    ),
                    Err(e) => {
                        *refusal.borrow_mut() = Some(e.to_string());
                        Rewrite::Keep
                    }
                };
            }
            match recover(
                id,
                found,
                owner,
                action,
                super::now_ms(),
                IdempotencyKey::mint_opt,
            ) {
                Ok(Recovery::Delete) => {
                    *discarded.borrow_mut() = meta.and_then(|m| inner.record_lane(m));
                    Rewrite::Delete
                }
                Ok(Recovery::Requeue(m)) => Rewrite::Fields(m.mutable_fields()),
                Err(e) => {
                    *refusal.borrow_mut() = Some(e.to_string());
                    Rewrite::Keep
                }
            }
        })
        .await
        .map_err(|e| format!("the record could not be changed: {e}"))?;
    if let Some(why) = refusal.into_inner() {
        return Err(why);
    }
    if !seen || changed == 0 {
        return Err(RecoveryRefused::Missing(id).to_string());
    }
    if let Some(before) = before {
        let lane = discarded.into_inner();
        inner.committed(before, false, |v| {
            if let Some(l) = &lane {
                v.remove_lane(l);
            }
        });
    }
    Ok(())
}
