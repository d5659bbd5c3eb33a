//! The idempotency ledger: storage of claims and their answers.
//!
//! The HTTP protocol on top (waiting, staleness, replay headers) is in
//! [`crate::idempotency`]; this module only says what must be stored atomically. It is a
//! trait so a site can back it by its own database: [`crate::ledger_pg::PgLedger`] is the
//! PostgreSQL one, which several server processes can share. The one hard requirement on
//! any backend: [`Ledger::begin`] must be atomic and its claim durable (committed) before it
//! returns, because the route runs right after, and a claim that could vanish in a crash
//! would let a retry apply the write twice.

use crate::store::{Db, StoreError};
use rusqlite::{params, OptionalExtension, TransactionBehavior};
use std::future::Future;
use std::pin::Pin;

/// Async results without an `async-trait` dependency, and object-safe so the app can hold an
/// `Arc<dyn Ledger>`.
pub type LedgerFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, LedgerError>> + Send + 'a>>;

#[derive(Debug)]
pub struct LedgerError(pub String);

impl std::fmt::Display for LedgerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ledger: {}", self.0)
    }
}

impl std::error::Error for LedgerError {}

impl From<StoreError> for LedgerError {
    fn from(e: StoreError) -> Self {
        LedgerError(e.to_string())
    }
}

/// Keys are scoped per account: two accounts that happen to send the same key are
/// unrelated writes, and one account can never read another's stored answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scope {
    pub account: String,
    pub key: String,
}

/// What makes a retry "the same request". The body is hashed so the ledger never needs to
/// keep request bodies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    pub method: String,
    /// Path with query: `/api/x?a=1` and `/api/x?a=2` are different writes.
    pub path: String,
    pub body_sha256: [u8; 32],
}

/// The answer stored for replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredAnswer {
    pub status: u16,
    pub content_type: Option<String>,
    pub location: Option<String>,
    pub body: Vec<u8>,
}

/// Identifies one claim, so a request whose entry was reset or expired and re-claimed by
/// another request cannot complete or heartbeat the newer claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimToken(pub String);

/// The outcome of trying to claim a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Begin {
    /// No live entry existed: a running claim is now committed; the caller runs the route.
    Claimed(ClaimToken),
    /// The same request already completed: replay this.
    Completed(StoredAnswer),
    /// The same request is running (or died while running); `heartbeat_ms` is its last sign
    /// of life, from which the caller decides between waiting and "outcome unknown".
    Running { heartbeat_ms: i64 },
    /// The key belongs to a different request.
    Reused,
}

pub trait Ledger: Send + Sync {
    /// Atomically: look up `scope`; treat an entry created before `expired_before_ms` as
    /// absent; if absent, insert a running claim with `now_ms` as creation and heartbeat
    /// time and commit it before returning.
    fn begin<'a>(
        &'a self,
        scope: &'a Scope,
        fingerprint: &'a Fingerprint,
        token: &'a ClaimToken,
        now_ms: i64,
        expired_before_ms: i64,
    ) -> LedgerFuture<'a, Begin>;

    /// Refreshes a running claim's heartbeat. A no-op if the claim is gone or not ours.
    fn heartbeat<'a>(
        &'a self,
        scope: &'a Scope,
        token: &'a ClaimToken,
        now_ms: i64,
    ) -> LedgerFuture<'a, ()>;

    /// Stores the answer and marks the claim completed. A no-op if the claim is gone or not
    /// ours (it was reset, or expired and re-claimed).
    fn complete<'a>(
        &'a self,
        scope: &'a Scope,
        token: &'a ClaimToken,
        answer: &'a StoredAnswer,
    ) -> LedgerFuture<'a, ()>;

    /// Deletes entries created before `expired_before_ms`; returns how many.
    fn prune(&self, expired_before_ms: i64) -> LedgerFuture<'_, u64>;

    /// Deletes everything (the test-mode reset).
    fn clear(&self) -> LedgerFuture<'_, ()>;
}

/// The default ledger: a table in the server's SQLite database.
#[derive(Clone)]
pub struct SqliteLedger {
    db: Db,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS idempotency (
    account TEXT NOT NULL,
    idem_key TEXT NOT NULL,
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    body_sha256 BLOB NOT NULL,
    claim_token TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('running', 'completed')),
    created_ms INTEGER NOT NULL,
    heartbeat_ms INTEGER NOT NULL,
    status INTEGER,
    content_type TEXT,
    location TEXT,
    body BLOB,
    PRIMARY KEY (account, idem_key)
);
CREATE INDEX IF NOT EXISTS idempotency_created ON idempotency (created_ms);
";

impl SqliteLedger {
    pub fn new(db: Db) -> Result<SqliteLedger, LedgerError> {
        db.lock().execute_batch(SCHEMA)?;
        Ok(SqliteLedger { db })
    }

    fn begin_sync(
        &self,
        scope: &Scope,
        fp: &Fingerprint,
        token: &ClaimToken,
        now_ms: i64,
        expired_before_ms: i64,
    ) -> Result<Begin, LedgerError> {
        let mut conn = self.db.lock();
        // IMMEDIATE takes the write lock up front, so two processes on one file cannot both
        // see "absent" and both claim.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        type Row = (
            String,
            String,
            Vec<u8>,
            String,
            i64,
            i64,
            Option<i64>,
            Option<String>,
            Option<String>,
            Option<Vec<u8>>,
        );
        let row: Option<Row> = tx
            .query_row(
                "SELECT method, path, body_sha256, state, created_ms, heartbeat_ms,
                        status, content_type, location, body
                 FROM idempotency WHERE account = ?1 AND idem_key = ?2",
                params![scope.account, scope.key],
                |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                        r.get(6)?,
                        r.get(7)?,
                        r.get(8)?,
                        r.get(9)?,
                    ))
                },
            )
            .optional()?;
        if let Some((method, path, sha, state, created_ms, heartbeat_ms, status, ct, loc, body)) =
            row
        {
            if created_ms >= expired_before_ms {
                let outcome = if method != fp.method || path != fp.path || sha != fp.body_sha256 {
                    Begin::Reused
                } else if state == "completed" {
                    let status = status
                        .and_then(|s| u16::try_from(s).ok())
                        .ok_or_else(|| LedgerError("completed entry without a status".into()))?;
                    Begin::Completed(StoredAnswer {
                        status,
                        content_type: ct,
                        location: loc,
                        body: body.unwrap_or_default(),
                    })
                } else {
                    Begin::Running { heartbeat_ms }
                };
                // Nothing was written; dropping `tx` rolls back the (empty) transaction.
                return Ok(outcome);
            }
        }
        tx.execute(
            "INSERT OR REPLACE INTO idempotency
                 (account, idem_key, method, path, body_sha256, claim_token, state,
                  created_ms, heartbeat_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'running', ?7, ?7)",
            params![
                scope.account,
                scope.key,
                fp.method,
                fp.path,
                fp.body_sha256.as_slice(),
                token.0,
                now_ms
            ],
        )?;
        tx.commit()?;
        Ok(Begin::Claimed(token.clone()))
    }
}

impl Ledger for SqliteLedger {
    fn begin<'a>(
        &'a self,
        scope: &'a Scope,
        fingerprint: &'a Fingerprint,
        token: &'a ClaimToken,
        now_ms: i64,
        expired_before_ms: i64,
    ) -> LedgerFuture<'a, Begin> {
        Box::pin(
            async move { self.begin_sync(scope, fingerprint, token, now_ms, expired_before_ms) },
        )
    }

    fn heartbeat<'a>(
        &'a self,
        scope: &'a Scope,
        token: &'a ClaimToken,
        now_ms: i64,
    ) -> LedgerFuture<'a, ()> {
        Box::pin(async move {
            self.db.lock().execute(
                "UPDATE idempotency SET heartbeat_ms = ?4
                 WHERE account = ?1 AND idem_key = ?2 AND claim_token = ?3 AND state = 'running'",
                params![scope.account, scope.key, token.0, now_ms],
            )?;
            Ok(())
        })
    }

    fn complete<'a>(
        &'a self,
        scope: &'a Scope,
        token: &'a ClaimToken,
        answer: &'a StoredAnswer,
    ) -> LedgerFuture<'a, ()> {
        Box::pin(async move {
            self.db.lock().execute(
                "UPDATE idempotency
                 SET state = 'completed', status = ?4, content_type = ?5, location = ?6, body = ?7
                 WHERE account = ?1 AND idem_key = ?2 AND claim_token = ?3 AND state = 'running'",
                params![
                    scope.account,
                    scope.key,
                    token.0,
                    i64::from(answer.status),
                    answer.content_type,
                    answer.location,
                    answer.body
                ],
            )?;
            Ok(())
        })
    }

    fn prune(&self, expired_before_ms: i64) -> LedgerFuture<'_, u64> {
        Box::pin(async move {
            let n = self.db.lock().execute(
                "DELETE FROM idempotency WHERE created_ms < ?1",
                params![expired_before_ms],
            )?;
            Ok(n as u64)
        })
    }

    fn clear(&self) -> LedgerFuture<'_, ()> {
        Box::pin(async move {
            self.db.lock().execute("DELETE FROM idempotency", [])?;
            Ok(())
        })
    }
}
