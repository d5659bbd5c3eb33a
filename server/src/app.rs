//! The router and the pipeline every `/api/` request goes through, in this order:
//!
//! 1. logged in the requests log (test modes read it);
//! 2. network down → connection dropped;
//! 3. fault rules (`refuse`, `hang`, `status`, `outcome-unknown` act here, before anything
//!    is claimed; `drop-after-commit` and `delay` act around the route);
//! 4. data writes: session (401), CSRF (403), expected account (409) — nothing claimed yet;
//! 5. keyed data writes: key shape (400), then the ledger ([`crate::idempotency::run`]);
//! 6. the route.
//!
//! Auth routes skip 4 and 5: they are never queued by the outbox, and login has no
//! session to scope a key by.

use crate::auth::{self, CurrentSession};
use crate::config::{Config, LedgerTimings, Mode};
use crate::control::{self, Control, RequestEntry};
use crate::faults::Fault;
use crate::http_util::{default_cache_control, detail, drop_connection, header_str, storage_error};
use crate::idempotency;
use crate::ledger::{Ledger, Scope, SqliteLedger};
use crate::ledger_pg::PgLedger;
use crate::routes;
use crate::statics::{self, Www};
use crate::store::{Db, Store, WriteInfo};
use axum::body::{to_bytes, Body};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::Response;
use axum::routing::{any, get, patch, post};
use axum::Router;
use std::sync::Arc;

/// Shared state of all routes.
#[derive(Clone)]
pub struct App {
    pub store: Store,
    pub ledger: Arc<dyn Ledger>,
    pub control: Arc<Control>,
    pub timings: LedgerTimings,
    pub mode: Mode,
    pub max_request_body: usize,
}

impl App {
    /// Opens the database and builds the state with the SQLite ledger.
    pub fn open(config: &Config) -> Result<App, String> {
        let db = Db::open(&config.db).map_err(|e| format!("opening {}: {e}", config.db))?;
        let store = Store::new(db.clone()).map_err(|e| e.to_string())?;
        let ledger = SqliteLedger::new(db).map_err(|e| e.to_string())?;
        Ok(App::with_ledger(config, store, Arc::new(ledger)))
    }

    /// Like [`App::open`], but with the ledger `config.ledger` names, when it names one: the
    /// demo data stays in `config.db` either way.
    pub async fn connect(config: &Config) -> Result<App, String> {
        let Some(url) = &config.ledger else {
            return App::open(config);
        };
        if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
            return Err(format!(
                "--ledger takes a postgres:// URL (got {url:?}); without it the ledger is in --db"
            ));
        }
        let db = Db::open(&config.db).map_err(|e| format!("opening {}: {e}", config.db))?;
        let store = Store::new(db).map_err(|e| e.to_string())?;
        // The URL may hold a password: the error names the backend, never the URL.
        let ledger = PgLedger::connect(url).await.map_err(|e| e.to_string())?;
        Ok(App::with_ledger(config, store, Arc::new(ledger)))
    }

    /// The state with another [`Ledger`] backend.
    pub fn with_ledger(config: &Config, store: Store, ledger: Arc<dyn Ledger>) -> App {
        App {
            store,
            ledger,
            control: Arc::new(Control::default()),
            timings: config.timings,
            mode: config.mode,
            max_request_body: config.max_request_body,
        }
    }
}

pub fn router(app: App, www: Www) -> Router {
    let api = Router::new()
        .route("/api/auth/login", post(auth::login))
        .route("/api/auth/logout", post(auth::logout))
        .route("/api/auth/me", get(auth::me))
        .route(
            "/api/projects/{pid}/tasks",
            get(routes::list_tasks).post(routes::create_task),
        )
        .route(
            "/api/projects/{pid}/tasks/{id}",
            patch(routes::update_task).delete(routes::delete_task),
        )
        .route(
            "/api/notes",
            get(routes::list_notes).post(routes::create_note),
        )
        .route("/api/{*rest}", any(routes::not_found))
        .layer(from_fn_with_state(app.clone(), pipeline));
    let mut router = api;
    if app.mode.has_control() {
        router = router.merge(control::router());
    }
    router
        .with_state(app)
        .fallback_service(get(statics::serve).with_state(www))
}

fn is_write(method: &Method) -> bool {
    matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    )
}

/// `^/api/auth(/|\?|$)`, case-insensitively, as the outbox's `authRoutePattern`.
fn is_auth_route(path: &str) -> bool {
    let lower = path.to_ascii_lowercase();
    lower == "/api/auth" || lower.starts_with("/api/auth/")
}

async fn pipeline(State(app): State<App>, req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let path_q = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| path.clone());
    let headers = req.headers();
    let key = header_str(headers, "idempotency-key");
    let session = match auth::lookup(&app.store, headers) {
        Ok(s) => s,
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
    let fault = app.control.take_fault(method.as_str(), &path);
    let mut drop_after = false;
    let mut delay = None;
    match fault {
        Some(Fault::Refuse) => return drop_connection(),
        // Never answers; hyper drops this future when the client goes away.
        Some(Fault::Hang) => return std::future::pending::<Response>().await,
        Some(Fault::Status {
            status,
            retry_after,
        }) => {
            let code = StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
            let mut resp = detail(code, "injected");
            if let Some(v) = retry_after.and_then(|v| HeaderValue::from_str(&v).ok()) {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
            return finish(&app, seq, resp);
        }
        Some(Fault::OutcomeUnknown) => {
            let resp = detail(StatusCode::CONFLICT, "idempotency_outcome_unknown");
            return finish(&app, seq, resp);
        }
        Some(Fault::DropAfterCommit) => drop_after = true,
        Some(Fault::Delay(d)) => delay = Some(d),
        None => {}
    }

    let resp = handle(&app, req, next, session, key, &method, &path_q, delay).await;
    if drop_after {
        return drop_connection();
    }
    finish(&app, seq, resp)
}

fn finish(app: &App, seq: u64, mut resp: Response) -> Response {
    app.control.set_status(seq, resp.status().as_u16());
    default_cache_control(&mut resp, "no-store");
    resp
}

#[allow(clippy::too_many_arguments)]
async fn handle(
    app: &App,
    req: Request,
    next: Next,
    session: Option<crate::store::Session>,
    key: Option<String>,
    method: &Method,
    path_q: &str,
    delay: Option<std::time::Duration>,
) -> Response {
    let write = is_write(method) && !is_auth_route(req.uri().path());
    if write {
        if let Err(resp) = auth::check_write(session.as_ref(), req.headers()) {
            return resp;
        }
        if key.as_deref().is_some_and(|k| !idempotency::valid_key(k)) {
            return detail(StatusCode::BAD_REQUEST, "idempotency_key_invalid");
        }
    }

    let (mut parts, body) = req.into_parts();
    let bytes = match to_bytes(body, app.max_request_body).await {
        Ok(b) => b,
        Err(_) => return detail(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large"),
    };
    parts.extensions.insert(CurrentSession(session.clone()));
    parts.extensions.insert(WriteInfo {
        method: method.to_string(),
        path: path_q.to_owned(),
        key: key.clone(),
        body: String::from_utf8_lossy(&bytes).into_owned(),
    });
    let fp = idempotency::fingerprint(method.as_str(), path_q, &bytes);
    let req = Request::from_parts(parts, Body::from(bytes));
    let route = async move {
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        next.run(req).await
    };
    match (write, key, session) {
        (true, Some(key), Some(session)) => {
            let scope = Scope {
                account: session.user,
                key,
            };
            idempotency::run(app, scope, fp, route).await
        }
        _ => route.await,
    }
}
