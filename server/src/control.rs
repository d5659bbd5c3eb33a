//! The `/__control/` routes (demo and test modes only) and the state they drive: the
//! network switch, the fault rules, the requests log, and (bearer mode) expiring every
//! access token at once. The `applied` log lives in the
//! store, written in the same transaction as the data change it describes.

use crate::app::App;
use crate::faults::{self, Fault, Rule, RuleSpec};
use crate::http_util::{detail, json_response, parse_json, storage_error};
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::Response;
use axum::routing::{any, get, post};
use axum::Router;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

/// One `/api/` request as seen on arrival.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestEntry {
    pub seq: u64,
    pub method: String,
    pub path: String,
    pub key: Option<String>,
    pub expected_account: Option<String>,
    pub csrf: Option<String>,
    pub user: Option<String>,
    /// `None` while running, and forever when the connection was dropped or the client
    /// gave up.
    pub status: Option<u16>,
}

#[derive(Default)]
struct Inner {
    network_down: bool,
    rules: Vec<Rule>,
    /// The newest `log_limit` requests.
    requests: VecDeque<RequestEntry>,
    /// Entries dropped from the front to stay within the bound.
    dropped: u64,
    next_seq: u64,
}

/// The state the control routes drive. The requests log keeps at most `log_limit`
/// entries (the newest): a server that runs for weeks must not grow without end, and
/// with 0 (`prod`, where nothing can read it) nothing is logged.
pub struct Control {
    inner: Mutex<Inner>,
    log_limit: usize,
}

impl Control {
    /// Keeps the newest `log_limit` requests (0: none).
    pub fn new(log_limit: usize) -> Control {
        Control {
            inner: Mutex::new(Inner::default()),
            log_limit,
        }
    }

    /// How many requests the log holds now.
    pub fn logged(&self) -> usize {
        self.lock().requests.len()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn network_down(&self) -> bool {
        self.lock().network_down
    }

    /// The fault for this request, if a rule hits it (counting the hit).
    pub fn take_fault(&self, method: &str, path: &str) -> Option<Fault> {
        faults::take(&mut self.lock().rules, method, path)
    }

    /// Appends to the requests log (dropping the oldest entry past the bound); returns
    /// the entry's `seq`, 0 when nothing is logged.
    pub fn log_request(&self, mut entry: RequestEntry) -> u64 {
        if self.log_limit == 0 {
            return 0;
        }
        let mut inner = self.lock();
        inner.next_seq += 1;
        entry.seq = inner.next_seq;
        while inner.requests.len() >= self.log_limit {
            inner.requests.pop_front();
            inner.dropped += 1;
        }
        inner.requests.push_back(entry);
        inner.next_seq
    }

    pub fn set_status(&self, seq: u64, status: u16) {
        if seq == 0 {
            return;
        }
        let mut inner = self.lock();
        if let Some(e) = inner.requests.iter_mut().rev().find(|e| e.seq == seq) {
            e.status = Some(status);
        }
    }

    fn reset(&self) {
        *self.lock() = Inner::default();
    }
}

pub fn router(app: App) -> Router<App> {
    Router::new()
        .route("/__control/network", get(get_network).post(set_network))
        .route("/__control/faults", get(get_faults).post(set_faults))
        .route("/__control/applied", get(applied))
        .route("/__control/requests", get(requests))
        .route("/__control/reset", post(reset))
        .route("/__control/expire-tokens", post(expire_tokens))
        .route(
            "/__control/{*rest}",
            any(|| async { detail(StatusCode::NOT_FOUND, "not_found") }),
        )
        .layer(from_fn_with_state(app, own_origin_only))
}

/// The control routes can break and reset the server, so only the demo's own pages (and
/// clients that are not browser pages, such as the test harness) may use them: no CORS
/// grant, no private-network grant, and a `Host` that is this server (see
/// [`crate::security::OriginPolicy::control_allowed`]).
async fn own_origin_only(State(app): State<App>, req: Request, next: Next) -> Response {
    let mut resp = if app.origins.control_allowed(req.headers()) {
        next.run(req).await
    } else {
        detail(StatusCode::FORBIDDEN, "origin_refused")
    };
    resp.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

#[derive(Deserialize)]
struct NetworkBody {
    down: bool,
}

async fn get_network(State(app): State<App>) -> Response {
    json_response(
        StatusCode::OK,
        json!({ "down": app.control.network_down() }),
    )
}

async fn set_network(State(app): State<App>, body: Bytes) -> Response {
    let parsed: NetworkBody = match parse_json(&body) {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    app.control.lock().network_down = parsed.down;
    json_response(StatusCode::OK, json!({ "down": parsed.down }))
}

#[derive(Deserialize)]
struct FaultsBody {
    rules: Vec<RuleSpec>,
}

async fn get_faults(State(app): State<App>) -> Response {
    let rules = app.control.lock().rules.clone();
    json_response(StatusCode::OK, json!({ "rules": rules }))
}

async fn set_faults(State(app): State<App>, body: Bytes) -> Response {
    let parsed: FaultsBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return json_response(
                StatusCode::BAD_REQUEST,
                json!({ "detail": "invalid_rules", "error": e.to_string() }),
            )
        }
    };
    let rules: Result<Vec<Rule>, String> = parsed.rules.into_iter().map(Rule::from_spec).collect();
    match rules {
        Ok(rules) => {
            app.control.lock().rules = rules.clone();
            json_response(StatusCode::OK, json!({ "rules": rules }))
        }
        Err(e) => json_response(
            StatusCode::BAD_REQUEST,
            json!({ "detail": "invalid_rules", "error": e }),
        ),
    }
}

async fn applied(State(app): State<App>) -> Response {
    match app.store.applied() {
        Ok(applied) => json_response(StatusCode::OK, json!({ "applied": applied })),
        Err(e) => storage_error(e),
    }
}

async fn requests(State(app): State<App>) -> Response {
    let (requests, dropped) = {
        let inner = app.control.lock();
        (inner.requests.clone(), inner.dropped)
    };
    json_response(
        StatusCode::OK,
        json!({ "requests": requests, "dropped": dropped }),
    )
}

/// Bearer mode: every access token expires now, as after `--token-ttl` (refresh tokens
/// stay valid). Answers how many were live.
async fn expire_tokens(State(app): State<App>) -> Response {
    match app.store.expire_access_tokens(crate::http_util::now_ms()) {
        Ok(n) => json_response(StatusCode::OK, json!({ "expired": n })),
        Err(e) => storage_error(e),
    }
}

async fn reset(State(app): State<App>) -> Response {
    app.control.reset();
    if let Err(e) = app.store.reset() {
        return storage_error(e);
    }
    if let Err(e) = app.ledger.clear().await {
        return storage_error(e);
    }
    app.login_throttle.reset();
    app.write_budget.reset();
    json_response(StatusCode::OK, json!({ "ok": true }))
}
