//! Running a claimed route: the plain layer (heartbeat while it runs, then its answer
//! stored) and transactional mode (the route in the claim's transaction, its answer
//! stored in it, one commit).

use crate::answers::{self, detail};
use crate::body::{read_capped, BoxError, Capped, IdempotencyBody};
use crate::hold::HeldTx;
use crate::layer::IdempotencyLayer;
use crate::ledger::{ClaimRequest, ClaimToken, Ledger, Scope, StoredAnswer};
use futures_util::FutureExt;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, Request, Response};
use http_body::Body;
use std::convert::Infallible;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::time::Duration;
use tower_service::Service;

/// What became of a claimed route's answer body.
enum Read<B> {
    /// Streamed or too large to store: handed on as it comes.
    Passed(Pin<Box<B>>),
    /// Read up to the bound.
    Capped(Result<Capped<B>, BoxError>),
}

/// Whether an answer is passed on unbuffered (and stored as its status only): an event
/// stream, a body of no exact length (a stream), or one longer than the bound.
fn is_streamed(headers: &HeaderMap, exact_len: Option<u64>, cap: usize) -> bool {
    let event_stream = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("text/event-stream")
        });
    event_stream || exact_len.is_none_or(|n| n > cap as u64)
}

/// What a claimed route did: its answer's head and body (read, or to pass on), its
/// failure, or its panic.
type Outcome<B, E> =
    Result<Result<(http::response::Parts, Read<B>), E>, Box<dyn std::any::Any + Send>>;

/// Calls the route and reads its answer up to `cap` (unless streamed), catching a panic.
async fn call_and_read<S, ReqB, ResB>(
    mut inner: S,
    req: Request<IdempotencyBody<ReqB>>,
    cap: usize,
) -> Outcome<ResB, S::Error>
where
    S: Service<Request<IdempotencyBody<ReqB>>, Response = Response<ResB>>,
    ResB: Body,
    ResB::Error: Into<BoxError>,
{
    AssertUnwindSafe(async move {
        let resp = inner.call(req).await?;
        let (parts, body) = resp.into_parts();
        let body = Box::pin(body);
        let read = if is_streamed(&parts.headers, body.size_hint().exact(), cap) {
            Read::Passed(body)
        } else {
            Read::Capped(read_capped(body, cap).await)
        };
        Ok((parts, read))
    })
    .catch_unwind()
    .await
}

impl IdempotencyLayer {
    /// Runs the route in the claim's transaction (transactional mode), then stores its
    /// answer in that transaction and commits. A route that panics or fails rolls back
    /// with its transaction, claim included as it was: nothing of it happened, and its
    /// retry runs it again.
    pub(crate) async fn run_held<S, ReqB, ResB>(
        &self,
        tx: Box<dyn HeldTx>,
        inner: S,
        mut req: Request<IdempotencyBody<ReqB>>,
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
        tx.expose(req.extensions_mut());
        let outcome = call_and_read(inner, req, self.settings.max_stored_answer()).await;
        let (parts, read) = match outcome {
            Err(panic) => {
                drop(tx);
                std::panic::resume_unwind(panic)
            }
            Ok(Err(e)) => {
                drop(tx);
                return Err(e);
            }
            Ok(Ok(done)) => done,
        };
        let headers = self.stored_headers(&parts.headers);
        let status = parts.status.as_u16();
        let (answer, resp) = match read {
            Read::Capped(Ok(Capped::Whole { data, trailers })) => (
                StoredAnswer::new(status, headers, data.to_vec()),
                Response::from_parts(parts, IdempotencyBody::held(data, trailers)),
            ),
            Read::Capped(Ok(Capped::Over(body))) => (
                StoredAnswer::status_only(status, headers),
                Response::from_parts(parts, body),
            ),
            Read::Passed(body) => (
                StoredAnswer::status_only(status, headers),
                Response::from_parts(parts, IdempotencyBody::pinned(Default::default(), body)),
            ),
            Read::Capped(Err(e)) => {
                // The route's answer broke off: rolled back, so its retry runs it again.
                tracing::error!(error = %e, "sw-outbox-idempotency: reading a route's answer failed; its transaction is rolled back");
                drop(tx);
                return Ok(answers::from_stored(
                    answers::internal_error_answer(),
                    false,
                ));
            }
        };
        match tx.commit(Some(answer)).await {
            Ok(()) => Ok(resp),
            Err(e) => {
                tracing::error!(error = %e, "sw-outbox-idempotency: a route's transaction did not commit");
                Ok(answers::retry_later(
                    detail::NOT_COMMITTED,
                    Duration::from_secs(1),
                ))
            }
        }
    }

    /// Runs the route under a claimed key, heartbeating, and stores what it answered.
    pub(crate) async fn run_claimed<S, ReqB, ResB>(
        &self,
        claim: ClaimRequest,
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
        // Reading a stored answer is part of the work (its body may come slowly): the claim
        // stays alive until the answer is stored. A streamed answer is not read here.
        let work = call_and_read(inner, req, self.settings.max_stored_answer());
        let (scope, token) = (&claim.scope, &claim.token);
        let outcome = tokio::select! {
            outcome = work => outcome,
            never = heartbeat(self.ledger.as_ref(), scope, token, self.settings.heartbeat_every()) => match never {},
        };
        match outcome {
            Err(panic) => {
                self.complete(scope, token, &answers::internal_error_answer())
                    .await;
                std::panic::resume_unwind(panic)
            }
            Ok(Err(e)) => {
                // The service failed without an answer; it may have done part of the work.
                self.complete(scope, token, &answers::internal_error_answer())
                    .await;
                Err(e)
            }
            Ok(Ok((parts, Read::Capped(Ok(Capped::Whole { data, trailers }))))) => {
                let answer = StoredAnswer::new(
                    parts.status.as_u16(),
                    self.stored_headers(&parts.headers),
                    data.to_vec(),
                );
                self.complete(scope, token, &answer).await;
                Ok(Response::from_parts(
                    parts,
                    IdempotencyBody::held(data, trailers),
                ))
            }
            Ok(Ok((parts, Read::Capped(Ok(Capped::Over(body)))))) => {
                self.complete_status_only(scope, token, &parts).await;
                Ok(Response::from_parts(parts, body))
            }
            Ok(Ok((parts, Read::Passed(body)))) => {
                // The route has answered (its status is decided): stored now, and the body
                // goes to the client as it comes.
                self.complete_status_only(scope, token, &parts).await;
                Ok(Response::from_parts(
                    parts,
                    IdempotencyBody::pinned(Default::default(), body),
                ))
            }
            Ok(Ok((_, Read::Capped(Err(e))))) => {
                // The route ran but its answer broke off: a 500 is stored so that retries do
                // not run it again.
                tracing::error!(error = %e, "sw-outbox-idempotency: reading a route's answer failed");
                let answer = answers::internal_error_answer();
                self.complete(scope, token, &answer).await;
                Ok(answers::from_stored(answer, false))
            }
        }
    }

    async fn complete_status_only(
        &self,
        scope: &Scope,
        token: &ClaimToken,
        parts: &http::response::Parts,
    ) {
        let answer =
            StoredAnswer::status_only(parts.status.as_u16(), self.stored_headers(&parts.headers));
        self.complete(scope, token, &answer).await;
    }

    pub(crate) fn stored_headers(&self, headers: &HeaderMap) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for name in self.settings.stored_headers() {
            for value in headers.get_all(name) {
                if let Ok(v) = value.to_str() {
                    out.push((name.as_str().to_owned(), v.to_owned()));
                }
            }
        }
        out
    }

    /// Stores the answer. A busy ledger gets two more tries; if the answer still cannot be
    /// stored, the claim stays running, stops heartbeating when this request ends, and its
    /// retries get "outcome unknown": the honest answer when the outcome was not recorded.
    async fn complete(&self, scope: &Scope, token: &ClaimToken, answer: &StoredAnswer) {
        const ATTEMPTS: usize = 3;
        for attempt in 1..=ATTEMPTS {
            match self.ledger.complete(scope, token, answer).await {
                Ok(()) => return,
                Err(e) if e.is_busy() && attempt < ATTEMPTS => {}
                Err(e) => {
                    tracing::error!(error = %e, "sw-outbox-idempotency: storing an answer failed");
                    return;
                }
            }
        }
    }
}

async fn heartbeat(
    ledger: &dyn Ledger,
    scope: &Scope,
    token: &ClaimToken,
    every: Duration,
) -> Infallible {
    // The claim was just written: the first beat is one period away.
    let start = tokio::time::Instant::now() + every;
    let mut tick = tokio::time::interval_at(start, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = ledger.heartbeat(scope, token).await {
            tracing::warn!(error = %e, "sw-outbox-idempotency: heartbeat failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    #[test]
    fn what_is_streamed() {
        let mut h = HeaderMap::new();
        assert!(!is_streamed(&h, Some(10), 10), "known and within the bound");
        assert!(is_streamed(&h, Some(11), 10), "over the bound");
        assert!(is_streamed(&h, None, 10), "no exact length");
        h.insert(
            CONTENT_TYPE,
            "Text/Event-Stream; charset=utf-8".parse().unwrap(),
        );
        assert!(
            is_streamed(&h, Some(3), 10),
            "an event stream, whatever its length"
        );
        h.insert(CONTENT_TYPE, "application/json".parse().unwrap());
        assert!(!is_streamed(&h, Some(0), 10));
    }
}
