//! `sw-outbox-conformance`: checks that an HTTP server keeps the idempotency duties the
//! sw-outbox service worker relies on, whatever it is written in, and says per duty what
//! the outbox will do where it does not (see README.md).
//!
//! [`options`] (the command line), [`http`] (the server under test, reached as the
//! outbox reaches it), [`duties`] (one function per duty), [`report`] (findings, text and
//! JSON). The consequences printed come from the outbox's own core
//! (`sw_outbox::core::answer::classify`, `core::identity::read_identity`), so they cannot
//! drift from what the worker does.

pub mod duties;
pub mod http;
pub mod options;
pub mod report;

pub use duties::run;
pub use options::Options;
pub use report::{Finding, Outcome, Report};
