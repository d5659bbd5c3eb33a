//! The ledger in PostgreSQL (feature `postgres`), on the app's own sqlx [`PgPool`], so
//! several server instances behind a load balancer share one ledger.
//!
//! Same rules as the SQLite ledger, row for row, with two things made for several
//! instances:
//!
//! - **Every time is the database's** (`statement_timestamp()`): a claim's time, its
//!   heartbeats, its completion, and every age compared with `stale_after` or `key_ttl`.
//!   Instances whose clocks disagree by minutes still agree on what is running, what is
//!   stale and what expired, because none of them reads its own clock for it.
//! - **Claims are atomic across connections**: one READ COMMITTED transaction does
//!   `INSERT … ON CONFLICT DO NOTHING` (which waits for a concurrent, uncommitted insert of
//!   the same key and then sees it) and, when the row already existed,
//!   `SELECT … FOR UPDATE` (which waits for a concurrent claim of an expired row and then
//!   reads the new version). Whoever inserts or replaces the row commits its claim before
//!   returning; everyone else reads that claim.
//!
//! Every call runs to its end in a task of its own, even when the request that made it goes
//! away: sqlx 0.8 can leave a pooled connection inside an open transaction when a future is
//! dropped during `BEGIN` (sqlx issue 4393), which would put the app's next queries on
//! that connection into a transaction nobody commits. A claim whose request went away before
//! its commit is rolled back instead of committed.
//!
//! Every wait is bounded by the lock wait: the wait for a pooled connection, and every
//! lock wait inside the database (`SET LOCAL lock_timeout` in each of the ledger's
//! transactions, so the app's other queries on the same pool keep their own settings).
//! Either running out is [`LedgerErrorKind::Busy`](crate::LedgerErrorKind). The row bounds
//! are checked after the insert, so instances claiming new keys at the same instant may
//! pass them by at most their number of concurrent claims.
//!
//! The table is the app's to create: [`PgLedger::migrate`] runs [`migration_sql`] (also in
//! the crate as `migrations/postgres/idempotency.sql`, for migration tools that take
//! files), under a configurable [`TableName`]. TLS is the pool's: with sqlx's `tls-*`
//! features (this crate's `postgres-rustls` is one) a URL's `sslmode=require` or
//! `verify-full` is honoured.

use crate::ledger::{
    encode_headers, millis, retry_after, Begin, ClaimRequest, ClaimToken, Found, Ledger,
    LedgerError, LedgerFuture, Scope, StoredAnswer, DEFAULT_LOCK_WAIT,
};
#[cfg(feature = "test-support")]
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgPool, Postgres};
use sqlx::{Row, Transaction};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// Serialises the migration across instances starting at once: `CREATE TABLE IF NOT
/// EXISTS` is not safe against a concurrent twin. An arbitrary constant, scoped to the
/// database.
const MIGRATION_LOCK: i64 = 0x5357_4f55_5442_4f58; // "SWOUTBOX"

/// The database's clock, in the ledger's unit (milliseconds since the Unix epoch): the
/// start of the current statement.
const NOW_MS: &str = "(extract(epoch from statement_timestamp()) * 1000)::bigint";

/// The columns a claim reads of an existing entry.
const ROW: &str = "SELECT method, path, body_sha256, state, content_type, held,
        (extract(epoch from statement_timestamp()) * 1000)::bigint - heartbeat_ms AS age_ms,
        status, headers, body";

/// How often `begin` starts over when the entry it collided with is deleted (pruned or
/// cleared) before it could lock it. Once is already rare; three times means something is
/// deleting the table in a loop.
const BEGIN_ATTEMPTS: usize = 3;

/// The ledger table's name: `name` or `schema.name`, each part lower-case ASCII letters,
/// digits and `_`, not starting with a digit (the table part at most 50 characters, so the
/// index names derived from it fit PostgreSQL's 63). Checked, because it goes into SQL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableName {
    schema: Option<String>,
    table: String,
}

/// A table name that [`TableName::new`] refused, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidTableName(String);

impl fmt::Display for InvalidTableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for InvalidTableName {}

impl Default for TableName {
    fn default() -> Self {
        TableName {
            schema: None,
            table: "idempotency".to_owned(),
        }
    }
}

impl TableName {
    /// Checks `name` (`idempotency`, `app.idempotency`).
    pub fn new(name: &str) -> Result<TableName, InvalidTableName> {
        let part = |p: &str, max: usize| -> Result<String, InvalidTableName> {
            let ok = !p.is_empty()
                && p.len() <= max
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                && !p.as_bytes()[0].is_ascii_digit();
            if ok {
                Ok(p.to_owned())
            } else {
                Err(InvalidTableName(format!(
                    "table name {name:?}: each part must be 1-{max} of [a-z0-9_], not starting \
                     with a digit"
                )))
            }
        };
        match name.split_once('.') {
            None => Ok(TableName {
                schema: None,
                table: part(name, 50)?,
            }),
            Some((schema, table)) => Ok(TableName {
                schema: Some(part(schema, 63)?),
                table: part(table, 50)?,
            }),
        }
    }

    /// `"schema"."table"` or `"table"`, quoted for SQL.
    fn quoted(&self) -> String {
        match &self.schema {
            Some(s) => format!("\"{s}\".\"{}\"", self.table),
            None => format!("\"{}\"", self.table),
        }
    }

    /// An index of this table named `<table>_<suffix>`, as `DROP INDEX` names it (in the
    /// table's schema).
    fn index(&self, suffix: &str) -> String {
        match &self.schema {
            Some(s) => format!("\"{s}\".\"{}_{suffix}\"", self.table),
            None => format!("\"{}_{suffix}\"", self.table),
        }
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.schema {
            Some(s) => write!(f, "{s}.{}", self.table),
            None => f.write_str(&self.table),
        }
    }
}

/// The SQL that creates the ledger table `table` (or upgrades one of an earlier layout),
/// idempotent: what [`PgLedger::migrate`] runs. For the default name it is the file
/// `migrations/postgres/idempotency.sql` of this crate.
pub fn migration_sql(table: &TableName) -> String {
    let t = table.quoted();
    let heartbeat_index = format!("\"{}_heartbeat\"", table.table);
    let old_index = table.index("created");
    // `to_regclass` takes the name as SQL text: the quoted name inside a literal (the name
    // has no quote of either kind in it).
    format!(
        "-- The sw-outbox-idempotency ledger (PostgreSQL). Safe to run again.
CREATE TABLE IF NOT EXISTS {t} (
    account TEXT NOT NULL,
    idem_key TEXT NOT NULL,
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    body_sha256 BYTEA NOT NULL,
    claim_token TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('running', 'completed')),
    -- Milliseconds since the Unix epoch, by the database's clock.
    created_ms BIGINT NOT NULL,
    -- The last sign of life: the claim, a heartbeat, or the completion.
    heartbeat_ms BIGINT NOT NULL,
    status INTEGER,
    headers TEXT,
    body BYTEA,
    -- The request's Content-Type (part of its fingerprint); NULL in entries from before it
    -- was, which match a retry of any type.
    content_type TEXT,
    -- Claimed in transactional mode: alive exactly while its row lock is held.
    held BOOLEAN NOT NULL DEFAULT false,
    PRIMARY KEY (account, idem_key)
);
-- A table of the first layout kept the answer's Content-Type and Location in columns of
-- their own: the answer's type moves into the stored headers, and the column is then the
-- request's, NULL for these entries.
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('{t}')
             AND attname = 'content_type' AND NOT attisdropped)
     AND NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('{t}')
             AND attname = 'headers' AND NOT attisdropped) THEN
    ALTER TABLE {t} ADD COLUMN headers TEXT;
    UPDATE {t} SET headers = (
      SELECT COALESCE(json_agg(json_build_array(h.n, h.v)), '[]'::json)::text
      FROM (VALUES ('content-type', content_type), ('location', location)) AS h(n, v)
      WHERE h.v IS NOT NULL)
    WHERE state = 'completed';
    UPDATE {t} SET content_type = NULL;
  END IF;
END $$;
-- Tables of the second layout: no request type, no transactional mode.
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS content_type TEXT;
ALTER TABLE {t} ADD COLUMN IF NOT EXISTS held BOOLEAN NOT NULL DEFAULT false;
-- Expiry and pruning go by the last sign of life.
CREATE INDEX IF NOT EXISTS {heartbeat_index} ON {t} (heartbeat_ms);
DROP INDEX IF EXISTS {old_index};
"
    )
}

/// The ledger's statements for one table.
#[derive(Debug)]
struct Sql {
    begin: String,
    insert: String,
    count_all: String,
    count_near_bound: String,
    count_account: String,
    oldest_all: String,
    oldest_account: String,
    lock_row: String,
    read_row: String,
    lock_own: String,
    replace: String,
    heartbeat: String,
    complete: String,
    release: String,
    prune: String,
}

impl Sql {
    fn new(table: &TableName, lock_wait: Duration) -> Sql {
        let t = table.quoted();
        let lock_ms = lock_wait.as_millis().max(1);
        let live = format!("heartbeat_ms >= {NOW_MS} - $1");
        Sql {
            // READ COMMITTED whatever the database's default: under REPEATABLE READ the
            // FOR UPDATE below would fail on a concurrent claim instead of reading it.
            begin: format!(
                "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = {lock_ms}"
            ),
            insert: format!(
                "INSERT INTO {t}
                     (account, idem_key, method, path, body_sha256, claim_token, state,
                      created_ms, heartbeat_ms, content_type, held)
                 VALUES ($1, $2, $3, $4, $5, $6, 'running', {NOW_MS}, {NOW_MS}, $7, $8)
                 ON CONFLICT (account, idem_key) DO NOTHING"
            ),
            count_all: format!("SELECT count(*) FROM {t}"),
            // Counting every row is a scan of the table, on every new key: most of a
            // claim's cost once the table holds tens of thousands of entries (the crate's
            // bench). The planner's estimate (kept by autovacuum's ANALYZE) says when the
            // table is far below the bound (under half of it, and 10 000 entries or more
            // short): then the count is skipped (-1). Near the bound it is exact.
            count_near_bound: format!(
                "SELECT CASE
                     WHEN c.reltuples >= 0 AND c.reltuples < $1::bigint::float8 / 2
                          AND $1::bigint::float8 - c.reltuples > 10000 THEN -1
                     ELSE (SELECT count(*) FROM {t})
                 END
                 FROM pg_class c WHERE c.oid = to_regclass('{t}')"
            ),
            count_account: format!("SELECT count(*) FROM {t} WHERE {live} AND account = $2"),
            oldest_all: format!("SELECT {NOW_MS} - min(heartbeat_ms) FROM {t} WHERE {live}"),
            oldest_account: format!(
                "SELECT {NOW_MS} - min(heartbeat_ms) FROM {t} WHERE {live} AND account = $2"
            ),
            // SKIP LOCKED: a row locked by another transaction (a route in transactional
            // mode, or another claim deciding this instant) is read without the lock
            // (`read_row`) instead of waited for.
            lock_row: format!(
                "{ROW} FROM {t} WHERE account = $1 AND idem_key = $2 FOR UPDATE SKIP LOCKED"
            ),
            read_row: format!("{ROW} FROM {t} WHERE account = $1 AND idem_key = $2"),
            lock_own: format!(
                "SELECT 1 FROM {t}
                 WHERE account = $1 AND idem_key = $2 AND claim_token = $3 AND state = 'running'
                 FOR UPDATE SKIP LOCKED"
            ),
            replace: format!(
                "UPDATE {t}
                 SET method = $3, path = $4, body_sha256 = $5, claim_token = $6,
                     state = 'running', created_ms = {NOW_MS}, heartbeat_ms = {NOW_MS},
                     status = NULL, headers = NULL, body = NULL, content_type = $7, held = $8
                 WHERE account = $1 AND idem_key = $2"
            ),
            heartbeat: format!(
                "UPDATE {t} SET heartbeat_ms = {NOW_MS}
                 WHERE account = $1 AND idem_key = $2 AND claim_token = $3 AND state = 'running'"
            ),
            complete: format!(
                "UPDATE {t}
                 SET state = 'completed', status = $4, headers = $5, body = $6,
                     heartbeat_ms = {NOW_MS}
                 WHERE account = $1 AND idem_key = $2 AND claim_token = $3 AND state = 'running'"
            ),
            release: format!(
                "DELETE FROM {t}
                 WHERE account = $1 AND idem_key = $2 AND claim_token = $3 AND state = 'running'"
            ),
            prune: format!("DELETE FROM {t} WHERE heartbeat_ms < {NOW_MS} - $1"),
        }
    }
}

impl From<sqlx::Error> for LedgerError {
    fn from(e: sqlx::Error) -> Self {
        let busy = match &e {
            sqlx::Error::PoolTimedOut => true,
            // lock_not_available: a `lock_timeout` ran out.
            sqlx::Error::Database(db) => db.code().as_deref() == Some("55P03"),
            _ => false,
        };
        if busy {
            LedgerError::busy(format!("postgres: {e}"))
        } else {
            LedgerError::failed(format!("postgres: {e}"))
        }
    }
}

/// The ledger in a PostgreSQL database, on a pool the app made (and may share with its own
/// queries). Cloning shares the pool.
#[derive(Clone)]
pub struct PgLedger {
    pool: PgPool,
    table: TableName,
    lock_wait: Duration,
    sql: Arc<Sql>,
}

impl fmt::Debug for PgLedger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgLedger")
            .field("table", &self.table.to_string())
            .field("lock_wait", &self.lock_wait)
            .field("pool_size", &self.pool.size())
            .finish_non_exhaustive()
    }
}

impl PgLedger {
    /// The ledger in the table `idempotency` of `pool`'s database, with
    /// [`DEFAULT_LOCK_WAIT`]. The table must exist: run [`PgLedger::migrate`] (or
    /// [`migration_sql`] in your own migrations) first.
    pub fn new(pool: PgPool) -> PgLedger {
        PgLedger::with(pool, TableName::default(), DEFAULT_LOCK_WAIT)
    }

    fn with(pool: PgPool, table: TableName, lock_wait: Duration) -> PgLedger {
        let sql = Arc::new(Sql::new(&table, lock_wait));
        PgLedger {
            pool,
            table,
            lock_wait,
            sql,
        }
    }

    /// The same ledger in another table.
    pub fn with_table(self, table: TableName) -> PgLedger {
        PgLedger::with(self.pool, table, self.lock_wait)
    }

    /// The same ledger with another bound on every wait: for a pooled connection, and for
    /// any lock inside the database.
    pub fn with_lock_wait(self, lock_wait: Duration) -> PgLedger {
        PgLedger::with(self.pool, self.table, lock_wait)
    }

    /// The pool the ledger uses.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The ledger's table.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// Creates the table (or upgrades one of an earlier layout): [`migration_sql`], in one
    /// transaction, serialised across instances that start at once. Safe to run at every
    /// start.
    pub async fn migrate(&self) -> Result<(), LedgerError> {
        let mut tx = self.pool.begin().await?;
        // `CREATE … IF NOT EXISTS` on a table that exists is a NOTICE ("already exists,
        // skipping"), which sqlx logs as a warning: not on every start.
        sqlx::query("SET LOCAL client_min_messages = warning")
            .execute(&mut *tx)
            .await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *tx)
            .await?;
        sqlx::raw_sql(&migration_sql(&self.table))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    #[cfg(feature = "test-support")]
    async fn acquire(&self) -> Result<PoolConnection<Postgres>, LedgerError> {
        tokio::time::timeout(self.lock_wait, self.pool.acquire())
            .await
            .map_err(|_| self.no_connection())?
            .map_err(LedgerError::from)
    }

    fn no_connection(&self) -> LedgerError {
        LedgerError::busy(format!(
            "postgres: no pooled connection within {:?}",
            self.lock_wait
        ))
    }

    /// A transaction of the ledger's kind (READ COMMITTED, lock waits bounded) on a pooled
    /// connection it owns, so it can outlive the call (transactional mode hands it to the
    /// route).
    pub(crate) async fn transaction(&self) -> Result<Transaction<'static, Postgres>, LedgerError> {
        tokio::time::timeout(self.lock_wait, self.pool.begin_with(self.sql.begin.clone()))
            .await
            .map_err(|_| self.no_connection())?
            .map_err(LedgerError::from)
    }

    /// Claims `c`: [`Hold::Committed`] commits a new claim before returning (the plain
    /// layer); [`Hold::Locked`] returns it in an open transaction holding its row lock (the
    /// route's transaction in transactional mode). `alive` says whether the request that
    /// asked still waits: a new claim is committed only for one that will run the route.
    pub(crate) async fn claim(
        &self,
        c: &ClaimRequest,
        hold: Hold,
        alive: &(dyn Fn() -> bool + Send + Sync),
    ) -> Result<Claim, LedgerError> {
        let sql = &*self.sql;
        let ttl = millis(c.key_ttl);
        let (account, key) = (&c.scope.account, &c.scope.key);
        let fp = &c.fingerprint;
        let sha = fp.body_sha256.as_slice();
        let held = hold == Hold::Locked;
        for _ in 0..BEGIN_ATTEMPTS {
            let mut tx = self.transaction().await?;
            let inserted = sqlx::query(&sql.insert)
                .bind(account)
                .bind(key)
                .bind(&fp.method)
                .bind(&fp.path)
                .bind(sha)
                .bind(&c.token.0)
                .bind(&fp.content_type)
                .bind(held)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            if inserted == 1 {
                if let Some(full) = self.over_bounds(&mut tx, c).await? {
                    tx.rollback().await?;
                    return Ok(Claim::Decided(full));
                }
                if !alive() {
                    tx.rollback().await?;
                    return Err(LedgerError::failed(
                        "postgres: the request went away before its claim was committed",
                    ));
                }
                tx.commit().await?;
                return match hold {
                    Hold::Committed => Ok(Claim::Decided(Begin::Claimed)),
                    Hold::Locked => self.lock_own(c).await,
                };
            }
            let found = match sqlx::query(&sql.lock_row)
                .bind(account)
                .bind(key)
                .fetch_optional(&mut *tx)
                .await?
            {
                Some(row) => found(&row)?,
                None => {
                    // Locked by another transaction, or deleted (prune, clear) since the insert.
                    let row = sqlx::query(&sql.read_row)
                        .bind(account)
                        .bind(key)
                        .fetch_optional(&mut *tx)
                        .await?;
                    tx.rollback().await?;
                    let Some(row) = row else {
                        continue;
                    };
                    return Ok(Claim::Decided(locked_outcome(found(&row)?, fp, ttl)?));
                }
            };
            // We hold its lock. A transactional claim still running without its lock is one
            // whose transaction ended without committing (its process died, or it never
            // started its route): nothing of its write was committed, so it is taken over,
            // as an expired entry is.
            let abandoned = found.held && !found.completed && found.matches(fp);
            if found.age_ms <= ttl && !abandoned {
                // Nothing was written; this only releases the row lock.
                tx.rollback().await?;
                return Ok(Claim::Decided(found.outcome(fp)?));
            }
            sqlx::query(&sql.replace)
                .bind(account)
                .bind(key)
                .bind(&fp.method)
                .bind(&fp.path)
                .bind(sha)
                .bind(&c.token.0)
                .bind(&fp.content_type)
                .bind(held)
                .execute(&mut *tx)
                .await?;
            return match hold {
                Hold::Committed if !alive() => {
                    tx.rollback().await?;
                    Err(LedgerError::failed(
                        "postgres: the request went away before its claim was committed",
                    ))
                }
                Hold::Committed => {
                    tx.commit().await?;
                    Ok(Claim::Decided(Begin::Claimed))
                }
                // Uncommitted: if this transaction ends without committing, the entry is
                // as it was, and the next retry takes it over in turn.
                Hold::Locked => Ok(Claim::Locked(tx)),
            };
        }
        Err(LedgerError::failed(format!(
            "the entry kept disappearing while being claimed ({BEGIN_ATTEMPTS} attempts)"
        )))
    }

    /// `Some(Full)` when the new claim in `tx` passes a row bound.
    async fn over_bounds(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        c: &ClaimRequest,
    ) -> Result<Option<Begin>, LedgerError> {
        let sql = &*self.sql;
        let ttl = millis(c.key_ttl);
        let account = &c.scope.account;
        if let Some(per_account) = c.max_rows_per_account {
            let held: i64 = sqlx::query_scalar(&sql.count_account)
                .bind(ttl)
                .bind(account)
                .fetch_one(&mut **tx)
                .await?;
            if u64::try_from(held).unwrap_or(0) > per_account {
                let oldest: Option<i64> = sqlx::query_scalar(&sql.oldest_account)
                    .bind(ttl)
                    .bind(account)
                    .fetch_one(&mut **tx)
                    .await?;
                return Ok(Some(Begin::Full {
                    retry_after: retry_after(c.key_ttl, oldest),
                }));
            }
        }
        let mut held: i64 = sqlx::query_scalar(&sql.count_near_bound)
            .bind(i64::try_from(c.max_rows).unwrap_or(i64::MAX))
            .fetch_one(&mut **tx)
            .await?;
        if u64::try_from(held).unwrap_or(0) > c.max_rows {
            // Expired entries are forgotten already: deleting them makes room. Nothing
            // else may go.
            sqlx::query(&sql.prune).bind(ttl).execute(&mut **tx).await?;
            held = sqlx::query_scalar(&sql.count_all)
                .fetch_one(&mut **tx)
                .await?;
            if u64::try_from(held).unwrap_or(0) > c.max_rows {
                let oldest: Option<i64> = sqlx::query_scalar(&sql.oldest_all)
                    .bind(ttl)
                    .fetch_one(&mut **tx)
                    .await?;
                return Ok(Some(Begin::Full {
                    retry_after: retry_after(c.key_ttl, oldest),
                }));
            }
        }
        Ok(None)
    }

    /// Takes the row lock of the claim just committed, in the transaction the route will
    /// get. Between the two, a retry may have taken the claim over (it read it as
    /// abandoned): then this request waits for that one's answer like any copy.
    async fn lock_own(&self, c: &ClaimRequest) -> Result<Claim, LedgerError> {
        let mut tx = self.transaction().await?;
        let mine = sqlx::query(&self.sql.lock_own)
            .bind(&c.scope.account)
            .bind(&c.scope.key)
            .bind(&c.token.0)
            .fetch_optional(&mut *tx)
            .await?;
        if mine.is_some() {
            return Ok(Claim::Locked(tx));
        }
        tx.rollback().await?;
        Ok(Claim::Decided(Begin::Running {
            since_heartbeat: Duration::ZERO,
        }))
    }

    /// Completes the claim in `tx` with `answer` and commits: the route's writes and the
    /// key's answer together, or neither.
    pub(crate) async fn complete_in(
        &self,
        mut tx: Transaction<'static, Postgres>,
        scope: &Scope,
        token: &ClaimToken,
        answer: &StoredAnswer,
    ) -> Result<(), LedgerError> {
        sqlx::query(&self.sql.complete)
            .bind(&scope.account)
            .bind(&scope.key)
            .bind(&token.0)
            .bind(i32::from(answer.status))
            .bind(encode_headers(&answer.headers))
            .bind(answer.body.as_deref())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Removes the claim in `tx` (its route never started) and commits.
    pub(crate) async fn release_in(
        &self,
        mut tx: Transaction<'static, Postgres>,
        scope: &Scope,
        token: &ClaimToken,
    ) -> Result<(), LedgerError> {
        sqlx::query(&self.sql.release)
            .bind(&scope.account)
            .bind(&scope.key)
            .bind(&token.0)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }
}

/// How a new claim is held while its route runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hold {
    /// Committed before the route runs, alive by its heartbeat (the plain layer).
    Committed,
    /// Held by its row lock in the route's own transaction (transactional mode).
    Locked,
}

/// What [`PgLedger::claim`] came to.
pub(crate) enum Claim {
    /// Anything but a claim held in a transaction.
    Decided(Begin),
    /// Claimed, in this transaction, which holds the row lock.
    Locked(Transaction<'static, Postgres>),
}

fn found(row: &sqlx::postgres::PgRow) -> Result<Found, LedgerError> {
    let state: String = row.try_get("state")?;
    Ok(Found {
        method: row.try_get("method")?,
        path: row.try_get("path")?,
        body_sha256: row.try_get("body_sha256")?,
        content_type: row.try_get("content_type")?,
        completed: state == "completed",
        held: row.try_get("held")?,
        age_ms: row.try_get("age_ms")?,
        status: row.try_get::<Option<i32>, _>("status")?.map(i64::from),
        headers: row.try_get("headers")?,
        body: row.try_get("body")?,
    })
}

/// The outcome for an entry another transaction holds locked: a running claim is alive by
/// that lock; a completed one is final (replayed, or another request's); an expired one is
/// being replaced this instant.
fn locked_outcome(
    found: Found,
    fp: &crate::ledger::Fingerprint,
    ttl: i64,
) -> Result<Begin, LedgerError> {
    if found.age_ms > ttl {
        return Ok(Begin::Running {
            since_heartbeat: Duration::ZERO,
        });
    }
    Ok(match found.outcome(fp)? {
        Begin::Running { .. } => Begin::Running {
            since_heartbeat: Duration::ZERO,
        },
        other => other,
    })
}

/// Runs a ledger call in a task of its own, to its end whatever becomes of the caller (see
/// the module documentation); the call is told whether the caller still waits.
fn detached<T, F, Fut>(call: F) -> LedgerFuture<'static, T>
where
    T: Send + 'static,
    F: FnOnce(Alive) -> Fut,
    Fut: std::future::Future<Output = Result<T, LedgerError>> + Send + 'static,
{
    let (send, receive) = tokio::sync::oneshot::channel();
    let waiting = Arc::new(std::sync::Mutex::new(Some(send)));
    let alive: Alive = {
        let waiting = waiting.clone();
        Arc::new(move || {
            waiting
                .lock()
                .map(|s| s.as_ref().is_some_and(|s| !s.is_closed()))
                .unwrap_or(false)
        })
    };
    let fut = call(alive);
    tokio::spawn(async move {
        let result = fut.await;
        if let Some(send) = waiting.lock().ok().and_then(|mut s| s.take()) {
            let _ = send.send(result);
        }
    });
    Box::pin(async move {
        receive
            .await
            .map_err(|_| LedgerError::failed("postgres: the ledger call did not finish"))?
    })
}

/// Whether the caller of a detached call still waits for its result.
pub(crate) type Alive = Arc<dyn Fn() -> bool + Send + Sync>;

impl Ledger for PgLedger {
    fn begin<'a>(&'a self, claim: &'a ClaimRequest) -> LedgerFuture<'a, Begin> {
        let (ledger, claim) = (self.clone(), claim.clone());
        detached(move |alive| async move {
            match ledger.claim(&claim, Hold::Committed, &*alive).await? {
                Claim::Decided(begin) => Ok(begin),
                // Never: only `Hold::Locked` returns an open transaction.
                Claim::Locked(tx) => {
                    tx.rollback().await?;
                    Err(LedgerError::failed(
                        "postgres: a plain claim came back uncommitted",
                    ))
                }
            }
        })
    }

    fn heartbeat<'a>(&'a self, scope: &'a Scope, token: &'a ClaimToken) -> LedgerFuture<'a, ()> {
        let (ledger, scope, token) = (self.clone(), scope.clone(), token.clone());
        detached(move |_| async move {
            ledger
                .statement(&ledger.sql.heartbeat, &scope, &token)
                .await
        })
    }

    fn complete<'a>(
        &'a self,
        scope: &'a Scope,
        token: &'a ClaimToken,
        answer: &'a StoredAnswer,
    ) -> LedgerFuture<'a, ()> {
        let (ledger, scope, token) = (self.clone(), scope.clone(), token.clone());
        let answer = answer.clone();
        detached(move |_| async move {
            let tx = ledger.transaction().await?;
            ledger.complete_in(tx, &scope, &token, &answer).await
        })
    }

    fn prune(&self, key_ttl: Duration) -> LedgerFuture<'_, u64> {
        let ledger = self.clone();
        detached(move |_| async move { ledger.prune_async(key_ttl).await })
    }

    fn release<'a>(&'a self, scope: &'a Scope, token: &'a ClaimToken) -> LedgerFuture<'a, ()> {
        let (ledger, scope, token) = (self.clone(), scope.clone(), token.clone());
        detached(
            move |_| async move { ledger.statement(&ledger.sql.release, &scope, &token).await },
        )
    }
}

impl PgLedger {
    /// One statement on a claim (`$1` account, `$2` key, `$3` token) in a transaction of
    /// its own.
    async fn statement(
        &self,
        sql: &str,
        scope: &Scope,
        token: &ClaimToken,
    ) -> Result<(), LedgerError> {
        let mut tx = self.transaction().await?;
        sqlx::query(sql)
            .bind(&scope.account)
            .bind(&scope.key)
            .bind(&token.0)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn prune_async(&self, key_ttl: Duration) -> Result<u64, LedgerError> {
        let mut tx = self.transaction().await?;
        let n = sqlx::query(&self.sql.prune)
            .bind(millis(key_ttl))
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        Ok(n)
    }
}

#[cfg(feature = "test-support")]
impl crate::testing::Inspect for PgLedger {
    fn into_ledger(self: Arc<Self>) -> Arc<dyn Ledger> {
        self
    }

    fn entries(&self) -> LedgerFuture<'_, u64> {
        Box::pin(async move {
            let mut conn = self.acquire().await?;
            let n: i64 = sqlx::query_scalar(&self.sql.count_all)
                .fetch_one(&mut *conn)
                .await?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    fn clear(&self) -> LedgerFuture<'_, ()> {
        Box::pin(async move {
            let mut conn = self.acquire().await?;
            let clear = format!("DELETE FROM {}", self.table.quoted());
            sqlx::query(&clear).execute(&mut *conn).await?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_checked() {
        for ok in ["idempotency", "app.idempotency", "_x", "t1", "ledger_v2"] {
            assert_eq!(TableName::new(ok).expect(ok).to_string(), ok);
        }
        for bad in [
            "",
            "Idempotency",
            "1t",
            "a.b.c",
            "a.",
            ".a",
            "has space",
            "x\"; DROP TABLE users; --",
            "t'",
            &"t".repeat(51),
        ] {
            assert!(TableName::new(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            TableName::new(&"t".repeat(50)).map(|t| t.table.len()),
            Ok(50)
        );
    }

    /// The file is for apps whose migration tool takes files; it must say what `migrate`
    /// runs. `SW_OUTBOX_WRITE_MIGRATION=1` rewrites it after a change of the SQL.
    #[test]
    fn the_migration_file_is_the_default_migration() {
        let sql = migration_sql(&TableName::default());
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/migrations/postgres/idempotency.sql"
        );
        if std::env::var("SW_OUTBOX_WRITE_MIGRATION").is_ok_and(|v| v == "1") {
            std::fs::write(path, &sql).expect("write the migration file");
        }
        let file = std::fs::read_to_string(path).expect("the migration file");
        assert_eq!(file, sql, "{path} differs from migration_sql()");
    }

    #[test]
    fn names_are_quoted_everywhere() {
        let t = TableName::new("app.ledger").expect("valid");
        let sql = migration_sql(&t);
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS \"app\".\"ledger\" ("));
        assert!(
            sql.contains("CREATE INDEX IF NOT EXISTS \"ledger_heartbeat\" ON \"app\".\"ledger\"")
        );
        assert!(sql.contains("DROP INDEX IF EXISTS \"app\".\"ledger_created\""));
        assert!(!sql.contains("\"idempotency"), "no default name left");
        let q = Sql::new(&t, Duration::from_millis(1500));
        assert!(q.insert.contains("INSERT INTO \"app\".\"ledger\""));
        assert!(q.begin.ends_with("lock_timeout = 1500"));
    }
}
