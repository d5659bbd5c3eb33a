//! The configured patterns compiled by the browser's own RegExp engine, so a site's
//! patterns mean exactly what they mean in JavaScript.

use crate::core::config::Config;
use crate::core::route::Patterns;
use js_sys::{Array, Reflect, RegExp};
use wasm_bindgen::{JsCast, JsValue};

pub struct JsPatterns {
    auth: RegExp,
    workspace: RegExp,
    never_queue: Option<RegExp>,
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

impl JsPatterns {
    pub fn new(config: &Config) -> Result<JsPatterns, String> {
        Ok(JsPatterns {
            auth: compile("authRoutePattern", &config.auth_route_pattern, "i")?,
            workspace: compile("workspacePattern", &config.workspace_pattern, "")?,
            never_queue: match &config.never_queue_pattern {
                Some(p) => Some(compile("neverQueuePattern", p, "")?),
                None => None,
            },
        })
    }
}

impl Patterns for JsPatterns {
    fn is_auth_route(&self, path_and_query: &str) -> bool {
        self.auth.test(path_and_query)
    }

    fn workspace(&self, record_path: &str) -> Option<String> {
        self.workspace
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
