//! The check against the reference server (`server/`), on both ledgers: every duty
//! passes, as the README's "Server compatibility" table says of it.

mod support;

#[path = "../../idempotency/tests/support/pg.rs"]
mod pg;

use std::path::PathBuf;
use support::{conformance, expected};
use sw_outbox_server::{Config, Mode, RunningServer};

/// The delay fault the test mode offers, as the slow hook: the next task write is
/// claimed, then held 3 s before it runs.
const SLOW_HOOK: &str = r#"POST /__control/faults {"rules":[{"path":"/api/projects/*/tasks","method":"POST","kind":"delay","delayMs":3000,"times":1}]}"#;

fn www() -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("sw-outbox-conformance-www-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("www dir");
    dir
}

async fn reference(mode: Mode, ledger: Option<String>) -> RunningServer {
    let config = Config {
        port: 0,
        www: www(),
        db: ":memory:".into(),
        ledger,
        ..Config::for_mode(mode)
    };
    sw_outbox_server::spawn(config)
        .await
        .expect("server starts")
}

fn all_pass() -> std::collections::BTreeMap<String, String> {
    expected(&[
        ("auth-me", "pass"),
        ("replay", "pass"),
        ("concurrent-repeat", "pass"),
        ("key-reuse", "pass"),
        ("keys-per-account", "pass"),
        ("expected-account", "pass"),
        ("csrf", "pass"),
        ("signed-out-write", "pass"),
        ("key-window", "pass"),
        ("page-keys", "pass"),
    ])
}

async fn check_reference(ledger: Option<String>) {
    let srv = reference(Mode::Test, ledger).await;
    let run = conformance(
        srv.addr,
        &[
            "--user",
            "alice",
            "--password",
            "alice",
            "--key-ttl",
            "24h",
            "--key-probe",
            "1s",
            "--slow-hook",
            SLOW_HOOK,
            "--second-user",
            "bob",
            "--second-password",
            "bob",
            "--json",
        ],
    )
    .await;
    assert_eq!(run.outcomes(), all_pass(), "{}", run.explain());
    assert_eq!(run.status, Some(0), "{}", run.explain());
    let second = run.finding("keys-per-account");
    assert!(
        second["server"]
            .as_str()
            .is_some_and(|s| s.starts_with("bob sent alice's key") && s.ends_with("ran once")),
        "{second}"
    );
    let replay = run.finding("replay");
    assert_eq!(
        replay["notes"],
        serde_json::json!([]),
        "marker, Location, body kept"
    );
    let concurrent = run.finding("concurrent-repeat");
    assert!(
        concurrent["server"].as_str().is_some_and(|s| s
            .contains("409 {\"detail\":\"idempotency_in_progress\"}")
            && s.ends_with("ran once")),
        "the repeat met the first copy running: {concurrent}"
    );
    assert!(run.finding("key-reuse")["server"]
        .as_str()
        .is_some_and(|s| s.contains("422 {\"detail\":\"idempotency_key_reused\"}")));
    srv.shutdown().await;
}

#[tokio::test]
async fn the_reference_server_on_sqlite_passes_every_duty() {
    check_reference(None).await;
}

#[tokio::test]
async fn the_reference_server_on_postgres_passes_every_duty() {
    let Some(pg) = pg::server() else {
        return; // SW_OUTBOX_SKIP_PG=1
    };
    check_reference(Some(pg.fresh_database().await)).await;
}

#[tokio::test]
async fn in_prod_mode_without_a_hook_copies_race_and_still_run_once() {
    let srv = reference(Mode::Prod, None).await;
    let run = conformance(
        srv.addr,
        &[
            "--user",
            "bob",
            "--password",
            "bob",
            "--key-probe",
            "1s",
            "--copies",
            "6",
            "--json",
        ],
    )
    .await;
    let mut expected = all_pass();
    // Raced without a slow hook: "ran once" is seen, "still running" is not credited.
    expected.insert("concurrent-repeat".into(), "not-checked".into());
    expected.insert("keys-per-account".into(), "not-checked".into());
    assert_eq!(run.outcomes(), expected, "{}", run.explain());
    let concurrent = run.finding("concurrent-repeat");
    assert!(
        concurrent["server"]
            .as_str()
            .is_some_and(|s| s.ends_with("ran once")),
        "{concurrent}"
    );
    assert!(
        concurrent["notes"][0]
            .as_str()
            .is_some_and(|s| s.contains("raced without --slow-hook")),
        "{concurrent}"
    );
    assert_eq!(run.status, Some(0), "not checked is no failure");
    srv.shutdown().await;
}

#[tokio::test]
async fn a_refused_sign_in_is_a_setup_error() {
    let srv = reference(Mode::Test, None).await;
    let run = conformance(srv.addr, &["--user", "alice", "--password", "wrong"]).await;
    assert_eq!(run.status, Some(2), "{}", run.explain());
    assert!(
        run.stderr.contains("signing in as alice"),
        "{}",
        run.explain()
    );
    let run = conformance(
        srv.addr,
        &[
            "--user",
            "alice",
            "--password",
            "alice",
            "--write",
            "POST /api/nowhere",
        ],
    )
    .await;
    assert_eq!(run.status, Some(2), "{}", run.explain());
    assert!(run.stderr.contains("a fresh write"), "{}", run.explain());
    srv.shutdown().await;
}

#[tokio::test]
async fn the_text_report_names_each_duty_and_the_totals() {
    let srv = reference(Mode::Test, None).await;
    let run = conformance(
        srv.addr,
        &[
            "--user",
            "alice",
            "--password",
            "alice",
            "--key-probe",
            "1s",
        ],
    )
    .await;
    assert_eq!(run.status, Some(0), "{}", run.explain());
    let unchecked = ["concurrent-repeat", "keys-per-account"];
    for duty in all_pass().keys() {
        let label = if unchecked.contains(&duty.as_str()) {
            "not checked"
        } else {
            "pass"
        };
        assert!(
            run.stdout.contains(&format!("[{label}] {duty}: ")),
            "{duty}\n{}",
            run.stdout
        );
    }
    assert!(
        run.stdout
            .contains("10 duties: 8 pass, 0 fail, 0 not supported, 2 not checked"),
        "{}",
        run.stdout
    );
    srv.shutdown().await;
}

#[tokio::test]
async fn a_claimed_window_shorter_than_the_outboxs_fails() {
    let srv = reference(Mode::Test, None).await;
    let run = conformance(
        srv.addr,
        &[
            "--user",
            "alice",
            "--password",
            "alice",
            "--key-ttl",
            "1h",
            "--key-probe",
            "1s",
            "--json",
        ],
    )
    .await;
    let window = run.finding("key-window");
    assert_eq!(window["outcome"], "fail", "{}", run.explain());
    assert!(
        window["outbox"]
            .as_str()
            .is_some_and(|s| s.contains("set serverKeyTtlMs to at most 3600000 ms")),
        "{window}"
    );
    assert_eq!(run.status, Some(1));
    srv.shutdown().await;
}
