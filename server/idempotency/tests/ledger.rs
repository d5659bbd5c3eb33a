//! The `Ledger` contract, checked directly (no HTTP) on both backends, and the race that
//! sharing a ledger between server processes must survive.
//!
//! Ages and windows are the ledger's own clock, so the cases pass durations: a window of an
//! hour for "not expired", one shorter than a sleep for "expired" (never a wall-clock
//! bound on how fast anything runs).

mod support;

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use support::*;
use sw_outbox_idempotency::{
    Begin, ClaimRequest, ClaimToken, Fingerprint, Ledger, LedgerErrorKind, PgLedger, Scope,
    StoredAnswer, TableName,
};
use tokio::sync::Barrier;
use tokio::time::sleep;

// Every case runs twice, as `sqlite::<case>` and `postgres::<case>`.
on_both_ledgers!(
    claim_then_complete_then_replay,
    every_status_is_stored_with_its_headers_and_body,
    an_answer_stored_without_its_body,
    a_stale_claim_cannot_touch_the_claim_that_replaced_it,
    a_live_claim_outlives_its_key_window,
    the_key_window_counts_from_the_completion,
    prune_entries_and_clear,
    a_full_ledger_refuses_new_keys_and_forgets_nothing,
    expired_entries_make_room_in_a_full_ledger,
    one_account_at_its_bound_does_not_hold_back_another,
    a_held_lock_makes_the_ledger_busy_within_the_lock_wait,
    an_old_table_is_upgraded_and_its_answers_replay,
);

const HOUR: Duration = Duration::from_secs(3600);
const ROOMY: u64 = 1_000_000;

fn fp(body: &[u8]) -> Fingerprint {
    Fingerprint::new("POST", "/api/notes", Sha256::digest(body).into())
}

fn scope(account: &str, key: &str) -> Scope {
    Scope::new(account, key)
}

fn token(t: &str) -> ClaimToken {
    ClaimToken(t.into())
}

/// A claim of `s` with `f` by `t` under a key window of `ttl`.
fn claim(s: &Scope, f: &Fingerprint, t: &ClaimToken, ttl: Duration) -> ClaimRequest {
    ClaimRequest::new(s.clone(), f.clone(), t.clone())
        .with_key_ttl(ttl)
        .with_max_rows(ROOMY, None)
}

fn answer(status: u16, body: &[u8]) -> StoredAnswer {
    StoredAnswer::new(
        status,
        vec![("content-type".into(), "application/json".into())],
        body.to_vec(),
    )
}

fn since_heartbeat(b: &Begin) -> Duration {
    match b {
        Begin::Running { since_heartbeat } => *since_heartbeat,
        other => panic!("expected running, got {other:?}"),
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
        l.begin(&claim(&s, &a, &t, HOUR)).await.unwrap(),
        Begin::Claimed
    );
    let young = since_heartbeat(&l.begin(&claim(&s, &a, &t2, HOUR)).await.unwrap());
    assert!(young < Duration::from_secs(60), "{young:?}");
    // A stranger's heartbeat does not keep the claim alive; the owner's does.
    sleep(Duration::from_millis(300)).await;
    l.heartbeat(&s, &t2).await.unwrap();
    let aged = since_heartbeat(&l.begin(&claim(&s, &a, &t2, HOUR)).await.unwrap());
    assert!(aged >= Duration::from_millis(300), "{aged:?}");
    l.heartbeat(&s, &t).await.unwrap();
    let fresh = since_heartbeat(&l.begin(&claim(&s, &a, &t2, HOUR)).await.unwrap());
    assert!(
        fresh < aged,
        "the heartbeat refreshed it: {fresh:?} < {aged:?}"
    );
    // Body, method and path are each part of the fingerprint.
    assert_eq!(
        l.begin(&claim(&s, &fp(b"b"), &t2, HOUR)).await.unwrap(),
        Begin::Reused
    );
    let mut other_path = fp(b"a");
    other_path.path = "/api/notes?x=1".into();
    assert_eq!(
        l.begin(&claim(&s, &other_path, &t2, HOUR)).await.unwrap(),
        Begin::Reused
    );
    let mut other_method = fp(b"a");
    other_method.method = "PUT".into();
    assert_eq!(
        l.begin(&claim(&s, &other_method, &t2, HOUR)).await.unwrap(),
        Begin::Reused
    );
    let ans = StoredAnswer::new(
        201,
        vec![
            ("content-type".into(), "application/json".into()),
            ("location".into(), "/api/notes/1".into()),
        ],
        b"{}".to_vec(),
    );
    // A stranger's token cannot complete the claim.
    l.complete(&s, &t2, &ans).await.unwrap();
    assert!(matches!(
        l.begin(&claim(&s, &a, &t2, HOUR)).await.unwrap(),
        Begin::Running { .. }
    ));
    l.complete(&s, &t, &ans).await.unwrap();
    assert_eq!(
        l.begin(&claim(&s, &a, &t2, HOUR)).await.unwrap(),
        Begin::Completed(ans.clone())
    );
    // Completed is final: neither a second completion nor a heartbeat changes it.
    l.complete(&s, &t, &answer(500, b"")).await.unwrap();
    l.heartbeat(&s, &t).await.unwrap();
    assert_eq!(
        l.begin(&claim(&s, &a, &t2, HOUR)).await.unwrap(),
        Begin::Completed(ans)
    );
    // Another account's identical key is a different entry.
    let bob = scope("bob", &s.key);
    assert_eq!(
        l.begin(&claim(&bob, &a, &t2, HOUR)).await.unwrap(),
        Begin::Claimed
    );
    // Expired: claimable again, even by a different request; pruning removes old rows.
    sleep(Duration::from_millis(1200)).await;
    let short = Duration::from_millis(1000);
    assert_eq!(
        l.begin(&claim(&s, &fp(b"z"), &token("t3"), short))
            .await
            .unwrap(),
        Begin::Claimed
    );
    assert_eq!(l.prune(short).await.unwrap(), 1, "bob's entry is pruned");
    assert_eq!(l.entries().await.unwrap(), 1);
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
        let ans = StoredAnswer::new(status, headers, body);
        let x = fp(b"x");
        assert_eq!(
            l.begin(&claim(&s, &x, &t, HOUR)).await.unwrap(),
            Begin::Claimed
        );
        l.complete(&s, &t, &ans).await.unwrap();
        assert_eq!(
            l.begin(&claim(&s, &x, &token("again"), HOUR))
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
    for (key, ans) in [
        ("none", StoredAnswer::status_only(200, vec![])),
        ("empty", StoredAnswer::new(200, vec![], Vec::new())),
    ] {
        let s = scope("alice", key);
        let t = token(key);
        assert_eq!(
            l.begin(&claim(&s, &x, &t, HOUR)).await.unwrap(),
            Begin::Claimed
        );
        l.complete(&s, &t, &ans).await.unwrap();
        assert_eq!(
            l.begin(&claim(&s, &x, &token("probe"), HOUR))
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
        l.begin(&claim(&s, &a, &old, HOUR)).await.unwrap(),
        Begin::Claimed
    );
    sleep(Duration::from_millis(100)).await;
    assert_eq!(
        l.begin(&claim(&s, &a, &new, Duration::from_millis(50)))
            .await
            .unwrap(),
        Begin::Claimed
    );
    l.complete(&s, &old, &answer(201, b"stale")).await.unwrap();
    l.heartbeat(&s, &old).await.unwrap();
    assert!(matches!(
        l.begin(&claim(&s, &a, &token("probe"), HOUR))
            .await
            .unwrap(),
        Begin::Running { .. }
    ));
    let fresh = answer(200, b"fresh");
    l.complete(&s, &new, &fresh).await.unwrap();
    assert_eq!(
        l.begin(&claim(&s, &a, &token("probe"), HOUR))
            .await
            .unwrap(),
        Begin::Completed(fresh)
    );
}

/// Expiry never replaces a live claim: a request that runs (and heartbeats) for longer than
/// the key window keeps its key. Only once it stops heartbeating for a whole window does
/// the key apply again.
async fn a_live_claim_outlives_its_key_window(backend: Backend) {
    let Some(l) = ledger_on(backend).await else {
        return;
    };
    let window = Duration::from_millis(1000);
    let s = scope("alice", "long-running");
    let (t, probe) = (token("runner"), token("probe"));
    let a = fp(b"a");
    assert_eq!(
        l.begin(&claim(&s, &a, &t, window)).await.unwrap(),
        Begin::Claimed
    );
    // Twice the window, heartbeating well within it.
    for _ in 0..10 {
        sleep(Duration::from_millis(200)).await;
        l.heartbeat(&s, &t).await.unwrap();
    }
    assert!(
        matches!(
            l.begin(&claim(&s, &a, &probe, window)).await.unwrap(),
            Begin::Running { .. }
        ),
        "claimed 2 s ago under a 1 s window, but alive: not replaced"
    );
    assert_eq!(
        l.begin(&claim(&s, &fp(b"other"), &probe, window))
            .await
            .unwrap(),
        Begin::Reused,
        "and its key is not free for another request either"
    );
    // Dead for a whole window: expired.
    sleep(window + Duration::from_millis(100)).await;
    assert_eq!(
        l.begin(&claim(&s, &a, &probe, window)).await.unwrap(),
        Begin::Claimed
    );
}

/// A write that took long keeps its answer a whole window after it completed.
async fn the_key_window_counts_from_the_completion(backend: Backend) {
    let Some(l) = ledger_on(backend).await else {
        return;
    };
    let window = Duration::from_millis(1000);
    let s = scope("alice", "slow-write");
    let t = token("t");
    let a = fp(b"a");
    assert_eq!(
        l.begin(&claim(&s, &a, &t, window)).await.unwrap(),
        Begin::Claimed
    );
    sleep(Duration::from_millis(700)).await;
    l.heartbeat(&s, &t).await.unwrap();
    sleep(Duration::from_millis(700)).await;
    let ans = answer(201, b"{}");
    l.complete(&s, &t, &ans).await.unwrap();
    assert_eq!(
        l.begin(&claim(&s, &a, &token("retry"), window))
            .await
            .unwrap(),
        Begin::Completed(ans),
        "claimed 1.4 s ago, completed just now: replayed"
    );
}

async fn prune_entries_and_clear(backend: Backend) {
    let Some(l) = ledger_on(backend).await else {
        return;
    };
    let p = fp(b"p");
    let add = |i: usize| {
        let l = l.clone();
        let p = p.clone();
        async move {
            let s = scope("alice", &format!("prune-{i}"));
            let r = l
                .begin(&claim(&s, &p, &token(&format!("p{i}")), HOUR))
                .await;
            assert_eq!(r.unwrap(), Begin::Claimed);
        }
    };
    add(0).await;
    add(1).await;
    sleep(Duration::from_millis(1500)).await;
    add(2).await;
    add(3).await;
    assert_eq!(l.entries().await.unwrap(), 4);
    assert_eq!(l.prune(HOUR).await.unwrap(), 0, "nothing is an hour old");
    assert_eq!(l.prune(Duration::from_millis(1000)).await.unwrap(), 2);
    assert_eq!(l.prune(Duration::from_millis(1000)).await.unwrap(), 0);
    assert_eq!(l.entries().await.unwrap(), 2);
    let survivor = scope("alice", "prune-3");
    assert!(matches!(
        l.begin(&claim(&survivor, &p, &token("x"), HOUR))
            .await
            .unwrap(),
        Begin::Running { .. }
    ));
    l.clear().await.unwrap();
    assert_eq!(l.entries().await.unwrap(), 0, "clear left nothing");
    assert_eq!(
        l.begin(&claim(&survivor, &fp(b"q"), &token("after"), HOUR))
            .await
            .unwrap(),
        Begin::Claimed
    );
}

fn bounded(s: &Scope, f: &Fingerprint, t: &ClaimToken, ttl: Duration, max: u64) -> ClaimRequest {
    claim(s, f, t, ttl).with_max_rows(max, None)
}

/// The ledger at its bound: a new key is refused (nothing written, nothing forgotten),
/// with a retry time of when the oldest entry expires; every entry it holds still answers
/// as before, completed or running.
async fn a_full_ledger_refuses_new_keys_and_forgets_nothing(backend: Backend) {
    let Some(l) = ledger_on(backend).await else {
        return;
    };
    let x = fp(b"x");
    // Three entries: k0 (completed, oldest), k1 (running), k2 (completed).
    for i in 0..3 {
        let s = scope("alice", &format!("k{i}"));
        let t = token(&format!("t{i}"));
        assert_eq!(
            l.begin(&bounded(&s, &x, &t, HOUR, 3)).await.unwrap(),
            Begin::Claimed
        );
        if i != 1 {
            l.complete(&s, &t, &answer(201, b"{}")).await.unwrap();
        }
    }
    for who in ["alice", "bob"] {
        match l
            .begin(&bounded(&scope(who, "k3"), &x, &token("t3"), HOUR, 3))
            .await
            .unwrap()
        {
            Begin::Full { retry_after } => assert!(
                retry_after <= HOUR && retry_after > HOUR - Duration::from_secs(600),
                "the oldest expires in about an hour: {retry_after:?}"
            ),
            other => panic!("{who}: expected full, got {other:?}"),
        }
    }
    assert_eq!(
        l.entries().await.unwrap(),
        3,
        "nothing was inserted or evicted"
    );
    // Every key inside its window is still known.
    for (i, want_running) in [(0, false), (1, true), (2, false)] {
        let got = l
            .begin(&bounded(
                &scope("alice", &format!("k{i}")),
                &x,
                &token("p"),
                HOUR,
                3,
            ))
            .await
            .unwrap();
        assert_eq!(
            matches!(got, Begin::Running { .. }),
            want_running,
            "k{i}: {got:?}"
        );
        assert_eq!(
            matches!(got, Begin::Completed(_)),
            !want_running,
            "k{i}: {got:?}"
        );
    }
}

/// Entries past their window are forgotten already: in a full ledger they make room.
async fn expired_entries_make_room_in_a_full_ledger(backend: Backend) {
    let Some(l) = ledger_on(backend).await else {
        return;
    };
    let x = fp(b"x");
    for i in 0..2 {
        let s = scope("alice", &format!("old{i}"));
        let t = token(&format!("t{i}"));
        assert_eq!(
            l.begin(&bounded(&s, &x, &t, HOUR, 2)).await.unwrap(),
            Begin::Claimed
        );
        l.complete(&s, &t, &answer(200, b"")).await.unwrap();
    }
    sleep(Duration::from_millis(300)).await;
    let short = Duration::from_millis(100);
    assert_eq!(
        l.begin(&bounded(&scope("alice", "new"), &x, &token("n"), short, 2))
            .await
            .unwrap(),
        Begin::Claimed
    );
    assert!(l.entries().await.unwrap() <= 2);
}

/// With a per-account bound, the account at it is refused new keys while another account
/// still claims.
async fn one_account_at_its_bound_does_not_hold_back_another(backend: Backend) {
    let Some(l) = ledger_on(backend).await else {
        return;
    };
    let x = fp(b"x");
    let per = |s: &Scope, t: &str| claim(s, &x, &token(t), HOUR).with_max_rows(10, Some(2));
    for k in ["a0", "a1"] {
        assert_eq!(
            l.begin(&per(&scope("alice", k), k)).await.unwrap(),
            Begin::Claimed
        );
    }
    assert!(matches!(
        l.begin(&per(&scope("alice", "a2"), "a2")).await.unwrap(),
        Begin::Full { .. }
    ));
    assert_eq!(
        l.begin(&per(&scope("bob", "b0"), "b0")).await.unwrap(),
        Begin::Claimed
    );
    assert!(
        matches!(
            l.begin(&per(&scope("alice", "a0"), "again")).await.unwrap(),
            Begin::Running { .. }
        ),
        "alice's own keys are still answered"
    );
    assert_eq!(l.entries().await.unwrap(), 3);
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
        .begin(&claim(&s, &x, &token("t"), HOUR))
        .await
        .expect_err("busy while the other connection holds the lock");
    assert_eq!(err.kind(), LedgerErrorKind::Busy, "{err}");
    drop(release);
    // Released: the same claim goes through.
    let mut claimed = None;
    for _ in 0..50 {
        match l.begin(&claim(&s, &x, &token("t"), HOUR)).await {
            Ok(b) => {
                claimed = Some(b);
                break;
            }
            Err(e) if e.is_busy() => sleep(Duration::from_millis(50)).await,
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

/// A table of the first layout (`content_type` and `location` columns, no header list)
/// keeps its stored answers when a ledger of this version opens (migrates) it.
async fn an_old_table_is_upgraded_and_its_answers_replay(backend: Backend) {
    let x = fp(b"x");
    let old_schema = |blob: &str, int: &str| {
        format!(
            "CREATE TABLE idempotency (
                account TEXT NOT NULL, idem_key TEXT NOT NULL, method TEXT NOT NULL,
                path TEXT NOT NULL, body_sha256 {blob} NOT NULL, claim_token TEXT NOT NULL,
                state TEXT NOT NULL, created_ms {int} NOT NULL, heartbeat_ms {int} NOT NULL,
                status INTEGER, content_type TEXT, location TEXT, body {blob},
                PRIMARY KEY (account, idem_key));
             CREATE INDEX idempotency_created ON idempotency (created_ms)"
        )
    };
    let file = TempDb::new("old");
    let l: TestLedger = match backend {
        Backend::Sqlite => {
            let conn = rusqlite::Connection::open(&file.0).expect("open");
            conn.execute_batch(&old_schema("BLOB", "INTEGER"))
                .expect("old schema");
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_millis() as i64;
            conn.execute(
                "INSERT INTO idempotency VALUES ('alice', 'old', 'POST', '/api/notes', ?1, 't',
                 'completed', ?2, ?2, 201, 'application/json', '/api/notes/9', X'7B7D')",
                rusqlite::params![x.body_sha256.as_slice(), now_ms],
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
                     't', 'completed', (extract(epoch from now()) * 1000)::bigint,
                     (extract(epoch from now()) * 1000)::bigint, 201, 'application/json',
                     '/api/notes/9', '\\x7b7d')",
                    &[&sha],
                )
                .await
                .expect("old row");
            drop(client);
            let _ = task.await;
            Arc::new(pg_ledger(&url, sw_outbox_idempotency::DEFAULT_LOCK_WAIT).await)
        }
    };
    let s = scope("alice", "old");
    assert_eq!(
        l.begin(&claim(&s, &x, &token("probe"), HOUR))
            .await
            .unwrap(),
        Begin::Completed(StoredAnswer::new(
            201,
            vec![
                ("content-type".into(), "application/json".into()),
                ("location".into(), "/api/notes/9".into()),
            ],
            b"{}".to_vec(),
        ))
    );
    // And new entries work in the upgraded table.
    let n = scope("alice", "new");
    let t = token("n");
    assert_eq!(
        l.begin(&claim(&n, &x, &t, HOUR)).await.unwrap(),
        Begin::Claimed
    );
    let ans = StoredAnswer::status_only(503, vec![("retry-after".into(), "3".into())]);
    l.complete(&n, &t, &ans).await.unwrap();
    assert_eq!(
        l.begin(&claim(&n, &x, &token("p"), HOUR)).await.unwrap(),
        Begin::Completed(ans)
    );
}

const RACE_KEYS: usize = 40;
/// Concurrent attempts per key on each replica.
const RACERS_PER_REPLICA: usize = 4;

/// Two replicas (two `PgLedger`s on two pools) on one database, and its URL.
async fn two_replicas() -> Option<(Arc<dyn Ledger>, Arc<dyn Ledger>, String)> {
    let url = pg::server()?.fresh_database().await;
    let a = pg_ledger(&url, sw_outbox_idempotency::DEFAULT_LOCK_WAIT).await;
    let b = pg_ledger(&url, sw_outbox_idempotency::DEFAULT_LOCK_WAIT).await;
    Some((Arc::new(a), Arc::new(b), url))
}

/// Every racer calls `begin` on one of the two replicas at the same moment; returns how
/// many got `Claimed` per key, and checks everyone else read a claim instead.
async fn race_begin(
    a: &Arc<dyn Ledger>,
    b: &Arc<dyn Ledger>,
    round: &str,
    ttl: Duration,
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
                let c = claim(
                    &scope("alice", &format!("race-{k}")),
                    &fp(b"race"),
                    &tok,
                    ttl,
                );
                barrier.wait().await;
                (k, ledger.begin(&c).await.expect("begin"))
            }));
        }
    }
    let mut claimed: HashMap<usize, usize> = HashMap::new();
    for t in tasks {
        let (k, got) = t.await.expect("join");
        match got {
            Begin::Claimed => *claimed.entry(k).or_default() += 1,
            Begin::Running { .. } => {}
            other => panic!("key {k}: unexpected {other:?}"),
        }
    }
    claimed
}

/// The reason the ledger can live in PostgreSQL: replicas racing on one key never both
/// claim it, neither for a new key nor when re-claiming an expired entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_replicas_racing_on_one_key_claim_it_once() {
    let Some((a, b, url)) = two_replicas().await else {
        return;
    };
    let claimed = race_begin(&a, &b, "new", HOUR).await;
    assert_eq!(
        claimed.len(),
        RACE_KEYS,
        "every key was claimed: {claimed:?}"
    );
    assert!(claimed.values().all(|&n| n == 1), "{claimed:?}");

    // Two hours pass for every entry (no heartbeat came): under a one-hour window all have
    // expired, and one racer per key replaces each, the rest see its claim. (The clock is
    // the database's, so the entries are aged instead.)
    sqlx::query("UPDATE idempotency SET heartbeat_ms = heartbeat_ms - 7200000")
        .execute(&pool(&url).await)
        .await
        .expect("age the entries");
    let claimed = race_begin(&a, &b, "expired", HOUR).await;
    assert_eq!(
        claimed.len(),
        RACE_KEYS,
        "every key was re-claimed: {claimed:?}"
    );
    assert!(claimed.values().all(|&n| n == 1), "{claimed:?}");
}

/// The ledger in tables of the app's naming: two tables in one database are two ledgers,
/// a schema-qualified name works, and migrating is safe to repeat and to race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_ledgers_in_tables_of_their_own() {
    let Some(server) = pg::server() else {
        return;
    };
    let url = server.fresh_database().await;
    let pool = pool(&url).await;
    sqlx::query("CREATE SCHEMA app")
        .execute(&pool)
        .await
        .expect("schema");
    let named = |name: &str| {
        PgLedger::new(pool.clone()).with_table(TableName::new(name).expect("valid name"))
    };
    let (orders, audit) = (named("orders_ledger"), named("app.audit_ledger"));
    // Instances starting at once each migrate; and again on the next start.
    let (r1, r2, r3) = tokio::join!(orders.migrate(), orders.migrate(), audit.migrate());
    r1.and(r2).and(r3).expect("migrations");
    orders.migrate().await.expect("migrate again");
    let s = scope("alice", "same-key");
    let x = fp(b"x");
    for l in [&orders, &audit] {
        assert_eq!(
            l.begin(&claim(&s, &x, &token("t"), HOUR)).await.unwrap(),
            Begin::Claimed
        );
    }
    for (table, n) in [
        ("orders_ledger", 1i64),
        ("app.audit_ledger", 1),
        ("idempotency", -1),
    ] {
        let got: Result<i64, _> = sqlx::query_scalar(&format!("SELECT count(*) FROM {table}"))
            .fetch_one(&pool)
            .await;
        match n {
            -1 => assert!(got.is_err(), "no table {table} was made"),
            n => assert_eq!(got.expect(table), n, "{table}"),
        }
    }
}

/// TLS through the pool: the ledger works over a verified connection (the server's
/// certificate checked against the authority that signed it, for the host name), the
/// database sees it encrypted, and a connection to a server whose certificate the client
/// cannot verify is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_verified_tls() {
    let Some(server) = pg::server() else {
        return;
    };
    let db = server.fresh_database_name().await;
    let pool = pool(&server.tls_url(&db)).await;
    let l = PgLedger::new(pool.clone());
    l.migrate().await.expect("migrate over TLS");
    let s = scope("alice", "tls");
    let (x, t) = (fp(b"x"), token("t"));
    assert_eq!(
        l.begin(&claim(&s, &x, &t, HOUR)).await.unwrap(),
        Begin::Claimed
    );
    l.complete(&s, &t, &answer(201, b"{}")).await.unwrap();
    assert_eq!(
        l.begin(&claim(&s, &x, &token("p"), HOUR)).await.unwrap(),
        Begin::Completed(answer(201, b"{}"))
    );
    let encrypted: Vec<bool> = sqlx::query_scalar(
        "SELECT ssl FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) WHERE datname = $1",
    )
    .bind(&db)
    .fetch_all(&pool)
    .await
    .expect("pg_stat_ssl");
    assert!(
        !encrypted.is_empty() && encrypted.iter().all(|&e| e),
        "{encrypted:?}"
    );

    // The same server, but the client trusts another authority: no connection.
    let other_ca =
        std::env::temp_dir().join(format!("sw-outbox-other-ca-{}.crt", std::process::id()));
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let other = params
        .self_signed(&rcgen::KeyPair::generate().expect("key"))
        .expect("other authority");
    std::fs::write(&other_ca, other.pem()).expect("write");
    let wrong = server.tls_url(&db).replace(
        &server.ca_file.display().to_string(),
        &other_ca.display().to_string(),
    );
    let refused = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(10))
        .connect(&wrong)
        .await;
    let _ = std::fs::remove_file(&other_ca);
    let err = refused.expect_err("a certificate of an authority the client does not trust");
    assert!(
        err.to_string().to_lowercase().contains("certificate")
            || err.to_string().to_lowercase().contains("tls"),
        "{err}"
    );
}

/// A loopback proxy to `target` that holds every chunk from the server for `delay`: a slow
/// network, so a request can go away while a round trip is in flight.
async fn slow_proxy(target: std::net::SocketAddr, delay: Duration) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(target).await else {
                continue;
            };
            let (mut cr, mut cw) = client.into_split();
            let (mut sr, mut sw) = server.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut cr, &mut sw).await;
            });
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = sr.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    sleep(delay).await;
                    if cw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

/// Ledger calls run to their end when the request that made them goes away (hyper drops
/// its future when the client hangs up), on a network slow enough that it goes away in the
/// middle: an answer being stored is stored (its retries get it, not "outcome unknown"); a
/// claim being made is rolled back (nobody will run its route); and the app's own writes
/// on the same pool, after either, are committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_calls_finish_when_the_request_goes_away() {
    let Some(server) = pg::server() else {
        return;
    };
    let db = server.fresh_database_name().await;
    let proxy = slow_proxy(
        std::net::SocketAddr::from(([127, 0, 0, 1], server.port)),
        Duration::from_millis(40),
    )
    .await;
    let url = format!("postgres://postgres@{proxy}/{db}?sslmode=disable");
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("pool");
    let l = PgLedger::new(pool.clone());
    l.migrate().await.expect("migrate");
    sqlx::query("CREATE TABLE app_data (n BIGINT)")
        .execute(&pool)
        .await
        .expect("the app's table");
    let other = support::pool(&server.url(&db)).await;
    let state = |key: &'static str| {
        let other = other.clone();
        async move {
            sqlx::query_scalar::<_, String>("SELECT state FROM idempotency WHERE idem_key = $1")
                .bind(key)
                .fetch_optional(&other)
                .await
                .expect("read the ledger")
        }
    };
    let app_write = |n: i64| {
        let (pool, other) = (pool.clone(), other.clone());
        async move {
            sqlx::query("INSERT INTO app_data VALUES ($1)")
                .bind(n)
                .execute(&pool)
                .await
                .expect("app write");
            let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM app_data")
                .fetch_one(&other)
                .await
                .expect("count");
            assert_eq!(rows, n, "the app's write number {n} was committed");
        }
    };

    let (s, t, x) = (scope("alice", "stored"), token("t"), fp(b"x"));
    assert_eq!(
        l.begin(&claim(&s, &x, &t, HOUR)).await.unwrap(),
        Begin::Claimed
    );
    // The request goes away 60 ms into storing its answer (each round trip takes 40 ms).
    let ans = answer(201, b"{}");
    let gone = tokio::time::timeout(Duration::from_millis(60), l.complete(&s, &t, &ans)).await;
    assert!(gone.is_err(), "storing took longer than a round trip");
    let mut stored = None;
    for _ in 0..100 {
        stored = state("stored").await;
        if stored.as_deref() == Some("completed") {
            break;
        }
        sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        stored.as_deref(),
        Some("completed"),
        "the answer was stored all the same"
    );
    app_write(1).await;

    let c = claim(&scope("alice", "gone"), &x, &token("g"), HOUR);
    let gone = tokio::time::timeout(Duration::from_millis(60), l.begin(&c)).await;
    assert!(gone.is_err(), "the claim took longer than a round trip");
    sleep(Duration::from_millis(600)).await;
    assert_eq!(
        state("gone").await,
        None,
        "no claim of a request that went away"
    );
    app_write(2).await;
}
