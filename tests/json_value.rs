//! A JSON answer's parsed value read by hand (`js::json_value`, issue 36, 4) beside the
//! serde reader it replaced (`js::from_value::<serde_json::Value>`), in a real service
//! worker (`wasm-pack test --headless --chrome`): on every sample both read the same
//! value, or both refuse it.
#![cfg(target_arch = "wasm32")]

use serde_json::Value;
use wasm_bindgen::prelude::*;
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_service_worker);

/// Samples as JavaScript expressions: what `JSON.parse` gives, and values it never gives.
const SAMPLES: &[&str] = &[
    "null",
    "true",
    "false",
    "0",
    "-0",
    "1",
    "-1",
    "1.5",
    "-2.25",
    "1e300",
    "9007199254740991",
    "9007199254740992",
    "-9007199254740991",
    "-9007199254740993",
    "NaN",
    "Infinity",
    "-Infinity",
    "''",
    "'text'",
    "'é ✓ \\u0000'",
    "[]",
    "[1, 'a', null]",
    "[[[]]]",
    "[ , 1]",
    "({})",
    "({ a: 1, b: [true, { c: 'd' }], e: null })",
    "({ id: 'u1', error: { code: 'account_mismatch' } })",
    "JSON.parse('{\"z\": 1, \"a\": [1.5, -3, {\"k\": \"v\"}], \"n\": null}')",
    "JSON.parse('[0.1, 1e21, 12345678901234567890]')",
    "undefined",
    "({ u: undefined })",
    "[undefined]",
    "5n",
    "[9007199254740993n]",
    "new Map([['a', 1], ['b', [2]]])",
    "new Map([[1, 'one']])",
    "new Set([1])",
    "new ArrayBuffer(4)",
    "new Uint8Array([1, 2])",
    "() => 1",
    "({ f: () => 1 })",
    "Symbol('s')",
    "({ [Symbol.iterator]: null, a: 1 })",
    "new Date(0)",
    "/re/",
    "Object.create(null)",
    "Object.assign(Object.create({ inherited: 1 }), { own: 2 })",
];

fn eval(expr: &str) -> JsValue {
    js_sys::Function::new_no_args(&format!("return {expr};"))
        .call0(&JsValue::UNDEFINED)
        .expect("a sample evaluates")
}

/// `v` nested `depth` times in arrays (`[`) or objects (`{`).
fn nested(open: char, depth: usize) -> String {
    let (o, c) = if open == '[' {
        ("[", "]")
    } else {
        ("{\"k\":", "}")
    };
    format!("JSON.parse('{}1{}')", o.repeat(depth), c.repeat(depth))
}

fn both_read_alike(expr: &str) -> Option<Value> {
    let v = eval(expr);
    let by_hand = sw_outbox::js::json_value(&v);
    let by_serde: Option<Value> = sw_outbox::js::from_value(v).ok();
    assert_eq!(by_hand, by_serde, "{expr}");
    by_hand
}

#[wasm_bindgen_test]
fn both_readers_read_alike() {
    for expr in SAMPLES {
        both_read_alike(expr);
    }
    // Up to the depth limit and past it.
    for depth in 125..=131 {
        for open in ['[', '{'] {
            both_read_alike(&nested(open, depth));
        }
    }
}

#[wasm_bindgen_test]
fn what_each_reads() {
    let v =
        both_read_alike("({ a: 1, b: [true, 1.5, 'x', null, -0], c: { d: 9007199254740992 } })");
    assert_eq!(
        v,
        Some(serde_json::json!({
            "a": 1, "b": [true, 1.5, "x", null, 0], "c": { "d": 9007199254740992.0 }
        }))
    );
    assert_eq!(both_read_alike("NaN"), Some(Value::Null));
    assert!(both_read_alike(&nested('[', 128)).is_some());
    assert_eq!(both_read_alike(&nested('[', 129)), None);
    assert_eq!(both_read_alike("new ArrayBuffer(4)"), None);
}
