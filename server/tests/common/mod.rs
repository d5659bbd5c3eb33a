//! A server on a loopback port and a deliberately minimal HTTP/1.1 client over a raw
//! `TcpStream`: the tests must be able to see "no answer at all", which a full client
//! library would turn into an error type we'd have to trust.

#![allow(dead_code)]

#[path = "../../idempotency/tests/support/pg.rs"]
pub mod pg;

use serde_json::Value;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use sw_outbox_idempotency::{Settings, SettingsBuilder};
use sw_outbox_server::{Config, Mode, RunningServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Short ledger bounds so state transitions happen in test time (never asserted as
/// durations), on top of the reference server's settings (which also store `ETag`).
pub fn fast_settings() -> Settings {
    fast().build().expect("valid settings")
}

/// [`fast_settings`] to change further.
pub fn fast() -> SettingsBuilder {
    Config::for_mode(Mode::Test)
        .idempotency
        .to_builder()
        .in_progress_wait(Duration::from_millis(300))
        .in_progress_poll(Duration::from_millis(20))
        .stale_after(Duration::from_millis(600))
        .heartbeat_every(Duration::from_millis(100))
        .key_ttl(Duration::from_secs(3600))
}

pub fn www_dir() -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "sw-outbox-server-test-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(dir.join("pkg")).expect("mkdir");
    std::fs::write(dir.join("index.html"), "<!doctype html><title>t</title>").expect("write");
    std::fs::write(dir.join("sw.js"), "self.x = 1;").expect("write");
    std::fs::write(dir.join("app.mjs"), "export {};").expect("write");
    std::fs::write(dir.join("manifest.webmanifest"), "{}").expect("write");
    std::fs::write(dir.join("pkg/app.wasm"), b"\0asm\x01\0\0\0").expect("write");
    dir
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// A server's configuration for the tests: loopback, a free port, in memory, `settings`.
pub fn test_config(settings: Settings, mode: Mode) -> Config {
    Config {
        port: 0,
        www: www_dir(),
        db: ":memory:".into(),
        idempotency: settings,
        shutdown_grace: Duration::from_millis(200),
        ..Config::for_mode(mode)
    }
}

pub async fn start(settings: Settings) -> RunningServer {
    start_with(settings, Mode::Test).await
}

pub async fn start_with(settings: Settings, mode: Mode) -> RunningServer {
    start_config(test_config(settings, mode)).await
}

pub async fn start_config(config: Config) -> RunningServer {
    sw_outbox_server::spawn(config)
        .await
        .expect("server starts")
}

/// Where the idempotency ledger lives; the same test cases run on each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A test-mode server with its ledger on `backend` (a fresh PostgreSQL database each time);
/// `None` when PostgreSQL tests are skipped.
pub async fn start_on(backend: Backend, settings: Settings) -> Option<RunningServer> {
    let mut config = test_config(settings, Mode::Test);
    if backend == Backend::Postgres {
        config.ledger = Some(pg::server()?.fresh_database().await);
    }
    Some(start_config(config).await)
}

/// Generates, for each named `async fn(Backend)`, one `#[tokio::test]` in `mod sqlite` and
/// one in `mod postgres`: the same test case on both ledgers.
#[macro_export]
macro_rules! on_both_ledgers {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name($crate::common::Backend::Sqlite).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name($crate::common::Backend::Postgres).await
                }
            )*
        }
    };
}

#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    pub fn detail(&self) -> String {
        self.json()["detail"].as_str().unwrap_or("").to_owned()
    }
}

/// Sends one request on a fresh connection (`Connection: close`) and reads until EOF.
/// `Ok(None)` means the server closed the connection without sending a single byte.
pub async fn raw(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> std::io::Result<Option<Resp>> {
    let mut stream = TcpStream::connect(addr).await?;
    let mut req = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        req.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    let body = body.unwrap_or(b"");
    if !body.is_empty() || matches!(method, "POST" | "PUT" | "PATCH") {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("\r\n");
    stream.write_all(req.as_bytes()).await?;
    stream.write_all(body).await?;
    let mut buf = Vec::new();
    match stream.read_to_end(&mut buf).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && buf.is_empty() => {
            return Ok(None)
        }
        Err(e) => return Err(e),
    }
    if buf.is_empty() {
        return Ok(None);
    }
    Ok(Some(parse(&buf)))
}

fn parse(buf: &[u8]) -> Resp {
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("header terminator");
    let head = String::from_utf8_lossy(&buf[..split]).into_owned();
    let mut rest = buf[split + 4..].to_vec();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().expect("status line");
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k == "transfer-encoding" && v.contains("chunked"));
    if chunked {
        rest = dechunk(&rest);
    }
    Resp {
        status,
        headers,
        body: rest,
    }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = data.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&data[..eol]).trim(), 16).unwrap_or(0);
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&data[eol + 2..eol + 2 + size]);
        data = &data[eol + 2 + size + 2..];
    }
}

/// A signed-in browser: cookie jar of one cookie plus the CSRF token.
#[derive(Clone)]
pub struct Client {
    pub addr: SocketAddr,
    pub cookie: Option<String>,
    pub csrf: Option<String>,
}

impl Client {
    pub fn anonymous(addr: SocketAddr) -> Client {
        Client {
            addr,
            cookie: None,
            csrf: None,
        }
    }

    pub async fn login(addr: SocketAddr, user: &str) -> Client {
        let mut c = Client::anonymous(addr);
        let body = format!(r#"{{"userId":"{user}","password":"{user}"}}"#);
        let resp = c
            .send("POST", "/api/auth/login", &[], Some(body.as_bytes()))
            .await;
        assert_eq!(resp.status, 200, "login {user}");
        let set = resp.header("set-cookie").expect("set-cookie").to_owned();
        c.cookie = Some(set.split(';').next().expect("cookie pair").to_owned());
        c.csrf = resp.json()["csrfToken"].as_str().map(|s| s.to_owned());
        c
    }

    /// Sends with the cookie and CSRF token (when known) plus `extra` headers; panics if
    /// the server gave no answer.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        extra: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Resp {
        self.try_send(method, path, extra, body)
            .await
            .expect("io")
            .unwrap_or_else(|| panic!("no answer to {method} {path}"))
    }

    pub async fn try_send(
        &self,
        method: &str,
        path: &str,
        extra: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> std::io::Result<Option<Resp>> {
        let mut headers: Vec<(&str, &str)> = Vec::new();
        if let Some(c) = &self.cookie {
            headers.push(("Cookie", c));
        }
        if let Some(t) = &self.csrf {
            headers.push(("X-CSRF-Token", t));
        }
        if body.is_some() {
            headers.push(("Content-Type", "application/json"));
        }
        headers.extend_from_slice(extra);
        raw(self.addr, method, path, &headers, body).await
    }

    pub async fn post(&self, path: &str, key: Option<&str>, body: &str) -> Resp {
        let extra: Vec<(&str, &str)> = key.map(|k| ("Idempotency-Key", k)).into_iter().collect();
        self.send("POST", path, &extra, Some(body.as_bytes())).await
    }

    pub async fn get(&self, path: &str) -> Resp {
        self.send("GET", path, &[], None).await
    }
}

/// Control route helpers.
pub async fn control(addr: SocketAddr, method: &str, path: &str, body: Option<&str>) -> Value {
    let resp = Client::anonymous(addr)
        .send(method, path, &[], body.map(|b| b.as_bytes()))
        .await;
    assert_eq!(
        resp.status,
        200,
        "{method} {path}: {:?}",
        String::from_utf8_lossy(&resp.body)
    );
    resp.json()
}

pub async fn applied(addr: SocketAddr) -> Vec<Value> {
    control(addr, "GET", "/__control/applied", None).await["applied"]
        .as_array()
        .expect("applied array")
        .clone()
}

pub async fn faults(addr: SocketAddr, rules: &str) {
    control(
        addr,
        "POST",
        "/__control/faults",
        Some(&format!(r#"{{"rules":{rules}}}"#)),
    )
    .await;
}

/// A fresh valid key per call.
pub fn key(tag: &str) -> String {
    format!("{tag:_<14}{:08}", rand_suffix())
}
