//! A flush's lanes (contract 4.3, 4.5): the planner hands out what may be sent now, up
//! to `replayConcurrency` records at once, each sent by its own task (`send`); each
//! answer goes back to the planner before anything later in its workspace is handed
//! out. A session change seen since the identity was checked stops the handing out
//! until the account is named again (the sign-in barrier, r3, 4.5 end); a stale-identity
//! answer earns its record one re-check (r4).

use super::identity::{recheck, stale_identity, Recheck, Who};
use super::marks::Marks;
use super::plan::Plan;
use super::send::{send_one, Held, Sent, Ticket};
use super::settle::{verdict_end, worst, Ending};
use crate::channel::mpsc;
use crate::core::answer::Verdict;
use crate::core::backoff::FlushEnd;
use crate::core::credential::Credential;
use crate::core::delivery::StopReason;
use crate::core::notify::Sent as SentKinds;
use crate::core::planner::Replay;
use crate::core::record::RecordId;
use crate::protocol::Outgoing;
use crate::store::next;
use crate::worker::{now_ms, Inner};
use std::rc::Rc;

/// What the lanes did, for the flush's end and its reports.
pub(super) struct Run {
    pub ending: Ending,
    /// Another identity than the flush's was met: its reports would describe the queue
    /// to the wrong account, so they are left to the flush that follows at once.
    pub identity_changed: bool,
    pub budget_spent: bool,
    /// For the notification: what was sent, by kind, and the first record that now
    /// needs a person.
    pub sent_kinds: SentKinds,
    pub first_attention: Option<RecordId>,
    /// What the server answered each replayed write (r3: `MUTATION_SETTLED`), by account.
    pub settled: Vec<(String, Outgoing)>,
    /// The credential a replay's 401 refused (r3): the pages are asked for a new one.
    pub refused: Option<Credential>,
    /// The account whose credential a re-check found refused or missing (r3).
    pub ask_for: Option<String>,
}

impl Run {
    /// Before any lane runs: a record whose age cannot be known backs off like a
    /// transient failure (it is tried again, but not every second while the clock is
    /// wrong); a record found expired is the first that needs a person.
    pub fn new(plan: &Plan) -> Run {
        Run {
            ending: Ending {
                stop: None,
                end: if plan.unknown_age {
                    FlushEnd::Transient
                } else {
                    FlushEnd::Clean
                },
                held: plan.unknown_age,
            },
            identity_changed: false,
            budget_spent: false,
            sent_kinds: SentKinds::default(),
            first_attention: plan.first_expired,
            settled: Vec::new(),
            refused: None,
            ask_for: None,
        }
    }
}

/// Runs the lanes until nothing more may be sent (or the budget, a stop or a changed
/// identity ends the handing out), then waits until every new state is stored (or known
/// not to be) before anything is reported.
pub(super) async fn run(
    inner: &Rc<Inner>,
    mut who: Who,
    plan: &mut Plan,
    deadline: u64,
    run: &mut Run,
) {
    let lanes = inner.config.replay_concurrency as usize;
    let (tx, mut rx) = mpsc::unbounded::<Sent>();
    let mut marks = Marks::default();
    inner.open_steps();
    loop {
        if now_ms() >= deadline && !plan.replay.is_stopped() {
            plan.replay.stop();
            run.budget_spent = true;
        }
        // A session change since the identity was checked: nothing more is handed out
        // until the account is named again (the sign-in barrier, r3, 4.5 end).
        if !plan.replay.is_stopped() && !inner.replay_allowed(who.checked) {
            after_session_change(inner, &mut who, &mut plan.replay, deadline, run).await;
        }
        for id in plan.replay.next_sends(lanes) {
            let ticket = Ticket {
                csrf: who.csrf.clone(),
                credential: who.credential.clone(),
                mark: marks.for_send(inner, &plan.replay, &plan.metas, id),
                generation: who.generation,
                final_stale: who.rechecked.contains(&id),
                checked: who.checked,
            };
            let (inner, tx) = (inner.clone(), tx.clone());
            wasm_bindgen_futures::spawn_local(async move {
                let sent = send_one(&inner, id, ticket).await;
                let _ = tx.unbounded_send(sent);
            });
        }
        if plan.replay.in_flight() == 0 {
            break;
        }
        let Some(sent) = next(&mut rx).await else {
            break;
        };
        // Its deletion (held by its lane) is handed to the commit loop now, before any
        // later record is handed out: the marks this answer makes due ride with it, and
        // a storage failure it meets stops the next send (`send::send_one`).
        inner.release_held();
        if sent.left {
            marks.sent(sent.id);
        }
        on_sent(inner, &mut who, sent, plan, deadline, run).await;
    }
    // The marks of records that never left are cleared with the flush's last steps;
    // every new state is stored (or known not to be) before anything is reported.
    marks.clear_unsent(inner);
    if !inner.steps_stored().await {
        plan.replay.stop();
        run.ending.stop.get_or_insert(StopReason::Storage);
        // A replayed write whose deletion may not be stored is sent again, and its
        // answer (the server's ledger's) reported then.
        run.settled.clear();
    }
}

/// A sign-in was seen since the identity was checked: checked again; another account
/// (or nobody, or no answer) stops the handing out.
async fn after_session_change(
    inner: &Rc<Inner>,
    who: &mut Who,
    replay: &mut Replay,
    deadline: u64,
    run: &mut Run,
) {
    match recheck(inner, who, deadline).await {
        Recheck::Same => {}
        Recheck::Changed { signed_out } => {
            replay.stop();
            run.identity_changed = true;
            run.ending.stop.get_or_insert(if signed_out {
                StopReason::SignedOut
            } else {
                StopReason::IdentityCheck
            });
        }
        Recheck::Failed(stop, end, ask) => {
            run.ask_for = run.ask_for.take().or(ask);
            replay.stop();
            run.ending.stop.get_or_insert(stop);
            run.ending.end = worst(run.ending.end, end);
        }
    }
}

/// One lane's report: a record held back goes back to the planner; a stale identity is
/// checked again once; else the answer is accounted for and told to the planner.
async fn on_sent(
    inner: &Rc<Inner>,
    who: &mut Who,
    mut sent: Sent,
    plan: &mut Plan,
    deadline: u64,
    run: &mut Run,
) {
    let replay = &mut plan.replay;
    match sent.held {
        // Not sent: a sign-in was seen first. Back to its place; the loop checks the
        // identity again before it is handed out anew.
        Some(Held::SignIn) => return replay.retry(sent.id),
        Some(Held::Clock) => {
            replay.hold(sent.id);
            run.ending.held = true;
            run.ending.end = worst(run.ending.end, FlushEnd::Transient);
            return;
        }
        // Gone: nothing to send; the next read of the queue shows what is left.
        Some(Held::Gone) => return replay.hold(sent.id),
        None => {}
    }
    if let Verdict::StaleIdentity { .. } = sent.verdict {
        match stale_identity(inner, who, &sent, deadline).await {
            // Sent again with the fresh identity, in its place.
            None => return replay.retry(sent.id),
            Some(Recheck::Changed { .. }) => run.identity_changed = true,
            Some(Recheck::Failed(stop, end, ask)) => {
                run.ask_for = run.ask_for.take().or(ask);
                run.ending.stop.get_or_insert(stop);
                run.ending.end = worst(run.ending.end, end);
            }
            Some(Recheck::Same) => {}
        }
    }
    account_for(who, &sent, plan, run);
    if let Some(answered) = sent.settled.take() {
        run.settled.push(answered.report(sent.id));
    }
    let replay = &mut plan.replay;
    replay.on_outcome(sent.id, &sent.verdict, sent.attention);
    inner.flush.borrow_mut().replayed_now = replay.replayed();
    if !sent.persisted {
        // Its new state is not stored: stop between records rather than let the
        // workspace move on past an unrecorded outcome.
        replay.stop();
        run.ending.stop.get_or_insert(StopReason::Storage);
    }
}

/// An answer's share of the flush's end, counts and reports.
fn account_for(who: &Who, sent: &Sent, plan: &Plan, run: &mut Run) {
    run.ending.end = worst(run.ending.end, verdict_end(&sent.verdict));
    if let Some(stop) = StopReason::of_verdict(&sent.verdict) {
        run.ending.stop.get_or_insert(stop);
    }
    if matches!(
        sent.verdict,
        Verdict::ServerFailure { .. } | Verdict::InProgress
    ) && sent.attention.is_none()
    {
        run.ending.held = true;
    }
    if sent.verdict == Verdict::Replayed {
        if let Some(m) = plan.metas.get(&sent.id) {
            run.sent_kinds.count(&m.method);
        }
    }
    if sent.verdict == Verdict::SignedOut && sent.carried_credential {
        run.refused = run.refused.take().or(who.credential.clone());
    }
    if sent.attention.is_some() {
        run.first_attention = Some(run.first_attention.map_or(sent.id, |f| f.min(sent.id)));
    }
}
