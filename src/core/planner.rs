//! The replay planner (contract sections 4.2, 4.3): which records may be sent now, and
//! why each other record is held back.
//!
//! A [`Replay`] is one flush's state machine with no I/O: the shell asks it for records
//! to send ([`Replay::next_sends`]), tells it each outcome ([`Replay::on_outcome`]), and
//! at the end asks for the report ([`Replay::blocked`]).
//!
//! The rules are stated once, as one pass over the whole queue ([`Replay::decide`]: the
//! report uses it, once per flush). Handing out sends does not rescan the queue: the
//! frontier keeps each lane's first record not yet replayed, and a record can only be
//! sent when it heads its lane with nothing unresolved ahead of it (the barrier of
//! account-level records included), so an outcome moves at most the heads it touches.
//! The work per outcome is O(1) amortised (plus the log of an ordered set); a host test
//! counts it, and a property test holds the frontier to `decide` at every step.

use super::answer::Verdict;
use super::record::{AttentionReason, RecordId, RecordMeta, RecordState};
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Why a record is not sent, in the contract's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockReason {
    AuthRoute,
    NoSession,
    UnknownOwner,
    OwnerMismatch,
    Attention(AttentionReason),
    WorkspaceOrder,
    CorruptRecord,
}

impl BlockReason {
    pub fn as_str(self) -> &'static str {
        match self {
            BlockReason::AuthRoute => "auth-route",
            BlockReason::NoSession => "no-session",
            BlockReason::UnknownOwner => "unknown-owner",
            BlockReason::OwnerMismatch => "owner-mismatch",
            BlockReason::Attention(r) => r.as_str(),
            BlockReason::WorkspaceOrder => "workspace-order",
            BlockReason::CorruptRecord => "corrupt-record",
        }
    }
}

impl Serialize for BlockReason {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A record as the planner sees it. Corrupt records have only their id.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanItem {
    pub id: RecordId,
    pub kind: ItemKind,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ItemKind {
    Corrupt,
    Record {
        owner: Option<String>,
        workspace: Option<String>,
        auth_route: bool,
        attention: Option<AttentionReason>,
    },
}

impl PlanItem {
    /// The planner's view of a readable record; `auth_route` comes from the patterns.
    pub fn of(meta: &RecordMeta, auth_route: bool) -> PlanItem {
        PlanItem {
            id: meta.id,
            kind: ItemKind::Record {
                owner: meta.owner.clone(),
                workspace: meta.workspace.clone(),
                auth_route,
                attention: match meta.state {
                    RecordState::Queued => None,
                    RecordState::NeedsAttention(r) => Some(r),
                },
            },
        }
    }

    pub fn corrupt(id: RecordId) -> PlanItem {
        PlanItem {
            id,
            kind: ItemKind::Corrupt,
        }
    }
}

/// Where a record is in this flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Progress {
    Waiting,
    InFlight,
    Replayed,
    /// Sent and left queued (409 in progress, a 5xx below the limit): not blocked
    /// itself, but it closes its lane for the rest of the flush.
    Held,
    /// Sent and moved to needs-attention.
    NowAttention(AttentionReason),
    /// The flush stopped on its outcome (network, 401, 429/503); left as it was.
    Interrupted,
}

/// What an earlier record means for a later one of the same lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Gate {
    Open,
    /// Not settled yet: wait.
    Busy,
    /// Failed or blocked: the later record is blocked with `workspace-order`.
    Closed,
}

/// The planner's decision for one record at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Send,
    /// Waits for an earlier record, or for the next flush.
    Wait,
    InFlight,
    Replayed,
    /// Sent and left queued; counted as remaining, not reported as blocked.
    Held,
    Blocked(BlockReason),
}

/// One lane of the signed-in account's records: its items (indices, in id order) and
/// the position of the first one not yet replayed.
#[derive(Debug, Clone, Default)]
struct LaneQueue {
    items: Vec<usize>,
    head: usize,
}

impl LaneQueue {
    fn head(&self) -> Option<usize> {
        self.items.get(self.head).copied()
    }
}

/// Where sends come from without rescanning the queue: the lanes (index 0 holds the
/// account-level records, the barrier), the owned records in id order with the first not
/// yet replayed, the heads ready to send, and the heads waiting for the barrier.
#[derive(Debug, Clone, Default)]
struct Frontier {
    lanes: Vec<LaneQueue>,
    lane_of: Vec<Option<usize>>,
    owned: Vec<usize>,
    first_unreplayed: usize,
    /// Min-heaps (smallest index first): an entry may be pushed twice, and the second
    /// pop of it is stale like any other (`sendable`); a heap is a fraction of a B-tree's
    /// code in the module.
    ready: BinaryHeap<Reverse<usize>>,
    behind_barrier: BinaryHeap<Reverse<(usize, usize)>>,
    /// Units of work done (head moves, set operations): what the host test counts.
    steps: u64,
}

/// The lane of account-level records.
const BARRIER: usize = 0;

/// One flush's plan over the queue, for the signed-in account (`None`: signed out).
#[derive(Debug, Clone)]
pub struct Replay {
    items: Vec<PlanItem>,
    progress: Vec<Progress>,
    user: Option<String>,
    stopped: bool,
    frontier: Frontier,
    in_flight: usize,
    replayed: usize,
    moved_to_attention: usize,
}

/// Orders items by id. The shell plans what the store read in key order, so this is
/// one pass over it there; an insertion sort, not std's, whose code was 1.8 KB of the
/// gzipped module. Ids are unique, so any sort gives the same order.
fn sort_by_id(items: &mut [PlanItem]) {
    for i in 1..items.len() {
        let mut j = i;
        while j > 0 && items[j - 1].id > items[j].id {
            items.swap(j - 1, j);
            j -= 1;
        }
    }
}

impl Replay {
    pub fn new(mut items: Vec<PlanItem>, user: Option<String>) -> Replay {
        sort_by_id(&mut items);
        let progress = vec![Progress::Waiting; items.len()];
        let mut r = Replay {
            items,
            progress,
            user,
            stopped: false,
            frontier: Frontier::default(),
            in_flight: 0,
            replayed: 0,
            moved_to_attention: 0,
        };
        r.build_frontier();
        r
    }

    fn build_frontier(&mut self) {
        let mut by_workspace: std::collections::HashMap<String, usize> =
            std::collections::HashMap::new();
        let mut f = Frontier {
            lanes: vec![LaneQueue::default()],
            lane_of: vec![None; self.items.len()],
            ..Frontier::default()
        };
        for i in 0..self.items.len() {
            if !self.is_owned(i) {
                continue;
            }
            let lane = match self.workspace(i) {
                None => BARRIER,
                Some(w) => match by_workspace.get(w) {
                    Some(l) => *l,
                    None => {
                        f.lanes.push(LaneQueue::default());
                        by_workspace.insert(w.to_owned(), f.lanes.len() - 1);
                        f.lanes.len() - 1
                    }
                },
            };
            f.lanes[lane].items.push(i);
            f.lane_of[i] = Some(lane);
            f.owned.push(i);
        }
        self.frontier = f;
        for lane in 0..self.frontier.lanes.len() {
            self.consider(lane);
        }
    }

    /// The first account-level record not yet replayed: later owned records wait for it.
    fn barrier_head(&self) -> Option<usize> {
        self.frontier.lanes[BARRIER].head()
    }

    /// Puts a lane's head among the ready ones when it may be sent now, or among those
    /// waiting for the barrier when only the barrier holds it back.
    fn consider(&mut self, lane: usize) {
        self.frontier.steps += 1;
        let Some(h) = self.frontier.lanes[lane].head() else {
            return;
        };
        if self.progress[h] != Progress::Waiting || self.static_reason(h).is_some() {
            return;
        }
        if lane == BARRIER {
            if self.frontier.owned.get(self.frontier.first_unreplayed) == Some(&h) {
                self.frontier.ready.push(Reverse(h));
            }
            return;
        }
        match self.barrier_head() {
            Some(b) if b < h => {
                self.frontier.behind_barrier.push(Reverse((h, lane)));
            }
            _ => {
                self.frontier.ready.push(Reverse(h));
            }
        }
    }

    /// Whether `h` may be sent now (a ready entry can be stale).
    fn sendable(&self, h: usize) -> bool {
        let Some(lane) = self.frontier.lane_of[h] else {
            return false;
        };
        if self.frontier.lanes[lane].head() != Some(h)
            || self.progress[h] != Progress::Waiting
            || self.static_reason(h).is_some()
        {
            return false;
        }
        if lane == BARRIER {
            self.frontier.owned.get(self.frontier.first_unreplayed) == Some(&h)
        } else {
            self.barrier_head().is_none_or(|b| b > h)
        }
    }

    /// Record `i` was replayed: its lane's head and the first unreplayed owned record
    /// move on, and whatever that frees is considered.
    fn advance(&mut self, i: usize) {
        let Some(lane) = self.frontier.lane_of[i] else {
            return;
        };
        while let Some(h) = self.frontier.lanes[lane].head() {
            if self.progress[h] != Progress::Replayed {
                break;
            }
            self.frontier.lanes[lane].head += 1;
            self.frontier.steps += 1;
        }
        while let Some(&o) = self.frontier.owned.get(self.frontier.first_unreplayed) {
            if self.progress[o] != Progress::Replayed {
                break;
            }
            self.frontier.first_unreplayed += 1;
            self.frontier.steps += 1;
        }
        self.consider(lane);
        if lane == BARRIER {
            let limit = self.barrier_head().unwrap_or(usize::MAX);
            while let Some(&Reverse((h, l))) = self.frontier.behind_barrier.peek() {
                if h > limit {
                    break;
                }
                self.frontier.behind_barrier.pop();
                self.consider(l);
            }
        } else {
            self.consider(BARRIER);
        }
    }

    pub fn items(&self) -> &[PlanItem] {
        &self.items
    }

    /// The reason of 4.2 that holds a record back whatever else happens in the flush.
    fn static_reason(&self, i: usize) -> Option<BlockReason> {
        let ItemKind::Record {
            owner,
            auth_route,
            attention,
            ..
        } = &self.items[i].kind
        else {
            return Some(BlockReason::CorruptRecord);
        };
        if *auth_route {
            return Some(BlockReason::AuthRoute);
        }
        let Some(user) = &self.user else {
            return Some(BlockReason::NoSession);
        };
        match owner {
            None => return Some(BlockReason::UnknownOwner),
            Some(o) if o != user => return Some(BlockReason::OwnerMismatch),
            Some(_) => {}
        }
        let attention = match self.progress[i] {
            Progress::NowAttention(r) => Some(r),
            _ => *attention,
        };
        attention.map(BlockReason::Attention)
    }

    /// Whether the record takes part in the signed-in account's ordering: its own,
    /// readable, not an auth route (those are never sent and hold nothing back).
    fn is_owned(&self, i: usize) -> bool {
        match (&self.items[i].kind, &self.user) {
            (
                ItemKind::Record {
                    owner: Some(o),
                    auth_route: false,
                    ..
                },
                Some(u),
            ) => o == u,
            _ => false,
        }
    }

    fn workspace(&self, i: usize) -> Option<&str> {
        match &self.items[i].kind {
            ItemKind::Record { workspace, .. } => workspace.as_deref(),
            ItemKind::Corrupt => None,
        }
    }

    /// Every record's decision now, in id order: the rules of 4.3 as one pass.
    pub fn decide(&self) -> Vec<Decision> {
        use std::collections::HashMap;
        let mut lanes: HashMap<&str, Gate> = HashMap::new();
        // The combined state of earlier account-level records, and of all earlier owned
        // records (what an account-level record may not overtake).
        let mut barrier = Gate::Open;
        let mut all_owned = Gate::Open;
        let mut out = Vec::with_capacity(self.items.len());
        for i in 0..self.items.len() {
            let progress = self.progress[i];
            let owned = self.is_owned(i);
            let (decision, contributes) = match (progress, self.static_reason(i)) {
                (Progress::Replayed, _) => (Decision::Replayed, Gate::Open),
                (Progress::InFlight, _) => (Decision::InFlight, Gate::Busy),
                (_, Some(reason)) => (Decision::Blocked(reason), Gate::Closed),
                (Progress::Held, None) => (Decision::Held, Gate::Closed),
                (Progress::Interrupted, None) => (Decision::Wait, Gate::Busy),
                (Progress::NowAttention(_), None) | (Progress::Waiting, None) => {
                    let ws = self.workspace(i);
                    let ahead = match ws {
                        Some(w) => barrier.max(*lanes.get(w).unwrap_or(&Gate::Open)),
                        None => all_owned,
                    };
                    match ahead {
                        Gate::Closed => {
                            (Decision::Blocked(BlockReason::WorkspaceOrder), Gate::Closed)
                        }
                        Gate::Busy => (Decision::Wait, Gate::Busy),
                        Gate::Open if self.stopped => (Decision::Wait, Gate::Busy),
                        Gate::Open => (Decision::Send, Gate::Busy),
                    }
                }
            };
            if owned {
                all_owned = all_owned.max(contributes);
                match self.workspace(i) {
                    Some(w) => {
                        let lane = lanes.entry(w).or_insert(Gate::Open);
                        *lane = (*lane).max(contributes);
                    }
                    None => barrier = barrier.max(contributes),
                }
            }
            out.push(decision);
        }
        out
    }

    /// Up to `limit` records to send now (fewer when as many are in flight already),
    /// marked in flight, in id order. Each workspace has at most one record in flight, so
    /// `limit` is the number of parallel lanes.
    pub fn next_sends(&mut self, limit: usize) -> Vec<RecordId> {
        let mut picked = Vec::new();
        while self.in_flight < limit && !self.stopped {
            let Some(Reverse(h)) = self.frontier.ready.pop() else {
                break;
            };
            self.frontier.steps += 1;
            if !self.sendable(h) {
                continue;
            }
            self.progress[h] = Progress::InFlight;
            self.in_flight += 1;
            picked.push(self.items[h].id);
        }
        picked
    }

    /// Up to `n` records that follow `id` in its lane and would be sent next if every
    /// record before them is replayed: waiting, and held back by no rule of 4.2. What a
    /// lane marks ahead while `id` is on the wire (4.7, r4): a guess, whose marks are
    /// cleared for the records that were not sent after all.
    pub fn next_in_lane(&self, id: RecordId, n: usize) -> Vec<RecordId> {
        let Some(i) = self.index(id) else {
            return Vec::new();
        };
        let Some(lane) = self.frontier.lane_of[i] else {
            return Vec::new();
        };
        let items = &self.frontier.lanes[lane].items;
        let Ok(at) = items.binary_search(&i) else {
            return Vec::new();
        };
        items[at + 1..]
            .iter()
            .take(n)
            .take_while(|&&j| {
                self.progress[j] == Progress::Waiting && self.static_reason(j).is_none()
            })
            .map(|&j| self.items[j].id)
            .collect()
    }

    /// Whether this flush would send `id` if nothing failed before it: a record of the
    /// signed-in account that no rule of 4.2 holds back. Only such a record's unknown
    /// age holds the flush back (r4): another account's never makes it back off.
    pub fn would_send(&self, id: RecordId) -> bool {
        self.index(id)
            .is_some_and(|i| self.is_owned(i) && self.static_reason(i).is_none())
    }

    /// Units of work the frontier did so far (for the host test of its cost).
    pub fn steps(&self) -> u64 {
        self.frontier.steps
    }

    fn index(&self, id: RecordId) -> Option<usize> {
        self.items.binary_search_by_key(&id, |i| i.id).ok()
    }

    /// Records the outcome of a record that was in flight; `attention` is the reason its
    /// settlement moved it to needs-attention, if it did. A stopping outcome ends the
    /// flush: nothing more is handed out.
    pub fn on_outcome(
        &mut self,
        id: RecordId,
        verdict: &Verdict,
        attention: Option<AttentionReason>,
    ) {
        let Some(i) = self.index(id) else { return };
        if self.progress[i] != Progress::InFlight {
            return;
        }
        self.in_flight -= 1;
        self.progress[i] = match (verdict, attention) {
            (Verdict::Replayed, _) => Progress::Replayed,
            (v, _) if v.stops_flush() => Progress::Interrupted,
            (_, Some(reason)) => Progress::NowAttention(reason),
            _ => Progress::Held,
        };
        match self.progress[i] {
            Progress::Replayed => {
                self.replayed += 1;
                self.advance(i);
            }
            Progress::NowAttention(_) => self.moved_to_attention += 1,
            _ => {}
        }
        if verdict.stops_flush() {
            self.stopped = true;
        }
    }

    /// Puts a record that was in flight back to waiting, to be sent again in this flush
    /// (after the identity was checked again: a stale CSRF token or account).
    pub fn retry(&mut self, id: RecordId) {
        if let Some(i) = self.index(id) {
            if self.progress[i] == Progress::InFlight {
                self.progress[i] = Progress::Waiting;
                self.in_flight -= 1;
                if let Some(lane) = self.frontier.lane_of[i] {
                    self.consider(lane);
                }
            }
        }
    }

    /// Leaves a record out of this flush without stopping it: it waits for the next one,
    /// queued as it is, and holds back the later records of its lane. For a record that
    /// may not be sent now though nothing failed: its age cannot be known (a clock behind
    /// its first send), or it was not found when its lane took it (gone, or no longer
    /// readable) — never counted as replayed.
    pub fn hold(&mut self, id: RecordId) {
        let Some(i) = self.index(id) else { return };
        match self.progress[i] {
            Progress::InFlight => self.in_flight -= 1,
            Progress::Waiting => {}
            _ => return,
        }
        self.progress[i] = Progress::Interrupted;
    }

    /// Ends the flush between records (budget spent, storage failed): no more sends.
    pub fn stop(&mut self) {
        self.stopped = true;
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Whether anything is in flight (the flush ends when nothing is and nothing can be
    /// sent).
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Records this flush moved to needs-attention.
    pub fn moved_to_attention(&self) -> usize {
        self.moved_to_attention
    }

    pub fn replayed(&self) -> usize {
        self.replayed
    }

    /// The records held back and why, in id order: the `MUTATIONS_BLOCKED` list.
    /// Records merely waiting for the next flush (not reached, or sent and left queued)
    /// are not blocked.
    pub fn blocked(&self) -> Vec<(RecordId, BlockReason)> {
        self.decide()
            .into_iter()
            .enumerate()
            .filter_map(|(i, d)| match d {
                Decision::Blocked(r) => Some((self.items[i].id, r)),
                _ => None,
            })
            .collect()
    }
}

/// How many records after one handed out its lane may mark ahead (contract 4.7, r4): up
/// to [`MARKS_AHEAD`], so that a lane stays fed while the group commit takes longer than
/// a few round trips (the worker's thread at 0 ms latency).
pub const MARKS_AHEAD: usize = 6;

/// The records ahead a lane marks whatever their bodies' size.
pub const MARKS_AHEAD_MIN: usize = 2;

/// Beyond [`MARKS_AHEAD_MIN`], a lane marks ahead only while the bodies it holds ahead
/// (read with their marks, waiting in memory) add up to at most this many bytes.
pub const MARKS_AHEAD_BYTES: usize = 1024 * 1024;

/// How many of the records that follow in a lane (their bodies' lengths, in lane order,
/// at most [`MARKS_AHEAD`] read) are marked ahead: the first [`MARKS_AHEAD_MIN`], then
/// each while the bodies held ahead stay within [`MARKS_AHEAD_BYTES`]. A crash leaves a
/// mark ahead in place, and its record is then taken for possibly sent (the safe side),
/// so the count stays small.
pub fn marks_ahead(body_lens: impl IntoIterator<Item = usize>) -> usize {
    let mut bytes = 0usize;
    let mut n = 0;
    for len in body_lens.into_iter().take(MARKS_AHEAD) {
        bytes = bytes.saturating_add(len);
        if n >= MARKS_AHEAD_MIN && bytes > MARKS_AHEAD_BYTES {
            break;
        }
        n += 1;
    }
    n
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_lane_marks_up_to_six_ahead_while_their_bodies_stay_within_a_mebibyte() {
        assert_eq!(marks_ahead([]), 0);
        assert_eq!(marks_ahead([10]), 1, "no more than follow");
        assert_eq!(marks_ahead([1024; 10]), MARKS_AHEAD, "small bodies: six");
        let big = MARKS_AHEAD_BYTES;
        assert_eq!(
            marks_ahead([big, big, big]),
            MARKS_AHEAD_MIN,
            "two whatever their size"
        );
        assert_eq!(
            marks_ahead([10, 10, big, 10]),
            2,
            "the third would pass the bytes"
        );
        assert_eq!(
            marks_ahead([big / 2, big / 4, big / 4, 1]),
            3,
            "exactly the bytes, then one over"
        );
        assert_eq!(marks_ahead([usize::MAX, usize::MAX, 1]), 2, "no overflow");
    }

    fn rec(id: u64, owner: Option<&str>, ws: Option<&str>) -> PlanItem {
        PlanItem {
            id: RecordId(id),
            kind: ItemKind::Record {
                owner: owner.map(Into::into),
                workspace: ws.map(Into::into),
                auth_route: false,
                attention: None,
            },
        }
    }

    fn with_attention(mut p: PlanItem, r: AttentionReason) -> PlanItem {
        if let ItemKind::Record { attention, .. } = &mut p.kind {
            *attention = Some(r);
        }
        p
    }

    fn alice(items: Vec<PlanItem>) -> Replay {
        Replay::new(items, Some("alice".into()))
    }

    fn ids(v: &[u64]) -> Vec<RecordId> {
        v.iter().copied().map(RecordId).collect()
    }

    const FAIL: Verdict = Verdict::ServerFailure { status: 500 };

    #[test]
    fn the_records_a_lane_marks_ahead_are_its_next_sendable_ones() {
        let mut r = alice(vec![
            rec(1, Some("alice"), Some("p1")),
            rec(2, Some("alice"), Some("p2")),
            rec(3, Some("alice"), Some("p1")),
            rec(4, Some("bob"), Some("p1")),
            rec(5, Some("alice"), Some("p1")),
            with_attention(rec(6, Some("alice"), Some("p1")), AttentionReason::Conflict),
            rec(7, Some("alice"), Some("p1")),
        ]);
        assert_eq!(r.next_sends(4), ids(&[1, 2]));
        // Its own lane only (not p2's), other accounts' records skipped (not in the lane),
        // and never past a record that is held back.
        assert_eq!(r.next_in_lane(RecordId(1), 5), ids(&[3, 5]));
        assert_eq!(r.next_in_lane(RecordId(1), 1), ids(&[3]));
        assert_eq!(r.next_in_lane(RecordId(2), 3), ids(&[]));
        r.on_outcome(RecordId(1), &Verdict::Replayed, None);
        assert_eq!(r.next_sends(4), ids(&[3]));
        assert_eq!(r.next_in_lane(RecordId(3), 3), ids(&[5]));
        assert_eq!(
            r.next_in_lane(RecordId(4), 3),
            ids(&[]),
            "not the account's"
        );
    }

    #[test]
    fn only_a_record_this_flush_would_send_holds_it_back() {
        let r = alice(vec![
            rec(1, Some("alice"), Some("p1")),
            rec(2, Some("bob"), Some("p1")),
            rec(3, None, Some("p1")),
            with_attention(rec(4, Some("alice"), Some("p2")), AttentionReason::Conflict),
        ]);
        assert!(r.would_send(RecordId(1)));
        assert!(!r.would_send(RecordId(2)), "another account's");
        assert!(!r.would_send(RecordId(3)), "no known owner");
        assert!(!r.would_send(RecordId(4)), "waits for a person");
        let signed_out = Replay::new(vec![rec(1, Some("alice"), Some("p1"))], None);
        assert!(!signed_out.would_send(RecordId(1)));
    }

    #[test]
    fn each_static_reason_in_its_order() {
        let mut auth = rec(1, Some("alice"), None);
        if let ItemKind::Record { auth_route, .. } = &mut auth.kind {
            *auth_route = true;
        }
        let r = alice(vec![
            auth,
            rec(2, None, Some("a")),
            rec(3, Some("bob"), Some("a")),
            with_attention(rec(4, Some("alice"), Some("b")), AttentionReason::KeyReused),
            PlanItem::corrupt(RecordId(5)),
        ]);
        assert_eq!(
            r.blocked(),
            vec![
                (RecordId(1), BlockReason::AuthRoute),
                (RecordId(2), BlockReason::UnknownOwner),
                (RecordId(3), BlockReason::OwnerMismatch),
                (
                    RecordId(4),
                    BlockReason::Attention(AttentionReason::KeyReused)
                ),
                (RecordId(5), BlockReason::CorruptRecord),
            ]
        );
        let signed_out = Replay::new(vec![rec(1, Some("alice"), None), rec(2, None, None)], None);
        assert_eq!(
            signed_out.blocked(),
            vec![
                (RecordId(1), BlockReason::NoSession),
                (RecordId(2), BlockReason::NoSession)
            ]
        );
        let mut signed_out = signed_out;
        assert!(signed_out.next_sends(4).is_empty());
    }

    #[test]
    fn items_given_out_of_order_are_planned_in_id_order() {
        // One workspace: only its oldest record may go first, whatever order it came in.
        let mut r = alice(vec![
            rec(3, Some("alice"), Some("a")),
            rec(1, Some("alice"), Some("a")),
            rec(4, Some("alice"), Some("a")),
            rec(2, Some("alice"), Some("a")),
        ]);
        let mut order = Vec::new();
        loop {
            let next = r.next_sends(4);
            if next.is_empty() {
                break;
            }
            assert_eq!(next.len(), 1, "one at a time in a workspace");
            order.push(next[0]);
            r.on_outcome(next[0], &Verdict::Replayed, None);
        }
        assert_eq!(order, ids(&[1, 2, 3, 4]));
    }

    #[test]
    fn fifo_within_a_workspace_parallel_across() {
        let mut r = alice(vec![
            rec(1, Some("alice"), Some("a")),
            rec(2, Some("alice"), Some("a")),
            rec(3, Some("alice"), Some("b")),
        ]);
        assert_eq!(r.next_sends(4), ids(&[1, 3]));
        assert_eq!(r.next_sends(4), ids(&[]), "2 waits for 1");
        r.on_outcome(RecordId(1), &Verdict::Replayed, None);
        assert_eq!(r.next_sends(4), ids(&[2]));
    }

    #[test]
    fn lanes_are_limited() {
        let mut r = alice(
            (1..=6)
                .map(|i| rec(i, Some("alice"), Some(&format!("w{i}"))))
                .collect(),
        );
        assert_eq!(r.next_sends(2), ids(&[1, 2]));
        assert_eq!(r.next_sends(2), ids(&[]));
        r.on_outcome(RecordId(2), &Verdict::Replayed, None);
        assert_eq!(r.next_sends(2), ids(&[3]));
    }

    #[test]
    fn a_failure_in_a_blocks_later_a_not_b() {
        let mut r = alice(vec![
            rec(1, Some("alice"), Some("a")),
            rec(2, Some("alice"), Some("b")),
            rec(3, Some("alice"), Some("a")),
            rec(4, Some("alice"), Some("b")),
        ]);
        assert_eq!(r.next_sends(4), ids(&[1, 2]));
        r.on_outcome(RecordId(1), &FAIL, None);
        r.on_outcome(RecordId(2), &Verdict::Replayed, None);
        assert_eq!(r.next_sends(4), ids(&[4]));
        assert_eq!(
            r.blocked(),
            vec![(RecordId(3), BlockReason::WorkspaceOrder)]
        );
    }

    #[test]
    fn a_blocked_owned_record_blocks_its_workspace() {
        let mut r = alice(vec![
            with_attention(
                rec(1, Some("alice"), Some("a")),
                AttentionReason::OutcomeUnknown,
            ),
            rec(2, Some("alice"), Some("a")),
            rec(3, Some("alice"), Some("b")),
        ]);
        assert_eq!(r.next_sends(4), ids(&[3]));
        assert_eq!(r.blocked()[1], (RecordId(2), BlockReason::WorkspaceOrder));
    }

    #[test]
    fn an_unresolved_account_level_record_blocks_every_later_owned_record() {
        let mut r = alice(vec![
            rec(1, Some("alice"), None),
            rec(2, Some("alice"), Some("a")),
            rec(3, Some("alice"), Some("b")),
            rec(4, Some("alice"), None),
        ]);
        assert_eq!(r.next_sends(4), ids(&[1]), "the barrier goes alone");
        r.on_outcome(
            RecordId(1),
            &Verdict::Attention {
                reason: AttentionReason::Rejected,
                status: 400,
            },
            Some(AttentionReason::Rejected),
        );
        assert_eq!(r.next_sends(4), ids(&[]));
        assert_eq!(
            r.blocked(),
            vec![
                (
                    RecordId(1),
                    BlockReason::Attention(AttentionReason::Rejected)
                ),
                (RecordId(2), BlockReason::WorkspaceOrder),
                (RecordId(3), BlockReason::WorkspaceOrder),
                (RecordId(4), BlockReason::WorkspaceOrder),
            ]
        );
    }

    #[test]
    fn an_account_level_record_waits_for_earlier_owned_records() {
        let mut r = alice(vec![
            rec(1, Some("alice"), Some("a")),
            rec(2, Some("alice"), Some("b")),
            rec(3, Some("alice"), None),
            rec(4, Some("alice"), Some("c")),
        ]);
        assert_eq!(
            r.next_sends(4),
            ids(&[1, 2]),
            "3 waits; 4 is behind the barrier"
        );
        r.on_outcome(RecordId(1), &Verdict::Replayed, None);
        assert_eq!(r.next_sends(4), ids(&[]));
        r.on_outcome(RecordId(2), &FAIL, None);
        assert_eq!(
            r.blocked(),
            vec![
                (RecordId(3), BlockReason::WorkspaceOrder),
                (RecordId(4), BlockReason::WorkspaceOrder)
            ]
        );
    }

    #[test]
    fn other_accounts_records_block_nothing() {
        let mut r = alice(vec![
            with_attention(rec(1, Some("bob"), None), AttentionReason::OutcomeUnknown),
            rec(2, Some("bob"), Some("a")),
            rec(3, None, None),
            rec(4, Some("alice"), Some("a")),
            rec(5, Some("alice"), None),
        ]);
        assert_eq!(r.next_sends(4), ids(&[4]));
        r.on_outcome(RecordId(4), &Verdict::Replayed, None);
        assert_eq!(r.next_sends(4), ids(&[5]));
    }

    #[test]
    fn a_stopping_outcome_ends_the_flush_and_reports_no_pending_record() {
        let mut r = alice(vec![
            rec(1, Some("alice"), Some("a")),
            rec(2, Some("alice"), Some("b")),
            rec(3, Some("alice"), Some("a")),
            rec(4, Some("alice"), Some("c")),
        ]);
        assert_eq!(r.next_sends(2), ids(&[1, 2]));
        r.on_outcome(RecordId(1), &Verdict::NetworkFailure, None);
        assert!(r.is_stopped());
        r.on_outcome(RecordId(2), &Verdict::Replayed, None);
        assert_eq!(r.next_sends(4), ids(&[]));
        assert_eq!(r.blocked(), vec![], "waiting records are not blocked");
        assert_eq!(r.replayed(), 1);
    }

    #[test]
    fn in_progress_holds_its_lane_without_being_blocked_itself() {
        let mut r = alice(vec![
            rec(1, Some("alice"), Some("a")),
            rec(2, Some("alice"), Some("a")),
        ]);
        assert_eq!(r.next_sends(4), ids(&[1]));
        r.on_outcome(RecordId(1), &Verdict::InProgress, None);
        assert_eq!(r.next_sends(4), ids(&[]));
        assert_eq!(
            r.blocked(),
            vec![(RecordId(2), BlockReason::WorkspaceOrder)]
        );
        assert_eq!(r.decide()[0], Decision::Held);
    }

    #[test]
    fn a_retried_record_is_sent_again_in_its_place() {
        let mut r = alice(vec![
            rec(1, Some("alice"), Some("a")),
            rec(2, Some("alice"), Some("a")),
        ]);
        assert_eq!(r.next_sends(4), ids(&[1]));
        r.retry(RecordId(1));
        assert_eq!(r.in_flight(), 0);
        assert_eq!(r.next_sends(4), ids(&[1]), "sent again, still before 2");
        let stale = Verdict::StaleIdentity { status: 403 };
        r.on_outcome(RecordId(1), &stale, None);
        assert!(r.is_stopped(), "a second stale identity stops the flush");
        assert_eq!(r.next_sends(4), ids(&[]));
        assert_eq!(
            r.blocked(),
            vec![],
            "the record waits unchanged, not blocked"
        );
    }

    #[test]
    fn a_held_record_waits_uncounted_and_holds_its_lane_only() {
        let mut r = alice(vec![
            rec(1, Some("alice"), Some("a")),
            rec(2, Some("alice"), Some("a")),
            rec(3, Some("alice"), Some("b")),
        ]);
        // Held before it is handed out (its age cannot be known): never sent.
        r.hold(RecordId(1));
        assert_eq!(r.next_sends(4), ids(&[3]), "the other lane goes on");
        r.on_outcome(RecordId(3), &Verdict::Replayed, None);
        assert_eq!(r.next_sends(4), ids(&[]), "2 waits behind 1");
        assert!(!r.is_stopped(), "holding is no stop");
        assert_eq!(r.replayed(), 1);
        assert_eq!(r.blocked(), vec![], "waiting, not blocked");
        // Held once in flight (gone when its lane took it): not counted as replayed.
        let mut r = alice(vec![
            rec(1, Some("alice"), Some("a")),
            rec(2, Some("alice"), None),
        ]);
        assert_eq!(r.next_sends(4), ids(&[1]));
        r.hold(RecordId(1));
        assert_eq!(r.in_flight(), 0);
        assert_eq!(r.replayed(), 0);
        assert_eq!(r.next_sends(4), ids(&[]), "the barrier record waits for it");
    }

    #[test]
    fn budget_stop_sends_nothing_more() {
        let mut r = alice(vec![
            rec(1, Some("alice"), Some("a")),
            rec(2, Some("alice"), Some("b")),
        ]);
        assert_eq!(r.next_sends(1), ids(&[1]));
        r.stop();
        r.on_outcome(RecordId(1), &Verdict::Replayed, None);
        assert_eq!(r.next_sends(4), ids(&[]));
    }

    /// A random queue, a random sequence of outcomes and a random order in which
    /// in-flight records answer: the invariants of 4.3 hold at every send.
    fn arb_item() -> impl Strategy<Value = (Option<u8>, Option<u8>, bool, bool)> {
        (
            prop::option::weighted(0.9, 0u8..3), // owner: alice, bob, carol / unknown
            prop::option::weighted(0.7, 0u8..3), // workspace a, b, c / account-level
            prop::bool::weighted(0.1),           // needs attention already
            prop::bool::weighted(0.05),          // corrupt
        )
    }

    fn arb_verdict() -> impl Strategy<Value = Verdict> {
        prop_oneof![
            6 => Just(Verdict::Replayed),
            1 => Just(Verdict::InProgress),
            1 => Just(Verdict::ServerFailure { status: 502 }),
            1 => Just(Verdict::Attention { reason: AttentionReason::OutcomeUnknown, status: 409 }),
            1 => Just(Verdict::Attention { reason: AttentionReason::Rejected, status: 400 }),
            1 => Just(Verdict::NetworkFailure),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn ordering_and_ownership_invariants(
            raw in prop::collection::vec(arb_item(), 0..40),
            verdicts in prop::collection::vec(arb_verdict(), 40),
            picks in prop::collection::vec(any::<prop::sample::Index>(), 40),
            lanes in 1usize..6,
        ) {
            let names = ["alice", "bob", "carol"];
            let wss = ["a", "b", "c"];
            let items: Vec<PlanItem> = raw.iter().enumerate().map(|(i, (o, w, att, corrupt))| {
                let id = RecordId(i as u64 + 1);
                if *corrupt { return PlanItem::corrupt(id); }
                let p = rec(id.0, o.map(|o| names[o as usize]), w.map(|w| wss[w as usize]));
                if *att { with_attention(p, AttentionReason::Expired) } else { p }
            }).collect();
            let mut r = alice(items.clone());
            let mut sent: Vec<RecordId> = Vec::new();
            let mut settled_ok: Vec<RecordId> = Vec::new();
            let mut in_flight: Vec<RecordId> = Vec::new();
            let mut step = 0;
            loop {
                for id in r.next_sends(lanes) {
                    let item = &items[(id.0 - 1) as usize];
                    let ItemKind::Record { owner, workspace, attention, .. } = &item.kind else {
                        return Err(TestCaseError::fail("corrupt record sent"));
                    };
                    prop_assert_eq!(owner.as_deref(), Some("alice"), "only the signed-in account's");
                    prop_assert!(attention.is_none(), "needs-attention never sent");
                    prop_assert!(!sent.contains(&id), "sent twice");
                    // Every earlier owned record that must settle first has settled OK.
                    for earlier in &items[..(id.0 - 1) as usize] {
                        let ItemKind::Record { owner: eo, workspace: ew, .. } = &earlier.kind else { continue };
                        if eo.as_deref() != Some("alice") { continue; }
                        let must = ew.is_none() || workspace.is_none() || ew == workspace;
                        if must {
                            prop_assert!(settled_ok.contains(&earlier.id),
                                "{:?} sent before {:?} settled", id, earlier.id);
                        }
                    }
                    sent.push(id);
                    in_flight.push(id);
                }
                prop_assert!(in_flight.len() <= lanes);
                if in_flight.is_empty() || step >= verdicts.len() { break; }
                let k = picks[step].index(in_flight.len());
                let id = in_flight.remove(k);
                let v = verdicts[step].clone();
                step += 1;
                if v == Verdict::Replayed { settled_ok.push(id); }
                let att = match &v { Verdict::Attention { reason, .. } => Some(*reason), _ => None };
                r.on_outcome(id, &v, att);
            }
            // Nothing blocked was ever sent, and the report never lists a replayed record.
            for (id, _) in r.blocked() {
                prop_assert!(!settled_ok.contains(&id));
                let item = &items[(id.0 - 1) as usize];
                if let ItemKind::Record { owner, attention, .. } = &item.kind {
                    if owner.as_deref() != Some("alice") || attention.is_some() {
                        prop_assert!(!sent.contains(&id), "blocked record was sent");
                    }
                }
            }
            // Every record of another owner, unknown owner, corrupt or needing attention
            // is in the report.
            let blocked: Vec<RecordId> = r.blocked().into_iter().map(|(id, _)| id).collect();
            for item in &items {
                let static_block = match &item.kind {
                    ItemKind::Corrupt => true,
                    ItemKind::Record { owner, attention, .. } =>
                        owner.as_deref() != Some("alice") || attention.is_some(),
                };
                if static_block { prop_assert!(blocked.contains(&item.id)); }
            }
        }
    }

    /// The sends `decide` allows now, in id order, as many as `room`.
    fn spec_sends(r: &Replay, limit: usize) -> Vec<RecordId> {
        let room = limit.saturating_sub(r.in_flight());
        r.decide()
            .iter()
            .enumerate()
            .filter(|(_, d)| **d == Decision::Send)
            .map(|(i, _)| r.items()[i].id)
            .take(room)
            .collect()
    }

    fn arb_outcome() -> impl Strategy<Value = Option<Verdict>> {
        prop_oneof![
            6 => Just(Some(Verdict::Replayed)),
            1 => Just(Some(Verdict::InProgress)),
            1 => Just(Some(Verdict::ServerFailure { status: 502 })),
            1 => Just(Some(Verdict::Attention { reason: AttentionReason::Rejected, status: 400 })),
            1 => Just(Some(Verdict::NetworkFailure)),
            1 => Just(None), // sent again after a stale identity
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1500))]
        /// The frontier hands out exactly what the one-pass rules allow, at every step.
        #[test]
        fn the_frontier_sends_what_decide_allows(
            raw in prop::collection::vec(arb_item(), 0..50),
            outcomes in prop::collection::vec(arb_outcome(), 60),
            picks in prop::collection::vec(any::<prop::sample::Index>(), 60),
            lanes in 1usize..6,
        ) {
            let names = ["alice", "bob"];
            let wss = ["a", "b", "c"];
            let items: Vec<PlanItem> = raw.iter().enumerate().map(|(i, (o, w, att, corrupt))| {
                let id = RecordId(i as u64 * 3 + 1);
                if *corrupt { return PlanItem::corrupt(id); }
                let p = rec(id.0, o.map(|o| names[o as usize % 2]), w.map(|w| wss[w as usize]));
                if *att { with_attention(p, AttentionReason::KeyExpired) } else { p }
            }).collect();
            let mut r = alice(items);
            let mut in_flight: Vec<RecordId> = Vec::new();
            for step in 0..outcomes.len() {
                let want = spec_sends(&r, lanes);
                let got = r.next_sends(lanes);
                prop_assert_eq!(&got, &want, "step {}", step);
                in_flight.extend(got);
                prop_assert_eq!(r.in_flight(), in_flight.len());
                if in_flight.is_empty() { break; }
                let id = in_flight.remove(picks[step].index(in_flight.len()));
                match &outcomes[step] {
                    None => r.retry(id),
                    Some(v) => {
                        let att = match v { Verdict::Attention { reason, .. } => Some(*reason), _ => None };
                        r.on_outcome(id, v, att);
                    }
                }
            }
            let replayed = r.decide().iter().filter(|d| **d == Decision::Replayed).count();
            prop_assert_eq!(r.replayed(), replayed);
        }
    }

    #[test]
    fn work_per_outcome_is_constant_amortised_at_ten_thousand() {
        for (n, workspaces) in [(10_000usize, 10usize), (10_000, 10_000), (10_000, 1)] {
            let items: Vec<PlanItem> = (0..n)
                .map(|i| {
                    // Every 50th record is account-level: a barrier for everything after it.
                    let ws = (i % 50 != 49).then(|| format!("w{}", i % workspaces));
                    rec(i as u64 + 1, Some("alice"), ws.as_deref())
                })
                .collect();
            let mut r = alice(items);
            let mut in_flight = std::collections::VecDeque::new();
            let mut sent = 0;
            loop {
                for id in r.next_sends(4) {
                    in_flight.push_back(id);
                    sent += 1;
                }
                let Some(id) = in_flight.pop_front() else {
                    break;
                };
                r.on_outcome(id, &Verdict::Replayed, None);
            }
            assert_eq!(sent, n, "every record sent once ({workspaces} workspaces)");
            assert_eq!(r.replayed(), n);
            let per = r.steps() as f64 / n as f64;
            assert!(
                per < 12.0,
                "{per} steps per record with {workspaces} workspaces"
            );
        }
    }
}
