//! Delivery notifications in the worker: shown after a background flush when no page
//! is open, for an account that opted in; a click focuses or opens the app.

use super::clients::windows;
use super::{absolute, scope, Inner, Trigger};
use crate::core::notify::{click_target_allowed, click_url, should_notify, summary, Sent};
use crate::core::record::{RecordId, MAX_SAFE_INTEGER};
use crate::protocol::Outgoing;
use js_sys::{Function, Object, Reflect};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use web_sys::WindowClient;

/// The tag of the one notification: a newer one replaces the older.
const TAG: &str = "sw-outbox";
/// The field of a notification's data that marks it as the outbox's.
const MARK: &str = "swOutbox";

fn permission_granted() -> bool {
    Reflect::get(&js_sys::global(), &"Notification".into())
        .and_then(|n| Reflect::get(&n, &"permission".into()))
        .ok()
        .and_then(|p| p.as_string())
        .is_some_and(|p| p == "granted")
}

/// Called at the end of every flush with what it did; `open`: whether its summary
/// reached a window.
pub async fn after_flush(
    inner: &Inner,
    trigger: Trigger,
    open: bool,
    user: Option<&str>,
    sent: &Sent,
    attention: usize,
    first_attention: Option<RecordId>,
) {
    let Some(user) = user else { return };
    let Some(text) = summary(sent, attention) else {
        return;
    };
    if !trigger.is_automatic() {
        return;
    }
    let opted_in = inner
        .store
        .notifications_enabled(user)
        .await
        .unwrap_or(false);
    if !should_notify(trigger, open, opted_in, permission_granted()) {
        return;
    }
    let registration = scope().registration();
    let Some(show) = Reflect::get(&registration, &"showNotification".into())
        .ok()
        .and_then(|f| f.dyn_into::<Function>().ok())
    else {
        return;
    };
    let options = Object::new();
    let _ = Reflect::set(&options, &"tag".into(), &TAG.into());
    let _ = Reflect::set(&options, &"body".into(), &text.clone().into());
    // Where a click leads: the app, at the first record that needs attention.
    let data = Object::new();
    let url = absolute(&click_url(
        &inner.config.notification_url,
        first_attention.map(|id| id.0),
    ));
    let _ = Reflect::set(&data, &"url".into(), &url.into());
    // The outbox's mark: `sw.js` hands a click to the outbox only for its own
    // notifications (this tag and this mark), never a site's others.
    let _ = Reflect::set(&data, &MARK.into(), &JsValue::TRUE);
    if let Some(id) = first_attention {
        let _ = Reflect::set(&data, &"record".into(), &JsValue::from_f64(id.0 as f64));
    }
    let _ = Reflect::set(&options, &"data".into(), &data);
    let title = "Queued changes";
    if let Ok(p) = show.call2(&registration, &title.into(), &options) {
        if let Ok(p) = p.dyn_into::<js_sys::Promise>() {
            if let Err(e) = JsFuture::from(p).await {
                web_sys::console::warn_1(
                    &format!("sw-outbox: notification not shown: {}", super::describe(&e)).into(),
                );
            }
        }
    }
}

/// A click on the notification (`data`: what `after_flush` attached): focus a window of
/// the app and ask it to show the record, or open the app at the record
/// (`notificationUrl?outboxRecord=<id>`, or `notificationUrl`).
pub async fn on_click(inner: &Inner, data: &JsValue) -> Result<(), JsValue> {
    let ours = Reflect::get(data, &MARK.into()).is_ok_and(|m| m == JsValue::TRUE);
    if !ours {
        // Not the outbox's notification: another listener's business.
        return Ok(());
    }
    let record = Reflect::get(data, &"record".into())
        .ok()
        .and_then(|r| r.as_f64())
        .filter(|r| *r >= 1.0 && r.fract() == 0.0 && *r <= MAX_SAFE_INTEGER as f64)
        .map(|r| RecordId(r as u64));
    let origin = scope().location().origin();
    let url = Reflect::get(data, &"url".into())
        .ok()
        .and_then(|u| u.as_string())
        .filter(|u| {
            web_sys::Url::new(u).is_ok_and(|parsed| {
                click_target_allowed(
                    &parsed.origin(),
                    &parsed.pathname(),
                    &origin,
                    &inner.config.notification_url,
                )
            })
        })
        .unwrap_or_else(|| absolute(&inner.config.notification_url));
    for client in windows().await {
        if let Ok(window) = client.dyn_into::<WindowClient>() {
            JsFuture::from(window.focus()?).await?;
            if let Some(id) = record {
                let _ = window.post_message(&super::clients::to_js(&Outgoing::ShowRecord { id }));
            }
            return Ok(());
        }
    }
    JsFuture::from(scope().clients().open_window(&url)).await?;
    Ok(())
}
