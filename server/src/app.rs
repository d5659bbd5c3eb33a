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
use crate::control::RequestEntry;
use crate::control_routes;
use crate::faults::{Fault, Injected};
use crate::http_util::{
    default_cache_control, detail, drop_connection, header_str, storage_error, too_many,
};
use crate::routes;
use crate::static_files;
use crate::store::WriteMeta;
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
use std::time::{Duration, Instant};
use sw_outbox_idempotency::IdempotencyLayer;

/// The state every route shares (module `state`; named here too, as before).
pub use crate::state::App;

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
        router = router.merge(control_routes::router(app.clone()));
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
