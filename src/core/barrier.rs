//! The sign-in barrier (contract 4.5, end, r3): the identity a flush checked holds only
//! until the browser's session can change. From the moment an auth-route request (a
//! sign-in, a sign-out, a token refresh; any method or mode) passes through the worker,
//! or an `AUTH_SESSION` arrives, no replay is sent until that request was answered (that
//! session persisted) and a fresh `GET authMePath`, sent after it, named the account
//! again. Replays already on the wire carry the old cookies and finish.
//!
//! (r4) The barrier belongs to the origin: a session change seen by another outbox worker
//! of the origin (another registration's scope, an old or a new version) is told to this
//! one (`worker::barrier`, a `BroadcastChannel`) and counts here as a remote change,
//! open until that worker says it settled, or until the time it gave runs out.
//!
//! The state is how many such events were seen (`epoch`), and which are still open (a
//! count of this worker's own, the ids of other workers'). An identity check counts only
//! when it was sent while none was open, and a replay may be sent only while the epoch is
//! still the one of its check.

/// At most this many other workers' changes are tracked at once; a flood of raises (a
/// misbehaving page of the origin) cannot grow the state without bound. The oldest is
/// forgotten first — it is the nearest to its time limit anyway.
pub const MAX_REMOTE_OPEN: usize = 64;

/// The `BroadcastChannel` on which the outbox workers of an origin tell each other of
/// session changes, and the Web Lock they fence them with: replays are sent only under a
/// worker's shared hold of it, and a sign-in leaves only once it holds it exclusively
/// (or after [`FENCE_WAIT_MS`]), so no worker's replay can be on its way out with a
/// check made before the sign-in.
pub const ORIGIN_CHANNEL: &str = "sw-outbox:sign-in";
pub const ORIGIN_LOCK: &str = "sw-outbox:sign-in";

/// How long a sign-in waits for the other workers to let go of their shared holds before
/// it is sent anyway: a live worker lets go as soon as it reads the raise (milliseconds);
/// only a hung one could hold it, and a sign-in is never held back for good.
pub const FENCE_WAIT_MS: u32 = 10_000;

/// The longest another worker's change is taken to stay open without its settle (its
/// worker may have been stopped meanwhile): a flood of raises cannot bar replays longer.
pub const MAX_REMOTE_HOLD_MS: u32 = 120_000;

/// What one outbox worker tells the others of its origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Signal {
    /// A session change was seen; open at most `hold_ms` unless settled first.
    Raise { id: String, hold_ms: u32 },
    /// That change settled (answered, persisted, or given up).
    Settle { id: String },
}

impl Signal {
    /// A message's fields (`t`: `raise` or `settle`, `id`, `ms`) as a signal; anything else
    /// is not one (`None`). The time is bounded by [`MAX_REMOTE_HOLD_MS`].
    pub fn read(kind: Option<&str>, id: Option<&str>, hold_ms: Option<f64>) -> Option<Signal> {
        let id = id.filter(|i| !i.is_empty() && i.len() <= 128)?.to_owned();
        match kind? {
            "raise" => {
                let ms = hold_ms.filter(|m| m.is_finite() && *m >= 0.0)?;
                Some(Signal::Raise {
                    id,
                    hold_ms: ms.min(MAX_REMOTE_HOLD_MS as f64) as u32,
                })
            }
            "settle" => Some(Signal::Settle { id }),
            _ => None,
        }
    }
}

/// Whether a worker in this `ServiceWorker.state` may flush (4.5, r4): only its
/// registration's active version (`activating`, `activated`). An installing or waiting
/// version, or one replaced (`redundant`), starts nothing, whatever its `online` event,
/// timers or `sync` say. An unknown state (`None`: an engine without
/// `self.serviceWorker`) is taken to be active.
pub fn flushes_in_state(state: Option<&str>) -> bool {
    matches!(state, None | Some("activating") | Some("activated"))
}

/// The barrier's state in one worker.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SignInBarrier {
    epoch: u64,
    open: u32,
    /// Other workers' changes still open, by the id their worker gave them.
    remote: Vec<String>,
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

    /// Another worker of the origin saw a session change (`id`: its name for it). The
    /// epoch moves even for an id already open: a check made since may predate it.
    pub fn raise_remote(&mut self, id: &str) {
        self.epoch += 1;
        if self.remote.iter().any(|r| r == id) {
            return;
        }
        if self.remote.len() >= MAX_REMOTE_OPEN {
            self.remote.remove(0);
        }
        self.remote.push(id.to_owned());
    }

    /// That worker's change `id` settled (or its time ran out). Whether it was open.
    pub fn settle_remote(&mut self, id: &str) -> bool {
        let before = self.remote.len();
        self.remote.retain(|r| r != id);
        self.remote.len() != before
    }

    /// Whether one of this worker's own changes is still open (it keeps the origin's
    /// fence while one is).
    pub fn is_open_here(&self) -> bool {
        self.open > 0
    }

    /// Whether a session change is still open (an identity check now would not count).
    pub fn is_open(&self) -> bool {
        self.open > 0 || !self.remote.is_empty()
    }

    /// An identity check about to be sent: the token it gives replays, or `None` while a
    /// session change is open (wait until it is settled, then check).
    pub fn check_begins(&self) -> Option<Checked> {
        (!self.is_open()).then_some(Checked(self.epoch))
    }

    /// Whether a replay may be sent now under an identity checked as `checked`: nothing
    /// that may have changed the session was seen since the check was sent.
    pub fn allows(&self, checked: Checked) -> bool {
        !self.is_open() && self.epoch == checked.0
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
    fn another_workers_change_bars_replays_until_it_settles() {
        let mut b = SignInBarrier::default();
        let checked = b.check_begins().expect("nothing open");
        b.raise_remote("w1:1");
        assert!(
            !b.allows(checked),
            "a sign-in through another scope stops replays"
        );
        assert_eq!(b.check_begins(), None, "no check counts while it is open");
        assert!(!b.settle_remote("w2:1"), "another id settles nothing");
        assert!(b.is_open());
        assert!(b.settle_remote("w1:1"));
        assert!(
            !b.allows(checked),
            "settled, but the account was not named again since"
        );
        let again = b.check_begins().expect("settled");
        assert!(b.allows(again));
        // Raised again under the same id (a message seen twice): still a change.
        b.raise_remote("w1:1");
        b.raise_remote("w1:1");
        assert!(!b.allows(again));
        assert!(b.settle_remote("w1:1"));
        assert!(
            !b.is_open(),
            "one settle closes an id however often it was raised"
        );
    }

    #[test]
    fn local_and_remote_changes_both_hold_it() {
        let mut b = SignInBarrier::default();
        b.raise();
        b.raise_remote("w1:1");
        b.settle();
        assert!(b.is_open(), "the remote one is still open");
        b.raise();
        assert!(b.settle_remote("w1:1"));
        assert!(b.is_open(), "the local one is still open");
        b.settle();
        assert!(!b.is_open());
    }

    #[test]
    fn only_the_active_version_flushes() {
        for active in [None, Some("activating"), Some("activated")] {
            assert!(flushes_in_state(active), "{active:?}");
        }
        for not in [
            Some("parsed"),
            Some("installing"),
            Some("installed"),
            Some("redundant"),
        ] {
            assert!(!flushes_in_state(not), "{not:?}");
        }
    }

    #[test]
    fn signals_are_read_strictly() {
        assert_eq!(
            Signal::read(Some("raise"), Some("w:1"), Some(2500.0)),
            Some(Signal::Raise {
                id: "w:1".into(),
                hold_ms: 2500
            })
        );
        assert_eq!(
            Signal::read(Some("raise"), Some("w:1"), Some(1e12)),
            Some(Signal::Raise {
                id: "w:1".into(),
                hold_ms: MAX_REMOTE_HOLD_MS
            })
        );
        assert_eq!(
            Signal::read(Some("settle"), Some("w:1"), None),
            Some(Signal::Settle { id: "w:1".into() })
        );
        for (k, id, ms) in [
            (None, Some("w:1"), Some(1.0)),
            (Some("raise"), None, Some(1.0)),
            (Some("raise"), Some(""), Some(1.0)),
            (Some("raise"), Some("w:1"), None),
            (Some("raise"), Some("w:1"), Some(f64::NAN)),
            (Some("raise"), Some("w:1"), Some(-1.0)),
            (Some("lower"), Some("w:1"), Some(1.0)),
        ] {
            assert_eq!(Signal::read(k, id, ms), None, "{k:?} {id:?} {ms:?}");
        }
        let long = "x".repeat(129);
        assert_eq!(Signal::read(Some("settle"), Some(&long), None), None);
    }

    #[test]
    fn remote_changes_are_bounded() {
        let mut b = SignInBarrier::default();
        for i in 0..(MAX_REMOTE_OPEN + 10) {
            b.raise_remote(&format!("w:{i}"));
        }
        assert_eq!(b.remote.len(), MAX_REMOTE_OPEN);
        assert!(!b.settle_remote("w:0"), "the oldest was forgotten");
        assert!(b.settle_remote(&format!("w:{}", MAX_REMOTE_OPEN + 9)));
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
