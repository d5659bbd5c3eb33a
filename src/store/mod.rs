//! The outbox's IndexedDB database (contract section 3): schema and upgrade, and one
//! function per transaction the outbox needs.
//!
//! Built on web-sys directly rather than a wrapper crate because two things the contract
//! requires are not expressible through rexie 0.6: a `durability: "strict"` commit for
//! queued writes, and rewriting version-1 records inside the version-change transaction.

pub mod idb;

use crate::core::record::{
    CorruptRecord, MutableFields, NewRecord, RawRecord, RecordId, RecordMeta, MAX_SAFE_INTEGER,
};
use crate::core::route::Patterns;
use futures_channel::mpsc;
use idb::{describe, done, failed, request, IdbError};
use js_sys::{Object, Reflect, Uint8Array};
use serde::Serialize;
use std::cell::RefCell;
use std::rc::Rc;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{
    IdbCursorWithValue, IdbDatabase, IdbFactory, IdbObjectStore, IdbObjectStoreParameters,
    IdbOpenDbRequest, IdbTransaction, IdbTransactionMode, IdbVersionChangeEvent,
};

#[wasm_bindgen]
extern "C" {
    /// `IDBDatabase` seen through the `transaction(names, mode, {durability})` overload:
    /// web-sys keeps the options argument behind its unstable-API flag.
    #[wasm_bindgen(extends = Object, js_name = IDBDatabase)]
    type DatabaseWithOptions;

    #[wasm_bindgen(catch, method, js_name = transaction)]
    fn transaction_with_options(
        this: &DatabaseWithOptions,
        names: &js_sys::Array,
        mode: &str,
        options: &JsValue,
    ) -> Result<IdbTransaction, JsValue>;
}

pub const VERSION: u32 = 2;
pub const MUTATIONS: &str = "mutations";
pub const SESSION: &str = "session";
const SESSION_KEY: &str = "current";
const BACKOFF_KEY: &str = "backoff";
/// `notify:<userId>` holds one account's delivery-notification choice.
const NOTIFY_PREFIX: &str = "notify:";

/// A stored value as the outbox reads it: a record, or something that is not one.
#[derive(Debug, Clone, PartialEq)]
pub enum QueueItem {
    Record(RecordMeta),
    Corrupt(RecordId, String),
}

impl QueueItem {
    pub fn id(&self) -> RecordId {
        match self {
            QueueItem::Record(m) => m.id,
            QueueItem::Corrupt(id, _) => *id,
        }
    }
}

/// A write to be queued: its fields and its exact body bytes.
pub struct Pending {
    pub record: NewRecord,
    pub body: Option<Uint8Array>,
}

/// Why a batch member was not stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnqueueFailure {
    Full,
    Storage(String),
}

/// The open database.
pub struct Store {
    db: IdbDatabase,
    patterns: Rc<dyn Patterns>,
}

fn factory() -> Result<IdbFactory, IdbError> {
    let f = Reflect::get(&js_sys::global(), &"indexedDB".into()).map_err(failed)?;
    f.dyn_into::<IdbFactory>()
        .map_err(|_| IdbError::Unavailable)
}

fn to_js<T: Serialize>(v: &T) -> Result<JsValue, IdbError> {
    crate::js::to_value(v).map_err(|e| IdbError::Failed(format!("serialising: {e}")))
}

/// The stored body's size: absent or null is 0, bytes and strings their length; any
/// other value makes the record corrupt (`None`).
fn body_len(value: &JsValue) -> Option<usize> {
    let body = Reflect::get(value, &"body".into()).ok()?;
    if body.is_null() || body.is_undefined() {
        Some(0)
    } else if let Some(b) = body.dyn_ref::<Uint8Array>() {
        Some(b.length() as usize)
    } else if let Some(b) = body.dyn_ref::<js_sys::ArrayBuffer>() {
        Some(b.byte_length() as usize)
    } else {
        body.as_string().map(|s| s.len())
    }
}

/// The body of a stored value as bytes for a request (`None` when there is none).
pub fn body_bytes(value: &JsValue) -> Option<JsValue> {
    let body = Reflect::get(value, &"body".into()).ok()?;
    if body.is_null() || body.is_undefined() {
        None
    } else if let Some(s) = body.as_string() {
        Some(Uint8Array::from(s.as_bytes()).into())
    } else {
        Some(body)
    }
}

fn record_id(key: &JsValue) -> Option<RecordId> {
    let n = key.as_f64()?;
    (n >= 0.0 && n.fract() == 0.0 && n <= MAX_SAFE_INTEGER as f64).then_some(RecordId(n as u64))
}

/// Reads one stored value as a record, or says why it is corrupt.
pub fn read_item(key: &JsValue, value: &JsValue, patterns: &dyn Patterns) -> Option<QueueItem> {
    let id = record_id(key)?;
    let raw: Result<RawRecord, _> = if value.is_object() {
        crate::js::from_value(value.clone()).map_err(|e| CorruptRecord::Shape(e.to_string()))
    } else {
        Err(CorruptRecord::Shape("not an object".into()))
    };
    Some(
        match raw.and_then(|raw| RecordMeta::from_raw(id, raw, body_len(value), patterns)) {
            Ok(meta) => QueueItem::Record(meta),
            Err(e) => QueueItem::Corrupt(id, e.to_string()),
        },
    )
}

/// Rewrites a version-1 value in place: owner unknown, workspace derived, key absent,
/// body bytes, state queued. Values that are not objects are left for the reader to
/// report as corrupt.
fn upgrade_v1_value(value: &JsValue, patterns: &dyn Patterns) -> Option<JsValue> {
    if !value.is_object() {
        return None;
    }
    let get = |f: &str| Reflect::get(value, &f.into()).unwrap_or(JsValue::UNDEFINED);
    let set = |f: &str, v: &JsValue| {
        let _ = Reflect::set(value, &f.into(), v);
    };
    if get("ownerId").is_undefined() {
        set("ownerId", &JsValue::NULL);
    }
    if get("workspace").is_undefined() {
        let ws = get("path")
            .as_string()
            .and_then(|p| patterns.workspace(&p))
            .map(|w| JsValue::from_str(&w))
            .unwrap_or(JsValue::NULL);
        set("workspace", &ws);
    }
    if get("idempotencyKey").is_undefined() {
        set("idempotencyKey", &JsValue::NULL);
    }
    if let Some(s) = get("body").as_string() {
        set("body", &Uint8Array::from(s.as_bytes()).into());
    }
    if get("state").is_undefined() {
        set("state", &"queued".into());
        set("attentionReason", &JsValue::NULL);
    }
    if get("serverFailures").is_undefined() {
        set("serverFailures", &0.into());
    }
    Some(value.clone())
}

/// One step of a cursor: the cursor on the next value, `None` past the last.
type CursorStep = Result<Option<IdbCursorWithValue>, IdbError>;
/// The event handlers that feed a cursor's channel; dropped with it.
type CursorHandlers = (Closure<dyn FnMut()>, Closure<dyn FnMut()>);
/// The version-1 migration's cursor handler, alive until the open request completes.
type MigrationSlot = Rc<RefCell<Option<Closure<dyn FnMut()>>>>;

/// A cursor's steps as a channel: each `success` sends the cursor (or `None` at the end).
fn cursor_steps(
    req: &web_sys::IdbRequest,
) -> (mpsc::UnboundedReceiver<CursorStep>, CursorHandlers) {
    let (tx, rx) = mpsc::unbounded();
    let (ok_tx, r1) = (tx.clone(), req.clone());
    let ok: Closure<dyn FnMut()> = Closure::new(move || {
        let step = r1
            .result()
            .map(|c| c.dyn_into::<IdbCursorWithValue>().ok())
            .map_err(failed);
        let _ = ok_tx.unbounded_send(step);
    });
    let r2 = req.clone();
    let err: Closure<dyn FnMut()> = Closure::new(move || {
        let why = match r2.error() {
            Ok(Some(d)) => idb::dom_error(&d),
            _ => "cursor failed".into(),
        };
        let _ = tx.unbounded_send(Err(IdbError::Failed(why)));
    });
    req.set_onsuccess(Some(ok.as_ref().unchecked_ref()));
    req.set_onerror(Some(err.as_ref().unchecked_ref()));
    (rx, (ok, err))
}

/// The next item of a channel (`StreamExt::next` without futures-util).
pub(crate) async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> Option<T> {
    std::future::poll_fn(|cx| futures_core::Stream::poll_next(std::pin::Pin::new(&mut *rx), cx))
        .await
}

impl Store {
    /// Opens (creating or upgrading) the database. A version-1 database keeps every
    /// record: the upgrade rewrites each one in the version-change transaction.
    pub async fn open(name: &str, patterns: Rc<dyn Patterns>) -> Result<Store, IdbError> {
        let open: IdbOpenDbRequest = factory()?.open_with_u32(name, VERSION).map_err(failed)?;
        let migration: MigrationSlot = Rc::new(RefCell::new(None));
        let (req, pats, mig) = (open.clone(), patterns.clone(), migration.clone());
        let on_upgrade: Closure<dyn FnMut(IdbVersionChangeEvent)> =
            Closure::new(move |e: IdbVersionChangeEvent| {
                if let Err(err) = upgrade(&req, e.old_version() as u32, &pats, &mig) {
                    web_sys::console::error_1(&format!("sw-outbox: upgrade failed: {err}").into());
                    if let Some(tx) = req.transaction() {
                        let _ = tx.abort();
                    }
                }
            });
        open.set_onupgradeneeded(Some(on_upgrade.as_ref().unchecked_ref()));
        let db = request(open.clone().into()).await;
        open.set_onupgradeneeded(None);
        drop(on_upgrade);
        migration.borrow_mut().take();
        let db: IdbDatabase = db?.dyn_into().map_err(|_| IdbError::Unavailable)?;
        // Let a newer worker's upgrade proceed instead of being blocked by this one.
        let db_for_close = db.clone();
        let on_version_change: Closure<dyn FnMut()> = Closure::new(move || db_for_close.close());
        db.set_onversionchange(Some(on_version_change.as_ref().unchecked_ref()));
        on_version_change.forget();
        Ok(Store { db, patterns })
    }

    pub fn close(&self) {
        self.db.close();
    }

    pub fn patterns(&self) -> &dyn Patterns {
        &*self.patterns
    }

    fn tx(
        &self,
        stores: &[&str],
        mode: IdbTransactionMode,
        strict: bool,
    ) -> Result<IdbTransaction, IdbError> {
        let names = js_sys::Array::new();
        for s in stores {
            names.push(&JsValue::from_str(s));
        }
        let mode = match mode {
            IdbTransactionMode::Readwrite => "readwrite",
            _ => "readonly",
        };
        let opts = Object::new();
        let durability = if strict { "strict" } else { "default" };
        Reflect::set(&opts, &"durability".into(), &durability.into()).map_err(failed)?;
        self.db
            .unchecked_ref::<DatabaseWithOptions>()
            .transaction_with_options(&names, mode, &opts)
            .map_err(failed)
    }

    fn store(tx: &IdbTransaction, name: &str) -> Result<IdbObjectStore, IdbError> {
        tx.object_store(name).map_err(failed)
    }

    /// Stores a batch of writes in one strict transaction (group commit). Each member
    /// gets its id, or why it was not stored; the ids are returned only after the
    /// transaction committed, so no caller can claim a write queued before it is.
    pub async fn enqueue(
        &self,
        batch: Vec<Pending>,
        max_records: u32,
    ) -> Vec<Result<RecordId, EnqueueFailure>> {
        let n = batch.len();
        match self.enqueue_inner(batch, max_records).await {
            Ok(r) => r,
            Err(e) => vec![Err(EnqueueFailure::Storage(e.to_string())); n],
        }
    }

    async fn enqueue_inner(
        &self,
        batch: Vec<Pending>,
        max_records: u32,
    ) -> Result<Vec<Result<RecordId, EnqueueFailure>>, IdbError> {
        let tx = self.tx(&[MUTATIONS], IdbTransactionMode::Readwrite, true)?;
        let committed = done(&tx);
        let store = Self::store(&tx, MUTATIONS)?;
        let count = request(store.count().map_err(failed)?)
            .await?
            .as_f64()
            .unwrap_or(0.0) as u64;
        let mut room = (max_records as u64).saturating_sub(count);
        let mut adds = Vec::with_capacity(batch.len());
        for p in batch {
            if room == 0 {
                adds.push(None);
                continue;
            }
            room -= 1;
            let value = to_js(&p.record)?;
            let body = p.body.map(JsValue::from).unwrap_or(JsValue::NULL);
            Reflect::set(&value, &"body".into(), &body).map_err(failed)?;
            adds.push(Some(request(store.add(&value).map_err(failed)?)));
        }
        if adds.iter().all(Option::is_none) {
            // Nothing to write: end the transaction rather than wait for it.
            let _ = tx.abort();
            return Ok(adds
                .into_iter()
                .map(|_| Err(EnqueueFailure::Full))
                .collect());
        }
        committed.await?;
        let mut out = Vec::with_capacity(adds.len());
        for add in adds {
            out.push(match add {
                None => Err(EnqueueFailure::Full),
                Some(f) => match f.await {
                    Ok(key) => record_id(&key).ok_or(EnqueueFailure::Storage("bad key".into())),
                    Err(e) => Err(EnqueueFailure::Storage(e.to_string())),
                },
            });
        }
        Ok(out)
    }

    /// Every stored value in id order, read as records or reported corrupt. The cursor
    /// holds one value at a time, and no body is copied into Rust.
    pub async fn read_queue(&self) -> Result<Vec<QueueItem>, IdbError> {
        let tx = self.tx(&[MUTATIONS], IdbTransactionMode::Readonly, false)?;
        let store = Self::store(&tx, MUTATIONS)?;
        let req = store.open_cursor().map_err(failed)?;
        let (mut steps, _handlers) = cursor_steps(&req);
        let mut out = Vec::new();
        while let Some(step) = next(&mut steps).await {
            let Some(cursor) = step? else { break };
            let key = cursor.primary_key().map_err(failed)?;
            let value = cursor.value().map_err(failed)?;
            if let Some(item) = read_item(&key, &value, &*self.patterns) {
                out.push(item);
            }
            cursor.continue_().map_err(failed)?;
        }
        Ok(out)
    }

    pub async fn count(&self) -> Result<u64, IdbError> {
        let tx = self.tx(&[MUTATIONS], IdbTransactionMode::Readonly, false)?;
        let store = Self::store(&tx, MUTATIONS)?;
        Ok(request(store.count().map_err(failed)?)
            .await?
            .as_f64()
            .unwrap_or(0.0) as u64)
    }

    /// Marks a record in flight (`attempts` + 1) and returns its stored value for the
    /// request, in one transaction committed before the request goes out. `None` when
    /// the record is gone or no longer readable.
    pub async fn begin_send(
        &self,
        id: RecordId,
    ) -> Result<Option<(RecordMeta, JsValue)>, IdbError> {
        let tx = self.tx(&[MUTATIONS], IdbTransactionMode::Readwrite, false)?;
        let committed = done(&tx);
        let store = Self::store(&tx, MUTATIONS)?;
        let key = JsValue::from_f64(id.0 as f64);
        let value = request(store.get(&key).map_err(failed)?).await?;
        let Some(QueueItem::Record(mut meta)) = read_item(&key, &value, &*self.patterns) else {
            return Ok(None);
        };
        meta.attempts = meta.attempts.saturating_add(1);
        Reflect::set(&value, &"attempts".into(), &meta.attempts.into()).map_err(failed)?;
        request(store.put(&value).map_err(failed)?).await?;
        committed.await?;
        Ok(Some((meta, value)))
    }

    /// Writes a record's new state over the stored one (the body is untouched).
    /// `Ok(false)` when the record is gone.
    pub async fn write_fields(
        &self,
        id: RecordId,
        fields: &MutableFields,
    ) -> Result<bool, IdbError> {
        let tx = self.tx(&[MUTATIONS], IdbTransactionMode::Readwrite, false)?;
        let committed = done(&tx);
        let store = Self::store(&tx, MUTATIONS)?;
        let key = JsValue::from_f64(id.0 as f64);
        let value = request(store.get(&key).map_err(failed)?).await?;
        if !value.is_object() {
            let _ = tx.abort();
            return Ok(false);
        }
        let patch: Object = to_js(fields)?.unchecked_into();
        Object::assign(value.unchecked_ref(), &patch);
        request(store.put(&value).map_err(failed)?).await?;
        committed.await?;
        Ok(true)
    }

    pub async fn delete(&self, id: RecordId) -> Result<(), IdbError> {
        let tx = self.tx(&[MUTATIONS], IdbTransactionMode::Readwrite, false)?;
        let committed = done(&tx);
        let store = Self::store(&tx, MUTATIONS)?;
        request(
            store
                .delete(&JsValue::from_f64(id.0 as f64))
                .map_err(failed)?,
        )
        .await?;
        committed.await
    }

    async fn get_session_value(&self, key: &str) -> Result<JsValue, IdbError> {
        let tx = self.tx(&[SESSION], IdbTransactionMode::Readonly, false)?;
        let store = Self::store(&tx, SESSION)?;
        request(store.get(&key.into()).map_err(failed)?).await
    }

    async fn put_session_value(&self, value: &JsValue) -> Result<(), IdbError> {
        let tx = self.tx(&[SESSION], IdbTransactionMode::Readwrite, true)?;
        let committed = done(&tx);
        let store = Self::store(&tx, SESSION)?;
        request(store.put(value).map_err(failed)?).await?;
        committed.await
    }

    /// The account of the last `AUTH_SESSION` (`None`: signed out or never told).
    pub async fn session_user(&self) -> Result<Option<String>, IdbError> {
        let v = self.get_session_value(SESSION_KEY).await?;
        Ok(Reflect::get(&v, &"userId".into())
            .ok()
            .and_then(|u| u.as_string())
            .filter(|u| !u.is_empty()))
    }

    pub async fn set_session_user(&self, user: Option<&str>) -> Result<(), IdbError> {
        let v = Object::new();
        Reflect::set(&v, &"key".into(), &SESSION_KEY.into()).map_err(failed)?;
        let u = user.map(JsValue::from_str).unwrap_or(JsValue::NULL);
        Reflect::set(&v, &"userId".into(), &u).map_err(failed)?;
        self.put_session_value(&v).await
    }

    pub async fn backoff(&self) -> Result<crate::core::backoff::Backoff, IdbError> {
        let v = self.get_session_value(BACKOFF_KEY).await?;
        if !v.is_object() {
            return Ok(Default::default());
        }
        Ok(crate::js::from_value(v).unwrap_or_default())
    }

    pub async fn set_backoff(&self, b: &crate::core::backoff::Backoff) -> Result<(), IdbError> {
        let v = to_js(b)?;
        Reflect::set(&v, &"key".into(), &BACKOFF_KEY.into()).map_err(failed)?;
        self.put_session_value(&v).await
    }

    /// Whether `user` opted in to delivery notifications on this device.
    pub async fn notifications_enabled(&self, user: &str) -> Result<bool, IdbError> {
        let v = self
            .get_session_value(&format!("{NOTIFY_PREFIX}{user}"))
            .await?;
        Ok(Reflect::get(&v, &"enabled".into())
            .ok()
            .and_then(|e| e.as_bool())
            .unwrap_or(false))
    }

    /// Records `user`'s choice; `CLEAR_DEVICE` removes it with the session.
    pub async fn set_notifications(&self, user: &str, enabled: bool) -> Result<(), IdbError> {
        let v = Object::new();
        let key = format!("{NOTIFY_PREFIX}{user}");
        Reflect::set(&v, &"key".into(), &key.into()).map_err(failed)?;
        Reflect::set(&v, &"userId".into(), &user.into()).map_err(failed)?;
        Reflect::set(&v, &"enabled".into(), &enabled.into()).map_err(failed)?;
        self.put_session_value(&v).await
    }

    /// Stores a raw value as it is, bypassing every check: for tests that need a
    /// corrupt record in the store.
    #[doc(hidden)]
    pub async fn put_raw_for_tests(&self, value: &JsValue) -> Result<(), IdbError> {
        let tx = self.tx(&[MUTATIONS], IdbTransactionMode::Readwrite, false)?;
        let committed = done(&tx);
        request(Self::store(&tx, MUTATIONS)?.add(value).map_err(failed)?).await?;
        committed.await
    }

    /// Deletes every record and the session, in one transaction.
    pub async fn clear_device(&self) -> Result<(), IdbError> {
        let tx = self.tx(&[MUTATIONS, SESSION], IdbTransactionMode::Readwrite, true)?;
        let committed = done(&tx);
        request(Self::store(&tx, MUTATIONS)?.clear().map_err(failed)?).await?;
        request(Self::store(&tx, SESSION)?.clear().map_err(failed)?).await?;
        committed.await
    }

    /// Runs `change` over every stored value in one readwrite transaction: it returns
    /// the fields to write over a record, `Delete`, or nothing. The read and the change
    /// are atomic: a concurrent flush sees all of it or none.
    /// `only` limits it to one record.
    pub async fn rewrite_where<F>(
        &self,
        only: Option<RecordId>,
        mut change: F,
    ) -> Result<u64, IdbError>
    where
        F: FnMut(&QueueItem) -> Rewrite,
    {
        let tx = self.tx(&[MUTATIONS], IdbTransactionMode::Readwrite, true)?;
        let committed = done(&tx);
        let store = Self::store(&tx, MUTATIONS)?;
        let req = match only {
            None => store.open_cursor(),
            Some(id) => web_sys::IdbKeyRange::only(&JsValue::from_f64(id.0 as f64))
                .and_then(|range| store.open_cursor_with_range(&range)),
        }
        .map_err(failed)?;
        let (mut steps, _handlers) = cursor_steps(&req);
        let mut affected = 0;
        while let Some(step) = next(&mut steps).await {
            let Some(cursor) = step? else { break };
            let key = cursor.primary_key().map_err(failed)?;
            let value = cursor.value().map_err(failed)?;
            if let Some(item) = read_item(&key, &value, &*self.patterns) {
                match change(&item) {
                    Rewrite::Keep => {}
                    Rewrite::Fields(fields) => {
                        let patch: Object = to_js(&fields)?.unchecked_into();
                        Object::assign(value.unchecked_ref(), &patch);
                        cursor.update(&value).map_err(failed)?;
                        affected += 1;
                    }
                    Rewrite::Delete => {
                        cursor.delete().map_err(failed)?;
                        affected += 1;
                    }
                }
            }
            cursor.continue_().map_err(failed)?;
        }
        committed.await?;
        Ok(affected)
    }
}

/// What [`Store::rewrite_where`] does with one stored value.
pub enum Rewrite {
    Keep,
    Fields(MutableFields),
    Delete,
}

/// The version-change step: stores created as section 3 says; a version-1 database's
/// records rewritten in place.
fn upgrade(
    req: &IdbOpenDbRequest,
    old_version: u32,
    patterns: &Rc<dyn Patterns>,
    migration: &MigrationSlot,
) -> Result<(), String> {
    let db: IdbDatabase = req
        .result()
        .map_err(|e| describe(&e))?
        .dyn_into()
        .map_err(|_| "no database".to_string())?;
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
    if !names.contains(SESSION) {
        let params = IdbObjectStoreParameters::new();
        params.set_key_path(&"key".into());
        db.create_object_store_with_optional_parameters(SESSION, &params)
            .map_err(|e| describe(&e))?;
    }
    if old_version == 1 {
        let tx = req
            .transaction()
            .ok_or_else(|| "no version-change transaction".to_string())?;
        let store = tx.object_store(MUTATIONS).map_err(|e| describe(&e))?;
        if !store.index_names().contains("timestamp") {
            store
                .create_index_with_str("timestamp", "timestamp")
                .map_err(|e| describe(&e))?;
        }
        let cursor_req = store.open_cursor().map_err(|e| describe(&e))?;
        let (r, pats) = (cursor_req.clone(), patterns.clone());
        let step: Closure<dyn FnMut()> = Closure::new(move || {
            let Ok(c) = r.result() else { return };
            let Ok(cursor) = c.dyn_into::<IdbCursorWithValue>() else {
                return;
            };
            if let Ok(value) = cursor.value() {
                if let Some(v) = upgrade_v1_value(&value, &*pats) {
                    let _ = cursor.update(&v);
                }
            }
            let _ = cursor.continue_();
        });
        cursor_req.set_onsuccess(Some(step.as_ref().unchecked_ref()));
        *migration.borrow_mut() = Some(step);
    }
    Ok(())
}
