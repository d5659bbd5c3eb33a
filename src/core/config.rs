//! The configuration `www/sw.js` passes to the outbox (contract section 7).
//!
//! Every default lives here and nowhere else; the shell and the docs read them from
//! [`Config::default`].

use serde::Deserialize;

/// One outbox's configuration. Field names are the contract's (camelCase in JavaScript).
#[derive(Debug, Clone, PartialEq, Deserialize)]
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
    pub db_name: String,
    pub sync_tag: String,
    pub attempt_timeout_ms: u32,
    pub max_body_bytes: u32,
    pub max_records: u32,
    pub max_server_failures: u32,
    pub max_retention_ms: u64,
    pub flush_budget_ms: u32,
    pub replay_concurrency: u32,
    /// App-shell URLs cached at install (section 9).
    pub precache: Vec<String>,
    /// The precached URL answered for navigations that fail (section 9); `None`: the
    /// first `precache` entry that is a page (`core::shell::shell_url`).
    pub shell_url: Option<String>,
    /// Where a click on a delivery notification opens the app when no window is open.
    pub notification_url: String,
    /// Cache-name suffix naming this build; `www/sw.js` sets it from the build id.
    pub build: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            api_prefix: "/api/".into(),
            auth_route_pattern: r"^/api/auth(/|\?|$)".into(),
            auth_me_path: "/api/auth/me".into(),
            expected_account_header: "X-PM-Expected-Account".into(),
            csrf_header: "X-CSRF-Token".into(),
            workspace_pattern: r"^/projects/([^/?#]+)".into(),
            db_name: "sw-outbox".into(),
            sync_tag: "sw-outbox".into(),
            attempt_timeout_ms: 15_000,
            max_body_bytes: 1024 * 1024,
            max_records: 10_000,
            max_server_failures: 3,
            max_retention_ms: 7 * 24 * 60 * 60 * 1000,
            flush_budget_ms: 25_000,
            replay_concurrency: 4,
            precache: Vec::new(),
            shell_url: None,
            notification_url: "/".into(),
            build: "dev".into(),
        }
    }
}

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
        if self.db_name.is_empty() {
            return bad("dbName", "must not be empty");
        }
        if self.sync_tag.is_empty() {
            return bad("syncTag", "must not be empty");
        }
        if self.attempt_timeout_ms == 0 {
            return bad("attemptTimeoutMs", "must be positive");
        }
        if self.max_records == 0 {
            return bad("maxRecords", "must be positive");
        }
        if self.max_server_failures == 0 {
            return bad("maxServerFailures", "must be positive");
        }
        if self.flush_budget_ms == 0 {
            return bad("flushBudgetMs", "must be positive");
        }
        if self.replay_concurrency == 0 || self.replay_concurrency > 32 {
            return bad("replayConcurrency", "must be between 1 and 32");
        }
        if let Some(u) = &self.shell_url {
            if !self.precache.contains(u) {
                return bad("shellUrl", "must be one of the precache URLs");
            }
        }
        Ok(self)
    }

    /// The API base without its trailing slash (`/api`): record paths are relative to it.
    pub fn api_base(&self) -> &str {
        self.api_prefix.trim_end_matches('/')
    }
}

fn is_header_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

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
    }

    #[test]
    fn partial_json_keeps_other_defaults() {
        let c: Config =
            serde_json::from_str(r#"{"attemptTimeoutMs":500,"dbName":"t"}"#).expect("parses");
        assert_eq!(c.attempt_timeout_ms, 500);
        assert_eq!(c.db_name, "t");
        assert_eq!(c.sync_tag, "sw-outbox");
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
}
