//! The browser shell: the service worker's events handed to the core.
//!
//! `www/sw.js` adds every listener during its first evaluation and calls into the
//! [`Outbox`] exported here once the module is ready; this module holds no policy of
//! its own: each decision is a call into `core`.

mod attempts;
mod barrier;
mod batcher;
mod chain;
mod clients;
mod commands;
#[doc(hidden)] // public for its service-worker tests only
pub mod config_reader;
mod early;
mod fetch;
mod flush;
mod http;
mod lanes;
mod locks;
mod message;
mod notify;
mod offline;
mod patterns;
mod retry;
mod shell;
mod steps;
mod view;

use crate::core::config::Config;
use crate::core::route::{owner, Owner};
use crate::core::shell::ShellRequest;
use crate::store::Store;
use chain::FifoLock;
use std::cell::RefCell;
use std::rc::Rc;
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use wasm_bindgen_futures::future_to_promise;
use web_sys::{ExtendableMessageEvent, Request, ServiceWorkerGlobalScope};

pub use crate::core::backoff::Trigger;
pub use flush::FlushOutcome;

pub(crate) fn scope() -> ServiceWorkerGlobalScope {
    js_sys::global().unchecked_into()
}

pub(crate) use crate::store::idb::describe;

/// A same-origin path as an absolute URL of this worker's origin.
pub(crate) fn absolute(path: &str) -> String {
    format!("{}{}", scope().location().origin(), path)
}

/// This worker's `ServiceWorker.state`, where the engine gives a worker its own
/// `self.serviceWorker` (Chromium; not Firefox).
fn own_state() -> Option<String> {
    let me = js_sys::Reflect::get(&js_sys::global(), &"serviceWorker".into())
        .ok()
        .filter(|w| w.is_object())?;
    js_sys::Reflect::get(&me, &"state".into())
        .ok()
        .and_then(|s| s.as_string())
}

/// Milliseconds since the epoch, from the worker's clock.
pub(crate) fn now_ms() -> u64 {
    js_sys::Date::now() as u64
}

/// The state of a flush in progress and of one asked for meanwhile (coalesced).
#[derive(Default)]
struct FlushState {
    running: bool,
    /// Records the current run has replayed so far (0 from the moment the run is
    /// committed, see `flush::next_waiters`), so a caller who joins it midway is told
    /// only about those replayed after it asked.
    replayed_now: usize,
    /// Callers waiting for the one extra flush that runs after the current one.
    again: Option<Vec<flush::Waiter>>,
}

pub(crate) struct Inner {
    config: Config,
    /// The database's name as resolved at start (`open_database`).
    db_name: String,
    /// `dbName` was configured: other registrations may share the database, so the view
    /// is checked against it before every use (`view`).
    shared_db: bool,
    patterns: Rc<patterns::JsPatterns>,
    store: Rc<Store>,
    /// The session and the lanes as this worker knows them, never staler than the
    /// database when used (`view`).
    view: view::View,
    /// `AUTH_SESSION` writes, in arrival order; queue operations wait for them.
    session_writes: FifoLock,
    chain: FifoLock,
    batcher: batcher::Batcher,
    /// A flush's marks and settlements, group-committed (`steps`).
    steps: steps::Steps,
    flush: RefCell<FlushState>,
    /// First attempts in lane order (`lanes`).
    lanes: lanes::Lanes,
    /// First attempts a page may still abort (`attempts`).
    attempts: attempts::Attempts,
    /// The live worker's own retries where there is no Background Sync (`retry`).
    retry: retry::RetryTimer,
    /// The known-offline fast path (`offline`).
    offline: offline::Offline,
    /// The sign-in barrier (`barrier`): no replay while a session may be changing.
    barrier: barrier::Barrier,
    /// Sync events being handled now: a sync is never registered while one fires (it
    /// would fire again as soon as that one ends).
    syncs_firing: std::cell::Cell<u32>,
    /// A write was queued while a sync event was being handled: its registration waits
    /// for the event's end (`sync_for_queued`, `handle_sync`).
    sync_owed: std::cell::Cell<bool>,
    /// Writes queued while this worker's registration of the sync is on its way to the
    /// browser: they share its outcome (`sync_for_queued`), one registration for them all.
    sync_joining: RefCell<Option<Vec<crate::channel::oneshot::Sender<bool>>>>,
    background_sync: bool,
    /// A newer version of the registration activated (`watch_successor`).
    replaced: std::cell::Cell<bool>,
}

/// The outbox running in this worker.
#[wasm_bindgen]
pub struct Outbox {
    inner: Rc<Inner>,
}

/// The database of this registration, and its name: the configured `dbName`, or the
/// default one unless another scope of the origin claimed it first, in which case one
/// named after this registration's scope (contract 3, r3).
async fn open_database(
    config: &Config,
    patterns: Rc<patterns::JsPatterns>,
    early: Option<early::Early>,
) -> Result<(Store, String, Option<crate::store::Snapshot>), crate::store::idb::IdbError> {
    use crate::core::config::{owns_default_db, scoped_db_name, DEFAULT_DB_NAME};
    // sw.js's connection, when it opened the database this start opens first.
    let (adopted, rows) = match early {
        Some(e) => (Some(Store::adopt(e.db, patterns.clone())), e.rows),
        None => (None, None),
    };
    if let Some(name) = &config.db_name {
        let store = match adopted {
            Some(store) => store,
            None => Store::open(name, patterns).await?,
        };
        let snap = rows.map(|r| store.snapshot_of(&r.generation, &r.session, &r.all));
        return Ok((store, name.clone(), snap));
    }
    let me = scope().registration().scope();
    let store = match adopted {
        Some(store) => store,
        None => match Store::open_claiming(DEFAULT_DB_NAME, patterns.clone(), Some(&me)).await? {
            // Created by this start, and claimed in the same transaction.
            (store, true) => return Ok((store, DEFAULT_DB_NAME.to_owned(), None)),
            (store, false) => store,
        },
    };
    // Claimed by this scope already (every start but the first): the rows sw.js read
    // are this database's, and nothing is left to read or write before the first event.
    if let Some(r) = rows {
        let owner = Store::claimed_scope(&r.scope);
        if owner.is_some() && owns_default_db(owner.as_deref(), &me) {
            let snap = store.snapshot_of(&r.generation, &r.session, &r.all);
            return Ok((store, DEFAULT_DB_NAME.to_owned(), Some(snap)));
        }
    }
    if store.claim(&me).await? {
        return Ok((store, DEFAULT_DB_NAME.to_owned(), None));
    }
    store.close();
    let path = web_sys::Url::new(&me)
        .map(|u| u.pathname())
        .unwrap_or(me.clone());
    let name = scoped_db_name(&path);
    // Its own scope's name: claimed for the record, whoever else might use it.
    let (store, claimed) = Store::open_claiming(&name, patterns, Some(&me)).await?;
    if !claimed {
        let _ = store.claim(&me).await;
    }
    Ok((store, name, None))
}

/// Starts the outbox: validates the configuration, compiles its patterns, opens (and
/// upgrades) the database and reads the persisted session and the queue's lanes.
/// `early` is what sw.js opened and read before the module was instantiated
/// (`worker::early`; `undefined`: nothing, the start opens and reads itself).
#[wasm_bindgen]
pub async fn start(config: JsValue, early: JsValue) -> Result<Outbox, JsValue> {
    let config: Config = if config.is_undefined() || config.is_null() {
        Config::default()
    } else {
        config_reader::read(&config)
            .map_err(|e| JsValue::from_str(&format!("sw-outbox: invalid configuration: {e}")))?
    };
    let config = config
        .validate()
        .map_err(|e| JsValue::from_str(&format!("sw-outbox: {e}")))?;
    let patterns = Rc::new(patterns::JsPatterns::new(&config));
    // The database's open request goes out first (the first poll issues it); the
    // patterns are compiled while the browser opens it, only to refuse a bad one here.
    let opened = {
        let first_name = config
            .db_name
            .as_deref()
            .unwrap_or(crate::core::config::DEFAULT_DB_NAME);
        let early = early::Early::read(&early, first_name);
        let mut opening = std::pin::pin!(open_database(&config, patterns.clone(), early));
        // Polled again below with the real waker, which every future on this path keeps
        // from its latest poll.
        let first = std::future::Future::poll(
            opening.as_mut(),
            &mut std::task::Context::from_waker(std::task::Waker::noop()),
        );
        patterns.check().map_err(|e| JsValue::from_str(&e))?;
        match first {
            std::task::Poll::Ready(opened) => opened,
            std::task::Poll::Pending => opening.await,
        }
    };
    let (store, db_name, snapshot) =
        opened.map_err(|e| JsValue::from_str(&format!("sw-outbox: cannot open IndexedDB: {e}")))?;
    let inner = Rc::new(Inner {
        shared_db: config.db_name.is_some(),
        db_name,
        config,
        patterns,
        store: Rc::new(store),
        view: view::View::default(),
        session_writes: FifoLock::default(),
        chain: FifoLock::default(),
        batcher: batcher::Batcher::default(),
        steps: steps::Steps::default(),
        flush: RefCell::new(FlushState::default()),
        lanes: lanes::Lanes::default(),
        attempts: attempts::Attempts::default(),
        retry: retry::RetryTimer::new(retry_flush),
        offline: offline::Offline::default(),
        barrier: barrier::Barrier::default(),
        syncs_firing: std::cell::Cell::new(0),
        sync_owed: std::cell::Cell::new(false),
        sync_joining: RefCell::new(None),
        background_sync: retry::has_background_sync(),
        replaced: std::cell::Cell::new(false),
    });
    match snapshot {
        Some(snap) => inner.load(snap),
        None => inner.reload().await,
    }
    barrier::listen(&inner);
    watch_updates(&inner);
    Ok(Outbox { inner })
}

/// What the retry timer runs (`worker::retry`): a flush.
fn retry_flush(inner: Rc<Inner>) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()>>> {
    Box::pin(async move {
        flush::request(&inner, Trigger::Retry).await;
    })
}

/// Lets go of the events kept open for retries when a new version of the worker appears
/// (`worker::retry`): they would hold its activation back. Once that version activates,
/// this one is replaced and flushes no more (4.5, r4), whatever its timers say — known
/// here where the engine does not give a worker its own state (Firefox).
fn watch_updates(inner: &Rc<Inner>) {
    let weak = Rc::downgrade(inner);
    let on_update = wasm_bindgen::closure::Closure::<dyn FnMut()>::new(move || {
        if let Some(inner) = weak.upgrade() {
            inner.release_kept_alive();
            if let Some(next) = scope().registration().installing() {
                watch_successor(&inner, next);
            }
        }
    });
    let _ = scope()
        .registration()
        .add_event_listener_with_callback("updatefound", on_update.as_ref().unchecked_ref());
    // Lives as long as the worker's global: one listener per start.
    on_update.forget();
}

/// Marks this worker replaced once `next` (a newer version) activates.
fn watch_successor(inner: &Rc<Inner>, next: web_sys::ServiceWorker) {
    let weak = Rc::downgrade(inner);
    let watched = next.clone();
    let on_state = wasm_bindgen::closure::Closure::<dyn FnMut()>::new(move || {
        let state = js_sys::Reflect::get(&watched, &"state".into())
            .ok()
            .and_then(|s| s.as_string());
        if let (Some(inner), Some(state)) = (weak.upgrade(), state) {
            if crate::core::barrier::flushes_in_state(Some(&state)) {
                inner.replaced.set(true);
            }
        }
    });
    next.set_onstatechange(Some(on_state.as_ref().unchecked_ref()));
    on_state.forget();
}

impl Inner {
    /// Whether this worker is its registration's active version (4.5, r4): its own
    /// `ServiceWorker.state` where the engine gives it (`activating`, `activated`), else
    /// not replaced by a newer version that activated. (An installing or waiting version
    /// in Firefox is kept from flushing by `sw.js`, which saw its `install` and no
    /// `activate`.)
    pub(crate) fn is_active_version(&self) -> bool {
        match own_state() {
            Some(state) => crate::core::barrier::flushes_in_state(Some(&state)),
            None => !self.replaced.get(),
        }
    }
}

#[wasm_bindgen]
impl Outbox {
    /// Answers a request under `apiPrefix` (contract sections 1 and 2): `sw.js` hands
    /// over only those (the app shell's requests it answers itself, needing no module).
    /// With the event, work that the answer does not need (the `MUTATION_QUEUED` report,
    /// the sync registration) runs after it, kept alive by `event.waitUntil`.
    pub fn handle_fetch(
        &self,
        request: Request,
        event: Option<web_sys::ExtendableEvent>,
    ) -> js_sys::Promise {
        let inner = self.inner.clone();
        // An auth-route request (a sign-in, a sign-out, a token refresh; any method or
        // mode) stops replays from this moment, synchronously, before anything awaits,
        // until it is answered and the account is named again (r3, 4.5 end) — in every
        // outbox worker of the origin (r4): it is sent once they let go of their replays.
        let changing = fetch::is_auth_route(&inner, &request).then(|| {
            let hold = inner.config.attempt_timeout_ms + crate::core::barrier::FENCE_WAIT_MS;
            inner.session_changing(hold)
        });
        future_to_promise(async move {
            if let Some(c) = &changing {
                c.fenced().await;
            }
            let answer = fetch::handle(&inner, request, event.as_ref()).await;
            drop(changing);
            answer.map(Into::into)
        })
    }

    /// An auth route outside `apiPrefix` (r4: a `/login` form post, an OAuth callback),
    /// which the outbox only observes: `sw.js` gives it no `respondWith`. It raises the
    /// sign-in barrier here and in every outbox worker of the origin; it settles once the
    /// page it navigates to exists (its answer, and any cookie with it, has arrived), or
    /// after `attemptTimeoutMs` when that cannot be known (not a navigation, or an engine
    /// whose `clients.get` does not wait for the page). The promise is for `waitUntil`.
    pub fn observe_sign_in(&self, event: web_sys::FetchEvent) -> js_sys::Promise {
        let inner = self.inner.clone();
        let hold = inner.config.attempt_timeout_ms;
        let changing = inner.session_changing(hold);
        let resulting = js_sys::Reflect::get(&event, &"resultingClientId".into())
            .ok()
            .and_then(|v| v.as_string())
            .filter(|id| !id.is_empty());
        future_to_promise(async move {
            clients::page_arrived_within(resulting.as_deref(), hold).await;
            drop(changing);
            Ok(JsValue::UNDEFINED)
        })
    }

    /// Handles a page's command; the promise settles when it was answered.
    pub fn handle_message(&self, event: ExtendableMessageEvent) -> js_sys::Promise {
        let inner = self.inner.clone();
        future_to_promise(async move {
            commands::handle(&inner, &event).await;
            Ok(JsValue::UNDEFINED)
        })
    }

    /// A Background Sync event; other tags are not the outbox's. The promise settles
    /// after a retry the flush scheduled when that is near (the sync event keeps the
    /// worker alive for it), and rejects when work is left, so the browser retries the
    /// sync later too.
    /// `last_chance`: the event's own (the browser gives the sync up if this one fails).
    pub fn handle_sync(&self, tag: String, last_chance: bool) -> js_sys::Promise {
        let inner = self.inner.clone();
        future_to_promise(async move {
            if tag == inner.config.sync_tag {
                inner.syncs_firing.set(inner.syncs_firing.get() + 1);
                let outcome = flush::request(&inner, Trigger::Sync).await;
                kept_alive(&outcome).await;
                inner
                    .syncs_firing
                    .set(inner.syncs_firing.get().saturating_sub(1));
                // Its flush stopped, but the worker's own retry it waited for may have
                // delivered the rest since: a rejection would have the browser fire it
                // again minutes later (waking the worker) for an empty queue.
                let retry_later = outcome.retry_later && inner.store.count().await.unwrap_or(1) > 0;
                let retried = retry_later && !last_chance;
                let owed = inner.syncs_firing.get() == 0 && inner.sync_owed.take() && !retried;
                // Registered again before the event ends (it fires again once this one
                // ends; its flush waits for the backoff like any): writes were queued
                // while it fired, which the browser will not fire it for by itself; or
                // its last chance failed with work left, and the browser gives it up —
                // delivery must not wait for the app to be opened when the worker's own
                // timer dies with the worker (r4, 4.8).
                let given_up = retry_later && last_chance && inner.background_sync;
                if given_up || (owed && inner.store.count().await.unwrap_or(1) > 0) {
                    retry::register_sync(&inner.config.sync_tag).await;
                }
                if retry_later {
                    // A rejected sync promise makes the browser retry the sync later.
                    return Err(JsValue::from_str("sw-outbox: flush incomplete"));
                }
            }
            Ok(JsValue::UNDEFINED)
        })
    }

    /// The worker's `online` event, where a browser fires one.
    pub fn handle_online(&self) -> js_sys::Promise {
        let inner = self.inner.clone();
        future_to_promise(async move {
            inner.network_answered();
            let outcome = flush::request(&inner, Trigger::Online).await;
            kept_alive(&outcome).await;
            Ok(JsValue::UNDEFINED)
        })
    }

    /// Once per worker start: flush when the queue is not empty. The promise (which
    /// `sw.js` keeps the first event after a start waiting for) settles after a retry the
    /// flush scheduled when that is near.
    pub fn handle_start(&self) -> js_sys::Promise {
        let inner = self.inner.clone();
        future_to_promise(async move {
            if inner.store.count().await.unwrap_or(0) > 0 {
                let outcome = flush::request(&inner, Trigger::Start).await;
                kept_alive(&outcome).await;
            }
            Ok(JsValue::UNDEFINED)
        })
    }

    /// The worker became the active one (`activate`): another version may have changed
    /// the session or the queue while this one waited, so its view is checked now. (Not
    /// through `fresh`, which trusts the view of a worker alone in its registration: a
    /// version activating is alone already, and nothing else would check it again.)
    pub fn handle_activate(&self) -> js_sys::Promise {
        let inner = self.inner.clone();
        future_to_promise(async move {
            inner.check_generation().await;
            Ok(JsValue::UNDEFINED)
        })
    }

    /// A click on a delivery notification (`data`: the notification's data): focus the
    /// app at the record, or open it there.
    pub fn handle_notification_click(&self, data: JsValue) -> js_sys::Promise {
        let inner = self.inner.clone();
        future_to_promise(async move {
            notify::on_click(&inner, &data).await?;
            Ok(JsValue::UNDEFINED)
        })
    }

    /// The configuration in force, for `sw.js` (precache list, build) and for tests.
    pub fn config(&self) -> JsValue {
        crate::js::to_value(&ConfigView::of(&self.inner.config, &self.inner.db_name))
            .unwrap_or(JsValue::NULL)
    }
}

/// Hooks for the service-worker tests (tests/*.rs call them as Rust methods): kept out
/// of the `#[wasm_bindgen]` block, so the module the site ships exports neither (nor
/// carries their glue).
impl Outbox {
    /// How `core::route::owner` decides a request given as plain values: the Rust side
    /// of the route rule that `www/sw.js` mirrors (`swOutboxRoute`) to decide before the
    /// module has loaded; tests/service_worker_route.rs runs the two side by side (a
    /// navigation `Request` cannot be constructed in a worker, hence plain values).
    /// `not-ours`, `write`, `read`, `auth`, `observe`, or `shell <cached URL>`.
    #[doc(hidden)]
    pub fn route_for_tests(&self, method: &str, url: &str, navigate: bool) -> String {
        let Some((same_origin, path)) = fetch::locate_url(url) else {
            return "not-ours".into();
        };
        let request = ShellRequest {
            navigate,
            same_origin,
            method,
            path: &path,
            url,
        };
        match owner(&request, &self.inner.config, &*self.inner.patterns) {
            Owner::NotOurs => "not-ours".into(),
            Owner::Write => "write".into(),
            Owner::Read => "read".into(),
            Owner::AuthRoute => "auth".into(),
            Owner::ObservedAuth => "observe".into(),
            Owner::Shell(cached) => format!("shell {cached}"),
        }
    }

    /// For the service-worker tests, whose server always answers: behave as after a
    /// network failure (the known-offline fast path), so a write is queued without an
    /// attempt, whatever the machine's timing.
    #[doc(hidden)]
    pub fn assume_network_failed_for_tests(&self) {
        self.inner.network_failed();
    }
}

/// For the service-worker tests: reads an identity answer (one made up in the test) as
/// a flush reads `GET authMePath`'s, with `csrf_header` as the configured `csrfHeader`,
/// and describes what it found (`Debug` of `worker::http::IdentityAnswer`).
#[doc(hidden)]
pub async fn identity_answer_for_tests(response: &web_sys::Response, csrf_header: &str) -> String {
    let Ok(deadline) = http::Deadline::after(15_000) else {
        return "no deadline".into();
    };
    format!(
        "{:?}",
        http::identity_of(response, &deadline, csrf_header).await
    )
}

/// Waits for the retry a flush scheduled, when it is near enough to keep an event open
/// for (`worker::retry`).
async fn kept_alive(outcome: &FlushOutcome) {
    if let Some(p) = &outcome.keep_alive {
        let _ = wasm_bindgen_futures::JsFuture::from(p.clone()).await;
    }
}

/// What `sw.js` needs to know of the configuration.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct ConfigView<'a> {
    db_name: &'a str,
    sync_tag: &'a str,
    precache: &'a [String],
    build: &'a str,
    /// The time limit of `restoreShell`'s fetches.
    attempt_timeout_ms: u32,
}

impl<'a> ConfigView<'a> {
    fn of(c: &'a Config, db_name: &'a str) -> Self {
        ConfigView {
            db_name,
            sync_tag: &c.sync_tag,
            precache: &c.precache,
            build: &c.build,
            attempt_timeout_ms: c.attempt_timeout_ms,
        }
    }
}

impl Inner {
    /// Waits until every session write that arrived before now is persisted.
    pub(crate) async fn session_settled(&self) {
        drop(self.session_writes.acquire().await);
    }

    /// Runs a queue operation in this worker's chain, after pending session writes,
    /// under the cross-worker Web Lock, on a view as fresh as the database.
    pub(crate) async fn in_chain<T: 'static>(
        self: &Rc<Self>,
        op: std::pin::Pin<Box<dyn std::future::Future<Output = T>>>,
    ) -> T {
        let _turn = self.chain.acquire().await;
        self.session_settled().await;
        let lock_name = format!("sw-outbox:{}", self.db_name);
        let me = self.clone();
        chain::under_web_lock(
            &lock_name,
            Box::pin(async move {
                me.fresh().await;
                op.await
            }),
        )
        .await
    }
}
