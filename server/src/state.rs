//! [`App`]: the state every route shares, and how it is built from a [`Config`] (the
//! database, the idempotency ledger, the policies). The handlers (`auth`, `routes`,
//! `control_routes`) and the router (`app`) use it; it uses none of them.

use crate::client::ClientPolicy;
use crate::config::{AuthMode, Config, Mode};
use crate::control::Control;
use crate::limits::{Budget, LoginThrottle};
use crate::security::OriginPolicy;
use crate::store::{Db, SessionLife, Store};
use std::sync::Arc;
use std::time::Duration;
use sw_outbox_idempotency::testing::Inspect;
use sw_outbox_idempotency::{PgLedger, Settings, SqliteLedger};

/// Shared state of all routes.
#[derive(Clone)]
pub struct App {
    pub store: Store,
    /// The idempotency ledger; the control routes' reset clears it.
    pub ledger: Arc<dyn Inspect>,
    pub control: Arc<Control>,
    pub idempotency: Settings,
    pub mode: Mode,
    pub max_request_body: usize,
    pub origins: Arc<OriginPolicy>,
    /// A configured origin is https: cookies are `Secure` whatever the request says.
    pub https_origin: bool,
    pub session_life: SessionLife,
    pub session_max: Duration,
    /// Cookie sessions or bearer tokens (`--auth`).
    pub auth: AuthMode,
    /// Bearer mode: how long an access token lives.
    pub token_ttl: Duration,
    pub login_throttle: Arc<LoginThrottle>,
    /// Who a request comes from (the peer, or the client a trusted proxy names).
    pub clients: Arc<ClientPolicy>,
    pub write_budget: Arc<Budget>,
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl App {
    /// Opens the database and builds the state with the ledger `config.ledger` names (the
    /// SQLite ledger in `config.db` when it names none).
    pub async fn connect(config: &Config) -> Result<App, String> {
        let db = Db::open(&config.db).map_err(|e| format!("opening {}: {e}", config.db))?;
        let store = Store::new(db).map_err(|e| e.to_string())?;
        let ledger: Arc<dyn Inspect> = match &config.ledger {
            None => Arc::new(
                SqliteLedger::open_with(&config.db, config.ledger_lock_wait)
                    .map_err(|e| format!("opening the ledger in {}: {e}", config.db))?,
            ),
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                Arc::new(pg_ledger(config, url).await?)
            }
            Some(url) => {
                return Err(format!(
                "--ledger takes a postgres:// URL (got {url:?}); without it the ledger is in --db"
            ))
            }
        };
        Ok(App::with_ledger(config, store, ledger))
    }

    /// The state with another ledger backend.
    pub fn with_ledger(config: &Config, store: Store, ledger: Arc<dyn Inspect>) -> App {
        App {
            store,
            ledger,
            control: Arc::new(Control::new(config.request_log)),
            idempotency: config.idempotency.clone(),
            mode: config.mode,
            max_request_body: config.max_request_body,
            origins: Arc::new(OriginPolicy::new(config.origins.clone(), config.host)),
            https_origin: config.origins.iter().any(|o| o.starts_with("https://")),
            session_life: SessionLife {
                idle_ms: ms(config.session_idle),
                max_ms: ms(config.session_max),
            },
            session_max: config.session_max,
            auth: config.auth,
            token_ttl: config.token_ttl,
            login_throttle: Arc::new(LoginThrottle::new(config.login_throttle)),
            clients: Arc::new(ClientPolicy::new(
                config.trusted_proxies.clone(),
                config.forwarded_header,
            )),
            write_budget: Arc::new(Budget::new(config.write_budget)),
        }
    }
}

/// Connections the PostgreSQL ledger's pool keeps at most. Every ledger call holds one only
/// for a few round trips (a claim never stays open across the route), so a handful serves
/// many requests; the bound keeps several replicas well under PostgreSQL's default
/// `max_connections` (100).
pub const PG_POOL_SIZE: u32 = 16;

/// How long opening a PostgreSQL connection may take at start-up.
const PG_CONNECT_WAIT: Duration = Duration::from_secs(10);

/// The PostgreSQL ledger as an sqlx app builds it: its pool (TLS as the URL's `sslmode`
/// says), the ledger on it, and the migration run at start-up.
async fn pg_ledger(config: &Config, url: &str) -> Result<PgLedger, String> {
    // The URL may hold a password: errors name the backend, never the URL.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(PG_POOL_SIZE)
        .acquire_timeout(PG_CONNECT_WAIT)
        .connect(url)
        .await
        .map_err(|e| format!("connecting the PostgreSQL ledger: {e}"))?;
    let ledger = PgLedger::new(pool)
        .with_table(config.ledger_table.clone())
        .with_lock_wait(config.ledger_lock_wait);
    ledger
        .migrate()
        .await
        .map_err(|e| format!("creating the ledger table {}: {e}", config.ledger_table))?;
    Ok(ledger)
}
