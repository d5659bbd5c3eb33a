//! The outbox's policy, with no browser in it: what is intercepted, the record, the
//! first attempt, who is signed in, how answers are read, what may be replayed and when.
//! Everything here builds and is tested on the host (`cargo test`).

pub mod answer;
pub mod backoff;
pub mod barrier;
pub mod config;
pub mod content;
pub mod credential;
pub mod delivery;
pub mod first_attempt;
pub mod identity;
pub mod key;
pub mod lanes;
pub mod layout;
pub mod notify;
pub mod planner;
pub mod record;
pub mod recovery;
pub mod route;
pub mod shell;
pub mod text;
pub mod windows;
