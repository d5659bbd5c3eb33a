//! Two reference-server processes behind one "load balancer" (this test, alternating),
//! sharing one idempotency ledger in a real PostgreSQL, one of them with its clock five
//! minutes ahead (libfaketime, preloaded into that process only: every clock read of the
//! process is skewed, as on a host whose clock drifted).
//!
//! The ledger must take no time from either process: claims, heartbeats, staleness and
//! expiry are the database's. The test races copies of the same writes across both
//! processes and checks every write was applied exactly once, that a live claim seen from
//! the skewed process is "running" (not "outcome unknown"), that a key is not expired early
//! by the process whose clock runs ahead (`--key-ttl 2m`, skew 5 min), and that a claim
//! whose process died still turns into "outcome unknown" after the stale bound, never into
//! a second run.
//!
//! The test names start with `multi_instance_`, so `./build.sh test` can run them as a
//! suite of their own. `SW_OUTBOX_SERVER_BIN` runs them against another build of the
//! server (how they were seen to fail on the ledger that trusted each process's clock).

mod common;

use common::*;
use serde_json::Value;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// The skew of the second process: ahead, so the first one's fresh heartbeats look five
/// minutes old to it, and entries younger than the 2-minute key window look expired.
const SKEW: &str = "+5m";
const SKEW_SECS: i64 = 300;

/// libfaketime from Debian (`apt-get install faketime`; ./build.sh does), the variant for
/// multi-threaded programs.
fn libfaketime() -> Result<PathBuf, String> {
    let found = std::fs::read_dir("/usr/lib")
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join("faketime/libfaketimeMT.so.1"))
        .find(|p| p.is_file());
    found.ok_or_else(|| {
        "libfaketime is not installed (no /usr/lib/*/faketime/libfaketimeMT.so.1): the \
         multi-instance test needs it to skew one server's clock. `apt-get install faketime` \
         (./build.sh does), or set SW_OUTBOX_SKIP_PG=1 to skip the PostgreSQL tests."
            .to_owned()
    })
}

fn server_bin() -> PathBuf {
    std::env::var_os("SW_OUTBOX_SERVER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_sw-outbox-server")))
}

/// A server process, killed when dropped.
struct Instance {
    child: Child,
    addr: SocketAddr,
}

impl Instance {
    async fn start(ledger_url: &str, skew: Option<&str>) -> Instance {
        let www = www_dir();
        let mut cmd = Command::new(server_bin());
        cmd.args(["--port", "0", "--mode", "test", "--db", ":memory:", "--www"])
            .arg(&www)
            .args(["--ledger", ledger_url])
            // Short enough for a test, far shorter than the skew: a process that judged
            // expiry by its own clock would see the other's entries as expired.
            .args([
                "--key-ttl",
                "2m",
                "--stale-after",
                "3s",
                "--heartbeat",
                "500ms",
            ])
            // Copies wait for a running first attempt (however slow the machine is).
            .args(["--in-progress-wait", "30s", "--in-progress-poll", "50ms"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(skew) = skew {
            let lib = libfaketime().unwrap_or_else(|e| panic!("{e}"));
            cmd.env("LD_PRELOAD", lib)
                .env("FAKETIME", skew)
                // Timers and waits run on the monotonic clock; the wall clock is skewed.
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        let mut child = cmd.spawn().expect("start the server");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the server printed its address within 60 s")
            .expect("read stdout")
            .expect("a line");
        let port: u16 = line
            .rsplit(':')
            .next()
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("not an address line: {line:?}"));
        // Keep reading (and dropping) anything else it prints.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Instance {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }
}

/// Seconds since the Unix epoch of an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`).
fn http_date_secs(date: &str) -> Option<i64> {
    let parts: Vec<&str> = date.split_whitespace().collect();
    let [_, day, month, year, time, "GMT"] = parts.as_slice() else {
        return None;
    };
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| m == month)? as i64
        + 1;
    let (day, year): (i64, i64) = (day.parse().ok()?, year.parse().ok()?);
    let hms: Vec<i64> = time.split(':').filter_map(|p| p.parse().ok()).collect();
    let [h, m, s] = hms.as_slice() else {
        return None;
    };
    // Days from the civil date (H. Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + m * 60 + s)
}

async fn clock_of(addr: SocketAddr) -> i64 {
    let r = Client::anonymous(addr).get("/api/auth/me").await;
    let date = r.header("date").expect("a Date header");
    http_date_secs(date).unwrap_or_else(|| panic!("unreadable Date {date:?}"))
}

/// Which keys a server's routes applied, and how often.
async fn applied_keys(addr: SocketAddr, into: &mut HashMap<String, usize>) {
    for a in applied(addr).await {
        if let Some(k) = a["key"].as_str() {
            *into.entry(k.to_owned()).or_default() += 1;
        }
    }
}

fn note(key: &str) -> String {
    format!(r#"{{"text":"{key}"}}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn multi_instance_servers_with_clocks_minutes_apart_apply_each_write_once() {
    const KEYS: usize = 12;
    const COPIES: usize = 6;
    let Some(pg) = pg::server() else {
        return;
    };
    let url = pg.fresh_database().await;
    let a = Instance::start(&url, None).await;
    let b = Instance::start(&url, Some(SKEW)).await;
    // The skew is real: the second process's own clock is five minutes ahead.
    let seen = clock_of(b.addr).await - clock_of(a.addr).await;
    assert!(
        (SKEW_SECS - 30..=SKEW_SECS + 30).contains(&seen),
        "the skewed server's clock is {seen} s ahead, not {SKEW_SECS}"
    );

    let clients = [
        Client::login(a.addr, "alice").await,
        Client::login(b.addr, "alice").await,
    ];
    let slow = |ms: u64| {
        format!(r#"[{{"path":"/api/notes","method":"POST","kind":"delay","delayMs":{ms}}}]"#)
    };
    for addr in [a.addr, b.addr] {
        faults(addr, &slow(1500)).await;
    }

    // Copies of every write at once, alternating between the two servers: each write is
    // claimed by one of them, and every other copy waits for it and gets its answer.
    let barrier = Arc::new(tokio::sync::Barrier::new(KEYS * COPIES));
    let mut tasks = Vec::new();
    for k in 0..KEYS {
        for c in 0..COPIES {
            let client = clients[(k + c) % 2].clone();
            let barrier = barrier.clone();
            tasks.push(tokio::spawn(async move {
                let key = format!("race-{k:02}-key-of-a-write");
                barrier.wait().await;
                let r = client.post("/api/notes", Some(&key), &note(&key)).await;
                (key, (k + c) % 2, r)
            }));
        }
    }
    let mut first: HashMap<String, Vec<Value>> = HashMap::new();
    for t in tasks {
        let (key, server, r) = t.await.expect("join");
        assert_eq!(
            r.status,
            201,
            "{key} at server {}: {} {}",
            ["a", "b (skewed)"][server],
            r.status,
            String::from_utf8_lossy(&r.body)
        );
        if r.header("idempotent-replayed").is_none() {
            first.entry(key).or_default().push(r.json());
        }
    }
    assert_eq!(first.len(), KEYS, "every write got one first answer");
    assert!(first.values().all(|v| v.len() == 1), "{first:?}");

    // Every copy again, one at a time, at both servers: replays. The skewed server must
    // not find the other's entries expired (they are seconds old, by the database).
    for addr in [a.addr, b.addr] {
        faults(addr, "[]").await;
    }
    for k in 0..KEYS {
        let key = format!("race-{k:02}-key-of-a-write");
        for client in &clients {
            let r = client.post("/api/notes", Some(&key), &note(&key)).await;
            assert_eq!(
                (r.status, r.header("idempotent-replayed")),
                (201, Some("true")),
                "{key} at {}",
                client.addr
            );
            assert_eq!(r.json(), first[&key][0], "{key}: the first answer");
        }
    }

    // A write that runs past the stale bound (3 s) on the unskewed server: its heartbeats,
    // judged by the database's clock, keep it alive for the skewed server's copy.
    faults(a.addr, &slow(4500)).await;
    let long_key = "long-running-write-key";
    let first_attempt = {
        let c = clients[0].clone();
        tokio::spawn(async move { c.post("/api/notes", Some(long_key), &note(long_key)).await })
    };
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let copy = clients[1]
        .post("/api/notes", Some(long_key), &note(long_key))
        .await;
    let original = first_attempt.await.expect("join");
    assert_eq!(original.status, 201);
    assert_eq!(
        (copy.status, copy.header("idempotent-replayed")),
        (201, Some("true")),
        "the copy waited for the live claim: {}",
        String::from_utf8_lossy(&copy.body)
    );

    let mut counts: HashMap<String, usize> = HashMap::new();
    applied_keys(a.addr, &mut counts).await;
    applied_keys(b.addr, &mut counts).await;
    assert_eq!(counts.len(), KEYS + 1, "{counts:?}");
    assert!(
        counts.values().all(|&n| n == 1),
        "each write applied once: {counts:?}"
    );

    // The unskewed server dies while a write it claimed is running: the skewed server's
    // copy waits while the claim is fresh, then, once no heartbeat came for the stale
    // bound, answers "outcome unknown". It never runs the write itself.
    faults(a.addr, &slow(20_000)).await;
    let orphan = "claimed-by-a-process-that-died";
    let doomed = {
        let c = clients[0].clone();
        tokio::spawn(async move {
            c.try_send(
                "POST",
                "/api/notes",
                &[("Idempotency-Key", orphan)],
                Some(note(orphan).as_bytes()),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let mut a = a;
    a.child.kill().await.expect("kill the first server");
    let _ = doomed.await;
    let r = clients[1]
        .post("/api/notes", Some(orphan), &note(orphan))
        .await;
    assert_eq!(
        (r.status, r.detail().as_str()),
        (409, "idempotency_outcome_unknown"),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    let mut after: HashMap<String, usize> = HashMap::new();
    applied_keys(b.addr, &mut after).await;
    assert!(!after.contains_key(orphan), "never run by the survivor");
}
