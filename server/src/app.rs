//! The router and the pipeline every `/api/` request goes through, in this order:
//!
//! 1. logged in the requests log (test modes read it);
//! 2. network down → connection dropped;
//! 3. fault rules (`refuse`, `hang`, `status`, `outcome-unknown`, `redirect`, `stall-body`,
//!    `endless-body` act here, before anything is claimed; `drop-after-commit` acts after
//!    the answer; `delay` and `stored-status` act inside the ledger, in place of the route);
//! 4. writes: Origin / `Sec-Fetch-Site` (403); data writes then: session (401), CSRF (403),
//!    expected account (409), the session's write budget (429) — nothing claimed yet;
//! 5. the idempotency layer (`sw_outbox_idempotency`) for keyed data writes: key shape
//!    (400), claim, replay, wait…;
//! 6. the route.
//!
//! Auth routes skip the session checks and the ledger: they are never queued by the
//! outbox, and login has no session to scope a key by.

use crate::auth::{self, CurrentSession};
use crate::client::ClientPolicy;
use crate::config::{AuthMode, Config, Mode};
use crate::control::{self, Control, RequestEntry};
use crate::faults::{Fault, Injected};
use crate::http_util::{
    default_cache_control, detail, drop_connection, header_str, storage_error, too_many,
};
use crate::limits::{Budget, LoginThrottle};
use crate::routes;
use crate::security::OriginPolicy;
use crate::static_files;
use crate::store::{Db, SessionLife, Store, WriteMeta};
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{from_fn, from_fn_with_state, Next};
use axum::response::Response;
use axum::routing::{any, get, post};
use axum::Router;
use futures_util::stream::{self, StreamExt};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use sw_outbox_idempotency::testing::Inspect;
use sw_outbox_idempotency::{IdempotencyLayer, PgLedger, Settings, SqliteLedger};

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

/// `^/api/auth(/|\?|$)`, case-insensitively, as the outbox's `authRoutePattern`.
fn is_auth_route(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    lower == "/api/auth" || lower.starts_with("/api/auth/")
}

fn is_write(method: &Method) -> bool {
    matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    )
}

/// The account a keyed write is scoped by: the session the pipeline resolved. Auth routes
/// have none, so the layer lets them through.
fn account_of(parts: &Parts) -> Option<String> {
    if is_auth_route(parts.uri.path()) {
        return None;
    }
    let session = parts.extensions.get::<CurrentSession>()?.0.as_ref()?;
    Some(session.user.clone())
}

pub fn router(app: App, www: &Path) -> Router {
    let layer = IdempotencyLayer::new(app.ledger.clone().into_ledger(), account_of)
        .with_settings(app.idempotency.clone());
    let api = Router::new()
        .route("/api/auth/login", post(auth::login))
        .route("/api/auth/logout", post(auth::logout))
        .route("/api/auth/me", get(auth::me))
        .route("/api/auth/refresh", post(auth::refresh))
        .route(
            "/api/projects/{pid}/tasks",
            get(routes::list_tasks).post(routes::create_task),
        )
        .route(
            "/api/projects/{pid}/tasks/{id}",
            get(routes::get_task)
                .patch(routes::update_task)
                .delete(routes::delete_task),
        )
        .route(
            "/api/notes",
            get(routes::list_notes).post(routes::create_note),
        )
        .route("/api/{*rest}", any(routes::not_found))
        // Innermost first: the faults that stand in for the route, the ledger around
        // them, the pipeline around everything.
        .layer(from_fn(in_place_of_route))
        .layer(layer)
        .layer(from_fn_with_state(app.clone(), pipeline));
    let mut router = api;
    if app.mode.has_control() {
        router = router.merge(control::router(app.clone()));
    }
    router
        .with_state(app)
        .fallback_service(static_files::service(www))
}

/// A fault that acts inside the ledger, handed from the pipeline to [`in_place_of_route`].
#[derive(Clone, Debug)]
enum InnerFault {
    Delay(Duration),
    Answer(Injected),
}

/// Between the ledger and the route: `delay` waits (the key is already claimed), then runs
/// the route; `stored-status` answers instead of the route, and the ledger stores that.
async fn in_place_of_route(req: Request, next: Next) -> Response {
    match req.extensions().get::<InnerFault>().cloned() {
        Some(InnerFault::Answer(injected)) => injected.response(),
        Some(InnerFault::Delay(d)) => {
            tokio::time::sleep(d).await;
            next.run(req).await
        }
        None => next.run(req).await,
    }
}

/// Headers and the first bytes of a body, then nothing until the client goes away (hyper
/// drops the body when the connection closes).
fn stalled(status: u16, content_type: &str, prefix: &str) -> Response {
    let first = stream::once(std::future::ready(Ok::<_, std::io::Error>(Bytes::from(
        prefix.to_owned(),
    ))));
    let mut resp = Response::new(Body::from_stream(first.chain(stream::pending())));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    if let Ok(v) = HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    resp
}

/// Filler of an endless body: one chunk every [`ENDLESS_PACE`], so a client that never
/// stops reading gets about 1.6 MB a second, not as much as loopback can carry.
const ENDLESS_CHUNK: usize = 16 * 1024;
const ENDLESS_PACE: Duration = Duration::from_millis(10);

/// Headers, the first bytes of a body, then spaces without end (until the client goes
/// away): a body far larger than any client should read.
fn endless(status: u16, content_type: &str, prefix: &str) -> Response {
    let first = stream::once(std::future::ready(Ok::<_, std::io::Error>(Bytes::from(
        prefix.to_owned(),
    ))));
    let filler = Bytes::from(vec![b' '; ENDLESS_CHUNK]);
    let rest = stream::unfold(filler, |filler| async move {
        tokio::time::sleep(ENDLESS_PACE).await;
        Some((Ok(filler.clone()), filler))
    });
    let mut resp = Response::new(Body::from_stream(first.chain(rest)));
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    if let Ok(v) = HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    resp
}

fn redirect(status: u16, location: &str) -> Response {
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::FOUND);
    if let Ok(v) = HeaderValue::from_str(location) {
        resp.headers_mut().insert(header::LOCATION, v);
    }
    resp
}

async fn pipeline(State(app): State<App>, mut req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let path_q = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| path.clone());
    let headers = req.headers();
    let key = header_str(headers, "idempotency-key");
    let auth::Resolved {
        session,
        token_expired,
    } = match auth::resolve(&app, headers) {
        Ok(r) => r,
        Err(e) => return storage_error(e),
    };
    let seq = app.control.log_request(RequestEntry {
        seq: 0,
        method: method.to_string(),
        path: path_q.clone(),
        key: key.clone(),
        expected_account: header_str(headers, "x-pm-expected-account"),
        csrf: header_str(headers, "x-csrf-token"),
        user: session.as_ref().map(|s| s.user.clone()),
        status: None,
    });

    if app.control.network_down() {
        return drop_connection();
    }
    let mut drop_after = false;
    match app.control.take_fault(method.as_str(), &path) {
        Some(Fault::Refuse) => return drop_connection(),
        // Never answers; hyper drops this future when the client goes away.
        Some(Fault::Hang) => return std::future::pending::<Response>().await,
        Some(Fault::Status(injected)) => return finish(&app, seq, injected.response()),
        Some(Fault::OutcomeUnknown) => {
            let resp = detail(StatusCode::CONFLICT, "idempotency_outcome_unknown");
            return finish(&app, seq, resp);
        }
        Some(Fault::Redirect { status, location }) => {
            return finish(&app, seq, redirect(status, &location))
        }
        Some(Fault::StallBody {
            status,
            content_type,
            prefix,
        }) => return finish(&app, seq, stalled(status, &content_type, &prefix)),
        Some(Fault::EndlessBody {
            status,
            content_type,
            prefix,
        }) => return finish(&app, seq, endless(status, &content_type, &prefix)),
        Some(Fault::DropAfterCommit) => drop_after = true,
        Some(Fault::Delay(d)) => {
            req.extensions_mut().insert(InnerFault::Delay(d));
        }
        Some(Fault::StoredStatus(injected)) => {
            req.extensions_mut().insert(InnerFault::Answer(injected));
        }
        None => {}
    }

    if let Err(resp) = admit(&app, &req, session.as_ref(), &method, token_expired) {
        return finish(&app, seq, resp);
    }
    if req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        .is_some_and(|n| n > app.max_request_body)
    {
        let resp = detail(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large");
        return finish(&app, seq, resp);
    }
    req.extensions_mut().insert(CurrentSession(session));
    if token_expired {
        req.extensions_mut().insert(auth::TokenExpired);
    }
    req.extensions_mut().insert(WriteMeta {
        method: method.to_string(),
        path: path_q,
        key,
    });
    let resp = next.run(req).await;
    if drop_after {
        return drop_connection();
    }
    finish(&app, seq, resp)
}

/// The checks a write passes before anything is claimed.
fn admit(
    app: &App,
    req: &Request,
    session: Option<&crate::store::Session>,
    method: &Method,
    token_expired: bool,
) -> Result<(), Response> {
    // Bearer mode: an expired access token is refused as such on every API route but the
    // auth routes (a refresh, a sign-out), reads included, so a client knows to refresh.
    if token_expired && !is_auth_route(req.uri().path()) {
        return Err(auth::unauthorized(app.auth, true));
    }
    if !is_write(method) {
        return Ok(());
    }
    if !app.origins.write_allowed(req.headers()) {
        return Err(detail(StatusCode::FORBIDDEN, "origin_refused"));
    }
    if is_auth_route(req.uri().path()) {
        return Ok(());
    }
    auth::check_write(session, req.headers(), app.auth, token_expired)?;
    if let Some(s) = session {
        if let Err(wait) = app.write_budget.take(&s.sid, Instant::now()) {
            return Err(too_many("write_budget_exceeded", wait));
        }
    }
    Ok(())
}

fn finish(app: &App, seq: u64, mut resp: Response) -> Response {
    app.control.set_status(seq, resp.status().as_u16());
    default_cache_control(&mut resp, "no-store");
    resp
}
