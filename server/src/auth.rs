//! Cookie sessions, CSRF and the login throttle for the two demo accounts.
//!
//! The session id travels in an HttpOnly, `SameSite=Strict` cookie (script cannot read it,
//! and no other site's page can make the browser send it), `Secure` when the site is served
//! over https. Sessions end after `session_idle` without use and `session_max` after
//! sign-in. The CSRF token is handed to the page (and to the worker, via `/api/auth/me`)
//! and must come back in `X-CSRF-Token` on every data write.

use crate::app::App;
use crate::http_util::{
    constant_time_eq, detail, json_response, now_ms, parse_json, random_token, read_body,
    storage_error, too_many,
};
use crate::security::served_over_https;
use crate::store::{Session, SessionLife, Store, StoreError};
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use axum::Extension;
use serde::Deserialize;
use serde_json::json;
use std::net::SocketAddr;
use std::time::Instant;

pub const SESSION_COOKIE: &str = "sid";
const ACCOUNTS: &[&str] = &["alice", "bob"];

/// The session the request's cookie names, resolved once by the pipeline and handed to the
/// routes as an extension.
#[derive(Clone, Debug, Default)]
pub struct CurrentSession(pub Option<Session>);

/// The peer address of the connection, put in each request by the connection loop.
#[derive(Clone, Copy, Debug)]
pub struct ClientAddr(pub SocketAddr);

/// The value of the `sid` cookie, if any.
pub fn session_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// The live session the request's cookie names.
pub fn lookup(
    store: &Store,
    headers: &HeaderMap,
    life: SessionLife,
) -> Result<Option<Session>, StoreError> {
    match session_id(headers) {
        Some(sid) => store.session(&sid, now_ms(), life),
        None => Ok(None),
    }
}

/// Why a data write is refused before anything else looks at it.
pub fn check_write(session: Option<&Session>, headers: &HeaderMap) -> Result<(), Response> {
    let Some(session) = session else {
        return Err(detail(StatusCode::UNAUTHORIZED, "not_signed_in"));
    };
    let csrf_ok = headers
        .get("x-csrf-token")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| constant_time_eq(t, &session.csrf));
    if !csrf_ok {
        return Err(detail(StatusCode::FORBIDDEN, "csrf_failed"));
    }
    if let Some(expected) = headers.get("x-pm-expected-account") {
        if expected.as_bytes() != session.user.as_bytes() {
            return Err(detail(StatusCode::CONFLICT, "account_mismatch"));
        }
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LoginBody {
    user_id: String,
    password: String,
}

/// The `Set-Cookie` value for `sid` (empty and `Max-Age=0` to clear it).
fn cookie(app: &App, headers: &HeaderMap, sid: &str, max_age_s: u64) -> Option<HeaderValue> {
    let secure = served_over_https(headers) || app.https_origin;
    let value = format!(
        "{SESSION_COOKIE}={sid}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age_s}{}",
        if secure { "; Secure" } else { "" }
    );
    HeaderValue::from_str(&value).ok()
}

pub async fn login(
    State(app): State<App>,
    Extension(current): Extension<CurrentSession>,
    client: Option<Extension<ClientAddr>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let body = match read_body(body, app.max_request_body).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let creds: LoginBody = match parse_json(&body) {
        Ok(c) => c,
        Err(resp) => return resp,
    };
    // Failures count per (account, client), per client and per account (see
    // `LoginThrottle`): guessing one account's password and trying one password on many
    // accounts are both slowed down, and no client locks out the others. The client is
    // the peer, or behind a trusted proxy the client it names.
    let now = Instant::now();
    let client = match client {
        Some(Extension(ClientAddr(addr))) => app.clients.client(addr.ip(), &headers),
        None => app
            .clients
            .client(std::net::Ipv4Addr::UNSPECIFIED.into(), &headers),
    };
    if let Err(wait) = app
        .login_throttle
        .check(&creds.user_id, client.as_str(), now)
    {
        return too_many("too_many_login_attempts", wait);
    }
    if !ACCOUNTS.contains(&creds.user_id.as_str()) || creds.password != creds.user_id {
        app.login_throttle
            .fail(&creds.user_id, client.as_str(), now);
        return detail(StatusCode::UNAUTHORIZED, "invalid_credentials");
    }
    app.login_throttle.succeed(&creds.user_id, client.as_str());
    // A new login replaces whatever session the browser had (never two live sessions in
    // one cookie jar, and a fresh CSRF token).
    if let Some(old) = current.0 {
        if let Err(e) = app.store.delete_session(&old.sid) {
            return storage_error(e);
        }
        app.write_budget.forget(&old.sid);
    }
    let (sid, csrf) = match (random_token(), random_token()) {
        (Ok(s), Ok(c)) => (s, c),
        (Err(e), _) | (_, Err(e)) => return storage_error(e),
    };
    let at = now_ms();
    let session = Session {
        sid,
        user: creds.user_id,
        csrf,
        created_ms: at,
        seen_ms: at,
    };
    if let Err(e) = app.store.create_session(&session) {
        return storage_error(e);
    }
    let mut resp = json_response(
        StatusCode::OK,
        json!({ "user": { "id": session.user }, "csrfToken": session.csrf }),
    );
    if let Some(v) = cookie(&app, &headers, &session.sid, app.session_max.as_secs()) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp
}

pub async fn logout(
    State(app): State<App>,
    Extension(current): Extension<CurrentSession>,
    headers: HeaderMap,
) -> Response {
    if let Some(session) = current.0 {
        if let Err(e) = app.store.delete_session(&session.sid) {
            return storage_error(e);
        }
        app.write_budget.forget(&session.sid);
    }
    let mut resp = json_response(StatusCode::OK, json!({ "ok": true }));
    if let Some(v) = cookie(&app, &headers, "", 0) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp
}

pub async fn me(Extension(current): Extension<CurrentSession>, headers: HeaderMap) -> Response {
    let Some(session) = current.0 else {
        return json_response(StatusCode::UNAUTHORIZED, json!({ "user": null }));
    };
    if let Some(expected) = headers.get("x-pm-expected-account") {
        if expected.as_bytes() != session.user.as_bytes() {
            return json_response(
                StatusCode::CONFLICT,
                json!({ "detail": "account_mismatch", "user": { "id": session.user } }),
            );
        }
    }
    let mut resp = json_response(
        StatusCode::OK,
        json!({ "user": { "id": session.user }, "csrfToken": session.csrf }),
    );
    if let Ok(v) = HeaderValue::from_str(&session.csrf) {
        resp.headers_mut().insert("x-csrf-token", v);
    }
    resp
}
