//! What a replay's answer means (contract section 4.5), and the record change it makes.

use super::config::Config;
use super::record::{AttentionReason, RecordMeta, RecordState};
use super::text;
use serde_json::Value;

/// An answer's body as far as classification reads it (bounded by the shell: at most
/// 64 KiB, within `attemptTimeoutMs`).
#[derive(Debug, Clone, Copy)]
pub enum AnswerBody<'a> {
    /// Not read (a 2xx), empty, cut off, or unreadable.
    None,
    /// Parsed JSON (`application/json`, `application/problem+json`, …).
    Json(&'a Value),
    /// Text that is not JSON (an HTML error page, say).
    Text(&'a str),
}

/// An HTTP answer to a replay, reduced to what classification reads.
#[derive(Debug, Clone, Copy)]
pub struct ReplayAnswer<'a> {
    pub status: u16,
    /// A redirect the browser did not follow (`redirect: "manual"` gives an
    /// `opaqueredirect` answer with status 0).
    pub opaque_redirect: bool,
    /// The raw `Retry-After` header.
    pub retry_after: Option<&'a str>,
    /// `Idempotent-Replayed: true`: the server answered from its ledger.
    pub replayed: bool,
    pub body: AnswerBody<'a>,
}

impl<'a> ReplayAnswer<'a> {
    /// An answer with a status and nothing else (tests, and the shell's fallbacks).
    pub fn status(status: u16) -> ReplayAnswer<'a> {
        ReplayAnswer {
            status,
            opaque_redirect: false,
            retry_after: None,
            replayed: false,
            body: AnswerBody::None,
        }
    }
}

/// The meaning of one replay's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// 2xx (a ledger replay included): delete the record.
    Replayed,
    /// 401: the session ended; stop the flush, leave the record.
    SignedOut,
    /// 403 with a CSRF failure, or 409 `account_mismatch`: the session changed since the
    /// flush's identity check (a sign-in in another tab). Checked again once, then
    /// resent once; a second one stops the flush, the record unchanged (r2).
    StaleIdentity { status: u16 },
    /// A 409 that is not outcome-unknown: another request with this key is still
    /// running (`idempotency_in_progress`, the IETF draft's and express-idempotency's
    /// bare 409). The record waits; `maxServerFailures` in a row need a person.
    InProgress,
    /// The record now needs a person; `status` is kept.
    Attention {
        reason: AttentionReason,
        status: u16,
    },
    /// 429, or 503 with `Retry-After`: stop the flush; the next automatic one waits
    /// (never longer than `maxRetryAfterMs`, which `Backoff` applies).
    RetryLater { after_ms: Option<u64> },
    /// Another 5xx: counts towards `maxServerFailures`.
    ServerFailure { status: u16 },
    /// The network failed or the attempt timed out: stop, leave the record.
    NetworkFailure,
}

impl Verdict {
    /// Whether this outcome ends the whole flush (nothing more is sent). A stale
    /// identity ends it only when the flush cannot check again (`worker::flush`).
    pub fn stops_flush(&self) -> bool {
        matches!(
            self,
            Verdict::SignedOut
                | Verdict::RetryLater { .. }
                | Verdict::NetworkFailure
                | Verdict::StaleIdentity { .. }
        )
    }
}

const OUTCOME_UNKNOWN: &str = "idempotency_outcome_unknown";
const OUTCOME_UNKNOWN_CODE: &str = "PM_IDEMPOTENCY_OUTCOME_UNKNOWN";
const KEY_REUSED: &str = "idempotency_key_reused";
const ACCOUNT_MISMATCH: &str = "account_mismatch";
const REPLAY_UNAVAILABLE: &str = "idempotency_replay_unavailable";
/// Stripe's error type for a key used with another request.
const STRIPE_IDEMPOTENCY_ERROR: &str = "idempotency_error";

/// The string fields an error body may carry a code or a description in: the reference
/// server's `detail`/`code`, problem+json's `type`/`title`/`detail`, and Stripe-style
/// `{"error":{"type","code","message"}}`.
fn error_strings<'a>(body: AnswerBody<'a>) -> impl Iterator<Item = &'a str> {
    let json = match body {
        AnswerBody::Json(v) => Some(v),
        _ => None,
    };
    let top = ["detail", "code", "type", "title", "error", "message"]
        .into_iter()
        .filter_map(move |f| json.and_then(|b| b.get(f)).and_then(Value::as_str));
    let nested = ["type", "code", "message"]
        .into_iter()
        .filter_map(move |f| {
            json.and_then(|b| b.get("error"))
                .and_then(|e| e.get(f))
                .and_then(Value::as_str)
        });
    top.chain(nested)
}

/// Whether the body carries exactly this code in `detail` or `code` (the reference
/// server's and this contract's idempotency codes). A body that is not JSON, or was cut
/// at the read bound (so it no longer parses), carries it when it names the code as a
/// whole word: a 409 `idempotency_outcome_unknown` with a huge body still needs a
/// person rather than being resent as a bare 409.
fn has_code(body: AnswerBody<'_>, code: &str) -> bool {
    match body {
        AnswerBody::Json(v) => ["detail", "code"]
            .into_iter()
            .any(|f| v.get(f).and_then(Value::as_str) == Some(code)),
        AnswerBody::Text(t) => names_word(t, code),
        AnswerBody::None => false,
    }
}

/// `word` occurs in `text` with no letter, digit or `_` on either side.
fn names_word(text: &str, word: &str) -> bool {
    let part = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    text::match_starts(text, word).any(|at| {
        !part(text::span(text, 0, at).chars().next_back())
            && !part(text::tail(text, at + word.len()).chars().next())
    })
}

/// Whether the body names `word` anywhere a server puts an error's code or words
/// (case-insensitive), JSON fields or plain text (an HTML error page).
fn mentions(body: AnswerBody<'_>, word: &str) -> bool {
    let hit = |s: &str| text::contains(&s.to_ascii_lowercase(), word);
    match body {
        AnswerBody::Text(t) => hit(t),
        _ => error_strings(body).any(hit),
    }
}

/// A CSRF refusal: a 403 whose error says that a CSRF check failed (the reference
/// server's `{"detail":"csrf_failed"}`, csurf's `EBADCSRFTOKEN` / "invalid csrf token",
/// Django's "CSRF verification failed" page, Spring's "Invalid CSRF Token", gorilla's
/// "CSRF token invalid"). Narrowly (r3): a page that merely carries a token — a Rails
/// layout's `<meta name="csrf-token">`, Django's `csrfmiddlewaretoken` field — around a
/// permission refusal is not one; only the words a person would read count (markup,
/// scripts and styles are not read), and only a word naming CSRF next to a word of
/// failure.
fn is_csrf_failure(a: &ReplayAnswer<'_>) -> bool {
    if a.status != 403 {
        return false;
    }
    match a.body {
        AnswerBody::Text(t) => states_csrf_failure(&visible_text(t)),
        body => error_strings(body).any(states_csrf_failure),
    }
}

/// Stems of the words that say a check failed.
const FAILURE_STEMS: [&str; 10] = [
    "fail",
    "invalid",
    "mismatch",
    "missing",
    "expired",
    "bad",
    "incorrect",
    "wrong",
    "verif",
    "reject",
];

/// How many words apart a CSRF word and a failure word may stand ("CSRF token is
/// missing", "Could not verify the provided CSRF token").
const CSRF_FAILURE_SPAN: usize = 3;

/// Whether `text` says a CSRF check failed: a word naming CSRF (or XSRF) that holds a
/// failure stem itself (`csrf_failed` splits in two; `EBADCSRFTOKEN` does not) or stands
/// within [`CSRF_FAILURE_SPAN`] words of one.
fn states_csrf_failure(text: &str) -> bool {
    let lower = text.to_ascii_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let failing = |w: &str| FAILURE_STEMS.iter().any(|s| text::contains(w, s));
    words.iter().enumerate().any(|(i, w)| {
        (text::contains(w, "csrf") || text::contains(w, "xsrf"))
            && words
                [i.saturating_sub(CSRF_FAILURE_SPAN)..(i + CSRF_FAILURE_SPAN + 1).min(words.len())]
                .iter()
                .any(|n| failing(n))
    })
}

/// The text of a page as a person reads it: tags (with their attributes), comments,
/// scripts and styles removed. A body that is not markup comes back as it was.
fn visible_text(body: &str) -> String {
    let mut out = String::with_capacity(body.len());
    let lower = body.to_ascii_lowercase();
    let mut at = 0;
    while let Some(open) = text::tail(body, at).find('<').map(|i| at + i) {
        out.push_str(text::span(body, at, open));
        out.push(' ');
        let rest = text::tail(&lower, open);
        let skip_to = |end: &str| text::find(rest, end).map(|i| open + i + end.len());
        let close = if rest.starts_with("<!--") {
            skip_to("-->")
        } else if rest.starts_with("<script") {
            skip_to("</script>")
        } else if rest.starts_with("<style") {
            skip_to("</style>")
        } else {
            skip_to(">")
        };
        match close {
            Some(c) => at = c,
            // An unclosed tag (a body cut at the read bound): the rest is markup.
            None => return out,
        }
    }
    out.push_str(text::tail(body, at));
    out
}

/// A key used with another request: the reference server's 422 `idempotency_key_reused`,
/// a 422 whose problem details name idempotency (the IETF draft), Stripe's
/// `idempotency_error` (a 400), express-idempotency's 417.
fn is_key_misuse(a: &ReplayAnswer<'_>) -> bool {
    let stripe = || {
        let AnswerBody::Json(v) = a.body else {
            return false;
        };
        v.get("error")
            .and_then(|e| e.get("type"))
            .and_then(Value::as_str)
            == Some(STRIPE_IDEMPOTENCY_ERROR)
    };
    match a.status {
        417 => true,
        422 => has_code(a.body, KEY_REUSED) || mentions(a.body, "idempotenc"),
        400 => stripe(),
        _ => false,
    }
}

/// The reference ledger's 409 `idempotency_replay_unavailable`: the first attempt
/// finished, but its answer was too large to store, so only its `status` is given back.
/// That status decides as the answer itself would have.
/// The status a ledger stored for an answer it could not replay whole (409
/// `idempotency_replay_unavailable` with `status`): the outcome of the write, which a
/// 2xx settles (r3: `MUTATION_SETTLED` carries that status, with no body).
pub fn replay_unavailable_status(a: &ReplayAnswer<'_>) -> Option<u16> {
    if a.status != 409 || !has_code(a.body, REPLAY_UNAVAILABLE) {
        return None;
    }
    let AnswerBody::Json(v) = a.body else {
        return None;
    };
    v.get("status")
        .and_then(Value::as_u64)
        .filter(|s| (100..=599).contains(s))
        .map(|s| s as u16)
}

/// Classifies a replay's answer (`None`: the network failed or the attempt timed out):
/// contract 4.5, one arm per row, in the table's order of precedence.
/// `now_ms` turns an HTTP-date `Retry-After` into a delay.
pub fn classify(answer: Option<ReplayAnswer<'_>>, now_ms: u64) -> Verdict {
    let Some(a) = answer else {
        return Verdict::NetworkFailure;
    };
    let attention = |reason| Verdict::Attention {
        reason,
        status: a.status,
    };
    let outcome_unknown = (a.status == 409 && has_code(a.body, OUTCOME_UNKNOWN))
        || has_code(a.body, OUTCOME_UNKNOWN_CODE);
    if let Some(stored) = replay_unavailable_status(&a) {
        return match stored {
            200..=299 => Verdict::Replayed,
            500..=599 => Verdict::Attention {
                reason: AttentionReason::Repeated5xx,
                status: stored,
            },
            _ => Verdict::Attention {
                reason: AttentionReason::Rejected,
                status: stored,
            },
        };
    }
    match a.status {
        _ if a.opaque_redirect => attention(AttentionReason::Redirected),
        200..=299 => Verdict::Replayed,
        300..=399 => attention(AttentionReason::Redirected),
        401 => Verdict::SignedOut,
        _ if outcome_unknown => attention(AttentionReason::OutcomeUnknown),
        403 if is_csrf_failure(&a) => Verdict::StaleIdentity { status: 403 },
        409 if has_code(a.body, ACCOUNT_MISMATCH) => Verdict::StaleIdentity { status: 409 },
        409 => Verdict::InProgress,
        _ if is_key_misuse(&a) => attention(AttentionReason::KeyReused),
        429 => Verdict::RetryLater {
            after_ms: a.retry_after.and_then(|r| parse_retry_after(r, now_ms)),
        },
        500..=599 if a.replayed => attention(AttentionReason::Repeated5xx),
        503 if a.retry_after.is_some() => Verdict::RetryLater {
            after_ms: a.retry_after.and_then(|r| parse_retry_after(r, now_ms)),
        },
        status @ 500..=599 => Verdict::ServerFailure { status },
        _ => attention(AttentionReason::Rejected),
    }
}

/// A stale-identity answer to a replay sent after its record's identity re-check
/// (contract 4.5, r3; r4: one per record): a second 403 is the server's refusal — `needs-attention`,
/// `rejected`, its status kept — not a stall of the whole queue; a second
/// `account_mismatch` stays a stop of the flush (reported, `account-mismatch`).
pub fn after_recheck(verdict: Verdict) -> Verdict {
    match verdict {
        Verdict::StaleIdentity { status: 403 } => Verdict::Attention {
            reason: AttentionReason::Rejected,
            status: 403,
        },
        other => other,
    }
}

/// `Retry-After` as a delay in milliseconds: delta-seconds or an IMF-fixdate HTTP date
/// (a date in the past is no delay). `None` when it is neither.
pub fn parse_retry_after(value: &str, now_ms: u64) -> Option<u64> {
    let v = value.trim();
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) {
        return v.parse::<u64>().ok().map(|s| s.saturating_mul(1000));
    }
    parse_http_date_ms(v).map(|at| at.saturating_sub(now_ms))
}

/// Parses `Sun, 06 Nov 1994 08:49:37 GMT` into milliseconds since the epoch.
fn parse_http_date_ms(s: &str) -> Option<u64> {
    let rest = text::tail(s, text::find(s, ", ")? + 2);
    let parts: Vec<&str> = rest.split(' ').collect();
    let [day, month, year, time, "GMT"] = parts.as_slice() else {
        return None;
    };
    let day: u64 = day.parse().ok()?;
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| m == month)? as u64
        + 1;
    let year: i64 = year.parse().ok()?;
    let hms: Vec<u64> = time
        .split(':')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    let [h, m, sec] = hms.as_slice() else {
        return None;
    };
    if !(1..=31).contains(&day) || *h > 23 || *m > 59 || *sec > 60 || year < 1970 {
        return None;
    }
    if year > MAX_DATE_YEAR {
        // A date further than any clock reaches (IMF-fixdate has four digits): as far
        // as can be; the backoff bounds it by maxRetryAfterMs. Never computed, so a huge
        // year cannot overflow the arithmetic below.
        return Some(u64::MAX);
    }
    let days = days_from_civil(year, month, day);
    Some(((days as u64) * 86_400 + h * 3600 + m * 60 + sec) * 1000)
}

/// The last year an HTTP date is computed for; later ones read as "as far as can be".
const MAX_DATE_YEAR: i64 = 9999;

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u64, d: u64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = m as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// What to do with a stored record after an outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum Settlement {
    Delete,
    /// Write these fields over the stored record.
    Update(Box<RecordMeta>),
    Unchanged,
}

impl Settlement {
    /// The reason the record now needs a person, when this settlement moves it there.
    pub fn moved_to_attention(&self) -> Option<AttentionReason> {
        match self {
            Settlement::Update(m) => match m.state {
                RecordState::NeedsAttention(r) => Some(r),
                RecordState::Queued => None,
            },
            _ => None,
        }
    }
}

/// The record change of a verdict, answered at `now_ms`. A 5xx counts towards
/// `maxServerFailures`; at the limit the record needs attention (`repeated-5xx`). A 409
/// "still running" is patience (r4, 4.5): the record needs attention (`conflict`) only
/// once such answers in a row number `maxServerFailures` and have lasted
/// `stillRunningPatienceMs` since the first of them — a slow first attempt is waited for.
pub fn settle(record: &RecordMeta, verdict: &Verdict, config: &Config, now_ms: u64) -> Settlement {
    let limit = config.max_server_failures;
    match verdict {
        Verdict::Replayed => Settlement::Delete,
        Verdict::SignedOut
        | Verdict::StaleIdentity { .. }
        | Verdict::RetryLater { .. }
        | Verdict::NetworkFailure => Settlement::Unchanged,
        Verdict::Attention { reason, status } => {
            let mut r = record.clone();
            r.state = RecordState::NeedsAttention(*reason);
            r.last_status = Some(*status);
            Settlement::Update(Box::new(r))
        }
        Verdict::InProgress => {
            let mut r = record.clone();
            r.conflicts = r.conflicts.saturating_add(1);
            // The first of the row starts the time; so does the next answer after a
            // clock that moved back (a start in the future would wait past the window).
            let since = match r.conflicts_since {
                Some(t) if t <= now_ms => t,
                _ => now_ms,
            };
            r.conflicts_since = Some(since);
            let waited = now_ms - since;
            if r.conflicts >= limit && waited >= config.still_running_patience_ms {
                r.state = RecordState::NeedsAttention(AttentionReason::Conflict);
                r.last_status = Some(409);
            }
            Settlement::Update(Box::new(r))
        }
        Verdict::ServerFailure { status } => {
            let mut r = record.clone();
            r.server_failures = r.server_failures.saturating_add(1);
            r.conflicts = 0;
            r.conflicts_since = None;
            r.last_status = Some(*status);
            if r.server_failures >= limit {
                r.state = RecordState::NeedsAttention(AttentionReason::Repeated5xx);
            }
            Settlement::Update(Box::new(r))
        }
    }
}

/// What the age rules say of a queued record now.
#[derive(Debug, Clone, PartialEq)]
pub enum Age {
    /// It may be sent.
    Sendable,
    /// It needs a person now (`key-expired` or `expired`): the record as it becomes.
    Expired(Box<RecordMeta>),
    /// Its age cannot be known: the clock reads earlier than its first send. The key
    /// window fails closed (r3): it is not sent until the clock has passed that time.
    Unknown,
}

/// Age rules, checked when a flush starts and again when a record is handed to its lane
/// (contract 4.5 "expired" and 4.7): a record that may have reached the server (it was
/// sent once) and whose first send is older than `serverKeyTtlMs` is `key-expired` —
/// the server may have forgotten its key, and resending it could apply it twice; one
/// older than `maxRetentionMs` is `expired`. A record that never left the worker is not
/// key-expired however old it is. A first send later than the clock's now is an age
/// that cannot be known, never an age of 0 (r3). Nothing is ever deleted for age.
pub fn check_age(record: &RecordMeta, now_ms: u64, config: &Config) -> Age {
    if record.state != RecordState::Queued {
        return Age::Sendable;
    }
    let reason = match record.first_sent_at {
        Some(sent) if now_ms < sent => return Age::Unknown,
        Some(sent) if now_ms - sent > config.server_key_ttl_ms => AttentionReason::KeyExpired,
        _ if now_ms.saturating_sub(record.timestamp) > config.max_retention_ms => {
            AttentionReason::Expired
        }
        _ => return Age::Sendable,
    };
    let mut r = record.clone();
    r.state = RecordState::NeedsAttention(reason);
    Age::Expired(Box::new(r))
}

/// The record as the age rules leave it, when they move it to needs-attention.
pub fn expire(record: &RecordMeta, now_ms: u64, config: &Config) -> Option<RecordMeta> {
    match check_age(record, now_ms, config) {
        Age::Expired(r) => Some(*r),
        Age::Sendable | Age::Unknown => None,
    }
}

/// The package README's words on a CSRF 403, held to these rules.
#[cfg(all(test, not(target_arch = "wasm32")))]
#[path = "answer_docs.rs"]
mod docs;

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::core::record::RecordId;
    use serde_json::json;

    fn answer(status: u16, body: Value, retry_after: Option<&str>) -> Verdict {
        classify(
            Some(ReplayAnswer {
                retry_after,
                body: AnswerBody::Json(&body),
                ..ReplayAnswer::status(status)
            }),
            0,
        )
    }

    fn text(status: u16, body: &str) -> Verdict {
        classify(
            Some(ReplayAnswer {
                body: AnswerBody::Text(body),
                ..ReplayAnswer::status(status)
            }),
            0,
        )
    }

    fn bare(status: u16) -> Verdict {
        classify(Some(ReplayAnswer::status(status)), 0)
    }

    fn attention(reason: AttentionReason, status: u16) -> Verdict {
        Verdict::Attention { reason, status }
    }

    fn record() -> RecordMeta {
        RecordMeta {
            id: RecordId(1),
            path: "/projects/1/tasks".into(),
            timestamp: 1_000,
            owner: Some("alice".into()),
            workspace: Some("1".into()),
            ..RecordMeta::default()
        }
    }

    fn updated(s: Settlement) -> RecordMeta {
        match s {
            Settlement::Update(r) => *r,
            other => panic!("expected an update, got {other:?}"),
        }
    }

    // Row: 2xx, with or without `Idempotent-Replayed: true`.
    #[test]
    fn row_2xx_is_replayed_with_or_without_ledger_replay() {
        for s in [200, 201, 204, 299] {
            assert_eq!(answer(s, json!({}), None), Verdict::Replayed);
            let replayed = ReplayAnswer {
                replayed: true,
                ..ReplayAnswer::status(s)
            };
            assert_eq!(classify(Some(replayed), 0), Verdict::Replayed);
        }
        assert_eq!(
            settle(&record(), &Verdict::Replayed, &Config::default(), 0),
            Settlement::Delete
        );
    }

    // Row: 3xx, or an opaque redirect (redirect: "manual").
    #[test]
    fn row_redirects_need_attention_and_never_count_as_replayed() {
        for s in [301, 302, 303, 307, 308] {
            assert_eq!(bare(s), attention(AttentionReason::Redirected, s));
        }
        let opaque = ReplayAnswer {
            opaque_redirect: true,
            ..ReplayAnswer::status(0)
        };
        let v = classify(Some(opaque), 0);
        assert_eq!(v, attention(AttentionReason::Redirected, 0));
        let r = updated(settle(&record(), &v, &Config::default(), 0));
        assert_eq!(
            r.state,
            RecordState::NeedsAttention(AttentionReason::Redirected)
        );
    }

    // Row: 401.
    #[test]
    fn row_401_stops_and_leaves_the_record() {
        let v = answer(401, json!({"detail":"not_signed_in"}), None);
        assert_eq!(v, Verdict::SignedOut);
        assert!(v.stops_flush());
        assert_eq!(
            settle(&record(), &v, &Config::default(), 0),
            Settlement::Unchanged
        );
    }

    // Row: 403 with a CSRF failure, or 409 account_mismatch.
    #[test]
    fn row_csrf_403_and_account_mismatch_are_a_stale_identity() {
        assert_eq!(
            answer(403, json!({"detail":"csrf_failed"}), None),
            Verdict::StaleIdentity { status: 403 }
        );
        assert_eq!(
            text(
                403,
                "<h1>Forbidden (403)</h1><p>CSRF verification failed.</p>"
            ),
            Verdict::StaleIdentity { status: 403 }
        );
        assert_eq!(
            answer(403, json!({"error":{"code":"EBADCSRFTOKEN"}}), None),
            Verdict::StaleIdentity { status: 403 }
        );
        assert_eq!(
            answer(
                409,
                json!({"detail":"account_mismatch","user":{"id":"bob"}}),
                None
            ),
            Verdict::StaleIdentity { status: 409 }
        );
        let v = Verdict::StaleIdentity { status: 403 };
        assert_eq!(
            settle(&record(), &v, &Config::default(), 0),
            Settlement::Unchanged
        );
        // A 403 that is not about CSRF is the server's refusal.
        assert_eq!(
            answer(403, json!({"detail":"forbidden"}), None),
            attention(AttentionReason::Rejected, 403)
        );
        assert_eq!(bare(403), attention(AttentionReason::Rejected, 403));
    }

    // Row: 409 idempotency_in_progress, or any other 409 without an outcome-unknown
    // marker (the IETF draft, express-idempotency's HTML page, Stripe's key in use).
    #[test]
    fn row_409_still_running_waits_then_needs_attention() {
        let families = [
            answer(409, json!({"detail":"idempotency_in_progress"}), None),
            text(409, "<!DOCTYPE html><pre>Error: A previous request is still in progress for this key.</pre>"),
            answer(
                409,
                json!({"type":"https://developer.example.com/idempotency",
                       "title":"A request is outstanding for this Idempotency-Key"}),
                None,
            ),
            answer(
                409,
                json!({"error":{"type":"idempotency_error","code":"idempotency_key_in_use"}}),
                None,
            ),
            bare(409),
        ];
        for v in families {
            assert_eq!(v, Verdict::InProgress);
            assert!(!v.stops_flush());
        }
        // r4: patience. Three answers within seconds (a slow first attempt met by the
        // worker's own retries) leave it queued; the count and the time spent both
        // decide.
        let c = Config::default();
        let start = 5_000_000;
        let mut r = record();
        for (n, at) in [(1, 0), (2, 1_000), (3, 3_000), (4, 599_999)] {
            r = updated(settle(&r, &Verdict::InProgress, &c, start + at));
            assert_eq!(r.conflicts, n);
            assert_eq!(r.conflicts_since, Some(start), "the row's first answer");
            assert_eq!(r.state, RecordState::Queued, "after {n} answers, {at} ms");
        }
        r = updated(settle(&r, &Verdict::InProgress, &c, start + 600_000));
        assert_eq!(
            r.state,
            RecordState::NeedsAttention(AttentionReason::Conflict),
            "maxServerFailures answers over stillRunningPatienceMs"
        );
        assert_eq!(r.last_status, Some(409));
        // Patience spent but too few answers: still waiting.
        let mut r = record();
        r = updated(settle(&r, &Verdict::InProgress, &c, start));
        r = updated(settle(&r, &Verdict::InProgress, &c, start + 3_600_000));
        assert_eq!(r.state, RecordState::Queued, "2 answers, an hour apart");
        // Without patience (0), the count alone decides, as before r4.
        let quick = Config {
            still_running_patience_ms: 0,
            ..Config::default()
        };
        let mut r = record();
        for n in 1..=3 {
            r = updated(settle(&r, &Verdict::InProgress, &quick, start));
            let want = if n < 3 {
                RecordState::Queued
            } else {
                RecordState::NeedsAttention(AttentionReason::Conflict)
            };
            assert_eq!(r.state, want, "after {n} answers");
        }
        // "In a row": another answer in between starts the count and the time again.
        let mut r = record();
        r.conflicts = 2;
        r.conflicts_since = Some(start);
        let r = updated(settle(
            &r,
            &Verdict::ServerFailure { status: 500 },
            &c,
            start,
        ));
        assert_eq!(r.conflicts, 0);
        assert_eq!(r.conflicts_since, None);
        // A count stored without its time (an earlier version) starts the time now; a
        // time in the future (the clock moved back) starts it again.
        for since in [None, Some(start + 86_400_000)] {
            let mut r = record();
            r.conflicts = 5;
            r.conflicts_since = since;
            let r = updated(settle(&r, &Verdict::InProgress, &c, start));
            assert_eq!(r.conflicts_since, Some(start), "{since:?}");
            assert_eq!(r.state, RecordState::Queued, "{since:?}");
        }
    }

    proptest::proptest! {
        /// However the answers fall in time, `conflict` comes neither before
        /// `maxServerFailures` answers in a row nor before `stillRunningPatienceMs` since
        /// the first of them, and always at the first answer where both are spent.
        #[test]
        fn conflict_waits_for_both_the_count_and_the_time(
            gaps in proptest::collection::vec(0u64..400_000, 1..12),
            limit in 1u32..5,
            patience in 0u64..1_500_000,
        ) {
            let c = Config {
                max_server_failures: limit,
                still_running_patience_ms: patience,
                ..Config::default()
            };
            let mut at = 1_000_000;
            let first = at + gaps[0];
            let mut r = record();
            for (i, gap) in gaps.iter().enumerate() {
                at += gap;
                r = updated(settle(&r, &Verdict::InProgress, &c, at));
                let due = i as u32 + 1 >= limit && at - first >= patience;
                let conflict = r.state == RecordState::NeedsAttention(AttentionReason::Conflict);
                proptest::prop_assert_eq!(conflict, due, "answer {} at +{}", i + 1, at - first);
                if conflict {
                    break;
                }
            }
        }
    }

    // The reference ledger's answer stored as status only: that status decides.
    #[test]
    fn a_replay_unavailable_answer_decides_by_its_stored_status() {
        let v = |status: u16| {
            answer(
                409,
                json!({"detail":"idempotency_replay_unavailable","status":status}),
                None,
            )
        };
        assert_eq!(v(201), Verdict::Replayed);
        assert_eq!(v(500), attention(AttentionReason::Repeated5xx, 500));
        assert_eq!(v(422), attention(AttentionReason::Rejected, 422));
        assert_eq!(
            answer(
                409,
                json!({"detail":"idempotency_replay_unavailable"}),
                None
            ),
            Verdict::InProgress,
            "without its status it is a bare 409"
        );
    }

    // Row: 409 idempotency_outcome_unknown, or code PM_IDEMPOTENCY_OUTCOME_UNKNOWN.
    #[test]
    fn row_outcome_unknown_by_detail_or_code() {
        let want = AttentionReason::OutcomeUnknown;
        assert_eq!(
            answer(409, json!({"detail":"idempotency_outcome_unknown"}), None),
            attention(want, 409)
        );
        assert_eq!(
            answer(409, json!({"code":"idempotency_outcome_unknown"}), None),
            attention(want, 409)
        );
        assert_eq!(
            answer(500, json!({"code":"PM_IDEMPOTENCY_OUTCOME_UNKNOWN"}), None),
            attention(want, 500)
        );
        let v = answer(409, json!({"detail":"idempotency_outcome_unknown"}), None);
        let r = updated(settle(&record(), &v, &Config::default(), 0));
        assert_eq!(r.state, RecordState::NeedsAttention(want));
    }

    // The same codes in a body that is not JSON, or JSON cut at the read bound (64 KiB).
    #[test]
    fn codes_are_read_from_text_and_cut_json_as_whole_words() {
        let cut = format!(
            "{{\"detail\":\"idempotency_outcome_unknown\",\"trace\":\"{}",
            "x".repeat(100)
        );
        assert_eq!(
            text(409, &cut),
            attention(AttentionReason::OutcomeUnknown, 409)
        );
        assert_eq!(
            text(500, "<p>PM_IDEMPOTENCY_OUTCOME_UNKNOWN</p>"),
            attention(AttentionReason::OutcomeUnknown, 500)
        );
        assert_eq!(
            text(409, "{\"detail\":\"account_mismatch\",\"pad\":\"…"),
            Verdict::StaleIdentity { status: 409 }
        );
        assert_eq!(
            text(409, "not_idempotency_outcome_unknown_really"),
            Verdict::InProgress,
            "a longer word is not the code"
        );
        assert_eq!(text(409, "Conflict"), Verdict::InProgress);
    }

    // Row: 422 idempotency_key_reused, or another server's key-misuse answer.
    #[test]
    fn row_key_misuse_of_every_family() {
        let want = |s| attention(AttentionReason::KeyReused, s);
        assert_eq!(
            answer(422, json!({"detail":"idempotency_key_reused"}), None),
            want(422)
        );
        assert_eq!(
            answer(422, json!({"code":"idempotency_key_reused"}), None),
            want(422)
        );
        // The IETF draft: problem details whose type and title name the key.
        assert_eq!(
            answer(
                422,
                json!({"type":"https://developer.example.com/idempotency",
                       "title":"Idempotency-Key is already used"}),
                None
            ),
            want(422)
        );
        // Stripe: a 400 of type idempotency_error.
        assert_eq!(
            answer(
                400,
                json!({"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters they were first used with."}}),
                None
            ),
            want(400)
        );
        // express-idempotency: 417 with Express's HTML error page.
        assert_eq!(
            text(417, "<pre>Error: Misuse of the idempotency key.</pre>"),
            want(417)
        );
        assert_eq!(bare(417), want(417));
        // A plain validation error stays "rejected".
        assert_eq!(
            answer(422, json!({"detail":"title too long"}), None),
            attention(AttentionReason::Rejected, 422)
        );
        assert_eq!(
            answer(400, json!({"error":{"type":"invalid_request_error"}}), None),
            attention(AttentionReason::Rejected, 400)
        );
    }

    // Row: 429, or 503 with Retry-After.
    #[test]
    fn row_429_and_503_with_retry_after_stop_the_flush() {
        assert_eq!(
            answer(429, json!({}), Some("7")),
            Verdict::RetryLater {
                after_ms: Some(7_000)
            }
        );
        assert_eq!(
            answer(429, json!({}), None),
            Verdict::RetryLater { after_ms: None }
        );
        let v = answer(503, json!({}), Some("2"));
        assert_eq!(
            v,
            Verdict::RetryLater {
                after_ms: Some(2_000)
            }
        );
        assert!(v.stops_flush());
        assert_eq!(
            settle(&record(), &v, &Config::default(), 0),
            Settlement::Unchanged
        );
    }

    // Row: 5xx with Idempotent-Replayed: true.
    #[test]
    fn row_replayed_5xx_needs_attention_at_once() {
        for (s, retry_after) in [(500, None), (502, None), (503, Some("5"))] {
            let a = ReplayAnswer {
                replayed: true,
                retry_after,
                ..ReplayAnswer::status(s)
            };
            let v = classify(Some(a), 0);
            assert_eq!(v, attention(AttentionReason::Repeated5xx, s));
            let r = updated(settle(&record(), &v, &Config::default(), 0));
            assert_eq!(
                r.state,
                RecordState::NeedsAttention(AttentionReason::Repeated5xx)
            );
            assert_eq!(r.last_status, Some(s));
        }
    }

    // Row: other 5xx.
    #[test]
    fn row_other_5xx_counts_to_repeated_5xx() {
        let c = Config::default();
        assert_eq!(
            answer(503, json!({}), None),
            Verdict::ServerFailure { status: 503 }
        );
        let v = answer(500, json!({}), None);
        assert_eq!(v, Verdict::ServerFailure { status: 500 });
        assert!(!v.stops_flush());
        let mut r = record();
        for n in 1..=3 {
            let next = updated(settle(&r, &v, &c, 0));
            assert_eq!(next.server_failures, n);
            let want = if n < 3 {
                RecordState::Queued
            } else {
                RecordState::NeedsAttention(AttentionReason::Repeated5xx)
            };
            assert_eq!(next.state, want, "after {n} failures");
            r = next;
        }
    }

    // Row: other 4xx.
    #[test]
    fn row_other_4xx_is_rejected_with_its_status() {
        for s in [400, 403, 404, 410, 412, 413, 422] {
            let v = answer(s, json!({"detail":"nope"}), None);
            assert_eq!(v, attention(AttentionReason::Rejected, s));
            let r = updated(settle(&record(), &v, &Config::default(), 0));
            assert_eq!(r.last_status, Some(s));
            assert_eq!(
                r.state,
                RecordState::NeedsAttention(AttentionReason::Rejected)
            );
        }
        assert_eq!(bare(400), attention(AttentionReason::Rejected, 400));
        assert_eq!(
            text(412, "Precondition Failed"),
            attention(AttentionReason::Rejected, 412)
        );
    }

    // Row: network failure or timeout.
    #[test]
    fn row_network_failure_stops_and_leaves_the_record() {
        let v = classify(None, 0);
        assert_eq!(v, Verdict::NetworkFailure);
        assert!(v.stops_flush());
        assert_eq!(
            settle(&record(), &v, &Config::default(), 0),
            Settlement::Unchanged
        );
    }

    // Row: (none) — older than maxRetentionMs.
    #[test]
    fn row_expired_needs_attention_never_deletion() {
        let c = Config::default();
        let r = record();
        assert_eq!(expire(&r, r.timestamp + c.max_retention_ms, &c), None);
        let e = expire(&r, r.timestamp + c.max_retention_ms + 1, &c).expect("expires");
        assert_eq!(
            e.state,
            RecordState::NeedsAttention(AttentionReason::Expired)
        );
        assert_eq!(expire(&e, u64::MAX, &c), None, "already needs attention");
    }

    // 4.7: the server's key window.
    #[test]
    fn a_record_sent_once_past_the_key_window_is_key_expired() {
        let c = Config::default();
        let mut sent = record();
        sent.first_sent_at = Some(5_000);
        assert_eq!(expire(&sent, 5_000 + c.server_key_ttl_ms, &c), None);
        let e = expire(&sent, 5_001 + c.server_key_ttl_ms, &c).expect("key window passed");
        assert_eq!(
            e.state,
            RecordState::NeedsAttention(AttentionReason::KeyExpired)
        );
        // Past both windows, the key window is the reason given (it is the risk).
        let e = expire(&sent, u64::MAX / 2, &c).expect("both");
        assert_eq!(
            e.state,
            RecordState::NeedsAttention(AttentionReason::KeyExpired)
        );
    }

    #[test]
    fn a_record_that_never_left_the_worker_is_never_key_expired() {
        let c = Config::default();
        let never_sent = record();
        let days = 6 * 24 * 3_600_000;
        assert_eq!(expire(&never_sent, never_sent.timestamp + days, &c), None);
    }

    #[test]
    fn retry_after_seconds_and_http_dates() {
        assert_eq!(parse_retry_after("120", 0), Some(120_000));
        assert_eq!(parse_retry_after(" 0 ", 0), Some(0));
        let at = 784_111_777_000; // Sun, 06 Nov 1994 08:49:37 GMT
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", at - 5_000),
            Some(5_000)
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", at + 1),
            Some(0)
        );
        assert_eq!(
            parse_retry_after("Thu, 01 Jan 1970 00:00:00 GMT", 0),
            Some(0)
        );
        assert_eq!(
            parse_retry_after("Wed, 02 Dec 2026 16:00:00 GMT", 0),
            Some(1_796_227_200_000)
        );
        assert!(parse_retry_after("Fri, 31 Dec 9999 23:59:59 GMT", 0).is_some());
        assert_eq!(
            parse_retry_after("31536000", 0),
            Some(31_536_000_000),
            "unclamped here: Backoff bounds it"
        );
        for bad in [
            "",
            "-1",
            "soon",
            "1.5",
            "Sun, 06 Nov 1994 08:49:37 PST",
            "Sun, 32 Nov 1994 08:49:37 GMT",
        ] {
            assert_eq!(parse_retry_after(bad, 0), None, "{bad}");
        }
    }

    // r3: a 403 that merely carries a CSRF token in its page is the server's refusal.
    #[test]
    fn a_permission_page_with_a_csrf_token_in_its_layout_is_a_refusal() {
        let rails = r#"<!DOCTYPE html><html><head><title>Forbidden</title>
            <meta name="csrf-param" content="authenticity_token" />
            <meta name="csrf-token" content="q1w2e3r4-invalid-looking-token" />
            <script>window.csrfToken = document.querySelector('meta[name=csrf-token]').content; // fails if missing</script>
            </head><body><h1>You are not allowed to edit this project</h1></body></html>"#;
        assert_eq!(text(403, rails), attention(AttentionReason::Rejected, 403));
        let django = r#"<html><body><form method="post">
            <input type="hidden" name="csrfmiddlewaretoken" value="bad-or-missing-who-knows">
            <p>Permission denied: only owners may invite members.</p></form></body></html>"#;
        assert_eq!(text(403, django), attention(AttentionReason::Rejected, 403));
        // A JSON refusal that carries a token beside its error is a refusal too.
        assert_eq!(
            answer(
                403,
                json!({"detail":"forbidden","csrfToken":"missing-csrf-nope"}),
                None
            ),
            attention(AttentionReason::Rejected, 403)
        );
        assert_eq!(
            text(
                403,
                "Forbidden: the CSRF token on this page is fine, you may not do this"
            ),
            attention(AttentionReason::Rejected, 403)
        );
    }

    #[test]
    fn the_csrf_failures_of_common_servers_are_a_stale_identity() {
        let stale = Verdict::StaleIdentity { status: 403 };
        for page in [
            // Django's failure page.
            r#"<html><head><title>403 Forbidden</title></head><body><h1>Forbidden <span>(403)</span></h1>
               <p>CSRF verification failed. Request aborted.</p></body></html>"#,
            // Express's error page for csurf.
            "<!DOCTYPE html><html><body><pre>ForbiddenError: invalid csrf token<br> &nbsp; &nbsp;at csrf</pre></body></html>",
            // Spring Security.
            "Invalid CSRF Token 'null' was found on the request parameter '_csrf' or header 'X-CSRF-TOKEN'.",
            "Could not verify the provided CSRF token because your session was not found.",
            // gorilla/csrf.
            "Forbidden - CSRF token invalid\n",
            "CSRF token missing",
            "xsrf token mismatch",
        ] {
            assert_eq!(text(403, page), stale, "{page}");
        }
        assert_eq!(answer(403, json!({"detail":"csrf_failed"}), None), stale);
        assert_eq!(
            answer(
                403,
                json!({"error":{"code":"EBADCSRFTOKEN","message":"invalid csrf token"}}),
                None
            ),
            stale
        );
        assert_eq!(
            answer(403, json!({"message":"CSRF token mismatch."}), None),
            stale
        );
        assert_eq!(
            text(500, "CSRF verification failed"),
            Verdict::ServerFailure { status: 500 },
            "only a 403 is a CSRF refusal"
        );
    }

    // r3: after the record's identity re-check, a 403 is final; account_mismatch stops.
    #[test]
    fn a_second_stale_identity_answer_after_the_recheck() {
        assert_eq!(
            after_recheck(Verdict::StaleIdentity { status: 403 }),
            attention(AttentionReason::Rejected, 403)
        );
        let r = updated(settle(
            &record(),
            &after_recheck(Verdict::StaleIdentity { status: 403 }),
            &Config::default(),
            0,
        ));
        assert_eq!(
            r.state,
            RecordState::NeedsAttention(AttentionReason::Rejected)
        );
        assert_eq!(r.last_status, Some(403), "status kept");
        let mismatch = Verdict::StaleIdentity { status: 409 };
        assert_eq!(after_recheck(mismatch.clone()), mismatch);
        assert!(after_recheck(mismatch).stops_flush());
        assert_eq!(after_recheck(Verdict::Replayed), Verdict::Replayed);
    }

    // r3, 4.7: the key window fails closed when the clock reads earlier than the first send.
    #[test]
    fn a_clock_behind_the_first_send_makes_the_age_unknown_never_zero() {
        let c = Config::default();
        let mut sent = record();
        sent.first_sent_at = Some(10_000_000);
        assert_eq!(check_age(&sent, 9_999_999, &c), Age::Unknown);
        assert_eq!(check_age(&sent, 0, &c), Age::Unknown);
        assert_eq!(
            expire(&sent, 0, &c),
            None,
            "not expired, but not sendable either"
        );
        assert_eq!(check_age(&sent, 10_000_000, &c), Age::Sendable);
        assert!(matches!(
            check_age(&sent, 10_000_001 + c.server_key_ttl_ms, &c),
            Age::Expired(_)
        ));
        // A record that never left the worker has no first send to be behind.
        let never = record();
        assert_eq!(check_age(&never, 0, &c), Age::Sendable);
    }

    #[test]
    fn a_retry_after_date_in_a_far_year_does_not_wrap() {
        for far in [
            "Fri, 31 Dec 9223372036854775807 23:59:59 GMT",
            "Fri, 31 Dec 100000000000000 23:59:59 GMT",
            "Fri, 31 Dec 99999 23:59:59 GMT",
        ] {
            assert_eq!(
                parse_retry_after(far, 1_000),
                Some(u64::MAX - 1_000),
                "{far}"
            );
        }
    }
}
