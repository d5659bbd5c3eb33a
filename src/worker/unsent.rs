//! Writes that arrived and are not on the wire yet (issue 36): the start flush waits for
//! them ([`Inner::writes_sent`]), so a worker started by a write spends its thread on
//! that write first — its count, identity check and marks come after the write's request
//! left, not between the module's start and the write's send. A write stops counting once
//! its request is handed to the network, once it waits for an earlier write of its lane
//! (that can take `attemptTimeoutMs`), or once it ends in any other way (queued, refused,
//! aborted).

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

/// One write counted as not sent yet; dropping it (or [`Arrived::sent`]) stops counting it.
pub struct Arrived {
    inner: Rc<Inner>,
}

impl Arrived {
    /// Its request is on the wire, or it waits for something that is not this worker's
    /// thread: it no longer holds the start flush back.
    pub fn sent(self) {}
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
    /// A write arrived: counted until it is sent (or ends).
    pub(crate) fn write_arrived(self: &Rc<Self>) -> Arrived {
        self.unsent.count.set(self.unsent.count.get() + 1);
        Arrived {
            inner: self.clone(),
        }
    }

    /// Resolves once no write that arrived before now is still before its send.
    pub(crate) async fn writes_sent(&self) {
        if self.unsent.count.get() == 0 {
            return;
        }
        let (tx, rx) = oneshot::channel();
        self.unsent.waiters.borrow_mut().push(tx);
        let _ = rx.await;
    }
}
