//! One record's replay (contract 4.4, 4.5, 4.7), as a lane runs it: marked in flight
//! (its first send stored before the request leaves), its age checked against the key
//! window again, the request built from what was stored, the sign-in barrier checked
//! right before `fetch()`, the answer read within bounds and classified, and its new
//! state handed to the group commit.

use crate::core::answer::{
    after_recheck, check_age, classify, replay_unavailable_status, settle, Age, AnswerBody,
    ReplayAnswer, Settlement, Verdict,
};
use crate::core::barrier::Checked;
use crate::core::content::is_textual;
use crate::core::credential::Credential;
use crate::core::key::IdempotencyKey;
use crate::core::record::{AttentionReason, Credentials, RecordId, RecordMeta, RecordState};
use crate::core::route::replay_path;
use crate::protocol::Outgoing;
use crate::store::{ReplayStep, StepDone};
use crate::worker::fetch::IDEMPOTENCY_KEY;
use crate::worker::http::{discard_body, header, read_bounded, send, Deadline};
use crate::worker::steps::StepAhead;
use crate::worker::{absolute, now_ms, Inner};
use std::rc::Rc;
use wasm_bindgen::JsValue;
use web_sys::{
    Headers, RequestCache, RequestCredentials, RequestInit, RequestRedirect, Response, ResponseType,
};

/// Why a record handed to its lane was not sent, though nothing failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Held {
    /// A sign-in was seen since the identity was checked.
    SignIn,
    /// Its age cannot be known: the clock reads earlier than its first send.
    Clock,
    /// It was not there (or no longer readable) when its lane took it.
    Gone,
}

/// One record's replay, as the lane reports it back to the flush.
pub(super) struct Sent {
    pub id: RecordId,
    pub verdict: Verdict,
    /// The reason it now needs a person, when its answer moved it there.
    pub attention: Option<AttentionReason>,
    /// `false`: the record could not be read or marked for sending, and the flush stops.
    pub persisted: bool,
    /// The identity check it was sent under.
    pub generation: u32,
    /// Not sent, and why.
    pub held: Option<Held>,
    /// A 2xx answer, for `MUTATION_SETTLED` (r3).
    pub settled: Option<Answered>,
    /// The request carried the session's credential (a 401 to it asks for a new one).
    pub carried_credential: bool,
    /// Its request left (or may have): its mark stays. `false`: its mark is cleared.
    pub left: bool,
}

impl Sent {
    fn done(id: RecordId, generation: u32, verdict: Verdict, persisted: bool) -> Sent {
        Sent {
            id,
            verdict,
            attention: None,
            persisted,
            generation,
            held: None,
            settled: None,
            carried_credential: false,
            left: false,
        }
    }

    fn held(id: RecordId, generation: u32, why: Held) -> Sent {
        Sent {
            held: Some(why),
            ..Sent::done(id, generation, Verdict::NetworkFailure, true)
        }
    }

    /// Nothing was sent and the record's state is not known to be stored: the flush
    /// stops.
    fn not_stored(id: RecordId, generation: u32) -> Sent {
        Sent::done(id, generation, Verdict::NetworkFailure, false)
    }
}

/// A replayed write's 2xx answer as pages get it (r3, contract 5): its status, and its
/// body when it is text or JSON read whole within 64 KiB and the attempt's deadline.
pub(super) struct Answered {
    key: String,
    owner: Option<String>,
    status: u16,
    content_type: Option<String>,
    body: Option<String>,
}

impl Answered {
    /// The report, with the account whose windows get it.
    pub fn report(self, id: RecordId) -> (String, Outgoing) {
        let account = self.owner.clone().unwrap_or_default();
        (
            account,
            Outgoing::Settled {
                id,
                idempotency_key: self.key,
                owner_id: self.owner,
                status: self.status,
                content_type: self.content_type,
                body: self.body,
            },
        )
    }
}

/// What a lane is given with its record: the identity it is sent under.
pub(super) struct Ticket {
    pub csrf: Option<String>,
    /// A bearer session's credential: sent with the records of its own account.
    pub credential: Option<Credential>,
    /// Its in-flight mark, handed to the group commit when it was handed out or ahead
    /// of it (`marks`): awaited before anything is sent.
    pub mark: StepAhead,
    pub generation: u32,
    /// The record's one stale-identity re-check was made before it was handed out (r4:
    /// once per record).
    pub final_stale: bool,
    pub checked: Checked,
}

/// Sends one record and hands over what its answer means.
pub(super) async fn send_one(inner: &Rc<Inner>, id: RecordId, ticket: Ticket) -> Sent {
    let Ticket {
        csrf,
        credential,
        mark,
        generation,
        final_stale,
        checked,
    } = ticket;
    // The sign-in barrier, before the record's mark is awaited.
    if !inner.replay_allowed(checked) {
        return Sent::held(id, generation, Held::SignIn);
    }
    let (meta, body) = match begin(inner, id, mark, generation).await {
        Ok(found) => found,
        Err(sent) => return sent,
    };
    let Some(key) = key_of(inner, id, &meta).await else {
        return Sent::not_stored(id, generation);
    };
    let sent_as = (csrf.as_deref(), credential.as_ref());
    let Some((init, carried_credential)) = request(inner, &meta, &key, sent_as, body) else {
        return Sent::not_stored(id, generation);
    };
    let url = absolute(&replay_path(&meta.path, &inner.config));
    // The sign-in barrier, right before `fetch()`: nothing is awaited between this check
    // and the request leaving (`send` calls `fetch` before its first await), so a
    // sign-in seen while this record was being marked stops it here (r3, 4.5 end).
    if !inner.replay_allowed(checked) {
        return Sent::held(id, generation, Held::SignIn);
    }
    // A step of the flush failed since this record's mark committed ahead (the database
    // closed under the flush, say): the flush stops rather than send what it could not
    // record the answer of.
    if inner.steps_failed() {
        return Sent::not_stored(id, generation);
    }
    let (verdict, two_xx) = match send(&init, &url, inner.config.attempt_timeout_ms, None).await {
        Err(_) => {
            inner.network_failed();
            (classify(None, now_ms()), None)
        }
        Ok((response, deadline)) => {
            inner.network_answered();
            let v = read_answer(response, &deadline).await;
            drop(deadline);
            v
        }
    };
    // After the record's identity re-check (r4: one per record), a 403 is the server's
    // refusal (r3).
    let verdict = if final_stale {
        after_recheck(verdict)
    } else {
        verdict
    };
    let attention = hand_over(inner, id, &meta, &verdict);
    let settled = two_xx
        .filter(|_| verdict == Verdict::Replayed)
        .map(|a| Answered {
            key: key.as_str().to_owned(),
            owner: meta.owner.clone(),
            status: a.status,
            content_type: a.content_type,
            body: a.body,
        });
    Sent {
        attention,
        settled,
        carried_credential,
        left: true,
        ..Sent::done(id, generation, verdict, true)
    }
}

/// The record marked in flight (its first send stored, strictly when it never left) and
/// read with its body; then the key window checked again, now that it is in its lane
/// (r3, 4.7): the flush may have run long since it started, and the clock may have
/// moved. `Err`: what the lane reports instead of sending.
async fn begin(
    inner: &Rc<Inner>,
    id: RecordId,
    mark: StepAhead,
    generation: u32,
) -> Result<(RecordMeta, Option<JsValue>), Sent> {
    let (meta, body) = match mark.result().await {
        Ok(StepDone::Begun(Some(found))) => found,
        // Gone (cleared) or unreadable since it was planned: nothing sent, nothing counted.
        Ok(_) => return Err(Sent::held(id, generation, Held::Gone)),
        Err(_) => return Err(Sent::not_stored(id, generation)),
    };
    match check_age(&meta, now_ms(), &inner.config) {
        Age::Sendable => Ok((meta, body)),
        Age::Unknown => Err(Sent::held(id, generation, Held::Clock)),
        Age::Expired(m) => {
            let reason = match m.state {
                RecordState::NeedsAttention(r) => r,
                RecordState::Queued => AttentionReason::KeyExpired,
            };
            inner.hand_over_step(ReplayStep::Update(id, m.mutable_fields()), None);
            let verdict = Verdict::Attention {
                reason,
                status: m.last_status.unwrap_or(0),
            };
            Err(Sent {
                attention: Some(reason),
                ..Sent::done(id, generation, verdict, true)
            })
        }
    }
}

/// The record's key; one minted and stored first for a record that has none (an
/// adopted record of an old schema). `None`: no key could be minted or stored.
async fn key_of(inner: &Inner, id: RecordId, meta: &RecordMeta) -> Option<IdempotencyKey> {
    if let Some(k) = &meta.key {
        return Some(k.clone());
    }
    let k = IdempotencyKey::mint_opt()?;
    let mut m = meta.clone();
    m.key = Some(k.clone());
    inner
        .store
        .write_fields(id, &m.mutable_fields())
        .await
        .ok()?;
    Some(k)
}

/// The replay's request (contract 4.4): the stored method, body and `Content-Type`, the
/// page's allowed headers, then the ones the outbox owns; never a redirect followed.
/// With whether it carries the session's credential.
fn request(
    inner: &Inner,
    meta: &RecordMeta,
    key: &IdempotencyKey,
    (csrf, credential): (Option<&str>, Option<&Credential>),
    body: Option<JsValue>,
) -> Option<(RequestInit, bool)> {
    let cfg = &inner.config;
    let headers = Headers::new().ok()?;
    // The page's own headers first (only those `replayHeaders` allows were stored, and
    // they are checked again here), then the ones the outbox owns.
    for (name, value) in &meta.headers {
        if cfg.stores_header(name) {
            let _ = headers.append(name, value);
        }
    }
    let _ = headers.set(IDEMPOTENCY_KEY, key.as_str());
    if let Some(owner) = &meta.owner {
        let _ = headers.set(&cfg.expected_account_header, owner);
    }
    if let Some(t) = csrf {
        let _ = headers.set(&cfg.csrf_header, t);
    }
    // The session's credential, for its own account's records only (r3); a page's own
    // `Authorization` is never stored, so this is the only one a replay carries.
    let authorization = credential.and_then(|c| c.for_owner(meta.owner.as_deref()));
    let carried_credential =
        authorization.is_some_and(|a| headers.set("Authorization", a.as_str()).is_ok());
    if let Some(ct) = &meta.content_type {
        let _ = headers.set("Content-Type", ct);
    }
    let init = RequestInit::new();
    init.set_method(&meta.method);
    init.set_headers(&headers);
    init.set_credentials(credentials_mode(meta.credentials));
    init.set_cache(RequestCache::NoStore);
    // A redirect is never followed: a 303 would turn the write into a GET that answers
    // 200, and a 307 to another origin would resend the body there (contract 4.4).
    init.set_redirect(RequestRedirect::Manual);
    if let Some(body) = &body {
        init.set_body(body);
    }
    Some((init, carried_credential))
}

fn credentials_mode(c: Credentials) -> RequestCredentials {
    match c {
        Credentials::Include => RequestCredentials::Include,
        Credentials::SameOrigin => RequestCredentials::SameOrigin,
        Credentials::Omit => RequestCredentials::Omit,
    }
}

/// What the answer means for the record (`core::answer::settle`), handed to the group
/// commit and not awaited: the next record of its lane may be handed out before it
/// committed, as that record's own mark commits after it (and fails if it failed); the
/// flush waits for every step before it reports. The reason it now needs a person, if
/// it does.
fn hand_over(
    inner: &Rc<Inner>,
    id: RecordId,
    meta: &RecordMeta,
    verdict: &Verdict,
) -> Option<AttentionReason> {
    let settlement = settle(meta, verdict, &inner.config, now_ms());
    let attention = settlement.moved_to_attention();
    match settlement {
        Settlement::Unchanged => {}
        Settlement::Delete => {
            inner.hand_over_delete(ReplayStep::Delete(id), inner.record_lane(meta))
        }
        Settlement::Update(m) => {
            inner.hand_over_step(ReplayStep::Update(id, m.mutable_fields()), None)
        }
    }
    attention
}

/// A 2xx answer's status and readable body.
struct TwoXx {
    status: u16,
    content_type: Option<String>,
    body: Option<String>,
}

/// The answer as `core::answer::classify` reads it, its body read within bounds; for a
/// 2xx, what pages are told of it (`MUTATION_SETTLED`, r3): the body is read only when
/// it is text or JSON, at most 64 KiB, within the attempt's deadline — a bigger,
/// binary, stalled or cut one is not given, and the write is settled all the same.
async fn read_answer(response: Response, deadline: &Deadline) -> (Verdict, Option<TwoXx>) {
    let headers = response.headers();
    let retry_after = header(&headers, "Retry-After");
    let replayed = header(&headers, "Idempotent-Replayed")
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    let status = response.status();
    let content_type = header(&headers, "Content-Type");
    let opaque_redirect = response.type_() == ResponseType::Opaqueredirect;
    let two_xx = (200..300).contains(&status) && !opaque_redirect;
    if two_xx {
        let body = if is_textual(content_type.as_deref()) {
            let read = read_bounded(&response, deadline).await;
            (read.complete && !read.text.is_empty()).then_some(read.text)
        } else {
            discard_body(&response);
            None
        };
        let verdict = classify(Some(ReplayAnswer::status(status)), now_ms());
        let answered = TwoXx {
            status,
            content_type: content_type.filter(|_| body.is_some()),
            body,
        };
        return (verdict, Some(answered));
    }
    let body = if opaque_redirect {
        discard_body(&response);
        None
    } else {
        Some(read_bounded(&response, deadline).await)
    };
    let json = body.as_ref().and_then(|b| b.json());
    let answer_body = match (&json, &body) {
        (Some(v), _) => AnswerBody::Json(v),
        (None, Some(b)) if !b.text.is_empty() => AnswerBody::Text(&b.text),
        _ => AnswerBody::None,
    };
    let answer = ReplayAnswer {
        status,
        opaque_redirect,
        retry_after: retry_after.as_deref(),
        replayed,
        body: answer_body,
    };
    let verdict = classify(Some(answer), now_ms());
    // A ledger that kept only the status of a 2xx (`idempotency_replay_unavailable`):
    // settled with that status, no body.
    let stored = replay_unavailable_status(&answer)
        .filter(|_| verdict == Verdict::Replayed)
        .map(|status| TwoXx {
            status,
            content_type: None,
            body: None,
        });
    (verdict, stored)
}
