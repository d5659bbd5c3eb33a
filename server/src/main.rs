//! `sw-outbox-server`: flags as in docs/SERVER-API.md.

use std::io::Write;
use std::process::ExitCode;
use sw_outbox_server::{Config, Mode};

const USAGE: &str = "usage: sw-outbox-server [--port N] [--host ADDR] [--www DIR] [--db FILE|:memory:] [--ledger postgres://USER@HOST:PORT/DB] [--mode prod|demo|test]";

fn parse_args(args: impl Iterator<Item = String>) -> Result<Config, String> {
    let mut config = Config::default();
    let mut args = args.peekable();
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.to_owned());
        }
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next())
                .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match flag.as_str() {
            "--port" => {
                let v = value()?;
                config.port = v.parse().map_err(|_| format!("bad --port {v}"))?;
            }
            "--host" => {
                let v = value()?;
                config.host = v.parse().map_err(|_| format!("bad --host {v}"))?;
            }
            "--www" => config.www = value()?.into(),
            "--db" => config.db = value()?,
            "--ledger" => config.ledger = Some(value()?),
            "--mode" => {
                let v = value()?;
                config.mode = Mode::parse(&v).ok_or_else(|| format!("bad --mode {v}"))?;
            }
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    Ok(config)
}

async fn stop_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let config = match parse_args(std::env::args().skip(1)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let server = match sw_outbox_server::spawn(config).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sw-outbox-server: {e}");
            return ExitCode::FAILURE;
        }
    };
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "listening on http://127.0.0.1:{}", server.addr.port());
        let _ = out.flush();
    }
    stop_signal().await;
    eprintln!("sw-outbox-server: shutting down");
    server.shutdown().await;
    ExitCode::SUCCESS
}
