//! The ledger in PostgreSQL (feature `postgres`), so several server replicas share one.
//!
//! Same semantics as [`crate::SqliteLedger`], row for row. What changes is how
//! [`Ledger::begin`] stays atomic when the racers are separate processes on separate
//! connections: one READ COMMITTED transaction does `INSERT … ON CONFLICT DO NOTHING`
//! (which waits for a concurrent, uncommitted insert of the same key and then sees it), and
//! when the row already existed, `SELECT … FOR UPDATE` (which waits for a concurrent claim
//! of an expired row and then re-reads the new version). Whoever inserts or replaces the row
//! commits its claim before returning; everyone else reads that claim. Two replicas can
//! therefore never both run the route for one key.
//!
//! Every wait is bounded by the lock wait: the pool's wait for a connection, and the
//! connections' `lock_timeout` for row and table locks. Either running out is
//! [`LedgerErrorKind::Busy`](crate::LedgerErrorKind). The row bound is checked after the
//! insert, so replicas claiming new keys at the same instant may pass it by at most their
//! number of concurrent claims.
//!
//! Plain TCP or a Unix socket, without TLS: the ledger is meant to sit next to the server
//! (loopback or a private network). A URL that demands TLS (`sslmode=require`) is refused
//! when connecting.

use crate::ledger::{
    decode_headers, encode_headers, Begin, ClaimRequest, ClaimToken, Ledger, LedgerError,
    LedgerFuture, Scope, StoredAnswer,
};
use crate::sqlite::DEFAULT_LOCK_WAIT;
use deadpool_postgres::{
    Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime, TimeoutType,
};
use std::time::Duration;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{IsolationLevel, NoTls};

/// Connections per server process. Every ledger call holds one only for a few round trips
/// (a claim never stays open across the route), so a handful serves many requests; the
/// bound keeps several replicas well under PostgreSQL's default `max_connections` (100).
pub const POOL_SIZE: usize = 16;

/// How long opening a connection may take: a database that does not answer must not hang
/// requests forever. (Not a lock wait: an unreachable database is a failure, not busy.)
const CONNECT_WAIT: Duration = Duration::from_secs(10);

/// Serialises schema creation across replicas starting at once: `CREATE TABLE IF NOT EXISTS`
/// is not safe against a concurrent twin. An arbitrary constant, scoped to the database.
const SCHEMA_LOCK: i64 = 0x5357_4f55_5442_4f58; // "SWOUTBOX"

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS idempotency (
    account TEXT NOT NULL,
    idem_key TEXT NOT NULL,
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    body_sha256 BYTEA NOT NULL,
    claim_token TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('running', 'completed')),
    created_ms BIGINT NOT NULL,
    heartbeat_ms BIGINT NOT NULL,
    status INTEGER,
    headers TEXT,
    body BYTEA,
    PRIMARY KEY (account, idem_key)
);
CREATE INDEX IF NOT EXISTS idempotency_created ON idempotency (created_ms);
";

/// Tables written before stored headers were a list kept `Content-Type` and `Location` in
/// columns of their own; their completed entries get the list, so they replay the same.
const UPGRADE: &str = "
DO $$
BEGIN
  IF EXISTS (SELECT 1 FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name = 'idempotency'
               AND column_name = 'content_type')
     AND NOT EXISTS (SELECT 1 FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name = 'idempotency'
               AND column_name = 'headers') THEN
    ALTER TABLE idempotency ADD COLUMN headers TEXT;
    UPDATE idempotency SET headers = (
      SELECT COALESCE(json_agg(json_build_array(h.n, h.v)), '[]'::json)::text
      FROM (VALUES ('content-type', content_type), ('location', location)) AS h(n, v)
      WHERE h.v IS NOT NULL)
    WHERE state = 'completed';
  END IF;
END $$;
";

const INSERT_CLAIM: &str = "
INSERT INTO idempotency
    (account, idem_key, method, path, body_sha256, claim_token, state, created_ms, heartbeat_ms)
VALUES ($1, $2, $3, $4, $5, $6, 'running', $7, $7)
ON CONFLICT (account, idem_key) DO NOTHING";

const SELECT_FOR_UPDATE: &str = "
SELECT method, path, body_sha256, state, created_ms, heartbeat_ms, status, headers, body
FROM idempotency WHERE account = $1 AND idem_key = $2
FOR UPDATE";

/// Replaces an expired entry by a fresh claim (SQLite's `INSERT OR REPLACE`).
const REPLACE_EXPIRED: &str = "
UPDATE idempotency
SET method = $3, path = $4, body_sha256 = $5, claim_token = $6, state = 'running',
    created_ms = $7, heartbeat_ms = $7, status = NULL, headers = NULL, body = NULL
WHERE account = $1 AND idem_key = $2";

/// The oldest completed or expired entries other than the new claim, skipping rows another
/// transaction holds (they are in use, and waiting for them would be an unbounded queue).
const EVICT: &str = "
DELETE FROM idempotency WHERE ctid IN (
    SELECT ctid FROM idempotency
    WHERE (state = 'completed' OR created_ms < $3) AND NOT (account = $1 AND idem_key = $2)
    ORDER BY created_ms LIMIT $4
    FOR UPDATE SKIP LOCKED)";

const HEARTBEAT: &str = "
UPDATE idempotency SET heartbeat_ms = $4
WHERE account = $1 AND idem_key = $2 AND claim_token = $3 AND state = 'running'";

const COMPLETE: &str = "
UPDATE idempotency SET state = 'completed', status = $4, headers = $5, body = $6
WHERE account = $1 AND idem_key = $2 AND claim_token = $3 AND state = 'running'";

/// How often `begin` starts over when the entry it collided with is deleted (pruned,
/// evicted or cleared) before it could lock it. Once is already rare; three times means
/// something is deleting the table in a loop.
const BEGIN_ATTEMPTS: usize = 3;

/// The ledger in a PostgreSQL database, through a pool of [`POOL_SIZE`] connections.
#[derive(Clone)]
pub struct PgLedger {
    pool: Pool,
}

/// The whole cause chain: tokio-postgres' own `Display` says only "db error". Wrappers
/// that already print their cause would repeat it, hence the suffix check.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let part = s.to_string();
        if !text.ends_with(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = s.source();
    }
    format!("postgres: {text}")
}

impl From<tokio_postgres::Error> for LedgerError {
    fn from(e: tokio_postgres::Error) -> Self {
        if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) {
            LedgerError::busy(chain(&e))
        } else {
            LedgerError::failed(chain(&e))
        }
    }
}

impl From<PoolError> for LedgerError {
    fn from(e: PoolError) -> Self {
        match e {
            PoolError::Timeout(TimeoutType::Wait) => LedgerError::busy(chain(&e)),
            PoolError::Backend(e) => e.into(),
            e => LedgerError::failed(chain(&e)),
        }
    }
}

impl PgLedger {
    /// Connects with [`DEFAULT_LOCK_WAIT`]; see [`PgLedger::connect_with`].
    pub async fn connect(url: &str) -> Result<PgLedger, LedgerError> {
        PgLedger::connect_with(url, DEFAULT_LOCK_WAIT).await
    }

    /// Connects to `url` (`postgres://user@host:port/db`, or the `key=value` form), checks
    /// that the database answers, and creates (or upgrades) the `idempotency` table.
    /// `lock_wait` bounds both the wait for a pooled connection and every lock wait inside
    /// the database (`lock_timeout`).
    pub async fn connect_with(url: &str, lock_wait: Duration) -> Result<PgLedger, LedgerError> {
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e: tokio_postgres::Error| LedgerError::failed(chain(&e)))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_WAIT);
        }
        if config.get_application_name().is_none() {
            config.application_name("sw-outbox-idempotency");
        }
        let lock_ms = lock_wait.as_millis().max(1);
        let options = match config.get_options() {
            Some(o) if !o.is_empty() => format!("{o} -c lock_timeout={lock_ms}"),
            _ => format!("-c lock_timeout={lock_ms}"),
        };
        config.options(&options);
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                // A broken connection shows as closed; a live one needs no test query.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(lock_wait))
            .create_timeout(Some(CONNECT_WAIT))
            .recycle_timeout(Some(CONNECT_WAIT))
            .build()
            .map_err(|e| LedgerError::failed(chain(&e)))?;
        let ledger = PgLedger { pool };
        ledger.create_schema().await?;
        Ok(ledger)
    }

    async fn client(&self) -> Result<Object, LedgerError> {
        Ok(self.pool.get().await?)
    }

    async fn create_schema(&self) -> Result<(), LedgerError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // The schema lock may wait for a twin's whole start-up: not bounded by lock_timeout.
        tx.batch_execute("SET LOCAL lock_timeout = 0").await?;
        tx.execute(&format!("SELECT pg_advisory_xact_lock({SCHEMA_LOCK})"), &[])
            .await?;
        tx.batch_execute(SCHEMA).await?;
        tx.batch_execute(UPGRADE).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn begin_async(&self, c: ClaimRequest<'_>) -> Result<Begin, LedgerError> {
        let mut client = self.client().await?;
        let sha = c.fingerprint.body_sha256.as_slice();
        let max_rows = i64::try_from(c.max_rows).unwrap_or(i64::MAX);
        for _ in 0..BEGIN_ATTEMPTS {
            // READ COMMITTED whatever the database's default: under REPEATABLE READ the
            // FOR UPDATE below would fail on a concurrent claim instead of reading it.
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::ReadCommitted)
                .start()
                .await?;
            let claim: [&(dyn ToSql + Sync); 7] = [
                &c.scope.account,
                &c.scope.key,
                &c.fingerprint.method,
                &c.fingerprint.path,
                &sha,
                &c.token.0,
                &c.now_ms,
            ];
            let insert = tx.prepare_cached(INSERT_CLAIM).await?;
            if tx.execute(&insert, &claim).await? == 1 {
                let count: i64 = tx
                    .query_one("SELECT count(*) FROM idempotency", &[])
                    .await?
                    .try_get(0)?;
                if count > max_rows {
                    let need = count - max_rows;
                    let evict = tx.prepare_cached(EVICT).await?;
                    let evicted = tx
                        .execute(
                            &evict,
                            &[&c.scope.account, &c.scope.key, &c.expired_before_ms, &need],
                        )
                        .await?;
                    if i64::try_from(evicted).unwrap_or(i64::MAX) < need {
                        tx.rollback().await?;
                        return Ok(Begin::Full);
                    }
                }
                tx.commit().await?;
                return Ok(Begin::Claimed);
            }
            let select = tx.prepare_cached(SELECT_FOR_UPDATE).await?;
            let Some(row) = tx
                .query_opt(&select, &[&c.scope.account, &c.scope.key])
                .await?
            else {
                // Deleted between the two statements (prune, evict, clear): start over.
                tx.rollback().await?;
                continue;
            };
            let created_ms: i64 = row.try_get(4)?;
            if created_ms >= c.expired_before_ms {
                let method: String = row.try_get(0)?;
                let path: String = row.try_get(1)?;
                let stored_sha: Vec<u8> = row.try_get(2)?;
                let state: String = row.try_get(3)?;
                let fp = c.fingerprint;
                let outcome =
                    if method != fp.method || path != fp.path || stored_sha != fp.body_sha256 {
                        Begin::Reused
                    } else if state == "completed" {
                        let status: Option<i32> = row.try_get(6)?;
                        let status =
                            status.and_then(|s| u16::try_from(s).ok()).ok_or_else(|| {
                                LedgerError::failed("completed entry without a status")
                            })?;
                        let headers: Option<String> = row.try_get(7)?;
                        Begin::Completed(StoredAnswer {
                            status,
                            headers: decode_headers(headers.as_deref())?,
                            body: row.try_get(8)?,
                        })
                    } else {
                        Begin::Running {
                            heartbeat_ms: row.try_get(5)?,
                        }
                    };
                // Nothing was written; this only releases the row lock.
                tx.rollback().await?;
                return Ok(outcome);
            }
            let replace = tx.prepare_cached(REPLACE_EXPIRED).await?;
            tx.execute(&replace, &claim).await?;
            tx.commit().await?;
            return Ok(Begin::Claimed);
        }
        Err(LedgerError::failed(format!(
            "the entry kept disappearing while being claimed ({BEGIN_ATTEMPTS} attempts)"
        )))
    }
}

impl Ledger for PgLedger {
    fn begin<'a>(&'a self, claim: ClaimRequest<'a>) -> LedgerFuture<'a, Begin> {
        Box::pin(self.begin_async(claim))
    }

    fn heartbeat<'a>(
        &'a self,
        scope: &'a Scope,
        token: &'a ClaimToken,
        now_ms: i64,
    ) -> LedgerFuture<'a, ()> {
        Box::pin(async move {
            let client = self.client().await?;
            let stmt = client.prepare_cached(HEARTBEAT).await?;
            client
                .execute(&stmt, &[&scope.account, &scope.key, &token.0, &now_ms])
                .await?;
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
            let client = self.client().await?;
            let stmt = client.prepare_cached(COMPLETE).await?;
            let headers = encode_headers(&answer.headers);
            client
                .execute(
                    &stmt,
                    &[
                        &scope.account,
                        &scope.key,
                        &token.0,
                        &i32::from(answer.status),
                        &headers,
                        &answer.body,
                    ],
                )
                .await?;
            Ok(())
        })
    }

    fn prune(&self, expired_before_ms: i64) -> LedgerFuture<'_, u64> {
        Box::pin(async move {
            let client = self.client().await?;
            Ok(client
                .execute(
                    "DELETE FROM idempotency WHERE created_ms < $1",
                    &[&expired_before_ms],
                )
                .await?)
        })
    }

    fn entries(&self) -> LedgerFuture<'_, u64> {
        Box::pin(async move {
            let client = self.client().await?;
            let n: i64 = client
                .query_one("SELECT count(*) FROM idempotency", &[])
                .await?
                .try_get(0)?;
            Ok(u64::try_from(n).unwrap_or(0))
        })
    }

    fn clear(&self) -> LedgerFuture<'_, ()> {
        Box::pin(async move {
            let client = self.client().await?;
            client.execute("DELETE FROM idempotency", &[]).await?;
            Ok(())
        })
    }
}
