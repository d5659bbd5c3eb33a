//! `sw_outbox::js`, the shell's serde over JavaScript values, against serde-wasm-bindgen
//! (which it replaced in the module to keep float formatting out): the same values read
//! and the same objects written, inside a real service worker.
#![cfg(target_arch = "wasm32")]

use serde_json::{json, Value};
use sw_outbox::core::config::Config;
use sw_outbox::core::delivery::{Delivery, StopReason};
use sw_outbox::core::planner::BlockReason;
use sw_outbox::core::record::RecordId;
use sw_outbox::js;
use sw_outbox::protocol::{BlockedEntry, Outgoing};
use wasm_bindgen::prelude::*;
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_service_worker);

/// Values a page, IndexedDB or a server can hand the shell, made by JavaScript itself.
fn samples() -> js_sys::Array {
    js_sys::Function::new_no_args(
        r#"return [
          null, true, false, 0, -0, 7, -12, 3.5, 1e21, 2 ** 53 - 1, -(2 ** 53 - 1),
          "", "plain", "ünï\u00e9 \u2603 \"quoted\" \\ \n", [], [1, "two", [3, null]],
          {}, { type: "FLUSH_QUEUE", requestId: 7 }, { type: "REBIND_RECORDS", ownerId: "u1", ids: [1, 2] },
          { a: { b: { c: [true, { d: "deep" }] } } }, { n: 1.25, s: "x", z: null },
          { "key with space": 1, "ü": 2 },
        ];"#,
    )
    .call0(&JsValue::NULL)
    .expect("samples")
    .into()
}

fn stringify(v: &JsValue) -> String {
    js_sys::JSON::stringify(v)
        .ok()
        .and_then(|s| s.as_string())
        .unwrap_or_else(|| "<not JSON>".into())
}

#[wasm_bindgen_test]
fn every_sample_reads_as_serde_wasm_bindgen_reads_it() {
    for v in samples().iter() {
        let ours: Value = js::from_value(v.clone()).expect("reads");
        let theirs: Value = serde_wasm_bindgen::from_value(v.clone()).expect("reads");
        assert_eq!(ours, theirs, "{}", stringify(&v));
        // And the way back gives the same JSON text.
        let back = js::to_value(&ours).expect("writes");
        let reference = serde::Serialize::serialize(
            &theirs,
            &serde_wasm_bindgen::Serializer::json_compatible(),
        )
        .expect("writes");
        assert_eq!(stringify(&back), stringify(&reference));
    }
}

#[wasm_bindgen_test]
fn undefined_fields_and_big_integers_read_as_the_shell_expects() {
    let v = js_sys::Function::new_no_args(r#"return { a: undefined, b: 10n, c: [undefined] };"#)
        .call0(&JsValue::NULL)
        .expect("value");
    let read: Value = js::from_value(v).expect("reads");
    assert_eq!(read, json!({"a": null, "b": 10, "c": [null]}));
}

#[wasm_bindgen_test]
fn reports_are_written_as_serde_wasm_bindgen_writes_them() {
    let reports = vec![
        Outgoing::CommandResult {
            command: Some("FLUSH_QUEUE".into()),
            ok: true,
            reason: None,
            affected: Some(3),
            request_id: Some(json!("r-1")),
        },
        Outgoing::CommandResult {
            command: None,
            ok: false,
            reason: Some("`type` is missing".into()),
            affected: None,
            request_id: None,
        },
        Outgoing::Blocked {
            blocked: vec![BlockedEntry {
                id: RecordId(9),
                method: Some("POST".into()),
                path: Some("/projects/p1/tasks".into()),
                owner_id: None,
                workspace: Some("p1".into()),
                state: "queued",
                reason: BlockReason::UnknownOwner,
            }],
        },
        Outgoing::Replayed { count: 0 },
        Outgoing::Partial {
            replayed: 2,
            remaining: 5,
            stopped_by: None,
            retry_at: None,
        },
        Outgoing::Partial {
            replayed: 0,
            remaining: 1,
            stopped_by: Some(StopReason::RateLimited),
            retry_at: Some(1_796_227_200_000),
        },
        Outgoing::QueueState {
            records: Vec::new(),
            delivery: Delivery {
                stopped_by: Some(StopReason::SignedOut),
                retry_at: None,
                last_attempt_at: Some(5),
            },
            account: Some("alice".into()),
            request_id: None,
        },
        Outgoing::Queued {
            id: RecordId(12),
            method: "DELETE".into(),
            path: "/notes/4".into(),
            workspace: None,
            owner_id: Some("alice".into()),
            background: true,
        },
        Outgoing::Settled {
            id: RecordId(13),
            idempotency_key: "k-13".into(),
            owner_id: Some("alice".into()),
            status: 201,
            content_type: Some("application/json".into()),
            body: Some(r#"{"id":4}"#.into()),
        },
        Outgoing::Settled {
            id: RecordId(14),
            idempotency_key: "k-14".into(),
            owner_id: Some("alice".into()),
            status: 204,
            content_type: None,
            body: None,
        },
        Outgoing::AuthNeeded {
            user_id: "alice".into(),
        },
    ];
    for r in &reports {
        let ours = js::to_value(r).expect("writes");
        let theirs =
            serde::Serialize::serialize(r, &serde_wasm_bindgen::Serializer::json_compatible())
                .expect("writes");
        assert_eq!(stringify(&ours), stringify(&theirs));
        assert!(ours.is_object(), "a plain object, not a Map");
    }
}

/// The delivery state as IndexedDB gives it back: the stop reason, a string, read as
/// the enum it was written from (a restarted worker answers LIST_QUEUE with it).
#[wasm_bindgen_test]
fn the_stored_delivery_state_reads_back_whole() {
    let d = Delivery {
        stopped_by: Some(StopReason::AccountMismatch),
        retry_at: Some(1_796_227_200_000),
        last_attempt_at: Some(3),
    };
    let stored = js::to_value(&d).expect("writes");
    let read: Delivery = js::from_value(stored).expect("reads");
    assert_eq!(read, d);
    let unknown = js_sys::Function::new_no_args(r#"return { stoppedBy: "gone-fishing" };"#)
        .call0(&JsValue::NULL)
        .expect("value");
    assert!(
        js::from_value::<Delivery>(unknown).is_err(),
        "an unknown reason is an error, which the store reads as no state"
    );
}

#[wasm_bindgen_test]
fn the_configuration_refuses_an_unknown_field_by_name_and_reads_a_known_one() {
    let v =
        js_sys::Function::new_no_args(r#"return { replayConcurrency: 2, replayConcurency: 3 };"#)
            .call0(&JsValue::NULL)
            .expect("value");
    let err = js::from_value_strict::<Config>(v.clone())
        .map(|_| ())
        .expect_err("a misspelt field is refused");
    assert!(err.to_string().contains("replayConcurency"), "{err}");
    // The lenient reader (records, messages) ignores what it does not know.
    let lenient: Config = js::from_value(v).expect("reads");
    assert_eq!(lenient.replay_concurrency, 2);
    let ok = js_sys::Function::new_no_args(r#"return { replayConcurrency: 2, precache: ["/a"] };"#)
        .call0(&JsValue::NULL)
        .expect("value");
    let cfg: Config = js::from_value_strict(ok).expect("reads");
    assert_eq!(cfg.replay_concurrency, 2);
    assert_eq!(cfg.precache, vec!["/a".to_string()]);
}

#[wasm_bindgen_test]
fn a_wrong_type_is_an_error_naming_what_was_found() {
    let v = js_sys::Function::new_no_args(r#"return { replayConcurrency: "four" };"#)
        .call0(&JsValue::NULL)
        .expect("value");
    let err = js::from_value_strict::<Config>(v)
        .map(|_| ())
        .expect_err("refused");
    let text = err.to_string();
    assert!(text.contains("four"), "{text}");
}
