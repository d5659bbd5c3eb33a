//! `sw-outbox-server`: flags as in docs/SERVER-API.md.

use std::io::Write;
use std::process::ExitCode;
use sw_outbox_server::cli::parse_args;

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
    // The idempotency layer reports through `tracing` (a ledger that failed, an answer that
    // could not be stored): to stderr, warnings and errors unless RUST_LOG says otherwise.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
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
