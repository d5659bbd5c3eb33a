//! The package README tells a server how to word a CSRF refusal so that the outbox
//! re-checks the identity instead of giving the write to a person ("What your server must
//! do"): its list of failure words is [`FAILURE_STEMS`], checked here.

use super::FAILURE_STEMS;

const README: &str = include_str!("../../package/README.md");

#[test]
fn the_readme_lists_the_failure_words_of_a_csrf_refusal() {
    let bullet = README
        .split("- **Say a CSRF failure in words.**")
        .nth(1)
        .and_then(|rest| rest.split("\n- ").next())
        .expect("package/README.md has its CSRF bullet");
    let listed = bullet
        .split("a word of failure")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .expect("the bullet lists the words of failure in parentheses");
    let words: Vec<String> = listed
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|w| w.trim_end_matches('…').to_string())
        .collect();
    assert_eq!(
        words, FAILURE_STEMS,
        "package/README.md's CSRF bullet: {listed}"
    );
    assert!(
        bullet.contains("CSRF or XSRF"),
        "the words naming CSRF are said"
    );
}
