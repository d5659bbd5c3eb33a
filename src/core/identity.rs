//! Who is signed in, read from the answer of `GET authMePath` (contract section 4.1).

use serde_json::Value;

/// The answer of the identity endpoint, as replay and recovery need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// 200 with a string `user.id`; the CSRF token for replays when the server gave one.
    SignedIn { user: String, csrf: Option<String> },
    /// 401, or 200 without a string `user.id`: nobody is signed in.
    SignedOut,
    /// Any other status (409 from an expected-account check among them). The flush
    /// stops and changes nothing.
    Unavailable { status: u16 },
}

/// Reads an identity answer. `body` is the parsed JSON body (`None` when it was not
/// JSON); `csrf_header` the `X-CSRF-Token` response header. The body's `csrfToken`
/// wins over the header when both are present.
pub fn read_identity(status: u16, body: Option<&Value>, csrf_header: Option<&str>) -> Identity {
    match status {
        200 => {
            let user = body
                .and_then(|b| b.get("user"))
                .and_then(|u| u.get("id"))
                .and_then(Value::as_str)
                .filter(|id| !id.is_empty());
            match user {
                Some(user) => {
                    let csrf = body
                        .and_then(|b| b.get("csrfToken"))
                        .and_then(Value::as_str)
                        .or(csrf_header)
                        .filter(|t| !t.is_empty())
                        .map(str::to_owned);
                    Identity::SignedIn {
                        user: user.to_owned(),
                        csrf,
                    }
                }
                None => Identity::SignedOut,
            }
        }
        401 => Identity::SignedOut,
        status => Identity::Unavailable { status },
    }
}

/// How much of an identity answer is read for `user.id` (contract 4.1, r3): a large
/// profile is an answer, not a network failure.
pub const MAX_IDENTITY_BODY: usize = 1024 * 1024;

/// An identity answer's body as the shell read it, within [`MAX_IDENTITY_BODY`].
#[derive(Debug, Clone, Copy)]
pub enum IdentityBody<'a> {
    /// The whole body, parsed as JSON.
    Json(&'a Value),
    /// The whole body, not JSON (or empty).
    NotJson,
    /// Longer than [`MAX_IDENTITY_BODY`]: an answer, but one whose account cannot be read.
    TooLarge,
}

/// Reads an identity answer whose body may have been too large to read whole. A 200 whose
/// body could not be read is neither signed in nor signed out: the check answered, and
/// the flush stops as for any other status (`identity-check`), never as offline.
pub fn read_identity_answer(
    status: u16,
    body: IdentityBody<'_>,
    csrf_header: Option<&str>,
) -> Identity {
    match body {
        IdentityBody::Json(v) => read_identity(status, Some(v), csrf_header),
        IdentityBody::NotJson => read_identity(status, None, csrf_header),
        IdentityBody::TooLarge if status == 200 => Identity::Unavailable { status },
        IdentityBody::TooLarge => read_identity(status, None, csrf_header),
    }
}

/// The longest account id the outbox accepts: it is sent as a header value.
pub const MAX_ACCOUNT_ID_LEN: usize = 256;

/// Whether an account id can travel as the expected-account header value exactly as the
/// server will compare it: 1–256 visible ASCII characters or inner spaces. Anything
/// else is refused where a page names an account (contract 7, r2): a non-Latin-1
/// character makes the browser's `Headers` throw on every write, and a Latin-1 one is
/// sent as bytes a server decoding UTF-8 would not match.
pub fn is_account_id(s: &str) -> bool {
    (1..=MAX_ACCOUNT_ID_LEN).contains(&s.len())
        && s.bytes().all(|b| (0x20..=0x7e).contains(&b))
        && !s.starts_with(' ')
        && !s.ends_with(' ')
}

/// Recovery acts only when a fresh identity answer names exactly the account the page
/// said it acts for (contract section 6).
pub fn confirms(identity: &Identity, owner: &str) -> bool {
    matches!(identity, Identity::SignedIn { user, .. } if user == owner)
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn signed_in_with_token_from_body_or_header() {
        let b = json!({"user":{"id":"alice"},"csrfToken":"t1"});
        assert_eq!(
            read_identity(200, Some(&b), Some("t2")),
            Identity::SignedIn {
                user: "alice".into(),
                csrf: Some("t1".into())
            }
        );
        let b = json!({"user":{"id":"alice"}});
        assert_eq!(
            read_identity(200, Some(&b), Some("t2")),
            Identity::SignedIn {
                user: "alice".into(),
                csrf: Some("t2".into())
            }
        );
        assert_eq!(
            read_identity(200, Some(&b), None),
            Identity::SignedIn {
                user: "alice".into(),
                csrf: None
            }
        );
    }

    #[test]
    fn no_string_user_id_means_signed_out() {
        for b in [
            json!({"user":null}),
            json!({"user":{"id":5}}),
            json!({}),
            json!({"user":{"id":""}}),
        ] {
            assert_eq!(
                read_identity(200, Some(&b), None),
                Identity::SignedOut,
                "{b}"
            );
        }
        assert_eq!(read_identity(200, None, None), Identity::SignedOut);
        assert_eq!(read_identity(401, None, None), Identity::SignedOut);
    }

    #[test]
    fn other_statuses_are_unavailable() {
        for s in [204, 302, 403, 409, 500, 503] {
            assert_eq!(
                read_identity(s, None, None),
                Identity::Unavailable { status: s }
            );
        }
    }

    #[test]
    fn a_body_too_large_to_read_is_an_answer_whose_account_is_unknown() {
        assert_eq!(
            read_identity_answer(200, IdentityBody::TooLarge, Some("t")),
            Identity::Unavailable { status: 200 },
            "never signed out for a profile too large to read"
        );
        assert_eq!(
            read_identity_answer(401, IdentityBody::TooLarge, None),
            Identity::SignedOut
        );
        let b = json!({"user":{"id":"alice"},"profile":"x".repeat(900 * 1024)});
        assert_eq!(
            read_identity_answer(200, IdentityBody::Json(&b), Some("t")),
            Identity::SignedIn {
                user: "alice".into(),
                csrf: Some("t".into())
            }
        );
        assert_eq!(
            read_identity_answer(200, IdentityBody::NotJson, None),
            Identity::SignedOut
        );
    }

    #[test]
    fn account_ids_must_be_header_values() {
        for ok in ["alice", "u-1", "a b", "user@example.com", &"x".repeat(256)] {
            assert!(is_account_id(ok), "{ok}");
        }
        for bad in [
            "",
            " alice",
            "alice ",
            "caf\u{e9}",
            "\u{1F600}",
            "a\tb",
            "a\nb",
            &"x".repeat(257),
        ] {
            assert!(!is_account_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn confirmation_needs_the_same_account() {
        let alice = Identity::SignedIn {
            user: "alice".into(),
            csrf: None,
        };
        assert!(confirms(&alice, "alice"));
        assert!(!confirms(&alice, "bob"));
        assert!(!confirms(&Identity::SignedOut, "alice"));
        assert!(!confirms(&Identity::Unavailable { status: 409 }, "alice"));
    }
}
