//! Cookie sessions, CSRF, bearer tokens and the login throttle for the two demo accounts.
//!
//! `--auth cookie` (the default): the session id travels in an HttpOnly, `SameSite=Strict`
//! cookie (script cannot read it, and no other site's page can make the browser send it),
//! `Secure` when the site is served over https. Sessions end after `session_idle` without
//! use and `session_max` after sign-in. The CSRF token is handed to the page (and to the
//! worker, via `/api/auth/me`) and must come back in `X-CSRF-Token` on every data write.
//!
//! `--auth bearer`: no cookie at all. Sign-in answers an access token (sent as
//! `Authorization: Bearer …`, valid `token_ttl`) and a refresh token, which is the
//! session's id and lives as a cookie session would; `POST /api/auth/refresh` trades it
//! for a new access token. An expired access token is answered 401 `token_expired` with
//! `WWW-Authenticate: Bearer error="invalid_token"`. No CSRF token: another site's page
//! cannot make the browser send an `Authorization` header.

use crate::config::AuthMode;
use crate::http_util::{
    constant_time_eq, detail, json_response, now_ms, parse_json, random_token, read_body,
    storage_error, too_many,
};
use crate::security::served_over_https;
use crate::state::App;
use crate::store::{AccessToken, Session, SessionLife, Store, StoreError};
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

/// Who a request comes from, as the pipeline resolves it once.
#[derive(Clone, Debug, Default)]
pub struct Resolved {
    pub session: Option<Session>,
    /// Bearer mode: the request's access token has expired (401 `token_expired`).
    pub token_expired: bool,
}

/// The token of an `Authorization: Bearer <token>` header.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// The request's session: its cookie's (cookie mode), or its access token's (bearer mode,
/// where cookies are ignored).
pub fn resolve(app: &App, headers: &HeaderMap) -> Result<Resolved, StoreError> {
    if app.auth == AuthMode::Cookie {
        return Ok(Resolved {
            session: lookup(&app.store, headers, app.session_life)?,
            token_expired: false,
        });
    }
    let Some(token) = bearer_token(headers) else {
        return Ok(Resolved::default());
    };
    match app.store.access_token(token, now_ms())? {
        AccessToken::Live { sid } => Ok(Resolved {
            session: app.store.session(&sid, now_ms(), app.session_life)?,
            token_expired: false,
        }),
        AccessToken::Expired => Ok(Resolved {
            session: None,
            token_expired: true,
        }),
        AccessToken::Unknown => Ok(Resolved::default()),
    }
}

/// The request's access token has expired (bearer mode), put in the request's
/// extensions by the pipeline: a refusal then says so.
#[derive(Clone, Copy, Debug)]
pub struct TokenExpired;

/// 401 for a request without a session: `token_expired` (with the `WWW-Authenticate`
/// challenge a bearer client reads) when its access token expired, else `not_signed_in`.
pub fn unauthorized(mode: AuthMode, expired: bool) -> Response {
    let mut resp = detail(
        StatusCode::UNAUTHORIZED,
        if expired {
            "token_expired"
        } else {
            "not_signed_in"
        },
    );
    if mode == AuthMode::Bearer {
        let challenge = if expired {
            r#"Bearer error="invalid_token", error_description="the access token expired""#
        } else {
            "Bearer"
        };
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(challenge),
        );
    }
    resp
}

/// Why a data write is refused before anything else looks at it. `csrf`: whether the
/// session came from a cookie, so that a CSRF token must come with it.
pub fn check_write(
    session: Option<&Session>,
    headers: &HeaderMap,
    mode: AuthMode,
    expired: bool,
) -> Result<(), Response> {
    let Some(session) = session else {
        return Err(unauthorized(mode, expired));
    };
    let csrf_ok = mode == AuthMode::Bearer
        || headers
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

/// Issues an access token of `session` (bearer mode): the token and when it expires.
fn issue_access_token(app: &App, session: &Session) -> Result<(String, i64), Response> {
    let token = random_token().map_err(storage_error)?;
    let ttl = i64::try_from(app.token_ttl.as_millis()).unwrap_or(i64::MAX);
    let expires = now_ms().saturating_add(ttl);
    app.store
        .create_access_token(&token, &session.sid, &session.user, expires)
        .map_err(storage_error)?;
    Ok((token, expires))
}

/// The body of a bearer sign-in or refresh.
fn token_answer(session: &Session, token: &str, expires: i64, refresh: bool) -> Response {
    let mut body = json!({
        "user": { "id": session.user },
        "tokenType": "Bearer",
        "accessToken": token,
        "expiresAt": expires,
    });
    if refresh {
        body["refreshToken"] = json!(session.sid);
    }
    json_response(StatusCode::OK, body)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RefreshBody {
    refresh_token: String,
}

/// `POST /api/auth/refresh {"refreshToken"}` (bearer mode): a new access token of the
/// session the refresh token names, while that session lives. The refresh token stays
/// the same (two tabs refreshing at once both succeed).
pub async fn refresh(State(app): State<App>, body: Body) -> Response {
    if app.auth != AuthMode::Bearer {
        return detail(StatusCode::NOT_FOUND, "not_found");
    }
    let body = match read_body(body, app.max_request_body).await {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let asked: RefreshBody = match parse_json(&body) {
        Ok(b) => b,
        Err(resp) => return resp,
    };
    let session = match app
        .store
        .session(&asked.refresh_token, now_ms(), app.session_life)
    {
        Ok(Some(s)) => s,
        Ok(None) => return detail(StatusCode::UNAUTHORIZED, "invalid_refresh_token"),
        Err(e) => return storage_error(e),
    };
    match issue_access_token(&app, &session) {
        Ok((token, expires)) => token_answer(&session, &token, expires, false),
        Err(resp) => resp,
    }
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
    if app.auth == AuthMode::Bearer {
        // No cookie: the refresh token is the session's id, the access token expires.
        return match issue_access_token(&app, &session) {
            Ok((token, expires)) => token_answer(&session, &token, expires, true),
            Err(resp) => resp,
        };
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
    body: Body,
) -> Response {
    // Bearer mode: the session of the access token, or of the refresh token in the body
    // (`{"refreshToken"}`, for a page whose access token already expired).
    let mut sid = current.0.map(|s| s.sid);
    if sid.is_none() && app.auth == AuthMode::Bearer {
        if let Ok(body) = read_body(body, app.max_request_body).await {
            sid = parse_json::<RefreshBody>(&body)
                .ok()
                .map(|b| b.refresh_token);
        }
    }
    if let Some(sid) = sid {
        if let Err(e) = app.store.delete_session(&sid) {
            return storage_error(e);
        }
        app.write_budget.forget(&sid);
    }
    let mut resp = json_response(StatusCode::OK, json!({ "ok": true }));
    if app.auth == AuthMode::Bearer {
        return resp;
    }
    if let Some(v) = cookie(&app, &headers, "", 0) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    resp
}

pub async fn me(
    State(app): State<App>,
    Extension(current): Extension<CurrentSession>,
    expired: Option<Extension<TokenExpired>>,
    headers: HeaderMap,
) -> Response {
    let Some(session) = current.0 else {
        let mut resp = unauthorized(app.auth, expired.is_some());
        *resp.body_mut() = Body::from(
            json!({ "user": null, "detail": if expired.is_some() { "token_expired" } else { "not_signed_in" } })
                .to_string(),
        );
        return resp;
    };
    if let Some(expected) = headers.get("x-pm-expected-account") {
        if expected.as_bytes() != session.user.as_bytes() {
            return json_response(
                StatusCode::CONFLICT,
                json!({ "detail": "account_mismatch", "user": { "id": session.user } }),
            );
        }
    }
    if app.auth == AuthMode::Bearer {
        return json_response(StatusCode::OK, json!({ "user": { "id": session.user } }));
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
