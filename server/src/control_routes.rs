//! The `/__control/` routes (demo and test modes only): the network switch, the fault
//! rules, the requests log, the `applied` log, a reset, and (bearer mode) expiring every
//! access token at once. What they drive is `control::Control`, part of [`App`].

use crate::faults::{Rule, RuleSpec};
use crate::http_util::{detail, json_response, parse_json, storage_error};
use crate::state::App;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::Response;
use axum::routing::{any, get, post};
use axum::Router;
use serde::Deserialize;
use serde_json::json;

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
    app.control.set_network_down(parsed.down);
    json_response(StatusCode::OK, json!({ "down": parsed.down }))
}

#[derive(Deserialize)]
struct FaultsBody {
    rules: Vec<RuleSpec>,
}

async fn get_faults(State(app): State<App>) -> Response {
    let rules = app.control.rules();
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
            app.control.set_rules(rules.clone());
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
    let (requests, dropped) = app.control.requests();
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
