//! The credential of an app that authenticates with a token instead of a cookie
//! (contract 4.1 and 6, r3): given by `AUTH_SESSION`'s `authorization`, held for the
//! session (never stored with a record), carried by the identity check and by the
//! replays of that account's records, and asked for again (`AUTH_NEEDED`) when the
//! server refuses it or a restarted worker no longer has it.

use std::fmt;

/// The longest `authorization` value accepted: the usual limit of one request header
/// line (a JWT with many claims runs to a few KB).
pub const MAX_AUTHORIZATION_LEN: usize = 8192;

/// An `Authorization` header value (`Bearer …`, or any scheme the site's server reads).
/// Its `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Authorization(String);

impl fmt::Debug for Authorization {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let scheme = self.0.split(' ').next().unwrap_or("");
        write!(f, "Authorization({scheme} …)")
    }
}

impl Authorization {
    /// A value that can be sent as a header exactly as given: 1 to
    /// [`MAX_AUTHORIZATION_LEN`] visible ASCII characters or inner spaces.
    pub fn parse(s: &str) -> Result<Authorization, String> {
        if s.is_empty() || s.len() > MAX_AUTHORIZATION_LEN {
            return Err(format!(
                "must be 1 to {MAX_AUTHORIZATION_LEN} characters long, got {}",
                s.len()
            ));
        }
        if !s.bytes().all(|b| (0x20..=0x7e).contains(&b)) || s.starts_with(' ') || s.ends_with(' ')
        {
            return Err(
                "must be visible ASCII characters or inner spaces (it is sent as the Authorization header)"
                    .into(),
            );
        }
        Ok(Authorization(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The credential the worker holds: whose it is, and the header value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub user: String,
    pub authorization: Authorization,
}

impl Credential {
    /// The `Authorization` a replay of a record owned by `owner` carries: the session's
    /// credential, only for that account's own records.
    pub fn for_owner(&self, owner: Option<&str>) -> Option<&Authorization> {
        (owner == Some(self.user.as_str())).then_some(&self.authorization)
    }
}

/// What the worker has for the identity check of a flush.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bearer {
    /// A cookie session (or nobody signed in): nothing to add.
    Cookie,
    /// The credential to send.
    Held(Credential),
    /// The last `AUTH_SESSION` gave a credential that this worker does not hold (it was
    /// restarted, and `persistAuthorization` is false): the page is asked for it
    /// (`AUTH_NEEDED`) before anything is replayed.
    Missing { user: String },
}

/// What the session says, and what this worker holds: `session_user` and `bearer` as
/// persisted (whether that `AUTH_SESSION` carried a credential), `held` in memory (or
/// read back from IndexedDB where `persistAuthorization` keeps it).
pub fn bearer(
    session_user: Option<&str>,
    bearer_session: bool,
    held: Option<&Credential>,
) -> Bearer {
    let Some(user) = session_user else {
        return Bearer::Cookie;
    };
    if !bearer_session {
        return Bearer::Cookie;
    }
    match held {
        Some(c) if c.user == user => Bearer::Held(c.clone()),
        _ => Bearer::Missing {
            user: user.to_owned(),
        },
    }
}

impl Bearer {
    /// The `Authorization` an identity check carries.
    pub fn authorization(&self) -> Option<&Authorization> {
        match self {
            Bearer::Held(c) => Some(&c.authorization),
            _ => None,
        }
    }

    /// The account a 401 to an identity check (or a replay) asks a credential for: the
    /// session's, when it is a bearer session. A cookie app's 401 means signed out.
    pub fn needs_on_401(&self) -> Option<&str> {
        match self {
            Bearer::Cookie => None,
            Bearer::Held(c) => Some(&c.user),
            Bearer::Missing { user } => Some(user),
        }
    }
}

/// Whether an `AUTH_SESSION` that names an account starts the flush a stop awaits
/// (`core::delivery::StopReason::awaits_trigger`): not when it carries the very
/// credential the server just refused (a page whose token provider hands back the same
/// expired token would otherwise loop: flush, 401, `AUTH_NEEDED`, the same token…).
pub fn sign_in_flushes(given: Option<&Authorization>, refused: Option<&Authorization>) -> bool {
    match (given, refused) {
        (Some(g), Some(r)) => g != r,
        _ => true,
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

    fn auth(s: &str) -> Authorization {
        Authorization::parse(s).expect("valid")
    }

    #[test]
    fn an_authorization_must_be_a_header_value() {
        for ok in [
            "Bearer abc.def.ghi",
            "Token x",
            &"b".repeat(MAX_AUTHORIZATION_LEN),
        ] {
            assert!(Authorization::parse(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            " Bearer x",
            "Bearer x ",
            "Bearer caf\u{e9}",
            "Bearer a\nb",
            &"b".repeat(MAX_AUTHORIZATION_LEN + 1),
        ] {
            assert!(Authorization::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            format!("{:?}", auth("Bearer secret-token")),
            "Authorization(Bearer …)",
            "never printed"
        );
    }

    #[test]
    fn the_credential_goes_with_its_own_accounts_records_only() {
        let c = Credential {
            user: "alice".into(),
            authorization: auth("Bearer a"),
        };
        assert_eq!(c.for_owner(Some("alice")), Some(&auth("Bearer a")));
        assert_eq!(c.for_owner(Some("bob")), None);
        assert_eq!(c.for_owner(None), None, "an unknown owner's record never");
    }

    #[test]
    fn a_bearer_session_without_its_credential_asks_for_it() {
        let alice = Credential {
            user: "alice".into(),
            authorization: auth("Bearer a"),
        };
        assert_eq!(bearer(None, false, None), Bearer::Cookie);
        assert_eq!(bearer(Some("alice"), false, None), Bearer::Cookie);
        assert_eq!(
            bearer(Some("alice"), true, Some(&alice)),
            Bearer::Held(alice.clone())
        );
        // A restarted worker (persistAuthorization false) holds nothing.
        assert_eq!(
            bearer(Some("alice"), true, None),
            Bearer::Missing {
                user: "alice".into()
            }
        );
        // A credential of the account before is no credential of this one.
        assert_eq!(
            bearer(Some("bob"), true, Some(&alice)),
            Bearer::Missing { user: "bob".into() }
        );
        assert_eq!(
            bearer(Some("alice"), true, Some(&alice)).needs_on_401(),
            Some("alice")
        );
        assert_eq!(bearer(Some("alice"), false, None).needs_on_401(), None);
        assert_eq!(
            bearer(Some("alice"), true, Some(&alice)).authorization(),
            Some(&auth("Bearer a"))
        );
    }

    #[test]
    fn the_refused_credential_given_again_does_not_flush() {
        let (old, new) = (auth("Bearer old"), auth("Bearer new"));
        assert!(sign_in_flushes(Some(&new), Some(&old)));
        assert!(!sign_in_flushes(Some(&old), Some(&old)));
        assert!(sign_in_flushes(None, Some(&old)), "a cookie sign-in");
        assert!(sign_in_flushes(Some(&new), None));
    }
}
