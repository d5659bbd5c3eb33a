//! The version-change step (contract section 3): stores created as schema 3 wants them,
//! and every record of an older database rewritten in place, none lost.
//!
//! - From version 1: owner unknown, workspace derived from the path, no key, a string
//!   body made bytes, state `queued` (then as from version 2).
//! - From version 2: the body moves to the `bodies` store under the record's id and the
//!   record keeps its length (`bodySize`); a record that has a key is taken to have been
//!   sent when it was queued (`firstSentAt` = `timestamp`), since a version-2 worker
//!   did not record whether its first attempt went out: the safe side of the server's
//!   key window (contract 4.7).
//! - A value under a key that is not a record id gets a fresh id and is marked, so it
//!   reads as `corrupt-record` instead of being counted but never listed.

use super::idb::describe;
use super::{record_id, BODIES, FOREIGN_MARK, GENERATION_KEY, MUTATIONS, SESSION};
use crate::core::route::Patterns;
use js_sys::{Reflect, Uint8Array};
use std::cell::RefCell;
use std::rc::Rc;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{
    IdbCursorWithValue, IdbDatabase, IdbObjectStore, IdbObjectStoreParameters, IdbOpenDbRequest,
};

/// The migration's cursor handler, alive until the open request completes.
pub type MigrationSlot = Rc<RefCell<Option<Closure<dyn FnMut()>>>>;

fn get(value: &JsValue, f: &str) -> JsValue {
    Reflect::get(value, &f.into()).unwrap_or(JsValue::UNDEFINED)
}

fn set(value: &JsValue, f: &str, v: &JsValue) {
    let _ = Reflect::set(value, &f.into(), v);
}

/// Rewrites a version-1 value's fields: owner unknown, workspace derived, key absent,
/// state queued.
fn upgrade_v1_fields(value: &JsValue, patterns: &dyn Patterns) {
    if get(value, "ownerId").is_undefined() {
        set(value, "ownerId", &JsValue::NULL);
    }
    if get(value, "workspace").is_undefined() {
        let ws = get(value, "path")
            .as_string()
            .and_then(|p| patterns.workspace(&p))
            .map(|w| JsValue::from_str(&w))
            .unwrap_or(JsValue::NULL);
        set(value, "workspace", &ws);
    }
    if get(value, "idempotencyKey").is_undefined() {
        set(value, "idempotencyKey", &JsValue::NULL);
    }
    if get(value, "state").is_undefined() {
        set(value, "state", &"queued".into());
        set(value, "attentionReason", &JsValue::NULL);
    }
    if get(value, "serverFailures").is_undefined() {
        set(value, "serverFailures", &0.into());
    }
}

/// Moves a value's inline body out (schemas 1 and 2 kept it in the record) and gives it
/// the schema-3 fields. Returns the body bytes to store under the record's id, if any.
/// A body of a type the outbox never wrote is left in place: the reader reports the
/// record corrupt, and it is kept.
fn to_v3(value: &JsValue) -> Option<JsValue> {
    let body = get(value, "body");
    let (bytes, len): (Option<JsValue>, Option<usize>) = if body.is_null() || body.is_undefined() {
        (None, Some(0))
    } else if let Some(s) = body.as_string() {
        let b = Uint8Array::from(s.as_bytes());
        let n = b.length() as usize;
        (Some(b.into()), Some(n))
    } else if let Some(b) = body.dyn_ref::<Uint8Array>() {
        (Some(body.clone()), Some(b.length() as usize))
    } else if let Some(b) = body.dyn_ref::<js_sys::ArrayBuffer>() {
        (
            Some(Uint8Array::new(b).into()),
            Some(b.byte_length() as usize),
        )
    } else {
        (None, None)
    };
    let len = len?;
    let _ = Reflect::delete_property(value.unchecked_ref::<js_sys::Object>(), &"body".into());
    if get(value, "bodySize").is_undefined() {
        set(value, "bodySize", &JsValue::from_f64(len as f64));
    }
    if get(value, "firstSentAt").is_undefined() {
        let keyed = get(value, "idempotencyKey").is_string();
        let ts = get(value, "timestamp");
        let sent = if keyed && ts.as_f64().is_some() {
            ts
        } else {
            JsValue::NULL
        };
        set(value, "firstSentAt", &sent);
    }
    if get(value, "conflicts").is_undefined() {
        set(value, "conflicts", &0.into());
    }
    bytes
}

/// Marks a value found under `key` (not a record id) so that it reads as corrupt once
/// it has an id of its own; the old key is kept in the mark for whoever inspects it.
pub fn mark_foreign(value: &JsValue, key: &JsValue) -> Result<(), super::IdbError> {
    let _ = Reflect::delete_property(value.unchecked_ref::<js_sys::Object>(), &"id".into());
    let old = js_sys::JSON::stringify(key)
        .ok()
        .and_then(|s| s.as_string())
        .unwrap_or_default();
    Reflect::set(value, &FOREIGN_MARK.into(), &old.into()).map_err(super::failed)?;
    Ok(())
}

fn create_stores(db: &IdbDatabase) -> Result<(), String> {
    let names = db.object_store_names();
    if !names.contains(MUTATIONS) {
        let params = IdbObjectStoreParameters::new();
        params.set_key_path(&"id".into());
        params.set_auto_increment(true);
        let store = db
            .create_object_store_with_optional_parameters(MUTATIONS, &params)
            .map_err(|e| describe(&e))?;
        store
            .create_index_with_str("timestamp", "timestamp")
            .map_err(|e| describe(&e))?;
    }
    if !names.contains(BODIES) {
        db.create_object_store(BODIES).map_err(|e| describe(&e))?;
    }
    if !names.contains(SESSION) {
        let params = IdbObjectStoreParameters::new();
        params.set_key_path(&"key".into());
        db.create_object_store_with_optional_parameters(SESSION, &params)
            .map_err(|e| describe(&e))?;
    }
    Ok(())
}

/// Rewrites one value of an older database in place (through the cursor), moving its
/// body into `bodies`; a value under a foreign key is re-added under a fresh id.
fn migrate_value(
    cursor: &IdbCursorWithValue,
    mutations: &IdbObjectStore,
    bodies: &IdbObjectStore,
    from_v1: bool,
    patterns: &dyn Patterns,
) {
    let (Ok(key), Ok(value)) = (cursor.primary_key(), cursor.value()) else {
        return;
    };
    if !value.is_object() {
        return;
    }
    if from_v1 {
        upgrade_v1_fields(&value, patterns);
    }
    let body = to_v3(&value);
    if record_id(&key).is_some() {
        if let Some(b) = &body {
            let _ = bodies.put_with_key(b, &key);
        }
        let _ = cursor.update(&value);
    } else if get(&value, FOREIGN_MARK).is_undefined() {
        let _ = cursor.delete();
        if mark_foreign(&value, &key).is_ok() {
            if let Some(b) = body {
                // Kept with the value: its new id is not known inside this handler.
                set(&value, "body", &b);
            }
            let _ = mutations.add(&value);
        }
    }
}

/// The version-change step. A database created here (`old_version` 0) is claimed for
/// scope `claim` in the same transaction, when one is given: nobody can have claimed a
/// database that did not exist, and a first install then commits one transaction
/// instead of two (issue 36, the cold start). `Ok(true)`: created and claimed.
pub fn run(
    req: &IdbOpenDbRequest,
    old_version: u32,
    patterns: &Rc<dyn Patterns>,
    migration: &MigrationSlot,
    claim: Option<&str>,
) -> Result<bool, String> {
    let db: IdbDatabase = req
        .result()
        .map_err(|e| describe(&e))?
        .dyn_into()
        .map_err(|_| "no database".to_string())?;
    create_stores(&db)?;
    let tx = req
        .transaction()
        .ok_or_else(|| "no version-change transaction".to_string())?;
    let session = tx.object_store(SESSION).map_err(|e| describe(&e))?;
    let gen = js_sys::Object::new();
    set(&gen, "key", &GENERATION_KEY.into());
    set(&gen, "n", &1.into());
    set(&gen, "clears", &0.into());
    session.put(&gen).map_err(|e| describe(&e))?;
    if old_version == 0 {
        let Some(scope) = claim else {
            return Ok(false);
        };
        session
            .put(&super::claim_row(scope).map_err(|e| e.to_string())?)
            .map_err(|e| describe(&e))?;
        return Ok(true);
    }
    let mutations = tx.object_store(MUTATIONS).map_err(|e| describe(&e))?;
    if !mutations.index_names().contains("timestamp") {
        mutations
            .create_index_with_str("timestamp", "timestamp")
            .map_err(|e| describe(&e))?;
    }
    let bodies = tx.object_store(BODIES).map_err(|e| describe(&e))?;
    let cursor_req = mutations.open_cursor().map_err(|e| describe(&e))?;
    let (r, pats) = (cursor_req.clone(), patterns.clone());
    let from_v1 = old_version == 1;
    let step: Closure<dyn FnMut()> = Closure::new(move || {
        let Ok(c) = r.result() else { return };
        let Ok(cursor) = c.dyn_into::<IdbCursorWithValue>() else {
            return;
        };
        migrate_value(&cursor, &mutations, &bodies, from_v1, &*pats);
        let _ = cursor.continue_();
    });
    cursor_req.set_onsuccess(Some(step.as_ref().unchecked_ref()));
    *migration.borrow_mut() = Some(step);
    Ok(false)
}
