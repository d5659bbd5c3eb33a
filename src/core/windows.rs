//! Which account a window is on, and which reports it may get (contract 5, r4).
//!
//! With a cookie session every window of the origin shares the one account. With bearer
//! credentials each window (tab) may be on its own: a window is on the account it last
//! named in `AUTH_SESSION`, kept with its client id in IndexedDB so that a worker the
//! browser stopped and started again still knows it. One account's reports (a write's
//! answer, its queuing, a request for its credential, its records' details) go to that
//! account's windows only; a window whose account is not known is treated as another
//! account's.

/// What a window said in its last `AUTH_SESSION`, as kept in IndexedDB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    pub client_id: String,
    /// `None`: it signed out.
    pub user: Option<String>,
}

/// The session as the worker holds it: the last `AUTH_SESSION`'s account of any window,
/// and whether it carried a bearer credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session<'a> {
    pub user: Option<&'a str>,
    pub bearer: bool,
}

/// The account a window is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OnAccount {
    Account(String),
    /// Signed out (it said so, or the cookie session names nobody).
    Nobody,
    /// Not known: a bearer session, and this window never named its account (or its
    /// record was dropped). It gets what another account's window gets.
    Unknown,
}

impl OnAccount {
    /// The account whose records' details this window may see (`None`: only records of
    /// no known owner, contract 5 r2).
    pub fn viewer(&self) -> Option<&str> {
        match self {
            OnAccount::Account(a) => Some(a),
            _ => None,
        }
    }

    /// Whether a report of `owner`'s write (`MUTATION_SETTLED`, `MUTATION_QUEUED`,
    /// `AUTH_NEEDED`) may go to this window. A write of no known owner is reported to
    /// every window: its details are everyone's to decide on (adoption).
    pub fn may_see(&self, owner: Option<&str>) -> bool {
        match owner {
            None => true,
            Some(o) => self.viewer() == Some(o),
        }
    }
}

/// The account of the window `client_id`: the one it named last when it named one (its
/// word is kept, cookie session or not: a tab still showing account A never gets B's
/// answers); else the cookie session's account; else (a bearer session) not known.
pub fn account_of(client_id: &str, named: &[Named], session: Session<'_>) -> OnAccount {
    match named.iter().find(|n| n.client_id == client_id) {
        Some(Named { user: Some(u), .. }) => OnAccount::Account(u.clone()),
        Some(Named { user: None, .. }) => OnAccount::Nobody,
        None if session.bearer => OnAccount::Unknown,
        None => match session.user {
            Some(u) => OnAccount::Account(u.to_owned()),
            None => OnAccount::Nobody,
        },
    }
}

/// The kept rows of windows that are no longer open (to delete).
pub fn gone<'a>(named: &'a [Named], open: &[String]) -> Vec<&'a str> {
    named
        .iter()
        .filter(|n| !open.contains(&n.client_id))
        .map(|n| n.client_id.as_str())
        .collect()
}

/// How many `MUTATION_SETTLED` reports are kept per account for a window of it that is
/// not open yet (contract 5, issue 34 item 8a): the newest, so an app that opens after
/// a long absence learns the latest answers; older ones are dropped (their records are
/// gone from the queue all the same, and the app reloads its data when it opens).
pub const KEPT_SETTLED_PER_ACCOUNT: usize = 50;

/// At most this many accounts' reports are kept; the account whose reports are oldest
/// goes first.
pub const KEPT_SETTLED_ACCOUNTS: usize = 20;

/// Appends `new` to an account's kept reports, keeping the newest
/// [`KEPT_SETTLED_PER_ACCOUNT`].
pub fn keep_newest<T>(kept: &mut Vec<T>, new: impl IntoIterator<Item = T>) {
    kept.extend(new);
    let over = kept.len().saturating_sub(KEPT_SETTLED_PER_ACCOUNT);
    kept.drain(..over);
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

    fn named(id: &str, user: Option<&str>) -> Named {
        Named {
            client_id: id.into(),
            user: user.map(Into::into),
        }
    }

    const BEARER_B: Session<'static> = Session {
        user: Some("b"),
        bearer: true,
    };
    const COOKIE_B: Session<'static> = Session {
        user: Some("b"),
        bearer: false,
    };

    #[test]
    fn a_window_is_on_the_account_it_named_last() {
        let rows = [
            named("t1", Some("a")),
            named("t2", Some("b")),
            named("t3", None),
        ];
        for session in [BEARER_B, COOKIE_B] {
            assert_eq!(
                account_of("t1", &rows, session),
                OnAccount::Account("a".into())
            );
            assert_eq!(
                account_of("t2", &rows, session),
                OnAccount::Account("b".into())
            );
            assert_eq!(account_of("t3", &rows, session), OnAccount::Nobody);
        }
    }

    #[test]
    fn a_window_that_never_named_one_is_on_the_cookie_session_or_unknown() {
        assert_eq!(
            account_of("t9", &[], COOKIE_B),
            OnAccount::Account("b".into())
        );
        assert_eq!(
            account_of(
                "t9",
                &[],
                Session {
                    user: None,
                    bearer: false
                }
            ),
            OnAccount::Nobody
        );
        // Bearer: the last AUTH_SESSION's account is some tab's, not necessarily this one's.
        assert_eq!(account_of("t9", &[], BEARER_B), OnAccount::Unknown);
    }

    #[test]
    fn reports_of_one_account_reach_its_windows_only() {
        let a = OnAccount::Account("a".into());
        assert!(a.may_see(Some("a")));
        assert!(!a.may_see(Some("b")));
        assert!(a.may_see(None), "a write of no known owner is everyone's");
        for other in [OnAccount::Nobody, OnAccount::Unknown] {
            assert!(!other.may_see(Some("a")), "{other:?}");
            assert!(other.may_see(None));
            assert_eq!(other.viewer(), None);
        }
        assert_eq!(a.viewer(), Some("a"));
    }

    #[test]
    fn rows_of_closed_windows_are_found() {
        let rows = [named("t1", Some("a")), named("t2", Some("b"))];
        assert_eq!(gone(&rows, &["t2".into(), "t5".into()]), vec!["t1"]);
        assert!(gone(&rows, &["t1".into(), "t2".into()]).is_empty());
    }

    #[test]
    fn kept_reports_are_the_newest() {
        let mut kept: Vec<usize> = (0..KEPT_SETTLED_PER_ACCOUNT - 1).collect();
        keep_newest(&mut kept, [1000, 1001, 1002]);
        assert_eq!(kept.len(), KEPT_SETTLED_PER_ACCOUNT);
        assert_eq!(kept[0], 2, "the oldest went");
        assert_eq!(kept.last(), Some(&1002));
    }
}
