//! `sw-outbox-conformance BASE_URL [options]`: exit 0 when no duty the outbox needs
//! failed, 1 when one did, 2 when the check could not run (bad options, no server, the
//! sign-in or a fresh write refused).

use clap::Parser;
use std::io::Write;
use std::process::ExitCode;
use sw_outbox_conformance::{run, Options};

#[tokio::main]
async fn main() -> ExitCode {
    let options = Options::parse();
    let report = match run(&options).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("sw-outbox-conformance: {e}");
            return ExitCode::from(2);
        }
    };
    let text = if options.json {
        match serde_json::to_string_pretty(&report) {
            Ok(j) => j + "\n",
            Err(e) => {
                eprintln!("sw-outbox-conformance: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        report.to_text()
    };
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
    if report.failed() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
