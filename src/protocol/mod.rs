//! The messages between pages and the worker (contract sections 5 and 6), typed.
//!
//! Commands are parsed from JSON values (the shell converts the page's message first,
//! with `js::from_value`), so every malformed shape is tested on the host. A refusal
//! always names the field at fault.

use crate::core::content::{base64_decode, present};
use crate::core::credential::Authorization;
use crate::core::delivery::{Delivery, StopReason};
use crate::core::identity::{is_account_id, MAX_ACCOUNT_ID_LEN};
use crate::core::key::IdempotencyKey;
use crate::core::planner::BlockReason;
use crate::core::record::{RecordId, RecordMeta, RecordState, MAX_SAFE_INTEGER};
use crate::core::recovery::Edit;
pub use crate::core::recovery::RecoverAction;
use serde::Serialize;
use serde_json::{Map, Value};

/// What a page may ask for.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    AuthSession {
        user: Option<String>,
        /// A bearer app's credential (r3): held for this session, never for a record.
        authorization: Option<Authorization>,
    },
    FlushQueue,
    RebindRecords {
        owner: String,
        ids: Option<Vec<RecordId>>,
    },
    RecoverRecord {
        id: RecordId,
        owner: String,
        action: RecoverAction,
        /// The new content, for `action: "edit"` only.
        edit: Option<Edit>,
    },
    /// The owner's record with its body (for a person to see, copy or edit it).
    ReadRecord {
        id: RecordId,
        owner: String,
    },
    ListQueue,
    ClearDevice,
    /// Opt the signed-in account in or out of delivery notifications.
    SetNotifications {
        user: String,
        enabled: bool,
    },
    /// The page gave up on a write before it was stored (contract 2.8, r2).
    AbortWrite {
        key: IdempotencyKey,
    },
}

/// Every field any command reads. The shell copies only these out of a page's message,
/// and only as far as their shape allows (strings, numbers, booleans, an array of ids),
/// so a message of any size or shape costs the worker no more than these fields do.
pub const MESSAGE_FIELDS: [&str; 13] = [
    "type",
    "requestId",
    "userId",
    "ownerId",
    "ids",
    "id",
    "action",
    "enabled",
    "idempotencyKey",
    "body",
    "bodyEncoding",
    "contentType",
    "authorization",
];

/// The one field that may be a long string (an edit's body); every other string field is
/// at most [`MAX_FIELD_CHARS`] characters, but [`AUTHORIZATION_FIELD`].
pub const BODY_FIELD: &str = "body";
pub const MAX_FIELD_CHARS: usize = 4096;
/// `AUTH_SESSION`'s credential: up to `core::credential::MAX_AUTHORIZATION_LEN`.
pub const AUTHORIZATION_FIELD: &str = "authorization";

/// What bounds a command's fields.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `REBIND_RECORDS.ids` (the queue never holds more than `maxRecords`).
    pub max_ids: usize,
    /// An edit's body, in bytes (`maxBodyBytes`).
    pub max_body: u32,
}

/// The one field that may be an array (`REBIND_RECORDS.ids`).
pub const ARRAY_FIELD: &str = "ids";

impl Command {
    pub fn name(&self) -> &'static str {
        match self {
            Command::AuthSession { .. } => "AUTH_SESSION",
            Command::FlushQueue => "FLUSH_QUEUE",
            Command::RebindRecords { .. } => "REBIND_RECORDS",
            Command::RecoverRecord { .. } => "RECOVER_RECORD",
            Command::ReadRecord { .. } => "READ_RECORD",
            Command::ListQueue => "LIST_QUEUE",
            Command::ClearDevice => "CLEAR_DEVICE",
            Command::SetNotifications { .. } => "SET_NOTIFICATIONS",
            Command::AbortWrite { .. } => "ABORT_WRITE",
        }
    }
}

/// A parsed command with the page's `requestId` (a string or a number, echoed as is).
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    pub command: Command,
    pub request_id: Option<Value>,
}

/// A message refused before anything was done.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// The message's `type` as sent, when it was a string.
    pub command: Option<String>,
    pub request_id: Option<Value>,
    pub reason: String,
}

impl Refusal {
    pub fn result(&self) -> Outgoing {
        Outgoing::CommandResult {
            command: self.command.clone(),
            ok: false,
            reason: Some(self.reason.clone()),
            affected: None,
            request_id: self.request_id.clone(),
        }
    }
}

/// Parses a page's message within `limits`.
pub fn parse_command(msg: &Value, limits: Limits) -> Result<Envelope, Refusal> {
    let max_ids = limits.max_ids;
    let Some(obj) = msg.as_object() else {
        return Err(Refusal {
            command: None,
            request_id: None,
            reason: "the message must be an object with a string field type".into(),
        });
    };
    let command = obj.get("type").and_then(Value::as_str).map(str::to_owned);
    let request_id = match obj.get("requestId") {
        None | Some(Value::Null) => None,
        Some(v @ Value::String(_)) => Some(v.clone()),
        Some(v @ Value::Number(n)) if n.as_f64().is_some_and(f64::is_finite) => Some(v.clone()),
        Some(_) => {
            return Err(Refusal {
                command,
                request_id: None,
                reason: "requestId must be a string or a number".into(),
            })
        }
    };
    let refuse = |reason: String| Refusal {
        command: command.clone(),
        request_id: request_id.clone(),
        reason,
    };
    let Some(kind) = command.as_deref() else {
        return Err(refuse(match obj.get("type") {
            None => "type is required".into(),
            Some(_) => "type must be a string".into(),
        }));
    };
    let parsed = match kind {
        "AUTH_SESSION" => {
            let user = match obj.get("userId") {
                None => Err("userId is required (a string, or null when signed out)".into()),
                Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if is_account_id(s) => Ok(Some(s.clone())),
                Some(Value::String(s)) if !s.is_empty() => Err(format!("userId {ACCOUNT_RULE}")),
                Some(_) => Err("userId must be a non-empty string or null".into()),
            };
            user.and_then(|user| {
                let authorization = match obj.get(AUTHORIZATION_FIELD) {
                    None | Some(Value::Null) => None,
                    Some(Value::String(a)) => {
                        Some(Authorization::parse(a).map_err(|e| format!("authorization {e}"))?)
                    }
                    Some(_) => return Err("authorization must be a string or null".into()),
                };
                if user.is_none() && authorization.is_some() {
                    return Err(
                        "authorization goes with a userId: a sign-out (userId null) carries none"
                            .into(),
                    );
                }
                Ok(Command::AuthSession {
                    user,
                    authorization,
                })
            })
        }
        "ABORT_WRITE" => match obj.get("idempotencyKey") {
            None => Err("idempotencyKey is required".into()),
            Some(Value::String(k)) => IdempotencyKey::parse(k)
                .map(|key| Command::AbortWrite { key })
                .map_err(|e| format!("idempotencyKey: {e}")),
            Some(_) => Err("idempotencyKey must be a string".into()),
        },
        "FLUSH_QUEUE" => Ok(Command::FlushQueue),
        "LIST_QUEUE" => Ok(Command::ListQueue),
        "CLEAR_DEVICE" => Ok(Command::ClearDevice),
        "REBIND_RECORDS" => owner_id(obj).and_then(|owner| {
            let ids = match obj.get("ids") {
                None | Some(Value::Null) => None,
                Some(Value::Array(a)) if a.len() > max_ids => {
                    return Err(format!("ids may list at most {max_ids} records"));
                }
                Some(Value::Array(a)) => Some(
                    a.iter()
                        .enumerate()
                        .map(|(i, v)| record_id(v).ok_or(format!("ids[{i}] {ID_RULE}")))
                        .collect::<Result<Vec<_>, _>>()?,
                ),
                Some(_) => return Err("ids must be an array of record ids".into()),
            };
            Ok(Command::RebindRecords { owner, ids })
        }),
        "RECOVER_RECORD" => id_field(obj).and_then(|id| {
            let owner = owner_id(obj)?;
            let (action, edit) = match obj.get("action").and_then(Value::as_str) {
                Some("retry-new") => (RecoverAction::RetryNew, None),
                Some("discard") => (RecoverAction::Discard, None),
                Some("edit") => (
                    RecoverAction::Edit,
                    Some(edit_fields(obj, limits.max_body)?),
                ),
                _ => return Err("action must be \"retry-new\", \"discard\" or \"edit\"".into()),
            };
            Ok(Command::RecoverRecord {
                id,
                owner,
                action,
                edit,
            })
        }),
        "READ_RECORD" => id_field(obj).and_then(|id| {
            Ok(Command::ReadRecord {
                id,
                owner: owner_id(obj)?,
            })
        }),
        "SET_NOTIFICATIONS" => match (obj.get("userId"), obj.get("enabled")) {
            (Some(Value::String(u)), Some(Value::Bool(enabled))) if is_account_id(u) => {
                Ok(Command::SetNotifications {
                    user: u.clone(),
                    enabled: *enabled,
                })
            }
            (None, _) => Err("userId is required".into()),
            (Some(Value::String(u)), _) if is_account_id(u) => {
                Err("enabled is required and must be true or false".into())
            }
            (Some(Value::String(u)), _) if !u.is_empty() => Err(format!("userId {ACCOUNT_RULE}")),
            _ => Err("userId must be a non-empty string".into()),
        },
        other => Err(format!(
            "type {} is not a command of this outbox",
            crate::core::text::quoted(other)
        )),
    };
    parsed
        .map(|command| Envelope {
            command,
            request_id: request_id.clone(),
        })
        .map_err(refuse)
}

const ID_RULE: &str = "must be a positive safe integer";

fn id_field(obj: &Map<String, Value>) -> Result<RecordId, String> {
    match obj.get("id") {
        None => Err("id is required".to_string()),
        Some(v) => record_id(v).ok_or(format!("id {ID_RULE}")),
    }
}

/// An edit's `body` (text, or base64 with `bodyEncoding: "base64"`) and optional
/// `contentType`.
fn edit_fields(obj: &Map<String, Value>, max_body: u32) -> Result<Edit, String> {
    let text = match obj.get("body") {
        None => return Err("body is required for an edit (a string)".into()),
        Some(Value::String(t)) => t,
        Some(_) => return Err("body must be a string".into()),
    };
    let body = match obj.get("bodyEncoding") {
        None | Some(Value::Null) => text.as_bytes().to_vec(),
        Some(Value::String(e)) if e == "text" => text.as_bytes().to_vec(),
        Some(Value::String(e)) if e == "base64" => {
            base64_decode(text).ok_or("body is not valid base64")?
        }
        Some(_) => return Err("bodyEncoding must be \"text\" or \"base64\"".into()),
    };
    if body.len() > max_body as usize {
        return Err(format!(
            "body is {} bytes, over the outbox's limit of {max_body} (maxBodyBytes)",
            body.len()
        ));
    }
    let content_type = match obj.get("contentType") {
        None | Some(Value::Null) => None,
        Some(Value::String(c)) if is_header_value(c) => Some(c.clone()),
        Some(_) => return Err("contentType must be a header value (visible ASCII)".into()),
    };
    Ok(Edit { body, content_type })
}

fn is_header_value(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| (0x20..=0x7e).contains(&b))
}

/// `core::identity::is_account_id`, in words.
const ACCOUNT_RULE: &str =
    "must be 1 to 256 visible ASCII characters (inner spaces allowed): it is sent as a header value";

fn owner_id(obj: &Map<String, Value>) -> Result<String, String> {
    match obj.get("ownerId") {
        None => Err("ownerId is required".into()),
        Some(Value::String(s)) if is_account_id(s) => Ok(s.clone()),
        Some(Value::String(s)) if !s.is_empty() => Err(format!("ownerId {ACCOUNT_RULE}")),
        Some(_) => Err("ownerId must be a non-empty string".into()),
    }
}

const _: () = assert!(MAX_ACCOUNT_ID_LEN == 256, "ACCOUNT_RULE names the limit");

fn record_id(v: &Value) -> Option<RecordId> {
    let n = v.as_number()?;
    let id = match (n.as_u64(), n.as_f64()) {
        (Some(u), _) => u,
        (None, Some(f)) if f.fract() == 0.0 && f >= 1.0 && f <= MAX_SAFE_INTEGER as f64 => f as u64,
        _ => return None,
    };
    (1..=MAX_SAFE_INTEGER).contains(&id).then_some(RecordId(id))
}

/// Whether a record's details may be shown to whoever is signed in now (`viewer`):
/// another account's records are reported by id, owner, state and reason only, never by
/// what they contain or where they go (contract 5, r2). Unknown-owner records keep their
/// details: a person needs them to decide on adoption.
pub fn details_visible(owner: Option<&str>, viewer: Option<&str>) -> bool {
    match owner {
        None => true,
        Some(o) => viewer == Some(o),
    }
}

fn state_name(state: RecordState) -> (&'static str, Option<&'static str>) {
    match state {
        RecordState::Queued => ("queued", None),
        RecordState::NeedsAttention(r) => ("needs-attention", Some(r.as_str())),
    }
}

/// One entry of `MUTATIONS_BLOCKED`. Corrupt records, and another account's, have no
/// method, path or workspace.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockedEntry {
    pub id: RecordId,
    pub method: Option<String>,
    pub path: Option<String>,
    pub owner_id: Option<String>,
    pub workspace: Option<String>,
    /// `queued`, `needs-attention` or `corrupt`.
    pub state: &'static str,
    pub reason: BlockReason,
}

impl BlockedEntry {
    /// The report entry of a record (`None`: a corrupt value) as `viewer` may see it.
    pub fn of(
        id: RecordId,
        meta: Option<&RecordMeta>,
        reason: BlockReason,
        viewer: Option<&str>,
    ) -> BlockedEntry {
        let Some(m) = meta else {
            return BlockedEntry {
                id,
                method: None,
                path: None,
                owner_id: None,
                workspace: None,
                state: "corrupt",
                reason,
            };
        };
        let shown = details_visible(m.owner.as_deref(), viewer);
        // A record blocked for a reason that needs a person is in needs-attention, though
        // `meta` (read as the flush began) may still say queued: this flush moved it.
        let state = match reason {
            BlockReason::Attention(r) => RecordState::NeedsAttention(r),
            _ => m.state,
        };
        BlockedEntry {
            id,
            method: shown.then(|| m.method.clone()),
            path: shown.then(|| m.path.clone()),
            owner_id: m.owner.clone(),
            workspace: m.workspace.clone().filter(|_| shown),
            state: state_name(state).0,
            reason,
        }
    }
}

/// One entry of `QUEUE_STATE`: metadata, never the body.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ListedRecord {
    pub id: RecordId,
    pub method: Option<String>,
    pub path: Option<String>,
    pub owner_id: Option<String>,
    pub workspace: Option<String>,
    /// `queued`, `needs-attention`, or `corrupt` for a value that is not a record.
    pub state: &'static str,
    pub attention_reason: Option<&'static str>,
    pub last_status: Option<u16>,
    pub timestamp: Option<u64>,
    pub body_size: Option<usize>,
}

impl ListedRecord {
    /// A record's listing as `viewer` (the account signed in now) may see it.
    pub fn of(m: &RecordMeta, viewer: Option<&str>) -> ListedRecord {
        let (state, attention_reason) = state_name(m.state);
        let shown = details_visible(m.owner.as_deref(), viewer);
        ListedRecord {
            id: m.id,
            method: shown.then(|| m.method.clone()),
            path: shown.then(|| m.path.clone()),
            owner_id: m.owner.clone(),
            workspace: m.workspace.clone().filter(|_| shown),
            state,
            attention_reason,
            last_status: m.last_status.filter(|_| shown),
            timestamp: shown.then_some(m.timestamp),
            body_size: shown.then_some(m.body_len),
        }
    }

    pub fn corrupt(id: RecordId) -> ListedRecord {
        ListedRecord {
            id,
            method: None,
            path: None,
            owner_id: None,
            workspace: None,
            state: "corrupt",
            attention_reason: None,
            last_status: None,
            timestamp: None,
            body_size: None,
        }
    }
}

/// The answer to `READ_RECORD`: the record as its owner may see it, its body included.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordContent {
    pub id: RecordId,
    pub method: String,
    pub path: String,
    pub workspace: Option<String>,
    pub state: &'static str,
    pub attention_reason: Option<&'static str>,
    pub last_status: Option<u16>,
    pub content_type: Option<String>,
    /// `text` when the Content-Type is textual and the bytes are UTF-8, else `base64`.
    pub body_encoding: &'static str,
    /// Empty when the record has no body.
    pub body: String,
    /// It was sent at least once, so it may already have been applied: an edit or a
    /// retry under a new key could apply it a second time.
    pub sent_before: bool,
    pub timestamp: u64,
}

impl RecordContent {
    pub fn of(m: &RecordMeta, body: &[u8]) -> RecordContent {
        let (state, attention_reason) = state_name(m.state);
        let (encoding, body) = present(body, m.content_type.as_deref());
        RecordContent {
            id: m.id,
            method: m.method.clone(),
            path: m.path.clone(),
            workspace: m.workspace.clone(),
            state,
            attention_reason,
            last_status: m.last_status,
            content_type: m.content_type.clone(),
            body_encoding: encoding.as_str(),
            body,
            sent_before: m.first_sent_at.is_some() || m.attempts > 0,
            timestamp: m.timestamp,
        }
    }
}

/// Every message the worker sends to pages.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type")]
pub enum Outgoing {
    #[serde(rename = "COMMAND_RESULT", rename_all = "camelCase")]
    CommandResult {
        command: Option<String>,
        ok: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        affected: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        request_id: Option<Value>,
    },
    #[serde(rename = "QUEUE_STATE", rename_all = "camelCase")]
    QueueState {
        records: Vec<ListedRecord>,
        /// Why the last flush stopped, when the next is due, when the last one ran (r3).
        delivery: Delivery,
        /// The account of the session the worker holds (the last `AUTH_SESSION`, as
        /// persisted; null: signed out or none yet): after an offline reload, a page
        /// that cannot ask `authMePath` still knows whose writes are pending (issue 37).
        account: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        request_id: Option<Value>,
    },
    #[serde(rename = "RECORD", rename_all = "camelCase")]
    Record {
        record: RecordContent,
        #[serde(skip_serializing_if = "Option::is_none")]
        request_id: Option<Value>,
    },
    /// A notification was clicked: a window of the app is asked to show this record.
    #[serde(rename = "SHOW_RECORD")]
    ShowRecord { id: RecordId },
    #[serde(rename = "MUTATIONS_BLOCKED")]
    Blocked { blocked: Vec<BlockedEntry> },
    #[serde(rename = "MUTATIONS_REPLAYED")]
    Replayed { count: u64 },
    /// `stopped_by`: why the flush stopped before the queue was drained (`None`: it was
    /// not stopped; what remains waits for a person, or was left to be tried again);
    /// `retry_at`: when the next automatic attempt runs (`None`: a trigger is awaited,
    /// or nothing will be tried without one). Contract 5, r3.
    #[serde(rename = "MUTATIONS_PARTIAL", rename_all = "camelCase")]
    Partial {
        replayed: u64,
        remaining: u64,
        stopped_by: Option<StopReason>,
        retry_at: Option<u64>,
    },
    #[serde(rename = "MUTATION_QUEUED", rename_all = "camelCase")]
    Queued {
        id: RecordId,
        method: String,
        path: String,
        workspace: Option<String>,
        owner_id: Option<String>,
        /// Whether it can be delivered while no page of the site is open: Background
        /// Sync was registered for it (r3).
        background: bool,
    },
    /// A replayed write the server answered 2xx, with the answer's body when it is text
    /// or JSON up to 64 KiB (r3): sent to the windows of its account only.
    #[serde(rename = "MUTATION_SETTLED", rename_all = "camelCase")]
    Settled {
        id: RecordId,
        idempotency_key: String,
        owner_id: Option<String>,
        status: u16,
        #[serde(skip_serializing_if = "Option::is_none")]
        content_type: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        body: Option<String>,
    },
    /// The server refused this account's credential, or a restarted worker does not
    /// hold it (r3): a page refreshes its token and sends `AUTH_SESSION` again.
    #[serde(rename = "AUTH_NEEDED", rename_all = "camelCase")]
    AuthNeeded { user_id: String },
}

impl Outgoing {
    pub fn ok(env: &Envelope, affected: Option<u64>) -> Outgoing {
        Outgoing::CommandResult {
            command: Some(env.command.name().to_owned()),
            ok: true,
            reason: None,
            affected,
            request_id: env.request_id.clone(),
        }
    }

    pub fn failed(env: &Envelope, reason: impl Into<String>) -> Outgoing {
        Outgoing::CommandResult {
            command: Some(env.command.name().to_owned()),
            ok: false,
            reason: Some(reason.into()),
            affected: None,
            request_id: env.request_id.clone(),
        }
    }

    /// The report after a flush: drained only when the queue was re-read and is empty.
    /// `remaining` is `None` when the queue could not be re-read; `estimate` is then
    /// what is known to remain. A partial one says why the flush stopped and when the
    /// next attempt is due.
    pub fn flush_summary(
        replayed: usize,
        remaining: Option<usize>,
        estimate: usize,
        stopped_by: Option<StopReason>,
        retry_at: Option<u64>,
    ) -> Outgoing {
        let partial = |remaining: usize| Outgoing::Partial {
            replayed: replayed as u64,
            remaining: remaining as u64,
            stopped_by,
            retry_at,
        };
        match remaining {
            Some(0) => Outgoing::Replayed {
                count: replayed as u64,
            },
            Some(m) => partial(m),
            None => partial(estimate.max(1)),
        }
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use serde_json::json;

    const LIMITS: Limits = Limits {
        max_ids: 100,
        max_body: 64,
    };

    fn parse(v: Value) -> Result<Command, String> {
        parse_command(&v, LIMITS)
            .map(|e| e.command)
            .map_err(|r| r.reason)
    }

    #[test]
    fn every_command_parses() {
        assert_eq!(
            parse(json!({"type":"FLUSH_QUEUE"})),
            Ok(Command::FlushQueue)
        );
        assert_eq!(parse(json!({"type":"LIST_QUEUE"})), Ok(Command::ListQueue));
        assert_eq!(
            parse(json!({"type":"CLEAR_DEVICE"})),
            Ok(Command::ClearDevice)
        );
        assert_eq!(
            parse(json!({"type":"AUTH_SESSION","userId":"u1"})),
            Ok(Command::AuthSession {
                user: Some("u1".into()),
                authorization: None,
            })
        );
        assert_eq!(
            parse(json!({"type":"AUTH_SESSION","userId":null})),
            Ok(Command::AuthSession {
                user: None,
                authorization: None,
            })
        );
        assert_eq!(
            parse(json!({"type":"AUTH_SESSION","userId":"u1","authorization":"Bearer t.1"})),
            Ok(Command::AuthSession {
                user: Some("u1".into()),
                authorization: Authorization::parse("Bearer t.1").ok(),
            })
        );
        assert_eq!(
            parse(json!({"type":"REBIND_RECORDS","ownerId":"u1"})),
            Ok(Command::RebindRecords {
                owner: "u1".into(),
                ids: None
            })
        );
        assert_eq!(
            parse(json!({"type":"REBIND_RECORDS","ownerId":"u1","ids":[1,2.0]})),
            Ok(Command::RebindRecords {
                owner: "u1".into(),
                ids: Some(vec![RecordId(1), RecordId(2)])
            })
        );
        assert_eq!(
            parse(json!({"type":"RECOVER_RECORD","id":7,"ownerId":"u1","action":"retry-new"})),
            Ok(Command::RecoverRecord {
                id: RecordId(7),
                owner: "u1".into(),
                action: RecoverAction::RetryNew,
                edit: None,
            })
        );
        assert_eq!(
            parse(json!({"type":"SET_NOTIFICATIONS","userId":"u1","enabled":true})),
            Ok(Command::SetNotifications {
                user: "u1".into(),
                enabled: true
            })
        );
        assert_eq!(
            parse(json!({"type":"RECOVER_RECORD","id":7,"ownerId":"u1","action":"discard"})),
            Ok(Command::RecoverRecord {
                id: RecordId(7),
                owner: "u1".into(),
                action: RecoverAction::Discard,
                edit: None,
            })
        );
    }

    #[test]
    fn request_ids_are_echoed() {
        let e =
            parse_command(&json!({"type":"FLUSH_QUEUE","requestId":"r-1"}), LIMITS).expect("ok");
        assert_eq!(e.request_id, Some(json!("r-1")));
        let e = parse_command(&json!({"type":"FLUSH_QUEUE","requestId":42}), LIMITS).expect("ok");
        let v = serde_json::to_value(Outgoing::ok(&e, Some(3))).expect("serialises");
        assert_eq!(
            v,
            json!({"type":"COMMAND_RESULT","command":"FLUSH_QUEUE","ok":true,"affected":3,"requestId":42})
        );
        let r = parse_command(&json!({"type":"NOPE","requestId":"x"}), LIMITS).unwrap_err();
        let v = serde_json::to_value(r.result()).expect("serialises");
        assert_eq!(v["requestId"], "x");
        assert_eq!(v["command"], "NOPE");
        assert_eq!(v["ok"], false);
    }

    /// One case per malformed shape; each reason names the field at fault.
    #[test]
    fn malformed_messages_are_refused_naming_the_field() {
        let cases = [
            (json!("FLUSH_QUEUE"), "type"),
            (json!(null), "type"),
            (json!([1]), "type"),
            (json!({}), "type is required"),
            (json!({"type":5}), "type must be a string"),
            (json!({"type":"FLUSH"}), "type \"FLUSH\""),
            (json!({"type":"FLUSH_QUEUE","requestId":{}}), "requestId"),
            (json!({"type":"FLUSH_QUEUE","requestId":true}), "requestId"),
            (json!({"type":"AUTH_SESSION"}), "userId is required"),
            (json!({"type":"AUTH_SESSION","userId":5}), "userId must"),
            (json!({"type":"AUTH_SESSION","userId":""}), "userId must"),
            (
                json!({"type":"AUTH_SESSION","userId":"u","authorization":5}),
                "authorization must be a string",
            ),
            (
                json!({"type":"AUTH_SESSION","userId":"u","authorization":""}),
                "authorization must be 1 to 8192",
            ),
            (
                json!({"type":"AUTH_SESSION","userId":"u","authorization":format!("Bearer {}", "t".repeat(8186))}),
                "authorization must be 1 to 8192 characters long, got 8193",
            ),
            (
                json!({"type":"AUTH_SESSION","userId":"u","authorization":"Bearer a\nb"}),
                "authorization must be visible ASCII",
            ),
            (
                json!({"type":"AUTH_SESSION","userId":null,"authorization":"Bearer x"}),
                "authorization goes with a userId",
            ),
            (json!({"type":"REBIND_RECORDS"}), "ownerId is required"),
            (
                json!({"type":"REBIND_RECORDS","ownerId":""}),
                "ownerId must",
            ),
            (json!({"type":"REBIND_RECORDS","ownerId":7}), "ownerId must"),
            (
                json!({"type":"REBIND_RECORDS","ownerId":"u","ids":"1,2"}),
                "ids must",
            ),
            (
                json!({"type":"REBIND_RECORDS","ownerId":"u","ids":[1,"2"]}),
                "ids[1]",
            ),
            (
                json!({"type":"REBIND_RECORDS","ownerId":"u","ids":[1.5]}),
                "ids[0]",
            ),
            (
                json!({"type":"REBIND_RECORDS","ownerId":"u","ids":[0]}),
                "ids[0]",
            ),
            (
                json!({"type":"REBIND_RECORDS","ownerId":"u","ids":[-3]}),
                "ids[0]",
            ),
            (
                json!({"type":"REBIND_RECORDS","ownerId":"u","ids":[9007199254740992u64]}),
                "ids[0]",
            ),
            (
                json!({"type":"REBIND_RECORDS","ownerId":"u","ids":(0..101).collect::<Vec<_>>()}),
                "ids may list at most 100",
            ),
            (
                json!({"type":"RECOVER_RECORD","ownerId":"u","action":"discard"}),
                "id is required",
            ),
            (
                json!({"type":"RECOVER_RECORD","id":"7","ownerId":"u","action":"discard"}),
                "id must",
            ),
            (
                json!({"type":"RECOVER_RECORD","id":1e300,"ownerId":"u","action":"discard"}),
                "id must",
            ),
            (
                json!({"type":"RECOVER_RECORD","id":7,"action":"discard"}),
                "ownerId is required",
            ),
            (
                json!({"type":"RECOVER_RECORD","id":7,"ownerId":"u"}),
                "action must",
            ),
            (
                json!({"type":"RECOVER_RECORD","id":7,"ownerId":"u","action":"retry"}),
                "action must",
            ),
            (
                json!({"type":"RECOVER_RECORD","id":7,"ownerId":"u","action":"edit"}),
                "body is required",
            ),
            (
                json!({"type":"RECOVER_RECORD","id":7,"ownerId":"u","action":"edit","body":{}}),
                "body must be a string",
            ),
            (
                json!({"type":"RECOVER_RECORD","id":7,"ownerId":"u","action":"edit","body":"x","bodyEncoding":"hex"}),
                "bodyEncoding must",
            ),
            (
                json!({"type":"RECOVER_RECORD","id":7,"ownerId":"u","action":"edit","body":"*","bodyEncoding":"base64"}),
                "not valid base64",
            ),
            (
                json!({"type":"RECOVER_RECORD","id":7,"ownerId":"u","action":"edit","body":"x".repeat(65)}),
                "over the outbox's limit of 64",
            ),
            (
                json!({"type":"RECOVER_RECORD","id":7,"ownerId":"u","action":"edit","body":"x","contentType":"caf\u{e9}"}),
                "contentType must",
            ),
            (
                json!({"type":"READ_RECORD","ownerId":"u"}),
                "id is required",
            ),
            (
                json!({"type":"READ_RECORD","id":-1,"ownerId":"u"}),
                "id must",
            ),
            (json!({"type":"READ_RECORD","id":3}), "ownerId is required"),
        ];
        for (msg, want) in cases {
            let got = parse(msg.clone()).expect_err("must be refused");
            assert!(got.contains(want), "{msg}: {got:?} should mention {want:?}");
        }
        let r = parse_command(&json!({"type":7}), LIMITS).unwrap_err();
        assert_eq!(
            r.command, None,
            "command is null when type was not a string"
        );
    }

    #[test]
    fn a_record_this_flush_moved_to_needs_attention_is_reported_in_that_state() {
        use crate::core::record::AttentionReason;
        let read_at_start = RecordMeta {
            id: RecordId(4),
            method: "POST".into(),
            path: "/projects/p1/tasks".into(),
            owner: Some("alice".into()),
            workspace: Some("p1".into()),
            state: RecordState::Queued,
            ..RecordMeta::default()
        };
        let moved = BlockedEntry::of(
            read_at_start.id,
            Some(&read_at_start),
            BlockReason::Attention(AttentionReason::Rejected),
            Some("alice"),
        );
        assert_eq!(
            (moved.state, moved.reason.as_str()),
            ("needs-attention", "rejected")
        );
        let behind = BlockedEntry::of(
            read_at_start.id,
            Some(&read_at_start),
            BlockReason::WorkspaceOrder,
            Some("alice"),
        );
        assert_eq!(behind.state, "queued");
    }

    #[test]
    fn another_accounts_records_show_no_method_path_or_workspace() {
        let bobs = RecordMeta {
            id: RecordId(9),
            method: "PATCH".into(),
            path: "/projects/secret-merger/tasks/4".into(),
            owner: Some("bob".into()),
            workspace: Some("secret-merger".into()),
            timestamp: 77,
            body_len: 12,
            last_status: Some(422),
            state: RecordState::NeedsAttention(crate::core::record::AttentionReason::Rejected),
            ..RecordMeta::default()
        };
        for viewer in [Some("alice"), None] {
            let b = serde_json::to_value(BlockedEntry::of(
                bobs.id,
                Some(&bobs),
                BlockReason::OwnerMismatch,
                viewer,
            ))
            .expect("ok");
            assert_eq!(
                b,
                json!({"id":9,"method":null,"path":null,"ownerId":"bob","workspace":null,
                       "state":"needs-attention","reason":"owner-mismatch"})
            );
            let l = serde_json::to_value(ListedRecord::of(&bobs, viewer)).expect("ok");
            assert_eq!(
                l,
                json!({"id":9,"method":null,"path":null,"ownerId":"bob","workspace":null,
                       "state":"needs-attention","attentionReason":"rejected",
                       "lastStatus":null,"timestamp":null,"bodySize":null})
            );
        }
        let own = serde_json::to_value(ListedRecord::of(&bobs, Some("bob"))).expect("ok");
        assert_eq!(own["path"], "/projects/secret-merger/tasks/4");
        assert_eq!(own["workspace"], "secret-merger");
        assert_eq!(own["bodySize"], 12);
    }

    #[test]
    fn read_record_and_edit_parse() {
        assert_eq!(
            parse(json!({"type":"READ_RECORD","id":3,"ownerId":"alice"})),
            Ok(Command::ReadRecord {
                id: RecordId(3),
                owner: "alice".into()
            })
        );
        assert_eq!(
            parse(
                json!({"type":"RECOVER_RECORD","id":3,"ownerId":"alice","action":"edit",
                          "body":"{\"title\":\"ok\"}","contentType":"application/json"})
            ),
            Ok(Command::RecoverRecord {
                id: RecordId(3),
                owner: "alice".into(),
                action: RecoverAction::Edit,
                edit: Some(Edit {
                    body: br#"{"title":"ok"}"#.to_vec(),
                    content_type: Some("application/json".into())
                }),
            })
        );
        let Ok(Command::RecoverRecord { edit: Some(e), .. }) = parse(
            json!({"type":"RECOVER_RECORD","id":3,"ownerId":"alice","action":"edit","body":"/wA=","bodyEncoding":"base64"}),
        ) else {
            panic!("parses");
        };
        assert_eq!(e.body, vec![0xff, 0x00]);
        assert_eq!(e.content_type, None, "kept as it was");
    }

    #[test]
    fn a_record_is_read_as_text_or_base64() {
        let m = RecordMeta {
            id: RecordId(4),
            path: "/projects/p1/tasks".into(),
            content_type: Some("application/json".into()),
            owner: Some("alice".into()),
            last_status: Some(422),
            state: RecordState::NeedsAttention(crate::core::record::AttentionReason::Rejected),
            ..RecordMeta::default()
        };
        let v = serde_json::to_value(Outgoing::Record {
            record: RecordContent::of(&m, br#"{"title":"x"}"#),
            request_id: Some(json!(1)),
        })
        .expect("ok");
        assert_eq!(v["type"], "RECORD");
        assert_eq!(v["record"]["body"], r#"{"title":"x"}"#);
        assert_eq!(v["record"]["bodyEncoding"], "text");
        assert_eq!(v["record"]["attentionReason"], "rejected");
        assert_eq!(v["record"]["lastStatus"], 422);
        assert_eq!(v["record"]["sentBefore"], false);
        assert_eq!(v["requestId"], 1);
        let bin = RecordContent::of(
            &RecordMeta {
                content_type: None,
                ..m
            },
            &[1, 2, 3],
        );
        assert_eq!((bin.body_encoding, bin.body.as_str()), ("base64", "AQID"));
    }

    #[test]
    fn abort_write_and_account_ids() {
        assert_eq!(
            parse(json!({"type":"ABORT_WRITE","idempotencyKey":"k:7f3e"})),
            Ok(Command::AbortWrite {
                key: IdempotencyKey::parse("k:7f3e").expect("valid")
            })
        );
        for (msg, want) in [
            (json!({"type":"ABORT_WRITE"}), "idempotencyKey is required"),
            (
                json!({"type":"ABORT_WRITE","idempotencyKey":7}),
                "idempotencyKey must",
            ),
            (
                json!({"type":"ABORT_WRITE","idempotencyKey":"has space"}),
                "idempotencyKey:",
            ),
            (
                json!({"type":"AUTH_SESSION","userId":"J\u{f6}rg"}),
                "userId must be 1 to 256 visible ASCII",
            ),
            (
                json!({"type":"AUTH_SESSION","userId":"\u{1F600}"}),
                "userId must be 1 to 256",
            ),
            (
                json!({"type":"AUTH_SESSION","userId":"x".repeat(257)}),
                "userId must be 1 to 256",
            ),
            (
                json!({"type":"REBIND_RECORDS","ownerId":" a"}),
                "ownerId must be 1 to 256",
            ),
            (
                json!({"type":"SET_NOTIFICATIONS","userId":"b\u{e9}","enabled":true}),
                "userId must be 1 to 256",
            ),
        ] {
            let got = parse(msg.clone()).expect_err("refused");
            assert!(got.contains(want), "{msg}: {got:?} should mention {want:?}");
        }
    }

    #[test]
    fn message_fields_cover_every_field_a_command_reads() {
        // Each command parses from its fields alone: nothing outside MESSAGE_FIELDS is
        // needed, so the shell may copy only those.
        for msg in [
            json!({"type":"AUTH_SESSION","userId":"u1","requestId":1}),
            json!({"type":"AUTH_SESSION","userId":"u1","authorization":"Bearer x"}),
            json!({"type":"REBIND_RECORDS","ownerId":"u1","ids":[1]}),
            json!({"type":"RECOVER_RECORD","id":7,"ownerId":"u1","action":"discard"}),
            json!({"type":"SET_NOTIFICATIONS","userId":"u1","enabled":true}),
            json!({"type":"ABORT_WRITE","idempotencyKey":"k"}),
            json!({"type":"READ_RECORD","id":1,"ownerId":"u1"}),
            json!({"type":"RECOVER_RECORD","id":1,"ownerId":"u1","action":"edit","body":"eA==","bodyEncoding":"base64","contentType":"text/plain"}),
        ] {
            let obj = msg.as_object().expect("object");
            assert!(
                obj.keys().all(|k| MESSAGE_FIELDS.contains(&k.as_str())),
                "{msg}"
            );
            assert!(parse(msg.clone()).is_ok(), "{msg}");
        }
    }

    #[test]
    fn reports_serialise_in_the_contracts_shape() {
        let unknown = RecordMeta {
            id: RecordId(3),
            path: "/notes".into(),
            ..RecordMeta::default()
        };
        let v = serde_json::to_value(Outgoing::Blocked {
            blocked: vec![BlockedEntry::of(
                RecordId(3),
                Some(&unknown),
                BlockReason::UnknownOwner,
                Some("alice"),
            )],
        })
        .expect("serialises");
        assert_eq!(
            v,
            json!({"type":"MUTATIONS_BLOCKED","blocked":[{"id":3,"method":"POST","path":"/notes","ownerId":null,"workspace":null,"state":"queued","reason":"unknown-owner"}]})
        );
        assert_eq!(
            serde_json::to_value(Outgoing::flush_summary(2, Some(0), 0, None, None)).expect("ok"),
            json!({"type":"MUTATIONS_REPLAYED","count":2})
        );
        assert_eq!(
            serde_json::to_value(Outgoing::flush_summary(2, Some(3), 0, None, None)).expect("ok"),
            json!({"type":"MUTATIONS_PARTIAL","replayed":2,"remaining":3,"stoppedBy":null,"retryAt":null})
        );
        assert_eq!(
            serde_json::to_value(Outgoing::flush_summary(
                2,
                None,
                0,
                Some(StopReason::Storage),
                Some(9)
            ))
            .expect("ok"),
            json!({"type":"MUTATIONS_PARTIAL","replayed":2,"remaining":1,"stoppedBy":"storage","retryAt":9}),
            "an unreadable queue is never claimed drained"
        );
        assert_eq!(
            serde_json::to_value(Outgoing::QueueState {
                records: Vec::new(),
                delivery: Delivery {
                    stopped_by: Some(StopReason::SignedOut),
                    retry_at: None,
                    last_attempt_at: Some(5),
                },
                account: None,
                request_id: None,
            })
            .expect("ok"),
            json!({"type":"QUEUE_STATE","records":[],"delivery":{"stoppedBy":"signed-out","retryAt":null,"lastAttemptAt":5},"account":null})
        );
        assert_eq!(
            serde_json::to_value(Outgoing::QueueState {
                records: Vec::new(),
                delivery: Delivery::default(),
                account: Some("alice".into()),
                request_id: Some(json!("r1")),
            })
            .expect("ok"),
            json!({"type":"QUEUE_STATE","records":[],"delivery":{"stoppedBy":null,"retryAt":null,"lastAttemptAt":null},"account":"alice","requestId":"r1"}),
            "the session's account is always there, null included"
        );
    }

    #[test]
    fn the_r3_reports_serialise_in_the_contracts_shape() {
        let queued = Outgoing::Queued {
            id: RecordId(4),
            method: "POST".into(),
            path: "/projects/p1/tasks".into(),
            workspace: Some("p1".into()),
            owner_id: Some("alice".into()),
            background: false,
        };
        assert_eq!(
            serde_json::to_value(queued).expect("ok"),
            json!({"type":"MUTATION_QUEUED","id":4,"method":"POST","path":"/projects/p1/tasks",
                   "workspace":"p1","ownerId":"alice","background":false})
        );
        let settled = Outgoing::Settled {
            id: RecordId(4),
            idempotency_key: "k-1".into(),
            owner_id: Some("alice".into()),
            status: 201,
            content_type: Some("application/json".into()),
            body: Some(r#"{"id":17}"#.into()),
        };
        assert_eq!(
            serde_json::to_value(settled).expect("ok"),
            json!({"type":"MUTATION_SETTLED","id":4,"idempotencyKey":"k-1","ownerId":"alice",
                   "status":201,"contentType":"application/json","body":"{\"id\":17}"})
        );
        let bare = Outgoing::Settled {
            id: RecordId(5),
            idempotency_key: "k-2".into(),
            owner_id: Some("alice".into()),
            status: 204,
            content_type: None,
            body: None,
        };
        assert_eq!(
            serde_json::to_value(bare).expect("ok"),
            json!({"type":"MUTATION_SETTLED","id":5,"idempotencyKey":"k-2","ownerId":"alice","status":204}),
            "no body field for an answer without a readable one"
        );
        assert_eq!(
            serde_json::to_value(Outgoing::AuthNeeded {
                user_id: "alice".into()
            })
            .expect("ok"),
            json!({"type":"AUTH_NEEDED","userId":"alice"})
        );
    }
}
