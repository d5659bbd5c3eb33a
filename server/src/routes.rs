//! The demo data routes: tasks per project (workspace-scoped writes, the outbox orders them
//! per project) and notes (account-level writes, a barrier in the outbox's ordering).
//!
//! Handlers only see requests that the pipeline (module `app`) let through: writes here
//! are already signed in, CSRF-checked and claimed in the ledger when keyed.

use crate::auth::CurrentSession;
use crate::conditional::IfMatch;
use crate::http_util::{detail, json_response, parse_json, read_body, storage_error};
use crate::state::App;
use crate::store::{Session, Task, Update, WriteMeta};
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use serde::Deserialize;
use serde_json::{json, Value};

fn signed_in(current: CurrentSession) -> Result<Session, Response> {
    current
        .0
        .ok_or_else(|| detail(StatusCode::UNAUTHORIZED, "not_signed_in"))
}

#[derive(Deserialize)]
struct NewTask {
    title: Value,
}

#[derive(Deserialize)]
struct TaskPatch {
    #[serde(default)]
    title: Option<Value>,
    #[serde(default)]
    done: Option<Value>,
}

#[derive(Deserialize)]
struct NewNote {
    text: Value,
}

/// The body, read up to the server's bound.
async fn body_of(app: &App, body: Body) -> Result<Bytes, Response> {
    read_body(body, app.max_request_body).await
}

/// One task as JSON, with its `ETag`.
fn one_task(status: StatusCode, task: &Task) -> Response {
    let mut resp = (status, axum::Json(task)).into_response();
    if let Ok(v) = HeaderValue::from_str(&task.etag()) {
        resp.headers_mut().insert(header::ETAG, v);
    }
    resp
}

/// A non-empty string field, or 400: a malformed write must be a clean 4xx (which the
/// outbox surfaces as `rejected`), never a half-applied change.
fn text_field(v: Value) -> Result<String, Response> {
    match v {
        Value::String(s) if !s.trim().is_empty() => Ok(s),
        _ => Err(detail(StatusCode::BAD_REQUEST, "invalid_body")),
    }
}

pub async fn list_tasks(
    State(app): State<App>,
    Extension(current): Extension<CurrentSession>,
    Path(pid): Path<String>,
) -> Response {
    let session = match signed_in(current) {
        Ok(s) => s,
        Err(r) => return r,
    };
    match app.store.list_tasks(&session.user, &pid) {
        Ok(tasks) => json_response(StatusCode::OK, json!({ "tasks": tasks })),
        Err(e) => storage_error(e),
    }
}

pub async fn create_task(
    State(app): State<App>,
    Extension(current): Extension<CurrentSession>,
    Extension(meta): Extension<WriteMeta>,
    Path(pid): Path<String>,
    body: Body,
) -> Response {
    let session = match signed_in(current) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let body = match body_of(&app, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let title = match parse_json::<NewTask>(&body).and_then(|b| text_field(b.title)) {
        Ok(t) => t,
        Err(r) => return r,
    };
    match app
        .store
        .create_task(&session.user, &pid, &title, &meta.with_body(&body))
    {
        Ok(task) => {
            let mut resp = one_task(StatusCode::CREATED, &task);
            let location = format!("/api/projects/{}/tasks/{}", pid, task.id);
            if let Ok(v) = HeaderValue::from_str(&location) {
                resp.headers_mut().insert(header::LOCATION, v);
            }
            resp
        }
        Err(e) => storage_error(e),
    }
}

pub async fn get_task(
    State(app): State<App>,
    Extension(current): Extension<CurrentSession>,
    Path((pid, id)): Path<(String, String)>,
) -> Response {
    let session = match signed_in(current) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let Ok(id) = id.parse::<i64>() else {
        return detail(StatusCode::NOT_FOUND, "not_found");
    };
    match app.store.get_task(&session.user, &pid, id) {
        Ok(Some(task)) => one_task(StatusCode::OK, &task),
        Ok(None) => detail(StatusCode::NOT_FOUND, "not_found"),
        Err(e) => storage_error(e),
    }
}

/// A partial update, conditional on `If-Match` when the request has one: a stale version
/// gets 412 `precondition_failed` and changes nothing (a lost update prevented).
pub async fn update_task(
    State(app): State<App>,
    Extension(current): Extension<CurrentSession>,
    Extension(meta): Extension<WriteMeta>,
    Path((pid, id)): Path<(String, String)>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let session = match signed_in(current) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let Ok(id) = id.parse::<i64>() else {
        return detail(StatusCode::NOT_FOUND, "not_found");
    };
    let body = match body_of(&app, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let patch: TaskPatch = match parse_json(&body) {
        Ok(p) => p,
        Err(r) => return r,
    };
    let title = match patch.title.map(text_field).transpose() {
        Ok(t) => t,
        Err(r) => return r,
    };
    let done = match patch.done {
        None => None,
        Some(Value::Bool(b)) => Some(b),
        Some(_) => return detail(StatusCode::BAD_REQUEST, "invalid_body"),
    };
    let condition = IfMatch::from_headers(&headers);
    let precondition = |etag: &str| condition.as_ref().is_none_or(|c| c.matches(etag));
    match app.store.update_task(
        &session.user,
        &pid,
        id,
        title.as_deref(),
        done,
        precondition,
        &meta.with_body(&body),
    ) {
        Ok(Update::Updated(task)) => one_task(StatusCode::OK, &task),
        Ok(Update::NotFound) => detail(StatusCode::NOT_FOUND, "not_found"),
        Ok(Update::PreconditionFailed) => {
            detail(StatusCode::PRECONDITION_FAILED, "precondition_failed")
        }
        Err(e) => storage_error(e),
    }
}

pub async fn delete_task(
    State(app): State<App>,
    Extension(current): Extension<CurrentSession>,
    Extension(meta): Extension<WriteMeta>,
    Path((pid, id)): Path<(String, String)>,
) -> Response {
    let session = match signed_in(current) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let Ok(id) = id.parse::<i64>() else {
        return detail(StatusCode::NOT_FOUND, "not_found");
    };
    match app
        .store
        .delete_task(&session.user, &pid, id, &meta.with_body(b""))
    {
        Ok(true) => StatusCode::NO_CONTENT.into_response(),
        Ok(false) => detail(StatusCode::NOT_FOUND, "not_found"),
        Err(e) => storage_error(e),
    }
}

pub async fn list_notes(
    State(app): State<App>,
    Extension(current): Extension<CurrentSession>,
) -> Response {
    let session = match signed_in(current) {
        Ok(s) => s,
        Err(r) => return r,
    };
    match app.store.list_notes(&session.user) {
        Ok(notes) => json_response(StatusCode::OK, json!({ "notes": notes })),
        Err(e) => storage_error(e),
    }
}

pub async fn create_note(
    State(app): State<App>,
    Extension(current): Extension<CurrentSession>,
    Extension(meta): Extension<WriteMeta>,
    body: Body,
) -> Response {
    let session = match signed_in(current) {
        Ok(s) => s,
        Err(r) => return r,
    };
    let body = match body_of(&app, body).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    let text = match parse_json::<NewNote>(&body).and_then(|b| text_field(b.text)) {
        Ok(t) => t,
        Err(r) => return r,
    };
    match app
        .store
        .create_note(&session.user, &text, &meta.with_body(&body))
    {
        Ok(note) => (StatusCode::CREATED, axum::Json(note)).into_response(),
        Err(e) => storage_error(e),
    }
}

/// Unknown `/api/` paths answer JSON, so the worker's classification sees a normal 4xx.
pub async fn not_found() -> Response {
    detail(StatusCode::NOT_FOUND, "not_found")
}
