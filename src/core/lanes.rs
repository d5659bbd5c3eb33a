//! First attempts keep their lane's order. Contract 4.3 orders replays; a write made
//! while earlier writes of its lane are still unresolved would otherwise go straight to
//! the server and be applied before them (an edit made online overtaking the stale edit
//! queued offline). Choice, written down in docs/PROTOCOL.md section 2: such a write is
//! queued behind them, without a first attempt, and replayed after them by the usual
//! triggers.
//!
//! A lane is the rule of 4.3 seen from one write: records of the same owner in the same
//! workspace, with account-level records (no workspace) a barrier both ways. Records of
//! other owners, and of unknown owners, hold nothing back.

/// The ordering a write takes part in: its owner and its workspace (`None`: an
/// account-level write).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lane {
    pub owner: String,
    pub workspace: Option<String>,
}

impl Lane {
    /// The lane of a write; writes of unknown owner have none (they are never replayed
    /// automatically, so nothing could be ordered after them).
    pub fn of(owner: Option<&str>, workspace: Option<&str>) -> Option<Lane> {
        owner.map(|o| Lane {
            owner: o.to_owned(),
            workspace: workspace.map(str::to_owned),
        })
    }

    /// Whether a later write of this lane must stay behind an earlier one of `earlier`.
    pub fn follows(&self, earlier: &Lane) -> bool {
        self.owner == earlier.owner
            && (self.workspace.is_none()
                || earlier.workspace.is_none()
                || self.workspace == earlier.workspace)
    }
}

/// The unresolved records of the queue (queued or needs-attention), counted per lane.
/// A list, not a map: a queue holds few distinct lanes, and every lookup is a scan of
/// the lanes a write follows anyway.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StoredLanes {
    counts: Vec<(Lane, u32)>,
}

impl StoredLanes {
    /// Counts the lanes of records read from the queue (unknown owners have none).
    pub fn from_lanes(lanes: impl IntoIterator<Item = Option<Lane>>) -> StoredLanes {
        let mut s = StoredLanes::default();
        for lane in lanes.into_iter().flatten() {
            s.add(&lane);
        }
        s
    }

    pub fn add(&mut self, lane: &Lane) {
        match self.counts.iter_mut().find(|(l, _)| l == lane) {
            Some((_, n)) => *n += 1,
            None => self.counts.push((lane.clone(), 1)),
        }
    }

    /// One record of the lane is resolved (replayed, discarded) or was never stored.
    pub fn remove(&mut self, lane: &Lane) {
        if let Some(i) = self.counts.iter().position(|(l, _)| l == lane) {
            self.counts[i].1 -= 1;
            if self.counts[i].1 == 0 {
                self.counts.swap_remove(i);
            }
        }
    }

    /// Whether a new write of `lane` has an unresolved record ahead of it.
    pub fn holds_back(&self, lane: &Lane) -> bool {
        self.counts.iter().any(|(earlier, _)| lane.follows(earlier))
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }
}

/// A write of this worker that has not yet been answered a first attempt or handed to
/// the store, in arrival order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticket(pub u64);

/// Writes still deciding (a first attempt under way, or a record about to be stored).
/// A later write of a following lane waits until every earlier one is settled, so that
/// it sees their outcome and is stored after them.
#[derive(Debug, Default)]
pub struct Deciding {
    next: u64,
    live: Vec<(Ticket, Lane)>,
}

impl Deciding {
    /// Registers a write on arrival.
    pub fn enter(&mut self, lane: Lane) -> Ticket {
        let t = Ticket(self.next);
        self.next += 1;
        self.live.push((t, lane));
        t
    }

    /// The earlier writes that `ticket` must wait for.
    pub fn ahead_of(&self, ticket: Ticket) -> Vec<Ticket> {
        let Some(lane) = self.lane(ticket) else {
            return Vec::new();
        };
        self.live
            .iter()
            .filter(|(t, l)| *t < ticket && lane.follows(l))
            .map(|(t, _)| *t)
            .collect()
    }

    fn lane(&self, ticket: Ticket) -> Option<&Lane> {
        self.live.iter().find(|(t, _)| *t == ticket).map(|(_, l)| l)
    }

    /// The write is settled: answered by the server, or its record handed to the store.
    pub fn leave(&mut self, ticket: Ticket) {
        self.live.retain(|(t, _)| *t != ticket);
    }

    pub fn is_live(&self, ticket: Ticket) -> bool {
        self.lane(ticket).is_some()
    }
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn lane(o: &str, w: Option<&str>) -> Lane {
        Lane::of(Some(o), w).expect("owned")
    }

    #[test]
    fn a_lane_is_one_owner_and_workspace_with_account_level_writes_a_barrier() {
        let p1 = lane("alice", Some("p1"));
        let p2 = lane("alice", Some("p2"));
        let account = lane("alice", None);
        let bob_p1 = lane("bob", Some("p1"));
        assert!(p1.follows(&p1));
        assert!(!p1.follows(&p2), "workspaces are independent");
        assert!(p1.follows(&account), "an account-level write is a barrier");
        assert!(
            account.follows(&p2),
            "an account-level write follows every workspace"
        );
        assert!(!p1.follows(&bob_p1), "another account holds nothing back");
        assert!(!account.follows(&bob_p1));
        assert_eq!(
            Lane::of(None, Some("p1")),
            None,
            "an unknown owner has no lane"
        );
    }

    #[test]
    fn stored_records_hold_back_their_lane_until_resolved() {
        let p1 = lane("alice", Some("p1"));
        let mut s = StoredLanes::from_lanes([Some(p1.clone()), None, Some(p1.clone())]);
        assert!(s.holds_back(&p1));
        assert!(!s.holds_back(&lane("alice", Some("p2"))));
        assert!(s.holds_back(&lane("alice", None)));
        s.remove(&p1);
        assert!(s.holds_back(&p1), "one of two is still there");
        s.remove(&p1);
        assert!(!s.holds_back(&p1));
        assert!(s.is_empty());
        s.remove(&p1);
        assert!(s.is_empty(), "removing what is not counted changes nothing");
    }

    #[test]
    fn a_write_waits_only_for_earlier_deciding_writes_of_a_lane_it_follows() {
        let mut d = Deciding::default();
        let a = d.enter(lane("alice", Some("p1")));
        let b = d.enter(lane("alice", Some("p2")));
        let c = d.enter(lane("alice", Some("p1")));
        let acct = d.enter(lane("alice", None));
        let e = d.enter(lane("bob", Some("p1")));
        assert_eq!(d.ahead_of(a), vec![]);
        assert_eq!(d.ahead_of(c), vec![a]);
        assert_eq!(d.ahead_of(acct), vec![a, b, c]);
        assert_eq!(d.ahead_of(e), vec![]);
        d.leave(a);
        assert_eq!(d.ahead_of(c), vec![]);
        assert!(!d.is_live(a));
        assert!(d.is_live(c));
        let later = d.enter(lane("alice", Some("p2")));
        assert_eq!(
            d.ahead_of(later),
            vec![b, acct],
            "the barrier holds later writes too"
        );
    }

    proptest! {
        /// Adding and removing the same lanes in any order leaves nothing held back, and
        /// a lane is held back exactly while one of the lanes it follows is counted.
        #[test]
        fn counts_match_a_plain_list(ops in proptest::collection::vec((0u8..3, 0u8..3, any::<bool>()), 0..60)) {
            let owners = ["alice", "bob", "carol"];
            let wss = [Some("p1"), Some("p2"), None];
            let mut s = StoredLanes::default();
            let mut list: Vec<Lane> = Vec::new();
            for (o, w, add) in ops {
                let l = lane(owners[o as usize], wss[w as usize]);
                if add {
                    s.add(&l);
                    list.push(l);
                } else if let Some(i) = list.iter().position(|x| *x == l) {
                    s.remove(&l);
                    list.remove(i);
                }
                for o in owners {
                    for w in wss {
                        let probe = lane(o, w);
                        prop_assert_eq!(s.holds_back(&probe), list.iter().any(|e| probe.follows(e)));
                    }
                }
            }
        }
    }
}
