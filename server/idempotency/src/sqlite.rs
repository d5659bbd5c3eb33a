//! The ledger in SQLite: a file (or `:memory:`) of its own, on one connection.
//!
//! SQLite calls block, so every call runs on tokio's blocking pool, never on a runtime
//! thread; the connection is taken through an async mutex whose wait is bounded by the lock
//! wait, and the connection's `busy_timeout` (the same bound) covers other processes on the
//! same file. A wait that runs out is [`LedgerErrorKind::Busy`](crate::LedgerErrorKind),
//! which the layer answers with 503 and `Retry-After: 1`.

use crate::ledger::{
    decode_headers, encode_headers, Begin, ClaimRequest, ClaimToken, Fingerprint, Ledger,
    LedgerError, LedgerFuture, Scope, StoredAnswer,
};
use rusqlite::{params, Connection, ErrorCode, OptionalExtension, TransactionBehavior};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

/// How long a ledger call waits for the connection or SQLite's write lock before it gives
/// up as busy.
pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(2);

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
    PRIMARY KEY (account, idem_key)
);
CREATE INDEX IF NOT EXISTS idempotency_created ON idempotency (created_ms);
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
        conn.execute_batch(SCHEMA)?;
        upgrade(&conn)?;
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

/// Tables written before stored headers were a list kept `Content-Type` and `Location` in
/// columns of their own; their completed entries get the list, so they replay the same.
fn upgrade(conn: &Connection) -> Result<(), LedgerError> {
    let mut stmt = conn.prepare("SELECT name FROM pragma_table_info('idempotency')")?;
    let columns: Vec<String> = stmt
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let has = |c: &str| columns.iter().any(|n| n == c);
    if has("headers") || !has("content_type") {
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
    Ok(())
}

/// The owned inputs of one `begin`, so it can move to the blocking pool.
struct OwnedClaim {
    scope: Scope,
    fp: Fingerprint,
    token: ClaimToken,
    now_ms: i64,
    expired_before_ms: i64,
    max_rows: u64,
}

type Row = (
    String,
    String,
    Vec<u8>,
    String,
    i64,
    i64,
    Option<i64>,
    Option<String>,
    Option<Vec<u8>>,
);

fn begin_sync(conn: &mut Connection, c: &OwnedClaim) -> Result<Begin, LedgerError> {
    // IMMEDIATE takes the write lock up front, so two processes on one file cannot both see
    // "absent" and both claim.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let row: Option<Row> = tx
        .query_row(
            "SELECT method, path, body_sha256, state, created_ms, heartbeat_ms,
                    status, headers, body
             FROM idempotency WHERE account = ?1 AND idem_key = ?2",
            params![c.scope.account, c.scope.key],
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
                ))
            },
        )
        .optional()?;
    let exists = row.is_some();
    if let Some((method, path, sha, state, created_ms, heartbeat_ms, status, headers, body)) = row {
        if created_ms >= c.expired_before_ms {
            let outcome = if method != c.fp.method || path != c.fp.path || sha != c.fp.body_sha256 {
                Begin::Reused
            } else if state == "completed" {
                let status = status
                    .and_then(|s| u16::try_from(s).ok())
                    .ok_or_else(|| LedgerError::failed("completed entry without a status"))?;
                Begin::Completed(StoredAnswer {
                    status,
                    headers: decode_headers(headers.as_deref())?,
                    body,
                })
            } else {
                Begin::Running { heartbeat_ms }
            };
            // Nothing was written; dropping `tx` rolls the empty transaction back.
            return Ok(outcome);
        }
    }
    if !exists {
        let count: i64 = tx.query_row("SELECT count(*) FROM idempotency", [], |r| r.get(0))?;
        let count = u64::try_from(count).unwrap_or(0);
        if count >= c.max_rows {
            let need = count - c.max_rows + 1;
            let evicted = tx.execute(
                "DELETE FROM idempotency WHERE rowid IN (
                     SELECT rowid FROM idempotency
                     WHERE state = 'completed' OR created_ms < ?1
                     ORDER BY created_ms LIMIT ?2)",
                params![c.expired_before_ms, i64::try_from(need).unwrap_or(i64::MAX)],
            )?;
            if (evicted as u64) < need {
                return Ok(Begin::Full);
            }
        }
    }
    tx.execute(
        "INSERT OR REPLACE INTO idempotency
             (account, idem_key, method, path, body_sha256, claim_token, state,
              created_ms, heartbeat_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'running', ?7, ?7)",
        params![
            c.scope.account,
            c.scope.key,
            c.fp.method,
            c.fp.path,
            c.fp.body_sha256.as_slice(),
            c.token.0,
            c.now_ms
        ],
    )?;
    tx.commit()?;
    Ok(Begin::Claimed)
}

impl Ledger for SqliteLedger {
    fn begin<'a>(&'a self, claim: ClaimRequest<'a>) -> LedgerFuture<'a, Begin> {
        let owned = OwnedClaim {
            scope: claim.scope.clone(),
            fp: claim.fingerprint.clone(),
            token: claim.token.clone(),
            now_ms: claim.now_ms,
            expired_before_ms: claim.expired_before_ms,
            max_rows: claim.max_rows,
        };
        Box::pin(self.call(move |conn| begin_sync(conn, &owned)))
    }

    fn heartbeat<'a>(
        &'a self,
        scope: &'a Scope,
        token: &'a ClaimToken,
        now_ms: i64,
    ) -> LedgerFuture<'a, ()> {
        let (scope, token) = (scope.clone(), token.clone());
        Box::pin(self.call(move |conn| {
            conn.execute(
                "UPDATE idempotency SET heartbeat_ms = ?4
                 WHERE account = ?1 AND idem_key = ?2 AND claim_token = ?3 AND state = 'running'",
                params![scope.account, scope.key, token.0, now_ms],
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
                "UPDATE idempotency SET state = 'completed', status = ?4, headers = ?5, body = ?6
                 WHERE account = ?1 AND idem_key = ?2 AND claim_token = ?3 AND state = 'running'",
                params![scope.account, scope.key, token.0, status, headers, body],
            )?;
            Ok(())
        }))
    }

    fn prune(&self, expired_before_ms: i64) -> LedgerFuture<'_, u64> {
        Box::pin(self.call(move |conn| {
            let n = conn.execute(
                "DELETE FROM idempotency WHERE created_ms < ?1",
                params![expired_before_ms],
            )?;
            Ok(n as u64)
        }))
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
