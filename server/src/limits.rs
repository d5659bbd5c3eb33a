//! In-memory counters for the login throttle (failures in a sliding window) and the
//! per-session write budget (a token bucket). Per process: with several replicas each keeps
//! its own, which bounds an attacker per replica, not in total.

use crate::config::Rate;
use std::collections::{HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Failed attempts per key in the last `rate.per`; refuses once `rate.count` are there.
pub struct Throttle {
    rate: Rate,
    failures: Mutex<HashMap<String, VecDeque<Instant>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Throttle {
    pub fn new(rate: Rate) -> Throttle {
        Throttle {
            rate,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// `Err(wait)` while `key` has used up its attempts: how long until one frees up.
    pub fn check(&self, key: &str, now: Instant) -> Result<(), Duration> {
        let mut map = lock(&self.failures);
        let Some(q) = map.get_mut(key) else {
            return Ok(());
        };
        while q
            .front()
            .is_some_and(|t| now.duration_since(*t) >= self.rate.per)
        {
            q.pop_front();
        }
        match q.front() {
            Some(oldest) if q.len() >= self.rate.count as usize => {
                Err(self.rate.per.saturating_sub(now.duration_since(*oldest)))
            }
            _ => Ok(()),
        }
    }

    pub fn fail(&self, key: &str, now: Instant) {
        let mut map = lock(&self.failures);
        let q = map.entry(key.to_owned()).or_default();
        q.push_back(now);
        while q.len() > self.rate.count as usize {
            q.pop_front();
        }
    }

    pub fn clear(&self, key: &str) {
        lock(&self.failures).remove(key);
    }

    /// Forgets every key (the test-mode reset).
    pub fn reset(&self) {
        lock(&self.failures).clear();
    }

    /// Forgets keys whose failures are all older than the window.
    pub fn prune(&self, now: Instant) {
        let per = self.rate.per;
        lock(&self.failures).retain(|_, q| q.back().is_some_and(|t| now.duration_since(*t) < per));
    }
}

/// How many more failures the client-wide and the account-wide counts allow than the
/// count of one client on one account.
pub const WIDE_FACTOR: u32 = 4;

/// Longest account name kept as a throttle key: a sign-in body may name anything.
const MAX_ACCOUNT_KEY: usize = 256;

/// Failed sign-ins, counted three ways so that no client can lock out the others:
///
/// - per (account, client): `rate.count` — one client guessing one account's password;
/// - per client, any account: `WIDE_FACTOR` × that — one client trying many accounts;
/// - per account, any client: `WIDE_FACTOR` × that — many clients guessing one account.
///   Locking an account out for everyone so takes failures from `WIDE_FACTOR` clients,
///   and each of them is held back first.
///
/// A successful sign-in clears only its own (account, client) count: an attacker who
/// owns an account cannot reset its client count by signing in to it between guesses.
pub struct LoginThrottle {
    pair: Throttle,
    client: Throttle,
    account: Throttle,
}

impl LoginThrottle {
    pub fn new(rate: Rate) -> LoginThrottle {
        let wide = Rate {
            count: rate.count.saturating_mul(WIDE_FACTOR),
            per: rate.per,
        };
        LoginThrottle {
            pair: Throttle::new(rate),
            client: Throttle::new(wide),
            account: Throttle::new(wide),
        }
    }

    fn keys(account: &str, client: &str) -> (String, String) {
        let account: String = account
            .to_lowercase()
            .chars()
            .take(MAX_ACCOUNT_KEY)
            .collect();
        let pair = format!("{client} {account}");
        (account, pair)
    }

    /// `Err(wait)` while any of the three counts is used up: the longest wait.
    pub fn check(&self, account: &str, client: &str, now: Instant) -> Result<(), Duration> {
        let (account, pair) = LoginThrottle::keys(account, client);
        let waits = [
            self.pair.check(&pair, now),
            self.client.check(client, now),
            self.account.check(&account, now),
        ];
        match waits.iter().filter_map(|w| w.err()).max() {
            Some(wait) => Err(wait),
            None => Ok(()),
        }
    }

    pub fn fail(&self, account: &str, client: &str, now: Instant) {
        let (account, pair) = LoginThrottle::keys(account, client);
        self.pair.fail(&pair, now);
        self.client.fail(client, now);
        self.account.fail(&account, now);
    }

    pub fn succeed(&self, account: &str, client: &str) {
        self.pair.clear(&LoginThrottle::keys(account, client).1);
    }

    pub fn reset(&self) {
        self.pair.reset();
        self.client.reset();
        self.account.reset();
    }

    pub fn prune(&self, now: Instant) {
        self.pair.prune(now);
        self.client.prune(now);
        self.account.prune(now);
    }
}

/// A token bucket per key: `rate.count` tokens, refilled at `rate.count` per `rate.per`.
pub struct Budget {
    rate: Rate,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl Budget {
    pub fn new(rate: Rate) -> Budget {
        Budget {
            rate,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn per_token(&self) -> Duration {
        self.rate.per / self.rate.count
    }

    fn refilled(&self, tokens: f64, since: Instant, now: Instant) -> f64 {
        let gained = now.duration_since(since).as_secs_f64() / self.per_token().as_secs_f64();
        (tokens + gained).min(f64::from(self.rate.count))
    }

    /// Takes one token, or `Err(wait)`: how long until the next one.
    pub fn take(&self, key: &str, now: Instant) -> Result<(), Duration> {
        let mut map = lock(&self.buckets);
        let full = f64::from(self.rate.count);
        let (tokens, at) = map.get(key).copied().unwrap_or((full, now));
        let tokens = self.refilled(tokens, at, now);
        if tokens >= 1.0 {
            map.insert(key.to_owned(), (tokens - 1.0, now));
            Ok(())
        } else {
            map.insert(key.to_owned(), (tokens, now));
            Err(self.per_token().mul_f64(1.0 - tokens))
        }
    }

    pub fn forget(&self, key: &str) {
        lock(&self.buckets).remove(key);
    }

    /// Refills every bucket (the test-mode reset).
    pub fn reset(&self) {
        lock(&self.buckets).clear();
    }

    /// Drops full buckets: a missing bucket is a full one.
    pub fn prune(&self, now: Instant) {
        let full = f64::from(self.rate.count);
        let mut map = lock(&self.buckets);
        let keep: HashMap<String, (f64, Instant)> = map
            .drain()
            .filter(|(_, (t, at))| self.refilled(*t, *at, now) < full)
            .collect();
        *map = keep;
    }
}

/// Seconds for `Retry-After`, rounded up, at least 1.
pub fn retry_after_secs(wait: Duration) -> u64 {
    let s = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    s.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(count: u32, secs: u64) -> Rate {
        Rate {
            count,
            per: Duration::from_secs(secs),
        }
    }

    #[test]
    fn throttle_window() {
        let t = Throttle::new(rate(2, 60));
        let t0 = Instant::now();
        assert!(t.check("a", t0).is_ok());
        t.fail("a", t0);
        t.fail("a", t0 + Duration::from_secs(10));
        let wait = t
            .check("a", t0 + Duration::from_secs(20))
            .expect_err("throttled");
        assert_eq!(wait, Duration::from_secs(40));
        assert!(t.check("b", t0).is_ok(), "per key");
        assert!(
            t.check("a", t0 + Duration::from_secs(60)).is_ok(),
            "the oldest left"
        );
        t.clear("a");
        t.fail("a", t0);
        assert!(t.check("a", t0).is_ok());
        t.prune(t0 + Duration::from_secs(61));
        assert!(lock(&t.failures).is_empty());
    }

    #[test]
    fn login_throttle_keeps_clients_apart() {
        let t = LoginThrottle::new(rate(2, 60));
        let t0 = Instant::now();
        for _ in 0..2 {
            t.fail("Alice", "203.0.113.1", t0);
        }
        assert!(
            t.check("alice", "203.0.113.1", t0).is_err(),
            "that client, that account"
        );
        assert!(
            t.check("alice", "203.0.113.2", t0).is_ok(),
            "another client, same account"
        );
        assert!(
            t.check("bob", "203.0.113.1", t0).is_ok(),
            "same client, another account"
        );
        // One client spraying accounts: held back at WIDE_FACTOR x the count.
        for i in 0..(2 * WIDE_FACTOR - 2) {
            t.fail(&format!("user{i}"), "203.0.113.1", t0);
        }
        assert!(t.check("carol", "203.0.113.1", t0).is_err(), "client-wide");
        assert!(t.check("carol", "203.0.113.2", t0).is_ok());
        // Many clients on one account: held back for everyone only at WIDE_FACTOR x.
        for c in 0..(WIDE_FACTOR - 1) {
            for _ in 0..2 {
                t.fail("dave", &format!("198.51.100.{c}"), t0);
            }
        }
        assert!(
            t.check("dave", "192.0.2.1", t0).is_ok(),
            "not yet account-wide"
        );
        t.fail("dave", "198.51.100.99", t0);
        t.fail("dave", "198.51.100.99", t0);
        assert!(t.check("dave", "192.0.2.1", t0).is_err(), "account-wide");
        // Success clears that pair only.
        t.succeed("alice", "203.0.113.1");
        assert!(
            t.check("alice", "203.0.113.1", t0).is_err(),
            "still client-wide"
        );
        t.prune(t0 + Duration::from_secs(61));
        assert!(t
            .check("dave", "192.0.2.1", t0 + Duration::from_secs(61))
            .is_ok());
    }

    #[test]
    fn budget_bucket() {
        let b = Budget::new(rate(3, 3));
        let t0 = Instant::now();
        for _ in 0..3 {
            assert!(b.take("s", t0).is_ok());
        }
        let wait = b.take("s", t0).expect_err("spent");
        assert_eq!(retry_after_secs(wait), 1);
        assert!(b.take("other", t0).is_ok(), "per session");
        assert!(
            b.take("s", t0 + Duration::from_secs(1)).is_ok(),
            "one refilled"
        );
        assert!(b.take("s", t0 + Duration::from_secs(1)).is_err());
        b.prune(t0 + Duration::from_secs(10));
        assert!(lock(&b.buckets).is_empty(), "all full again");
    }
}
