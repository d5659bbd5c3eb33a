//! The outbox's IndexedDB database (contract section 3): schema and upgrades, and one
//! function per transaction the outbox needs.
//!
//! Built on web-sys directly rather than a wrapper crate because two things the contract
//! requires are not expressible through rexie 0.6: a `durability: "strict"` commit for
//! queued writes, and rewriting older records inside the version-change transaction.
//!
//! Schema 3 keeps each record's body in its own store (`bodies`, keyed by the record's
//! id): every scan of the queue (a flush, `LIST_QUEUE`, the lanes at start) reads
//! metadata only, and the in-flight mark and the settling of a replay rewrite metadata
//! only. The `session` store also holds the generation (see [`Generation`]).

pub mod idb;
pub mod session_values;
mod upgrade;
mod windows;

pub use windows::Kept;

use crate::channel::mpsc;
use crate::core::credential::Authorization;
use crate::core::record::{
    CorruptRecord, MutableFields, NewRecord, RawRecord, RecordId, RecordMeta, MAX_SAFE_INTEGER,
};
use crate::core::route::Patterns;
use idb::{done, failed, request, IdbError, RequestFuture};
use js_sys::{Object, Reflect, Uint8Array};
use serde::Serialize;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::{
    IdbCursorWithValue, IdbDatabase, IdbFactory, IdbObjectStore, IdbOpenDbRequest, IdbTransaction,
    IdbTransactionMode, IdbVersionChangeEvent,
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

pub use crate::core::layout::{BODIES, MUTATIONS, SESSION, VERSION};
use crate::core::layout::{GENERATION_KEY, SCOPE_KEY, SESSION_KEY};
const BACKOFF_KEY: &str = "backoff";
/// Why the last flush stopped and when the next is due (`core::delivery::Delivery`).
const DELIVERY_KEY: &str = "delivery";
/// `notify:<userId>` holds one account's delivery-notification choice.
const NOTIFY_PREFIX: &str = "notify:";

/// The database's change counter (contract 8, r2). Every transaction that changes what
/// a worker keeps in memory — the session, which lanes hold unresolved records — adds
/// one to `n` in the same transaction; `CLEAR_DEVICE` also adds one to `clears`. A
/// worker compares `n` with the generation its copies reflect before it uses them, so
/// neither of two worker instances (an old and a new version during an update) acts on
/// a view the other has changed since; `clears` fences writes still on their first
/// attempt when a clear commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Generation {
    pub n: u64,
    pub clears: u64,
}

impl Generation {
    fn read(v: &JsValue) -> Generation {
        let num = |f: &str| {
            Reflect::get(v, &f.into())
                .ok()
                .and_then(|x| x.as_f64())
                .filter(|x| x.is_finite() && *x >= 0.0)
                .map_or(0, |x| x as u64)
        };
        Generation {
            n: num("n"),
            clears: num("clears"),
        }
    }

    fn to_js(self) -> Result<JsValue, IdbError> {
        let v = Object::new();
        let set = |k: &str, x: JsValue| Reflect::set(&v, &k.into(), &x).map_err(failed);
        set("key", GENERATION_KEY.into())?;
        set("n", JsValue::from_f64(self.n as f64))?;
        set("clears", JsValue::from_f64(self.clears as f64))?;
        Ok(v.into())
    }

    /// The generation after one more change (`clear`: a `CLEAR_DEVICE`).
    pub fn next(self, clear: bool) -> Generation {
        Generation {
            n: self.n + 1,
            clears: self.clears + u64::from(clear),
        }
    }
}

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

/// What the last `AUTH_SESSION` persisted beside its account (r3): whether it carried a
/// credential (a bearer session), and the credential itself where `persistAuthorization`
/// keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SessionAuth {
    pub bearer: bool,
    pub authorization: Option<Authorization>,
}

/// The queue as read in one transaction, with the generation and session of that moment.
pub struct Snapshot {
    pub generation: Generation,
    pub session: Option<String>,
    pub auth: SessionAuth,
    pub items: Vec<QueueItem>,
    /// Values stored under a key that is not a record id (not written by the outbox);
    /// [`Store::rekey_foreign`] gives them ids so they can be listed and discarded.
    pub foreign: usize,
}

/// A write to be queued: its fields, its exact body bytes, and the clear count of the
/// view it was decided in (a clear since then means it is not stored).
pub struct Pending {
    pub record: NewRecord,
    pub body: Option<Uint8Array>,
    pub clears: u64,
}

/// One step of a replay, stored with the others due at the same moment
/// ([`Store::replay_steps`]).
#[derive(Debug, Clone)]
pub enum ReplayStep {
    /// Mark in flight (`attempts` + 1, `firstSentAt` when `None`) and read the record and
    /// its body for the request. `first_send`: the caller knows it was never sent.
    Begin {
        id: RecordId,
        now_ms: u64,
        first_send: bool,
    },
    /// The record and its body go (a replayed write).
    Delete(RecordId),
    /// The record's new state over its stored metadata; the body is untouched.
    Update(RecordId, MutableFields),
    /// `marks` marks whose request never left (held at the sign-in barrier, marked ahead
    /// and not reached, a stop, the budget: r4, 4.7): `attempts` − `marks`, and
    /// `firstSentAt` back to null when it still holds `first_send`, the time the first of
    /// them set.
    Unmark {
        id: RecordId,
        marks: u32,
        first_send: Option<u64>,
    },
}

/// What a [`ReplayStep`] found, once its transaction committed.
#[derive(Debug)]
pub enum StepDone {
    /// The record as marked, with its body; `None` when it is gone or unreadable.
    Begun(Option<(RecordMeta, Option<JsValue>)>),
    Deleted,
    /// Whether the record was still there to update.
    Updated(bool),
}

/// Why a batch member was not stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnqueueFailure {
    Full,
    Storage(String),
    /// Another worker changed the database since this worker's view was read: nothing
    /// of the batch was stored; refresh the view and try again.
    Stale,
    /// `CLEAR_DEVICE` committed after the write was decided: it is never stored.
    Cleared,
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

fn key_of(id: RecordId) -> JsValue {
    JsValue::from_f64(id.0 as f64)
}

/// The size of a body stored inside a record (schemas 1 and 2): absent or null is 0,
/// bytes and strings their length; any other value makes the record corrupt (`None`).
fn inline_body_len(value: &JsValue) -> Option<usize> {
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

/// A stored body as bytes for a request (`None` when there is none).
fn body_bytes(body: JsValue) -> Option<JsValue> {
    if body.is_null() || body.is_undefined() {
        None
    } else if let Some(s) = body.as_string() {
        Some(Uint8Array::from(s.as_bytes()).into())
    } else {
        Some(body)
    }
}

/// A primary key as a record id: a positive safe integer.
pub fn record_id(key: &JsValue) -> Option<RecordId> {
    let n = key.as_f64()?;
    (n >= 1.0 && n.fract() == 0.0 && n <= MAX_SAFE_INTEGER as f64).then_some(RecordId(n as u64))
}

/// The field a re-keyed foreign value carries, so that it reads as corrupt.
const FOREIGN_MARK: &str = "swOutboxForeignKey";

/// Reads one stored value as a record, or says why it is corrupt. `None` when `key` is
/// not a record id.
pub fn read_item(key: &JsValue, value: &JsValue, patterns: &dyn Patterns) -> Option<QueueItem> {
    let id = record_id(key)?;
    if !value.is_object() {
        return Some(QueueItem::Corrupt(id, "not an object".into()));
    }
    if Reflect::has(value, &FOREIGN_MARK.into()).unwrap_or(false) {
        return Some(QueueItem::Corrupt(
            id,
            "stored under a key that is not a record id".into(),
        ));
    }
    let raw = raw_record(value).map_err(CorruptRecord::Shape);
    Some(
        match raw.and_then(|raw| RecordMeta::from_raw(id, raw, inline_body_len(value), patterns)) {
            Ok(meta) => QueueItem::Record(meta),
            Err(e) => QueueItem::Corrupt(id, e.to_string()),
        },
    )
}

/// A stored value's fields as [`RawRecord`], read one by one: what serde over the value
/// read (absent, `undefined` and `null` are `None`; a BigInt reads as `Number()` gives
/// it; other fields are ignored), without a serde instantiation in the module (read_item
/// was 13.5 KB of it). The first field of the wrong type is named.
// Assigned field by field, not one struct literal: an early return then drops the one
// value, where the literal's returns each dropped the fields read so far (100 B gzip).
#[allow(clippy::field_reassign_with_default)]
fn raw_record(value: &JsValue) -> Result<RawRecord, String> {
    let mut r = RawRecord::default();
    r.id = num(value, "id")?;
    r.method = text(value, "method")?;
    r.path = text(value, "path")?;
    r.content_type = text(value, "contentType")?;
    r.timestamp = num(value, "timestamp")?;
    r.owner_id = text(value, "ownerId")?;
    r.workspace = text(value, "workspace")?;
    r.idempotency_key = text(value, "idempotencyKey")?;
    r.state = text(value, "state")?;
    r.attention_reason = text(value, "attentionReason")?;
    r.server_failures = num(value, "serverFailures")?;
    r.last_status = num(value, "lastStatus")?;
    r.attempts = num(value, "attempts")?;
    r.body_size = num(value, "bodySize")?;
    r.first_sent_at = num(value, "firstSentAt")?;
    r.headers = match field(value, "headers")? {
        None => None,
        Some(v) => Some(header_pairs(&v).ok_or_else(|| wrong("headers", "[name, value] pairs"))?),
    };
    r.credentials = text(value, "credentials")?;
    r.conflicts = num(value, "conflicts")?;
    r.conflicts_since = num(value, "conflictsSince")?;
    Ok(r)
}

/// Why a stored field is unreadable, naming it.
fn wrong(f: &str, what: &str) -> String {
    ["field `", f, "` is not ", what].concat()
}

/// A stored field; absent, `undefined` and `null` are `None`.
fn field(value: &JsValue, f: &'static str) -> Result<Option<JsValue>, String> {
    let v = crate::js::with_name(f, |name| Reflect::get(value, name))
        .map_err(|_| wrong(f, "readable"))?;
    Ok((!v.is_null() && !v.is_undefined()).then_some(v))
}

/// A numeric stored field (a BigInt reads as `Number()` gives it).
fn num(value: &JsValue, f: &'static str) -> Result<Option<f64>, String> {
    match field(value, f)? {
        None => Ok(None),
        Some(v) if v.is_bigint() => {
            #[allow(deprecated)]
            let n = js_sys::Number::new(&v).value_of();
            Ok(Some(n))
        }
        Some(v) => v.as_f64().map(Some).ok_or_else(|| wrong(f, "a number")),
    }
}

/// A text stored field.
fn text(value: &JsValue, f: &'static str) -> Result<Option<String>, String> {
    match field(value, f)? {
        None => Ok(None),
        Some(v) => v.as_string().map(Some).ok_or_else(|| wrong(f, "a string")),
    }
}

/// `[[name, value], …]` as pairs (extra elements of a pair are ignored, as serde's
/// tuples ignored them); `None` when it is not that shape.
fn header_pairs(v: &JsValue) -> Option<Vec<(String, String)>> {
    if !js_sys::Array::is_array(v) {
        return None;
    }
    let items: &js_sys::Array = v.unchecked_ref();
    let mut out = Vec::with_capacity(items.length() as usize);
    for item in items.iter() {
        if !js_sys::Array::is_array(&item) {
            return None;
        }
        let pair: &js_sys::Array = item.unchecked_ref();
        if pair.length() < 2 {
            return None;
        }
        out.push((pair.get(0).as_string()?, pair.get(1).as_string()?));
    }
    Some(out)
}

/// One step of a cursor: the cursor on the next value, `None` past the last.
type CursorStep = Result<Option<IdbCursorWithValue>, IdbError>;
/// The event handlers that feed a cursor's channel; dropped with it.
type CursorHandlers = (Closure<dyn FnMut()>, Closure<dyn FnMut()>);

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

/// The next item of a channel.
pub(crate) async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> Option<T> {
    rx.next().await
}

/// Reads the generation and writes the next one, inside `tx`'s `session` store. Returns
/// the generation read (the one the change applies to).
async fn bump(session: &IdbObjectStore, clear: bool) -> Result<Generation, IdbError> {
    let before =
        Generation::read(&request(session.get(&GENERATION_KEY.into()).map_err(failed)?).await?);
    request(session.put(&before.next(clear).to_js()?).map_err(failed)?).await?;
    Ok(before)
}

/// What a read-write transaction's work decided: keep what it wrote, or end without
/// writing anything (a stale view, nothing to change).
enum TxEnd<T> {
    Commit(T),
    Abort(T),
}

/// Ends a read-write transaction after its work: committed when the work succeeded and
/// asked for it; aborted when it asked for that, or when it failed midway — a request
/// that could not even be made (a value that cannot be cloned, a closed database) after
/// others were must never let the transaction commit part of the work (issue 27, 7).
async fn finish<T>(
    tx: &IdbTransaction,
    committed: idb::TransactionFuture,
    work: Result<TxEnd<T>, IdbError>,
) -> Result<T, IdbError> {
    match work {
        Ok(TxEnd::Commit(v)) => {
            committed.await?;
            Ok(v)
        }
        Ok(TxEnd::Abort(v)) => {
            let _ = tx.abort();
            Ok(v)
        }
        Err(e) => {
            let _ = tx.abort();
            Err(e)
        }
    }
}

/// The row that claims the default database for the registration of scope `scope`
/// (contract 3, r3).
fn claim_row(scope: &str) -> Result<JsValue, IdbError> {
    let claim = Object::new();
    Reflect::set(&claim, &"key".into(), &SCOPE_KEY.into()).map_err(failed)?;
    Reflect::set(&claim, &"scope".into(), &scope.into()).map_err(failed)?;
    Ok(claim.into())
}

impl Store {
    /// Opens (creating or upgrading) the database. Older databases keep every record:
    /// the upgrade rewrites each one in the version-change transaction.
    pub async fn open(name: &str, patterns: Rc<dyn Patterns>) -> Result<Store, IdbError> {
        Ok(Self::open_claiming(name, patterns, None).await?.0)
    }

    /// [`Store::open`], and a database created by this open claimed for scope `claim` in
    /// its creating transaction (`upgrade::run`): `true` when it was, so the start has no
    /// claim of its own to commit.
    pub async fn open_claiming(
        name: &str,
        patterns: Rc<dyn Patterns>,
        claim: Option<&str>,
    ) -> Result<(Store, bool), IdbError> {
        let open: IdbOpenDbRequest = factory()?.open_with_u32(name, VERSION).map_err(failed)?;
        let migration: upgrade::MigrationSlot = Rc::new(RefCell::new(None));
        let claimed = Rc::new(Cell::new(false));
        let (req, pats, mig) = (open.clone(), patterns.clone(), migration.clone());
        let (claim, claimed_in) = (claim.map(str::to_owned), claimed.clone());
        let on_upgrade: Closure<dyn FnMut(IdbVersionChangeEvent)> =
            Closure::new(move |e: IdbVersionChangeEvent| {
                let old = e.old_version() as u32;
                match upgrade::run(&req, old, &pats, &mig, claim.as_deref()) {
                    Ok(c) => claimed_in.set(c),
                    Err(err) => {
                        web_sys::console::error_1(
                            &format!("sw-outbox: upgrade failed: {err}").into(),
                        );
                        if let Some(tx) = req.transaction() {
                            let _ = tx.abort();
                        }
                    }
                }
            });
        open.set_onupgradeneeded(Some(on_upgrade.as_ref().unchecked_ref()));
        let db = request(open.clone().into()).await;
        open.set_onupgradeneeded(None);
        drop(on_upgrade);
        migration.borrow_mut().take();
        let db: IdbDatabase = db?.dyn_into().map_err(|_| IdbError::Unavailable)?;
        Ok((Self::adopt(db, patterns), claimed.get()))
    }

    /// A store over a connection opened elsewhere at [`VERSION`] (`sw.js` opens the
    /// database at its first evaluation, issue 36): it gets the same version-change
    /// handling as one this module opened.
    pub fn adopt(db: IdbDatabase, patterns: Rc<dyn Patterns>) -> Store {
        // Let a newer worker's upgrade proceed instead of being blocked by this one.
        let db_for_close = db.clone();
        let on_version_change: Closure<dyn FnMut()> = Closure::new(move || db_for_close.close());
        db.set_onversionchange(Some(on_version_change.as_ref().unchecked_ref()));
        on_version_change.forget();
        Store { db, patterns }
    }

    pub fn close(&self) {
        self.db.close();
    }

    /// Claims the database for the registration of scope `me` unless another scope
    /// claimed it first: whether `me` may use it. Read and written in one transaction,
    /// so two registrations starting at once cannot both claim it.
    pub async fn claim(&self, me: &str) -> Result<bool, IdbError> {
        let tx = self.tx(&[SESSION], IdbTransactionMode::Readwrite, true)?;
        let committed = done(&tx);
        let work = async {
            let store = Self::store(&tx, SESSION)?;
            let v = request(store.get(&SCOPE_KEY.into()).map_err(failed)?).await?;
            let owner = Self::claimed_scope(&v);
            if owner.is_some() {
                let mine = crate::core::config::owns_default_db(owner.as_deref(), me);
                return Ok(TxEnd::Abort(mine));
            }
            request(store.put(&claim_row(me)?).map_err(failed)?).await?;
            Ok(TxEnd::Commit(true))
        }
        .await;
        finish(&tx, committed, work).await
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

    /// The generation now (a read of one small value).
    pub async fn generation(&self) -> Result<Generation, IdbError> {
        let tx = self.tx(&[SESSION], IdbTransactionMode::Readonly, false)?;
        let session = Self::store(&tx, SESSION)?;
        Ok(Generation::read(
            &request(session.get(&GENERATION_KEY.into()).map_err(failed)?).await?,
        ))
    }

    /// The generation, the session and every record's metadata, as of one moment.
    pub async fn snapshot(&self) -> Result<Snapshot, IdbError> {
        let tx = self.tx(&[MUTATIONS, SESSION], IdbTransactionMode::Readonly, false)?;
        let session = Self::store(&tx, SESSION)?;
        let gen = request(session.get(&GENERATION_KEY.into()).map_err(failed)?);
        let user = request(session.get(&SESSION_KEY.into()).map_err(failed)?);
        let all = request(Self::store(&tx, MUTATIONS)?.get_all().map_err(failed)?);
        let (gen, user) = (gen.await?, user.await?);
        Ok(self.snapshot_of(&gen, &user, &all.await?))
    }

    /// The snapshot of the rows [`Store::snapshot`] reads (the generation, the session
    /// row and every record), read in one transaction by this module or by `sw.js`.
    pub fn snapshot_of(&self, generation: &JsValue, user: &JsValue, all: &JsValue) -> Snapshot {
        let (items, foreign) = self.items_of(all);
        Snapshot {
            generation: Generation::read(generation),
            session: session_user_of(user),
            auth: session_auth_of(user),
            items,
            foreign,
        }
    }

    /// The scope recorded in a claim row (`SCOPE_KEY`), as [`Store::claim`] reads it.
    pub fn claimed_scope(row: &JsValue) -> Option<String> {
        Reflect::get(row, &"scope".into())
            .ok()
            .and_then(|s| s.as_string())
    }

    fn items_of(&self, all: &JsValue) -> (Vec<QueueItem>, usize) {
        let Some(values) = all.dyn_ref::<js_sys::Array>() else {
            return (Vec::new(), 0);
        };
        let mut items = Vec::with_capacity(values.length() as usize);
        let mut foreign = 0;
        for value in values.iter() {
            // The store's key path is `id`: a value's `id` is its primary key.
            let key = crate::js::with_name("id", |id| Reflect::get(&value, id))
                .unwrap_or(JsValue::UNDEFINED);
            match read_item(&key, &value, &*self.patterns) {
                Some(item) => items.push(item),
                None => foreign += 1,
            }
        }
        (items, foreign)
    }

    /// Stores a batch of writes in one strict transaction (group commit). Each member
    /// gets its id, or why it was not stored; the ids are returned only after the
    /// transaction committed, so no caller can claim a write queued before it is.
    /// `expected` is the generation the writes were decided under, read when the
    /// transaction sees the database's: any other generation stores nothing (`Stale`).
    /// Returns the generation the batch applied to when it committed.
    pub async fn enqueue(
        &self,
        batch: &[&Pending],
        max_records: u32,
        expected: &dyn Fn() -> Option<u64>,
    ) -> (Option<Generation>, Vec<Result<RecordId, EnqueueFailure>>) {
        let n = batch.len();
        match self.enqueue_inner(batch, max_records, expected).await {
            Ok(r) => r,
            Err(e) => (None, vec![Err(EnqueueFailure::Storage(e.to_string())); n]),
        }
    }

    async fn enqueue_inner(
        &self,
        batch: &[&Pending],
        max_records: u32,
        expected: &dyn Fn() -> Option<u64>,
    ) -> Result<(Option<Generation>, Vec<Result<RecordId, EnqueueFailure>>), IdbError> {
        let tx = self.tx(
            &[MUTATIONS, BODIES, SESSION],
            IdbTransactionMode::Readwrite,
            true,
        )?;
        let committed = done(&tx);
        let work = self.enqueue_in(&tx, batch, max_records, expected).await;
        let (before, keys) = finish(&tx, committed, work).await?;
        let out = keys
            .into_iter()
            .map(|k| {
                k.and_then(|key| record_id(&key).ok_or(EnqueueFailure::Storage("bad key".into())))
            })
            .collect();
        Ok((before, out))
    }

    /// The requests of [`Store::enqueue`], inside its transaction.
    #[allow(clippy::type_complexity)]
    async fn enqueue_in(
        &self,
        tx: &IdbTransaction,
        batch: &[&Pending],
        max_records: u32,
        expected: &dyn Fn() -> Option<u64>,
    ) -> Result<TxEnd<(Option<Generation>, Vec<Result<JsValue, EnqueueFailure>>)>, IdbError> {
        let store = Self::store(tx, MUTATIONS)?;
        let bodies = Self::store(tx, BODIES)?;
        let session = Self::store(tx, SESSION)?;
        let count = request(store.count().map_err(failed)?);
        let before = bump(&session, false).await?;
        let count = count.await?.as_f64().unwrap_or(0.0) as u64;
        if expected() != Some(before.n) {
            let stale = batch.iter().map(|_| Err(EnqueueFailure::Stale)).collect();
            return Ok(TxEnd::Abort((None, stale)));
        }
        let mut room = (max_records as u64).saturating_sub(count);
        let mut adds = Vec::with_capacity(batch.len());
        let mut held = Vec::with_capacity(batch.len());
        for p in batch.iter() {
            if p.clears != before.clears {
                adds.push(Err(EnqueueFailure::Cleared));
                continue;
            }
            if room == 0 {
                adds.push(Err(EnqueueFailure::Full));
                continue;
            }
            room -= 1;
            let value = to_js(&p.record)?;
            adds.push(Ok(request(store.add(&value).map_err(failed)?)));
            held.push(p.body.clone());
        }
        if adds.iter().all(Result::is_err) {
            // Nothing to write: end the transaction rather than wait for it.
            let none = adds.into_iter().map(|a| a.map(|_| JsValue::NULL)).collect();
            return Ok(TxEnd::Abort((None, none)));
        }
        let mut keys = Vec::with_capacity(adds.len());
        let mut bodies_left = held.into_iter();
        for add in adds {
            keys.push(match add {
                Err(why) => Err(why),
                Ok(f) => {
                    let key = f.await?;
                    if let Some(body) = bodies_left.next().flatten() {
                        // Issued from the add's success: the transaction is still active.
                        bodies.put_with_key(&body, &key).map_err(failed)?;
                    }
                    Ok(key)
                }
            });
        }
        Ok(TxEnd::Commit((Some(before), keys)))
    }

    /// Every stored record's metadata in id order, read as records or reported corrupt,
    /// and how many values are stored under foreign keys. No body is read.
    pub async fn read_queue(&self) -> Result<(Vec<QueueItem>, usize), IdbError> {
        let tx = self.tx(&[MUTATIONS], IdbTransactionMode::Readonly, false)?;
        let all = request(Self::store(&tx, MUTATIONS)?.get_all().map_err(failed)?).await?;
        Ok(self.items_of(&all))
    }

    pub async fn count(&self) -> Result<u64, IdbError> {
        let tx = self.tx(&[MUTATIONS], IdbTransactionMode::Readonly, false)?;
        let store = Self::store(&tx, MUTATIONS)?;
        Ok(request(store.count().map_err(failed)?)
            .await?
            .as_f64()
            .unwrap_or(0.0) as u64)
    }

    /// Marks a record in flight and reads it for its request: [`ReplayStep::Begin`] alone.
    pub async fn begin_send(
        &self,
        id: RecordId,
        now_ms: u64,
        first_send: bool,
    ) -> Result<Option<(RecordMeta, Option<JsValue>)>, IdbError> {
        let step = ReplayStep::Begin {
            id,
            now_ms,
            first_send,
        };
        match self.replay_steps(vec![step]).await?.1.pop() {
            Some(StepDone::Begun(found)) => Ok(found),
            _ => Ok(None),
        }
    }

    /// Stores the steps of a replay that are due at the same moment in one transaction
    /// (group commit: a transaction per step serialised the lanes of a flush on
    /// IndexedDB), and answers each in order once it committed. Strict when a step
    /// records a first send (losing that time could let a replay run after the server's
    /// key window); relaxed otherwise, as a lost delete or settle only replays a record
    /// again under its key. Also returns the generation the deletes applied to, if any.
    pub async fn replay_steps(
        &self,
        steps: Vec<ReplayStep>,
    ) -> Result<(Option<Generation>, Vec<StepDone>), IdbError> {
        let strict = steps.iter().any(|s| {
            matches!(
                s,
                ReplayStep::Begin {
                    first_send: true,
                    ..
                }
            )
        });
        let deletes = steps.iter().any(|s| matches!(s, ReplayStep::Delete(_)));
        let names: &[&str] = if deletes {
            &[MUTATIONS, BODIES, SESSION]
        } else {
            &[MUTATIONS, BODIES]
        };
        let tx = self.tx(names, IdbTransactionMode::Readwrite, strict)?;
        let committed = done(&tx);
        // Nothing of a batch that failed midway is kept.
        let work = self.steps_in(&tx, steps, deletes).await.map(TxEnd::Commit);
        finish(&tx, committed, work).await
    }

    async fn steps_in(
        &self,
        tx: &IdbTransaction,
        steps: Vec<ReplayStep>,
        deletes: bool,
    ) -> Result<(Option<Generation>, Vec<StepDone>), IdbError> {
        let store = Self::store(tx, MUTATIONS)?;
        let bodies = Self::store(tx, BODIES)?;
        // Every read is asked for first, so the transaction has requests pending until the
        // last write is made; each write is made as its read arrives.
        let generation = if deletes {
            let session = Self::store(tx, SESSION)?;
            let get = request(session.get(&GENERATION_KEY.into()).map_err(failed)?);
            Some((session, get))
        } else {
            None
        };
        enum Reading {
            Begin(JsValue, RequestFuture, RequestFuture, u64),
            Deleted,
            Update(RequestFuture, MutableFields),
            Unmark(RequestFuture, u32, Option<u64>),
        }
        let mut reads = Vec::with_capacity(steps.len());
        for step in steps {
            reads.push(match step {
                ReplayStep::Begin { id, now_ms, .. } => {
                    let key = key_of(id);
                    let body = request(bodies.get(&key).map_err(failed)?);
                    let value = request(store.get(&key).map_err(failed)?);
                    Reading::Begin(key, value, body, now_ms)
                }
                ReplayStep::Delete(id) => {
                    let key = key_of(id);
                    store.delete(&key).map_err(failed)?;
                    bodies.delete(&key).map_err(failed)?;
                    Reading::Deleted
                }
                ReplayStep::Update(id, fields) => {
                    let key = key_of(id);
                    let value = request(store.get(&key).map_err(failed)?);
                    Reading::Update(value, fields)
                }
                ReplayStep::Unmark {
                    id,
                    marks,
                    first_send,
                } => {
                    let value = request(store.get(&key_of(id)).map_err(failed)?);
                    Reading::Unmark(value, marks, first_send)
                }
            });
        }
        let before = match generation {
            Some((session, get)) => {
                let before = Generation::read(&get.await?);
                session.put(&before.next(false).to_js()?).map_err(failed)?;
                Some(before)
            }
            None => None,
        };
        let mut out = Vec::with_capacity(reads.len());
        for reading in reads {
            out.push(match reading {
                Reading::Deleted => StepDone::Deleted,
                Reading::Update(value, fields) => {
                    let value = value.await?;
                    if value.is_object() {
                        let patch: Object = to_js(&fields)?.unchecked_into();
                        Object::assign(value.unchecked_ref(), &patch);
                        store.put(&value).map_err(failed)?;
                        StepDone::Updated(true)
                    } else {
                        StepDone::Updated(false)
                    }
                }
                Reading::Unmark(value, marks, first_send) => {
                    let value = value.await?;
                    let attempts = num(&value, "attempts").ok().flatten();
                    match attempts {
                        Some(n) if value.is_object() => {
                            let set = |f: &str, v: &JsValue| Reflect::set(&value, &f.into(), v);
                            let left = (n - f64::from(marks)).max(0.0);
                            set("attempts", &left.into()).map_err(failed)?;
                            let first = num(&value, "firstSentAt").ok().flatten();
                            if first_send.is_some_and(|t| first == Some(t as f64)) {
                                set("firstSentAt", &JsValue::NULL).map_err(failed)?;
                            }
                            store.put(&value).map_err(failed)?;
                            StepDone::Updated(true)
                        }
                        _ => StepDone::Updated(false),
                    }
                }
                Reading::Begin(key, value, body, now_ms) => {
                    let value = value.await?;
                    let mut body = body.await?;
                    match read_item(&key, &value, &*self.patterns) {
                        Some(QueueItem::Record(mut meta)) => {
                            // Marked (`attempts` + 1, `firstSentAt` the first time) in the
                            // transaction that commits before the request goes out.
                            // Only the two fields it changes are set on the stored object:
                            // no patch of every field serialised from Rust per send.
                            meta.attempts = meta.attempts.saturating_add(1);
                            let set = |f: &'static str, v: f64| {
                                crate::js::with_name(f, |f| Reflect::set(&value, f, &v.into()))
                            };
                            set("attempts", f64::from(meta.attempts)).map_err(failed)?;
                            if meta.first_sent_at.is_none() {
                                meta.first_sent_at = Some(now_ms);
                                set("firstSentAt", now_ms as f64).map_err(failed)?;
                            }
                            store.put(&value).map_err(failed)?;
                            if body.is_undefined() {
                                // A record whose body was never moved out (written by hand, say).
                                body =
                                    Reflect::get(&value, &"body".into()).unwrap_or(JsValue::NULL);
                            }
                            StepDone::Begun(Some((meta, body_bytes(body))))
                        }
                        // Gone (cleared) or no longer readable: nothing to send.
                        _ => StepDone::Begun(None),
                    }
                }
            });
        }
        Ok((before, out))
    }

    /// A record's body as stored (for reading it back), `None` when it has none.
    pub async fn body(&self, id: RecordId) -> Result<Option<JsValue>, IdbError> {
        Ok(self.record(id).await?.and_then(|(_, b)| b))
    }

    /// One stored value read as a record, with its body, in one transaction (`None`: no
    /// value under that id).
    pub async fn record(
        &self,
        id: RecordId,
    ) -> Result<Option<(QueueItem, Option<JsValue>)>, IdbError> {
        let tx = self.tx(&[MUTATIONS, BODIES], IdbTransactionMode::Readonly, false)?;
        let key = key_of(id);
        let body = request(Self::store(&tx, BODIES)?.get(&key).map_err(failed)?);
        let value = request(Self::store(&tx, MUTATIONS)?.get(&key).map_err(failed)?).await?;
        let mut body = body.await?;
        if value.is_undefined() {
            return Ok(None);
        }
        if body.is_undefined() {
            body = Reflect::get(&value, &"body".into()).unwrap_or(JsValue::NULL);
        }
        Ok(read_item(&key, &value, &*self.patterns).map(|item| (item, body_bytes(body))))
    }

    /// Writes a record's new state over the stored metadata (the body is untouched).
    /// `Ok(false)` when the record is gone.
    pub async fn write_fields(
        &self,
        id: RecordId,
        fields: &MutableFields,
    ) -> Result<bool, IdbError> {
        let tx = self.tx(&[MUTATIONS], IdbTransactionMode::Readwrite, false)?;
        let committed = done(&tx);
        let work = async {
            let store = Self::store(&tx, MUTATIONS)?;
            let value = request(store.get(&key_of(id)).map_err(failed)?).await?;
            if !value.is_object() {
                return Ok(TxEnd::Abort(false));
            }
            let patch: Object = to_js(fields)?.unchecked_into();
            Object::assign(value.unchecked_ref(), &patch);
            request(store.put(&value).map_err(failed)?).await?;
            Ok(TxEnd::Commit(true))
        }
        .await;
        finish(&tx, committed, work).await
    }

    /// Deletes a record and its body. Returns the generation the change applied to.
    pub async fn delete(&self, id: RecordId) -> Result<Generation, IdbError> {
        match self.replay_steps(vec![ReplayStep::Delete(id)]).await? {
            (Some(before), _) => Ok(before),
            (None, _) => Err(IdbError::Failed("no generation read".into())),
        }
    }

    async fn get_session_value(&self, key: &str) -> Result<JsValue, IdbError> {
        let tx = self.tx(&[SESSION], IdbTransactionMode::Readonly, false)?;
        let store = Self::store(&tx, SESSION)?;
        request(store.get(&key.into()).map_err(failed)?).await
    }

    /// Puts one value in the session store, strictly; `bump`: it changes what workers
    /// cache, so the generation moves (returned as it was before).
    async fn put_session_value(
        &self,
        value: &JsValue,
        bump_it: bool,
    ) -> Result<Option<Generation>, IdbError> {
        let tx = self.tx(&[SESSION], IdbTransactionMode::Readwrite, true)?;
        let committed = done(&tx);
        let work = async {
            let store = Self::store(&tx, SESSION)?;
            let put = request(store.put(value).map_err(failed)?);
            let before = if bump_it {
                Some(bump(&store, false).await?)
            } else {
                None
            };
            put.await?;
            Ok(TxEnd::Commit(before))
        }
        .await;
        finish(&tx, committed, work).await
    }

    /// The account of the last `AUTH_SESSION` (`None`: signed out or never told).
    pub async fn session_user(&self) -> Result<Option<String>, IdbError> {
        Ok(session_user_of(&self.get_session_value(SESSION_KEY).await?))
    }

    /// Persists the signed-in account; returns the generation the change applied to.
    pub async fn set_session_user(&self, user: Option<&str>) -> Result<Generation, IdbError> {
        self.set_session(user, &SessionAuth::default()).await
    }

    /// Persists the signed-in account and what its `AUTH_SESSION` said of a credential
    /// (r3): `bearer`, and the credential only when given (`persistAuthorization`). The
    /// record is replaced whole, so a sign-out or a cookie sign-in leaves no credential.
    pub async fn set_session(
        &self,
        user: Option<&str>,
        auth: &SessionAuth,
    ) -> Result<Generation, IdbError> {
        let v = Object::new();
        Reflect::set(&v, &"key".into(), &SESSION_KEY.into()).map_err(failed)?;
        let u = user.map(JsValue::from_str).unwrap_or(JsValue::NULL);
        Reflect::set(&v, &"userId".into(), &u).map_err(failed)?;
        if auth.bearer && user.is_some() {
            Reflect::set(&v, &"bearer".into(), &JsValue::TRUE).map_err(failed)?;
            if let Some(a) = &auth.authorization {
                Reflect::set(&v, &"authorization".into(), &a.as_str().into()).map_err(failed)?;
            }
        }
        self.put_session_value(&v, true)
            .await?
            .ok_or_else(|| IdbError::Failed("no generation".into()))
    }

    /// What the last `AUTH_SESSION` persisted of a credential.
    pub async fn session_auth(&self) -> Result<SessionAuth, IdbError> {
        Ok(session_auth_of(&self.get_session_value(SESSION_KEY).await?))
    }

    /// The backoff state. Read from the database at every use, never cached.
    pub async fn backoff(&self) -> Result<crate::core::backoff::Backoff, IdbError> {
        let v = self.get_session_value(BACKOFF_KEY).await?;
        if !v.is_object() {
            return Ok(Default::default());
        }
        Ok(session_values::backoff(&v).unwrap_or_default())
    }

    pub async fn set_backoff(&self, b: &crate::core::backoff::Backoff) -> Result<(), IdbError> {
        let v = to_js(b)?;
        Reflect::set(&v, &"key".into(), &BACKOFF_KEY.into()).map_err(failed)?;
        self.put_session_value(&v, false).await.map(drop)
    }

    /// Why the last flush stopped and when the next is due, as the last flush stored it
    /// (a restarted worker answers `LIST_QUEUE` with it).
    pub async fn delivery(&self) -> Result<crate::core::delivery::Delivery, IdbError> {
        let v = self.get_session_value(DELIVERY_KEY).await?;
        if !v.is_object() {
            return Ok(Default::default());
        }
        Ok(session_values::delivery(&v).unwrap_or_default())
    }

    /// Stores how a flush ended: the delivery state, and the backoff when it changed, in
    /// one transaction; strict when the backoff is in it (a `Retry-After` must outlive a
    /// restart), the browser's default otherwise (a lost delivery state only reports the
    /// flush before).
    pub async fn set_flush_end(
        &self,
        backoff: Option<&crate::core::backoff::Backoff>,
        delivery: &crate::core::delivery::Delivery,
    ) -> Result<(), IdbError> {
        let tx = self.tx(&[SESSION], IdbTransactionMode::Readwrite, backoff.is_some())?;
        let committed = done(&tx);
        let result = async {
            let store = Self::store(&tx, SESSION)?;
            let d = to_js(delivery)?;
            Reflect::set(&d, &"key".into(), &DELIVERY_KEY.into()).map_err(failed)?;
            let put = request(store.put(&d).map_err(failed)?);
            if let Some(b) = backoff {
                let v = to_js(b)?;
                Reflect::set(&v, &"key".into(), &BACKOFF_KEY.into()).map_err(failed)?;
                request(store.put(&v).map_err(failed)?).await?;
            }
            put.await
        }
        .await;
        finish(&tx, committed, result.map(TxEnd::Commit))
            .await
            .map(drop)
    }

    /// Whether `user` opted in to delivery notifications on this device. Read from the
    /// database at every use, never cached.
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
        self.put_session_value(&v, false).await.map(drop)
    }

    /// Stores a raw value as it is, bypassing every check: for tests that need a
    /// corrupt record in the store (or one under a foreign key).
    #[doc(hidden)]
    pub async fn put_raw_for_tests(&self, value: &JsValue) -> Result<(), IdbError> {
        let tx = self.tx(&[MUTATIONS], IdbTransactionMode::Readwrite, false)?;
        let committed = done(&tx);
        let work = async {
            request(Self::store(&tx, MUTATIONS)?.put(value).map_err(failed)?).await?;
            Ok(TxEnd::Commit(()))
        }
        .await;
        finish(&tx, committed, work).await
    }

    /// Deletes every record, every body, the session, the backoff and the notification
    /// choices, in one transaction, and counts a clear. Returns the records deleted and
    /// the generation the clear applied to.
    pub async fn clear_device(&self) -> Result<(u64, Generation), IdbError> {
        let tx = self.tx(
            &[MUTATIONS, BODIES, SESSION],
            IdbTransactionMode::Readwrite,
            true,
        )?;
        let committed = done(&tx);
        let work = async {
            let mutations = Self::store(&tx, MUTATIONS)?;
            let session = Self::store(&tx, SESSION)?;
            let count = request(mutations.count().map_err(failed)?);
            let gen = request(session.get(&GENERATION_KEY.into()).map_err(failed)?);
            let claim = request(session.get(&SCOPE_KEY.into()).map_err(failed)?);
            let n = count.await?.as_f64().unwrap_or(0.0) as u64;
            let before = Generation::read(&gen.await?);
            let claim = claim.await?;
            mutations.clear().map_err(failed)?;
            Self::store(&tx, BODIES)?.clear().map_err(failed)?;
            session.clear().map_err(failed)?;
            // Which registration the database belongs to is no account's data: kept.
            if claim.is_object() {
                session.put(&claim).map_err(failed)?;
            }
            request(session.put(&before.next(true).to_js()?).map_err(failed)?).await?;
            Ok(TxEnd::Commit((n, before)))
        }
        .await;
        finish(&tx, committed, work).await
    }

    /// Runs `change` over every stored value in one readwrite transaction: it returns
    /// the fields to write over a record, `Delete`, or nothing. The read and the change
    /// are atomic: a concurrent flush sees all of it or none. `only` limits it to one
    /// record. When anything changed, the generation moves; returns the records changed
    /// and the generation the change applied to.
    pub async fn rewrite_where<F>(
        &self,
        only: Option<RecordId>,
        mut change: F,
    ) -> Result<(u64, Option<Generation>), IdbError>
    where
        F: FnMut(&QueueItem) -> Rewrite,
    {
        let tx = self.tx(
            &[MUTATIONS, BODIES, SESSION],
            IdbTransactionMode::Readwrite,
            true,
        )?;
        let committed = done(&tx);
        let work = self.rewrite_in(&tx, only, &mut change).await;
        finish(&tx, committed, work).await
    }

    /// The requests of [`Store::rewrite_where`], inside its transaction.
    async fn rewrite_in<F>(
        &self,
        tx: &IdbTransaction,
        only: Option<RecordId>,
        change: &mut F,
    ) -> Result<TxEnd<(u64, Option<Generation>)>, IdbError>
    where
        F: FnMut(&QueueItem) -> Rewrite,
    {
        let store = Self::store(tx, MUTATIONS)?;
        let bodies = Self::store(tx, BODIES)?;
        let req = match only {
            None => store.open_cursor(),
            Some(id) => web_sys::IdbKeyRange::only(&key_of(id))
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
                    Rewrite::Replace(fields, body) => {
                        let patch: Object = to_js(&fields)?.unchecked_into();
                        Object::assign(value.unchecked_ref(), &patch);
                        // A body that never moved out of the record goes now.
                        let _ = Reflect::delete_property(
                            value.unchecked_ref::<Object>(),
                            &"body".into(),
                        );
                        cursor.update(&value).map_err(failed)?;
                        match body {
                            Some(b) => bodies.put_with_key(&b, &key).map_err(failed)?,
                            None => bodies.delete(&key).map_err(failed)?,
                        };
                        affected += 1;
                    }
                    Rewrite::Delete => {
                        cursor.delete().map_err(failed)?;
                        bodies.delete(&key).map_err(failed)?;
                        affected += 1;
                    }
                }
            }
            cursor.continue_().map_err(failed)?;
        }
        if affected == 0 {
            return Ok(TxEnd::Abort((0, None)));
        }
        let before = bump(&Self::store(tx, SESSION)?, false).await?;
        Ok(TxEnd::Commit((affected, Some(before))))
    }

    /// Gives every value stored under a key that is not a record id (not written by
    /// the outbox) a fresh id, marked so that it reads as `corrupt-record`: kept,
    /// listed, reported and discardable like any corrupt record, instead of counted
    /// but invisible. The ids are chosen here, after the highest record id, or in a gap
    /// below it, never by the key generator: a foreign key at or past 2^53 exhausts the
    /// generator, and the value that did it must still be re-keyed (issue 27, 8).
    /// Returns how many were moved.
    pub async fn rekey_foreign(&self) -> Result<usize, IdbError> {
        let tx = self.tx(&[MUTATIONS, SESSION], IdbTransactionMode::Readwrite, true)?;
        let committed = done(&tx);
        let work = self.rekey_in(&tx).await;
        finish(&tx, committed, work).await
    }

    /// The requests of [`Store::rekey_foreign`], inside its transaction.
    async fn rekey_in(&self, tx: &IdbTransaction) -> Result<TxEnd<usize>, IdbError> {
        let store = Self::store(tx, MUTATIONS)?;
        let req = store.open_cursor().map_err(failed)?;
        let (mut steps, _handlers) = cursor_steps(&req);
        let mut moved = Vec::new();
        // Ascending: a cursor visits primary keys in order (`free_ids` relies on it).
        let mut used = Vec::new();
        while let Some(step) = next(&mut steps).await {
            let Some(cursor) = step? else { break };
            let key = cursor.primary_key().map_err(failed)?;
            match record_id(&key) {
                Some(id) => {
                    used.push(id.0);
                }
                None => {
                    let value = cursor.value().map_err(failed)?;
                    cursor.delete().map_err(failed)?;
                    moved.push((key, value));
                }
            }
            cursor.continue_().map_err(failed)?;
        }
        if moved.is_empty() {
            return Ok(TxEnd::Abort(0));
        }
        let mut free = free_ids(&used);
        for (key, value) in &moved {
            let id = free
                .next()
                .ok_or_else(|| IdbError::Failed("no record id is free".into()))?;
            upgrade::mark_foreign(value, key)?;
            Reflect::set(value, &"id".into(), &key_of(RecordId(id))).map_err(failed)?;
            request(store.add(value).map_err(failed)?).await?;
        }
        bump(&Self::store(tx, SESSION)?, false).await?;
        Ok(TxEnd::Commit(moved.len()))
    }
}

/// Record ids not in `used`: after the highest one first (the re-keyed values come after
/// every record), then the gaps from 1 up, never past 2^53 - 1.
/// `used` is in ascending order (a sorted `Vec`: a B-tree set cost the module its code).
fn free_ids(used: &[u64]) -> impl Iterator<Item = u64> + '_ {
    let top = used.last().copied().unwrap_or(0);
    (top.saturating_add(1)..=MAX_SAFE_INTEGER)
        .chain((1..top).filter(move |i| used.binary_search(i).is_err()))
}

/// The persisted account, re-validated as it is read: a session stored before account
/// ids were checked (r2) that cannot be sent as a header value is no session (issue 27,
/// 9): header-less writes are then unknown-owner instead of failing on the header.
fn session_user_of(v: &JsValue) -> Option<String> {
    Reflect::get(v, &"userId".into())
        .ok()
        .and_then(|u| u.as_string())
        .filter(|u| crate::core::identity::is_account_id(u))
}

/// The credential part of the stored session (r3); a value that cannot be a header is
/// none (the page is asked for a new one).
fn session_auth_of(v: &JsValue) -> SessionAuth {
    if session_user_of(v).is_none() {
        return SessionAuth::default();
    }
    let bearer = Reflect::get(v, &"bearer".into())
        .ok()
        .and_then(|b| b.as_bool())
        .unwrap_or(false);
    let authorization = Reflect::get(v, &"authorization".into())
        .ok()
        .and_then(|a| a.as_string())
        .and_then(|a| Authorization::parse(&a).ok());
    SessionAuth {
        bearer,
        authorization: authorization.filter(|_| bearer),
    }
}

/// What [`Store::rewrite_where`] does with one stored value.
pub enum Rewrite {
    Keep,
    Fields(MutableFields),
    /// New fields and a new body (an edit), in the same transaction.
    Replace(MutableFields, Option<Uint8Array>),
    Delete,
}
