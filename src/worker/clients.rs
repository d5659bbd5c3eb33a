//! Messages to pages: reports to every window of the scope, answers to the sender, and
//! reports of one account to that account's windows only.

use crate::channel::oneshot;
use crate::protocol::Outgoing;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
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
pub async fn broadcast(msg: &Outgoing) {
    let (done, posted) = oneshot::channel();
    let first = REPORTS.with(|r| {
        r.waiting.borrow_mut().push((to_js(msg), done));
        !r.looking.replace(true)
    });
    if first {
        wasm_bindgen_futures::spawn_local(post_waiting());
    }
    let _ = posted.await;
}

/// Reports waiting for a look-up of the windows, and whether one is under way.
#[derive(Default)]
struct Reports {
    waiting: RefCell<Vec<(JsValue, oneshot::Sender<()>)>>,
    looking: Cell<bool>,
}

thread_local! {
    static REPORTS: Reports = Reports::default();
}

/// Looks the windows up for the reports waiting now and posts them, until none waits.
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
        for (value, done) in batch {
            for client in &open {
                let _ = client.post_message(&value);
            }
            let _ = done.send(());
        }
    }
}

/// The account each window said it is signed in as (r3, for `MUTATION_SETTLED`): a
/// window's last `AUTH_SESSION`, by client id, in memory. Choice: a window that sent
/// none (since this worker started) is on the account of the last `AUTH_SESSION` from
/// any window — with cookie sessions every window of the origin shares the one
/// account; a window whose last `AUTH_SESSION` was a sign-out is on none.
#[derive(Default)]
pub struct WindowAccounts {
    said: RefCell<HashMap<String, Option<String>>>,
}

impl WindowAccounts {
    /// A window (`client_id`) sent `AUTH_SESSION` naming `user`.
    pub fn said(&self, client_id: String, user: Option<String>) {
        self.said.borrow_mut().insert(client_id, user);
    }

    /// Forgets every window (`CLEAR_DEVICE`: the device's accounts are gone).
    pub fn forget_all(&self) {
        self.said.borrow_mut().clear();
    }

    /// The account `client_id` is on, `session` being the account of the last
    /// `AUTH_SESSION` of any window.
    fn of(&self, client_id: &str, session: Option<&str>) -> Option<String> {
        match self.said.borrow().get(client_id) {
            Some(said) => said.clone(),
            None => session.map(str::to_owned),
        }
    }

    /// Forgets the windows that are gone.
    fn keep_only(&self, open: &[Client]) {
        let ids: std::collections::HashSet<String> = open.iter().map(Client::id).collect();
        self.said.borrow_mut().retain(|id, _| ids.contains(id));
    }
}

/// Sends each report to the windows on its account only (`session`: the account of the
/// last `AUTH_SESSION`, for windows that never said theirs). Another account's windows
/// never learn what this account's writes answered.
pub async fn to_accounts(
    accounts: &WindowAccounts,
    session: Option<&str>,
    msgs: &[(String, Outgoing)],
) {
    if msgs.is_empty() {
        return;
    }
    let open = windows().await;
    accounts.keep_only(&open);
    let on: Vec<(Client, Option<String>)> = open
        .into_iter()
        .map(|c| {
            let account = accounts.of(&c.id(), session);
            (c, account)
        })
        .collect();
    for (account, msg) in msgs {
        let value = to_js(msg);
        for (client, on) in &on {
            if on.as_deref() == Some(account.as_str()) {
                let _ = client.post_message(&value);
            }
        }
    }
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

/// Asks every window for a credential of `user` (r3: `AUTH_NEEDED`).
pub(in crate::worker) async fn ask_for_credential(user: &str) {
    broadcast(&Outgoing::AuthNeeded {
        user_id: user.to_owned(),
    })
    .await;
}
