//! A throwaway PostgreSQL server for the tests that run the ledger on PostgreSQL (this
//! crate's and the reference server's, which includes this file).
//!
//! One server per test binary, started on first use with Debian's binaries
//! (`/usr/lib/postgresql/<version>/bin`): a fresh cluster in a temporary directory, trust
//! authentication, a free loopback port, its Unix socket in that directory, `fsync` off (a
//! crash of a test database loses nothing anyone needs). Each test gets its own database,
//! so tests that prune or clear the whole ledger cannot disturb each other.
//!
//! The test harness has no "after all tests" hook and never drops statics, so a small
//! watchdog shell, started before the server, blocks reading a pipe whose only writer is
//! this process. When the process ends — tests passed, a test panicked, or it was killed —
//! the pipe closes, and the watchdog stops the server and deletes the directory. It runs in
//! its own process group so a Ctrl-C on `cargo test` does not kill it before it cleans up.
//!
//! The server also speaks TLS, with a certificate of a throwaway authority made here
//! (rcgen): [`PgServer::url`] asks for no TLS, [`PgServer::tls_url`] for verified TLS.
//!
//! Without the binaries the PostgreSQL tests fail with a message naming the package; with
//! `SW_OUTBOX_SKIP_PG=1` they are skipped instead (and say so).

// Shared by the test crates of the workspace, each using a part of it.
#![allow(dead_code)]

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub struct PgServer {
    pub port: u16,
    /// The authority that signed the server's certificate (PEM), for `sslrootcert`.
    pub ca_file: PathBuf,
    /// Holding it keeps the watchdog waiting; it is never written to.
    _watchdog: ChildStdin,
}

static SERVER: OnceLock<Result<PgServer, String>> = OnceLock::new();

pub const SKIP_VAR: &str = "SW_OUTBOX_SKIP_PG";

/// The shared server, or `None` when PostgreSQL tests are skipped. Panics (failing the
/// calling test) when the server cannot be had.
pub fn server() -> Option<&'static PgServer> {
    if std::env::var(SKIP_VAR).is_ok_and(|v| v == "1") {
        eprintln!("skipped ({SKIP_VAR}=1): PostgreSQL ledger test not run");
        return None;
    }
    match SERVER.get_or_init(start) {
        Ok(s) => Some(s),
        Err(e) => panic!("{e}"),
    }
}

impl PgServer {
    /// Plain TCP (the server would take TLS; these tests do not want its cost).
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{db}?sslmode=disable",
            self.port
        )
    }

    /// TLS, the server's certificate checked against the test authority and the host name.
    pub fn tls_url(&self, db: &str) -> String {
        format!(
            "postgres://postgres@127.0.0.1:{}/{db}?sslmode=verify-full&sslrootcert={}",
            self.port,
            self.ca_file.display()
        )
    }

    /// A new, empty database; returns its URL (without TLS).
    pub async fn fresh_database(&self) -> String {
        let name = self.fresh_database_name().await;
        self.url(&name)
    }

    /// A new, empty database; returns its name.
    pub async fn fresh_database_name(&self) -> String {
        static N: AtomicU64 = AtomicU64::new(0);
        let name = format!("t{}", N.fetch_add(1, Ordering::Relaxed));
        let (client, conn) = tokio_postgres::connect(&self.url("postgres"), tokio_postgres::NoTls)
            .await
            .expect("connect to the test PostgreSQL server");
        let conn = tokio::spawn(conn);
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("CREATE DATABASE");
        drop(client);
        let _ = conn.await;
        name
    }
}

/// Debian installs each major version side by side; take the newest.
fn bin_dir() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin)
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// `bin/<tool>`, run as `postgres` when we are root (PostgreSQL refuses to run as root).
fn tool(bin: &Path, name: &str, as_postgres: bool) -> Command {
    if as_postgres {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin.join(name));
        c
    } else {
        Command::new(bin.join(name))
    }
}

fn run(mut cmd: Command, what: &str) -> Result<(), String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{what}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("binding a port: {e}"))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("binding a port: {e}"))
}

fn start() -> Result<PgServer, String> {
    let started = Instant::now();
    let bin = bin_dir().ok_or_else(|| {
        format!(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): the ledger's \
             PostgreSQL tests need it. Install it with `apt-get install postgresql` (./build.sh \
             does), or set {SKIP_VAR}=1 to skip these tests."
        )
    })?;
    let root = is_root();
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("sw-outbox-pg-{}-{nanos:x}", std::process::id()));
    let data = dir.join("data");
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;

    // The watchdog first: from here on, whatever happens, the directory (and the server,
    // once it runs) goes away with this process.
    let stop_cmd: Vec<String> = if root {
        vec![
            "runuser".into(),
            "-u".into(),
            "postgres".into(),
            "--".into(),
        ]
    } else {
        Vec::new()
    };
    let mut watchdog = Command::new("sh")
        .arg("-c")
        .arg(r#"cat >/dev/null; "$@" stop -D "$PG_DATA" -m immediate -w; rm -rf "$PG_DIR""#)
        .arg("sh")
        .args(&stop_cmd)
        .arg(bin.join("pg_ctl"))
        .env("PG_DATA", &data)
        .env("PG_DIR", &dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("starting the cleanup watchdog: {e}"))?;
    let pipe = watchdog
        .stdin
        .take()
        .ok_or("the watchdog has no stdin pipe")?;

    let tls = write_certificates(&dir)?;
    if root {
        run(
            {
                let mut c = Command::new("chown");
                c.arg("-R").arg("postgres:postgres").arg(&dir);
                c
            },
            "chown postgres",
        )?;
    }
    let mut initdb = tool(&bin, "initdb", root);
    initdb.arg("-D").arg(&data).args([
        "-U",
        "postgres",
        "-A",
        "trust",
        "-E",
        "UTF8",
        "--locale=C",
        "--no-sync",
    ]);
    run(initdb, "initdb")?;

    let mut last_error = String::new();
    for _ in 0..3 {
        let port = free_port()?;
        let mut pg_ctl = tool(&bin, "pg_ctl", root);
        pg_ctl
            .arg("start")
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(dir.join("server.log"))
            .args(["-w", "-t", "60", "-o"])
            .arg(format!(
                "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off \
                 -c synchronous_commit=off -c full_page_writes=off -c shared_buffers=16MB \
                 -c max_connections=200 -c ssl=on -c ssl_cert_file={} -c ssl_key_file={}",
                dir.display(),
                tls.cert.display(),
                tls.key.display()
            ));
        match run(pg_ctl, "pg_ctl start") {
            Ok(()) => {
                eprintln!(
                    "test PostgreSQL ({}) on 127.0.0.1:{port}, ready in {:?}",
                    bin.display(),
                    started.elapsed()
                );
                return Ok(PgServer {
                    port,
                    ca_file: tls.ca,
                    _watchdog: pipe,
                });
            }
            // Most likely the port was taken between probing and binding: try another.
            Err(e) => {
                let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
                last_error = format!("{e}\nserver log:\n{log}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    // `pipe` is dropped here: the watchdog removes the directory right away.
    Err(format!(
        "the test PostgreSQL server did not start: {last_error}"
    ))
}

struct TlsFiles {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

/// A throwaway certificate authority and a server certificate it signed for `127.0.0.1`
/// and `localhost`, as PEM files in `dir` (the key readable by its owner only, as
/// PostgreSQL demands).
fn write_certificates(dir: &Path) -> Result<TlsFiles, String> {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    use std::os::unix::fs::PermissionsExt;
    let e = |e: rcgen::Error| format!("making the test certificates: {e}");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(e)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "sw-outbox test authority");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().map_err(e)?).map_err(e)?;
    let key = KeyPair::generate().map_err(e)?;
    let cert = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .map_err(e)?
        .signed_by(&key, &ca)
        .map_err(e)?;
    let files = TlsFiles {
        ca: dir.join("ca.crt"),
        cert: dir.join("server.crt"),
        key: dir.join("server.key"),
    };
    let write = |path: &Path, text: &str, mode: u32| -> Result<(), String> {
        std::fs::write(path, text).map_err(|err| format!("writing {}: {err}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|err| format!("chmod {}: {err}", path.display()))
    };
    write(&files.ca, &ca.pem(), 0o644)?;
    write(&files.cert, &cert.pem(), 0o644)?;
    write(&files.key, &key.serialize_pem(), 0o600)?;
    Ok(files)
}
