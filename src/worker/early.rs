//! What `www/sw.js` did before the module was instantiated (issue 36): it opened the
//! database at its first evaluation and, once an event needed the outbox, read the rows
//! a start reads in one transaction, so the browser did that while the module's script
//! was parsed, decoded and instantiated. The start adopts the connection and the rows
//! instead of opening and reading again; anything missing or unexpected in the handover
//! is left for the start to do itself, as without it.

use crate::core::layout::VERSION;
use js_sys::Reflect;
use wasm_bindgen::{JsCast, JsValue};
use web_sys::IdbDatabase;

/// The open connection, and the rows if they were read.
pub(super) struct Early {
    pub db: IdbDatabase,
    pub rows: Option<Rows>,
}

/// The `session` store's claim, generation and session rows and every record, read in
/// one transaction (`undefined` where a row does not exist).
pub(super) struct Rows {
    pub scope: JsValue,
    pub generation: JsValue,
    pub session: JsValue,
    pub all: JsValue,
}

fn field(v: &JsValue, name: &str) -> Option<JsValue> {
    Reflect::get(v, &JsValue::from_str(name)).ok()
}

impl Early {
    /// sw.js's handover, `{db, rows?: {scope, generation, session, all}}`, when its
    /// connection is to database `name` at this module's version; a connection to
    /// another is closed and not used.
    pub fn read(handover: &JsValue, name: &str) -> Option<Early> {
        if !handover.is_object() {
            return None;
        }
        let db: IdbDatabase = field(handover, "db")?.dyn_into().ok()?;
        if db.name() != name || db.version() != f64::from(VERSION) {
            db.close();
            return None;
        }
        let rows = field(handover, "rows")
            .filter(JsValue::is_object)
            .and_then(|r| {
                Some(Rows {
                    scope: field(&r, "scope")?,
                    generation: field(&r, "generation")?,
                    session: field(&r, "session")?,
                    all: field(&r, "all").filter(|a| a.is_array())?,
                })
            });
        Some(Early { db, rows })
    }
}
