//! The worker's in-memory copies of IndexedDB state, and the rule that keeps them from
//! being staler than the database when they are used (contract 8, r2).
//!
//! A worker caches two things: the session (the account of the last `AUTH_SESSION`,
//! which header-less writes are bound to) and the lanes of the unresolved records (which
//! decide whether a first attempt is made or the write is queued behind). Backoff and
//! notification choices are read from the database at every use, so they are never
//! stale.
//!
//! The database holds a generation ([`Generation`]) that every transaction changing
//! either cached thing moves by one, in that same transaction. The view remembers the
//! generation it reflects:
//! - before a write is decided, and when the queue's lock is taken, the generation is
//!   read (one small read) and the view reloaded when it differs;
//! - this worker's own changes come back with the generation they applied to: when it
//!   is the view's, the change is applied to the view too (it is then as fresh as the
//!   database); when it is not, another worker changed the database in between, and the
//!   view is marked stale, to be reloaded at its next use;
//! - a batch of writes is stored only when the database's generation is still the
//!   view's when its transaction runs (`Store::enqueue`), so no record is stored with an
//!   owner taken from a stale session.

use super::chain::FifoLock;
use super::Inner;
use crate::core::credential::{bearer, Authorization, Bearer, Credential};
use crate::core::lanes::{Lane, StoredLanes};
use crate::core::record::RecordMeta;
use crate::core::route::record_is_auth_route;
use crate::store::{Generation, QueueItem, SessionAuth};
use std::cell::{Cell, RefCell};

#[derive(Default)]
pub struct View {
    /// The generation the copies below reflect; `None`: unknown (stale, or never read).
    generation: Cell<Option<u64>>,
    /// Clears counted by the database as of `generation`.
    clears: Cell<u64>,
    /// The persisted session as of `generation`.
    session: RefCell<Option<String>>,
    /// What that session's `AUTH_SESSION` persisted of a credential (r3).
    session_auth: RefCell<SessionAuth>,
    /// The credential this worker holds for the session: given by an `AUTH_SESSION` it
    /// handled, or read back where `persistAuthorization` keeps it. Never in a record.
    credential: RefCell<Option<Credential>>,
    /// The credential a server answered 401 to (`core::credential::sign_in_flushes`).
    refused: RefCell<Option<Authorization>>,
    /// An `AUTH_SESSION` not yet committed: binds writes at once (its number, its user).
    pending_session: RefCell<Option<(u64, Option<String>)>>,
    session_seq: Cell<u64>,
    /// The lanes of the unresolved records as of `generation` (`None`: unreadable).
    stored: RefCell<Option<StoredLanes>>,
    /// Records of this worker handed to the store and not yet committed.
    pending: RefCell<StoredLanes>,
    /// One reload at a time.
    reloading: FifoLock,
}

impl Inner {
    /// Makes the view as fresh as the database: reads the generation and reloads when
    /// it moved (or the view is stale). A database that cannot be read leaves the view
    /// as it was.
    pub(crate) async fn fresh(&self) {
        if !self.shared_db && alone() && self.view.generation.get().is_some() {
            // No other worker of this registration exists to change the database, and no
            // other registration uses it (its name is this registration's own): the view
            // is as this worker left it (it was checked at start and activation).
            return;
        }
        self.check_generation().await;
    }

    /// Reads the database's generation and reloads the view when it moved (or the view
    /// is stale), whether or not this worker is alone: at activation a new version is
    /// its registration's only worker already, but the version it replaces may have
    /// written since this one loaded its view while installing.
    pub(crate) async fn check_generation(&self) {
        let known = self.view.generation.get();
        match self.store.generation().await {
            Ok(g) if Some(g.n) == known => {}
            Ok(_) => self.reload().await,
            Err(_) if known.is_none() => self.reload().await,
            Err(_) => {}
        }
    }

    /// Reads the session and the lanes again, in one transaction.
    pub(crate) async fn reload(&self) {
        let _one = self.view.reloading.acquire().await;
        let Ok(snap) = self.store.snapshot().await else {
            return;
        };
        self.load(snap);
    }

    /// Takes a snapshot's session and lanes as the view (a reload's, or the one `sw.js`
    /// read at its first evaluation for the start, issue 36).
    pub(crate) fn load(&self, snap: crate::store::Snapshot) {
        if self.view.generation.get() == Some(snap.generation.n) {
            return; // another reload got there first
        }
        let lanes = StoredLanes::from_lanes(snap.items.iter().map(|i| match i {
            QueueItem::Record(m) => self.record_lane(m),
            QueueItem::Corrupt(..) => None,
        }));
        // A credential read back (persistAuthorization) replaces the one in memory; without
        // one, the memory's stays only while the session is still a bearer one (another
        // worker's sign-out, or a cookie sign-in, drops it): `bearer` matches its account.
        let mut auth = snap.auth;
        if !self.config.persist_authorization {
            // Stored by a version configured to keep it: this one does not use it.
            auth.authorization = None;
        }
        let credential = match (&snap.session, &auth) {
            (
                Some(user),
                SessionAuth {
                    bearer: true,
                    authorization: Some(a),
                },
            ) => Some(Credential {
                user: user.clone(),
                authorization: a.clone(),
            }),
            (
                Some(_),
                SessionAuth {
                    bearer: true,
                    authorization: None,
                },
            ) => self.view.credential.borrow().clone(),
            _ => None,
        };
        *self.view.credential.borrow_mut() = credential;
        *self.view.session.borrow_mut() = snap.session;
        *self.view.session_auth.borrow_mut() = auth;
        *self.view.stored.borrow_mut() = Some(lanes);
        self.view.clears.set(snap.generation.clears);
        self.view.generation.set(Some(snap.generation.n));
    }

    /// This worker's change committed, having applied to generation `before`. When that
    /// was the view's, `apply` brings the view along; otherwise the view is stale.
    pub(crate) fn committed(&self, before: Generation, clear: bool, apply: impl FnOnce(&View)) {
        let after = before.next(clear);
        if self.view.generation.get() == Some(before.n) {
            apply(&self.view);
            self.view.generation.set(Some(after.n));
            self.view.clears.set(after.clears);
        } else {
            self.view.generation.set(None);
        }
    }

    /// The generation the view reflects (for `Store::enqueue`'s check).
    pub(crate) fn view_generation(&self) -> Option<u64> {
        self.view.generation.get()
    }

    /// The clears the view has seen: a write decided now is fenced by a later clear.
    pub(crate) fn view_clears(&self) -> u64 {
        self.view.clears.get()
    }

    /// The account header-less writes are bound to now.
    pub(crate) fn session_user(&self) -> Option<String> {
        match &*self.view.pending_session.borrow() {
            Some((_, user)) => user.clone(),
            None => self.view.session.borrow().clone(),
        }
    }

    /// An `AUTH_SESSION` arrived: it binds writes at once, before it is persisted.
    pub(crate) fn session_arrived(&self, user: Option<String>) -> u64 {
        let seq = self.view.session_seq.get() + 1;
        self.view.session_seq.set(seq);
        *self.view.pending_session.borrow_mut() = Some((seq, user));
        seq
    }

    /// That `AUTH_SESSION` was persisted (`Some(before)`) or failed (`None`), with the
    /// credential it carried (`given`) and what of it was persisted (`auth`).
    pub(crate) fn session_settled_as(
        &self,
        seq: u64,
        user: Option<String>,
        given: Option<Authorization>,
        auth: SessionAuth,
        before: Option<Generation>,
    ) {
        if let Some(before) = before {
            // Held for this session whatever the view's generation: it is this worker's
            // to keep (in memory), and `bearer` only uses it for its own account.
            *self.view.credential.borrow_mut() = match (&user, given) {
                (Some(u), Some(a)) => Some(Credential {
                    user: u.clone(),
                    authorization: a,
                }),
                _ => None,
            };
            self.committed(before, false, |v| {
                *v.session.borrow_mut() = user;
                *v.session_auth.borrow_mut() = auth;
            });
        }
        let mut pending = self.view.pending_session.borrow_mut();
        if pending.as_ref().is_some_and(|(s, _)| *s == seq) {
            *pending = None;
        }
    }

    /// What the identity check of a flush (or a command) carries, or why it cannot be
    /// made: the credential of a bearer session, or that it is missing (r3).
    /// Whether the last `AUTH_SESSION` carried a credential (a bearer session: each
    /// window may be on an account of its own, contract 5).
    pub(crate) fn bearer_session(&self) -> bool {
        self.view.session_auth.borrow().bearer
    }

    pub(crate) fn bearer(&self) -> Bearer {
        let session = self.view.session.borrow();
        bearer(
            session.as_deref(),
            self.view.session_auth.borrow().bearer,
            self.view.credential.borrow().as_ref(),
        )
    }

    /// The server answered 401 to this credential: the next `AUTH_SESSION` that gives it
    /// again is not a reason to flush (`core::credential::sign_in_flushes`).
    pub(crate) fn credential_refused(&self, refused: Option<&Authorization>) {
        if let Some(a) = refused {
            *self.view.refused.borrow_mut() = Some(a.clone());
        }
    }

    /// The credential the server refused last, if any.
    pub(crate) fn refused_credential(&self) -> Option<Authorization> {
        self.view.refused.borrow().clone()
    }

    /// Whether an unresolved record (stored, or handed to the store) is ahead of a new
    /// write of `lane`. When the queue cannot be read, nothing is assumed ahead (the
    /// write is attempted, as the contract's first attempt is).
    pub(crate) fn held_back(&self, lane: &Lane) -> bool {
        self.view.pending.borrow().holds_back(lane)
            || self
                .view
                .stored
                .borrow()
                .as_ref()
                .is_some_and(|s| s.holds_back(lane))
    }

    /// A record of `lane` was handed to the store (it holds back the writes behind it
    /// before its commit).
    pub(crate) fn lane_pending(&self, lane: &Lane) {
        self.view.pending.borrow_mut().add(lane);
    }

    /// That record's commit ended, stored or not (a stored one is in the view through
    /// [`Inner::committed`]).
    pub(crate) fn lane_unpending(&self, lane: &Lane) {
        self.view.pending.borrow_mut().remove(lane);
    }

    /// The lane a stored record holds back: none for auth routes (never sent) and
    /// unknown owners.
    pub(crate) fn record_lane(&self, m: &RecordMeta) -> Option<Lane> {
        if record_is_auth_route(&m.path, &self.config, &*self.patterns) {
            return None;
        }
        Lane::of(m.owner.as_deref(), m.workspace.as_deref())
    }
}

/// Whether this worker is its registration's only one: active and activated, with no
/// version installing or waiting. Only then can no other worker instance write the
/// database (a replaced one has no events left: activation waits for that), and has
/// this one's view been checked since the version it replaced last wrote (at
/// activation). While it is still `activating` it is not: Chromium hands it the pages'
/// fetches before its `activate` handler has run, and a write decided then on the view
/// read at install was attempted ahead of a write of its lane the replaced version had
/// queued (issue 27; `tests/e2e-engines/update-view.test.mjs`). Unknown (a browser
/// without `self.serviceWorker`) counts as not alone.
fn alone() -> bool {
    let scope = super::scope();
    let registration = scope.registration();
    let me = js_sys::Reflect::get(&scope, &"serviceWorker".into())
        .unwrap_or(wasm_bindgen::JsValue::UNDEFINED);
    if me.is_undefined() || me.is_null() {
        return false;
    }
    let activated = js_sys::Reflect::get(&me, &"state".into())
        .ok()
        .and_then(|s| s.as_string())
        .is_some_and(|s| s == "activated");
    activated
        && registration.installing().is_none()
        && registration.waiting().is_none()
        && registration
            .active()
            .is_some_and(|a| wasm_bindgen::JsValue::from(a) == me)
}

impl View {
    pub(crate) fn add_lane(&self, lane: &Lane) {
        if let Some(s) = self.stored.borrow_mut().as_mut() {
            s.add(lane);
        }
    }

    pub(crate) fn remove_lane(&self, lane: &Lane) {
        if let Some(s) = self.stored.borrow_mut().as_mut() {
            s.remove(lane);
        }
    }

    /// `CLEAR_DEVICE` committed: no records, no session, no credential.
    pub(crate) fn cleared(&self) {
        *self.stored.borrow_mut() = Some(StoredLanes::default());
        *self.session.borrow_mut() = None;
        *self.session_auth.borrow_mut() = SessionAuth::default();
        *self.credential.borrow_mut() = None;
        *self.refused.borrow_mut() = None;
    }
}
