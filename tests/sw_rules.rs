//! What `www/sw.js` needs before the module loads, written from the Rust definitions
//! (issue 34, 9): every configuration default (`Config::default`), the shell's statuses
//! (`core::shell`), the write methods (`core::route`), the cache prefix and lock, the
//! key header, the 503 answers given without the module (`core::first_attempt`), and
//! the database's name, version, stores and keys it opens and reads at its first
//! evaluation (`core::layout`, issue 36).
//! They stand in sw.js between its `generated from Rust: begin` and `end` lines;
//! `SW_RULES_WRITE=1 cargo test --test sw_rules` writes them, and `cargo test` fails
//! when sw.js holds anything else, so a default changed in Rust and not in sw.js is
//! caught on the host. The behaviour of the route part is held to the Rust in a real
//! service worker (tests/service_worker_route.rs).
#![cfg(not(target_arch = "wasm32"))]

use serde_json::{json, Value};
use sw_outbox::core::config::{Config, DEFAULT_AUTH_NAMES, DEFAULT_AUTH_PARENTS, DEFAULT_DB_NAME};
use sw_outbox::core::first_attempt::{SyntheticAnswer, WHY};
use sw_outbox::core::key::IDEMPOTENCY_KEY_HEADER;
use sw_outbox::core::layout;
use sw_outbox::core::route::WRITE_METHODS;
use sw_outbox::core::shell::{CACHES_LOCK, CACHE_PREFIX, SHELL_STATUSES};

const SW_JS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/www/sw.js");
const BEGIN: &str = "// ---- generated from Rust: begin\n";
const END: &str = "// ---- generated from Rust: end\n";

/// The configuration fields `sw.js` reads before (or beside) the module: their defaults
/// are in the block. (Only these: every default would cost the script's size for
/// nothing.) `sw_js_reads_only_fields_of_the_block` holds sw.js to this list.
const READ_BY_SW_JS: [&str; 9] = [
    "apiPrefix",
    "authRoutePattern",
    "expectedAccountHeader",
    "precache",
    "shellUrl",
    "skipWaiting",
    "build",
    "staticRoutes",
    "dbName",
];

/// `defaults`' values of the fields sw.js reads, in [`READ_BY_SW_JS`]'s order.
fn config_defaults(defaults: &Config) -> Value {
    let all = serde_json::to_value(defaults).expect("Config is plain data");
    let mut read = serde_json::Map::new();
    for f in READ_BY_SW_JS {
        read.insert(f.into(), all.get(f).cloned().expect("a field of Config"));
    }
    Value::Object(read)
}

/// The rules as one JSON value (sw.js reads it as `SW_OUTBOX_RULES`).
fn rules(defaults: &Config) -> Value {
    let not_started = SyntheticAnswer::not_started(WHY);
    let offline = SyntheticAnswer::offline();
    json!({
        "config": config_defaults(defaults),
        "shellStatuses": SHELL_STATUSES,
        "writeMethods": WRITE_METHODS,
        "authNames": DEFAULT_AUTH_NAMES,
        "authParents": DEFAULT_AUTH_PARENTS,
        "cachePrefix": CACHE_PREFIX,
        "cachesLock": CACHES_LOCK,
        "idempotencyKeyHeader": IDEMPOTENCY_KEY_HEADER,
        "offline": { "status": offline.status, "body": offline.body },
        "notStarted": { "status": not_started.status, "body": not_started.body, "why": WHY },
        "database": {
            "name": DEFAULT_DB_NAME,
            "version": layout::VERSION,
            "stores": { "mutations": layout::MUTATIONS, "session": layout::SESSION },
            "keys": {
                "session": layout::SESSION_KEY,
                "scope": layout::SCOPE_KEY,
                "generation": layout::GENERATION_KEY,
            },
        },
    })
}

/// The block between the markers, as Rust writes it.
fn block(defaults: &Config) -> String {
    let json = serde_json::to_string_pretty(&rules(defaults)).expect("JSON");
    format!(
        "// Written by `SW_RULES_WRITE=1 cargo test --test sw_rules` from the Rust definitions\n\
         // (tests/sw_rules.rs); `cargo test` fails when it differs. Not edited by hand.\n\
         const SW_OUTBOX_RULES = {json};\n"
    )
}

/// sw.js split around its generated block: before, the block, after.
fn split(sw: &str) -> (&str, &str, &str) {
    let b = sw
        .find(BEGIN)
        .expect("sw.js has the generated block's begin line")
        + BEGIN.len();
    let e = sw[b..].find(END).expect("sw.js has its end line") + b;
    (&sw[..b], &sw[b..e], &sw[e..])
}

/// Whether sw.js holds the block `defaults` gives; with `SW_RULES_WRITE=1` it is
/// written first.
fn check(sw: &str, defaults: &Config) -> Result<(), String> {
    let (_, held, _) = split(sw);
    let want = block(defaults);
    if held == want {
        Ok(())
    } else {
        Err(format!(
            "www/sw.js's generated block differs from the Rust definitions: \
             run `SW_RULES_WRITE=1 cargo test --test sw_rules`\n--- sw.js\n{held}\n--- Rust\n{want}"
        ))
    }
}

/// `SW_RULES_WRITE=1`: this run writes the block (the tests that read sw.js wait for
/// the next run, which checks what was written).
fn writing() -> bool {
    std::env::var_os("SW_RULES_WRITE").is_some()
}

#[test]
fn sw_js_holds_what_rust_writes() {
    let sw = std::fs::read_to_string(SW_JS).expect("www/sw.js");
    if writing() {
        let (before, _, after) = split(&sw);
        let written = format!("{before}{}{after}", block(&Config::default()));
        if written != sw {
            std::fs::write(SW_JS, &written).expect("write www/sw.js");
        }
        return;
    }
    if let Err(e) = check(&sw, &Config::default()) {
        panic!("{e}");
    }
}

/// A default changed in Rust alone is caught: for each kind of field, a changed default
/// no longer matches the block sw.js holds.
#[test]
fn a_default_changed_in_rust_alone_is_caught() {
    if writing() {
        return;
    }
    let sw = std::fs::read_to_string(SW_JS).expect("www/sw.js");
    let changed = [
        Config {
            api_prefix: "/v2/".into(),
            ..Config::default()
        },
        Config {
            skip_waiting: false,
            ..Config::default()
        },
        Config {
            expected_account_header: "X-Account".into(),
            ..Config::default()
        },
        Config {
            precache: vec!["/".into()],
            ..Config::default()
        },
        Config {
            build: "other".into(),
            ..Config::default()
        },
    ];
    for c in changed {
        assert!(check(&sw, &c).is_err(), "{c:?}");
    }
}

/// The block's defaults are `Config::default`'s, each field read back as Rust reads it.
#[test]
fn the_blocks_defaults_are_rusts() {
    let block = rules(&Config::default())["config"].clone();
    let back: Config = serde_json::from_value(block.clone()).expect("fields of Config");
    assert_eq!(back, Config::default());
    assert_eq!(
        block.as_object().map(|o| o.len()),
        Some(READ_BY_SW_JS.len())
    );
}

/// Outside the generated block sw.js restates no default: no default's text appears
/// there, and every configuration field it reads has its default in the block.
#[test]
fn sw_js_restates_no_rule_outside_the_block() {
    if writing() {
        return;
    }
    let sw = std::fs::read_to_string(SW_JS).expect("www/sw.js");
    let (before, _, after) = split(&sw);
    let rest = format!("{before}{after}");
    let c = Config::default();
    let mut texts = vec![
        c.api_prefix.clone(),
        c.auth_route_pattern.clone(),
        c.auth_me_path.clone(),
        c.expected_account_header.clone(),
        c.csrf_header.clone(),
        c.workspace_pattern.clone(),
        CACHES_LOCK.into(),
        IDEMPOTENCY_KEY_HEADER.into(),
        format!("'{CACHE_PREFIX}'"),
        format!("'{}'", c.build),
        "neither sent nor stored".into(),
        "{ error: 'offline' }".into(),
        "500, 502, 503, 504".into(),
        format!("'{}'", layout::MUTATIONS),
        format!("'{}'", layout::GENERATION_KEY),
    ];
    texts.extend(
        WRITE_METHODS
            .iter()
            .map(|m| format!("|{}", m.to_lowercase())),
    );
    for t in texts {
        assert!(
            !rest.contains(&t),
            "sw.js restates {t:?} outside the generated block"
        );
    }
    let block = config_defaults(&c);
    let fields = block.as_object().expect("an object");
    for holder in ["CONFIG.", "config.", "CONFIG_DEFAULTS."] {
        for (i, _) in rest.match_indices(holder) {
            let name: String = rest[i + holder.len()..]
                .chars()
                .take_while(|ch| ch.is_ascii_alphanumeric())
                .collect();
            let method = name.is_empty() || ["map", "find"].contains(&name.as_str());
            assert!(
                method || fields.contains_key(&name),
                "sw.js reads {holder}{name}: not a field whose default the block holds \
                 (READ_BY_SW_JS)"
            );
        }
    }
}
