//! The app shell (contract section 9): which requests the worker answers for the shell
//! (navigations, and the precached files of the shell), when the cached copy replaces
//! the network's answer, which cached URL the shell is, and which caches are stale.
//!
//! Plain values in, plain values out: the browser side (`worker::shell`) reads the
//! request's mode, origin, method, path and URL, and the network's outcome, and asks
//! here.

use super::config::Config;

/// Every cache this product creates starts with this; activation deletes only caches
/// with this prefix that are not the current build's. `www/sw.js` uses the same prefix.
pub const CACHE_PREFIX: &str = "sw-outbox-";

/// The Web Lock under which the caches of this origin's builds are checked, created,
/// added to and deleted (`www/sw.js`'s `CACHES_LOCK`, the same name): a worker being
/// replaced must not bring back, by opening it, the cache its successor's activation
/// just deleted. It is held only while caches are touched, never across a fetch.
pub const CACHES_LOCK: &str = "sw-outbox:caches";

/// The versioned cache of one build: `sw-outbox-<build>`.
pub fn cache_name(build: &str) -> String {
    format!("{CACHE_PREFIX}{build}")
}

/// Whether a cache is an older build's of this product (deleted at activation). Other
/// sites' and libraries' caches are never touched.
pub fn is_stale_cache(name: &str, build: &str) -> bool {
    name.starts_with(CACHE_PREFIX) && name != cache_name(build)
}

/// What the request looks like, as far as the shell cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShellRequest<'a> {
    /// `request.mode == "navigate"`: a top-level or frame navigation.
    pub navigate: bool,
    pub same_origin: bool,
    pub method: &'a str,
    /// Path with query.
    pub path: &'a str,
    /// The whole URL, as `precache` entries are written (`sw.js` makes them absolute).
    pub url: &'a str,
}

/// The cached URL that answers this request when the network fails, or `None` when
/// the request is not the shell's business (then the worker does not intercept it):
///
/// - a same-origin GET navigation outside `apiPrefix` → the shell ([`shell_url`]);
/// - a same-origin GET of a `precache` URL (the shell's own scripts, styles, icons) →
///   that URL, so a shell answered offline can load what it needs.
///
/// Both go to the network first; nothing else is ever answered from a cache.
pub fn fallback_for<'a>(req: &ShellRequest<'_>, config: &'a Config) -> Option<&'a str> {
    if !req.same_origin || !req.method.eq_ignore_ascii_case("GET") || under_api(req.path, config) {
        return None;
    }
    if req.navigate {
        return shell_url(config);
    }
    let url = req.url.split('#').next().unwrap_or(req.url);
    config
        .precache
        .iter()
        .map(String::as_str)
        .find(|u| *u == url)
}

/// Whether the worker intercepts this request for the shell.
pub fn handles(req: &ShellRequest<'_>, config: &Config) -> bool {
    fallback_for(req, config).is_some()
}

/// `apiPrefix` and everything under it, and the API base itself (`/api`, `/api?…`):
/// API answers are never replaced by the shell.
fn under_api(path: &str, config: &Config) -> bool {
    path.starts_with(&config.api_prefix)
        || path
            .strip_prefix(config.api_base())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('?'))
}

/// What the network did with a navigation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkOutcome {
    /// No answer: offline, refused, reset.
    Failed,
    /// An answer with this status (0 for an opaque redirect).
    Status(u16),
}

/// Whether the cached shell answers instead of the network: on a network failure, and
/// on the server errors a proxy or a struggling server gives (500, 502, 503, 504). Any
/// other answer, 404 included, is the page's.
pub fn use_shell(outcome: NetworkOutcome) -> bool {
    match outcome {
        NetworkOutcome::Failed => true,
        NetworkOutcome::Status(s) => SHELL_STATUSES.contains(&s),
    }
}

/// The server errors after which the shell's cached copy answers ([`use_shell`]); also
/// written into `www/sw.js`, which answers the shell before the module loads
/// (tests/sw_rules.rs).
pub const SHELL_STATUSES: [u16; 4] = [500, 502, 503, 504];

/// The cached URL that is the shell: `shellUrl` when set, else the first `precache`
/// entry that is a page (ends with `/`, `.html` or `.htm`, or has no file extension).
/// `None` when there is none: navigations are then not intercepted at all.
pub fn shell_url(config: &Config) -> Option<&str> {
    if let Some(u) = &config.shell_url {
        return Some(u);
    }
    config
        .precache
        .iter()
        .map(String::as_str)
        .find(|u| is_page(u))
}

/// Whether a URL names a page rather than an asset, by its path's last segment.
pub fn is_page(url: &str) -> bool {
    let path = url.split(['?', '#']).next().unwrap_or("");
    // The path of an absolute URL starts after "scheme://host".
    let path = match super::text::find(path, "://") {
        Some(i) => path[i + 3..].find('/').map_or("/", |j| &path[i + 3 + j..]),
        None => path,
    };
    let last = path.rsplit('/').next().unwrap_or("");
    if last.is_empty() || last == "." {
        return true;
    }
    let lower = last.to_ascii_lowercase();
    lower.ends_with(".html") || lower.ends_with(".htm") || !last.contains('.')
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

    fn with_precache(urls: &[&str]) -> Config {
        Config {
            precache: urls.iter().map(|u| u.to_string()).collect(),
            ..Config::default()
        }
    }

    fn nav(path: &str) -> ShellRequest<'_> {
        ShellRequest {
            navigate: true,
            same_origin: true,
            method: "GET",
            path,
            url: path,
        }
    }

    #[test]
    fn same_origin_get_navigations_outside_the_api_are_the_shells() {
        let c = with_precache(&["/", "/app.js"]);
        assert!(handles(&nav("/"), &c));
        assert!(handles(&nav("/projects/p1?tab=2"), &c));
        assert!(
            handles(&nav("/apiary"), &c),
            "only the prefix /api/ is the API"
        );
    }

    #[test]
    fn other_requests_are_not() {
        let c = with_precache(&["/index.html", "/app.js"]);
        assert!(!handles(
            &ShellRequest {
                navigate: false,
                ..nav("/")
            },
            &c
        ));
        assert!(!handles(
            &ShellRequest {
                same_origin: false,
                ..nav("/")
            },
            &c
        ));
        assert!(!handles(
            &ShellRequest {
                method: "POST",
                ..nav("/")
            },
            &c
        ));
        assert!(!handles(
            &ShellRequest {
                method: "HEAD",
                ..nav("/")
            },
            &c
        ));
        assert!(!handles(&nav("/api/projects"), &c));
        assert!(!handles(&nav("/api"), &c));
        assert!(!handles(&nav("/api?x=1"), &c));
        assert!(handles(
            &ShellRequest {
                method: "get",
                ..nav("/")
            },
            &c
        ));
    }

    #[test]
    fn precached_assets_fall_back_to_their_own_copy_nothing_else_does() {
        let c = with_precache(&["https://a.example/", "https://a.example/app.js"]);
        let asset = |url| ShellRequest {
            navigate: false,
            same_origin: true,
            method: "GET",
            path: "/app.js",
            url,
        };
        assert_eq!(
            fallback_for(&asset("https://a.example/app.js"), &c),
            Some("https://a.example/app.js")
        );
        assert_eq!(
            fallback_for(&asset("https://a.example/app.js#x"), &c),
            Some("https://a.example/app.js")
        );
        assert_eq!(
            fallback_for(&asset("https://a.example/app.js?v=2"), &c),
            None
        );
        assert_eq!(fallback_for(&asset("https://a.example/other.js"), &c), None);
        let post = ShellRequest {
            method: "POST",
            ..asset("https://a.example/app.js")
        };
        assert_eq!(fallback_for(&post, &c), None);
        // A navigation anywhere outside the API answers with the shell.
        let deep = ShellRequest {
            url: "https://a.example/projects/p1",
            ..nav("/projects/p1")
        };
        assert_eq!(fallback_for(&deep, &c), Some("https://a.example/"));
    }

    #[test]
    fn api_urls_are_never_the_shells_even_when_listed() {
        let c = with_precache(&["/", "/api/projects"]);
        let read = ShellRequest {
            navigate: false,
            ..nav("/api/projects")
        };
        assert!(!handles(&read, &c));
    }

    #[test]
    fn without_a_precached_page_nothing_is_intercepted() {
        assert!(!handles(&nav("/"), &Config::default()));
        assert!(!handles(
            &nav("/"),
            &with_precache(&["/app.js", "/app.css"])
        ));
    }

    #[test]
    fn failures_and_server_errors_fall_back_other_answers_do_not() {
        assert!(use_shell(NetworkOutcome::Failed));
        for s in [500, 502, 503, 504] {
            assert!(use_shell(NetworkOutcome::Status(s)), "{s}");
        }
        for s in [0, 200, 204, 301, 304, 400, 401, 404, 410, 501, 505, 599] {
            assert!(!use_shell(NetworkOutcome::Status(s)), "{s}");
        }
    }

    #[test]
    fn the_shell_is_shell_url_or_the_first_precached_page() {
        let c = with_precache(&["/app.js", "/index.html", "/"]);
        assert_eq!(shell_url(&c), Some("/index.html"));
        let c = with_precache(&["https://a.example/app.css", "https://a.example/"]);
        assert_eq!(shell_url(&c), Some("https://a.example/"));
        let c = Config {
            shell_url: Some("/offline".into()),
            ..with_precache(&["/", "/offline"])
        };
        assert_eq!(shell_url(&c), Some("/offline"));
        assert_eq!(shell_url(&with_precache(&[])), None);
    }

    #[test]
    fn pages_are_told_from_assets_by_the_last_segment() {
        for p in [
            "/",
            "./",
            ".",
            "/index.html",
            "/INDEX.HTM",
            "/app/shell",
            "https://a.example",
            "https://a.example/",
            "https://a.example/start?x=1.js",
            "http://127.0.0.1:8080/",
        ] {
            assert!(is_page(p), "{p}");
        }
        for p in [
            "/app.js",
            "/app.css",
            "./icon.svg",
            "https://a.example/m.webmanifest",
        ] {
            assert!(!is_page(p), "{p}");
        }
    }

    #[test]
    fn shell_url_is_a_config_field_that_must_be_precached() {
        let c: Config = serde_json::from_str(r#"{"precache":["/","/offline.html"]}"#).unwrap();
        assert_eq!(c.shell_url, None, "defaults to the first precached page");
        let c = c.validate().expect("valid");
        assert_eq!(shell_url(&c), Some("/"));
        let c: Config = serde_json::from_str(
            r#"{"precache":["/","/offline.html"],"shellUrl":"/offline.html"}"#,
        )
        .unwrap();
        assert_eq!(
            shell_url(&c.validate().expect("valid")),
            Some("/offline.html")
        );
        let c: Config =
            serde_json::from_str(r#"{"precache":["/"],"shellUrl":"/nope.html"}"#).unwrap();
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "config.shellUrl: must be one of the precache URLs"
        );
        assert!(serde_json::from_str::<Config>(r#"{"shellURL":"/"}"#).is_err());
    }

    #[test]
    fn only_older_caches_of_this_product_are_stale() {
        assert_eq!(cache_name("abc"), "sw-outbox-abc");
        assert!(is_stale_cache("sw-outbox-old", "abc"));
        assert!(!is_stale_cache("sw-outbox-abc", "abc"));
        assert!(!is_stale_cache("workbox-precache-v2", "abc"));
        assert!(!is_stale_cache("my-app-sw-outbox-old", "abc"));
    }
}
