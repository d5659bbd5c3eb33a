//! Group commit of a flush's steps. Each lane of a flush marks its record in flight
//! before the request and stores what the answer means after it; with one transaction
//! per step, the lanes queued behind each other on IndexedDB (readwrite transactions over
//! one store run one at a time), so parallel lanes were no faster than one. Steps that
//! become due while a transaction commits are stored together in the next one; each
//! lane learns its step's result only after that transaction committed.
//!
//! A record's mark must have committed before its request leaves; nothing else need
//! wait for a commit (r4, 4.7). Its lane's marks are handed over ahead
//! (`flush::marks`), and a settlement is handed over unawaited: only a replayed
//! record's deletion is followed by more sends of its lane (every other answer holds
//! the lane for the flush), and a deletion a crash or a failed transaction lost only
//! has the record sent again with its key, answered from the server's ledger. Once a
//! transaction fails every later step of the flush fails too (until
//! [`Inner::open_steps`]), so no mark handed over after it lets a record leave.
//!
//! A replayed record's deletion does not start a transaction of its own either: it is
//! held until the flush has taken in its answer ([`Inner::release_held`], before any
//! later record is handed out, so the marks that answer makes due join it and a
//! storage failure the transaction meets stops the next send), until [`HELD_DELETES`]
//! are waiting, or until the next step is handed over; so a flush commits one
//! transaction per answer instead of two. A crash loses at most the held deletions:
//! their records are sent again with their keys (r4, 4.7: the safe side).

use super::Inner;
use crate::channel::oneshot;
use crate::core::lanes::Lane;
use crate::store::idb::IdbError;
use crate::store::{ReplayStep, StepDone};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

type Waiter = oneshot::Sender<Result<StepDone, IdbError>>;
/// What is left of an [`Item`] once its step went into a transaction.
type Handed = (Option<Lane>, Option<Waiter>);

struct Item {
    step: ReplayStep,
    /// A deleted record's lane, which the view stops counting once the delete committed.
    lane: Option<Lane>,
    /// Told the step's result; `None` for a settlement handed over unawaited
    /// ([`Inner::hand_over_step`]), which [`Inner::steps_stored`] accounts for.
    waiter: Option<Waiter>,
}

/// A step handed over, whose transaction's result is awaited when it is needed.
pub(crate) struct StepAhead(oneshot::Receiver<Result<StepDone, IdbError>>);

impl StepAhead {
    /// The step's result once its transaction committed (or failed).
    pub(crate) async fn result(self) -> Result<StepDone, IdbError> {
        self.0
            .await
            .unwrap_or_else(|_| Err(IdbError::Aborted("the step was dropped".into())))
    }
}

/// How many replayed records' deletions wait for a step to ride with before they are
/// stored on their own: bounds what a crash makes the server answer twice.
const HELD_DELETES: usize = 32;

#[derive(Default)]
pub struct Steps {
    queue: RefCell<Vec<Item>>,
    /// Deletions of replayed records not handed to the commit loop yet (see the module).
    held: RefCell<Vec<Item>>,
    running: Cell<bool>,
    /// A transaction of this flush failed: every later step fails without being tried.
    failed: Cell<bool>,
    /// Callers of [`Inner::steps_stored`], told once every step handed over is settled.
    drained: RefCell<Vec<oneshot::Sender<bool>>>,
}

impl Inner {
    /// Whether a step of this flush failed: nothing more is sent (a record whose mark
    /// committed ahead included), as the flush cannot store what it learns.
    pub(crate) fn steps_failed(&self) -> bool {
        self.steps.failed.get()
    }

    /// A flush starts: its steps are tried again whatever an earlier flush's failed.
    pub(crate) fn open_steps(&self) {
        self.steps.failed.set(false);
    }

    /// Resolves once every step handed over so far was stored or refused: whether all
    /// of this flush's were stored. The flush waits for it before it reports, instead
    /// of holding each step's answer (one per record: memory that grew with the queue).
    pub(crate) async fn steps_stored(self: &Rc<Self>) -> bool {
        self.release_held();
        if !self.steps.running.get() {
            return !self.steps.failed.get();
        }
        let (tx, rx) = oneshot::channel();
        self.steps.drained.borrow_mut().push(tx);
        rx.await.unwrap_or(false)
    }

    /// Hands a step over now (with whatever else is due; `lane`: the lane a deleted
    /// record leaves), its result awaited when it is needed: a lane's marks committed
    /// ahead of its sends (4.7, r4) take their place among the flush's steps here.
    pub(crate) fn step_ahead(self: &Rc<Self>, step: ReplayStep, lane: Option<Lane>) -> StepAhead {
        let (tx, rx) = oneshot::channel();
        self.submit_step(step, lane, Some(tx));
        StepAhead(rx)
    }

    /// Hands a settlement over without waiting for it to commit (see the module's
    /// comment); whether it was stored, [`Inner::steps_stored`] tells.
    pub(crate) fn hand_over_step(self: &Rc<Self>, step: ReplayStep, lane: Option<Lane>) {
        self.submit_step(step, lane, None);
    }

    /// Hands a replayed record's deletion over without starting a transaction for it:
    /// it rides with the next step (see the module's comment).
    pub(crate) fn hand_over_delete(self: &Rc<Self>, step: ReplayStep, lane: Option<Lane>) {
        let full = {
            let mut held = self.steps.held.borrow_mut();
            held.push(Item {
                step,
                lane,
                waiter: None,
            });
            held.len() >= HELD_DELETES
        };
        if full {
            self.release_held();
        }
    }

    /// The held deletions go to the commit loop, ahead of whatever is handed over next
    /// (in the same transaction when that comes before the loop runs, in this turn).
    pub(crate) fn release_held(self: &Rc<Self>) {
        let held = std::mem::take(&mut *self.steps.held.borrow_mut());
        if held.is_empty() {
            return;
        }
        self.steps.queue.borrow_mut().extend(held);
        self.run_steps_soon();
    }

    /// Queues a step now (its place among the flush's steps is fixed here, after the
    /// held deletions) and starts the commit loop unless it runs.
    fn submit_step(self: &Rc<Self>, step: ReplayStep, lane: Option<Lane>, waiter: Option<Waiter>) {
        {
            let mut queue = self.steps.queue.borrow_mut();
            queue.append(&mut self.steps.held.borrow_mut());
            queue.push(Item { step, lane, waiter });
        }
        self.run_steps_soon();
    }

    fn run_steps_soon(self: &Rc<Self>) {
        if !self.steps.running.get() {
            self.steps.running.set(true);
            let me = self.clone();
            wasm_bindgen_futures::spawn_local(async move { me.run_steps().await });
        }
    }

    async fn run_steps(self: Rc<Self>) {
        loop {
            let batch = std::mem::take(&mut *self.steps.queue.borrow_mut());
            if batch.is_empty() {
                self.steps.running.set(false);
                let stored = !self.steps.failed.get();
                for waiter in std::mem::take(&mut *self.steps.drained.borrow_mut()) {
                    let _ = waiter.send(stored);
                }
                return;
            }
            let (steps, rest): (Vec<ReplayStep>, Vec<Handed>) = batch
                .into_iter()
                .map(|i| (i.step, (i.lane, i.waiter)))
                .unzip();
            let stored = if self.steps.failed.get() {
                Err(IdbError::Aborted(
                    "an earlier step of this flush was not stored".into(),
                ))
            } else {
                self.store.replay_steps(steps).await
            };
            match stored {
                Ok((before, done)) => {
                    if let Some(before) = before {
                        self.committed(before, false, |v| {
                            for ((lane, _), d) in rest.iter().zip(&done) {
                                if let (Some(l), StepDone::Deleted) = (lane, d) {
                                    v.remove_lane(l);
                                }
                            }
                        });
                    }
                    for ((_, waiter), d) in rest.into_iter().zip(done) {
                        if let Some(waiter) = waiter {
                            let _ = waiter.send(Ok(d));
                        }
                    }
                }
                Err(e) => {
                    self.steps.failed.set(true);
                    for waiter in rest.into_iter().filter_map(|(_, w)| w) {
                        let _ = waiter.send(Err(e.clone()));
                    }
                }
            }
        }
    }
}
