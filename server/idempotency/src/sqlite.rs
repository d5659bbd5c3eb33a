//! The ledger in SQLite (feature `sqlite`): a file (or `:memory:`) of its own, on one
//! connection.
//!
//! SQLite calls block, so every call runs on tokio's blocking pool, never on a runtime
//! thread; the connection is taken through an async mutex whose wait is bounded by the lock
//! wait, and the connection's `busy_timeout` (the same bound) covers other processes on the
//! same file. A wait that runs out is [`LedgerErrorKind::Busy`](crate::LedgerErrorKind),
//! which the layer answers with 503 and `Retry-After: 1`.
//!
//! Times are this machine's clock: every process that can open the file runs on it.
//! (Several machines share a ledger through `PgLedger` (feature `postgres`), whose times are
//! the database's.)

use crate::ledger::{
    encode_headers, millis, retry_after, Begin, ClaimRequest, ClaimToken, Found, Ledger,
    LedgerError, LedgerFuture, Scope, StoredAnswer, DEFAULT_LOCK_WAIT,
};
use rusqlite::{params, Connection, ErrorCode, OptionalExtension, TransactionBehavior};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::Mutex;

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
    headers TEXT,
    body BLOB,
    content_type TEXT,
    PRIMARY KEY (account, idem_key)
);
CREATE INDEX IF NOT EXISTS idempotency_heartbeat ON idempotency (heartbeat_ms);
DROP INDEX IF EXISTS idempotency_created;
";

impl From<rusqlite::Error> for LedgerError {
    fn from(e: rusqlite::Error) -> Self {
        match e.sqlite_error_code() {
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
                LedgerError::busy(format!("sqlite: {e}"))
            }
            _ => LedgerError::failed(format!("sqlite: {e}")),
        }
    }
}

/// The SQLite ledger. Cloning shares the connection.
#[derive(Clone)]
pub struct SqliteLedger {
    conn: Arc<Mutex<Connection>>,
    lock_wait: Duration,
}

impl fmt::Debug for SqliteLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteLedger")
            .field("lock_wait", &self.lock_wait)
            .finish_non_exhaustive()
    }
}

impl SqliteLedger {
    /// Opens (creating if needed) the ledger in the file `path`, or in memory for
    /// `:memory:`, with [`DEFAULT_LOCK_WAIT`].
    pub fn open(path: &str) -> Result<SqliteLedger, LedgerError> {
        SqliteLedger::open_with(path, DEFAULT_LOCK_WAIT)
    }

    /// Like [`SqliteLedger::open`] with another lock wait. A file uses WAL with
    /// `synchronous=FULL`: a claim must survive a crash once committed, or "claimed before
    /// the route runs" means nothing.
    pub fn open_with(path: &str, lock_wait: Duration) -> Result<SqliteLedger, LedgerError> {
        let conn = if path == ":memory:" {
            Connection::open_in_memory()?
        } else {
            let conn = Connection::open(path)?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.pragma_update(None, "synchronous", "FULL")?;
            conn
        };
        SqliteLedger::from_connection(conn, lock_wait)
    }

    /// The ledger on a connection the app opened; creates (or upgrades) its table.
    pub fn from_connection(
        conn: Connection,
        lock_wait: Duration,
    ) -> Result<SqliteLedger, LedgerError> {
        conn.busy_timeout(lock_wait)?;
        upgrade(&conn)?;
        conn.execute_batch(SCHEMA)?;
        Ok(SqliteLedger {
            conn: Arc::new(Mutex::new(conn)),
            lock_wait,
        })
    }

    /// Runs `f` on the connection, on the blocking pool, after a bounded wait for it.
    async fn call<T, F>(&self, f: F) -> Result<T, LedgerError>
    where
        F: FnOnce(&mut Connection) -> Result<T, LedgerError> + Send + 'static,
        T: Send + 'static,
    {
        let guard = tokio::time::timeout(self.lock_wait, self.conn.clone().lock_owned())
            .await
            .map_err(|_| {
                LedgerError::busy(format!(
                    "sqlite: the connection stayed taken for {:?}",
                    self.lock_wait
                ))
            })?;
        tokio::task::spawn_blocking(move || {
            let mut conn = guard;
            f(&mut conn)
        })
        .await
        .map_err(|e| LedgerError::failed(format!("sqlite call did not finish: {e}")))?
    }
}

/// Wall-clock milliseconds of this machine.
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(millis)
        .unwrap_or(0)
}

/// Brings a table of an earlier layout up to this one:
///
/// - the first layout kept the answer's `Content-Type` and `Location` in columns of their
///   own (`content_type`, `location`); its completed entries get the stored-header list,
///   so they replay the same, and that `content_type` column is then the request's, as
///   now — NULL for the entries it held, which match a retry of any type;
/// - the second had no `content_type`: it is added, NULL for the same reason.
fn upgrade(conn: &Connection) -> Result<(), LedgerError> {
    let mut stmt = conn.prepare("SELECT name FROM pragma_table_info('idempotency')")?;
    let columns: Vec<String> = stmt
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let has = |c: &str| columns.iter().any(|n| n == c);
    if columns.is_empty() {
        return Ok(());
    }
    if has("headers") {
        if !has("content_type") {
            conn.execute_batch("ALTER TABLE idempotency ADD COLUMN content_type TEXT")?;
        }
        return Ok(());
    }
    if !has("content_type") {
        conn.execute_batch(
            "ALTER TABLE idempotency ADD COLUMN headers TEXT;
             ALTER TABLE idempotency ADD COLUMN content_type TEXT;",
        )?;
        return Ok(());
    }
    conn.execute_batch("ALTER TABLE idempotency ADD COLUMN headers TEXT")?;
    let mut stmt = conn.prepare(
        "SELECT rowid, content_type, location FROM idempotency WHERE state = 'completed'",
    )?;
    let rows: Vec<(i64, Option<String>, Option<String>)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    for (rowid, content_type, location) in rows {
        let headers: Vec<(String, String)> =
            [("content-type", content_type), ("location", location)]
                .into_iter()
                .filter_map(|(n, v)| Some((n.to_owned(), v?)))
                .collect();
        conn.execute(
            "UPDATE idempotency SET headers = ?1 WHERE rowid = ?2",
            params![encode_headers(&headers), rowid],
        )?;
    }
    conn.execute_batch("UPDATE idempotency SET content_type = NULL")?;
    Ok(())
}

fn count(
    tx: &rusqlite::Transaction<'_>,
    sql: &str,
    p: impl rusqlite::Params,
) -> Result<u64, LedgerError> {
    let n: i64 = tx.query_row(sql, p, |r| r.get(0))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

fn begin_sync(conn: &mut Connection, c: &ClaimRequest) -> Result<Begin, LedgerError> {
    // IMMEDIATE takes the write lock up front, so two processes on one file cannot both see
    // "absent" and both claim.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = now_ms();
    let ttl = millis(c.key_ttl);
    let expired_before = now.saturating_sub(ttl);
    let found = tx
        .query_row(
            "SELECT method, path, body_sha256, state, heartbeat_ms, status, headers, body,
                    content_type
             FROM idempotency WHERE account = ?1 AND idem_key = ?2",
            params![c.scope.account, c.scope.key],
            |r| {
                let state: String = r.get(3)?;
                let heartbeat_ms: i64 = r.get(4)?;
                Ok(Found {
                    method: r.get(0)?,
                    path: r.get(1)?,
                    body_sha256: r.get(2)?,
                    content_type: r.get(8)?,
                    completed: state == "completed",
                    held: false,
                    age_ms: now.saturating_sub(heartbeat_ms),
                    status: r.get(5)?,
                    headers: r.get(6)?,
                    body: r.get(7)?,
                })
            },
        )
        .optional()?;
    if let Some(found) = found {
        if found.age_ms <= ttl {
            // Nothing was written; dropping `tx` rolls the empty transaction back.
            return found.outcome(&c.fingerprint);
        }
        // Expired (no sign of life for a whole key window): the new claim replaces it below.
    } else {
        // The age of the oldest unexpired entry in the way: the first to make room.
        let oldest = |tx: &rusqlite::Transaction<'_>,
                      account: Option<&str>,
                      expired_before: i64|
         -> Result<Option<i64>, LedgerError> {
            let min: Option<i64> = match account {
                Some(a) => tx.query_row(
                    "SELECT min(heartbeat_ms) FROM idempotency
                     WHERE account = ?1 AND heartbeat_ms >= ?2",
                    params![a, expired_before],
                    |r| r.get(0),
                )?,
                None => tx.query_row(
                    "SELECT min(heartbeat_ms) FROM idempotency WHERE heartbeat_ms >= ?1",
                    params![expired_before],
                    |r| r.get(0),
                )?,
            };
            Ok(min.map(|m| now.saturating_sub(m)))
        };
        if let Some(per_account) = c.max_rows_per_account {
            let held = count(
                &tx,
                "SELECT count(*) FROM idempotency WHERE account = ?1 AND heartbeat_ms >= ?2",
                params![c.scope.account, expired_before],
            )?;
            if held >= per_account {
                let after = oldest(&tx, Some(&c.scope.account), expired_before)?;
                return Ok(Begin::Full {
                    retry_after: retry_after(c.key_ttl, after),
                });
            }
        }
        let mut held = count(&tx, "SELECT count(*) FROM idempotency", [])?;
        if held >= c.max_rows {
            // Expired entries are forgotten already: deleting them makes room. Nothing else
            // may go.
            tx.execute(
                "DELETE FROM idempotency WHERE heartbeat_ms < ?1",
                params![expired_before],
            )?;
            held = count(&tx, "SELECT count(*) FROM idempotency", [])?;
            if held >= c.max_rows {
                let after = oldest(&tx, None, expired_before)?;
                tx.commit()?;
                return Ok(Begin::Full {
                    retry_after: retry_after(c.key_ttl, after),
                });
            }
        }
    }
    tx.execute(
        "INSERT OR REPLACE INTO idempotency
             (account, idem_key, method, path, body_sha256, claim_token, state,
              created_ms, heartbeat_ms, content_type)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'running', ?7, ?7, ?8)",
        params![
            c.scope.account,
            c.scope.key,
            c.fingerprint.method,
            c.fingerprint.path,
            c.fingerprint.body_sha256.as_slice(),
            c.token.0,
            now,
            c.fingerprint.content_type
        ],
    )?;
    tx.commit()?;
    Ok(Begin::Claimed)
}

impl Ledger for SqliteLedger {
    fn begin<'a>(&'a self, claim: &'a ClaimRequest) -> LedgerFuture<'a, Begin> {
        let owned = claim.clone();
        Box::pin(self.call(move |conn| begin_sync(conn, &owned)))
    }

    fn heartbeat<'a>(&'a self, scope: &'a Scope, token: &'a ClaimToken) -> LedgerFuture<'a, ()> {
        let (scope, token) = (scope.clone(), token.clone());
        Box::pin(self.call(move |conn| {
            conn.execute(
                "UPDATE idempotency SET heartbeat_ms = ?4
                 WHERE account = ?1 AND idem_key = ?2 AND claim_token = ?3 AND state = 'running'",
                params![scope.account, scope.key, token.0, now_ms()],
            )?;
            Ok(())
        }))
    }

    fn complete<'a>(
        &'a self,
        scope: &'a Scope,
        token: &'a ClaimToken,
        answer: &'a StoredAnswer,
    ) -> LedgerFuture<'a, ()> {
        let (scope, token) = (scope.clone(), token.clone());
        let (status, headers, body) = (
            i64::from(answer.status),
            encode_headers(&answer.headers),
            answer.body.clone(),
        );
        Box::pin(self.call(move |conn| {
            conn.execute(
                "UPDATE idempotency
                 SET state = 'completed', status = ?4, headers = ?5, body = ?6, heartbeat_ms = ?7
                 WHERE account = ?1 AND idem_key = ?2 AND claim_token = ?3 AND state = 'running'",
                params![
                    scope.account,
                    scope.key,
                    token.0,
                    status,
                    headers,
                    body,
                    now_ms()
                ],
            )?;
            Ok(())
        }))
    }

    fn release<'a>(&'a self, scope: &'a Scope, token: &'a ClaimToken) -> LedgerFuture<'a, ()> {
        let (scope, token) = (scope.clone(), token.clone());
        Box::pin(self.call(move |conn| {
            conn.execute(
                "DELETE FROM idempotency
                 WHERE account = ?1 AND idem_key = ?2 AND claim_token = ?3 AND state = 'running'",
                params![scope.account, scope.key, token.0],
            )?;
            Ok(())
        }))
    }

    fn prune(&self, key_ttl: Duration) -> LedgerFuture<'_, u64> {
        Box::pin(self.call(move |conn| {
            let n = conn.execute(
                "DELETE FROM idempotency WHERE heartbeat_ms < ?1",
                params![now_ms().saturating_sub(millis(key_ttl))],
            )?;
            Ok(n as u64)
        }))
    }
}

#[cfg(feature = "test-support")]
impl crate::testing::Inspect for SqliteLedger {
    fn into_ledger(self: Arc<Self>) -> Arc<dyn Ledger> {
        self
    }

    fn entries(&self) -> LedgerFuture<'_, u64> {
        Box::pin(self.call(|conn| {
            let n: i64 = conn.query_row("SELECT count(*) FROM idempotency", [], |r| r.get(0))?;
            Ok(u64::try_from(n).unwrap_or(0))
        }))
    }

    fn clear(&self) -> LedgerFuture<'_, ()> {
        Box::pin(self.call(|conn| {
            conn.execute("DELETE FROM idempotency", [])?;
            Ok(())
        }))
    }
}
