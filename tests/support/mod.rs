//! What several service-worker test files share (each `tests/*.rs` is its own crate, so
//! they declare `mod support;`): the parts of `www/sw.js` evaluated on their own, a
//! page's command sent to an outbox with a reply port, and small value helpers. Not every file uses every item.
#![allow(dead_code)]

use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::JsFuture;

/// A name no other test uses (databases, caches).
pub fn unique(name: &str) -> String {
    format!("{name}-{}", js_sys::Math::random().to_bits())
}

/// A JSON value as the page would post it.
pub fn js(v: &serde_json::Value) -> JsValue {
    use serde::Serialize;
    v.serialize(&serde_wasm_bindgen::Serializer::json_compatible())
        .expect("js")
}

/// A property of a JavaScript object (`undefined` when it cannot be read).
pub fn get(o: &JsValue, name: &str) -> JsValue {
    js_sys::Reflect::get(o, &name.into()).unwrap_or(JsValue::UNDEFINED)
}

pub const SW_JS: &str = include_str!("../../www/sw.js");

/// The text of sw.js between its `// ---- <name>: begin` and `// ---- <name>: end` lines.
pub fn part_of_sw_js(name: &str) -> &'static str {
    let begin = SW_JS
        .find(&format!("// ---- {name}: begin"))
        .unwrap_or_else(|| panic!("sw.js marks where its {name} part begins"));
    let end = SW_JS
        .find(&format!("// ---- {name}: end"))
        .unwrap_or_else(|| panic!("sw.js marks where its {name} part ends"));
    &SW_JS[begin..end]
}

/// Sends `data` to the outbox as a page's message with a reply port; its answer.
pub async fn command(o: &sw_outbox::worker::Outbox, data: &JsValue) -> serde_json::Value {
    let channel = web_sys::MessageChannel::new().expect("channel");
    let (tx, rx) = futures_channel::oneshot::channel::<JsValue>();
    let tx = std::cell::RefCell::new(Some(tx));
    let on_answer =
        Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |e: web_sys::MessageEvent| {
            if let Some(tx) = tx.borrow_mut().take() {
                let _ = tx.send(e.data());
            }
        });
    channel
        .port2()
        .set_onmessage(Some(on_answer.as_ref().unchecked_ref()));
    let init = web_sys::ExtendableMessageEventInit::new();
    init.set_data(data);
    init.set_ports(&js_sys::Array::of1(&channel.port1()));
    let event =
        web_sys::ExtendableMessageEvent::new_with_event_init_dict("message", &init).expect("event");
    JsFuture::from(o.handle_message(event))
        .await
        .expect("handled");
    let answer = rx.await.expect("answered");
    drop(on_answer);
    serde_wasm_bindgen::from_value(answer).expect("json")
}
