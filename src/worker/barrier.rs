//! The sign-in barrier in the worker (`core::barrier`, contract 4.5 end): raised by an
//! auth-route request the moment the fetch handler gets it and by an `AUTH_SESSION`
//! when it arrives, lowered when that request is answered (the session persisted). A
//! flush checks it right before each replay's `fetch()`, with no `await` in between, so a
//! record handed to its lane before a sign-in is never sent after it.
//!
//! (r4) It belongs to the origin: every outbox worker of the origin (another
//! registration's scope, an old or a new version) is told of a change this one sees, on
//! the `BroadcastChannel` [`ORIGIN_CHANNEL`], and the Web Lock [`ORIGIN_LOCK`] fences it:
//! a flush replays only while its worker holds that lock shared (taken before its
//! identity check, let go of at its end or the moment a change is raised), and a sign-in
//! this worker sends leaves only once it holds the lock exclusively — that is, once every
//! other worker has read the raise and let go (or after [`FENCE_WAIT_MS`]). The message
//! alone could arrive after the sign-in's cookie; the lock cannot be granted before every
//! replay under the old identity has left.

use super::locks::{Hold, Mode};
use super::Inner;
use crate::channel::oneshot;
use crate::core::barrier::{
    Checked, SignInBarrier, Signal, FENCE_WAIT_MS, ORIGIN_CHANNEL, ORIGIN_LOCK,
};
use js_sys::{Object, Reflect};
use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use wasm_bindgen::prelude::*;
use wasm_bindgen::JsCast;
use web_sys::BroadcastChannel;

pub struct Barrier {
    state: RefCell<SignInBarrier>,
    /// Told when no session change is open any more.
    settled: RefCell<Vec<oneshot::Sender<()>>>,
    /// This worker's shared hold of the origin lock: replays go out only under it.
    shared: RefCell<Option<Hold>>,
    /// This worker's exclusive hold, while any of its own changes is open.
    exclusive: RefCell<Option<Hold>>,
    /// Sign-ins waiting for the exclusive hold (or for it to be given up).
    fenced: RefCell<Vec<oneshot::Sender<()>>>,
    /// Whether this worker has Web Locks at all (without them the message is the fence).
    locks: bool,
    channel: Option<BroadcastChannel>,
    /// This worker's name for its changes (`<random>:<n>`), unique across the origin.
    me: String,
    next: Cell<u64>,
}

impl Default for Barrier {
    fn default() -> Self {
        // Random, in base 36, written by the browser (no Rust number formatting).
        let me = js_sys::Number::from(js_sys::Math::random())
            .to_string_with_radix(36)
            .ok()
            .and_then(|s| s.as_string())
            .unwrap_or_default();
        Barrier {
            state: RefCell::default(),
            settled: RefCell::default(),
            shared: RefCell::default(),
            exclusive: RefCell::default(),
            fenced: RefCell::default(),
            locks: Hold::available(),
            channel: BroadcastChannel::new(ORIGIN_CHANNEL).ok(),
            me,
            next: Cell::new(0),
        }
    }
}

/// One open session change; dropping it settles it (answered, failed, or abandoned).
pub struct Opened {
    inner: Rc<Inner>,
    id: String,
}

impl Opened {
    /// Resolves once the other outbox workers of the origin let go of their replays (this
    /// worker holds the origin lock exclusively), or after [`FENCE_WAIT_MS`], or at once
    /// without Web Locks. A sign-in is sent after it.
    pub async fn fenced(&self) {
        let barrier = &self.inner.barrier;
        let held = barrier
            .exclusive
            .borrow()
            .as_ref()
            .is_none_or(Hold::is_granted);
        if held {
            return;
        }
        let (tx, rx) = oneshot::channel();
        barrier.fenced.borrow_mut().push(tx);
        let (fired, timer) = oneshot::channel::<()>();
        let _timeout = gloo_timers::callback::Timeout::new(FENCE_WAIT_MS, move || {
            let _ = fired.send(());
        });
        first_of(rx, timer).await;
    }
}

impl Drop for Opened {
    fn drop(&mut self) {
        let barrier = &self.inner.barrier;
        barrier.state.borrow_mut().settle();
        barrier.post(&self.id, None);
        if !barrier.state.borrow().is_open_here() {
            barrier.exclusive.borrow_mut().take();
            barrier.release_fenced();
        }
        barrier.notify_if_settled();
    }
}

impl Barrier {
    /// Tells the other workers of a change (`hold_ms`: `Some` for a raise).
    fn post(&self, id: &str, hold_ms: Option<u32>) {
        let Some(channel) = &self.channel else { return };
        let msg = Object::new();
        let kind = if hold_ms.is_some() { "raise" } else { "settle" };
        let _ = Reflect::set(&msg, &"t".into(), &kind.into());
        let _ = Reflect::set(&msg, &"id".into(), &id.into());
        if let Some(ms) = hold_ms {
            let _ = Reflect::set(&msg, &"ms".into(), &JsValue::from(ms));
        }
        let _ = channel.post_message(&msg);
    }

    fn notify_if_settled(&self) {
        if !self.state.borrow().is_open() {
            for tx in std::mem::take(&mut *self.settled.borrow_mut()) {
                let _ = tx.send(());
            }
        }
    }

    fn release_fenced(&self) {
        for tx in std::mem::take(&mut *self.fenced.borrow_mut()) {
            let _ = tx.send(());
        }
    }

    /// A change was raised here or elsewhere: this worker's replays stop, and its shared
    /// hold goes at once, so a sign-in anywhere in the origin can be fenced.
    fn let_go_of_replays(&self) {
        self.shared.borrow_mut().take();
    }
}

/// Resolves when either resolves.
async fn first_of<A, B>(a: A, b: B)
where
    A: std::future::Future,
    B: std::future::Future,
{
    let mut a = std::pin::pin!(a);
    let mut b = std::pin::pin!(b);
    std::future::poll_fn(|cx| {
        if a.as_mut().poll(cx).is_ready() || b.as_mut().poll(cx).is_ready() {
            return std::task::Poll::Ready(());
        }
        std::task::Poll::Pending
    })
    .await
}

/// Listens to the other workers of the origin. Called once, at start.
pub(crate) fn listen(inner: &Rc<Inner>) {
    let Some(channel) = &inner.barrier.channel else {
        return;
    };
    let weak: Weak<Inner> = Rc::downgrade(inner);
    let on_message =
        Closure::<dyn FnMut(web_sys::MessageEvent)>::new(move |event: web_sys::MessageEvent| {
            let Some(inner) = weak.upgrade() else { return };
            let data = event.data();
            let field = |name: &str| Reflect::get(&data, &name.into()).ok();
            let kind = field("t").and_then(|v| v.as_string());
            let id = field("id").and_then(|v| v.as_string());
            let ms = field("ms").and_then(|v| v.as_f64());
            match Signal::read(kind.as_deref(), id.as_deref(), ms) {
                Some(Signal::Raise { id, hold_ms }) => inner.remote_change(id, hold_ms),
                Some(Signal::Settle { id }) => inner.remote_settled(&id),
                None => {}
            }
        });
    channel.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    // Lives as long as the worker's global: one listener per start.
    on_message.forget();
}

/// How a flush's wait for its shared hold ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    /// Held (or no Web Locks): the identity may be checked.
    Yes,
    /// A change was raised meanwhile: wait for it to settle, then ask again.
    Raised,
    /// The deadline passed first.
    TimedOut,
}

impl Inner {
    /// A session may be changing from now on (synchronously: call it before anything
    /// is awaited). Replays stop, here and in every outbox worker of the origin, until
    /// the returned guard is dropped and an identity check made after that names the
    /// account again. `hold_ms`: how long the other workers take it to be open at most,
    /// should they never hear that it settled.
    pub(crate) fn session_changing(self: &Rc<Self>, hold_ms: u32) -> Opened {
        let barrier = &self.barrier;
        barrier.state.borrow_mut().raise();
        barrier.let_go_of_replays();
        let n = barrier.next.get() + 1;
        barrier.next.set(n);
        let id = format!("{}:{n}", barrier.me);
        if barrier.exclusive.borrow().is_none() {
            if let Some((hold, granted)) = Hold::request(ORIGIN_LOCK, Mode::Exclusive) {
                *barrier.exclusive.borrow_mut() = Some(hold);
                let weak = Rc::downgrade(self);
                wasm_bindgen_futures::spawn_local(async move {
                    let _ = granted.await;
                    if let Some(inner) = weak.upgrade() {
                        inner.barrier.release_fenced();
                    }
                });
            }
        }
        barrier.post(&id, Some(hold_ms));
        Opened {
            inner: self.clone(),
            id,
        }
    }

    /// Another worker of the origin saw a change: open here until it settles, or until
    /// `hold_ms` passed.
    fn remote_change(self: &Rc<Self>, id: String, hold_ms: u32) {
        let barrier = &self.barrier;
        barrier.state.borrow_mut().raise_remote(&id);
        barrier.let_go_of_replays();
        let weak = Rc::downgrade(self);
        gloo_timers::callback::Timeout::new(hold_ms, move || {
            if let Some(inner) = weak.upgrade() {
                inner.remote_settled(&id);
            }
        })
        .forget();
    }

    fn remote_settled(&self, id: &str) {
        if self.barrier.state.borrow_mut().settle_remote(id) {
            self.barrier.notify_if_settled();
        }
    }

    /// Takes this worker's shared hold of the origin lock for a flush's replays, waiting
    /// (until `deadline`, ms since the epoch) while another worker's sign-in holds it.
    pub(crate) async fn hold_for_replays(&self, deadline: u64) -> Held {
        let barrier = &self.barrier;
        if !barrier.locks {
            return Held::Yes;
        }
        if barrier
            .shared
            .borrow()
            .as_ref()
            .is_some_and(Hold::is_granted)
        {
            return Held::Yes;
        }
        let Some((hold, granted)) = Hold::request(ORIGIN_LOCK, Mode::Shared) else {
            return Held::Yes;
        };
        *barrier.shared.borrow_mut() = Some(hold);
        let left = deadline.saturating_sub(super::now_ms());
        let (fired, timer) = oneshot::channel::<()>();
        let _timeout =
            gloo_timers::callback::Timeout::new(left.min(i32::MAX as u64) as u32, move || {
                let _ = fired.send(());
            });
        let got = std::rc::Rc::new(Cell::new(None));
        let g = got.clone();
        first_of(
            async move {
                g.set(Some(granted.await.is_ok()));
            },
            timer,
        )
        .await;
        match got.get() {
            Some(true) => Held::Yes,
            Some(false) => Held::Raised,
            None => {
                barrier.shared.borrow_mut().take();
                Held::TimedOut
            }
        }
    }

    /// A flush is over: its shared hold goes (the next one checks the identity again).
    pub(crate) fn replays_done(&self) {
        self.barrier.shared.borrow_mut().take();
    }

    /// The token of an identity check about to be sent, or `None` while a session
    /// change is open.
    pub(crate) fn identity_check_begins(&self) -> Option<Checked> {
        self.barrier.state.borrow().check_begins()
    }

    /// Whether a replay may go out now under an identity checked as `checked`: no change
    /// seen since, here or elsewhere in the origin, and this worker still holds its
    /// shared part of the origin lock.
    pub(crate) fn replay_allowed(&self, checked: Checked) -> bool {
        let barrier = &self.barrier;
        let fenced = !barrier.locks
            || barrier
                .shared
                .borrow()
                .as_ref()
                .is_some_and(Hold::is_granted);
        fenced && barrier.state.borrow().allows(checked)
    }

    /// Whether a session change is open now.
    pub(crate) fn barrier_open(&self) -> bool {
        self.barrier.state.borrow().is_open()
    }

    /// Resolves once no session change is open (at once when none is).
    pub(crate) async fn session_changes_settled(&self) {
        if !self.barrier.state.borrow().is_open() {
            return;
        }
        let (tx, rx) = oneshot::channel();
        self.barrier.settled.borrow_mut().push(tx);
        let _ = rx.await;
    }
}
