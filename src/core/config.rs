//! The configuration `www/sw.js` passes to the outbox (contract section 7).
//!
//! Every default lives here and nowhere else; the shell and the docs read them from
//! [`Config::default`].

use serde::Deserialize;

/// One outbox's configuration. Field names are the contract's (camelCase in JavaScript).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[cfg_attr(not(target_arch = "wasm32"), derive(serde::Serialize))]
#[serde(default, rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    /// Same-origin paths starting with this are the outbox's business.
    pub api_prefix: String,
    /// A JavaScript regular expression (compiled case-insensitively) matched against the
    /// path and query; matching requests are never queued.
    pub auth_route_pattern: String,
    /// The identity endpoint asked before every replay.
    pub auth_me_path: String,
    pub expected_account_header: String,
    pub csrf_header: String,
    /// A JavaScript regular expression matched against a record's path (relative to the
    /// API base); capture group 1 is the workspace.
    pub workspace_pattern: String,
    /// The IndexedDB database. `None` (the default): `sw-outbox` for the first
    /// registration of the origin that opens it (an existing install keeps its queue,
    /// whatever its scope), `sw-outbox:<scope path>` for any other, so two registrations
    /// never share a database unless configured to (contract 3, r3). Set in every
    /// registration that is to share one: a worker whose `dbName` is configured reads the
    /// database's generation before each use of its cached view (contract 8).
    pub db_name: Option<String>,
    pub sync_tag: String,
    pub attempt_timeout_ms: u32,
    pub max_body_bytes: u32,
    pub max_records: u32,
    pub max_server_failures: u32,
    /// How long 409 "still running" answers in a row are waited for before a record is
    /// handed to a person (`conflict`, with `maxServerFailures` such answers too):
    /// a slow server's first attempt is waited for, not failed (contract 4.5, r4).
    pub still_running_patience_ms: u64,
    pub max_retention_ms: u64,
    pub flush_budget_ms: u32,
    pub replay_concurrency: u32,
    /// A JavaScript regular expression matched against the path and query: matching
    /// writes are sent like any other but never queued (contract 2.9, r2).
    pub never_queue_pattern: Option<String>,
    /// How long the server's idempotency ledger keeps a key (contract 4.7, r2): a record
    /// that may have reached the server is never sent with its old key after this.
    pub server_key_ttl_ms: u64,
    /// The longest a server's `Retry-After` may hold delivery (contract 4.5, r2).
    pub max_retry_after_ms: u32,
    /// How often a worker that saw the network fail probes it (`GET authMePath`) while it
    /// queues writes without a first attempt (the known-offline fast path).
    pub offline_probe_ms: u32,
    /// The page's own request headers stored with a record and sent on its replays
    /// (contract 4.4, r2); credentials, the CSRF header and hop-by-hop headers never are
    /// ([`Config::stores_header`]).
    pub replay_headers: Vec<String>,
    /// Statuses that queue a first attempt as a network failure would (contract 2.3,
    /// r3): a gateway whose application is down. `[]`: every answer passes through.
    pub queue_statuses: Vec<u16>,
    /// Whether `AUTH_SESSION`'s `authorization` is kept in IndexedDB across worker
    /// restarts (contract 6, r3); `false`: in memory only, and a restarted worker asks
    /// for it (`AUTH_NEEDED`) before it replays.
    pub persist_authorization: bool,
    /// App-shell URLs cached at install (section 9).
    pub precache: Vec<String>,
    /// The precached URL answered for navigations that fail (section 9); `None`: the
    /// first `precache` entry that is a page (`core::shell::shell_url`).
    pub shell_url: Option<String>,
    /// Where a click on a delivery notification opens the app when no window is open.
    pub notification_url: String,
    /// Whether a new version takes over at once after it installed (contract 7, r3).
    /// `false` leaves it waiting until a page asks (`SKIP_WAITING`): a prompt-to-update
    /// flow. Read by `www/sw.js`, which installs and activates.
    pub skip_waiting: bool,
    /// Whether the worker serves only the API (contract 1, r4): where the browser offers
    /// static routing, its install routes every request that is neither under
    /// `apiPrefix` nor an auth route (nor the app shell's) to the network, so a page load
    /// never waits for the worker to start. `false` (the default): every request reaches
    /// the fetch listeners, as a site that pairs the outbox with its own caching needs.
    /// Read by `www/sw.js`, which installs.
    pub static_routes: bool,
    /// Cache-name suffix naming this build; `www/sw.js` sets it from the build id.
    pub build: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            api_prefix: "/api/".into(),
            auth_route_pattern: DEFAULT_AUTH_ROUTE_PATTERN.into(),
            auth_me_path: "/api/auth/me".into(),
            expected_account_header: "X-PM-Expected-Account".into(),
            csrf_header: "X-CSRF-Token".into(),
            workspace_pattern: r"^/projects/([^/?#]+)".into(),
            db_name: None,
            sync_tag: "sw-outbox".into(),
            attempt_timeout_ms: 15_000,
            max_body_bytes: 1024 * 1024,
            max_records: 10_000,
            max_server_failures: 3,
            still_running_patience_ms: 10 * 60 * 1000,
            max_retention_ms: 7 * 24 * 60 * 60 * 1000,
            flush_budget_ms: 25_000,
            replay_concurrency: 4,
            never_queue_pattern: None,
            server_key_ttl_ms: 24 * 60 * 60 * 1000,
            max_retry_after_ms: 60 * 60 * 1000,
            offline_probe_ms: 2000,
            replay_headers: DEFAULT_REPLAY_HEADERS.iter().map(|h| (*h).into()).collect(),
            queue_statuses: DEFAULT_QUEUE_STATUSES.to_vec(),
            persist_authorization: false,
            precache: Vec::new(),
            shell_url: None,
            notification_url: "/".into(),
            skip_waiting: true,
            static_routes: false,
            build: "dev".into(),
        }
    }
}

/// The default `authRoutePattern` (contract 1, r4): the usual names of sign-in, sign-out
/// and token routes — `auth`, `login`, `logout`, `signin`, `signout`, `sign-in`,
/// `sign-out`, `session(s)`, `token(s)`, `refresh`, `oauth` — as a path's first segment,
/// or as its second after `/api/` or `/accounts/`, the segment ending at `/`, `?` or the
/// end. A sign-in is never queued wherever it lives: under `apiPrefix` it is an auth
/// route, elsewhere it is observed (`core::route::Owner::ObservedAuth`). Whole segments
/// only, so `/api/tokenizer` and `/api/authors` are not auth routes; deeper segments
/// neither (`/api/projects/1/sessions` is an app's own resource). The same text is a
/// JavaScript and a Rust regular expression, compiled case-insensitively.
pub const DEFAULT_AUTH_ROUTE_PATTERN: &str = r"^/(?:(?:api|accounts)/)?(?:auth|login|logout|signin|signout|sign-in|sign-out|sessions?|tokens?|refresh|oauth)(?:/|\?|$)";

/// The names and places [`DEFAULT_AUTH_ROUTE_PATTERN`] spells as one expression, as lists:
/// `sw.js` turns them into one URLPattern per name and place for `staticRoutes` (Chromium
/// takes no regular-expression groups there). `default_auth_pattern_is_its_lists` holds
/// the two forms together.
pub const DEFAULT_AUTH_NAMES: [&str; 13] = [
    "auth", "login", "logout", "signin", "signout", "sign-in", "sign-out", "session", "sessions",
    "token", "tokens", "refresh", "oauth",
];
/// Where a [`DEFAULT_AUTH_NAMES`] segment may stand: first, or second after these.
pub const DEFAULT_AUTH_PARENTS: [&str; 3] = ["", "/api", "/accounts"];

/// The default database of the origin's first registration (contract 3).
pub const DEFAULT_DB_NAME: &str = "sw-outbox";

/// The default database of a registration that finds [`DEFAULT_DB_NAME`] claimed by
/// another scope of the origin: named after its own scope's path.
pub fn scoped_db_name(scope_path: &str) -> String {
    format!("{DEFAULT_DB_NAME}:{scope_path}")
}

/// Whether a registration (scope `me`) may use the default database, which records the
/// scope that claimed it first (`owner`; `None`: not claimed yet, so it claims it now).
pub fn owns_default_db(owner: Option<&str>, me: &str) -> bool {
    owner.is_none_or(|o| o == me)
}

/// The page headers a replay carries by default (contract 4.4): the conditional-request
/// headers that keep a stale queued edit from overwriting newer server state (a replayed
/// `If-Match` gets its 412), and content negotiation.
pub const DEFAULT_REPLAY_HEADERS: [&str; 7] = [
    "If-Match",
    "If-None-Match",
    "If-Unmodified-Since",
    "If-Modified-Since",
    "Accept",
    "Accept-Language",
    "Content-Language",
];

/// A gateway's answers while the application behind it is down or restarting (contract
/// 2.3, r3): a first attempt answered so is queued, its key making the replay safe
/// whether or not the request reached the application.
pub const DEFAULT_QUEUE_STATUSES: [u16; 3] = [502, 503, 504];

/// Headers never stored with a record, whatever `replayHeaders` lists: credentials (the
/// browser adds the cookie of the moment, and a stored token would outlive a sign-out),
/// the headers the worker sets itself, the body's own (`Content-Type` is stored apart)
/// and hop-by-hop headers.
const NEVER_STORED: [&str; 14] = [
    "cookie",
    "authorization",
    "proxy-authorization",
    "idempotency-key",
    "content-type",
    "content-length",
    "host",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The largest timer a browser honours (`setTimeout` takes a signed 32-bit delay; a
/// larger one fires at once).
pub const MAX_TIMER_MS: u64 = (1 << 31) - 1;

/// The largest integer a JavaScript number holds exactly: bounds the millisecond spans
/// compared with `Date.now()`.
const MAX_SPAN_MS: u64 = (1 << 53) - 1;

/// Why a configuration was refused. The worker refuses to start rather than run with a
/// configuration it would have to guess about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("config.{field}: {problem}")]
    Invalid {
        field: &'static str,
        problem: &'static str,
    },
}

impl Config {
    /// Checks the values a deserialised configuration cannot express in its types.
    pub fn validate(self) -> Result<Self, ConfigError> {
        let bad = |field, problem| Err(ConfigError::Invalid { field, problem });
        if !self.api_prefix.starts_with('/') || !self.api_prefix.ends_with('/') {
            return bad("apiPrefix", "must start and end with '/'");
        }
        if !self.auth_me_path.starts_with('/') {
            return bad("authMePath", "must be a same-origin path starting with '/'");
        }
        if !is_header_name(&self.expected_account_header) {
            return bad("expectedAccountHeader", "must be an HTTP header name");
        }
        if !is_header_name(&self.csrf_header) {
            return bad("csrfHeader", "must be an HTTP header name");
        }
        if !self.notification_url.starts_with('/') {
            return bad(
                "notificationUrl",
                "must be a same-origin path starting with '/'",
            );
        }
        if self.db_name.as_deref() == Some("") {
            return bad("dbName", "must not be empty (null: the default)");
        }
        if self.sync_tag.is_empty() {
            return bad("syncTag", "must not be empty");
        }
        let timer = "must be between 1 and 2147483647 (a browser timer)";
        if !in_range(self.attempt_timeout_ms, 1, MAX_TIMER_MS) {
            return bad("attemptTimeoutMs", timer);
        }
        if !in_range(self.flush_budget_ms, 1, MAX_TIMER_MS) {
            return bad("flushBudgetMs", timer);
        }
        if !in_range(self.max_retry_after_ms, 1, MAX_TIMER_MS) {
            return bad("maxRetryAfterMs", timer);
        }
        if !in_range(self.offline_probe_ms, 1, MAX_TIMER_MS) {
            return bad("offlineProbeMs", timer);
        }
        let span = "must be between 1 and 9007199254740991";
        if !in_range(self.max_retention_ms, 1, MAX_SPAN_MS) {
            return bad("maxRetentionMs", span);
        }
        if !in_range(self.server_key_ttl_ms, 1, MAX_SPAN_MS) {
            return bad("serverKeyTtlMs", span);
        }
        if !in_range(self.still_running_patience_ms, 0, MAX_SPAN_MS) {
            return bad(
                "stillRunningPatienceMs",
                "must be between 0 and 9007199254740991",
            );
        }
        if !in_range(self.max_body_bytes, 1, MAX_BODY_BYTES) {
            return bad("maxBodyBytes", "must be between 1 and 268435456 (256 MiB)");
        }
        if !in_range(self.max_records, 1, MAX_RECORDS) {
            return bad("maxRecords", "must be between 1 and 1000000");
        }
        if !in_range(self.max_server_failures, 1, 1000) {
            return bad("maxServerFailures", "must be between 1 and 1000");
        }
        if !in_range(self.replay_concurrency, 1, 32) {
            return bad("replayConcurrency", "must be between 1 and 32");
        }
        if self.replay_headers.iter().any(|h| !is_header_name(h)) {
            return bad("replayHeaders", "must list HTTP header names");
        }
        if self.queue_statuses.len() > MAX_QUEUE_STATUSES
            || self.queue_statuses.iter().any(|s| !(400..=599).contains(s))
        {
            return bad(
                "queueStatuses",
                "must list at most 200 HTTP error statuses (400 to 599)",
            );
        }
        if self.never_queue_pattern.as_deref() == Some("") {
            return bad(
                "neverQueuePattern",
                "must be a non-empty pattern, or null for none",
            );
        }
        if self.build.is_empty() {
            return bad("build", "must not be empty");
        }
        if let Some(u) = &self.shell_url {
            if !self.precache.contains(u) {
                return bad("shellUrl", "must be one of the precache URLs");
            }
        }
        Ok(self)
    }

    /// Whether a page's request header is stored with its record for replays: listed in
    /// `replayHeaders`, and none of the headers that are never stored (credentials, the
    /// CSRF and expected-account headers, hop-by-hop headers).
    pub fn stores_header(&self, name: &str) -> bool {
        let never = NEVER_STORED.iter().any(|n| n.eq_ignore_ascii_case(name))
            || name.eq_ignore_ascii_case(&self.csrf_header)
            || name.eq_ignore_ascii_case(&self.expected_account_header);
        !never
            && self
                .replay_headers
                .iter()
                .any(|h| h.eq_ignore_ascii_case(name))
    }

    /// Whether a first attempt answered `status` is queued as a network failure would be
    /// (contract 2.3, r3): a status in `queueStatuses`, unless the answer says the
    /// server's ledger stored it (`Idempotent-Replayed: true`): then it is the answer to
    /// this key, every resend would get it again, and the page gets it as it is.
    pub fn queues_answer(&self, status: u16, replayed: bool) -> bool {
        !replayed && self.queue_statuses.contains(&status)
    }

    /// The API base without its trailing slash (`/api`): record paths are relative to it.
    pub fn api_base(&self) -> &str {
        self.api_prefix.trim_end_matches('/')
    }
}

/// Bodies are held in memory by the browser while they are stored and sent.
const MAX_BODY_BYTES: u64 = 256 * 1024 * 1024;
/// A queue scan is linear in the records; a million is far past any device's use.
const MAX_RECORDS: u64 = 1_000_000;
/// Every error status fits; a longer list is a mistake.
const MAX_QUEUE_STATUSES: usize = 200;

fn in_range(v: impl Into<u64>, lo: u64, hi: u64) -> bool {
    (lo..=hi).contains(&v.into())
}

fn is_header_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// The package README's configuration table, held to [`Config::default`].
#[cfg(all(test, not(target_arch = "wasm32")))]
#[path = "config_docs.rs"]
mod docs;

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

    /// The default pattern matches exactly a name of [`DEFAULT_AUTH_NAMES`] as a whole
    /// segment after a place of [`DEFAULT_AUTH_PARENTS`], in any case, and nothing else
    /// (so the lists sw.js routes by for `staticRoutes` are the pattern).
    #[test]
    fn default_auth_pattern_is_its_lists() {
        let re = regex::RegexBuilder::new(DEFAULT_AUTH_ROUTE_PATTERN)
            .case_insensitive(true)
            .build()
            .expect("the default pattern compiles");
        let near = ["", "s", "x", "-x", "er", "izer", "ors"];
        let places = ["", "/api", "/accounts", "/app", "/api/v1", "/x/api"];
        let names = DEFAULT_AUTH_NAMES
            .iter()
            .copied()
            .chain(["sign", "oauth2", "tok", "me"]);
        for name in names {
            for suffix in near {
                let segment = format!("{name}{suffix}");
                let listed = DEFAULT_AUTH_NAMES.contains(&segment.as_str());
                for place in places {
                    let routed = listed && DEFAULT_AUTH_PARENTS.contains(&place);
                    for end in ["", "/", "/x", "?a=1"] {
                        for path in [
                            format!("{place}/{segment}{end}"),
                            format!("{place}/{}{end}", segment.to_uppercase()),
                        ] {
                            assert_eq!(re.is_match(&path), routed, "{path}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn defaults_are_the_contracts() {
        let c = Config::default().validate().expect("defaults are valid");
        assert_eq!(c.api_base(), "/api");
        assert_eq!(c.attempt_timeout_ms, 15_000);
        assert_eq!(c.max_body_bytes, 1_048_576);
        assert_eq!(c.max_records, 10_000);
        assert_eq!(c.max_server_failures, 3);
        assert_eq!(c.max_retention_ms, 604_800_000);
        assert_eq!(c.flush_budget_ms, 25_000);
        assert_eq!(c.replay_concurrency, 4);
        assert_eq!(c.server_key_ttl_ms, 86_400_000);
        assert_eq!(c.max_retry_after_ms, 3_600_000);
        assert_eq!(c.still_running_patience_ms, 600_000);
        assert_eq!(c.never_queue_pattern, None);
        assert_eq!(c.replay_headers.len(), 7);
        assert_eq!(c.queue_statuses, [502, 503, 504]);
        assert!(!c.persist_authorization);
        assert!(
            c.skip_waiting,
            "a new version takes over at once, as before r3"
        );
    }

    #[test]
    fn a_gateways_answer_queues_unless_the_ledger_stored_it() {
        let c = Config::default();
        for s in [502, 503, 504] {
            assert!(c.queues_answer(s, false), "{s}");
            assert!(!c.queues_answer(s, true), "{s} replayed by the ledger");
        }
        for s in [200, 201, 400, 401, 409, 422, 500, 501] {
            assert!(!c.queues_answer(s, false), "{s}");
        }
        let none: Config = serde_json::from_str(r#"{"queueStatuses":[]}"#).expect("parses");
        let none = none.validate().expect("[] is valid");
        assert!(!none.queues_answer(502, false), "[] restores pass-through");
        let more: Config = serde_json::from_str(r#"{"queueStatuses":[500,429]}"#).expect("parses");
        let more = more.validate().expect("valid");
        assert!(more.queues_answer(429, false) && more.queues_answer(500, false));
        assert!(!more.queues_answer(502, false));
    }

    #[test]
    fn partial_json_keeps_other_defaults() {
        let c: Config =
            serde_json::from_str(r#"{"attemptTimeoutMs":500,"dbName":"t"}"#).expect("parses");
        assert_eq!(c.attempt_timeout_ms, 500);
        assert_eq!(c.db_name.as_deref(), Some("t"));
        assert_eq!(c.sync_tag, "sw-outbox");
    }

    #[test]
    fn two_scopes_get_two_databases_unless_configured_to_share() {
        assert_eq!(Config::default().db_name, None);
        let root = "https://app.example/";
        let sub = "https://app.example/admin/";
        // An install that had the default keeps it (its scope claims it, or claimed it).
        assert!(owns_default_db(None, sub));
        assert!(owns_default_db(Some(root), root));
        // A second scope of the origin gets a database of its own.
        assert!(!owns_default_db(Some(root), sub));
        assert_eq!(scoped_db_name("/admin/"), "sw-outbox:/admin/");
        assert_ne!(scoped_db_name("/admin/"), DEFAULT_DB_NAME);
        let c: Config = serde_json::from_str(r#"{"dbName":""}"#).expect("parses");
        assert!(c.validate().is_err());
    }

    #[test]
    fn unknown_and_invalid_fields_are_refused() {
        assert!(serde_json::from_str::<Config>(r#"{"attemptTimeout":5}"#).is_err());
        assert!(serde_json::from_str::<Config>(r#"{"maxRecords":"many"}"#).is_err());
        let c: Config = serde_json::from_str(r#"{"apiPrefix":"api"}"#).expect("parses");
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "config.apiPrefix: must start and end with '/'"
        );
        let c: Config = serde_json::from_str(r#"{"replayConcurrency":0}"#).expect("parses");
        assert!(c.validate().is_err());
        let c: Config = serde_json::from_str(r#"{"csrfHeader":"X CSRF"}"#).expect("parses");
        assert!(c.validate().is_err());
    }

    #[test]
    fn every_number_is_range_checked() {
        let refused = |json: &str, field: &str| {
            let c: Config = serde_json::from_str(json).expect("parses");
            let err = c.validate().expect_err(json).to_string();
            assert!(
                err.starts_with(&format!("config.{field}:")),
                "{json}: {err}"
            );
        };
        refused(r#"{"attemptTimeoutMs":2147483648}"#, "attemptTimeoutMs");
        refused(r#"{"attemptTimeoutMs":0}"#, "attemptTimeoutMs");
        refused(r#"{"flushBudgetMs":4294967295}"#, "flushBudgetMs");
        refused(r#"{"maxRetryAfterMs":0}"#, "maxRetryAfterMs");
        refused(r#"{"maxRetryAfterMs":3000000000}"#, "maxRetryAfterMs");
        refused(r#"{"offlineProbeMs":0}"#, "offlineProbeMs");
        refused(r#"{"maxRetentionMs":0}"#, "maxRetentionMs");
        refused(r#"{"maxRetentionMs":9007199254740992}"#, "maxRetentionMs");
        refused(r#"{"serverKeyTtlMs":0}"#, "serverKeyTtlMs");
        refused(
            r#"{"stillRunningPatienceMs":9007199254740992}"#,
            "stillRunningPatienceMs",
        );
        refused(r#"{"maxBodyBytes":0}"#, "maxBodyBytes");
        refused(r#"{"maxBodyBytes":268435457}"#, "maxBodyBytes");
        refused(r#"{"maxRecords":1000001}"#, "maxRecords");
        refused(r#"{"maxServerFailures":1001}"#, "maxServerFailures");
        refused(r#"{"replayConcurrency":33}"#, "replayConcurrency");
        refused(r#"{"replayHeaders":["If Match"]}"#, "replayHeaders");
        refused(r#"{"neverQueuePattern":""}"#, "neverQueuePattern");
        refused(r#"{"build":""}"#, "build");
        refused(r#"{"queueStatuses":[201]}"#, "queueStatuses");
        refused(r#"{"queueStatuses":[600]}"#, "queueStatuses");
        refused(r#"{"queueStatuses":[302]}"#, "queueStatuses");
        for ok in [
            r#"{"attemptTimeoutMs":2147483647}"#,
            r#"{"maxRetryAfterMs":1}"#,
            r#"{"serverKeyTtlMs":9007199254740991}"#,
            r#"{"stillRunningPatienceMs":0}"#,
            r#"{"neverQueuePattern":"/merge$"}"#,
            r#"{"replayHeaders":[]}"#,
        ] {
            let c: Config = serde_json::from_str(ok).expect("parses");
            assert!(c.validate().is_ok(), "{ok}");
        }
        // Out of the field's type altogether: refused by the reader.
        assert!(serde_json::from_str::<Config>(r#"{"attemptTimeoutMs":-1}"#).is_err());
        assert!(serde_json::from_str::<Config>(r#"{"attemptTimeoutMs":1.5}"#).is_err());
        // A flag is a boolean, not a truthy value: "false" would read as a prompt nobody wrote.
        assert!(serde_json::from_str::<Config>(r#"{"staticRoutes":"true"}"#).is_err());
        assert!(serde_json::from_str::<Config>(r#"{"staticRoutes":1}"#).is_err());
        let c: Config = serde_json::from_str(r#"{"staticRoutes":true}"#).expect("parses");
        assert!(c.validate().expect("valid").static_routes);
        assert!(
            !Config::default().static_routes,
            "the default is false (contract 1, r4)"
        );
        assert!(serde_json::from_str::<Config>(r#"{"skipWaiting":"false"}"#).is_err());
        assert!(serde_json::from_str::<Config>(r#"{"skipWaiting":0}"#).is_err());
        let c: Config = serde_json::from_str(r#"{"skipWaiting":false}"#).expect("parses");
        assert!(!c.validate().expect("valid").skip_waiting);
    }

    #[test]
    fn replay_headers_never_include_credentials_or_the_workers_own() {
        let c = Config::default();
        for stored in ["If-Match", "if-none-match", "Accept-Language"] {
            assert!(c.stores_header(stored), "{stored}");
        }
        assert!(!c.stores_header("X-Custom"), "not listed");
        let c = Config {
            replay_headers: [
                "Cookie",
                "Authorization",
                "Proxy-Authorization",
                "X-CSRF-Token",
                "X-PM-Expected-Account",
                "Idempotency-Key",
                "Connection",
                "Transfer-Encoding",
                "Content-Type",
                "X-Custom",
            ]
            .iter()
            .map(|h| (*h).into())
            .collect(),
            ..Config::default()
        };
        let c = c.validate().expect("listing them is allowed");
        for never in &c.replay_headers[..9] {
            assert!(!c.stores_header(never), "{never}");
        }
        assert!(c.stores_header("x-custom"));
    }
}
