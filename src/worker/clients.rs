//! Messages to pages: reports to every window of the scope, answers to the sender.

use crate::protocol::Outgoing;
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

/// Sends a report to every window client.
pub async fn broadcast(msg: &Outgoing) {
    let value = to_js(msg);
    for client in windows().await {
        let _ = client.post_message(&value);
    }
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
