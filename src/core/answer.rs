//! What a replay's answer means (contract section 4.5), and the record change it makes.

use super::config::Config;
use super::record::{AttentionReason, RecordMeta, RecordState};
use serde_json::Value;

/// An HTTP answer to a replay, reduced to what classification reads.
#[derive(Debug, Clone, Copy)]
pub struct ReplayAnswer<'a> {
    pub status: u16,
    /// The raw `Retry-After` header.
    pub retry_after: Option<&'a str>,
    /// The parsed JSON body, when it was JSON.
    pub body: Option<&'a Value>,
}

/// The meaning of one replay's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// 2xx (a ledger replay included): delete the record.
    Replayed,
    /// 401: the session ended; stop the flush, leave the record.
    SignedOut,
    /// 409 `idempotency_in_progress`: leave the record; its workspace waits.
    InProgress,
    /// The record now needs a person; `status` is kept for `rejected`.
    Attention {
        reason: AttentionReason,
        status: u16,
    },
    /// 429, or 503 with `Retry-After`: stop the flush; the next automatic one waits.
    RetryLater { after_ms: Option<u64> },
    /// Another 5xx: counts towards `maxServerFailures`.
    ServerFailure { status: u16 },
    /// The network failed or the attempt timed out: stop, leave the record.
    NetworkFailure,
}

impl Verdict {
    /// Whether this outcome ends the whole flush (nothing more is sent).
    pub fn stops_flush(&self) -> bool {
        matches!(
            self,
            Verdict::SignedOut | Verdict::RetryLater { .. } | Verdict::NetworkFailure
        )
    }
}

const OUTCOME_UNKNOWN: &str = "idempotency_outcome_unknown";
const OUTCOME_UNKNOWN_CODE: &str = "PM_IDEMPOTENCY_OUTCOME_UNKNOWN";
const IN_PROGRESS: &str = "idempotency_in_progress";
const KEY_REUSED: &str = "idempotency_key_reused";

/// The idempotency code of an error body: its `detail` or `code` string.
fn error_codes(body: Option<&Value>) -> impl Iterator<Item = &str> {
    ["detail", "code"]
        .into_iter()
        .filter_map(move |f| body.and_then(|b| b.get(f)).and_then(Value::as_str))
}

/// Classifies a replay's answer (`None`: the network failed or the attempt timed out).
/// `now_ms` turns an HTTP-date `Retry-After` into a delay.
pub fn classify(answer: Option<ReplayAnswer<'_>>, now_ms: u64) -> Verdict {
    let Some(a) = answer else {
        return Verdict::NetworkFailure;
    };
    let has = |code: &str| error_codes(a.body).any(|c| c == code);
    match a.status {
        200..=299 => Verdict::Replayed,
        401 => Verdict::SignedOut,
        409 if has(OUTCOME_UNKNOWN) => Verdict::Attention {
            reason: AttentionReason::OutcomeUnknown,
            status: 409,
        },
        status if has(OUTCOME_UNKNOWN_CODE) => Verdict::Attention {
            reason: AttentionReason::OutcomeUnknown,
            status,
        },
        409 if has(IN_PROGRESS) => Verdict::InProgress,
        422 if has(KEY_REUSED) => Verdict::Attention {
            reason: AttentionReason::KeyReused,
            status: 422,
        },
        429 => Verdict::RetryLater {
            after_ms: a.retry_after.and_then(|r| parse_retry_after(r, now_ms)),
        },
        503 if a.retry_after.is_some() => Verdict::RetryLater {
            after_ms: a.retry_after.and_then(|r| parse_retry_after(r, now_ms)),
        },
        status @ 500..=599 => Verdict::ServerFailure { status },
        status => Verdict::Attention {
            reason: AttentionReason::Rejected,
            status,
        },
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
    let rest = s.split_once(", ")?.1;
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
    let days = days_from_civil(year, month, day);
    Some(((days as u64) * 86_400 + h * 3600 + m * 60 + sec) * 1000)
}

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
    Update(RecordMeta),
    Unchanged,
}

/// The record change of a verdict. A 5xx counts towards `maxServerFailures`; at the
/// limit the record needs attention (`repeated-5xx`).
pub fn settle(record: &RecordMeta, verdict: &Verdict, config: &Config) -> Settlement {
    match verdict {
        Verdict::Replayed => Settlement::Delete,
        Verdict::SignedOut
        | Verdict::InProgress
        | Verdict::RetryLater { .. }
        | Verdict::NetworkFailure => Settlement::Unchanged,
        Verdict::Attention { reason, status } => {
            let mut r = record.clone();
            r.state = RecordState::NeedsAttention(*reason);
            r.last_status = Some(*status);
            Settlement::Update(r)
        }
        Verdict::ServerFailure { status } => {
            let mut r = record.clone();
            r.server_failures = r.server_failures.saturating_add(1);
            r.last_status = Some(*status);
            if r.server_failures >= config.max_server_failures {
                r.state = RecordState::NeedsAttention(AttentionReason::Repeated5xx);
            }
            Settlement::Update(r)
        }
    }
}

/// A queued record older than `maxRetentionMs` needs attention (`expired`); it is never
/// deleted silently.
pub fn expire(record: &RecordMeta, now_ms: u64, config: &Config) -> Option<RecordMeta> {
    let old = now_ms.saturating_sub(record.timestamp) > config.max_retention_ms;
    if old && record.state == RecordState::Queued {
        let mut r = record.clone();
        r.state = RecordState::NeedsAttention(AttentionReason::Expired);
        Some(r)
    } else {
        None
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::core::record::RecordId;
    use serde_json::json;

    fn answer(status: u16, body: Value, retry_after: Option<&str>) -> Verdict {
        classify(
            Some(ReplayAnswer {
                status,
                retry_after,
                body: Some(&body),
            }),
            0,
        )
    }

    fn record() -> RecordMeta {
        RecordMeta {
            id: RecordId(1),
            method: "POST".into(),
            path: "/projects/1/tasks".into(),
            content_type: None,
            timestamp: 1_000,
            owner: Some("alice".into()),
            workspace: Some("1".into()),
            key: None,
            state: RecordState::Queued,
            server_failures: 0,
            last_status: None,
            attempts: 0,
            body_len: 0,
        }
    }

    #[test]
    fn row_2xx_is_replayed_with_or_without_ledger_replay() {
        for s in [200, 201, 204, 299] {
            assert_eq!(answer(s, json!({}), None), Verdict::Replayed);
        }
        assert_eq!(
            settle(&record(), &Verdict::Replayed, &Config::default()),
            Settlement::Delete
        );
    }

    #[test]
    fn row_401_stops_and_leaves_the_record() {
        let v = answer(401, json!({"detail":"not_signed_in"}), None);
        assert_eq!(v, Verdict::SignedOut);
        assert!(v.stops_flush());
        assert_eq!(
            settle(&record(), &v, &Config::default()),
            Settlement::Unchanged
        );
    }

    #[test]
    fn row_409_in_progress_waits() {
        let v = answer(409, json!({"detail":"idempotency_in_progress"}), None);
        assert_eq!(v, Verdict::InProgress);
        assert!(!v.stops_flush());
        assert_eq!(
            settle(&record(), &v, &Config::default()),
            Settlement::Unchanged
        );
    }

    #[test]
    fn row_outcome_unknown_by_detail_or_code() {
        let want = AttentionReason::OutcomeUnknown;
        assert!(matches!(
            answer(409, json!({"detail":"idempotency_outcome_unknown"}), None),
            Verdict::Attention { reason, status: 409 } if reason == want
        ));
        assert!(matches!(
            answer(409, json!({"code":"idempotency_outcome_unknown"}), None),
            Verdict::Attention { reason, .. } if reason == want
        ));
        assert!(matches!(
            answer(500, json!({"code":"PM_IDEMPOTENCY_OUTCOME_UNKNOWN"}), None),
            Verdict::Attention { reason, status: 500 } if reason == want
        ));
        let v = answer(409, json!({"detail":"idempotency_outcome_unknown"}), None);
        let Settlement::Update(r) = settle(&record(), &v, &Config::default()) else {
            panic!("must update");
        };
        assert_eq!(r.state, RecordState::NeedsAttention(want));
    }

    #[test]
    fn row_422_key_reused() {
        assert_eq!(
            answer(422, json!({"detail":"idempotency_key_reused"}), None),
            Verdict::Attention {
                reason: AttentionReason::KeyReused,
                status: 422
            }
        );
        assert_eq!(
            answer(422, json!({"code":"idempotency_key_reused"}), None),
            Verdict::Attention {
                reason: AttentionReason::KeyReused,
                status: 422
            }
        );
    }

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
            settle(&record(), &v, &Config::default()),
            Settlement::Unchanged
        );
    }

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
            let Settlement::Update(next) = settle(&r, &v, &c) else {
                panic!("5xx must update");
            };
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

    #[test]
    fn row_other_4xx_is_rejected_with_its_status() {
        for s in [400, 403, 404, 409, 410, 413, 422] {
            let v = answer(s, json!({"detail":"nope"}), None);
            assert_eq!(
                v,
                Verdict::Attention {
                    reason: AttentionReason::Rejected,
                    status: s
                }
            );
            let Settlement::Update(r) = settle(&record(), &v, &Config::default()) else {
                panic!("must update");
            };
            assert_eq!(r.last_status, Some(s));
            assert_eq!(
                r.state,
                RecordState::NeedsAttention(AttentionReason::Rejected)
            );
        }
        let v = classify(
            Some(ReplayAnswer {
                status: 400,
                retry_after: None,
                body: None,
            }),
            0,
        );
        assert_eq!(
            v,
            Verdict::Attention {
                reason: AttentionReason::Rejected,
                status: 400
            }
        );
    }

    #[test]
    fn row_network_failure_stops_and_leaves_the_record() {
        let v = classify(None, 0);
        assert_eq!(v, Verdict::NetworkFailure);
        assert!(v.stops_flush());
        assert_eq!(
            settle(&record(), &v, &Config::default()),
            Settlement::Unchanged
        );
    }

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
}
