//! The duties, one function each, in the order they run. Each sends what the outbox
//! would send, reads what the server answered, counts whether the write ran (through
//! the count route), and turns that into a [`Finding`] whose "outbox" line comes from
//! the outbox's own classification of the answer.

use crate::http::{Answer, SetupError, Target, Tweak};
use crate::options::{Options, RequestSpec};
use crate::report::{outbox_does, Finding, Outcome, Report};
use std::sync::Arc;
use std::time::Duration;
use sw_outbox::core::answer::Verdict;
use sw_outbox::core::config::Config;
use sw_outbox::core::identity::Identity;
use sw_outbox::core::key::IdempotencyKey;
use sw_outbox::core::record::AttentionReason;
use tokio::task::JoinSet;

/// Runs every duty against the server `options` names.
pub async fn run(options: &Options) -> Result<Report, SetupError> {
    let mut target = Target::connect(options).await?;
    let mut findings = vec![auth_me(&mut target).await];
    let t = Arc::new(target);
    let counter = Counter::new(&t).await;
    // The replay right after its first copy: the count between them is theirs alone.
    let first = preflight(&t).await?;
    findings.push(replay(&t, &counter, first).await);
    findings.push(concurrent_repeat(&t, &counter).await);
    findings.push(key_reuse(&t, &counter).await);
    findings.push(keys_per_account(&t, &counter).await);
    findings.push(expected_account(&t, &counter).await);
    findings.push(csrf(&t, &counter).await);
    findings.push(signed_out_write(&t, &counter).await);
    let (window, replay_failure) = key_window(&t, &counter).await;
    findings.push(window);
    if let Some(problem) = replay_failure {
        // Each failure under the duty that failed: the key was remembered (the window
        // holds), its replay was wrong.
        if let Some(f) = findings.iter_mut().find(|f| f.duty == "replay") {
            f.outcome = Outcome::Fail;
            f.outbox = problem.clone();
            f.notes
                .push(format!("seen in the key-window check: {problem}"));
        }
    }
    findings.push(page_keys(&t).await);
    Ok(Report {
        target: options.base.clone(),
        account: t.account.clone(),
        findings,
    })
}

fn finding(duty: &'static str, title: &'static str) -> Finding {
    Finding {
        duty,
        title,
        outcome: Outcome::NotChecked,
        server: String::new(),
        outbox: String::new(),
        notes: Vec::new(),
    }
}

fn new_key() -> Result<String, String> {
    IdempotencyKey::mint()
        .map(|k| k.as_str().to_owned())
        .map_err(|e| format!("no random source for a key: {e}"))
}

/// Reads the count route, or says once why it cannot.
struct Counter {
    unavailable: Option<String>,
}

impl Counter {
    async fn new(t: &Target) -> Counter {
        let unavailable = if t.options.no_count {
            Some("no count route (--no-count)".to_owned())
        } else {
            t.count().await.err()
        };
        Counter { unavailable }
    }

    async fn now(&self, t: &Target) -> Option<u64> {
        if self.unavailable.is_some() {
            return None;
        }
        t.count().await.ok()
    }

    /// How many writes ran between `before` and now.
    async fn since(&self, t: &Target, before: Option<u64>) -> Option<u64> {
        let after = self.now(t).await?;
        Some(after.saturating_sub(before?))
    }

    fn why_not(&self) -> String {
        self.unavailable
            .clone()
            .unwrap_or_else(|| "the count route could not be read".into())
    }
}

/// The first copy of a write, kept for the replay duty.
struct FirstWrite {
    key: String,
    body: String,
    answer: Answer,
    before: Option<u64>,
}

/// A fresh write must succeed, or nothing else can be checked.
async fn preflight(t: &Target) -> Result<FirstWrite, SetupError> {
    let key = new_key().map_err(SetupError)?;
    let body = t.fresh_body();
    let before = t.count().await.ok();
    let answer = t
        .write(&key, &body, Tweak::default())
        .await
        .map_err(|e| SetupError(format!("{} {}: {e}", t.write.method, t.write.path)))?;
    if !(200..300).contains(&answer.status) {
        return Err(SetupError(format!(
            "a fresh write ({} {} with a new key) answered {}: every duty needs a write that succeeds (check --write, --body, --content-type and the sign-in)",
            t.write.method,
            t.write.path,
            answer.describe()
        )));
    }
    Ok(FirstWrite {
        key,
        body,
        answer,
        before,
    })
}

async fn auth_me(t: &mut Target) -> Finding {
    let mut f = finding(
        "auth-me",
        "GET /auth/me names the signed-in account (200 {\"user\":{\"id\"}}), 401 when signed out",
    );
    let me = t.me_path.clone();
    let out = match t.me(false).await {
        Ok(r) => r,
        Err(e) => {
            f.outcome = Outcome::Fail;
            f.server = format!("GET {me} signed out: {e}");
            f.outbox = outbox_does(&Verdict::NetworkFailure);
            return f;
        }
    };
    let inn = match t.me(true).await {
        Ok(r) => r,
        Err(e) => {
            f.outcome = Outcome::Fail;
            f.server = format!("GET {me} signed in: {e}");
            f.outbox = outbox_does(&Verdict::NetworkFailure);
            return f;
        }
    };
    f.server = format!(
        "signed out: {}; signed in: {}",
        out.0.describe(),
        describe_identity(&inn.0, &inn.1)
    );
    let mut problems = Vec::new();
    match &out.1 {
        Identity::SignedOut => {
            if out.0.status != 401 {
                f.notes.push(format!(
                    "signed out answers {} without a user id: read as signed out (401 is the usual answer)",
                    out.0.status
                ));
            }
        }
        Identity::SignedIn { user, .. } => problems.push(format!(
            "signed out, it still names {user:?}: the outbox would replay as that account"
        )),
        Identity::Unavailable { status } => problems.push(format!(
            "signed out, it answers {status}: every flush stops at the identity check instead of reporting the records blocked (no-session)"
        )),
    }
    match &inn.1 {
        Identity::SignedIn { user, csrf } if *user == t.account => {
            f.notes.push(match (csrf, &inn.0) {
                (Some(_), a) if a.json().and_then(|v| v.get("csrfToken").cloned()).is_some() => {
                    "CSRF token in the body's csrfToken".into()
                }
                (Some(_), _) => format!("CSRF token in the {} header", t.csrf_header),
                (None, _) => "no CSRF token: replays carry none".into(),
            });
        }
        Identity::SignedIn { user, .. } => problems.push(format!(
            "it names {user:?}, not {:?}: records of {:?} are blocked (owner-mismatch)",
            t.account, t.account
        )),
        Identity::SignedOut => problems.push(
            "signed in, it reads as signed out: nothing is ever replayed (every record blocked: no-session)".into(),
        ),
        Identity::Unavailable { status } => problems.push(format!(
            "signed in, it answers {status}: every flush stops at the identity check; nothing is replayed"
        )),
    }
    if problems.is_empty() {
        f.outcome = Outcome::Pass;
        f.outbox =
            "reads who is signed in before every flush and replays only that account's records"
                .into();
    } else {
        f.outcome = Outcome::Fail;
        f.outbox = problems.join("; ");
    }
    f
}

fn describe_identity(a: &Answer, id: &Identity) -> String {
    match id {
        Identity::SignedIn { user, .. } => format!("{} user.id {user:?}", a.status),
        _ => a.describe(),
    }
}

/// What a copy that should have been refused did.
struct Refusal {
    answer: Answer,
    ran: Option<u64>,
}

async fn refused_write(
    t: &Target,
    counter: &Counter,
    key: &str,
    body: &str,
    tweak: Tweak<'_>,
) -> Result<Refusal, String> {
    let before = counter.now(t).await;
    let answer = t.write(key, body, tweak).await?;
    let ran = counter.since(t, before).await;
    Ok(Refusal { answer, ran })
}

/// After a refusal, the same key with the right request must run: a refusal is never the
/// key's stored answer. `None` when it did.
async fn claimed_nothing(t: &Target, key: &str, body: &str) -> Option<String> {
    match t.write(key, body, Tweak::default()).await {
        Ok(a) if (200..300).contains(&a.status) && !a.replayed => None,
        Ok(a) => Some(format!(
            "the same key, sent properly afterwards, answered {}: the refusal was kept as the key's answer, so the outbox's resend after checking again gets it too",
            a.describe()
        )),
        Err(e) => Some(format!("the same key, sent properly afterwards: {e}")),
    }
}

async fn signed_out_write(t: &Target, counter: &Counter) -> Finding {
    let mut f = finding(
        "signed-out-write",
        "a write without a session is refused with 401, nothing applied",
    );
    let (key, body) = match new_key() {
        Ok(k) => (k, t.fresh_body()),
        Err(e) => return not_checked(f, e),
    };
    let tweak = Tweak {
        signed_out: true,
        ..Tweak::default()
    };
    let r = match refused_write(t, counter, &key, &body, tweak).await {
        Ok(r) => r,
        Err(e) => return network(f, e),
    };
    f.server = r.answer.describe();
    let verdict = r.answer.verdict();
    f.outbox = outbox_does(&verdict);
    if r.ran.is_some_and(|n| n > 0) || (200..300).contains(&r.answer.status) {
        f.outcome = Outcome::Fail;
        f.server.push_str(": applied without a session");
    } else if verdict == Verdict::SignedOut {
        f.outcome = Outcome::Pass;
    } else {
        f.outcome = Outcome::NotSupported;
        f.notes.push(
            "only matters when a session ends between the flush's identity check and a replay: that record then needs a person instead of waiting for the sign-in".into(),
        );
    }
    f
}

async fn csrf(t: &Target, counter: &Counter) -> Finding {
    let mut f = finding(
        "csrf",
        "the CSRF token /auth/me hands out is required: a write without it is refused (403), nothing applied",
    );
    let (key, body) = match new_key() {
        Ok(k) => (k, t.fresh_body()),
        Err(e) => return not_checked(f, e),
    };
    let tweak = Tweak {
        without_csrf: true,
        ..Tweak::default()
    };
    let r = match refused_write(t, counter, &key, &body, tweak).await {
        Ok(r) => r,
        Err(e) => return network(f, e),
    };
    let verdict = r.answer.verdict();
    let ran = r.ran.is_some_and(|n| n > 0) || (200..300).contains(&r.answer.status);
    f.server = format!("without the token: {}", r.answer.describe());
    f.outbox = outbox_does(&verdict);
    match (&t.csrf, ran) {
        (None, true) => {
            f.outcome = Outcome::NotSupported;
            f.server = format!(
                "/auth/me gives no token, and a write without one is applied: {}",
                r.answer.describe()
            );
            f.outbox = "sends no CSRF token; fine with a bearer token or another defence against cross-site writes".into();
        }
        (None, false) => {
            f.outcome = Outcome::Fail;
            f.server = format!(
                "/auth/me gives no token (no csrfToken, no {} header), yet a write without one is refused: {}",
                t.csrf_header,
                r.answer.describe()
            );
            f.outbox = format!(
                "cannot find the token, so every replay is refused: {}",
                outbox_does(&verdict)
            );
        }
        (Some(_), true) => {
            f.outcome = Outcome::Fail;
            f.server = format!(
                "a write without the token is applied: {}",
                r.answer.describe()
            );
            f.outbox = "carries the token, but the server does not check it: any site can make a signed-in browser write".into();
        }
        (Some(_), false) => {
            f.outcome = Outcome::Pass;
            if !matches!(verdict, Verdict::StaleIdentity { status: 403 }) {
                f.notes.push(format!(
                    "not a 403 naming CSRF: a replay whose token went stale → {}, instead of a fresh token and one resend",
                    outbox_does(&verdict)
                ));
            }
            if let Some(problem) = claimed_nothing(t, &key, &body).await {
                f.outcome = Outcome::Fail;
                f.notes.push(problem);
            }
        }
    }
    f
}

async fn replay(t: &Target, counter: &Counter, first: FirstWrite) -> Finding {
    let mut f = finding(
        "replay",
        "a repeat of a completed write gets its stored answer and does not run again",
    );
    let second = match t.write(&first.key, &first.body, Tweak::default()).await {
        Ok(a) => a,
        Err(e) => return network(f, e),
    };
    let ran = counter.since(t, first.before).await;
    let verdict = second.verdict();
    f.server = format!(
        "{} then {}{}",
        first.answer.describe(),
        second.describe(),
        ran_text(ran)
    );
    f.outbox = outbox_does(&verdict);
    match (ran, verdict == Verdict::Replayed) {
        (Some(n), _) if n > 1 => {
            f.outcome = Outcome::Fail;
            f.outbox = format!(
                "{}: every write whose answer was lost is applied twice",
                f.outbox
            );
        }
        (Some(_), true) => f.outcome = Outcome::Pass,
        (None, true) if second.replayed => {
            f.outcome = Outcome::Pass;
            f.notes.push(format!(
                "ran once: only the Idempotent-Replayed marker says so ({})",
                counter.why_not()
            ));
        }
        (None, true) => {
            return not_checked(
                f,
                format!(
                    "the repeat answered {} without Idempotent-Replayed, and {}: a replay cannot be told from a second run",
                    second.describe(),
                    counter.why_not()
                ),
            )
        }
        (_, false) => {
            f.outcome = Outcome::Fail;
            f.outbox = format!(
                "{}, although the write was applied",
                outbox_does(&verdict)
            );
        }
    }
    if f.outcome == Outcome::Pass {
        if !second.replayed {
            f.notes.push("no Idempotent-Replayed: true on the replay: a stored 5xx cannot be told from a fresh one, so it counts toward maxServerFailures instead of repeated-5xx at once".into());
        }
        if second.status != first.answer.status {
            f.notes.push(format!(
                "the replay's status ({}) is not the first answer's ({})",
                second.status, first.answer.status
            ));
        }
        if first.answer.location.is_some() && second.location.is_none() {
            f.notes
                .push("the first answer's Location header is not replayed".into());
        }
        if first.answer.json() != second.json() {
            f.notes
                .push("the replay's body is not the first answer's".into());
        }
    }
    f
}

async fn concurrent_repeat(t: &Arc<Target>, counter: &Counter) -> Finding {
    let mut f = finding(
        "concurrent-repeat",
        "a repeat while the first copy still runs waits or is told \"in progress\" (409), and never runs it twice",
    );
    let (key, body) = match new_key() {
        Ok(k) => (k, t.fresh_body()),
        Err(e) => return not_checked(f, e),
    };
    let before = counter.now(t).await;
    let hook = t.options.slow_hook.as_deref().map(RequestSpec::parse);
    // With the hook: whether the repeat was sent before the first copy's answer came
    // back, i.e. whether the two were seen to overlap. Without it: not known.
    let (answers, overlapped): (Vec<Result<Answer, String>>, Option<bool>) = match hook {
        Some(Err(e)) => return not_checked(f, format!("--slow-hook: {e}")),
        Some(Ok(spec)) => {
            match t.request(&spec).await {
                Ok(a) if (200..300).contains(&a.status) => {}
                Ok(a) => {
                    return not_checked(
                        f,
                        format!(
                            "the slow hook {} {} answered {}",
                            spec.method,
                            spec.path,
                            a.describe()
                        ),
                    )
                }
                Err(e) => return not_checked(f, format!("the slow hook: {e}")),
            }
            let first = {
                let (t, key, body) = (t.clone(), key.clone(), body.clone());
                tokio::spawn(async move {
                    let answer = t.write(&key, &body, Tweak::default()).await;
                    (answer, tokio::time::Instant::now())
                })
            };
            tokio::time::sleep(t.options.repeat_after).await;
            let repeat_sent = tokio::time::Instant::now();
            let second = t.write(&key, &body, Tweak::default()).await;
            let (first, first_answered) = first
                .await
                .unwrap_or_else(|e| (Err(e.to_string()), tokio::time::Instant::now()));
            (vec![first, second], Some(repeat_sent < first_answered))
        }
        None => {
            let mut set = JoinSet::new();
            for _ in 0..t.options.copies.max(2) {
                let (t, key, body) = (t.clone(), key.clone(), body.clone());
                set.spawn(async move { t.write(&key, &body, Tweak::default()).await });
            }
            let mut all = Vec::new();
            while let Some(r) = set.join_next().await {
                all.push(r.unwrap_or_else(|e| Err(e.to_string())));
            }
            (all, None)
        }
    };
    let ran = counter.since(t, before).await;
    let mut described = Vec::new();
    let mut bad = Vec::new();
    for a in &answers {
        match a {
            Ok(a) => {
                described.push(a.describe());
                match a.verdict() {
                    Verdict::InProgress | Verdict::Replayed | Verdict::RetryLater { .. } => {}
                    other => bad.push(format!("{} → {}", a.describe(), outbox_does(&other))),
                }
            }
            Err(e) => bad.push(format!(
                "no answer ({e}) → {}",
                outbox_does(&Verdict::NetworkFailure)
            )),
        }
    }
    f.server = format!("{}{}", described.join(", "), ran_text(ran));
    let in_progress = answers
        .iter()
        .flatten()
        .find(|a| a.verdict() == Verdict::InProgress);
    f.outbox = match in_progress {
        Some(a) => format!("to {}: {}", a.describe(), outbox_does(&Verdict::InProgress)),
        None => outbox_does(&Verdict::Replayed),
    };
    if ran.is_some_and(|n| n > 1) {
        f.outcome = Outcome::Fail;
        f.outbox = format!(
            "ran {} times: a replay that meets its first attempt still running applies the write again",
            ran.unwrap_or(0)
        );
        return f;
    }
    if !bad.is_empty() {
        f.outcome = Outcome::Fail;
        f.outbox = bad.join("; ");
        return f;
    }
    if ran.is_none() {
        return not_checked(
            f,
            format!("{}: whether it ran twice cannot be seen", counter.why_not()),
        );
    }
    // "Still running" is credited only when the copies were seen to overlap: a 409 to a
    // copy that came after the first had finished is not "in progress", whatever it says.
    match overlapped {
        Some(true) => f.outcome = Outcome::Pass,
        Some(false) => {
            return not_checked(
                f,
                "the repeat was sent after the first copy had answered, so it never met the first one running (ran once: yes): make the slow hook slower than --repeat-after",
            )
        }
        None => {
            return not_checked(
                f,
                "copies were raced without --slow-hook, so whether one met another still running was not seen, and \"still running\" is not credited (ran once: yes): give --slow-hook to hold the first copy",
            )
        }
    }
    f
}

/// Duty 10.2: keys are scoped per account. The second account sends the first one's key,
/// path and body: its own write must run, and it must never get the first one's answer.
async fn keys_per_account(t: &Target, counter: &Counter) -> Finding {
    let mut f = finding(
        "keys-per-account",
        "the same key, path and body from another account is that account's own write: it runs, and never gets the first account's stored answer",
    );
    let second = match t.second_account().await {
        Ok(Some(a)) => a,
        Ok(None) => {
            return not_checked(
                f,
                "no second account: give --second-user NAME --second-password P (or --second-bearer TOKEN). A page key such as order_1234 collides between users easily; a server that scopes keys globally answers the second user with the first one's stored answer, and the second user's write is lost",
            )
        }
        Err(e) => return not_checked(f, format!("the second account: {e}")),
    };
    let (key, body) = match new_key() {
        Ok(k) => (k, t.fresh_body()),
        Err(e) => return not_checked(f, e),
    };
    let first = match t.write(&key, &body, Tweak::default()).await {
        Ok(a) if (200..300).contains(&a.status) => a,
        Ok(a) => {
            return not_checked(
                f,
                format!("the first account's write answered {}", a.describe()),
            )
        }
        Err(e) => return network(f, e),
    };
    // The count may be per account or global: read it as each.
    let counted = counter.unavailable.is_none();
    let before = if counted {
        (t.count().await.ok(), t.count_as(Some(&second)).await.ok())
    } else {
        (None, None)
    };
    let answer = match t.write_as(&second, &key, &body).await {
        Ok(a) => a,
        Err(e) => return network(f, e),
    };
    let ran = match before {
        (Some(b1), Some(b2)) => {
            match (t.count().await.ok(), t.count_as(Some(&second)).await.ok()) {
                (Some(a1), Some(a2)) => Some(a1.saturating_sub(b1).max(a2.saturating_sub(b2))),
                _ => None,
            }
        }
        _ => None,
    };
    let verdict = answer.verdict();
    let success = (200..300).contains(&answer.status);
    let same_answer = success && first.json().is_some() && first.json() == answer.json();
    f.server = format!(
        "{} sent {}'s key, path and body: {}{}",
        second.id,
        t.account,
        answer.describe(),
        ran_text(ran)
    );
    f.outbox = outbox_does(&verdict);
    let leaked = success && (answer.replayed || ran == Some(0) || same_answer);
    if leaked {
        f.outcome = Outcome::Fail;
        f.outbox = format!(
            "deletes {}'s record as delivered: it got {}'s stored answer, and its own write was never applied (keys are scoped globally, not per account)",
            second.id, t.account
        );
        if same_answer {
            f.notes
                .push("the answer's body is the first account's, byte for byte".into());
        }
        return f;
    }
    match (success, ran) {
        (true, Some(1)) => f.outcome = Outcome::Pass,
        (true, Some(n)) => {
            f.outcome = Outcome::Fail;
            f.outbox = format!("ran {n} times for one write");
        }
        (true, None) => {
            return not_checked(
                f,
                format!(
                    "answered 2xx with another body and no Idempotent-Replayed, but {}: whether its own write ran is not known",
                    counter.why_not()
                ),
            )
        }
        (false, _) => {
            f.outcome = Outcome::Fail;
            f.outbox = format!(
                "{}: {}'s write is refused because {} used the key (keys are scoped globally, not per account)",
                outbox_does(&verdict),
                second.id,
                t.account
            );
        }
    }
    f
}

async fn key_reuse(t: &Target, counter: &Counter) -> Finding {
    let mut f = finding(
        "key-reuse",
        "a used key sent with another request is refused as a key misuse (422), nothing applied",
    );
    let key = match new_key() {
        Ok(k) => k,
        Err(e) => return not_checked(f, e),
    };
    match t.write(&key, &t.fresh_body(), Tweak::default()).await {
        Ok(a) if (200..300).contains(&a.status) => {}
        Ok(a) => return not_checked(f, format!("the first write answered {}", a.describe())),
        Err(e) => return network(f, e),
    }
    let other = t.fresh_body();
    let r = match refused_write(t, counter, &key, &other, Tweak::default()).await {
        Ok(r) => r,
        Err(e) => return network(f, e),
    };
    let verdict = r.answer.verdict();
    f.server = format!(
        "another body under a used key: {}{}",
        r.answer.describe(),
        ran_text(r.ran)
    );
    f.outbox = outbox_does(&verdict);
    let key_reused = matches!(
        verdict,
        Verdict::Attention {
            reason: AttentionReason::KeyReused,
            ..
        }
    );
    match (r.ran, &verdict) {
        (Some(n), _) if n > 0 => {
            f.outcome = Outcome::Fail;
            f.outbox = format!(
                "{}: the key no longer names one write, so a lost answer of either can be replayed as the other",
                f.outbox
            );
        }
        (_, Verdict::Replayed) => {
            f.outcome = Outcome::Fail;
            f.outbox =
                "deletes the record as delivered, but this write was never applied: a lost write"
                    .into();
        }
        (None, _) if !key_reused => {
            return not_checked(
                f,
                format!("{}: whether it ran cannot be seen", counter.why_not()),
            )
        }
        _ if key_reused => f.outcome = Outcome::Pass,
        _ => {
            f.outcome = Outcome::NotSupported;
            f.notes.push(
                "refused, but not as a key misuse: nothing is lost or doubled, the record ends up needing a person for another reason".into(),
            );
        }
    }
    f
}

async fn expected_account(t: &Target, counter: &Counter) -> Finding {
    let mut f = finding(
        "expected-account",
        "X-PM-Expected-Account naming another account → 409 account_mismatch, nothing applied",
    );
    let (key, body) = match new_key() {
        Ok(k) => (k, t.fresh_body()),
        Err(e) => return not_checked(f, e),
    };
    let other = t.options.other_account.clone();
    let tweak = Tweak {
        expected_account: Some(&other),
        ..Tweak::default()
    };
    let r = match refused_write(t, counter, &key, &body, tweak).await {
        Ok(r) => r,
        Err(e) => return network(f, e),
    };
    let verdict = r.answer.verdict();
    let ran = r.ran.map(|n| n > 0);
    f.server = format!(
        "X-PM-Expected-Account: {other}: {}{}",
        r.answer.describe(),
        ran_text(r.ran)
    );
    f.outbox = outbox_does(&verdict);
    let mismatch = verdict == Verdict::StaleIdentity { status: 409 };
    match (ran, mismatch) {
        (Some(true), _) | (None, false) if (200..300).contains(&r.answer.status) => {
            f.outcome = Outcome::NotSupported;
            f.outbox = "UNSAFE on devices shared by several accounts: the outbox checks /auth/me before every flush and holds replays across every sign-in its workers see (contract 4.5, r3/r4), but a sign-in it cannot see (a page outside every outbox scope, another app on the same origin) can change the session between that check and a replay, and this server then applies the first account's queued write as the second account, with nothing to tell them apart".into();
            f.notes.push(
                "check X-PM-Expected-Account: refuse a write whose header names another account than the session's with 409 {\"detail\":\"account_mismatch\"}, before the idempotency ledger".into(),
            );
        }
        (Some(true), _) => {
            f.outcome = Outcome::Fail;
            f.outbox = format!("{}, and the write was applied", f.outbox);
        }
        (_, true) => {
            f.outcome = Outcome::Pass;
            if ran.is_none() {
                f.notes.push(format!(
                    "nothing applied is not checked: {}",
                    counter.why_not()
                ));
            }
            if let Some(problem) = claimed_nothing(t, &key, &body).await {
                f.outcome = Outcome::Fail;
                f.notes.push(problem);
            }
        }
        (None, false) => {
            return not_checked(
                f,
                format!("{}: whether it ran cannot be seen", counter.why_not()),
            )
        }
        (Some(false), false) => {
            f.outcome = Outcome::NotSupported;
            f.notes.push(
                "refused, but not as account_mismatch: the outbox does not check again and resend; the record waits or needs a person as stated".into(),
            );
        }
    }
    f
}

/// The key-window duty, and a failure of the replay duty when it saw one: a key remembered
/// (not run again) but answered as no replay is the replay's failure, not the window's.
async fn key_window(t: &Target, counter: &Counter) -> (Finding, Option<String>) {
    let mut f = finding(
        "key-window",
        "a completed key is still honoured later; the window the server claims covers the outbox's serverKeyTtlMs",
    );
    let (key, body) = match new_key() {
        Ok(k) => (k, t.fresh_body()),
        Err(e) => return (not_checked(f, e), None),
    };
    let before = counter.now(t).await;
    match t.write(&key, &body, Tweak::default()).await {
        Ok(a) if (200..300).contains(&a.status) => {}
        Ok(a) => {
            return (
                not_checked(f, format!("the first write answered {}", a.describe())),
                None,
            )
        }
        Err(e) => return (network(f, e), None),
    }
    let probe = t.options.key_probe;
    tokio::time::sleep(probe).await;
    let later = match t.write(&key, &body, Tweak::default()).await {
        Ok(a) => a,
        Err(e) => return (network(f, e), None),
    };
    let ran = counter.since(t, before).await;
    let verdict = later.verdict();
    f.server = format!(
        "after {}: {}{}",
        human(probe),
        later.describe(),
        ran_text(ran)
    );
    f.outbox = outbox_does(&verdict);
    let outbox_ttl = Duration::from_millis(Config::default().server_key_ttl_ms);
    let honoured = match ran {
        Some(n) => n == 1 && verdict == Verdict::Replayed,
        None => later.replayed && verdict == Verdict::Replayed,
    };
    if ran.is_some_and(|n| n > 1) {
        f.outcome = Outcome::Fail;
        f.outbox = format!(
            "the server forgot the key within {}: a replay after that is applied again",
            human(probe)
        );
        return (f, None);
    }
    let mut replay_failure = None;
    if !honoured {
        if ran.is_none() {
            return (
                not_checked(
                    f,
                    format!("no Idempotent-Replayed marker and {}", counter.why_not()),
                ),
                None,
            );
        }
        // Ran once: the key was remembered, so the window holds; the answer is the
        // replay duty's failure.
        replay_failure = Some(format!(
            "a repeat {} after its write answered {} → {}, although the key was remembered (the write did not run again)",
            human(probe),
            later.describe(),
            outbox_does(&verdict)
        ));
        f.outbox = "keeps the record's key and replays it; the key was remembered".into();
        f.notes.push(format!(
            "remembered, but its replay was answered {}: reported under replay",
            later.describe()
        ));
    }
    f.outcome = Outcome::Pass;
    f.notes.push(format!(
        "checked: honoured after {}; not checked: anything longer (the check cannot wait a day)",
        human(probe)
    ));
    match t.options.key_ttl {
        Some(ttl) if ttl < outbox_ttl => {
            f.outcome = Outcome::Fail;
            f.outbox = format!(
                "the server claims {} but the outbox's serverKeyTtlMs is {} by default: a record first sent longer ago than {} would be resent after the key is forgotten, and applied twice; set serverKeyTtlMs to at most {} ms",
                human(ttl),
                human(outbox_ttl),
                human(ttl),
                ttl.as_millis()
            );
        }
        Some(ttl) => f.notes.push(format!(
            "claimed window {} ≥ the outbox's serverKeyTtlMs ({}): a record older than that is never resent with its key (key-expired, for a person)",
            human(ttl),
            human(outbox_ttl)
        )),
        None => f.notes.push(format!(
            "no --key-ttl given: the outbox's serverKeyTtlMs ({}) must not exceed how long the server keeps a key",
            human(outbox_ttl)
        )),
    }
    (f, replay_failure)
}

/// Builds a page key from the run's number.
type MakeKey = fn(u64) -> String;

/// Page keys the outbox passes through unchanged (contract 2.2): any 1–255 visible ASCII,
/// each made unique by the run's number so a server that keeps keys across runs sees
/// fresh ones.
const PAGE_KEYS: &[(&str, MakeKey)] = &[
    ("order_1234", |run| format!("order_{run}")),
    ("80 hex characters", |run| format!("{run:0>80x}")),
    ("k:7f3e", |run| format!("k:{run:x}")),
    ("255 characters", |run| {
        let digits = run.to_string();
        format!("{}{digits}", "k".repeat(255 - digits.len()))
    }),
];

async fn page_keys(t: &Target) -> Finding {
    let mut f = finding(
        "page-keys",
        "keys of any 1–255 visible ASCII characters are taken, as the outbox passes a page's own key through",
    );
    let mut refused = Vec::new();
    let mut seen = Vec::new();
    let run = crate::http::now_ms();
    for (name, make) in PAGE_KEYS {
        match t.write(&make(run), &t.fresh_body(), Tweak::default()).await {
            Ok(a) if (200..300).contains(&a.status) => seen.push(format!("{name}: {}", a.status)),
            Ok(a) => {
                seen.push(format!("{name}: {}", a.describe()));
                refused.push(format!("{name} → {}", outbox_does(&a.verdict())));
            }
            Err(e) => return network(f, e),
        }
    }
    f.server = seen.join(", ");
    if refused.is_empty() {
        f.outcome = Outcome::Pass;
        f.outbox = "passes page keys through unchanged; minted keys are UUID v4".into();
    } else {
        f.outcome = Outcome::NotSupported;
        f.outbox = format!(
            "a page's own key of these shapes is refused: {}; let the outbox mint the keys (UUID v4, accepted) for this server",
            refused.join("; ")
        );
    }
    f
}

fn ran_text(ran: Option<u64>) -> String {
    match ran {
        Some(1) => "; ran once".into(),
        Some(n) => format!("; ran {n} times"),
        None => String::new(),
    }
}

fn human(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        ms if ms % 86_400_000 == 0 && ms >= 172_800_000 => format!("{} d", ms / 86_400_000),
        ms if ms % 3_600_000 == 0 && ms > 0 => format!("{} h", ms / 3_600_000),
        ms if ms % 60_000 == 0 && ms > 0 => format!("{} min", ms / 60_000),
        ms if ms % 1000 == 0 => format!("{} s", ms / 1000),
        ms => format!("{ms} ms"),
    }
}

fn not_checked(mut f: Finding, why: impl Into<String>) -> Finding {
    f.outcome = Outcome::NotChecked;
    let why = why.into();
    if f.server.is_empty() {
        f.server = why;
    } else {
        f.notes.push(why);
    }
    if f.outbox.is_empty() {
        f.outbox = "unknown".into();
    }
    f
}

fn network(mut f: Finding, e: String) -> Finding {
    f.outcome = Outcome::Fail;
    f.server = format!("no answer: {e}");
    f.outbox = outbox_does(&Verdict::NetworkFailure);
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(human(Duration::from_secs(86_400)), "24 h");
        assert_eq!(human(Duration::from_secs(7 * 86_400)), "7 d");
        assert_eq!(human(Duration::from_secs(7200)), "2 h");
        assert_eq!(human(Duration::from_secs(3)), "3 s");
        assert_eq!(human(Duration::from_millis(1500)), "1500 ms");
    }

    #[test]
    fn page_keys_are_keys_the_outbox_accepts() {
        for run in [0, 1_765_000_000_000, u64::MAX] {
            for (name, make) in PAGE_KEYS {
                assert!(IdempotencyKey::parse(&make(run)).is_ok(), "{name} {run}");
            }
            assert_eq!(PAGE_KEYS[1].1(run).len(), 80);
            assert_eq!(PAGE_KEYS[3].1(run).len(), 255);
        }
    }
}
