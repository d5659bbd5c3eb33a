//! The crate README's five-minute example is `examples/quickstart.rs`, which builds with
//! the tests: the two must not drift apart.

#[test]
fn the_readme_shows_the_quickstart_example_as_it_is() {
    let readme = include_str!("../README.md");
    let example = include_str!("../examples/quickstart.rs");
    assert!(
        readme.contains(&format!("```rust\n{example}```")),
        "README.md must show examples/quickstart.rs verbatim in a ```rust block"
    );
}
