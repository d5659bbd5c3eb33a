//! The crate README's Rust snippets are the examples, which build with the tests: every
//! ```rust block of the README is one of `examples/*.rs` verbatim, and each example is
//! shown. So every name a snippet uses is defined, and the snippets compile.

const EXAMPLES: [(&str, &str); 3] = [
    ("quickstart", include_str!("../examples/quickstart.rs")),
    ("postgres", include_str!("../examples/postgres.rs")),
    (
        "transactional",
        include_str!("../examples/transactional.rs"),
    ),
];

/// The README's fenced blocks: (info string, text).
fn blocks(readme: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut open: Option<(String, String)> = None;
    for line in readme.split_inclusive('\n') {
        let fence = line.trim_end().strip_prefix("```");
        match (&mut open, fence) {
            (None, Some(info)) => open = Some((info.trim().to_owned(), String::new())),
            (Some(_), Some("")) => out.extend(open.take()),
            (Some((_, text)), _) => text.push_str(line),
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "a code block is not closed");
    out
}

#[test]
fn every_rust_snippet_of_the_readme_is_an_example_verbatim() {
    let readme = include_str!("../README.md");
    let rust: Vec<String> = blocks(readme)
        .into_iter()
        .filter(|(info, _)| info.starts_with("rust"))
        .map(|(info, text)| {
            assert_eq!(info, "rust", "no ignored or untested snippets: {info}");
            text
        })
        .collect();
    for text in &rust {
        assert!(
            EXAMPLES.iter().any(|(_, e)| e == text),
            "a README snippet that is not an example verbatim:\n{text}"
        );
    }
    for (name, example) in EXAMPLES {
        assert!(
            rust.iter().any(|t| t == example),
            "README.md must show examples/{name}.rs verbatim in a ```rust block"
        );
    }
}

#[test]
fn the_quickstarts_dependencies_are_listed() {
    let readme = include_str!("../README.md");
    let toml: Vec<String> = blocks(readme)
        .into_iter()
        .filter(|(info, _)| info == "toml")
        .map(|(_, t)| t)
        .collect();
    let quick = toml
        .first()
        .expect("a [dependencies] block before the quickstart");
    for dep in [
        "sw-outbox-idempotency",
        "axum",
        "tokio",
        "serde_json",
        "tracing-subscriber",
    ] {
        assert!(
            quick.lines().any(|l| l.starts_with(&format!("{dep} ="))),
            "{dep} missing from the quickstart's dependencies:\n{quick}"
        );
    }
    let pg_only = toml
        .iter()
        .find(|t| t.contains("default-features = false"))
        .expect("how a PostgreSQL-only app turns SQLite off");
    assert!(pg_only.contains("features = [\"postgres\"]"), "{pg_only}");
    assert!(pg_only.contains("sqlx = { version = \"0.8"), "{pg_only}");
}
