//! The state the `/__control/` routes (`control_routes`) drive: the network switch, the
//! fault rules and the requests log. The pipeline reads it on every `/api/` request. (The
//! `applied` log lives in the store, written in the same transaction as the data change
//! it describes.)

use crate::faults::{self, Fault, Rule};
use serde::Serialize;
use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};

/// One `/api/` request as seen on arrival.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestEntry {
    pub seq: u64,
    pub method: String,
    pub path: String,
    pub key: Option<String>,
    pub expected_account: Option<String>,
    pub csrf: Option<String>,
    pub user: Option<String>,
    /// `None` while running, and forever when the connection was dropped or the client
    /// gave up.
    pub status: Option<u16>,
}

#[derive(Default)]
struct Inner {
    network_down: bool,
    rules: Vec<Rule>,
    /// The newest `log_limit` requests.
    requests: VecDeque<RequestEntry>,
    /// Entries dropped from the front to stay within the bound.
    dropped: u64,
    next_seq: u64,
}

/// The state the control routes drive. The requests log keeps at most `log_limit`
/// entries (the newest): a server that runs for weeks must not grow without end, and
/// with 0 (`prod`, where nothing can read it) nothing is logged.
pub struct Control {
    inner: Mutex<Inner>,
    log_limit: usize,
}

impl Control {
    /// Keeps the newest `log_limit` requests (0: none).
    pub fn new(log_limit: usize) -> Control {
        Control {
            inner: Mutex::new(Inner::default()),
            log_limit,
        }
    }

    /// How many requests the log holds now.
    pub fn logged(&self) -> usize {
        self.lock().requests.len()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn network_down(&self) -> bool {
        self.lock().network_down
    }

    /// The fault for this request, if a rule hits it (counting the hit).
    pub fn take_fault(&self, method: &str, path: &str) -> Option<Fault> {
        faults::take(&mut self.lock().rules, method, path)
    }

    /// Appends to the requests log (dropping the oldest entry past the bound); returns
    /// the entry's `seq`, 0 when nothing is logged.
    pub fn log_request(&self, mut entry: RequestEntry) -> u64 {
        if self.log_limit == 0 {
            return 0;
        }
        let mut inner = self.lock();
        inner.next_seq += 1;
        entry.seq = inner.next_seq;
        while inner.requests.len() >= self.log_limit {
            inner.requests.pop_front();
            inner.dropped += 1;
        }
        inner.requests.push_back(entry);
        inner.next_seq
    }

    pub fn set_status(&self, seq: u64, status: u16) {
        if seq == 0 {
            return;
        }
        let mut inner = self.lock();
        if let Some(e) = inner.requests.iter_mut().rev().find(|e| e.seq == seq) {
            e.status = Some(status);
        }
    }

    /// The network switch: down, every `/api/` request's connection is dropped.
    pub fn set_network_down(&self, down: bool) {
        self.lock().network_down = down;
    }

    pub fn rules(&self) -> Vec<Rule> {
        self.lock().rules.clone()
    }

    pub fn set_rules(&self, rules: Vec<Rule>) {
        self.lock().rules = rules;
    }

    /// The requests log, and how many entries were dropped from its front.
    pub fn requests(&self) -> (VecDeque<RequestEntry>, u64) {
        let inner = self.lock();
        (inner.requests.clone(), inner.dropped)
    }

    /// Network up, no rules, an empty log.
    pub fn reset(&self) {
        *self.lock() = Inner::default();
    }
}
