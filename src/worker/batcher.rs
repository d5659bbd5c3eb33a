//! Group commit: writes that arrive while a transaction is being committed are stored
//! together in the next one. Each waiter learns its own id only after its own
//! transaction committed.
//!
//! A batch is stored only under a fresh view (`worker::view`): when another worker
//! changed the database since, nothing is stored, the view is reloaded, the writes bound
//! to the session are bound to the session as it is now, and the same batch is tried
//! again, in the same order, before any write that arrived later.

use super::Inner;
use crate::channel::oneshot;
use crate::core::lanes::Lane;
use crate::core::record::RecordId;
use crate::store::{EnqueueFailure, Pending};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// A stored write: its id and the account it was stored under.
#[derive(Debug, Clone)]
pub struct Stored {
    pub id: RecordId,
    pub owner: Option<String>,
}

type Waiter = oneshot::Sender<Result<Stored, EnqueueFailure>>;

struct Item {
    pending: Pending,
    /// Its owner came from the session (no page header): re-bound when the view was stale.
    owner_from_session: bool,
    lane: Option<Lane>,
    waiter: Waiter,
}

#[derive(Default)]
pub struct Batcher {
    queue: RefCell<Vec<Item>>,
    running: Cell<bool>,
}

/// How often a batch is retried when other workers keep changing the database.
const STALE_RETRIES: u32 = 5;

impl Inner {
    /// Stores one write through the group-commit batcher. The write is handed over when
    /// this is called (so the order of calls is the order of ids), and holds back later
    /// writes of its lane from then on; the future resolves once its transaction
    /// committed, or with why it was not stored.
    pub(crate) fn enqueue(
        self: &Rc<Self>,
        pending: Pending,
        owner_from_session: bool,
    ) -> impl std::future::Future<Output = Result<Stored, EnqueueFailure>> {
        let (tx, rx) = oneshot::channel();
        let lane = self.pending_lane(&pending);
        if let Some(l) = &lane {
            self.lane_pending(l);
        }
        self.batcher.queue.borrow_mut().push(Item {
            pending,
            owner_from_session,
            lane,
            waiter: tx,
        });
        if !self.batcher.running.get() {
            self.batcher.running.set(true);
            let me = self.clone();
            wasm_bindgen_futures::spawn_local(async move { me.run_batches().await });
        }
        async move {
            rx.await.unwrap_or(Err(EnqueueFailure::Storage(
                "the write was dropped before it was stored".into(),
            )))
        }
    }

    fn pending_lane(&self, p: &Pending) -> Option<Lane> {
        Lane::of(p.record.owner_id.as_deref(), p.record.workspace.as_deref())
    }

    async fn run_batches(self: Rc<Self>) {
        loop {
            let mut batch = std::mem::take(&mut *self.batcher.queue.borrow_mut());
            if batch.is_empty() {
                self.batcher.running.set(false);
                return;
            }
            let mut tries = 0;
            let (before, results) = loop {
                let pendings: Vec<&Pending> = batch.iter().map(|i| &i.pending).collect();
                let me = self.clone();
                let expected = move || me.view_generation();
                let (before, results) = self
                    .store
                    .enqueue(&pendings, self.config.max_records, &expected)
                    .await;
                let stale = results.iter().any(|r| r == &Err(EnqueueFailure::Stale));
                if !stale || tries >= STALE_RETRIES {
                    break (before, results);
                }
                tries += 1;
                self.reload().await;
                self.rebind(&mut batch);
            };
            if let Some(before) = before {
                let stored_lanes: Vec<Lane> = batch
                    .iter()
                    .zip(&results)
                    .filter(|(_, r)| r.is_ok())
                    .filter_map(|(i, _)| i.lane.clone())
                    .collect();
                self.committed(before, false, |v| {
                    for l in &stored_lanes {
                        v.add_lane(l);
                    }
                });
            }
            for (item, result) in batch.into_iter().zip(results) {
                if let Some(l) = &item.lane {
                    self.lane_unpending(l);
                }
                let result = match result {
                    Ok(id) => Ok(Stored {
                        id,
                        owner: item.pending.record.owner_id.clone(),
                    }),
                    Err(EnqueueFailure::Stale) => Err(EnqueueFailure::Storage(
                        "other workers kept changing the outbox's database".into(),
                    )),
                    Err(e) => Err(e),
                };
                let _ = item.waiter.send(result);
            }
        }
    }

    /// After a reload: writes bound to the session take the session as it is now (an
    /// account switched by another worker), and their lanes follow.
    fn rebind(&self, batch: &mut [Item]) {
        let session = self.session_user();
        for item in batch.iter_mut().filter(|i| i.owner_from_session) {
            if item.pending.record.owner_id == session {
                continue;
            }
            item.pending.record.owner_id = session.clone();
            if let Some(l) = &item.lane {
                self.lane_unpending(l);
            }
            item.lane = self.pending_lane(&item.pending);
            if let Some(l) = &item.lane {
                self.lane_pending(l);
            }
        }
    }
}
