//! Writes that arrived and are not answered yet (issue 36): the start flush waits for
//! them ([`Inner::writes_answered`]), so a worker started by a write spends its thread and
//! its database on that write first — the flush's count, identity check, marks and stored
//! stops come after the write's answer (its 201, or its 202 once stored), not between the
//! module's start and the answer. A write stops counting once it is answered or ends in
//! any other way, or once it waits for an earlier write of its lane (that can take
//! `attemptTimeoutMs`, and that write holds the flush itself).

use super::Inner;
use crate::channel::oneshot;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

#[derive(Default)]
pub struct Unsent {
    count: Cell<u32>,
    /// Told once `count` is back to zero.
    waiters: RefCell<Vec<oneshot::Sender<()>>>,
}

/// One write counted as not answered yet; dropping it stops counting it.
pub struct Arrived {
    inner: Rc<Inner>,
}

impl Drop for Arrived {
    fn drop(&mut self) {
        let unsent = &self.inner.unsent;
        let left = unsent.count.get().saturating_sub(1);
        unsent.count.set(left);
        if left == 0 {
            for waiter in std::mem::take(&mut *unsent.waiters.borrow_mut()) {
                let _ = waiter.send(());
            }
        }
    }
}

impl Inner {
    /// A write arrived: counted until it is answered (or ends).
    pub(crate) fn write_arrived(self: &Rc<Self>) -> Arrived {
        self.unsent.count.set(self.unsent.count.get() + 1);
        Arrived {
            inner: self.clone(),
        }
    }

    /// Resolves once no write that arrived before now is still unanswered (writes waiting
    /// behind an earlier write of their lane aside).
    pub(crate) async fn writes_answered(&self) {
        if self.unsent.count.get() == 0 {
            return;
        }
        let (tx, rx) = oneshot::channel();
        self.unsent.waiters.borrow_mut().push(tx);
        let _ = rx.await;
    }
}
