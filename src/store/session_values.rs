//! The backoff and the delivery state as stored in the `session` store, read field by
//! field: what `js::from_value` read through their serde derives, without a serde
//! instantiation in the module for two small objects (about 3 KB of the gzipped module).
//!
//! The same reading as serde's: a field that is absent keeps its default; one that is
//! present must have the field's type, else the whole value reads as its default (the
//! callers' `unwrap_or_default`). Integers are numbers without a fraction up to 2^53
//! (a BigInt reads as `Number()` gives it); `null` and `undefined` are only an
//! `Option`'s `None`; a stop reason is its kebab-case name.

use crate::core::backoff::Backoff;
use crate::core::delivery::{Delivery, StopReason};
use js_sys::Reflect;
use wasm_bindgen::JsValue;

/// A stored backoff; `None` when a field has a value of the wrong type.
pub fn backoff(v: &JsValue) -> Option<Backoff> {
    let mut b = Backoff::default();
    if let Some(f) = present(v, "retryAfterUntil") {
        b.retry_after_until = integer(&f)?;
    }
    if let Some(f) = present(v, "notBefore") {
        b.not_before = integer(&f)?;
    }
    if let Some(f) = present(v, "failures") {
        b.failures = u32::try_from(integer(&f)?).ok()?;
    }
    Some(b)
}

/// A stored delivery state; `None` when a field has a value of the wrong type.
pub fn delivery(v: &JsValue) -> Option<Delivery> {
    let mut d = Delivery::default();
    if let Some(f) = present(v, "stoppedBy").filter(|f| !nullish(f)) {
        let name = f.as_string()?;
        d.stopped_by = Some(StopReason::from_name(&name)?);
    }
    if let Some(f) = present(v, "retryAt").filter(|f| !nullish(f)) {
        d.retry_at = Some(integer(&f)?);
    }
    if let Some(f) = present(v, "lastAttemptAt").filter(|f| !nullish(f)) {
        d.last_attempt_at = Some(integer(&f)?);
    }
    Some(d)
}

/// The field's value, or `None` when the object does not have it (a field set to
/// `undefined` is present).
fn present(obj: &JsValue, name: &'static str) -> Option<JsValue> {
    crate::js::with_name(name, |key| {
        let value = Reflect::get(obj, key).unwrap_or(JsValue::UNDEFINED);
        (!value.is_undefined() || Reflect::has(obj, key).unwrap_or(false)).then_some(value)
    })
}

fn nullish(v: &JsValue) -> bool {
    v.is_null() || v.is_undefined()
}

/// A non-negative integer up to 2^53, as a number or a BigInt.
fn integer(v: &JsValue) -> Option<u64> {
    let n = if v.is_bigint() {
        #[allow(deprecated)]
        js_sys::Number::new(v).value_of()
    } else {
        v.as_f64()?
    };
    let max = crate::core::record::MAX_SAFE_INTEGER as f64;
    (n.fract() == 0.0 && n.abs() <= max && n >= 0.0).then_some(n as u64)
}
