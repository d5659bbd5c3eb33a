//! Test support (feature `test-support`): what a test suite or a test server needs of a
//! ledger and a production layer never does, kept out of the [`Ledger`]
//! trait.

use crate::ledger::{Ledger, LedgerFuture};
use std::sync::Arc;

/// Counting and clearing a ledger.
pub trait Inspect: Ledger {
    /// How many entries the ledger holds (expired ones included until pruned).
    fn entries(&self) -> LedgerFuture<'_, u64>;

    /// Deletes every entry: every key applies again. Only for tests and test servers.
    fn clear(&self) -> LedgerFuture<'_, ()>;

    /// The same ledger, as the layer takes it.
    fn into_ledger(self: Arc<Self>) -> Arc<dyn Ledger>;
}
