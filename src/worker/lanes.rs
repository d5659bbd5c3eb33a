//! The worker's side of `core::lanes`: which writes are still deciding, and the lanes of
//! the unresolved records in the queue, so a first attempt never overtakes an earlier
//! write of its lane.
//!
//! The stored count is read from the queue once per worker start (by the first write
//! that needs it) and then kept by this worker: a record handed to the store counts, one
//! replayed or discarded stops counting, an adopted one starts. Another worker changing
//! the queue meanwhile (an old one during an update) can only leave a count too high,
//! which queues a write that could have been sent: its order is kept either way.

use super::chain::FifoLock;
use super::Inner;
use crate::core::lanes::{Deciding, Lane, StoredLanes, Ticket};
use crate::core::record::RecordMeta;
use crate::core::route::record_is_auth_route;
use crate::store::QueueItem;
use futures_channel::oneshot;
use std::cell::RefCell;
use std::rc::Rc;

#[derive(Default)]
pub struct Lanes {
    stored: RefCell<Option<StoredLanes>>,
    /// One reader of the queue at a time when the count is first needed.
    reading: FifoLock,
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
    /// handed to the store.
    pub async fn wait(&self) {
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
        for rx in receivers {
            // A dropped sender also means the earlier write left.
            let _ = rx.await;
        }
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

    /// Whether an unresolved record of the queue is ahead of a new write of `lane`. When
    /// the queue cannot be read, nothing is assumed ahead (the write is attempted, as
    /// the contract's first attempt is).
    pub(crate) async fn held_back(&self, lane: &Lane) -> bool {
        self.count_lanes().await;
        self.lanes
            .stored
            .borrow()
            .as_ref()
            .is_some_and(|s| s.holds_back(lane))
    }

    /// Reads the lanes of the queue's records once (`start` begins it, so the first write
    /// seldom waits for it).
    pub(crate) async fn count_lanes(&self) {
        if self.lanes.stored.borrow().is_none() {
            let _reader = self.lanes.reading.acquire().await;
            if self.lanes.stored.borrow().is_none() {
                let Ok(items) = self.store.read_queue().await else {
                    return;
                };
                let counted = StoredLanes::from_lanes(items.iter().map(|i| match i {
                    QueueItem::Record(m) => self.record_lane(m),
                    QueueItem::Corrupt(..) => None,
                }));
                *self.lanes.stored.borrow_mut() = Some(counted);
            }
        }
    }

    /// The lane a stored record holds back: none for auth routes (never sent) and
    /// unknown owners.
    pub(crate) fn record_lane(&self, m: &RecordMeta) -> Option<Lane> {
        if record_is_auth_route(&m.path, &self.config, &*self.patterns) {
            return None;
        }
        Lane::of(m.owner.as_deref(), m.workspace.as_deref())
    }

    /// A record of `lane` was handed to the store (counted before its commit, so a write
    /// behind it already sees it).
    pub(crate) fn lane_stored(&self, lane: &Lane) {
        if let Some(s) = self.lanes.stored.borrow_mut().as_mut() {
            s.add(lane);
        }
    }

    /// A record of `lane` left the queue (replayed, discarded), or was never stored.
    pub(crate) fn lane_resolved(&self, lane: &Lane) {
        if let Some(s) = self.lanes.stored.borrow_mut().as_mut() {
            s.remove(lane);
        }
    }

    /// The queue was emptied (`CLEAR_DEVICE`).
    pub(crate) fn lanes_cleared(&self) {
        if let Some(s) = self.lanes.stored.borrow_mut().as_mut() {
            *s = StoredLanes::default();
        }
    }
}
