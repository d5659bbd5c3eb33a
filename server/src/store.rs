//! SQLite storage of the demo data, the sessions and the `applied` log.
//!
//! One connection behind a mutex: the demo's load is tiny and every operation is a short
//! synchronous transaction that never holds the lock across an `.await`. (The idempotency
//! ledger has a connection of its own, run off the async threads: see
//! `sw_outbox_idempotency::SqliteLedger`.)
//!
//! Each data change inserts its `applied` row in the same transaction, so the log is exactly
//! the set of writes that changed data, in the order they did.

use rusqlite::{params, Connection, OptionalExtension};
use serde::Serialize;
use std::sync::{Arc, Mutex, MutexGuard};

pub type StoreError = rusqlite::Error;

/// The shared connection.
#[derive(Clone)]
pub struct Db(Arc<Mutex<Connection>>);

impl Db {
    /// Opens (creating if needed) the database. A file database uses WAL with
    /// `synchronous=FULL`: a ledger claim must survive a crash once committed, or the
    /// "claimed before the route runs" guarantee means nothing.
    pub fn open(path: &str) -> Result<Db, StoreError> {
        let conn = if path == ":memory:" {
            Connection::open_in_memory()?
        } else {
            let conn = Connection::open(path)?;
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.pragma_update(None, "synchronous", "FULL")?;
            conn
        };
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        Ok(Db(Arc::new(Mutex::new(conn))))
    }

    /// The connection. A poisoned lock only means another request panicked mid-call; the
    /// SQLite transaction it held was rolled back, so the connection is still consistent.
    pub fn lock(&self) -> MutexGuard<'_, Connection> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[derive(Clone, Debug)]
pub struct Session {
    pub sid: String,
    pub user: String,
    pub csrf: String,
    /// Sign-in time (wall-clock ms): the session ends `session_max` after it.
    pub created_ms: i64,
    /// Last use, refreshed now and then: the session ends `session_idle` after it.
    pub seen_ms: i64,
}

/// An access token as the store knows it (bearer mode).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AccessToken {
    /// Valid: issued by session `sid` (which must still be live itself).
    Live { sid: String },
    /// Past its time: refresh it.
    Expired,
    /// Never issued here, revoked by a sign-out, or long expired.
    Unknown,
}

/// How long sessions live (see `Config::session_idle`, `Config::session_max`).
#[derive(Clone, Copy, Debug)]
pub struct SessionLife {
    pub idle_ms: i64,
    pub max_ms: i64,
}

impl Session {
    pub fn expired(&self, now_ms: i64, life: SessionLife) -> bool {
        now_ms - self.created_ms >= life.max_ms || now_ms - self.seen_ms >= life.idle_ms
    }
}

#[derive(Clone, Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    pub id: i64,
    pub project_id: String,
    pub title: String,
    pub done: bool,
    pub owner: String,
    /// 1 when created, +1 per successful PATCH; the task's `ETag` is `"<version>"`.
    pub version: i64,
}

impl Task {
    /// The strong entity tag of this version.
    pub fn etag(&self) -> String {
        format!("\"{}\"", self.version)
    }
}

/// What a conditional update found.
#[derive(Clone, Debug, PartialEq)]
pub enum Update {
    Updated(Task),
    NotFound,
    /// The task's current entity tag did not satisfy the request's `If-Match`.
    PreconditionFailed,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Note {
    pub id: i64,
    pub text: String,
    pub owner: String,
}

/// What the `applied` log records about a write whose route ran.
#[derive(Clone, Debug, Serialize)]
pub struct Applied {
    pub seq: i64,
    pub user: String,
    pub method: String,
    pub path: String,
    pub key: Option<String>,
    pub body: String,
}

/// The request facts an `applied` row is made from (everything but `seq`).
#[derive(Clone, Debug)]
pub struct WriteInfo {
    pub method: String,
    pub path: String,
    pub key: Option<String>,
    pub body: String,
}

/// The request facts the pipeline knows before the body is read; a route adds the body.
#[derive(Clone, Debug)]
pub struct WriteMeta {
    pub method: String,
    pub path: String,
    pub key: Option<String>,
}

impl WriteMeta {
    pub fn with_body(&self, body: &[u8]) -> WriteInfo {
        WriteInfo {
            method: self.method.clone(),
            path: self.path.clone(),
            key: self.key.clone(),
            body: String::from_utf8_lossy(body).into_owned(),
        }
    }
}

#[derive(Clone)]
pub struct Store {
    db: Db,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sessions (
    sid TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    csrf TEXT NOT NULL,
    created_ms INTEGER NOT NULL DEFAULT 0,
    seen_ms INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS access_tokens (
    token TEXT PRIMARY KEY,
    sid TEXT NOT NULL,
    user_id TEXT NOT NULL,
    expires_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS access_tokens_sid ON access_tokens (sid);
CREATE TABLE IF NOT EXISTS tasks (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    owner TEXT NOT NULL,
    project TEXT NOT NULL,
    title TEXT NOT NULL,
    done INTEGER NOT NULL DEFAULT 0,
    version INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS notes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    owner TEXT NOT NULL,
    text TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS applied (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    user_id TEXT NOT NULL,
    method TEXT NOT NULL,
    path TEXT NOT NULL,
    idem_key TEXT,
    body TEXT NOT NULL
);
";

fn log_applied(conn: &Connection, user: &str, info: &WriteInfo) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO applied (user_id, method, path, idem_key, body) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![user, info.method, info.path, info.key, info.body],
    )?;
    Ok(())
}

const TASK_COLUMNS: &str = "id, owner, project, title, done, version";

fn task_from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Task> {
    Ok(Task {
        id: row.get(0)?,
        owner: row.get(1)?,
        project_id: row.get(2)?,
        title: row.get(3)?,
        done: row.get::<_, i64>(4)? != 0,
        version: row.get(5)?,
    })
}

/// Adds the columns a database file from an earlier version lacks (their defaults make old
/// sessions expired and old tasks version 1).
fn upgrade(conn: &Connection) -> Result<(), StoreError> {
    let columns = |table: &str| -> Result<Vec<String>, StoreError> {
        let mut stmt = conn.prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))?;
        let names = stmt.query_map([], |r| r.get(0))?.collect();
        names
    };
    let sessions = columns("sessions")?;
    for col in ["created_ms", "seen_ms"] {
        if !sessions.iter().any(|c| c == col) {
            conn.execute_batch(&format!(
                "ALTER TABLE sessions ADD COLUMN {col} INTEGER NOT NULL DEFAULT 0"
            ))?;
        }
    }
    if !columns("tasks")?.iter().any(|c| c == "version") {
        conn.execute_batch("ALTER TABLE tasks ADD COLUMN version INTEGER NOT NULL DEFAULT 1")?;
    }
    Ok(())
}

impl Store {
    pub fn new(db: Db) -> Result<Store, StoreError> {
        {
            let conn = db.lock();
            conn.execute_batch(SCHEMA)?;
            upgrade(&conn)?;
        }
        Ok(Store { db })
    }

    pub fn create_session(&self, session: &Session) -> Result<(), StoreError> {
        self.db.lock().execute(
            "INSERT INTO sessions (sid, user_id, csrf, created_ms, seen_ms)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            params![
                session.sid,
                session.user,
                session.csrf,
                session.created_ms,
                session.seen_ms
            ],
        )?;
        Ok(())
    }

    /// The live session `sid` names. An expired one is deleted and is `None`; a live one's
    /// last use is refreshed when it is older than a quarter of the idle bound (at most a
    /// minute), so a busy session is not a write per request.
    pub fn session(
        &self,
        sid: &str,
        now_ms: i64,
        life: SessionLife,
    ) -> Result<Option<Session>, StoreError> {
        let conn = self.db.lock();
        let found = conn
            .query_row(
                "SELECT sid, user_id, csrf, created_ms, seen_ms FROM sessions WHERE sid = ?1",
                params![sid],
                |row| {
                    Ok(Session {
                        sid: row.get(0)?,
                        user: row.get(1)?,
                        csrf: row.get(2)?,
                        created_ms: row.get(3)?,
                        seen_ms: row.get(4)?,
                    })
                },
            )
            .optional()?;
        let Some(mut session) = found else {
            return Ok(None);
        };
        if session.expired(now_ms, life) {
            conn.execute("DELETE FROM sessions WHERE sid = ?1", params![sid])?;
            return Ok(None);
        }
        if now_ms - session.seen_ms >= (life.idle_ms / 4).min(60_000) {
            conn.execute(
                "UPDATE sessions SET seen_ms = ?2 WHERE sid = ?1",
                params![sid, now_ms],
            )?;
            session.seen_ms = now_ms;
        }
        Ok(Some(session))
    }

    /// Deletes expired sessions; returns how many.
    pub fn prune_sessions(&self, now_ms: i64, life: SessionLife) -> Result<usize, StoreError> {
        self.db.lock().execute(
            "DELETE FROM sessions WHERE ?1 - created_ms >= ?2 OR ?1 - seen_ms >= ?3",
            params![now_ms, life.max_ms, life.idle_ms],
        )
    }

    /// Deletes a session and every access token it issued (bearer mode).
    pub fn delete_session(&self, sid: &str) -> Result<(), StoreError> {
        let conn = self.db.lock();
        conn.execute("DELETE FROM sessions WHERE sid = ?1", params![sid])?;
        conn.execute("DELETE FROM access_tokens WHERE sid = ?1", params![sid])?;
        Ok(())
    }

    /// Records an access token of session `sid` (bearer mode), valid until `expires_ms`.
    pub fn create_access_token(
        &self,
        token: &str,
        sid: &str,
        user: &str,
        expires_ms: i64,
    ) -> Result<(), StoreError> {
        self.db.lock().execute(
            "INSERT INTO access_tokens (token, sid, user_id, expires_ms) VALUES (?1, ?2, ?3, ?4)",
            params![token, sid, user, expires_ms],
        )?;
        Ok(())
    }

    /// What an access token is now: the session that issued it while it lives.
    pub fn access_token(&self, token: &str, now_ms: i64) -> Result<AccessToken, StoreError> {
        let found: Option<(String, i64)> = self
            .db
            .lock()
            .query_row(
                "SELECT sid, expires_ms FROM access_tokens WHERE token = ?1",
                params![token],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()?;
        Ok(match found {
            None => AccessToken::Unknown,
            Some((_, expires)) if now_ms >= expires => AccessToken::Expired,
            Some((sid, _)) => AccessToken::Live { sid },
        })
    }

    /// Makes every access token expired now (the control route `expire-tokens`): the next
    /// request with one gets 401 `token_expired`, as after `--token-ttl`.
    pub fn expire_access_tokens(&self, now_ms: i64) -> Result<usize, StoreError> {
        self.db.lock().execute(
            "UPDATE access_tokens SET expires_ms = ?1 WHERE expires_ms > ?1",
            params![now_ms],
        )
    }

    /// Deletes access tokens expired for longer than `grace_ms` (kept that long so a late
    /// request is told `token_expired`, not "unknown"), and those of sessions that ended.
    pub fn prune_access_tokens(&self, now_ms: i64, grace_ms: i64) -> Result<usize, StoreError> {
        self.db.lock().execute(
            "DELETE FROM access_tokens WHERE expires_ms <= ?1 - ?2
                 OR sid NOT IN (SELECT sid FROM sessions)",
            params![now_ms, grace_ms],
        )
    }

    pub fn create_task(
        &self,
        owner: &str,
        project: &str,
        title: &str,
        info: &WriteInfo,
    ) -> Result<Task, StoreError> {
        let mut conn = self.db.lock();
        let tx = conn.transaction()?;
        tx.execute(
            "INSERT INTO tasks (owner, project, title) VALUES (?1, ?2, ?3)",
            params![owner, project, title],
        )?;
        let id = tx.last_insert_rowid();
        log_applied(&tx, owner, info)?;
        tx.commit()?;
        Ok(Task {
            id,
            project_id: project.to_owned(),
            title: title.to_owned(),
            done: false,
            owner: owner.to_owned(),
            version: 1,
        })
    }

    pub fn list_tasks(&self, owner: &str, project: &str) -> Result<Vec<Task>, StoreError> {
        let conn = self.db.lock();
        let mut stmt = conn.prepare(&format!(
            "SELECT {TASK_COLUMNS} FROM tasks WHERE owner = ?1 AND project = ?2 ORDER BY id"
        ))?;
        let rows = stmt.query_map(params![owner, project], task_from_row)?;
        rows.collect()
    }

    pub fn get_task(
        &self,
        owner: &str,
        project: &str,
        id: i64,
    ) -> Result<Option<Task>, StoreError> {
        self.db
            .lock()
            .query_row(
                &format!(
                    "SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?1 AND owner = ?2 AND project = ?3"
                ),
                params![id, owner, project],
                task_from_row,
            )
            .optional()
    }

    /// Applies a partial update and bumps the version, when the task exists for this owner
    /// and project and `precondition` accepts its current entity tag; otherwise nothing
    /// changes (and nothing is logged). Read, check and write are one transaction, so the
    /// check cannot go stale before the write.
    #[allow(clippy::too_many_arguments)]
    pub fn update_task(
        &self,
        owner: &str,
        project: &str,
        id: i64,
        title: Option<&str>,
        done: Option<bool>,
        precondition: impl FnOnce(&str) -> bool,
        info: &WriteInfo,
    ) -> Result<Update, StoreError> {
        let mut conn = self.db.lock();
        let tx = conn.transaction()?;
        let current = tx
            .query_row(
                &format!(
                    "SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?1 AND owner = ?2 AND project = ?3"
                ),
                params![id, owner, project],
                task_from_row,
            )
            .optional()?;
        let Some(current) = current else {
            return Ok(Update::NotFound);
        };
        if !precondition(&current.etag()) {
            return Ok(Update::PreconditionFailed);
        }
        tx.execute(
            "UPDATE tasks SET title = COALESCE(?2, title), done = COALESCE(?3, done),
                 version = version + 1
             WHERE id = ?1",
            params![id, title, done.map(i64::from)],
        )?;
        let task = tx.query_row(
            &format!("SELECT {TASK_COLUMNS} FROM tasks WHERE id = ?1"),
            params![id],
            task_from_row,
        )?;
        log_applied(&tx, owner, info)?;
        tx.commit()?;
        Ok(Update::Updated(task))
    }

    /// `false` when the task does not exist for this owner and project.
    pub fn delete_task(
        &self,
        owner: &str,
        project: &str,
        id: i64,
        info: &WriteInfo,
    ) -> Result<bool, StoreError> {
        let mut conn = self.db.lock();
        let tx = conn.transaction()?;
        let changed = tx.execute(
            "DELETE FROM tasks WHERE id = ?1 AND owner = ?2 AND project = ?3",
            params![id, owner, project],
        )?;
        if changed == 0 {
            return Ok(false);
        }
        log_applied(&tx, owner, info)?;
        tx.commit()?;
        Ok(true)
    }

    pub fn create_note(
        &self,
        owner: &str,
        text: &str,
        info: &WriteInfo,
    ) -> Result<Note, StoreError> {
        let mut conn = self.db.lock();
        let tx = conn.transaction()?;
        tx.execute(
            "INSERT INTO notes (owner, text) VALUES (?1, ?2)",
            params![owner, text],
        )?;
        let id = tx.last_insert_rowid();
        log_applied(&tx, owner, info)?;
        tx.commit()?;
        Ok(Note {
            id,
            text: text.to_owned(),
            owner: owner.to_owned(),
        })
    }

    pub fn list_notes(&self, owner: &str) -> Result<Vec<Note>, StoreError> {
        let conn = self.db.lock();
        let mut stmt =
            conn.prepare("SELECT id, text, owner FROM notes WHERE owner = ?1 ORDER BY id")?;
        let rows = stmt.query_map(params![owner], |row| {
            Ok(Note {
                id: row.get(0)?,
                text: row.get(1)?,
                owner: row.get(2)?,
            })
        })?;
        rows.collect()
    }

    pub fn applied(&self) -> Result<Vec<Applied>, StoreError> {
        let conn = self.db.lock();
        let mut stmt = conn.prepare(
            "SELECT seq, user_id, method, path, idem_key, body FROM applied ORDER BY seq",
        )?;
        let rows = stmt.query_map([], |row| {
            Ok(Applied {
                seq: row.get(0)?,
                user: row.get(1)?,
                method: row.get(2)?,
                path: row.get(3)?,
                key: row.get(4)?,
                body: row.get(5)?,
            })
        })?;
        rows.collect()
    }

    /// Deletes all data, sessions and the applied log, and restarts the id counters so a
    /// test run after a reset sees the same ids as a fresh server.
    pub fn reset(&self) -> Result<(), StoreError> {
        self.db.lock().execute_batch(
            "BEGIN;
             DELETE FROM tasks; DELETE FROM notes; DELETE FROM applied; DELETE FROM sessions;
             DELETE FROM access_tokens;
             DELETE FROM sqlite_sequence WHERE name IN ('tasks', 'notes', 'applied');
             COMMIT;",
        )
    }
}
