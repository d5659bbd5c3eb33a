//! The configuration reader without serde (`worker::config_reader`, issue 36, 1) beside
//! the serde reader it replaced (`js::from_value_strict::<Config>`), in a real service
//! worker (`wasm-pack test --headless --chrome`, `--firefox`): on every sample
//! configuration, good and bad, both read the same `Config` or refuse it with the same
//! words, and the started outbox refuses a bad one as before.
#![cfg(target_arch = "wasm32")]

use sw_outbox::core::config::Config;
use sw_outbox::worker::config_reader;
use wasm_bindgen::prelude::*;
use wasm_bindgen_test::*;

wasm_bindgen_test_configure!(run_in_service_worker);

/// Sample configurations as JavaScript expressions (so `undefined`, `BigInt`s, `Map`s,
/// functions and odd numbers can be written).
const SAMPLES: &[&str] = &[
    "({})",
    "({ apiPrefix: '/v1/', attemptTimeoutMs: 500, dbName: 't' })",
    // Every field set to something other than its default.
    "({ apiPrefix: '/v1/', authRoutePattern: '^/login', authMePath: '/v1/me', \
       expectedAccountHeader: 'X-Account', csrfHeader: 'X-XSRF', workspacePattern: '^/w/([^/]+)', \
       dbName: 'db', syncTag: 'tag', attemptTimeoutMs: 1, maxBodyBytes: 2, maxRecords: 3, \
       maxServerFailures: 4, stillRunningPatienceMs: 5, maxRetentionMs: 6, flushBudgetMs: 7, \
       replayConcurrency: 8, neverQueuePattern: '/merge$', serverKeyTtlMs: 9, \
       maxRetryAfterMs: 10, offlineProbeMs: 11, replayHeaders: ['If-Match'], \
       queueStatuses: [500, 429], persistAuthorization: true, precache: ['/a', '/b.html'], \
       shellUrl: '/b.html', notificationUrl: '/n', skipWaiting: false, staticRoutes: true, \
       build: 'b1' })",
    "({ stillRunningPatienceMs: 0 })",
    "({ stillRunningPatienceMs: 9007199254740991 })",
    "({ stillRunningPatienceMs: 9007199254740992 })",
    "({ stillRunningPatienceMs: -1 })",
    "({ stillRunningPatienceMs: '600000' })",
    "({ dbName: null, shellUrl: undefined, neverQueuePattern: null })",
    "({ attemptTimeout: 5 })",
    "({ apiprefix: '/api/' })",
    "({ maxRecords: 'many' })",
    "({ attemptTimeoutMs: -1 })",
    "({ attemptTimeoutMs: 1.5 })",
    "({ attemptTimeoutMs: 4294967296 })",
    "({ attemptTimeoutMs: 4294967295 })",
    "({ attemptTimeoutMs: NaN })",
    "({ attemptTimeoutMs: Infinity })",
    "({ attemptTimeoutMs: null })",
    "({ attemptTimeoutMs: undefined })",
    "({ attemptTimeoutMs: true })",
    "({ attemptTimeoutMs: [1] })",
    "({ attemptTimeoutMs: { ms: 1 } })",
    "({ attemptTimeoutMs: 5n })",
    "({ attemptTimeoutMs: -0 })",
    "({ skipWaiting: 'false' })",
    "({ skipWaiting: 0 })",
    "({ staticRoutes: 'true' })",
    "({ persistAuthorization: null })",
    "({ apiPrefix: 5 })",
    "({ apiPrefix: null })",
    "({ apiPrefix: ['/api/'] })",
    "({ apiPrefix: () => '/api/' })",
    "({ apiPrefix: new Set(['/api/']) })",
    "({ apiPrefix: new Map([['a', 1]]) })",
    "({ apiPrefix: new Date(0) })",
    "({ apiPrefix: 'caf\\u00e9 \"quoted\"' })",
    "({ dbName: 7 })",
    "({ replayHeaders: 'If-Match' })",
    "({ replayHeaders: ['If-Match', 3] })",
    "({ replayHeaders: null })",
    "({ replayHeaders: {} })",
    "({ queueStatuses: [502, 70000] })",
    "({ queueStatuses: [502, -1] })",
    "({ queueStatuses: [502, 2.5] })",
    "({ queueStatuses: ['502'] })",
    "({ queueStatuses: [] })",
    "({ precache: [null] })",
    "new Map([['apiPrefix', '/m/'], ['maxRecords', 5]])",
    "new Map([['nope', 1]])",
    "['/api/']",
    "Object.assign([], { apiPrefix: '/arr/' })",
    "Object.create({ apiPrefix: '/inherited/' })",
    "Object.defineProperty({}, 'apiPrefix', { value: '/hidden/', enumerable: false })",
    "'config'",
    "5",
    "1.5",
    "true",
    "5n",
    "() => 1",
];

fn sample(expr: &str) -> JsValue {
    js_sys::Function::new_no_args(&format!("return {expr};"))
        .call0(&JsValue::NULL)
        .expect("a sample evaluates")
}

#[wasm_bindgen_test]
fn both_readers_read_and_refuse_alike() {
    let mut refused = 0;
    for expr in SAMPLES {
        let serde: Result<Config, String> =
            sw_outbox::js::from_value_strict(sample(expr)).map_err(|e| e.to_string());
        let direct = config_reader::read(&sample(expr));
        assert_eq!(direct, serde, "{expr}");
        // And so after validation, which both go through.
        let checked =
            |r: Result<Config, String>| r.and_then(|c| c.validate().map_err(|e| e.to_string()));
        assert_eq!(checked(direct.clone()), checked(serde), "{expr}");
        refused += usize::from(direct.is_err());
    }
    assert!(
        refused > 30,
        "the samples include bad configurations: {refused}"
    );
}

#[wasm_bindgen_test]
fn every_field_is_read() {
    let all = config_reader::read(&sample(SAMPLES[2])).expect("reads");
    let d = Config::default();
    // No field kept its default: each was read.
    assert_ne!(all.api_prefix, d.api_prefix);
    assert_ne!(all.auth_route_pattern, d.auth_route_pattern);
    assert_ne!(all.auth_me_path, d.auth_me_path);
    assert_ne!(all.expected_account_header, d.expected_account_header);
    assert_ne!(all.csrf_header, d.csrf_header);
    assert_ne!(all.workspace_pattern, d.workspace_pattern);
    assert_ne!(all.db_name, d.db_name);
    assert_ne!(all.sync_tag, d.sync_tag);
    assert_ne!(all.attempt_timeout_ms, d.attempt_timeout_ms);
    assert_ne!(all.max_body_bytes, d.max_body_bytes);
    assert_ne!(all.max_records, d.max_records);
    assert_ne!(all.max_server_failures, d.max_server_failures);
    assert_ne!(all.still_running_patience_ms, d.still_running_patience_ms);
    assert_ne!(all.max_retention_ms, d.max_retention_ms);
    assert_ne!(all.flush_budget_ms, d.flush_budget_ms);
    assert_ne!(all.replay_concurrency, d.replay_concurrency);
    assert_ne!(all.never_queue_pattern, d.never_queue_pattern);
    assert_ne!(all.server_key_ttl_ms, d.server_key_ttl_ms);
    assert_ne!(all.max_retry_after_ms, d.max_retry_after_ms);
    assert_ne!(all.offline_probe_ms, d.offline_probe_ms);
    assert_ne!(all.replay_headers, d.replay_headers);
    assert_ne!(all.queue_statuses, d.queue_statuses);
    assert_ne!(all.persist_authorization, d.persist_authorization);
    assert_ne!(all.precache, d.precache);
    assert_ne!(all.shell_url, d.shell_url);
    assert_ne!(all.notification_url, d.notification_url);
    assert_ne!(all.skip_waiting, d.skip_waiting);
    assert_ne!(all.static_routes, d.static_routes);
    assert_ne!(all.build, d.build);
}

#[wasm_bindgen_test]
async fn the_outbox_refuses_a_bad_configuration_as_before() {
    for (expr, said) in [
        (
            "({ maxRecords: 'many' })",
            "sw-outbox: invalid configuration: invalid type: string \"many\", expected u32",
        ),
        (
            "({ stillRunningPatienceMs: -1 })",
            "sw-outbox: invalid configuration: invalid value: integer `-1`, expected u64",
        ),
        (
            "({ replayConcurrency: 0 })",
            "sw-outbox: config.replayConcurrency: must be between 1 and 32",
        ),
    ] {
        let refused = sw_outbox::worker::start(sample(expr), JsValue::UNDEFINED)
            .await
            .err()
            .and_then(|e| e.as_string());
        assert_eq!(refused.as_deref(), Some(said), "{expr}");
    }
    let unknown = sw_outbox::worker::start(sample("({ attemptTimeout: 5 })"), JsValue::UNDEFINED)
        .await
        .err()
        .and_then(|e| e.as_string())
        .unwrap_or_default();
    assert!(
        unknown.starts_with("sw-outbox: invalid configuration: unknown field `attemptTimeout`, expected one of `apiPrefix`, "),
        "{unknown}"
    );
}

/// The patterns are compiled while the database opens (issue 36, 2), and a bad one
/// still keeps the outbox from starting, named as before.
#[wasm_bindgen_test]
async fn a_pattern_that_does_not_compile_refuses_the_start() {
    for (expr, field) in [
        (
            "({ dbName: 'bad-auth-pattern', authRoutePattern: '(' })",
            "authRoutePattern",
        ),
        (
            "({ dbName: 'bad-workspace-pattern', workspacePattern: '[' })",
            "workspacePattern",
        ),
        (
            "({ dbName: 'bad-never-queue', neverQueuePattern: '*' })",
            "neverQueuePattern",
        ),
    ] {
        let refused = sw_outbox::worker::start(sample(expr), JsValue::UNDEFINED)
            .await
            .err()
            .and_then(|e| e.as_string())
            .unwrap_or_default();
        assert!(
            refused.starts_with(&format!(
                "config.{field} is not a valid regular expression: "
            )),
            "{expr}: {refused}"
        );
    }
    // A good one starts, and its patterns work from their first use.
    let o = sw_outbox::worker::start(
        sample("({ dbName: 'good-patterns', neverQueuePattern: '/merge$' })"),
        JsValue::UNDEFINED,
    )
    .await;
    assert!(o.is_ok());
}
