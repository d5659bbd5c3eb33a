//! The sign-in barrier (contract 4.5, end, r3): the identity a flush checked holds only
//! until the browser's session can change. From the moment an auth-route request (a
//! sign-in, a sign-out, a token refresh; any method or mode) passes through the worker,
//! or an `AUTH_SESSION` arrives, no replay is sent until that request was answered (that
//! session persisted) and a fresh `GET authMePath`, sent after it, named the account
//! again. Replays already on the wire carry the old cookies and finish.
//!
//! The state is two numbers: how many such events were seen (`epoch`), and how many are
//! still open. An identity check counts only when it was sent while none was open, and a
//! replay may be sent only while the epoch is still the one of its check.

/// The barrier's state in one worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SignInBarrier {
    epoch: u64,
    open: u32,
}

/// An identity check that counts: it was sent while no session change was open, at this
/// epoch. Replays sent under it are allowed while the epoch has not moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checked(u64);

impl SignInBarrier {
    /// A session may be changing (an auth-route request seen, an `AUTH_SESSION` arrived).
    pub fn raise(&mut self) {
        self.epoch += 1;
        self.open += 1;
    }

    /// That request was answered (or failed), that session persisted (or not).
    pub fn settle(&mut self) {
        self.open = self.open.saturating_sub(1);
    }

    /// Whether a session change is still open (an identity check now would not count).
    pub fn is_open(&self) -> bool {
        self.open > 0
    }

    /// An identity check about to be sent: the token it gives replays, or `None` while a
    /// session change is open (wait until it is settled, then check).
    pub fn check_begins(&self) -> Option<Checked> {
        (self.open == 0).then_some(Checked(self.epoch))
    }

    /// Whether a replay may be sent now under an identity checked as `checked`: nothing
    /// that may have changed the session was seen since the check was sent.
    pub fn allows(&self, checked: Checked) -> bool {
        self.open == 0 && self.epoch == checked.0
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;

    #[test]
    fn a_check_holds_until_a_session_change_is_seen() {
        let mut b = SignInBarrier::default();
        let checked = b.check_begins().expect("nothing open");
        assert!(b.allows(checked));
        b.raise();
        assert!(
            !b.allows(checked),
            "a sign-in passing through stops replays at once"
        );
        assert_eq!(b.check_begins(), None, "no check counts while it is open");
        b.settle();
        assert!(
            !b.allows(checked),
            "answered, but the account was not named again since"
        );
        let again = b.check_begins().expect("settled");
        assert!(b.allows(again), "a fresh check after it lets replays go on");
    }

    #[test]
    fn a_change_seen_during_a_check_voids_it() {
        let mut b = SignInBarrier::default();
        let checked = b.check_begins().expect("nothing open");
        // The sign-in passes through while /auth/me is on its way, and is answered before it.
        b.raise();
        b.settle();
        assert!(!b.allows(checked), "the answer may predate the new cookie");
    }

    #[test]
    fn every_open_change_must_settle() {
        let mut b = SignInBarrier::default();
        b.raise();
        b.raise();
        b.settle();
        assert!(b.is_open());
        assert_eq!(b.check_begins(), None);
        b.settle();
        assert!(!b.is_open());
        b.settle(); // a settle too many never reopens it
        assert!(b.check_begins().is_some());
    }
}
