//! What is intercepted (contract section 1) and which workspace a write belongs to
//! (section 3).
//!
//! [`owner`] is the one statement of "is this request the outbox's" (r3): it reads the
//! configuration and the request's method, URL and mode, nothing else, so `www/sw.js`
//! can decide it synchronously before the module has loaded. sw.js holds a JavaScript
//! mirror of it (`swOutboxRoute`), which `tests/service_worker_route.rs` runs beside this
//! function over every route class, in each engine.
//!
//! The two patterns of the configuration are JavaScript regular expressions, so in the
//! browser they are compiled by the browser's own engine (exact JavaScript semantics, no
//! regex engine shipped in the module). The core only needs "does it match" and "what is
//! capture group 1", which is the [`Patterns`] trait.

use super::config::Config;
use super::shell::{self, ShellRequest};

/// The two configured patterns, compiled by whoever hosts the core.
pub trait Patterns {
    /// `authRoutePattern`, case-insensitive, against the path and query.
    fn is_auth_route(&self, path_and_query: &str) -> bool;
    /// `workspacePattern` against a record path (relative to the API base): group 1.
    fn workspace(&self, record_path: &str) -> Option<String>;
    /// `neverQueuePattern` against the path and query (`false` when none is set).
    fn never_queue(&self, path_and_query: &str) -> bool;
}

/// HTTP methods the outbox treats as writes.
pub const WRITE_METHODS: [&str; 4] = ["POST", "PUT", "PATCH", "DELETE"];

pub fn is_write_method(method: &str) -> bool {
    WRITE_METHODS.iter().any(|m| m.eq_ignore_ascii_case(method))
}

/// What the outbox does with a request a page made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestKind {
    /// Not the outbox's business: the browser handles it.
    Passthrough,
    /// GET/HEAD/OPTIONS under the prefix: network only, never cached; 503 offline JSON
    /// when the network fails.
    ApiRead,
    /// An auth route: straight to the network without the outbox's headers, never queued.
    AuthRoute,
    /// A write the outbox owns: first attempt, then queue on failure.
    Write {
        /// Path and query relative to the API base, as stored in the record.
        record_path: String,
        workspace: Option<String>,
        /// `neverQueuePattern` matched: sent like any other write, never queued (2.9).
        never_queue: bool,
    },
}

/// Who answers a request: decided from the configuration and the request alone (the
/// browser-side facts in [`ShellRequest`]), before anything is loaded or read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner<'c> {
    /// Not the outbox's: no `respondWith`; the browser, or another library's listener,
    /// handles it as if the outbox were not there.
    NotOurs,
    /// A write under `apiPrefix` (the module's: first attempt, queue).
    Write,
    /// A read under `apiPrefix`: network only; `503 {"error":"offline"}` when it fails.
    Read,
    /// An auth route: to the network without the outbox's headers, never queued.
    AuthRoute,
    /// The app shell's (section 9): network first, this cached URL when the network
    /// fails or answers a server error.
    Shell(&'c str),
    /// An auth route outside `apiPrefix` (r4: a `/login` form post, an OAuth callback):
    /// only observed. It raises the sign-in barrier and is otherwise left to the network
    /// and the site's own listeners (no `respondWith`), before the shell's rule: a
    /// sign-in page is never answered from the cache.
    ObservedAuth,
}

/// Whether the outbox answers this request, and how (contract 1, r3, r4; section 9).
/// Under `apiPrefix` it is [`classify`]'s kind; elsewhere a same-origin path matching
/// `authRoutePattern` is observed, else the shell's ([`shell::fallback_for`]); anything
/// else is not the outbox's.
pub fn owner<'c>(req: &ShellRequest<'_>, config: &'c Config, patterns: &dyn Patterns) -> Owner<'c> {
    match classify(req.method, req.same_origin, req.path, config, patterns) {
        RequestKind::Write { .. } => Owner::Write,
        RequestKind::ApiRead => Owner::Read,
        RequestKind::AuthRoute => Owner::AuthRoute,
        RequestKind::Passthrough if req.same_origin && patterns.is_auth_route(req.path) => {
            Owner::ObservedAuth
        }
        RequestKind::Passthrough => match shell::fallback_for(req, config) {
            Some(url) => Owner::Shell(url),
            None => Owner::NotOurs,
        },
    }
}

/// Whether a request raises the sign-in barrier (contract 4.5, r3, r4): an auth route
/// under `apiPrefix` (sent by the worker) or one outside it (observed only).
pub fn raises_barrier(owner: &Owner<'_>) -> bool {
    matches!(owner, Owner::AuthRoute | Owner::ObservedAuth)
}

/// Decides the kind of a request from its method, whether it is same-origin, and its
/// path with query (`/api/projects/1/tasks?x=1`).
pub fn classify(
    method: &str,
    same_origin: bool,
    path_and_query: &str,
    config: &Config,
    patterns: &dyn Patterns,
) -> RequestKind {
    if !same_origin || !path_and_query.starts_with(config.api_prefix.as_str()) {
        return RequestKind::Passthrough;
    }
    if patterns.is_auth_route(path_and_query) {
        return RequestKind::AuthRoute;
    }
    if !is_write_method(method) {
        return RequestKind::ApiRead;
    }
    let record_path = record_path(path_and_query, config).to_owned();
    let workspace = patterns.workspace(&record_path);
    RequestKind::Write {
        record_path,
        workspace,
        never_queue: patterns.never_queue(path_and_query),
    }
}

/// The record's `path`: the request path and query without the API base (`/api`).
pub fn record_path<'a>(path_and_query: &'a str, config: &Config) -> &'a str {
    path_and_query
        .strip_prefix(config.api_base())
        .unwrap_or(path_and_query)
}

/// The URL path a replay is sent to: the API base followed by the record's path.
pub fn replay_path(record_path: &str, config: &Config) -> String {
    format!("{}{}", config.api_base(), record_path)
}

/// Whether a stored record targets an auth route (possible only for records written by
/// another version); such records are never sent.
pub fn record_is_auth_route(record_path: &str, config: &Config, patterns: &dyn Patterns) -> bool {
    patterns.is_auth_route(&replay_path(record_path, config))
}

/// Patterns compiled with the `regex` crate: the host-side stand-in for the browser's
/// RegExp, used by the core's tests (the default patterns mean the same in both).
#[cfg(all(test, not(target_arch = "wasm32")))]
pub mod test_patterns {
    use super::*;

    pub struct RegexPatterns {
        auth: regex::Regex,
        workspace: regex::Regex,
        never_queue: Option<regex::Regex>,
    }

    impl RegexPatterns {
        pub fn new(config: &Config) -> Self {
            RegexPatterns {
                auth: regex::RegexBuilder::new(&config.auth_route_pattern)
                    .case_insensitive(true)
                    .build()
                    .expect("auth pattern compiles"),
                workspace: regex::Regex::new(&config.workspace_pattern)
                    .expect("workspace pattern compiles"),
                never_queue: config
                    .never_queue_pattern
                    .as_deref()
                    .map(|p| regex::Regex::new(p).expect("never-queue pattern compiles")),
            }
        }

        pub fn defaults() -> Self {
            Self::new(&Config::default())
        }
    }

    impl Patterns for RegexPatterns {
        fn is_auth_route(&self, path_and_query: &str) -> bool {
            self.auth.is_match(path_and_query)
        }
        fn workspace(&self, record_path: &str) -> Option<String> {
            self.workspace
                .captures(record_path)
                .and_then(|c| c.get(1))
                .map(|m| m.as_str().to_owned())
        }
        fn never_queue(&self, path_and_query: &str) -> bool {
            self.never_queue
                .as_ref()
                .is_some_and(|r| r.is_match(path_and_query))
        }
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::test_patterns::RegexPatterns;
    use super::*;

    fn kind(method: &str, path: &str) -> RequestKind {
        classify(
            method,
            true,
            path,
            &Config::default(),
            &RegexPatterns::defaults(),
        )
    }

    #[test]
    fn writes_under_the_prefix_are_the_outboxs() {
        for m in ["POST", "PUT", "PATCH", "DELETE", "post", "Patch"] {
            assert_eq!(
                kind(m, "/api/projects/42/tasks?x=1"),
                RequestKind::Write {
                    record_path: "/projects/42/tasks?x=1".into(),
                    workspace: Some("42".into()),
                    never_queue: false,
                },
                "{m}"
            );
        }
        assert_eq!(
            kind("POST", "/api/notes"),
            RequestKind::Write {
                record_path: "/notes".into(),
                workspace: None,
                never_queue: false,
            }
        );
    }

    #[test]
    fn never_queue_writes_are_still_writes() {
        let c = Config {
            never_queue_pattern: Some(r"/(merge|close)$".into()),
            ..Config::default()
        };
        let p = RegexPatterns::new(&c);
        let k = classify("POST", true, "/api/projects/1/merge", &c, &p);
        assert_eq!(
            k,
            RequestKind::Write {
                record_path: "/projects/1/merge".into(),
                workspace: Some("1".into()),
                never_queue: true,
            }
        );
        assert!(matches!(
            classify("POST", true, "/api/projects/1/tasks", &c, &p),
            RequestKind::Write {
                never_queue: false,
                ..
            }
        ));
        // Auth routes and reads are not writes, whatever the pattern says.
        assert_eq!(
            classify("GET", true, "/api/projects/1/merge", &c, &p),
            RequestKind::ApiRead
        );
    }

    #[test]
    fn reads_are_network_only() {
        for m in ["GET", "HEAD", "OPTIONS"] {
            assert_eq!(kind(m, "/api/projects/1/tasks"), RequestKind::ApiRead);
        }
    }

    #[test]
    fn auth_routes_are_detected_case_insensitively() {
        for p in [
            "/api/auth",
            "/api/auth/",
            "/api/auth/login",
            "/api/auth?next=1",
            "/api/AUTH/me",
            "/api/Auth/logout",
        ] {
            assert_eq!(kind("POST", p), RequestKind::AuthRoute, "{p}");
        }
        assert!(RegexPatterns::defaults().is_auth_route("/API/AUTH/me"));
        assert_eq!(kind("GET", "/api/auth/me"), RequestKind::AuthRoute);
        assert_ne!(kind("POST", "/api/authors"), RequestKind::AuthRoute);
        assert_ne!(kind("POST", "/api/authentic/x"), RequestKind::AuthRoute);
    }

    /// The default `authRoutePattern` (r4) against the contract's list: each name as a
    /// path's first segment, or its second after `/api/` or `/accounts/`; whole segments
    /// only. Each non-match is a choice written down in docs/PROTOCOL.md.
    #[test]
    fn the_default_auth_pattern_covers_the_usual_sign_in_and_token_routes() {
        let p = RegexPatterns::defaults();
        let names = [
            "auth", "login", "logout", "signin", "signout", "sign-in", "sign-out", "session",
            "sessions", "token", "tokens", "refresh", "oauth",
        ];
        for name in names {
            for base in ["", "/api", "/accounts"] {
                for tail in ["", "/", "/x/y", "?next=/", "/callback?code=1"] {
                    let path = format!("{base}/{name}{tail}");
                    assert!(p.is_auth_route(&path), "{path} is an auth route");
                    let upper = path.to_ascii_uppercase();
                    assert!(p.is_auth_route(&upper), "{upper}: case-insensitive");
                }
            }
        }
        for path in [
            "/api/tokenizer",
            "/api/authors",
            "/api/logins",
            "/api/refreshments",
            "/api/oauth2/callback",
            "/api/projects/1/sessions",
            "/api/projects/1/tokens",
            "/api/accounts/login",
            "/api/v1/login",
            "/v1/api/login",
            "/accountslogin",
            "/apilogin",
            "/blog/login-tips",
            "/login.html",
            "/api/sign_in",
            "/api/notes?next=/login",
            "/",
            "/api/",
        ] {
            assert!(!p.is_auth_route(path), "{path} is not an auth route");
        }
        // The contract's bearer app: sign-in and refresh under the API are auth routes,
        // never writes (never queued).
        assert_eq!(kind("POST", "/api/login"), RequestKind::AuthRoute);
        assert_eq!(kind("POST", "/api/refresh"), RequestKind::AuthRoute);
        assert_eq!(kind("POST", "/api/auth/me"), RequestKind::AuthRoute);
        assert!(matches!(
            kind("POST", "/api/projects/1/sessions"),
            RequestKind::Write { .. }
        ));
    }

    #[test]
    fn auth_routes_outside_the_prefix_are_observed_never_answered() {
        let c = Config {
            precache: vec![
                "https://a.example/".into(),
                "https://a.example/login".into(),
            ],
            ..Config::default()
        };
        let p = RegexPatterns::new(&c);
        let at = |method, navigate, path| {
            let url = format!("https://a.example{path}");
            owner(&request(method, navigate, path, &url), &c, &p)
        };
        for (method, navigate, path) in [
            ("POST", true, "/login"),
            ("GET", true, "/login"),
            ("GET", true, "/oauth/callback?code=1"),
            ("POST", false, "/accounts/logout/"),
            ("GET", false, "/auth"),
        ] {
            let o = at(method, navigate, path);
            assert_eq!(o, Owner::ObservedAuth, "{method} {path}");
            assert!(raises_barrier(&o));
        }
        assert!(raises_barrier(&at("POST", false, "/api/login")));
        assert!(!raises_barrier(&at("POST", false, "/api/notes")));
        assert!(!raises_barrier(&at("GET", true, "/projects/1")));
        // Another origin's sign-in is nobody's business here.
        let other = ShellRequest {
            same_origin: false,
            ..request("POST", true, "/login", "https://b.example/login")
        };
        assert_eq!(owner(&other, &c, &p), Owner::NotOurs);
    }

    #[test]
    fn outside_the_prefix_or_origin_is_passthrough() {
        assert_eq!(kind("POST", "/apix/tasks"), RequestKind::Passthrough);
        assert_eq!(kind("POST", "/index.html"), RequestKind::Passthrough);
        assert_eq!(kind("GET", "/api"), RequestKind::Passthrough);
        let c = Config::default();
        assert_eq!(
            classify("POST", false, "/api/notes", &c, &RegexPatterns::defaults()),
            RequestKind::Passthrough
        );
    }

    fn request<'a>(
        method: &'a str,
        navigate: bool,
        path: &'a str,
        url: &'a str,
    ) -> ShellRequest<'a> {
        ShellRequest {
            navigate,
            same_origin: true,
            method,
            path,
            url,
        }
    }

    #[test]
    fn the_owner_is_the_api_the_shell_or_nobody() {
        let c = Config {
            precache: vec![
                "https://a.example/".into(),
                "https://a.example/app.js".into(),
            ],
            ..Config::default()
        };
        let p = RegexPatterns::new(&c);
        let at = |method, navigate, path| {
            let url = format!("https://a.example{path}");
            owner(&request(method, navigate, path, &url), &c, &p)
        };
        assert_eq!(at("POST", false, "/api/notes"), Owner::Write);
        assert_eq!(at("GET", false, "/api/notes"), Owner::Read);
        assert_eq!(at("GET", true, "/api/auth/login"), Owner::AuthRoute);
        assert_eq!(
            at("GET", true, "/projects/1"),
            Owner::Shell("https://a.example/")
        );
        assert_eq!(
            at("GET", false, "/app.js"),
            Owner::Shell("https://a.example/app.js")
        );
        assert_eq!(at("GET", false, "/other.js"), Owner::NotOurs);
        assert_eq!(
            at("GET", true, "/api"),
            Owner::NotOurs,
            "the API base is neither"
        );
        assert_eq!(at("POST", true, "/form"), Owner::NotOurs);
        let other = ShellRequest {
            same_origin: false,
            ..request("POST", false, "/api/notes", "https://b.example/api/notes")
        };
        assert_eq!(owner(&other, &c, &p), Owner::NotOurs);
        // Without a shell, navigations are nobody's.
        let bare = Config::default();
        assert_eq!(
            owner(&request("GET", true, "/", "https://a.example/"), &bare, &p),
            Owner::NotOurs
        );
    }

    #[test]
    fn workspace_is_the_first_segment_after_projects() {
        let p = RegexPatterns::defaults();
        assert_eq!(p.workspace("/projects/a-b/tasks/3"), Some("a-b".into()));
        assert_eq!(p.workspace("/projects/7?x=1"), Some("7".into()));
        assert_eq!(p.workspace("/projects/"), None);
        assert_eq!(p.workspace("/notes/projects/1"), None);
        assert_eq!(p.workspace("/projectsx/1"), None);
    }

    #[test]
    fn replay_path_restores_the_base() {
        let c = Config::default();
        assert_eq!(
            replay_path("/projects/1/tasks?a=b", &c),
            "/api/projects/1/tasks?a=b"
        );
        assert_eq!(record_path("/api/notes", &c), "/notes");
    }
}
