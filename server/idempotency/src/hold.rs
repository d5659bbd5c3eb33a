//! The seam of transactional mode: a ledger that claims a key inside a transaction of its
//! own and hands that transaction to the route, so the route's writes and the key's
//! answer commit together. The layer speaks to it through these traits only; `PgLedger`
//! is the one that can (feature `postgres`, module `transactional`).

use crate::ledger::{Begin, ClaimRequest, LedgerFuture, StoredAnswer};

/// What claiming a key in transactional mode came to.
// Only `PgLedger` makes one.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
pub(crate) enum Held {
    /// Claimed: this transaction holds the claim's row lock; the route runs in it.
    Claimed(Box<dyn HeldTx>),
    /// Anything else (a replay, a running claim, a refusal), as a plain claim reads it.
    Not(Begin),
}

/// A route's transaction, as the layer handles it.
pub(crate) trait HeldTx: Send {
    /// Puts the handle the route asks for into the request.
    fn expose(&self, extensions: &mut http::Extensions);

    /// Commits: with `Some(answer)`, the claim is completed with it first, in the same
    /// transaction. Without one (a request the layer did not claim), only the route's own
    /// writes, if it began any.
    fn commit(self: Box<Self>, answer: Option<StoredAnswer>) -> LedgerFuture<'static, ()>;

    /// Removes the claim (its route never started) and commits that.
    fn release(self: Box<Self>) -> LedgerFuture<'static, ()>;
}

/// A ledger with a transactional mode.
pub(crate) trait Holder: Send + Sync {
    /// Claims the key inside a transaction that stays open when claimed.
    fn begin_held<'a>(&'a self, claim: &'a ClaimRequest) -> LedgerFuture<'a, Held>;

    /// A transaction for a request that is not claimed (no key, not a write, no account),
    /// begun only if the route asks for it.
    fn unclaimed(&self) -> Box<dyn HeldTx>;
}
