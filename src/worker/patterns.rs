//! The configured patterns compiled by the browser's own RegExp engine, so a site's
//! patterns mean exactly what they mean in JavaScript.

use crate::core::config::Config;
use crate::core::route::Patterns;
use js_sys::{Array, Reflect, RegExp};
use std::cell::OnceCell;
use wasm_bindgen::{JsCast, JsValue};

/// The three patterns, each compiled the first time it is needed (issue 36, 2): the
/// start compiles them all once ([`JsPatterns::check`]) only to refuse a bad one, and
/// does it while the database opens, not before.
pub struct JsPatterns {
    auth: Lazy,
    workspace: Lazy,
    never_queue: Option<Lazy>,
}

fn compile(field: &str, pattern: &str, flags: &str) -> Result<RegExp, String> {
    let ctor: js_sys::Function = Reflect::get(&js_sys::global(), &"RegExp".into())
        .map_err(|_| "RegExp is unavailable".to_string())?
        .unchecked_into();
    let args = Array::of2(&JsValue::from_str(pattern), &JsValue::from_str(flags));
    Reflect::construct(&ctor, &args)
        .map(JsCast::unchecked_into)
        .map_err(|e| {
            format!(
                "config.{field} is not a valid regular expression: {}",
                super::describe(&e)
            )
        })
}

/// One configured pattern and, once compiled, its RegExp.
struct Lazy {
    field: &'static str,
    pattern: String,
    flags: &'static str,
    compiled: OnceCell<RegExp>,
}

impl Lazy {
    fn new(field: &'static str, pattern: &str, flags: &'static str) -> Lazy {
        Lazy {
            field,
            pattern: pattern.to_owned(),
            flags,
            compiled: OnceCell::new(),
        }
    }

    fn get(&self) -> Result<&RegExp, String> {
        if let Some(r) = self.compiled.get() {
            return Ok(r);
        }
        let r = compile(self.field, &self.pattern, self.flags)?;
        Ok(self.compiled.get_or_init(|| r))
    }

    /// Tests with the compiled pattern; a pattern that does not compile (refused at
    /// start, so never here in a started outbox) matches nothing.
    fn test(&self, text: &str) -> bool {
        self.get().is_ok_and(|r| r.test(text))
    }
}

impl JsPatterns {
    /// The configured patterns, none compiled yet.
    pub fn new(config: &Config) -> JsPatterns {
        JsPatterns {
            auth: Lazy::new("authRoutePattern", &config.auth_route_pattern, "i"),
            workspace: Lazy::new("workspacePattern", &config.workspace_pattern, ""),
            never_queue: config
                .never_queue_pattern
                .as_deref()
                .map(|p| Lazy::new("neverQueuePattern", p, "")),
        }
    }

    /// Compiles every pattern (kept for their first use): the error names the first
    /// that is not a valid regular expression, so a worker configured with one never
    /// starts.
    pub fn check(&self) -> Result<(), String> {
        self.auth.get()?;
        self.workspace.get()?;
        if let Some(n) = &self.never_queue {
            n.get()?;
        }
        Ok(())
    }
}

impl Patterns for JsPatterns {
    fn is_auth_route(&self, path_and_query: &str) -> bool {
        self.auth.test(path_and_query)
    }

    fn workspace(&self, record_path: &str) -> Option<String> {
        self.workspace
            .get()
            .ok()?
            .exec(record_path)
            .and_then(|m| m.get(1).as_string())
            .filter(|w| !w.is_empty())
    }

    fn never_queue(&self, path_and_query: &str) -> bool {
        self.never_queue
            .as_ref()
            .is_some_and(|r| r.test(path_and_query))
    }
}
