//! The modules of `src/` import each other without circles (docs/ARCHITECTURE.md:
//! imports point down only). A module may use its ancestors (`worker` holds `Inner`,
//! which every shell module works on, and declares them all); between any other two
//! modules, a path one way (`use`, `crate::…`, `super::…`) forbids a path back, directly
//! or through others. Tests count too: a test that reaches up is a circle a reader must
//! follow as well.
#![cfg(not(target_arch = "wasm32"))]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module path (`worker::flush::send`, `""` for the crate) → its source.
fn modules() -> BTreeMap<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("src/ is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let rel = path.strip_prefix(&root).expect("under src/");
            let mut parts: Vec<String> = rel
                .with_extension("")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
                parts.pop();
            }
            let source = std::fs::read_to_string(&path).expect("a readable source file");
            out.insert(parts.join("::"), source);
        }
    }
    out
}

/// The source without comments (a doc comment naming `crate::x` is no import).
fn code(source: &str) -> String {
    source
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `use` tree flattened into paths: `use a::{b, c::{d, e}}` → `a::b`, `a::c::d`,
/// `a::c::e`.
fn use_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("use ") {
        let before = rest[..at].chars().last();
        rest = &rest[at + 4..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let Some(end) = rest.find(';') else { break };
        let tree: String = rest[..end].chars().filter(|c| !c.is_whitespace()).collect();
        flatten("", &tree, &mut out);
        rest = &rest[end..];
    }
    out
}

fn flatten(prefix: &str, tree: &str, out: &mut Vec<String>) {
    let Some(open) = tree.find('{') else {
        out.push(format!("{prefix}{tree}"));
        return;
    };
    let head = format!("{prefix}{}", &tree[..open]);
    let inner = &tree[open + 1..tree.len().saturating_sub(1)];
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                flatten(&head, &inner[start..i], out);
                start = i + 1;
            }
            _ => {}
        }
    }
    flatten(&head, &inner[start..], out);
}

/// Paths written in the code: `crate::a::b…` and `super::a…`.
fn inline_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for start in ["crate::", "super::"] {
        let mut rest = code;
        while let Some(at) = rest.find(start) {
            let before = rest[..at].chars().last();
            let tail = &rest[at..];
            let len = tail
                .find(|c: char| !(c.is_ascii_lowercase() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            if !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                out.push(tail[..len].trim_end_matches(':').to_owned());
            }
            rest = &rest[at + start.len()..];
        }
    }
    out
}

/// The modules `module` refers to, by the longest module prefix of each path.
fn references(module: &str, source: &str, known: &BTreeMap<String, String>) -> BTreeSet<String> {
    let parent: Vec<&str> = match module.rsplit_once("::") {
        Some((p, _)) => p.split("::").collect(),
        None => Vec::new(),
    };
    let code = code(source);
    let mut out = BTreeSet::new();
    for path in use_paths(&code).into_iter().chain(inline_paths(&code)) {
        let segs: Vec<&str> = path.split("::").collect();
        let (base, segs): (Vec<&str>, &[&str]) = match segs.first() {
            Some(&"crate") => (Vec::new(), &segs[1..]),
            Some(&"super") => (parent.clone(), &segs[1..]),
            _ => continue,
        };
        for k in (0..=segs.len()).rev() {
            let candidate: Vec<&str> = base
                .iter()
                .chain(&segs[..k])
                .copied()
                .filter(|s| !s.is_empty())
                .collect();
            let candidate = candidate.join("::");
            if known.contains_key(&candidate) {
                // The crate root (`use crate::{…}` read inline) is every module's ancestor.
                if candidate != module && !candidate.is_empty() {
                    out.insert(candidate);
                }
                break;
            }
        }
    }
    out
}

fn is_ancestor(of: &str, module: &str) -> bool {
    of.is_empty() || module.starts_with(&format!("{of}::"))
}

/// The edges between modules neither of which is the other's ancestor.
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let known = modules();
    known
        .iter()
        .map(|(m, src)| {
            let refs = references(m, src, &known)
                .into_iter()
                .filter(|t| !is_ancestor(t, m) && !is_ancestor(m, t))
                .collect();
            (m.clone(), refs)
        })
        .collect()
}

/// A path from `to` back to `from`, if any (depth-first).
fn path_back(
    graph: &BTreeMap<String, BTreeSet<String>>,
    from: &str,
    to: &str,
) -> Option<Vec<String>> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![vec![to.to_owned()]];
    while let Some(path) = stack.pop() {
        let last = path.last().expect("never empty").clone();
        if last == from {
            return Some(path);
        }
        if !seen.insert(last.clone()) {
            continue;
        }
        for next in graph.get(&last).into_iter().flatten() {
            let mut p = path.clone();
            p.push(next.clone());
            stack.push(p);
        }
    }
    None
}

#[test]
fn modules_import_each_other_without_circles() {
    let graph = graph();
    assert!(
        graph.contains_key("worker::flush") && graph.contains_key("core::answer"),
        "the module tree was read: {:?}",
        graph.keys().collect::<Vec<_>>()
    );
    let mut circles = Vec::new();
    for (from, targets) in &graph {
        for to in targets {
            if let Some(back) = path_back(&graph, from, to) {
                circles.push(format!("{from} -> {}", back.join(" -> ")));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_reader_sees_every_kind_of_reference() {
    let known: BTreeMap<String, String> = ["", "a", "a::b", "a::c", "d"]
        .iter()
        .map(|m| (m.to_string(), String::new()))
        .collect();
    let source = "use super::c::{X, Y};\nuse crate::d;\n// crate::a::c in a comment\nfn f() { crate::a::c::g(); }";
    let refs = references("a::b", source, &known);
    assert_eq!(
        refs,
        ["a::c", "d"].iter().map(|s| s.to_string()).collect(),
        "{refs:?}"
    );
    let grouped = references("a::b", "use crate::{d, a::{c::Z}};", &known);
    assert_eq!(
        grouped,
        ["a::c", "d"].iter().map(|s| s.to_string()).collect(),
        "{grouped:?}"
    );
}
