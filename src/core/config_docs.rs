//! The package README documents every configuration field with its default (its
//! "Configuration" table): an adopter reads the defaults there, so they are checked
//! against [`Config::default`], the one place they live. A field added to [`Config`]
//! needs its row.

use super::Config;
use serde_json::Value;

const README: &str = include_str!("../../package/README.md");

/// Fields a site does not set: `build` is `www/sw.js`'s, from the build id.
const NOT_DOCUMENTED: [&str; 1] = ["build"];

/// The rows of the table under `### Configuration`: (field, default cell).
fn rows() -> Vec<(String, String)> {
    let table = README
        .split("### Configuration")
        .nth(1)
        .expect("package/README.md has a Configuration section");
    table
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| {
            // Cells split on `|` not escaped as `\|` (a pattern's alternation).
            let cells: Vec<String> = l
                .replace("\\|", "\u{0}")
                .split('|')
                .map(|c| c.trim().replace('\u{0}', "|"))
                .collect();
            let field = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((field.to_string(), cells.get(2)?.clone()))
        })
        .collect()
}

/// The code spans of a cell, in order.
fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// Whether the README's cell says `value`: a number, string or boolean as its first code
/// span; a list as a JSON code span or as one code span per item; no value (a default
/// the worker works out) as words.
fn says(cell: &str, value: &Value) -> bool {
    let spans = code_spans(cell);
    match value {
        Value::Null => true,
        Value::Array(items) => match spans.first() {
            Some(first) if first.starts_with('[') => {
                serde_json::from_str::<Value>(first).ok().as_ref() == Some(value)
            }
            _ => {
                let listed: Vec<Value> = spans.iter().map(|s| Value::from(*s)).collect();
                &listed == items
            }
        },
        Value::String(s) => spans.first() == Some(&s.as_str()),
        other => spans.first() == Some(&other.to_string().as_str()),
    }
}

#[test]
fn every_field_has_a_row_with_its_default() {
    let defaults = serde_json::to_value(Config::default()).expect("serializes");
    let defaults = defaults.as_object().expect("an object");
    let rows = rows();
    assert!(rows.len() >= 10, "the table was read: {rows:?}");
    let mut wrong = Vec::new();
    for (field, cell) in &rows {
        match defaults.get(field) {
            None => wrong.push(format!("`{field}`: no such field")),
            Some(value) if !says(cell, value) => wrong.push(format!(
                "`{field}`: the README says {cell:?}, the default is {value}"
            )),
            Some(_) => {}
        }
    }
    for field in defaults.keys() {
        if !NOT_DOCUMENTED.contains(&field.as_str()) && !rows.iter().any(|(f, _)| f == field) {
            wrong.push(format!(
                "`{field}`: no row in package/README.md's Configuration table"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "package/README.md, Configuration:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_wrong_default_is_told() {
    assert!(says("`15000`", &Value::from(15000)));
    assert!(!says("`117`", &Value::from(15000)));
    assert!(says(
        "`[502, 503, 504]`",
        &serde_json::json!([502, 503, 504])
    ));
    assert!(says(
        "`If-Match`, `Accept`",
        &serde_json::json!(["If-Match", "Accept"])
    ));
    assert!(!says(
        "`If-Match`",
        &serde_json::json!(["If-Match", "Accept"])
    ));
    assert!(says("`false`", &Value::Bool(false)));
    assert!(!says("`true`", &Value::Bool(false)));
}
