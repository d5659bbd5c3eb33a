//! Findings, one per duty, and how they are printed (text for people, JSON for CI).

use serde::Serialize;
use std::fmt::Write as _;
use sw_outbox::core::answer::Verdict;
use sw_outbox::core::config::Config;

/// The result of one duty.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// The server does what the outbox relies on.
    Pass,
    /// It does not, and writes can be lost or doubled, or never delivered.
    Fail,
    /// The server does not offer this; the outbox copes, with the consequence stated.
    NotSupported,
    /// The check could not be made (what it needs is missing: said in `server`).
    NotChecked,
}

impl Outcome {
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Fail => "FAIL",
            Outcome::NotSupported => "not supported",
            Outcome::NotChecked => "not checked",
        }
    }
}

/// One duty's finding.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    /// A stable id (`replay`, `concurrent-repeat`, …).
    pub duty: &'static str,
    /// What the duty is, in one line.
    pub title: &'static str,
    pub outcome: Outcome,
    /// What the server did.
    pub server: String,
    /// What the outbox does about it.
    pub outbox: String,
    /// Anything else worth knowing (a missing marker, what was not checked).
    pub notes: Vec<String>,
}

/// Every finding, in the order checked.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub target: String,
    pub account: String,
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn count(&self, outcome: Outcome) -> usize {
        self.findings
            .iter()
            .filter(|f| f.outcome == outcome)
            .count()
    }

    /// Whether a duty the outbox needs failed.
    pub fn failed(&self) -> bool {
        self.count(Outcome::Fail) > 0
    }

    pub fn finding(&self, duty: &str) -> Option<&Finding> {
        self.findings.iter().find(|f| f.duty == duty)
    }

    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "sw-outbox-conformance {} against {} (account {})\n",
            env!("CARGO_PKG_VERSION"),
            self.target,
            self.account
        );
        for f in &self.findings {
            let _ = writeln!(out, "[{}] {}: {}", f.outcome.label(), f.duty, f.title);
            let _ = writeln!(out, "    server: {}", f.server);
            let _ = writeln!(out, "    outbox: {}", f.outbox);
            for n in &f.notes {
                let _ = writeln!(out, "    note:   {n}");
            }
        }
        let _ = writeln!(
            out,
            "\n{} duties: {} pass, {} fail, {} not supported, {} not checked",
            self.findings.len(),
            self.count(Outcome::Pass),
            self.count(Outcome::Fail),
            self.count(Outcome::NotSupported),
            self.count(Outcome::NotChecked),
        );
        out
    }
}

/// What the outbox does with a replay answered this way (contract 4.5, the numbers from
/// the outbox's default configuration).
pub fn outbox_does(verdict: &Verdict) -> String {
    let c = Config::default();
    let failures = c.max_server_failures;
    match verdict {
        Verdict::Replayed => "deletes the record, counted as replayed".into(),
        Verdict::SignedOut => {
            "stops the flush; the record waits, unchanged, for its account to sign in".into()
        }
        Verdict::StaleIdentity { status: 403 } => "checks who is signed in again (fresh /auth/me, fresh token) and resends once; a second 403 → needs attention (rejected)".into(),
        Verdict::StaleIdentity { .. } => "checks who is signed in again and resends once; a second account_mismatch stops the flush, the record unchanged".into(),
        Verdict::InProgress => format!(
            "leaves the record queued and its workspace waiting, retried on a growing backoff; needs attention (conflict) only after {failures} such answers in a row lasting {} min",
            c.still_running_patience_ms / 60_000
        ),
        Verdict::Attention { reason, status } => {
            format!("needs attention: {} (status {status})", reason.as_str())
        }
        Verdict::RetryLater { .. } => format!(
            "stops the flush; the next one waits Retry-After (at most {} s)",
            c.max_retry_after_ms / 1000
        ),
        Verdict::ServerFailure { status } => format!(
            "counts a server failure ({status}) and retries later; {failures} in a row → needs attention (repeated-5xx)"
        ),
        Verdict::NetworkFailure => {
            "stops the flush; the record is unchanged and keeps its key".into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sw_outbox::core::record::AttentionReason;

    #[test]
    fn texts_name_the_outboxs_reasons() {
        let reused = Verdict::Attention {
            reason: AttentionReason::KeyReused,
            status: 417,
        };
        assert_eq!(
            outbox_does(&reused),
            "needs attention: key-reused (status 417)"
        );
        assert!(outbox_does(&Verdict::InProgress).contains("3 such answers"));
    }

    #[test]
    fn a_failure_is_what_fails_the_run() {
        let finding = |outcome| Finding {
            duty: "d",
            title: "t",
            outcome,
            server: String::new(),
            outbox: String::new(),
            notes: Vec::new(),
        };
        let mut r = Report {
            target: "http://x".into(),
            account: "a".into(),
            findings: vec![
                finding(Outcome::Pass),
                finding(Outcome::NotSupported),
                finding(Outcome::NotChecked),
            ],
        };
        assert!(!r.failed());
        r.findings.push(finding(Outcome::Fail));
        assert!(r.failed());
        assert!(r
            .to_text()
            .contains("4 duties: 1 pass, 1 fail, 1 not supported, 1 not checked"));
    }
}
