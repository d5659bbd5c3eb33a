//! The stored backoff and delivery state read by hand (`store::session_values`, issue 36,
//! 4) beside the serde reader they replaced (`js::from_value`, with the callers'
//! `unwrap_or_default`), in a real service worker (`wasm-pack test --headless
//! --chrome`): on every sample, good and bad, both read the same value.
#![cfg(target_arch = "wasm32")]

use sw_outbox::core::backoff::Backoff;
use sw_outbox::core::delivery::{Delivery, StopReason};
use sw_outbox::store::session_values;
use wasm_bindgen::prelude::*;
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_service_worker);

/// Values a field may hold, as JavaScript expressions.
const VALUES: &[&str] = &[
    "0",
    "-0",
    "1",
    "4294967295",
    "4294967296",
    "9007199254740991",
    "9007199254740992",
    "-1",
    "1.5",
    "NaN",
    "Infinity",
    "-Infinity",
    "5n",
    "-5n",
    "9007199254740993n",
    "null",
    "undefined",
    "true",
    "'7'",
    "[1]",
    "({ n: 1 })",
    "'offline'",
    "'rate-limited'",
    "'account-mismatch'",
    "'storage'",
    "'Offline'",
    "'rate_limited'",
    "''",
];

/// The stored objects: each field alone with each value, every field at once, and a few
/// whole shapes (`v` stands for the value).
const SHAPES: &[&str] = &[
    "({ retryAfterUntil: v })",
    "({ notBefore: v })",
    "({ failures: v })",
    "({ stoppedBy: v })",
    "({ retryAt: v })",
    "({ lastAttemptAt: v })",
    "({ key: 'backoff', retryAfterUntil: 10, notBefore: 20, failures: 3, stoppedBy: v })",
    "({ key: 'delivery', stoppedBy: 'offline', retryAt: 5, lastAttemptAt: v })",
    "({ retryAfterUntil: 10, notBefore: v, failures: 2 })",
    "({ stoppedBy: 'budget', retryAt: v, lastAttemptAt: 1 })",
    "Object.create({ failures: v })",
    "Object.assign(Object.create({ retryAt: 3 }), { notBefore: v })",
    "new Map([['failures', v]])",
    "[v]",
];

fn eval(expr: &str) -> JsValue {
    js_sys::Function::new_no_args(&format!("return {expr};"))
        .call0(&JsValue::UNDEFINED)
        .expect("a sample evaluates")
}

#[wasm_bindgen_test]
fn both_readers_read_alike() {
    let mut read = 0;
    for shape in SHAPES {
        for value in VALUES {
            let expr = shape
                .replace(": v", &format!(": ({value})"))
                .replace("[v]", &format!("[({value})]"));
            let expr = expr.replace(", v]", &format!(", ({value})]"));
            let v = eval(&expr);
            let by_hand = session_values::backoff(&v).unwrap_or_default();
            let by_serde: Backoff = sw_outbox::js::from_value(v.clone()).unwrap_or_default();
            assert_eq!(by_hand, by_serde, "backoff of {expr}");
            let by_hand = session_values::delivery(&v).unwrap_or_default();
            let by_serde: Delivery = sw_outbox::js::from_value(v).unwrap_or_default();
            assert_eq!(by_hand, by_serde, "delivery of {expr}");
            read += 1;
        }
    }
    assert_eq!(read, SHAPES.len() * VALUES.len());
}

#[wasm_bindgen_test]
fn every_field_is_read() {
    let v = eval(
        "({ retryAfterUntil: 10, notBefore: 20, failures: 3, stoppedBy: 'rate-limited', \
           retryAt: 30, lastAttemptAt: 40n })",
    );
    assert_eq!(
        session_values::backoff(&v),
        Some(Backoff {
            retry_after_until: 10,
            not_before: 20,
            failures: 3
        })
    );
    assert_eq!(
        session_values::delivery(&v),
        Some(Delivery {
            stopped_by: Some(StopReason::RateLimited),
            retry_at: Some(30),
            last_attempt_at: Some(40)
        })
    );
    for reason in [
        "offline",
        "signed-out",
        "identity-check",
        "unauthorized",
        "rate-limited",
        "account-mismatch",
        "budget",
        "storage",
    ] {
        let d = session_values::delivery(&eval(&format!("({{ stoppedBy: '{reason}' }})")));
        assert_eq!(
            d.and_then(|d| d.stopped_by).map(StopReason::as_str),
            Some(reason)
        );
    }
}
