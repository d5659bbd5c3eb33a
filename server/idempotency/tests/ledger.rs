//! The `Ledger` contract, checked directly (no HTTP) on both backends, and the race that
//! sharing a ledger between server processes must survive.

mod support;

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use support::*;
use sw_outbox_idempotency::{
    Begin, ClaimRequest, ClaimToken, Fingerprint, Ledger, LedgerErrorKind, PgLedger, Scope,
    StoredAnswer,
};
use tokio::sync::Barrier;

// Every case runs twice, as `sqlite::<case>` and `postgres::<case>`.
on_both_ledgers!(
    claim_then_complete_then_replay,
    every_status_is_stored_with_its_headers_and_body,
    an_answer_stored_without_its_body,
    a_stale_claim_cannot_touch_the_claim_that_replaced_it,
    prune_len_and_clear,
    full_ledger_evicts_the_oldest_completed_entries,
    full_of_running_claims_refuses_new_keys,
    a_held_lock_makes_the_ledger_busy_within_the_lock_wait,
    an_old_table_is_upgraded_and_its_answers_replay,
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

const ROOMY: u64 = 1_000_000;

fn claim<'a>(
    s: &'a Scope,
    f: &'a Fingerprint,
    t: &'a ClaimToken,
    now_ms: i64,
    expired_before_ms: i64,
) -> ClaimRequest<'a> {
    ClaimRequest {
        scope: s,
        fingerprint: f,
        token: t,
        now_ms,
        expired_before_ms,
        max_rows: ROOMY,
    }
}

fn answer(status: u16, body: &[u8]) -> StoredAnswer {
    StoredAnswer {
        status,
        headers: vec![("content-type".into(), "application/json".into())],
        body: Some(body.to_vec()),
    }
}

async fn claim_then_complete_then_replay(backend: Backend) {
    let Some(l) = ledger_on(backend).await else {
        return;
    };
    let s = scope("alice", "k");
    let (t, t2) = (token("t1"), token("t2"));
    let a = fp(b"a");
    assert_eq!(
        l.begin(claim(&s, &a, &t, 1000, 0)).await.unwrap(),
        Begin::Claimed
    );
    assert_eq!(
        l.begin(claim(&s, &a, &t2, 1001, 0)).await.unwrap(),
        Begin::Running { heartbeat_ms: 1000 }
    );
    l.heartbeat(&s, &t, 1500).await.unwrap();
    assert_eq!(
        l.begin(claim(&s, &a, &t2, 1501, 0)).await.unwrap(),
        Begin::Running { heartbeat_ms: 1500 }
    );
    // A stranger's heartbeat does not keep the claim alive.
    l.heartbeat(&s, &t2, 1600).await.unwrap();
    assert_eq!(
        l.begin(claim(&s, &a, &t2, 1601, 0)).await.unwrap(),
        Begin::Running { heartbeat_ms: 1500 }
    );
    // Body, method and path are each part of the fingerprint.
    assert_eq!(
        l.begin(claim(&s, &fp(b"b"), &t2, 1602, 0)).await.unwrap(),
        Begin::Reused
    );
    let mut other_path = fp(b"a");
    other_path.path = "/api/notes?x=1".into();
    assert_eq!(
        l.begin(claim(&s, &other_path, &t2, 1602, 0)).await.unwrap(),
        Begin::Reused
    );
    let mut other_method = fp(b"a");
    other_method.method = "PUT".into();
    assert_eq!(
        l.begin(claim(&s, &other_method, &t2, 1602, 0))
            .await
            .unwrap(),
        Begin::Reused
    );
    let ans = StoredAnswer {
        status: 201,
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("location".into(), "/api/notes/1".into()),
        ],
        body: Some(b"{}".to_vec()),
    };
    // A stranger's token cannot complete the claim.
    l.complete(&s, &t2, &ans).await.unwrap();
    assert!(matches!(
        l.begin(claim(&s, &a, &t2, 1603, 0)).await.unwrap(),
        Begin::Running { .. }
    ));
    l.complete(&s, &t, &ans).await.unwrap();
    assert_eq!(
        l.begin(claim(&s, &a, &t2, 1604, 0)).await.unwrap(),
        Begin::Completed(ans.clone())
    );
    // Completed is final: neither a second completion nor a heartbeat changes it.
    l.complete(&s, &t, &answer(500, b"")).await.unwrap();
    l.heartbeat(&s, &t, 1700).await.unwrap();
    assert_eq!(
        l.begin(claim(&s, &a, &t2, 1701, 0)).await.unwrap(),
        Begin::Completed(ans)
    );
    // Another account's identical key is a different entry.
    let bob = scope("bob", &s.key);
    assert_eq!(
        l.begin(claim(&bob, &a, &t2, 1705, 0)).await.unwrap(),
        Begin::Claimed
    );
    // Expired: claimable again, even by a different request; pruning removes old rows.
    let t3 = token("t3");
    assert_eq!(
        l.begin(claim(&s, &fp(b"z"), &t3, 9000, 5000))
            .await
            .unwrap(),
        Begin::Claimed
    );
    assert_eq!(
        l.prune(9000).await.unwrap(),
        1,
        "bob's entry (1705) is pruned"
    );
}

async fn every_status_is_stored_with_its_headers_and_body(backend: Backend) {
    let Some(l) = ledger_on(backend).await else {
        return;
    };
    let h = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    };
    let json = ("content-type", "application/json");
    let answers = [
        (200, h(&[json]), br#"{"ok":true}"#.to_vec()),
        (
            201,
            h(&[json, ("location", "/api/projects/p1/tasks/7")]),
            b"{}".to_vec(),
        ),
        (204, h(&[]), Vec::new()),
        (
            200,
            h(&[
                ("content-type", "text/csv"),
                ("content-disposition", "attachment; filename=\"r.csv\""),
            ]),
            b"a,b\n".to_vec(),
        ),
        (400, h(&[json]), br#"{"detail":"invalid_body"}"#.to_vec()),
        (409, h(&[json]), br#"{"detail":"conflict"}"#.to_vec()),
        (
            412,
            h(&[json]),
            br#"{"detail":"precondition_failed"}"#.to_vec(),
        ),
        (500, h(&[json]), br#"{"detail":"storage_error"}"#.to_vec()),
        (
            503,
            h(&[("content-type", "text/plain"), ("retry-after", "7")]),
            b"down".to_vec(),
        ),
        // The largest body the layer stores by default, every byte value included.
        (
            200,
            h(&[("content-type", "application/octet-stream")]),
            (0..1024 * 1024).map(|i| (i % 251) as u8).collect(),
        ),
    ];
    for (i, (status, headers, body)) in answers.into_iter().enumerate() {
        let s = scope("alice", &format!("status-{i}"));
        let t = token(&format!("t{i}"));
        let ans = StoredAnswer {
            status,
            headers,
            body: Some(body),
        };
        let x = fp(b"x");
        assert_eq!(
            l.begin(claim(&s, &x, &t, 1000, 0)).await.unwrap(),
            Begin::Claimed
        );
        l.complete(&s, &t, &ans).await.unwrap();
        assert_eq!(
            l.begin(claim(&s, &x, &token("again"), 1001, 0))
                .await
                .unwrap(),
            Begin::Completed(ans),
            "status {status}"
        );
    }
}

/// Status only: `None` is kept apart from an empty body.
async fn an_answer_stored_without_its_body(backend: Backend) {
    let Some(l) = ledger_on(backend).await else {
        return;
    };
    let x = fp(b"x");
    for (key, body) in [("none", None), ("empty", Some(Vec::new()))] {
        let s = scope("alice", key);
        let t = token(key);
        let ans = StoredAnswer {
            status: 200,
            headers: vec![],
            body,
        };
        assert_eq!(
            l.begin(claim(&s, &x, &t, 1000, 0)).await.unwrap(),
            Begin::Claimed
        );
        l.complete(&s, &t, &ans).await.unwrap();
        assert_eq!(
            l.begin(claim(&s, &x, &token("probe"), 1001, 0))
                .await
                .unwrap(),
            Begin::Completed(ans)
        );
    }
}

/// A claim that expired and was claimed again belongs to its new owner: the first request,
/// if it is somehow still running, can neither complete nor heartbeat it.
async fn a_stale_claim_cannot_touch_the_claim_that_replaced_it(backend: Backend) {
    let Some(l) = ledger_on(backend).await else {
        return;
    };
    let s = scope("alice", "replaced");
    let (old, new) = (token("old"), token("new"));
    let a = fp(b"a");
    assert_eq!(
        l.begin(claim(&s, &a, &old, 1000, 0)).await.unwrap(),
        Begin::Claimed
    );
    assert_eq!(
        l.begin(claim(&s, &a, &new, 5000, 2000)).await.unwrap(),
        Begin::Claimed
    );
    l.complete(&s, &old, &answer(201, b"stale")).await.unwrap();
    l.heartbeat(&s, &old, 6000).await.unwrap();
    assert_eq!(
        l.begin(claim(&s, &a, &token("probe"), 6001, 2000))
            .await
            .unwrap(),
        Begin::Running { heartbeat_ms: 5000 }
    );
    let fresh = answer(200, b"fresh");
    l.complete(&s, &new, &fresh).await.unwrap();
    assert_eq!(
        l.begin(claim(&s, &a, &token("probe"), 6002, 2000))
            .await
            .unwrap(),
        Begin::Completed(fresh)
    );
    // Expired again: the stored answer goes with it.
    assert_eq!(
        l.begin(claim(&s, &fp(b"other"), &token("newest"), 9000, 8000))
            .await
            .unwrap(),
        Begin::Claimed
    );
}

async fn prune_len_and_clear(backend: Backend) {
    let Some(l) = ledger_on(backend).await else {
        return;
    };
    let p = fp(b"p");
    for (i, created) in [100, 200, 300, 400].into_iter().enumerate() {
        let s = scope("alice", &format!("prune-{i}"));
        let t = token(&format!("p{i}"));
        assert_eq!(
            l.begin(claim(&s, &p, &t, created, 0)).await.unwrap(),
            Begin::Claimed
        );
    }
    assert_eq!(l.entries().await.unwrap(), 4);
    assert_eq!(l.prune(100).await.unwrap(), 0, "strictly older only");
    assert_eq!(l.prune(300).await.unwrap(), 2);
    assert_eq!(l.prune(300).await.unwrap(), 0);
    assert_eq!(l.entries().await.unwrap(), 2);
    let survivor = scope("alice", "prune-3");
    assert_eq!(
        l.begin(claim(&survivor, &p, &token("x"), 500, 0))
            .await
            .unwrap(),
        Begin::Running { heartbeat_ms: 400 }
    );
    l.clear().await.unwrap();
    assert_eq!(l.entries().await.unwrap(), 0, "clear left nothing");
    assert_eq!(
        l.begin(claim(&survivor, &fp(b"q"), &token("after"), 600, 0))
            .await
            .unwrap(),
        Begin::Claimed
    );
}

fn bounded<'a>(
    s: &'a Scope,
    f: &'a Fingerprint,
    t: &'a ClaimToken,
    now_ms: i64,
    max_rows: u64,
) -> ClaimRequest<'a> {
    ClaimRequest {
        max_rows,
        ..claim(s, f, t, now_ms, 0)
    }
}

async fn full_ledger_evicts_the_oldest_completed_entries(backend: Backend) {
    let Some(l) = ledger_on(backend).await else {
        return;
    };
    let x = fp(b"x");
    // Three entries: k0 (completed, oldest), k1 (running), k2 (completed).
    for i in 0..3 {
        let s = scope("alice", &format!("k{i}"));
        let t = token(&format!("t{i}"));
        assert_eq!(
            l.begin(bounded(&s, &x, &t, 1000 + i, 3)).await.unwrap(),
            Begin::Claimed
        );
        if i != 1 {
            l.complete(&s, &t, &answer(201, b"{}")).await.unwrap();
        }
    }
    // A fourth key: the oldest completed entry (k0) makes room, the running k1 stays.
    let k3 = scope("alice", "k3");
    assert_eq!(
        l.begin(bounded(&k3, &x, &token("t3"), 2000, 3))
            .await
            .unwrap(),
        Begin::Claimed
    );
    assert_eq!(l.entries().await.unwrap(), 3);
    assert_eq!(
        l.begin(bounded(&scope("alice", "k1"), &x, &token("p"), 2001, 3))
            .await
            .unwrap(),
        Begin::Running { heartbeat_ms: 1001 }
    );
    assert!(matches!(
        l.begin(bounded(&scope("alice", "k2"), &x, &token("p"), 2002, 3))
            .await
            .unwrap(),
        Begin::Completed(_)
    ));
    // k0 was forgotten: it is claimed afresh (evicting k2, now the oldest completed one).
    assert_eq!(
        l.begin(bounded(&scope("alice", "k0"), &x, &token("again"), 2003, 3))
            .await
            .unwrap(),
        Begin::Claimed
    );
    assert_eq!(l.entries().await.unwrap(), 3);
}

async fn full_of_running_claims_refuses_new_keys(backend: Backend) {
    let Some(l) = ledger_on(backend).await else {
        return;
    };
    let x = fp(b"x");
    for i in 0..2 {
        let s = scope("alice", &format!("r{i}"));
        assert_eq!(
            l.begin(bounded(&s, &x, &token(&format!("t{i}")), 1000, 2))
                .await
                .unwrap(),
            Begin::Claimed
        );
    }
    let extra = scope("alice", "r2");
    assert_eq!(
        l.begin(bounded(&extra, &x, &token("t2"), 1001, 2))
            .await
            .unwrap(),
        Begin::Full
    );
    assert_eq!(l.entries().await.unwrap(), 2, "nothing was inserted");
    // Known keys are still read while full.
    assert_eq!(
        l.begin(bounded(&scope("alice", "r0"), &x, &token("p"), 1002, 2))
            .await
            .unwrap(),
        Begin::Running { heartbeat_ms: 1000 }
    );
    // Once one completes, it can make room.
    l.complete(&scope("alice", "r1"), &token("t1"), &answer(200, b""))
        .await
        .unwrap();
    assert_eq!(
        l.begin(bounded(&extra, &x, &token("t2"), 1003, 2))
            .await
            .unwrap(),
        Begin::Claimed
    );
}

/// Another connection holds the table; a claim gives up as busy after the lock wait instead
/// of queueing for as long as the holder likes.
async fn a_held_lock_makes_the_ledger_busy_within_the_lock_wait(backend: Backend) {
    let Some((l, place)) = ledger_with(backend, Duration::from_millis(200)).await else {
        return;
    };
    let s = scope("alice", "busy");
    let x = fp(b"x");
    let release = match &place {
        Place::Sqlite(file) => {
            let conn = rusqlite::Connection::open(&file.0).expect("second connection");
            conn.execute_batch("BEGIN IMMEDIATE")
                .expect("hold the write lock");
            Holder::Sqlite(conn)
        }
        Place::Postgres(url) => {
            let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                .await
                .expect("second connection");
            let task = tokio::spawn(conn);
            client
                .batch_execute("BEGIN; LOCK TABLE idempotency IN ACCESS EXCLUSIVE MODE")
                .await
                .expect("hold the table lock");
            Holder::Postgres(client, task)
        }
    };
    let err = l
        .begin(claim(&s, &x, &token("t"), 1000, 0))
        .await
        .expect_err("busy while the other connection holds the lock");
    assert_eq!(err.kind, LedgerErrorKind::Busy, "{err}");
    drop(release);
    // Released: the same claim goes through.
    let mut claimed = None;
    for _ in 0..50 {
        match l.begin(claim(&s, &x, &token("t"), 1000, 0)).await {
            Ok(b) => {
                claimed = Some(b);
                break;
            }
            Err(e) if e.is_busy() => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(claimed, Some(Begin::Claimed));
}

#[allow(dead_code)] // held for its Drop
enum Holder {
    Sqlite(rusqlite::Connection),
    Postgres(
        tokio_postgres::Client,
        tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
    ),
}

/// A table of the earlier layout (`content_type` and `location` columns, no header list)
/// keeps its stored answers when a ledger of this version opens it.
async fn an_old_table_is_upgraded_and_its_answers_replay(backend: Backend) {
    let x = fp(b"x");
    let old_schema = |blob: &str, int: &str| {
        format!(
            "CREATE TABLE idempotency (
                account TEXT NOT NULL, idem_key TEXT NOT NULL, method TEXT NOT NULL,
                path TEXT NOT NULL, body_sha256 {blob} NOT NULL, claim_token TEXT NOT NULL,
                state TEXT NOT NULL, created_ms {int} NOT NULL, heartbeat_ms {int} NOT NULL,
                status INTEGER, content_type TEXT, location TEXT, body {blob},
                PRIMARY KEY (account, idem_key))"
        )
    };
    let file = TempDb::new("old");
    let l: Arc<dyn Ledger> = match backend {
        Backend::Sqlite => {
            let conn = rusqlite::Connection::open(&file.0).expect("open");
            conn.execute_batch(&old_schema("BLOB", "INTEGER"))
                .expect("old schema");
            conn.execute(
                "INSERT INTO idempotency VALUES ('alice', 'old', 'POST', '/api/notes', ?1, 't',
                 'completed', 1000, 1000, 201, 'application/json', '/api/notes/9', X'7B7D')",
                [x.body_sha256.as_slice()],
            )
            .expect("old row");
            drop(conn);
            Arc::new(sw_outbox_idempotency::SqliteLedger::open(&file.path()).expect("upgrade"))
        }
        Backend::Postgres => {
            let Some(server) = pg::server() else {
                return;
            };
            let url = server.fresh_database().await;
            let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("connect");
            let task = tokio::spawn(conn);
            client
                .batch_execute(&old_schema("BYTEA", "BIGINT"))
                .await
                .expect("old schema");
            let sha = x.body_sha256.as_slice();
            client
                .execute(
                    "INSERT INTO idempotency VALUES ('alice', 'old', 'POST', '/api/notes', $1,
                     't', 'completed', 1000, 1000, 201, 'application/json', '/api/notes/9',
                     '\\x7b7d')",
                    &[&sha],
                )
                .await
                .expect("old row");
            drop(client);
            let _ = task.await;
            Arc::new(PgLedger::connect(&url).await.expect("upgrade"))
        }
    };
    let s = scope("alice", "old");
    assert_eq!(
        l.begin(claim(&s, &x, &token("probe"), 2000, 0))
            .await
            .unwrap(),
        Begin::Completed(StoredAnswer {
            status: 201,
            headers: vec![
                ("content-type".into(), "application/json".into()),
                ("location".into(), "/api/notes/9".into()),
            ],
            body: Some(b"{}".to_vec()),
        })
    );
    // And new entries work in the upgraded table.
    let n = scope("alice", "new");
    let t = token("n");
    assert_eq!(
        l.begin(claim(&n, &x, &t, 2000, 0)).await.unwrap(),
        Begin::Claimed
    );
    let ans = StoredAnswer {
        status: 503,
        headers: vec![("retry-after".into(), "3".into())],
        body: None,
    };
    l.complete(&n, &t, &ans).await.unwrap();
    assert_eq!(
        l.begin(claim(&n, &x, &token("p"), 2001, 0)).await.unwrap(),
        Begin::Completed(ans)
    );
}

const RACE_KEYS: usize = 40;
/// Concurrent attempts per key on each replica.
const RACERS_PER_REPLICA: usize = 4;

/// Two replicas (two `PgLedger`s, two connection pools) on one database.
pub async fn two_replicas() -> Option<(Arc<dyn Ledger>, Arc<dyn Ledger>)> {
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
                let s = scope("alice", &format!("race-{k}"));
                let f = fp(b"race");
                barrier.wait().await;
                let got = ledger
                    .begin(claim(&s, &f, &tok, now_ms, expired_before_ms))
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
            Begin::Claimed => *claimed.entry(k).or_default() += 1,
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
