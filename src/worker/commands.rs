//! Page commands (contract section 6): parsed into one enum, run in the chain, each
//! answered to its sender.

use super::clients::{self, ReplyTo};
use super::http::identity;
use super::{absolute, flush, Inner, Trigger};
use crate::core::identity::confirms;
use crate::core::key::IdempotencyKey;
use crate::core::lanes::Lane;
use crate::core::record::RecordId;
use crate::core::recovery::{adopt, recover, Recovery};
use crate::core::route::record_is_auth_route;
use crate::protocol::{parse_command, Command, Envelope, ListedRecord, Outgoing, RecoverAction};
use crate::store::{QueueItem, Rewrite};
use serde_json::Value;
use std::cell::RefCell;
use std::rc::Rc;
use web_sys::ExtendableMessageEvent;

pub async fn handle(inner: &Rc<Inner>, event: &ExtendableMessageEvent) {
    let reply = ReplyTo::of(event);
    let data: Value = crate::js::from_value(event.data()).unwrap_or(Value::Null);
    let env = match parse_command(&data, inner.config.max_records as usize) {
        Ok(env) => env,
        Err(refusal) => return reply.send(&refusal.result()),
    };
    let (answer, then_flush) = run(inner, &env).await;
    reply.send(&answer);
    if then_flush {
        flush::request(inner, Trigger::Recovery).await;
    }
}

/// Runs one command; returns its answer and whether a flush follows.
async fn run(inner: &Rc<Inner>, env: &Envelope) -> (Outgoing, bool) {
    match &env.command {
        Command::AuthSession { user } => {
            *inner.session.borrow_mut() = user.clone();
            let _turn = inner.session_writes.acquire().await;
            match inner.store.set_session_user(user.as_deref()).await {
                Ok(()) => (Outgoing::ok(env, None), false),
                Err(e) => (
                    Outgoing::failed(env, format!("the session could not be stored: {e}")),
                    false,
                ),
            }
        }
        Command::FlushQueue => {
            let out = flush::request(inner, Trigger::Page).await;
            match out.not_run {
                None => (Outgoing::ok(env, Some(out.replayed as u64)), false),
                Some(why) => (Outgoing::failed(env, why), false),
            }
        }
        Command::ListQueue => {
            inner.session_settled().await;
            match inner.store.read_queue().await {
                Ok(items) => {
                    let records = items
                        .iter()
                        .map(|i| match i {
                            QueueItem::Record(m) => ListedRecord::of(m),
                            QueueItem::Corrupt(id, _) => ListedRecord::corrupt(*id),
                        })
                        .collect();
                    (
                        Outgoing::QueueState {
                            records,
                            request_id: env.request_id.clone(),
                        },
                        false,
                    )
                }
                Err(e) => (
                    Outgoing::failed(env, format!("the queue could not be read: {e}")),
                    false,
                ),
            }
        }
        Command::ClearDevice => {
            let me = inner.clone();
            let cleared = inner
                .in_chain(Box::pin(async move {
                    let n = me.store.count().await.unwrap_or(0);
                    me.store.clear_device().await.map(|()| n)
                }))
                .await;
            match cleared {
                Ok(n) => {
                    inner.lanes_cleared();
                    *inner.session.borrow_mut() = None;
                    clients::broadcast(&Outgoing::Blocked {
                        blocked: Vec::new(),
                    })
                    .await;
                    (Outgoing::ok(env, Some(n)), false)
                }
                Err(e) => (
                    Outgoing::failed(env, format!("the device could not be cleared: {e}")),
                    false,
                ),
            }
        }
        Command::SetNotifications { user, enabled } => {
            inner.session_settled().await;
            if inner.session_user().as_deref() != Some(user.as_str()) {
                return (
                    Outgoing::failed(
                        env,
                        format!("{user} is not the account of the last AUTH_SESSION"),
                    ),
                    false,
                );
            }
            match inner.store.set_notifications(user, *enabled).await {
                Ok(()) => (Outgoing::ok(env, None), false),
                Err(e) => (
                    Outgoing::failed(env, format!("the choice could not be stored: {e}")),
                    false,
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
                Ok(n) => (Outgoing::ok(env, Some(n)), n > 0),
                Err(why) => (Outgoing::failed(env, why), false),
            }
        }
        Command::RecoverRecord { id, owner, action } => {
            let (me, owner, id, action) = (inner.clone(), owner.clone(), *id, *action);
            let out = inner
                .in_chain(Box::pin(async move {
                    recover_one(&me, id, &owner, action).await
                }))
                .await;
            match out {
                Ok(()) => (Outgoing::ok(env, Some(1)), true),
                Err(why) => (Outgoing::failed(env, why), false),
            }
        }
    }
}

/// A fresh identity check naming `owner` as the expected account.
async fn verify(inner: &Inner, owner: &str) -> Result<(), String> {
    let url = absolute(&inner.config.auth_me_path);
    let expected = Some((inner.config.expected_account_header.as_str(), owner));
    match identity(&url, expected, inner.config.attempt_timeout_ms).await {
        Some(id) if confirms(&id, owner) => Ok(()),
        Some(_) => Err(format!("{owner} is not the signed-in account")),
        None => Err("the identity check failed: offline".into()),
    }
}

async fn rebind(inner: &Inner, owner: &str, ids: Option<&[RecordId]>) -> Result<u64, String> {
    verify(inner, owner).await?;
    let cfg = &inner.config;
    let patterns = &*inner.patterns;
    let adopted_lanes: RefCell<Vec<Lane>> = RefCell::new(Vec::new());
    let n = inner
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
    for lane in adopted_lanes.into_inner() {
        inner.lane_stored(&lane);
    }
    Ok(n)
}

async fn recover_one(
    inner: &Inner,
    id: RecordId,
    owner: &str,
    action: RecoverAction,
) -> Result<(), String> {
    verify(inner, owner).await?;
    let refusal: RefCell<Option<String>> = RefCell::new(None);
    let discarded: RefCell<Option<Lane>> = RefCell::new(None);
    let mut seen = false;
    let changed = inner
        .store
        .rewrite_where(Some(id), |item| {
            seen = true;
            let meta = match item {
                QueueItem::Record(m) => Some(m),
                QueueItem::Corrupt(..) => None,
            };
            match recover(
                id,
                meta,
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
        return Err(crate::core::recovery::RecoveryRefused::Missing(id).to_string());
    }
    if let Some(lane) = discarded.into_inner() {
        inner.lane_resolved(&lane);
    }
    Ok(())
}
