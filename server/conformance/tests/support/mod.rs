//! Runs the built `sw-outbox-conformance` binary, as an adopter would, and reads its
//! JSON report.

#![allow(dead_code)]

use serde_json::Value;
use std::collections::BTreeMap;
use std::net::SocketAddr;

pub struct Run {
    pub status: Option<i32>,
    pub report: Option<Value>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Each duty's outcome, by duty.
    pub fn outcomes(&self) -> BTreeMap<String, String> {
        let findings = self
            .report
            .as_ref()
            .and_then(|r| r["findings"].as_array().cloned())
            .unwrap_or_default();
        findings
            .iter()
            .map(|f| {
                (
                    f["duty"].as_str().unwrap_or("?").to_owned(),
                    f["outcome"].as_str().unwrap_or("?").to_owned(),
                )
            })
            .collect()
    }

    pub fn finding(&self, duty: &str) -> Value {
        self.report
            .as_ref()
            .and_then(|r| r["findings"].as_array().cloned())
            .unwrap_or_default()
            .into_iter()
            .find(|f| f["duty"] == duty)
            .unwrap_or_else(|| panic!("no finding {duty}: {}\n{}", self.stdout, self.stderr))
    }

    pub fn explain(&self) -> String {
        format!(
            "exit {:?}\nstdout:\n{}\nstderr:\n{}",
            self.status, self.stdout, self.stderr
        )
    }
}

/// `sw-outbox-conformance http://<addr> <args>`.
pub async fn conformance(addr: SocketAddr, args: &[&str]) -> Run {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_sw-outbox-conformance"))
        .arg(format!("http://{addr}"))
        .args(args)
        .output()
        .await
        .expect("the conformance binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    Run {
        status: out.status.code(),
        report: serde_json::from_str(&stdout).ok(),
        stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

pub fn expected(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(d, o)| ((*d).to_owned(), (*o).to_owned()))
        .collect()
}
