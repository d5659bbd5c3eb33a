//! First-send marks committed ahead (contract 4.7, r4): a record's first send is durable
//! before its request leaves, but need not be written just before it. When a lane's
//! record is handed out, the marks of the records that follow it in its lane are handed
//! to the group commit at once, so they commit (with the lanes' other steps) while it is
//! on the wire, and the next record leaves as soon as the answer before it came — no
//! lane waits for a commit between two sends. A mark whose request never left (held at
//! the sign-in barrier, marked ahead and not reached, a stop, the budget) is cleared
//! when the flush ends, with its last steps; after a crash it stays, and the record is
//! treated as possibly sent (the safe side).

use crate::core::planner::{marks_ahead, Replay, MARKS_AHEAD};
use crate::core::record::{RecordId, RecordMeta};
use crate::store::ReplayStep;
use crate::worker::steps::StepAhead;
use crate::worker::{now_ms, Inner};
use std::collections::HashMap;
use std::rc::Rc;

/// The flush's marks: those handed over ahead of their records, and for each record
/// whose request has not left since its first mark in this flush, how many marks it got
/// and the first-send time the first of them set, if it set one (a record held at the
/// barrier is handed out, and marked, again). Lists, not maps: they hold a few records
/// per lane, and a map's code is kilobytes of the module.
#[derive(Default)]
pub(super) struct Marks {
    ahead: Vec<(RecordId, StepAhead)>,
    unsent: Vec<Unsent>,
}

/// A record's marks whose request has not left.
struct Unsent {
    id: RecordId,
    marks: u32,
    first_send: Option<u64>,
}

impl Marks {
    /// The mark of a record handed out now: the one made ahead, or one handed over now;
    /// then the marks of the records that follow it in its lane, ahead.
    pub fn for_send(
        &mut self,
        inner: &Rc<Inner>,
        replay: &Replay,
        metas: &HashMap<RecordId, RecordMeta>,
        id: RecordId,
    ) -> StepAhead {
        let mark = match self.ahead.iter().position(|(a, _)| *a == id) {
            Some(at) => self.ahead.swap_remove(at).1,
            None => self.mark(inner, metas, id),
        };
        // How many follow it marked (`core::planner::marks_ahead`: their bodies wait in
        // memory once read).
        let following = replay.next_in_lane(id, MARKS_AHEAD);
        let n = marks_ahead(
            following
                .iter()
                .map(|r| metas.get(r).map_or(0, |m| m.body_len)),
        );
        for next in following.into_iter().take(n) {
            if !self.ahead.iter().any(|(a, _)| *a == next) {
                let ahead = self.mark(inner, metas, next);
                self.ahead.push((next, ahead));
            }
        }
        mark
    }

    /// Hands a record's mark to the group commit (`attempts` + 1, its first send when it
    /// never left: committed strictly).
    fn mark(
        &mut self,
        inner: &Rc<Inner>,
        metas: &HashMap<RecordId, RecordMeta>,
        id: RecordId,
    ) -> StepAhead {
        let now = now_ms();
        let first_send = metas.get(&id).is_some_and(|m| m.first_sent_at.is_none());
        match self.unsent.iter_mut().find(|u| u.id == id) {
            Some(u) => u.marks += 1,
            None => self.unsent.push(Unsent {
                id,
                marks: 1,
                first_send: first_send.then_some(now),
            }),
        }
        inner.step_ahead(
            ReplayStep::Begin {
                id,
                now_ms: now,
                first_send,
            },
            None,
        )
    }

    /// The record's request left (or may have): its mark stays.
    pub fn sent(&mut self, id: RecordId) {
        self.unsent.retain(|u| u.id != id);
    }

    /// The flush ends: every mark whose request never left is cleared, after the steps
    /// handed over so far (its own mark among them).
    pub fn clear_unsent(self, inner: &Rc<Inner>) {
        drop(self.ahead);
        for Unsent {
            id,
            marks,
            first_send,
        } in self.unsent
        {
            inner.hand_over_step(
                ReplayStep::Unmark {
                    id,
                    marks,
                    first_send,
                },
                None,
            );
        }
    }
}
