//! The `Ledger` contract, checked directly (no HTTP) on every backend, and the race that
//! sharing a ledger between server processes must survive.

mod common;

use axum::body::{to_bytes, Body};
use axum::response::Response;
use common::*;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use sw_outbox_server::app::App;
use sw_outbox_server::idempotency::{self, MAX_STORED_BODY};
use sw_outbox_server::ledger::{Begin, ClaimToken, Fingerprint, Ledger, Scope, StoredAnswer};
use sw_outbox_server::ledger_pg::PgLedger;
use sw_outbox_server::store::{Db, Store};
use sw_outbox_server::{Config, LedgerTimings};
use tokio::sync::Barrier;

// Every case runs twice, as `sqlite::<case>` and `postgres::<case>`.
on_both_ledgers!(
    claim_then_complete_then_replay,
    every_status_is_stored_with_its_headers_and_body,
    a_stale_claim_cannot_touch_the_claim_that_replaced_it,
    prune_and_clear,
);

fn fp(body: &[u8]) -> Fingerprint {
    Fingerprint {
        method: "POST".into(),
        path: "/api/notes".into(),
        body_sha256: Sha256::digest(body).into(),
    }
}

fn scope(account: &str, key: &str) -> Scope {
    Scope {
        account: account.into(),
        key: key.into(),
    }
}

fn token(t: &str) -> ClaimToken {
    ClaimToken(t.into())
}

async fn claim_then_complete_then_replay(backend: Backend) {
    let Some(l) = ledger_on(backend).await else {
        return;
    };
    let s = scope("alice", &"k".repeat(22));
    let t = token("t1");
    assert_eq!(
        l.begin(&s, &fp(b"a"), &t, 1000, 0).await.unwrap(),
        Begin::Claimed(t.clone())
    );
    let t2 = token("t2");
    assert_eq!(
        l.begin(&s, &fp(b"a"), &t2, 1001, 0).await.unwrap(),
        Begin::Running { heartbeat_ms: 1000 }
    );
    l.heartbeat(&s, &t, 1500).await.unwrap();
    assert_eq!(
        l.begin(&s, &fp(b"a"), &t2, 1501, 0).await.unwrap(),
        Begin::Running { heartbeat_ms: 1500 }
    );
    // A stranger's heartbeat does not keep the claim alive.
    l.heartbeat(&s, &t2, 1600).await.unwrap();
    assert_eq!(
        l.begin(&s, &fp(b"a"), &t2, 1601, 0).await.unwrap(),
        Begin::Running { heartbeat_ms: 1500 }
    );
    // Body, method and path are each part of the fingerprint.
    assert_eq!(
        l.begin(&s, &fp(b"b"), &t2, 1602, 0).await.unwrap(),
        Begin::Reused
    );
    let mut other_path = fp(b"a");
    other_path.path = "/api/notes?x=1".into();
    assert_eq!(
        l.begin(&s, &other_path, &t2, 1602, 0).await.unwrap(),
        Begin::Reused
    );
    let mut other_method = fp(b"a");
    other_method.method = "PUT".into();
    assert_eq!(
        l.begin(&s, &other_method, &t2, 1602, 0).await.unwrap(),
        Begin::Reused
    );
    let ans = StoredAnswer {
        status: 201,
        content_type: Some("application/json".into()),
        location: Some("/api/notes/1".into()),
        body: b"{}".to_vec(),
    };
    // A stranger's token cannot complete the claim.
    l.complete(&s, &t2, &ans).await.unwrap();
    assert!(matches!(
        l.begin(&s, &fp(b"a"), &t2, 1603, 0).await.unwrap(),
        Begin::Running { .. }
    ));
    l.complete(&s, &t, &ans).await.unwrap();
    assert_eq!(
        l.begin(&s, &fp(b"a"), &t2, 1604, 0).await.unwrap(),
        Begin::Completed(ans.clone())
    );
    // Completed is final: neither a second completion nor a heartbeat changes it.
    let other = StoredAnswer {
        status: 500,
        content_type: None,
        location: None,
        body: Vec::new(),
    };
    l.complete(&s, &t, &other).await.unwrap();
    l.heartbeat(&s, &t, 1700).await.unwrap();
    assert_eq!(
        l.begin(&s, &fp(b"a"), &t2, 1701, 0).await.unwrap(),
        Begin::Completed(ans)
    );
    // Another account's identical key is a different entry.
    let bob = scope("bob", &s.key);
    assert_eq!(
        l.begin(&bob, &fp(b"a"), &t2, 1705, 0).await.unwrap(),
        Begin::Claimed(t2.clone())
    );
    // Expired: claimable again, even by a different request; pruning removes old rows.
    let t3 = token("t3");
    assert_eq!(
        l.begin(&s, &fp(b"z"), &t3, 9000, 5000).await.unwrap(),
        Begin::Claimed(t3)
    );
    assert_eq!(
        l.prune(9000).await.unwrap(),
        1,
        "bob's entry (created 1705) is pruned"
    );
}

async fn every_status_is_stored_with_its_headers_and_body(backend: Backend) {
    let Some(l) = ledger_on(backend).await else {
        return;
    };
    let json = Some("application/json".to_owned());
    let answers = [
        (200, json.clone(), None, br#"{"ok":true}"#.to_vec()),
        (
            201,
            json.clone(),
            Some("/api/projects/p1/tasks/7".to_owned()),
            b"{}".to_vec(),
        ),
        (204, None, None, Vec::new()),
        (
            400,
            json.clone(),
            None,
            br#"{"detail":"invalid_body"}"#.to_vec(),
        ),
        (
            404,
            json.clone(),
            None,
            br#"{"detail":"not_found"}"#.to_vec(),
        ),
        (
            409,
            json.clone(),
            None,
            br#"{"detail":"conflict"}"#.to_vec(),
        ),
        (422, json.clone(), None, br#"{"detail":"x"}"#.to_vec()),
        (
            500,
            json.clone(),
            None,
            br#"{"detail":"storage_error"}"#.to_vec(),
        ),
        (
            503,
            Some("text/plain; charset=utf-8".to_owned()),
            None,
            b"down".to_vec(),
        ),
        // The largest body the protocol stores, every byte value included.
        (
            200,
            Some("application/octet-stream".to_owned()),
            None,
            (0..MAX_STORED_BODY).map(|i| (i % 251) as u8).collect(),
        ),
    ];
    for (i, (status, content_type, location, body)) in answers.into_iter().enumerate() {
        let s = scope("alice", &format!("status-{i:0>16}"));
        let t = token(&format!("t{i}"));
        let answer = StoredAnswer {
            status,
            content_type,
            location,
            body,
        };
        assert_eq!(
            l.begin(&s, &fp(b"x"), &t, 1000, 0).await.unwrap(),
            Begin::Claimed(t.clone())
        );
        l.complete(&s, &t, &answer).await.unwrap();
        assert_eq!(
            l.begin(&s, &fp(b"x"), &token("again"), 1001, 0)
                .await
                .unwrap(),
            Begin::Completed(answer),
            "status {status}"
        );
    }
}

/// A claim that expired and was claimed again belongs to its new owner: the first request,
/// if it is somehow still running, can neither complete nor heartbeat it.
async fn a_stale_claim_cannot_touch_the_claim_that_replaced_it(backend: Backend) {
    let Some(l) = ledger_on(backend).await else {
        return;
    };
    let s = scope("alice", &"r".repeat(30));
    let (old, new) = (token("old"), token("new"));
    assert_eq!(
        l.begin(&s, &fp(b"a"), &old, 1000, 0).await.unwrap(),
        Begin::Claimed(old.clone())
    );
    // A completed entry is replaced on expiry just like a running one.
    assert_eq!(
        l.begin(&s, &fp(b"a"), &new, 5000, 2000).await.unwrap(),
        Begin::Claimed(new.clone())
    );
    let stale = StoredAnswer {
        status: 201,
        content_type: None,
        location: None,
        body: b"stale".to_vec(),
    };
    l.complete(&s, &old, &stale).await.unwrap();
    l.heartbeat(&s, &old, 6000).await.unwrap();
    assert_eq!(
        l.begin(&s, &fp(b"a"), &token("probe"), 6001, 2000)
            .await
            .unwrap(),
        Begin::Running { heartbeat_ms: 5000 }
    );
    let fresh = StoredAnswer {
        status: 200,
        content_type: None,
        location: None,
        body: b"fresh".to_vec(),
    };
    l.complete(&s, &new, &fresh).await.unwrap();
    assert_eq!(
        l.begin(&s, &fp(b"a"), &token("probe"), 6002, 2000)
            .await
            .unwrap(),
        Begin::Completed(fresh.clone())
    );
    // Expired again: the stored answer goes with it.
    let newest = token("newest");
    assert_eq!(
        l.begin(&s, &fp(b"other"), &newest, 9000, 8000)
            .await
            .unwrap(),
        Begin::Claimed(newest)
    );
}

async fn prune_and_clear(backend: Backend) {
    let Some(l) = ledger_on(backend).await else {
        return;
    };
    for (i, created) in [100, 200, 300, 400].into_iter().enumerate() {
        let s = scope("alice", &format!("prune-{i:0>18}"));
        let t = token(&format!("p{i}"));
        assert_eq!(
            l.begin(&s, &fp(b"p"), &t, created, 0).await.unwrap(),
            Begin::Claimed(t)
        );
    }
    assert_eq!(l.prune(100).await.unwrap(), 0, "strictly older only");
    assert_eq!(l.prune(300).await.unwrap(), 2);
    assert_eq!(l.prune(300).await.unwrap(), 0);
    // The survivors are still there.
    assert!(matches!(
        l.begin(
            &scope("alice", &format!("prune-{:0>18}", 3)),
            &fp(b"p"),
            &token("x"),
            500,
            0
        )
        .await
        .unwrap(),
        Begin::Running { heartbeat_ms: 400 }
    ));
    l.clear().await.unwrap();
    assert_eq!(l.prune(i64::MAX).await.unwrap(), 0, "clear left nothing");
    let t = token("after-clear");
    assert_eq!(
        l.begin(
            &scope("alice", &format!("prune-{:0>18}", 3)),
            &fp(b"q"),
            &t,
            600,
            0
        )
        .await
        .unwrap(),
        Begin::Claimed(t)
    );
}

const RACE_KEYS: usize = 40;
/// Concurrent attempts per key on each replica.
const RACERS_PER_REPLICA: usize = 4;

/// Two replicas (two `PgLedger`s, two connection pools) on one database.
async fn two_replicas() -> Option<(Arc<dyn Ledger>, Arc<dyn Ledger>)> {
    let url = pg::server()?.fresh_database().await;
    let a = PgLedger::connect(&url).await.expect("replica a");
    let b = PgLedger::connect(&url).await.expect("replica b");
    Some((Arc::new(a), Arc::new(b)))
}

/// Every racer calls `begin` on one of the two replicas at the same moment; returns how
/// many got `Claimed` per key, and checks everyone else read a claim instead.
async fn race_begin(
    a: &Arc<dyn Ledger>,
    b: &Arc<dyn Ledger>,
    round: &str,
    now_ms: i64,
    expired_before_ms: i64,
) -> HashMap<usize, usize> {
    let racers = RACE_KEYS * RACERS_PER_REPLICA * 2;
    let barrier = Arc::new(Barrier::new(racers));
    let mut tasks = Vec::new();
    for k in 0..RACE_KEYS {
        for r in 0..RACERS_PER_REPLICA * 2 {
            let ledger = if r % 2 == 0 { a.clone() } else { b.clone() };
            let barrier = barrier.clone();
            let tok = token(&format!("{round}-{k}-{r}"));
            tasks.push(tokio::spawn(async move {
                let s = scope("alice", &format!("race-{k:0>17}"));
                barrier.wait().await;
                let got = ledger
                    .begin(&s, &fp(b"race"), &tok, now_ms, expired_before_ms)
                    .await
                    .expect("begin");
                (k, got)
            }));
        }
    }
    let mut claimed: HashMap<usize, usize> = HashMap::new();
    for t in tasks {
        let (k, got) = t.await.expect("join");
        match got {
            Begin::Claimed(_) => *claimed.entry(k).or_default() += 1,
            Begin::Running { heartbeat_ms } => assert_eq!(heartbeat_ms, now_ms, "key {k}"),
            other => panic!("key {k}: unexpected {other:?}"),
        }
    }
    claimed
}

/// The reason the ledger can live in PostgreSQL: replicas racing on one key never both
/// claim it, neither for a new key nor when re-claiming an expired entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_replicas_racing_on_one_key_claim_it_once() {
    let Some((a, b)) = two_replicas().await else {
        return;
    };
    let claimed = race_begin(&a, &b, "new", 1000, 0).await;
    assert_eq!(
        claimed.len(),
        RACE_KEYS,
        "every key was claimed: {claimed:?}"
    );
    assert!(claimed.values().all(|&n| n == 1), "{claimed:?}");

    // Every entry has expired: one racer per key replaces it, the rest see its claim.
    let claimed = race_begin(&a, &b, "expired", 5000, 2000).await;
    assert_eq!(
        claimed.len(),
        RACE_KEYS,
        "every key was re-claimed: {claimed:?}"
    );
    assert!(claimed.values().all(|&n| n == 1), "{claimed:?}");
}

async fn body(resp: Response) -> Vec<u8> {
    to_bytes(resp.into_body(), usize::MAX)
        .await
        .expect("body")
        .to_vec()
}

/// The whole protocol on two replicas: duplicates of one write, sent to both at once, run
/// the route exactly once per key, and everyone gets that one answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_replicas_run_each_route_once() {
    let Some((a, b)) = two_replicas().await else {
        return;
    };
    let timings = LedgerTimings {
        // Long enough that no duplicate gives up while the first attempt runs.
        in_progress_wait: Duration::from_secs(10),
        in_progress_poll: Duration::from_millis(10),
        ..LedgerTimings::default()
    };
    let config = Config {
        timings,
        ..Config::default()
    };
    let replica = |ledger: Arc<dyn Ledger>| {
        let store = Store::new(Db::open(":memory:").expect("db")).expect("store");
        App::with_ledger(&config, store, ledger)
    };
    let apps = [replica(a), replica(b)];
    let runs: Arc<Vec<AtomicUsize>> =
        Arc::new((0..RACE_KEYS).map(|_| AtomicUsize::new(0)).collect());
    let racers = RACE_KEYS * RACERS_PER_REPLICA * 2;
    let barrier = Arc::new(Barrier::new(racers));
    let mut tasks = Vec::new();
    for k in 0..RACE_KEYS {
        for r in 0..RACERS_PER_REPLICA * 2 {
            let app = apps[r % 2].clone();
            let (runs, barrier) = (runs.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                let s = scope("alice", &format!("route-{k:0>16}"));
                let f = idempotency::fingerprint("POST", "/api/notes", b"{}");
                barrier.wait().await;
                let route = async {
                    let n = runs[k].fetch_add(1, Ordering::SeqCst);
                    // Slow enough that the duplicates really overlap the first attempt.
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    let mut resp = Response::new(Body::from(format!("key {k} run {n}")));
                    *resp.status_mut() = axum::http::StatusCode::CREATED;
                    resp
                };
                let resp = idempotency::run(&app, s, f, route).await;
                let replayed = resp.headers().contains_key("idempotent-replayed");
                (k, resp.status().as_u16(), replayed, body(resp).await)
            }));
        }
    }
    let mut fresh = vec![0usize; RACE_KEYS];
    for t in tasks {
        let (k, status, replayed, body) = t.await.expect("join");
        assert_eq!(status, 201, "key {k}: {}", String::from_utf8_lossy(&body));
        assert_eq!(body, format!("key {k} run 0").into_bytes(), "key {k}");
        if !replayed {
            fresh[k] += 1;
        }
    }
    for (k, n) in runs.iter().enumerate() {
        assert_eq!(n.load(Ordering::SeqCst), 1, "key {k}: the route ran once");
        assert_eq!(fresh[k], 1, "key {k}: one first answer, the rest replays");
    }
}
