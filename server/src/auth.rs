//! Cookie sessions and CSRF for the two demo accounts.
//!
//! The session id travels in an HttpOnly cookie (script cannot read it); the CSRF token is
//! handed to the page (and to the worker, via `/api/auth/me`) and must come back in
//! `X-CSRF-Token` on every data write, which a cross-site form cannot do.

use crate::app::App;
use crate::http_util::{
    constant_time_eq, detail, json_response, parse_json, random_token, storage_error,
};
use crate::store::{Session, Store, StoreError};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use axum::Extension;
use serde::Deserialize;
use serde_json::json;

pub const SESSION_COOKIE: &str = "sid";
const ACCOUNTS: &[&str] = &["alice", "bob"];

/// The session the request's cookie names, resolved once by the pipeline and handed to the
/// routes as an extension.
#[derive(Clone, Debug, Default)]
pub struct CurrentSession(pub Option<Session>);

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

pub fn lookup(store: &Store, headers: &HeaderMap) -> Result<Option<Session>, StoreError> {
    match session_id(headers) {
        Some(sid) => store.session(&sid),
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

fn cookie(value: &str) -> Option<HeaderValue> {
    HeaderValue::from_str(value).ok()
}

pub async fn login(
    State(app): State<App>,
    Extension(current): Extension<CurrentSession>,
    body: Bytes,
) -> Response {
    let creds: LoginBody = match parse_json(&body) {
        Ok(c) => c,
        Err(resp) => return resp,
    };
    if !ACCOUNTS.contains(&creds.user_id.as_str()) || creds.password != creds.user_id {
        return detail(StatusCode::UNAUTHORIZED, "invalid_credentials");
    }
    // A new login replaces whatever session the browser had (never two live sessions in
    // one cookie jar, and a fresh CSRF token).
    if let Some(old) = current.0 {
        if let Err(e) = app.store.delete_session(&old.sid) {
            return storage_error(e);
        }
    }
    let (sid, csrf) = match (random_token(), random_token()) {
        (Ok(s), Ok(c)) => (s, c),
        (Err(e), _) | (_, Err(e)) => return storage_error(e),
    };
    let session = Session {
        sid,
        user: creds.user_id,
        csrf,
    };
    if let Err(e) = app.store.create_session(&session) {
        return storage_error(e);
    }
    let mut resp = json_response(
        StatusCode::OK,
        json!({ "user": { "id": session.user }, "csrfToken": session.csrf }),
    );
    if let Some(v) = cookie(&format!(
        "{SESSION_COOKIE}={}; HttpOnly; SameSite=Lax; Path=/",
        session.sid
    )) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp
}

pub async fn logout(
    State(app): State<App>,
    Extension(current): Extension<CurrentSession>,
) -> Response {
    if let Some(session) = current.0 {
        if let Err(e) = app.store.delete_session(&session.sid) {
            return storage_error(e);
        }
    }
    let mut resp = json_response(StatusCode::OK, json!({ "ok": true }));
    if let Some(v) = cookie(&format!(
        "{SESSION_COOKIE}=; HttpOnly; SameSite=Lax; Path=/; Max-Age=0"
    )) {
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
