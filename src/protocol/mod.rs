//! The messages between pages and the worker (contract sections 5 and 6), typed.
//!
//! Commands are parsed from JSON values (the shell converts the page's message first,
//! with `js::from_value`), so every malformed shape is tested on the host. A refusal
//! always names the field at fault.

use crate::core::planner::BlockReason;
use crate::core::record::{RecordId, RecordMeta, RecordState, MAX_SAFE_INTEGER};
use serde::Serialize;
use serde_json::{Map, Value};

/// What a page may ask for.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    AuthSession {
        user: Option<String>,
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
    },
    ListQueue,
    ClearDevice,
    /// Opt the signed-in account in or out of delivery notifications.
    SetNotifications {
        user: String,
        enabled: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoverAction {
    RetryNew,
    Discard,
}

impl Command {
    pub fn name(&self) -> &'static str {
        match self {
            Command::AuthSession { .. } => "AUTH_SESSION",
            Command::FlushQueue => "FLUSH_QUEUE",
            Command::RebindRecords { .. } => "REBIND_RECORDS",
            Command::RecoverRecord { .. } => "RECOVER_RECORD",
            Command::ListQueue => "LIST_QUEUE",
            Command::ClearDevice => "CLEAR_DEVICE",
            Command::SetNotifications { .. } => "SET_NOTIFICATIONS",
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

/// Parses a page's message. `max_ids` bounds `REBIND_RECORDS.ids` (the queue can never
/// hold more records than `maxRecords`).
pub fn parse_command(msg: &Value, max_ids: usize) -> Result<Envelope, Refusal> {
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
        "AUTH_SESSION" => match obj.get("userId") {
            None => Err("userId is required (a string, or null when signed out)".into()),
            Some(Value::Null) => Ok(Command::AuthSession { user: None }),
            Some(Value::String(s)) if !s.is_empty() => Ok(Command::AuthSession {
                user: Some(s.clone()),
            }),
            Some(_) => Err("userId must be a non-empty string or null".into()),
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
        "RECOVER_RECORD" => {
            let id = match obj.get("id") {
                None => Err("id is required".to_string()),
                Some(v) => record_id(v).ok_or(format!("id {ID_RULE}")),
            };
            id.and_then(|id| {
                let owner = owner_id(obj)?;
                let action = match obj.get("action").and_then(Value::as_str) {
                    Some("retry-new") => RecoverAction::RetryNew,
                    Some("discard") => RecoverAction::Discard,
                    _ => return Err("action must be \"retry-new\" or \"discard\"".into()),
                };
                Ok(Command::RecoverRecord { id, owner, action })
            })
        }
        "SET_NOTIFICATIONS" => match (obj.get("userId"), obj.get("enabled")) {
            (Some(Value::String(u)), Some(Value::Bool(enabled))) if !u.is_empty() => {
                Ok(Command::SetNotifications {
                    user: u.clone(),
                    enabled: *enabled,
                })
            }
            (None, _) => Err("userId is required".into()),
            (Some(Value::String(u)), _) if !u.is_empty() => {
                Err("enabled is required and must be true or false".into())
            }
            _ => Err("userId must be a non-empty string".into()),
        },
        other => Err(format!("type {other:?} is not a command of this outbox")),
    };
    parsed
        .map(|command| Envelope {
            command,
            request_id: request_id.clone(),
        })
        .map_err(refuse)
}

const ID_RULE: &str = "must be a positive safe integer";

fn owner_id(obj: &Map<String, Value>) -> Result<String, String> {
    match obj.get("ownerId") {
        None => Err("ownerId is required".into()),
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(_) => Err("ownerId must be a non-empty string".into()),
    }
}

fn record_id(v: &Value) -> Option<RecordId> {
    let n = v.as_number()?;
    let id = match (n.as_u64(), n.as_f64()) {
        (Some(u), _) => u,
        (None, Some(f)) if f.fract() == 0.0 && f >= 1.0 && f <= MAX_SAFE_INTEGER as f64 => f as u64,
        _ => return None,
    };
    (1..=MAX_SAFE_INTEGER).contains(&id).then_some(RecordId(id))
}

/// One entry of `MUTATIONS_BLOCKED`. Corrupt records have no method or path.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BlockedEntry {
    pub id: RecordId,
    pub method: Option<String>,
    pub path: Option<String>,
    pub owner_id: Option<String>,
    pub workspace: Option<String>,
    pub reason: BlockReason,
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
    pub fn of(m: &RecordMeta) -> ListedRecord {
        let (state, attention_reason) = match m.state {
            RecordState::Queued => ("queued", None),
            RecordState::NeedsAttention(r) => ("needs-attention", Some(r.as_str())),
        };
        ListedRecord {
            id: m.id,
            method: Some(m.method.clone()),
            path: Some(m.path.clone()),
            owner_id: m.owner.clone(),
            workspace: m.workspace.clone(),
            state,
            attention_reason,
            last_status: m.last_status,
            timestamp: Some(m.timestamp),
            body_size: Some(m.body_len),
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
        #[serde(skip_serializing_if = "Option::is_none")]
        request_id: Option<Value>,
    },
    #[serde(rename = "MUTATIONS_BLOCKED")]
    Blocked { blocked: Vec<BlockedEntry> },
    #[serde(rename = "MUTATIONS_REPLAYED")]
    Replayed { count: u64 },
    #[serde(rename = "MUTATIONS_PARTIAL")]
    Partial { replayed: u64, remaining: u64 },
    #[serde(rename = "MUTATION_QUEUED", rename_all = "camelCase")]
    Queued {
        id: RecordId,
        method: String,
        path: String,
        workspace: Option<String>,
        owner_id: Option<String>,
    },
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
    /// what is known to remain.
    pub fn flush_summary(replayed: usize, remaining: Option<usize>, estimate: usize) -> Outgoing {
        match remaining {
            Some(0) => Outgoing::Replayed {
                count: replayed as u64,
            },
            Some(m) => Outgoing::Partial {
                replayed: replayed as u64,
                remaining: m as u64,
            },
            None => Outgoing::Partial {
                replayed: replayed as u64,
                remaining: estimate.max(1) as u64,
            },
        }
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<Command, String> {
        parse_command(&v, 100)
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
                user: Some("u1".into())
            })
        );
        assert_eq!(
            parse(json!({"type":"AUTH_SESSION","userId":null})),
            Ok(Command::AuthSession { user: None })
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
                action: RecoverAction::RetryNew
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
                action: RecoverAction::Discard
            })
        );
    }

    #[test]
    fn request_ids_are_echoed() {
        let e = parse_command(&json!({"type":"FLUSH_QUEUE","requestId":"r-1"}), 1).expect("ok");
        assert_eq!(e.request_id, Some(json!("r-1")));
        let e = parse_command(&json!({"type":"FLUSH_QUEUE","requestId":42}), 1).expect("ok");
        let v = serde_json::to_value(Outgoing::ok(&e, Some(3))).expect("serialises");
        assert_eq!(
            v,
            json!({"type":"COMMAND_RESULT","command":"FLUSH_QUEUE","ok":true,"affected":3,"requestId":42})
        );
        let r = parse_command(&json!({"type":"NOPE","requestId":"x"}), 1).unwrap_err();
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
        ];
        for (msg, want) in cases {
            let got = parse(msg.clone()).expect_err("must be refused");
            assert!(got.contains(want), "{msg}: {got:?} should mention {want:?}");
        }
        let r = parse_command(&json!({"type":7}), 1).unwrap_err();
        assert_eq!(
            r.command, None,
            "command is null when type was not a string"
        );
    }

    #[test]
    fn reports_serialise_in_the_contracts_shape() {
        let v = serde_json::to_value(Outgoing::Blocked {
            blocked: vec![BlockedEntry {
                id: RecordId(3),
                method: Some("POST".into()),
                path: Some("/notes".into()),
                owner_id: None,
                workspace: None,
                reason: BlockReason::UnknownOwner,
            }],
        })
        .expect("serialises");
        assert_eq!(
            v,
            json!({"type":"MUTATIONS_BLOCKED","blocked":[{"id":3,"method":"POST","path":"/notes","ownerId":null,"workspace":null,"reason":"unknown-owner"}]})
        );
        assert_eq!(
            serde_json::to_value(Outgoing::flush_summary(2, Some(0), 0)).expect("ok"),
            json!({"type":"MUTATIONS_REPLAYED","count":2})
        );
        assert_eq!(
            serde_json::to_value(Outgoing::flush_summary(2, Some(3), 0)).expect("ok"),
            json!({"type":"MUTATIONS_PARTIAL","replayed":2,"remaining":3})
        );
        assert_eq!(
            serde_json::to_value(Outgoing::flush_summary(2, None, 0)).expect("ok"),
            json!({"type":"MUTATIONS_PARTIAL","replayed":2,"remaining":1}),
            "an unreadable queue is never claimed drained"
        );
    }
}
