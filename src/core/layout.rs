//! The database's layout: its version, its object stores and the `session` store's keys
//! a start reads. The store (`crate::store`) builds and reads the database from these,
//! and `www/sw.js` gets them in its generated block (tests/sw_rules.rs): it opens the
//! database and reads a start's rows at its first evaluation, while the module is still
//! being parsed and instantiated (issue 36), so both must name the same things.

/// The schema's version: `store::upgrade` brings an older database up to it. `sw.js`
/// opens with it and leaves an upgrade (or a creation) to the module.
pub const VERSION: u32 = 3;
/// One row per queued write: its metadata (the bodies live in [`BODIES`]).
pub const MUTATIONS: &str = "mutations";
/// The exact body bytes, by record id.
pub const BODIES: &str = "bodies";
/// The session, the claim, the generation and the worker's other small rows.
pub const SESSION: &str = "session";
/// The signed-in account, in [`SESSION`].
pub const SESSION_KEY: &str = "current";
/// The scope that claimed the default database (`core::config::owns_default_db`).
pub const SCOPE_KEY: &str = "scope";
/// The database's change counter (`store::Generation`).
pub const GENERATION_KEY: &str = "generation";
