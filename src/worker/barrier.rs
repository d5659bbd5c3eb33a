//! The sign-in barrier in the worker (`core::barrier`, contract 4.5 end): raised by an
//! auth-route request the moment the fetch handler gets it and by an `AUTH_SESSION`
//! when it arrives, lowered when that request is answered (the session persisted). A
//! flush checks it right before each replay's `fetch()`, with no `await` in between, so a
//! record handed to its lane before a sign-in is never sent after it.

use super::Inner;
use crate::channel::oneshot;
use crate::core::barrier::{Checked, SignInBarrier};
use std::cell::RefCell;
use std::rc::Rc;

#[derive(Default)]
pub struct Barrier {
    state: RefCell<SignInBarrier>,
    /// Told when no session change is open any more.
    settled: RefCell<Vec<oneshot::Sender<()>>>,
}

/// One open session change; dropping it settles it (answered, failed, or abandoned).
pub struct Opened {
    inner: Rc<Inner>,
}

impl Drop for Opened {
    fn drop(&mut self) {
        let barrier = &self.inner.barrier;
        barrier.state.borrow_mut().settle();
        if !barrier.state.borrow().is_open() {
            for tx in std::mem::take(&mut *barrier.settled.borrow_mut()) {
                let _ = tx.send(());
            }
        }
    }
}

impl Inner {
    /// A session may be changing from now on (synchronously: call it before anything
    /// is awaited). Replays stop until the returned guard is dropped and an identity
    /// check made after that names the account again.
    pub(crate) fn session_changing(self: &Rc<Self>) -> Opened {
        self.barrier.state.borrow_mut().raise();
        Opened {
            inner: self.clone(),
        }
    }

    /// The token of an identity check about to be sent, or `None` while a session
    /// change is open.
    pub(crate) fn identity_check_begins(&self) -> Option<Checked> {
        self.barrier.state.borrow().check_begins()
    }

    /// Whether a replay may go out now under an identity checked as `checked`.
    pub(crate) fn replay_allowed(&self, checked: Checked) -> bool {
        self.barrier.state.borrow().allows(checked)
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
