//! What the test files share: the two ledger backends, fast bounds, and a macro that runs
//! one case on each backend.

#![allow(dead_code)]

pub mod pg;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use sw_outbox_idempotency::testing::Inspect;
use sw_outbox_idempotency::{PgLedger, Settings, SettingsBuilder, SqliteLedger};

/// Where the ledger lives; the same cases run on each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Short bounds so every state is reached in test time (never asserted as durations).
pub fn fast() -> SettingsBuilder {
    Settings::builder()
        .in_progress_wait(Duration::from_millis(300))
        .in_progress_poll(Duration::from_millis(20))
        .heartbeat_every(Duration::from_millis(100))
        .stale_after(Duration::from_millis(600))
        .key_ttl(Duration::from_secs(3600))
}

pub fn fast_settings() -> Settings {
    fast().build().expect("valid settings")
}

/// A ledger the tests can also count and clear.
pub type TestLedger = Arc<dyn Inspect>;

/// The app's own pool, as an sqlx app has one, on `url`.
pub async fn pool(url: &str) -> sqlx::PgPool {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .connect(url)
        .await
        .expect("connect the pool")
}

/// A migrated PostgreSQL ledger on `url` with `lock_wait`.
pub async fn pg_ledger(url: &str, lock_wait: Duration) -> PgLedger {
    let l = PgLedger::new(pool(url).await).with_lock_wait(lock_wait);
    l.migrate().await.expect("migrate");
    l
}

/// A SQLite file in the temporary directory, deleted (with its WAL files) on drop.
pub struct TempDb(pub PathBuf);

impl TempDb {
    pub fn new(tag: &str) -> TempDb {
        static N: AtomicU64 = AtomicU64::new(0);
        TempDb(std::env::temp_dir().join(format!(
            "sw-outbox-idem-{tag}-{}-{}.sqlite",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        )))
    }

    pub fn path(&self) -> String {
        self.0.to_string_lossy().into_owned()
    }
}

impl Drop for TempDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.path()));
        }
    }
}

/// Where a second connection finds a ledger made by [`ledger_with`].
pub enum Place {
    Sqlite(TempDb),
    Postgres(String),
}

/// A ledger on `backend`, empty, with `lock_wait`; `None` when PostgreSQL tests are
/// skipped. The SQLite one is a file, so another connection can contend for it; the
/// PostgreSQL one is a fresh database.
pub async fn ledger_with(backend: Backend, lock_wait: Duration) -> Option<(TestLedger, Place)> {
    Some(match backend {
        Backend::Sqlite => {
            let file = TempDb::new("ledger");
            let l = SqliteLedger::open_with(&file.path(), lock_wait).expect("sqlite ledger");
            (Arc::new(l), Place::Sqlite(file))
        }
        Backend::Postgres => {
            let url = pg::server()?.fresh_database().await;
            let l = pg_ledger(&url, lock_wait).await;
            (Arc::new(l), Place::Postgres(url))
        }
    })
}

/// An empty ledger on `backend` (SQLite in memory); `None` when PostgreSQL tests are
/// skipped.
pub async fn ledger_on(backend: Backend) -> Option<TestLedger> {
    Some(match backend {
        Backend::Sqlite => Arc::new(SqliteLedger::open(":memory:").expect("sqlite ledger")),
        Backend::Postgres => {
            let url = pg::server()?.fresh_database().await;
            Arc::new(pg_ledger(&url, sw_outbox_idempotency::DEFAULT_LOCK_WAIT).await)
        }
    })
}

/// The same ledger as the layer takes it.
pub fn as_ledger(l: &TestLedger) -> Arc<dyn sw_outbox_idempotency::Ledger> {
    l.clone().into_ledger()
}

/// Generates, for each named `async fn(Backend)`, one `#[tokio::test]` in `mod sqlite` and
/// one in `mod postgres`: the same case on both ledgers.
#[macro_export]
macro_rules! on_both_ledgers {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::support::Backend::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::support::Backend::Postgres).await
                }
            )*
        }
    };
}
