//! Claiming a key and running its route, in a task of its own per try, so that the
//! client's connection closing at any instant (before, during or after the claim's
//! commit) never leaves a committed claim that nothing runs.

use crate::answers::{self, detail};
use crate::body::{BoxError, IdempotencyBody};
use crate::hold::Held;
use crate::layer::{IdempotencyLayer, Trace};
use crate::ledger::{Begin, ClaimRequest};
use http::{Request, Response, StatusCode};
use http_body::Body;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tower_service::Service;
use tracing::Instrument;

/// Set when the request's future is dropped (hyper drops it when the client's connection
/// closes): the claim's task reads it just before the route would start.
struct Client(Arc<AtomicBool>);

impl Client {
    fn here() -> Client {
        Client(Arc::new(AtomicBool::new(false)))
    }

    fn watch(&self) -> Arc<AtomicBool> {
        self.0.clone()
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// What one try at claiming the key came to, in the claim's own task.
enum Attempt<S, ReqB, ResB, E> {
    /// The route ran (its answer), or the layer answered in its place.
    Done(Result<Response<IdempotencyBody<ResB>>, E>),
    /// The key is held by a running attempt: the route and the request come back, to try
    /// again after a poll.
    Running {
        since_heartbeat: Duration,
        inner: S,
        req: Request<IdempotencyBody<ReqB>>,
    },
    /// The client went away before the route started: the claim was removed.
    Gone,
}

impl IdempotencyLayer {
    /// Claims the key and runs the route, or answers in its place.
    ///
    /// Each try runs in a task of its own, from the claim to the end of the route, so no
    /// instant exists at which a committed claim belongs to nothing: hyper drops this
    /// future when the client's connection closes (before, during or after the claim's
    /// commit), but the task goes on. Just before the route would start, the task looks
    /// whether the client is still there: if not, the claim is removed (the retry runs the
    /// write); if so, the route runs to its end even when the client leaves meanwhile (a
    /// route cut off midway may have done part of its work), its answer is stored, and the
    /// retry gets it. The request body is already read, so nothing of the client is needed.
    pub(crate) async fn claim_and_run<S, ReqB, ResB>(
        &self,
        claim: ClaimRequest,
        trace: Trace,
        inner: S,
        req: Request<IdempotencyBody<ReqB>>,
    ) -> Result<Response<IdempotencyBody<ResB>>, S::Error>
    where
        S: Service<Request<IdempotencyBody<ReqB>>, Response = Response<ResB>> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        ReqB: Send + 'static,
        ResB: Body + Send + 'static,
        ResB::Error: Into<BoxError>,
        ResB::Data: Send,
    {
        let client = Client::here();
        let s = self.settings.clone();
        let wait_until = tokio::time::Instant::now() + s.in_progress_wait();
        let trace = Arc::new(trace);
        let (mut inner, mut req) = (inner, req);
        loop {
            let attempt =
                self.clone()
                    .attempt(claim.clone(), trace.clone(), inner, req, client.watch());
            let outcome = match tokio::spawn(attempt.in_current_span()).await {
                Ok(outcome) => outcome,
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => {
                    // Only a runtime shutting down cancels the task.
                    tracing::error!(error = %e, "sw-outbox-idempotency: a claimed route was cancelled");
                    return Ok(answers::detail(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        detail::LEDGER_ERROR,
                    ));
                }
            };
            match outcome {
                Attempt::Done(answer) => return answer,
                // Only when this future was dropped, so nobody reads this.
                Attempt::Gone => {
                    return Ok(answers::detail(StatusCode::CONFLICT, detail::IN_PROGRESS))
                }
                Attempt::Running {
                    since_heartbeat,
                    inner: back,
                    req: again,
                } => {
                    if since_heartbeat > s.stale_after() {
                        trace.answered(409, detail::OUTCOME_UNKNOWN);
                        return Ok(answers::detail(
                            StatusCode::CONFLICT,
                            detail::OUTCOME_UNKNOWN,
                        ));
                    }
                    let left = wait_until.saturating_duration_since(tokio::time::Instant::now());
                    if left.is_zero() {
                        trace.answered(409, detail::IN_PROGRESS);
                        return Ok(answers::detail(StatusCode::CONFLICT, detail::IN_PROGRESS));
                    }
                    tokio::time::sleep(left.min(s.in_progress_poll())).await;
                    (inner, req) = (back, again);
                }
            }
        }
    }

    /// One try: claim, then (claimed, and the client still there) the route to its end.
    async fn attempt<S, ReqB, ResB>(
        self,
        claim: ClaimRequest,
        trace: Arc<Trace>,
        inner: S,
        req: Request<IdempotencyBody<ReqB>>,
        gone: Arc<AtomicBool>,
    ) -> Attempt<S, ReqB, ResB, S::Error>
    where
        S: Service<Request<IdempotencyBody<ReqB>>, Response = Response<ResB>> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        ReqB: Send + 'static,
        ResB: Body + Send + 'static,
        ResB::Error: Into<BoxError>,
        ResB::Data: Send,
    {
        let client_gone = || gone.load(Ordering::SeqCst);
        let begin = match &self.holder {
            Some(holder) => match holder.begin_held(&claim).await {
                Ok(Held::Claimed(tx)) => {
                    if client_gone() {
                        if let Err(e) = tx.release().await {
                            tracing::warn!(error = %e, "sw-outbox-idempotency: removing a claim failed");
                        }
                        trace.removed();
                        return Attempt::Gone;
                    }
                    return Attempt::Done(self.run_held(tx, inner, req).await);
                }
                Ok(Held::Not(begin)) => Ok(begin),
                Err(e) => Err(e),
            },
            None => self.ledger.begin(&claim).await,
        };
        match begin {
            Ok(Begin::Claimed) => {
                if client_gone() {
                    if let Err(e) = self.ledger.release(&claim.scope, &claim.token).await {
                        // Left running: its retry meets "outcome unknown" once it is stale.
                        tracing::warn!(error = %e, "sw-outbox-idempotency: removing a claim failed");
                    }
                    trace.removed();
                    return Attempt::Gone;
                }
                Attempt::Done(self.run_claimed(claim, inner, req).await)
            }
            Ok(Begin::Running { since_heartbeat }) => Attempt::Running {
                since_heartbeat,
                inner,
                req,
            },
            Ok(Begin::Completed(answer)) => {
                trace.answered(answer.status, "replayed");
                Attempt::Done(Ok(answers::from_stored(answer, true)))
            }
            Ok(Begin::Reused) => {
                trace.answered(422, detail::KEY_REUSED);
                Attempt::Done(Ok(answers::detail(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    detail::KEY_REUSED,
                )))
            }
            Ok(Begin::Full { retry_after }) => {
                trace.answered(503, detail::LEDGER_FULL);
                Attempt::Done(Ok(answers::retry_later(detail::LEDGER_FULL, retry_after)))
            }
            Err(e) if e.is_busy() => {
                trace.answered(503, detail::LEDGER_BUSY);
                Attempt::Done(Ok(answers::retry_later(
                    detail::LEDGER_BUSY,
                    Duration::from_secs(1),
                )))
            }
            Err(e) => {
                tracing::error!(error = %e, account = %trace.account, route = %trace.route, "sw-outbox-idempotency: claiming a key failed");
                Attempt::Done(Ok(answers::detail(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    detail::LEDGER_ERROR,
                )))
            }
        }
    }
}
