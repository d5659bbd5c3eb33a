//! Messages to pages: reports to every window of the scope, answers to the sender, and
//! reports of one account to that account's windows only (contract 5, r4: which account
//! a window is on is kept in IndexedDB, `store::windows`, ruled by `core::windows`).

use super::Inner;
use crate::channel::oneshot;
use crate::core::windows::{self, OnAccount, Session};
use crate::protocol::Outgoing;
use crate::store::Kept;
use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;
use web_sys::{Client, ClientQueryOptions, ClientType, MessagePort};

use super::scope;

pub fn to_js(msg: &Outgoing) -> JsValue {
    crate::js::to_value(msg).unwrap_or(JsValue::NULL)
}

/// Every window client of the scope, controlled or not (a page that loaded before the
/// worker took control still wants its outbox list).
pub async fn windows() -> Vec<Client> {
    let opts = ClientQueryOptions::new();
    opts.set_type(ClientType::Window);
    opts.set_include_uncontrolled(true);
    match JsFuture::from(scope().clients().match_all_with_options(&opts)).await {
        Ok(found) => js_sys::Array::from(&found)
            .iter()
            .filter_map(|c| c.dyn_into::<Client>().ok())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// Sends a report to every window client; resolves once it was posted. Reports made
/// while the windows are being looked up wait for the next look-up, which then serves
/// all of them in the order they were made: with 16 writes in flight, one
/// `clients.matchAll` per group of `MUTATION_QUEUED` reports instead of one per write.
/// Each report's look-up still starts after the report was made, so a window that
/// opened before it gets it, as with a look-up of its own.
/// Answers how many windows it reached.
pub async fn broadcast(msg: &Outgoing) -> usize {
    post(None, msg).await
}

/// Sends a report of `owner`'s write (`MUTATION_QUEUED`) to the windows on that account
/// only (contract 5, r4; a write of no known owner to every window), batched as
/// [`broadcast`]'s are.
pub async fn to_owner(inner: &Rc<Inner>, owner: Option<&str>, msg: &Outgoing) {
    post(Some((Rc::downgrade(inner), owner.map(str::to_owned))), msg).await;
}

/// Who a waiting report is for: every window (`None`), or the windows that may see a
/// write of that owner.
type Audience = Option<(Weak<Inner>, Option<String>)>;

/// Answers how many windows the report was posted to.
async fn post(audience: Audience, msg: &Outgoing) -> usize {
    let (done, posted) = oneshot::channel();
    let first = REPORTS.with(|r| {
        r.waiting.borrow_mut().push((to_js(msg), audience, done));
        !r.looking.replace(true)
    });
    if first {
        wasm_bindgen_futures::spawn_local(post_waiting());
    }
    posted.await.unwrap_or(0)
}

/// Reports waiting for a look-up of the windows, and whether one is under way.
#[derive(Default)]
struct Reports {
    waiting: RefCell<Vec<(JsValue, Audience, oneshot::Sender<usize>)>>,
    looking: Cell<bool>,
}

thread_local! {
    static REPORTS: Reports = Reports::default();
}

/// Looks the windows up for the reports waiting now and posts them, until none waits.
/// Their accounts are looked up (once per group) only when a report is one account's.
async fn post_waiting() {
    loop {
        let batch = REPORTS.with(|r| {
            let batch = std::mem::take(&mut *r.waiting.borrow_mut());
            if batch.is_empty() {
                r.looking.set(false);
            }
            batch
        });
        if batch.is_empty() {
            return;
        }
        let open = windows().await;
        let inner = batch
            .iter()
            .find_map(|(_, a, _)| a.as_ref().and_then(|(w, _)| w.upgrade()));
        let on: Vec<(Client, OnAccount)> = match &inner {
            Some(inner) => on_accounts(inner, open).await,
            None => open.into_iter().map(|c| (c, OnAccount::Unknown)).collect(),
        };
        for (value, audience, done) in batch {
            let mut reached = 0;
            for (client, account) in &on {
                let to = match &audience {
                    None => true,
                    Some((_, owner)) => account.may_see(owner.as_deref()),
                };
                if to && client.post_message(&value).is_ok() {
                    reached += 1;
                }
            }
            let _ = done.send(reached);
        }
    }
}

/// Each open window with the account it is on (contract 5, r4: kept in IndexedDB, so a
/// restarted worker knows it); the kept rows of windows that are gone are deleted.
pub async fn on_accounts(inner: &Inner, open: Vec<Client>) -> Vec<(Client, OnAccount)> {
    let named = inner.store.named_windows().await.unwrap_or_default();
    let ids: Vec<String> = open.iter().map(Client::id).collect();
    let gone = windows::gone(&named, &ids);
    if !gone.is_empty() {
        if let Err(e) = inner.store.forget_windows(&gone).await {
            web_sys::console::warn_1(
                &format!("sw-outbox: closed windows' accounts not forgotten: {e}").into(),
            );
        }
    }
    let user = inner.session_user();
    let session = Session {
        user: user.as_deref(),
        bearer: inner.bearer_session(),
    };
    open.into_iter()
        .map(|c| {
            let account = windows::account_of(&c.id(), &named, session);
            (c, account)
        })
        .collect()
}

/// The account of the window a command came from (a window that is not known, or a
/// message from no window, as [`windows::account_of`] rules for an unknown one).
pub async fn account_of_sender(
    inner: &Inner,
    event: &web_sys::ExtendableMessageEvent,
) -> OnAccount {
    let named = inner.store.named_windows().await.unwrap_or_default();
    let user = inner.session_user();
    let session = Session {
        user: user.as_deref(),
        bearer: inner.bearer_session(),
    };
    let id = source_id(event).unwrap_or_default();
    windows::account_of(&id, &named, session)
}

/// Sends each window the report `make` gives for the account it is on (its viewer:
/// another account's records without their details, contract 5), one report per
/// distinct viewer.
pub async fn per_viewer(inner: &Inner, make: impl Fn(Option<&str>) -> Outgoing) {
    let on = on_accounts(inner, windows().await).await;
    let mut made: Vec<(Option<String>, JsValue)> = Vec::new();
    for (client, account) in &on {
        let viewer = account.viewer();
        let value = match made.iter().find(|(v, _)| v.as_deref() == viewer) {
            Some((_, value)) => value.clone(),
            None => {
                let value = to_js(&make(viewer));
                made.push((viewer.map(str::to_owned), value.clone()));
                value
            }
        };
        let _ = client.post_message(&value);
    }
}

/// Sends `AUTH_NEEDED` for `user` to that account's windows only (r4).
pub async fn ask_for_credential(inner: &Inner, user: &str) {
    let msg = to_js(&Outgoing::AuthNeeded {
        user_id: user.to_owned(),
    });
    for (client, account) in on_accounts(inner, windows().await).await {
        if account.may_see(Some(user)) {
            let _ = client.post_message(&msg);
        }
    }
}

/// Each replayed write's answer (`MUTATION_SETTLED`, r3) to the windows on its account
/// only; one whose account has no window open is kept in IndexedDB (bounded) and given
/// to a window of that account when one is there (issue 34, 8a). Reports kept earlier
/// go first.
pub async fn settled(inner: &Inner, msgs: Vec<(String, Outgoing)>) {
    let on = on_accounts(inner, windows().await).await;
    deliver_kept(inner, &on).await;
    let mut keep: Vec<Kept> = Vec::new();
    for (account, msg) in msgs {
        let value = to_js(&msg);
        let mut sent = false;
        for (client, on) in &on {
            if on.viewer() == Some(account.as_str()) {
                sent |= client.post_message(&value).is_ok();
            }
        }
        if !sent {
            match keep.iter_mut().find(|k| k.account == account) {
                Some(k) => k.reports.push(value),
                None => keep.push(Kept {
                    account,
                    reports: vec![value],
                }),
            }
        }
    }
    if let Err(e) = inner.store.keep_settled(super::now_ms(), keep).await {
        web_sys::console::warn_1(
            &format!("sw-outbox: answers for accounts with no window open not kept: {e}").into(),
        );
    }
}

/// Gives the windows open now the reports kept for their accounts (and forgets them).
pub async fn deliver_kept(inner: &Inner, on: &[(Client, OnAccount)]) {
    let kept = inner.store.kept_accounts().await.unwrap_or_default();
    let here: Vec<String> = kept
        .into_iter()
        .filter(|a| on.iter().any(|(_, o)| o.viewer() == Some(a.as_str())))
        .collect();
    let Ok(taken) = inner.store.take_settled(&here).await else {
        return;
    };
    for Kept { account, reports } in taken {
        for value in reports {
            for (client, o) in on {
                if o.viewer() == Some(account.as_str()) {
                    let _ = client.post_message(&value);
                }
            }
        }
    }
}

/// Resolves once the page a navigation resulted in exists (`clients.get` of its
/// `resultingClientId` found it: its answer has arrived, and a cookie with it is set), or
/// after `limit_ms`, whichever is first; only after `limit_ms` when there is no such id or
/// the engine's `clients.get` does not find it (it need not wait for a page still loading).
pub async fn page_arrived_within(resulting: Option<&str>, limit_ms: u32) {
    let (fired, timer) = oneshot::channel::<()>();
    let _timeout = gloo_timers::callback::Timeout::new(limit_ms, move || {
        let _ = fired.send(());
    });
    let found = async {
        let Some(id) = resulting else {
            return std::future::pending::<()>().await;
        };
        let got = JsFuture::from(scope().clients().get(id)).await;
        if !matches!(got, Ok(c) if c.is_object()) {
            std::future::pending::<()>().await;
        }
    };
    let mut found = std::pin::pin!(found);
    let mut timer = std::pin::pin!(timer);
    std::future::poll_fn(|cx| {
        use std::future::Future;
        if found.as_mut().poll(cx).is_ready() || timer.as_mut().poll(cx).is_ready() {
            return std::task::Poll::Ready(());
        }
        std::task::Poll::Pending
    })
    .await
}

/// The id of the window a message came from, when it came from one.
pub fn source_id(event: &web_sys::ExtendableMessageEvent) -> Option<String> {
    event
        .source()
        .and_then(|s| s.dyn_into::<Client>().ok())
        .map(|c| c.id())
}

/// Where a command's answer goes: the message's first transferred port when it sent
/// one, else its source.
#[derive(Clone)]
pub enum ReplyTo {
    Port(MessagePort),
    Client(Client),
    Nobody,
}

impl ReplyTo {
    pub fn of(event: &web_sys::ExtendableMessageEvent) -> ReplyTo {
        if let Ok(port) = event.ports().get(0).dyn_into::<MessagePort>() {
            return ReplyTo::Port(port);
        }
        match event.source().and_then(|s| s.dyn_into::<Client>().ok()) {
            Some(c) => ReplyTo::Client(c),
            None => ReplyTo::Nobody,
        }
    }

    pub fn send(&self, msg: &Outgoing) {
        let value = to_js(msg);
        let _ = match self {
            ReplyTo::Port(p) => p.post_message(&value),
            ReplyTo::Client(c) => c.post_message(&value),
            ReplyTo::Nobody => Ok(()),
        };
    }
}
