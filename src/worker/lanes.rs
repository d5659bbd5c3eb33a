//! The worker's side of `core::lanes`: the writes still deciding, in arrival order, so
//! a first attempt never overtakes an earlier write of its lane. (The lanes of the
//! records already stored are the view's: `worker::view`.)

use super::Inner;
use crate::channel::oneshot;
use crate::core::lanes::{Deciding, Lane, Ticket};
use std::cell::RefCell;
use std::rc::Rc;

#[derive(Default)]
pub struct Lanes {
    deciding: RefCell<Deciding>,
    /// Who waits for which earlier write to settle.
    waiters: RefCell<Vec<(Ticket, oneshot::Sender<()>)>>,
}

/// A write's place among the writes still deciding; leaving it (drop) lets the writes
/// behind it go on.
pub struct Turn {
    inner: Rc<Inner>,
    ticket: Ticket,
}

impl Turn {
    /// Waits until every earlier write of a lane this one follows has been answered or
    /// handed to the store; `true` when there was one to wait for.
    pub async fn wait(&self) -> bool {
        let lanes = &self.inner.lanes;
        let receivers: Vec<_> = {
            let ahead = lanes.deciding.borrow().ahead_of(self.ticket);
            let mut waiters = lanes.waiters.borrow_mut();
            ahead
                .into_iter()
                .map(|t| {
                    let (tx, rx) = oneshot::channel();
                    waiters.push((t, tx));
                    rx
                })
                .collect()
        };
        let waited = !receivers.is_empty();
        for rx in receivers {
            // A dropped sender also means the earlier write left.
            let _ = rx.await;
        }
        waited
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let lanes = &self.inner.lanes;
        lanes.deciding.borrow_mut().leave(self.ticket);
        let woken: Vec<_> = {
            let mut waiters = lanes.waiters.borrow_mut();
            let (mine, rest) = std::mem::take(&mut *waiters)
                .into_iter()
                .partition(|(t, _)| *t == self.ticket);
            *waiters = rest;
            mine
        };
        for (_, tx) in woken {
            let _ = tx.send(());
        }
    }
}

impl Inner {
    /// Registers a write of `lane` on arrival.
    pub(crate) fn enter_lane(self: &Rc<Self>, lane: Lane) -> Turn {
        let ticket = self.lanes.deciding.borrow_mut().enter(lane);
        Turn {
            inner: self.clone(),
            ticket,
        }
    }
}
