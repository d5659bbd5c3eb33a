//! A page's message read as `protocol::parse_command` takes it: only the fields a
//! command has (`protocol::MESSAGE_FIELDS`), each only as far as its shape allows.
//!
//! A message is the page's to shape: a structured clone keeps shared references, so a
//! few kilobytes on the wire can be a graph with 2^40 paths (`x = {a: x, b: x}` forty
//! times over). Converting it whole would spin the worker thread, holding every fetch of
//! the site, until the module ran out of memory. Here a field is a string, a number, a
//! boolean or null; anything else reads as an empty object (which the parser refuses,
//! naming the field), and only `ids` may be an array, read no further than one element
//! past the longest list a command accepts.

use crate::core::credential::MAX_AUTHORIZATION_LEN;
use crate::protocol::{
    Limits, ARRAY_FIELD, AUTHORIZATION_FIELD, BODY_FIELD, MAX_FIELD_CHARS, MESSAGE_FIELDS,
};
use js_sys::{Array, Reflect};
use serde_json::{Map, Number, Value};
use wasm_bindgen::{JsCast, JsValue};

/// A placeholder for a value of the wrong shape: refused by the parser as "must be …".
fn not_a_scalar() -> Value {
    Value::Object(Map::new())
}

/// A string field longer than `max_chars` reads as an object, refused naming the field:
/// a page's string is copied into the module only when a command could use it.
fn bounded(v: &JsValue, max_chars: usize) -> Value {
    match v.dyn_ref::<js_sys::JsString>() {
        Some(s) if s.length() as usize > max_chars => not_a_scalar(),
        _ => scalar(v),
    }
}

fn scalar(v: &JsValue) -> Value {
    if v.is_null() || v.is_undefined() {
        Value::Null
    } else if let Some(b) = v.as_bool() {
        Value::Bool(b)
    } else if let Some(n) = v.as_f64() {
        Number::from_f64(n).map_or_else(not_a_scalar, Value::Number)
    } else if let Some(s) = v.as_string() {
        Value::String(s)
    } else if v.is_bigint() {
        // A BigInt request id reads as the number it is (as it always has).
        i64::try_from(v.clone())
            .ok()
            .and_then(|n| Number::from_f64(n as f64))
            .map_or_else(not_a_scalar, Value::Number)
    } else {
        not_a_scalar()
    }
}

fn list(v: &JsValue, max_len: usize) -> Value {
    if !Array::is_array(v) {
        return bounded(v, MAX_FIELD_CHARS);
    }
    let a: &Array = v.unchecked_ref();
    let len = (a.length() as usize).min(max_len.saturating_add(1));
    Value::Array((0..len as u32).map(|i| scalar(&a.get(i))).collect())
}

/// The fields of `data` that commands read; a message that is not an object stays what
/// it is to the parser (a string, a number, null), or an empty list.
pub fn read_message(data: &JsValue, limits: Limits) -> Value {
    if Array::is_array(data) {
        return Value::Array(Vec::new());
    }
    if !data.is_object() {
        return scalar(data);
    }
    let mut fields = Map::new();
    for name in MESSAGE_FIELDS {
        // A getter that throws reads as absent.
        let Ok(v) = Reflect::get(data, &name.into()) else {
            continue;
        };
        if v.is_undefined() {
            continue;
        }
        let value = if name == ARRAY_FIELD {
            list(&v, limits.max_ids)
        } else if name == AUTHORIZATION_FIELD {
            // A token may be longer than other fields; up to eight times the limit is
            // still read as a string, so the parser names the limit and the length.
            bounded(&v, MAX_AUTHORIZATION_LEN.saturating_mul(8))
        } else if name == BODY_FIELD {
            // Base64 is 4/3 of the bytes; a UTF-16 character is at least one byte.
            bounded(&v, (limits.max_body as usize).saturating_mul(4) / 3 + 4)
        } else {
            bounded(&v, MAX_FIELD_CHARS)
        };
        fields.insert(name.to_owned(), value);
    }
    Value::Object(fields)
}
