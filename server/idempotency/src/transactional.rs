//! Transactional mode (feature `postgres`): the route runs its writes in the transaction
//! that holds the claim's row, and the layer stores the route's answer in that same
//! transaction and commits it after the route returns.
//!
//! The write and its recorded completion then commit together or not at all. A claim
//! whose process died (or whose client left before its route started) never committed
//! anything: the next retry finds it running but unlocked, takes it over and runs the
//! write again, so such routes never answer "outcome unknown". A live attempt is told
//! from a dead one by its row lock (a claim reads the row `FOR UPDATE SKIP LOCKED`), not
//! by a heartbeat: PostgreSQL ends a dead client's transaction and frees its locks.
//!
//! The route asks for the transaction as an axum extractor, `Extension<ClaimTransaction>`
//! (or, in any tower service, `request.extensions().get::<ClaimTransaction>()`), and
//! runs its queries on [`ClaimTransaction::conn`]. It must not commit it, nor write
//! through another connection what must happen once: only what runs in this transaction
//! commits with the key's answer.

use crate::hold::{Held, HeldTx, Holder};
use crate::layer::{AccountOf, IdempotencyLayer};
use crate::ledger::{ClaimRequest, ClaimToken, LedgerError, LedgerFuture, Scope, StoredAnswer};
use crate::postgres::{Claim, Hold, PgLedger};
use sqlx::postgres::{PgConnection, Postgres};
use sqlx::Transaction;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use tokio::sync::{Mutex, OwnedMappedMutexGuard, OwnedMutexGuard};

impl IdempotencyLayer {
    /// The layer in transactional mode on `ledger`: every request that reaches the route
    /// through it gets a [`ClaimTransaction`]; for a claimed keyed write it is the one
    /// holding the claim, committed with the route's answer after the route returns.
    ///
    /// Prefer it for routes whose writes go to the same PostgreSQL database as the
    /// ledger: a process killed mid-route then costs a re-run, never a person's time.
    /// Keep the plain layer ([`IdempotencyLayer::new`]) for routes that write elsewhere
    /// (another database, a payment API, a queue), which no transaction here can undo.
    pub fn transactional(ledger: PgLedger, account: impl AccountOf) -> IdempotencyLayer {
        let holder: Arc<dyn Holder> = Arc::new(ledger.clone());
        let mut layer = IdempotencyLayer::new(Arc::new(ledger), account);
        layer.holder = Some(holder);
        layer
    }
}

/// The route's transaction in transactional mode: an axum `Extension`, cheap to clone.
/// Its queries run on [`ClaimTransaction::conn`]; the layer commits it after the route
/// returns (or rolls it back, if the route panics or fails), never the route.
#[derive(Clone)]
pub struct ClaimTransaction {
    slot: Arc<Mutex<Slot>>,
}

impl fmt::Debug for ClaimTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClaimTransaction").finish_non_exhaustive()
    }
}

enum Slot {
    /// Not begun: begun on the route's first `conn()` (a request the layer did not claim).
    Lazy(PgLedger),
    Open(Transaction<'static, Postgres>),
    /// Committed or rolled back: the route returned.
    Closed,
}

/// The transaction's connection, for sqlx: `query.execute(&mut *conn)`. Held, other
/// users of the same [`ClaimTransaction`] wait.
pub struct TransactionConn(OwnedMappedMutexGuard<Slot, PgConnection>);

impl fmt::Debug for TransactionConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransactionConn").finish_non_exhaustive()
    }
}

impl Deref for TransactionConn {
    type Target = PgConnection;
    fn deref(&self) -> &PgConnection {
        &self.0
    }
}

impl DerefMut for TransactionConn {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.0
    }
}

impl ClaimTransaction {
    fn new(slot: Slot) -> ClaimTransaction {
        ClaimTransaction {
            slot: Arc::new(Mutex::new(slot)),
        }
    }

    /// The connection the transaction runs on. Fails only if the transaction could not
    /// be begun (a request the layer did not claim, whose transaction begins here) or the
    /// route already returned.
    pub async fn conn(&self) -> Result<TransactionConn, LedgerError> {
        let mut slot = self.slot.clone().lock_owned().await;
        if let Slot::Lazy(ledger) = &*slot {
            let ledger = ledger.clone();
            // In a task of its own: a route dropped during BEGIN must not hand a
            // connection back to the pool inside a transaction (sqlx issue 4393).
            let tx = tokio::spawn(async move { ledger.transaction().await })
                .await
                .map_err(|e| {
                    LedgerError::failed(format!("postgres: BEGIN did not finish: {e}"))
                })??;
            *slot = Slot::Open(tx);
        }
        OwnedMutexGuard::try_map(slot, |s| match s {
            Slot::Open(tx) => Some(&mut **tx),
            _ => None,
        })
        .map(TransactionConn)
        .map_err(|_| LedgerError::failed("the route's transaction ended: the route returned"))
    }

    /// Takes the transaction out, closing the handle for everyone.
    async fn take(&self) -> Option<Transaction<'static, Postgres>> {
        let mut slot = self.slot.lock().await;
        match std::mem::replace(&mut *slot, Slot::Closed) {
            Slot::Open(tx) => Some(tx),
            _ => None,
        }
    }
}

/// A [`ClaimTransaction`] as the layer holds it, with the claim it completes.
struct PgHeld {
    ledger: PgLedger,
    handle: ClaimTransaction,
    claim: Option<(Scope, ClaimToken)>,
}

impl HeldTx for PgHeld {
    fn expose(&self, extensions: &mut http::Extensions) {
        extensions.insert(self.handle.clone());
    }

    fn commit(self: Box<Self>, answer: Option<StoredAnswer>) -> LedgerFuture<'static, ()> {
        Box::pin(async move {
            let Some(tx) = self.handle.take().await else {
                return match self.claim {
                    Some(_) => Err(LedgerError::failed("the claim's transaction was gone")),
                    None => Ok(()),
                };
            };
            match (self.claim, answer) {
                (Some((scope, token)), Some(answer)) => {
                    self.ledger.complete_in(tx, &scope, &token, &answer).await
                }
                _ => Ok(tx.commit().await?),
            }
        })
    }

    fn release(self: Box<Self>) -> LedgerFuture<'static, ()> {
        Box::pin(async move {
            match (self.handle.take().await, self.claim) {
                (Some(tx), Some((scope, token))) => {
                    self.ledger.release_in(tx, &scope, &token).await
                }
                (Some(tx), None) => Ok(tx.rollback().await?),
                (None, _) => Ok(()),
            }
        })
    }
}

impl Holder for PgLedger {
    fn begin_held<'a>(&'a self, claim: &'a ClaimRequest) -> LedgerFuture<'a, Held> {
        Box::pin(async move {
            Ok(match self.claim(claim, Hold::Locked, &|| true).await? {
                Claim::Decided(begin) => Held::Not(begin),
                Claim::Locked(tx) => Held::Claimed(Box::new(PgHeld {
                    ledger: self.clone(),
                    handle: ClaimTransaction::new(Slot::Open(tx)),
                    claim: Some((claim.scope.clone(), claim.token.clone())),
                })),
            })
        })
    }

    fn unclaimed(&self) -> Box<dyn HeldTx> {
        Box::new(PgHeld {
            ledger: self.clone(),
            handle: ClaimTransaction::new(Slot::Lazy(self.clone())),
            claim: None,
        })
    }
}
