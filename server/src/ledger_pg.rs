//! The idempotency ledger in PostgreSQL, so several server replicas can share one ledger.
//!
//! Same semantics as [`crate::ledger::SqliteLedger`], row for row. What changes is how
//! [`Ledger::begin`] stays atomic when the racers are separate processes on separate
//! connections: one READ COMMITTED transaction does `INSERT … ON CONFLICT DO NOTHING`
//! (which waits for a concurrent, uncommitted insert of the same key and then sees it), and
//! when the row already existed, `SELECT … FOR UPDATE` (which waits for a concurrent claim
//! of an expired row and then re-reads the new version). Whoever inserts or replaces the row
//! commits its claim before returning; everyone else reads that claim. Two replicas can
//! therefore never both run the route for one key.
//!
//! Plain TCP or a Unix socket, without TLS: the ledger is meant to sit next to the server
//! (loopback or a private network). A URL that demands TLS (`sslmode=require`) is refused
//! when connecting.

use crate::ledger::{
    Begin, ClaimToken, Fingerprint, Ledger, LedgerError, LedgerFuture, Scope, StoredAnswer,
};
use deadpool_postgres::{
    Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime,
};
use std::time::Duration;
use tokio_postgres::{IsolationLevel, NoTls};

/// Connections per server process. Every ledger call holds one only for a few round trips
/// (a claim never stays open across the route), so a handful serves many requests; the
/// bound keeps several replicas well under PostgreSQL's default `max_connections` (100).
pub const POOL_SIZE: usize = 16;

/// How long a call waits for a connection (from the pool, or a new one) before failing with
/// a storage error: a database that does not answer must not hang requests forever.
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
    content_type TEXT,
    location TEXT,
    body BYTEA,
    PRIMARY KEY (account, idem_key)
);
CREATE INDEX IF NOT EXISTS idempotency_created ON idempotency (created_ms);
";

const INSERT_CLAIM: &str = "
INSERT INTO idempotency
    (account, idem_key, method, path, body_sha256, claim_token, state, created_ms, heartbeat_ms)
VALUES ($1, $2, $3, $4, $5, $6, 'running', $7, $7)
ON CONFLICT (account, idem_key) DO NOTHING";

const SELECT_FOR_UPDATE: &str = "
SELECT method, path, body_sha256, state, created_ms, heartbeat_ms,
       status, content_type, location, body
FROM idempotency WHERE account = $1 AND idem_key = $2
FOR UPDATE";

/// Replaces an expired entry by a fresh claim (SQLite's `INSERT OR REPLACE`).
const REPLACE_EXPIRED: &str = "
UPDATE idempotency
SET method = $3, path = $4, body_sha256 = $5, claim_token = $6, state = 'running',
    created_ms = $7, heartbeat_ms = $7,
    status = NULL, content_type = NULL, location = NULL, body = NULL
WHERE account = $1 AND idem_key = $2";

const HEARTBEAT: &str = "
UPDATE idempotency SET heartbeat_ms = $4
WHERE account = $1 AND idem_key = $2 AND claim_token = $3 AND state = 'running'";

const COMPLETE: &str = "
UPDATE idempotency
SET state = 'completed', status = $4, content_type = $5, location = $6, body = $7
WHERE account = $1 AND idem_key = $2 AND claim_token = $3 AND state = 'running'";

/// How often `begin` starts over when the entry it collided with is deleted (pruned or
/// cleared) before it could lock it. Once is already rare; three times means something is
/// deleting the table in a loop.
const BEGIN_ATTEMPTS: usize = 3;

/// The ledger in a PostgreSQL database, through a pool of [`POOL_SIZE`] connections.
#[derive(Clone)]
pub struct PgLedger {
    pool: Pool,
}

/// The whole cause chain: tokio-postgres' own `Display` says only "db error". Wrappers
/// that already print their cause would repeat it, hence the suffix check.
fn pg_error(e: &(dyn std::error::Error + 'static)) -> LedgerError {
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
    LedgerError(format!("postgres: {text}"))
}

impl From<tokio_postgres::Error> for LedgerError {
    fn from(e: tokio_postgres::Error) -> Self {
        pg_error(&e)
    }
}

impl From<PoolError> for LedgerError {
    fn from(e: PoolError) -> Self {
        pg_error(&e)
    }
}

impl PgLedger {
    /// Connects to `url` (`postgres://user@host:port/db`, or the `key=value` form), checks
    /// that the database answers, and creates the `idempotency` table if it is missing.
    pub async fn connect(url: &str) -> Result<PgLedger, LedgerError> {
        let mut config: tokio_postgres::Config = url
            .parse()
            .map_err(|e: tokio_postgres::Error| pg_error(&e))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_WAIT);
        }
        if config.get_application_name().is_none() {
            config.application_name("sw-outbox-server");
        }
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
            .wait_timeout(Some(CONNECT_WAIT))
            .create_timeout(Some(CONNECT_WAIT))
            .recycle_timeout(Some(CONNECT_WAIT))
            .build()
            .map_err(|e| pg_error(&e))?;
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
        tx.execute(&format!("SELECT pg_advisory_xact_lock({SCHEMA_LOCK})"), &[])
            .await?;
        tx.batch_execute(SCHEMA).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn begin_async(
        &self,
        scope: &Scope,
        fp: &Fingerprint,
        token: &ClaimToken,
        now_ms: i64,
        expired_before_ms: i64,
    ) -> Result<Begin, LedgerError> {
        let mut client = self.client().await?;
        let sha = fp.body_sha256.as_slice();
        for _ in 0..BEGIN_ATTEMPTS {
            // READ COMMITTED whatever the database's default: under REPEATABLE READ the
            // FOR UPDATE below would fail on a concurrent claim instead of reading it.
            let tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::ReadCommitted)
                .start()
                .await?;
            let claim = [
                &scope.account as &(dyn tokio_postgres::types::ToSql + Sync),
                &scope.key,
                &fp.method,
                &fp.path,
                &sha,
                &token.0,
                &now_ms,
            ];
            let insert = tx.prepare_cached(INSERT_CLAIM).await?;
            if tx.execute(&insert, &claim).await? == 1 {
                tx.commit().await?;
                return Ok(Begin::Claimed(token.clone()));
            }
            let select = tx.prepare_cached(SELECT_FOR_UPDATE).await?;
            let Some(row) = tx.query_opt(&select, &[&scope.account, &scope.key]).await? else {
                // Deleted between the two statements (prune, clear): start over.
                tx.rollback().await?;
                continue;
            };
            let created_ms: i64 = row.try_get(4)?;
            if created_ms >= expired_before_ms {
                let method: String = row.try_get(0)?;
                let path: String = row.try_get(1)?;
                let stored_sha: Vec<u8> = row.try_get(2)?;
                let state: String = row.try_get(3)?;
                let outcome =
                    if method != fp.method || path != fp.path || stored_sha != fp.body_sha256 {
                        Begin::Reused
                    } else if state == "completed" {
                        let status: Option<i32> = row.try_get(6)?;
                        let status =
                            status.and_then(|s| u16::try_from(s).ok()).ok_or_else(|| {
                                LedgerError("completed entry without a status".into())
                            })?;
                        let body: Option<Vec<u8>> = row.try_get(9)?;
                        Begin::Completed(StoredAnswer {
                            status,
                            content_type: row.try_get(7)?,
                            location: row.try_get(8)?,
                            body: body.unwrap_or_default(),
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
            return Ok(Begin::Claimed(token.clone()));
        }
        Err(LedgerError(format!(
            "the entry kept disappearing while being claimed ({BEGIN_ATTEMPTS} attempts)"
        )))
    }
}

impl Ledger for PgLedger {
    fn begin<'a>(
        &'a self,
        scope: &'a Scope,
        fingerprint: &'a Fingerprint,
        token: &'a ClaimToken,
        now_ms: i64,
        expired_before_ms: i64,
    ) -> LedgerFuture<'a, Begin> {
        Box::pin(self.begin_async(scope, fingerprint, token, now_ms, expired_before_ms))
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
            client
                .execute(
                    &stmt,
                    &[
                        &scope.account,
                        &scope.key,
                        &token.0,
                        &i32::from(answer.status),
                        &answer.content_type,
                        &answer.location,
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

    fn clear(&self) -> LedgerFuture<'_, ()> {
        Box::pin(async move {
            let client = self.client().await?;
            client.execute("DELETE FROM idempotency", &[]).await?;
            Ok(())
        })
    }
}
