//! The configuration read field by field from the page's JavaScript object, without
//! serde: the serde reader's code (a visitor per field type, monomorphised for
//! `Config`) was instantiated only for this, on every start's path (issue 36, 1).
//!
//! It reads what `crate::js::from_value_strict::<Config>` read and refuses what it
//! refused, with the same words: every own key must be a field (a misspelt field must
//! not be silently ignored), an absent field keeps `Config::default`'s value, `null` or
//! `undefined` is `None` for an optional field and refused for any other, numbers are
//! integers up to 2^53, a `BigInt` is read as the number it holds. The service-worker
//! tests compare the two readers on sample configurations, bad ones included.

use crate::core::config::Config;
use crate::core::record::MAX_SAFE_INTEGER;
use js_sys::{Array, Object, Reflect};
use wasm_bindgen::{JsCast, JsValue};

/// `Config`'s fields as a page writes them, in the struct's order (the order an unknown
/// field's message lists them in).
const FIELDS: [&str; 29] = [
    "apiPrefix",
    "authRoutePattern",
    "authMePath",
    "expectedAccountHeader",
    "csrfHeader",
    "workspacePattern",
    "dbName",
    "syncTag",
    "attemptTimeoutMs",
    "maxBodyBytes",
    "maxRecords",
    "maxServerFailures",
    "stillRunningPatienceMs",
    "maxRetentionMs",
    "flushBudgetMs",
    "replayConcurrency",
    "neverQueuePattern",
    "serverKeyTtlMs",
    "maxRetryAfterMs",
    "offlineProbeMs",
    "replayHeaders",
    "queueStatuses",
    "persistAuthorization",
    "precache",
    "shellUrl",
    "notificationUrl",
    "skipWaiting",
    "staticRoutes",
    "build",
];

/// Reads a configuration object (not `null` or `undefined`: the caller takes those as
/// the defaults). The error is the reason alone, as the serde reader gave it.
pub fn read(value: &JsValue) -> Result<Config, String> {
    if !value.is_object() {
        return Err(format!(
            "invalid type: {}, expected struct Config",
            not_an_object(value)
        ));
    }
    let mut c = Config::default();
    for (key, v) in pairs(value) {
        let Some(key) = key.as_string() else {
            return Err(invalid_type(&key, "field identifier"));
        };
        set(&mut c, &key, &v)?;
    }
    Ok(c)
}

/// The object's own enumerable `[key, value]` pairs, as the serde reader saw them: a
/// `Map`'s entries; for another iterable (an array) or a byte buffer, only the fields
/// it has, whatever their enumerability.
fn pairs(value: &JsValue) -> Vec<(JsValue, JsValue)> {
    let entries = if let Some(map) = value.dyn_ref::<js_sys::Map>() {
        Array::from(&map.entries())
    } else if Reflect::has(value, &js_sys::Symbol::iterator()).unwrap_or(true)
        || value.is_instance_of::<js_sys::ArrayBuffer>()
    {
        return FIELDS
            .iter()
            .filter_map(|f| {
                let key = JsValue::from_str(f);
                let v = Reflect::get(value, &key).unwrap_or(JsValue::UNDEFINED);
                let present = !v.is_undefined() || Reflect::has(value, &key).unwrap_or(false);
                present.then_some((key, v))
            })
            .collect();
    } else {
        Object::entries(value.unchecked_ref())
    };
    entries
        .iter()
        .map(|pair| {
            let pair: Array = pair.unchecked_into();
            (pair.get(0), pair.get(1))
        })
        .collect()
}

/// Sets the field `key` from `v`. Every field of `Config` is named here: the
/// destructuring below stops the build when a field is added and not read.
fn set(c: &mut Config, key: &str, v: &JsValue) -> Result<(), String> {
    let Config {
        api_prefix,
        auth_route_pattern,
        auth_me_path,
        expected_account_header,
        csrf_header,
        workspace_pattern,
        db_name,
        sync_tag,
        attempt_timeout_ms,
        max_body_bytes,
        max_records,
        max_server_failures,
        still_running_patience_ms,
        max_retention_ms,
        flush_budget_ms,
        replay_concurrency,
        never_queue_pattern,
        server_key_ttl_ms,
        max_retry_after_ms,
        offline_probe_ms,
        replay_headers,
        queue_statuses,
        persist_authorization,
        precache,
        shell_url,
        notification_url,
        skip_waiting,
        static_routes,
        build,
    } = c;
    match key {
        "apiPrefix" => *api_prefix = string(v)?,
        "authRoutePattern" => *auth_route_pattern = string(v)?,
        "authMePath" => *auth_me_path = string(v)?,
        "expectedAccountHeader" => *expected_account_header = string(v)?,
        "csrfHeader" => *csrf_header = string(v)?,
        "workspacePattern" => *workspace_pattern = string(v)?,
        "dbName" => *db_name = optional(v)?,
        "syncTag" => *sync_tag = string(v)?,
        "attemptTimeoutMs" => *attempt_timeout_ms = u32_of(v)?,
        "maxBodyBytes" => *max_body_bytes = u32_of(v)?,
        "maxRecords" => *max_records = u32_of(v)?,
        "maxServerFailures" => *max_server_failures = u32_of(v)?,
        "stillRunningPatienceMs" => *still_running_patience_ms = u64_of(v)?,
        "maxRetentionMs" => *max_retention_ms = u64_of(v)?,
        "flushBudgetMs" => *flush_budget_ms = u32_of(v)?,
        "replayConcurrency" => *replay_concurrency = u32_of(v)?,
        "neverQueuePattern" => *never_queue_pattern = optional(v)?,
        "serverKeyTtlMs" => *server_key_ttl_ms = u64_of(v)?,
        "maxRetryAfterMs" => *max_retry_after_ms = u32_of(v)?,
        "offlineProbeMs" => *offline_probe_ms = u32_of(v)?,
        "replayHeaders" => *replay_headers = list(v, string)?,
        "queueStatuses" => {
            *queue_statuses = list(v, |s| integer(s, u16::MAX.into(), "u16").map(|n| n as u16))?
        }
        "persistAuthorization" => *persist_authorization = boolean(v)?,
        "precache" => *precache = list(v, string)?,
        "shellUrl" => *shell_url = optional(v)?,
        "notificationUrl" => *notification_url = string(v)?,
        "skipWaiting" => *skip_waiting = boolean(v)?,
        "staticRoutes" => *static_routes = boolean(v)?,
        "build" => *build = string(v)?,
        other => return Err(unknown_field(other)),
    }
    Ok(())
}

fn string(v: &JsValue) -> Result<String, String> {
    v.as_string().ok_or_else(|| invalid_type(v, "a string"))
}

/// `null` and `undefined` are `None`.
fn optional(v: &JsValue) -> Result<Option<String>, String> {
    if v.is_null() || v.is_undefined() {
        Ok(None)
    } else {
        string(v).map(Some)
    }
}

fn boolean(v: &JsValue) -> Result<bool, String> {
    v.as_bool().ok_or_else(|| invalid_type(v, "a boolean"))
}

fn u32_of(v: &JsValue) -> Result<u32, String> {
    integer(v, u32::MAX.into(), "u32").map(|n| n as u32)
}

fn u64_of(v: &JsValue) -> Result<u64, String> {
    integer(v, u64::MAX, "u64")
}

/// A whole number from 0 to `max` (and at most 2^53 - 1, where a JavaScript number
/// stops being exact).
fn integer(v: &JsValue, max: u64, expected: &str) -> Result<u64, String> {
    match number(v) {
        Some(n) if is_safe_integer(n) => {
            let i = n as i64;
            match u64::try_from(i) {
                Ok(u) if u <= max => Ok(u),
                _ => Err(format!("invalid value: integer `{i}`, expected {expected}")),
            }
        }
        _ => Err(invalid_type(v, expected)),
    }
}

fn list<T>(v: &JsValue, item: impl Fn(&JsValue) -> Result<T, String>) -> Result<Vec<T>, String> {
    if !Array::is_array(v) {
        return Err(invalid_type(v, "a sequence"));
    }
    let items: &Array = v.unchecked_ref();
    items.iter().map(|i| item(&i)).collect()
}

/// A number, or a `BigInt` as the number `Number(value)` gives.
fn number(v: &JsValue) -> Option<f64> {
    if let Some(n) = v.as_f64() {
        return Some(n);
    }
    if v.is_bigint() {
        #[allow(deprecated)]
        return Some(js_sys::Number::new(v).value_of());
    }
    None
}

fn is_safe_integer(n: f64) -> bool {
    n.fract() == 0.0 && n.abs() <= MAX_SAFE_INTEGER as f64
}

fn invalid_type(v: &JsValue, expected: &str) -> String {
    format!("invalid type: {}, expected {expected}", unexpected(v))
}

/// What the value is, in serde's words (the serde reader's messages).
fn unexpected(v: &JsValue) -> String {
    if v.is_null() || v.is_undefined() {
        return "unit value".into();
    }
    if let Some(b) = v.as_bool() {
        return format!("boolean `{b}`");
    }
    if let Some(n) = number(v) {
        return if is_safe_integer(n) {
            format!("integer `{}`", n as i64)
        } else {
            let text = js_sys::Number::from(n)
                .to_string_with_radix(10)
                .map(String::from)
                .unwrap_or_default();
            format!("floating point `{text}`")
        };
    }
    if let Some(s) = v.as_string() {
        return format!("string {}", crate::core::text::quoted(&s));
    }
    if Array::is_array(v) {
        return "sequence".into();
    }
    let iterable = Reflect::has(v, &js_sys::Symbol::iterator()).unwrap_or(true);
    let map = v.is_instance_of::<js_sys::Map>()
        || (v.is_object() && !iterable && !v.is_instance_of::<js_sys::ArrayBuffer>());
    if map {
        "map".into()
    } else {
        "an object".into()
    }
}

/// What a configuration that is not an object is, in the serde reader's words (which
/// call every number a floating point one there).
fn not_an_object(v: &JsValue) -> String {
    if let Some(b) = v.as_bool() {
        format!("boolean `{b}`")
    } else if let Some(n) = v.as_f64() {
        let text = js_sys::Number::from(n)
            .to_string_with_radix(10)
            .map(String::from)
            .unwrap_or_default();
        format!("floating point `{text}`")
    } else if let Some(s) = v.as_string() {
        format!("string {}", crate::core::text::quoted(&s))
    } else {
        "an object".into()
    }
}

fn unknown_field(name: &str) -> String {
    let names: Vec<String> = FIELDS.iter().map(|f| format!("`{f}`")).collect();
    format!(
        "unknown field `{name}`, expected one of {}",
        names.join(", ")
    )
}
