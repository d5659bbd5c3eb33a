//! [`IdempotencyLayer`]: the ledger protocol around any tower HTTP service.
//!
//! For a write (POST, PUT, PATCH, DELETE) with an `Idempotency-Key` from a known account:
//!
//! 1. the key is checked against the [`KeyRule`](crate::KeyRule) (400
//!    `idempotency_key_invalid`);
//! 2. the body is read, up to `max_request_body`; a larger one passes through untouched
//!    (no idempotency, nothing buffered past the bound);
//! 3. [`Ledger::begin`] commits a running claim **before** the route runs, so a crash
//!    mid-route leaves a claim that every retry reads as "outcome unknown" instead of
//!    applying the write a second time;
//! 4. the route runs in a task of its own, to its end even when the client goes away
//!    (its answer is stored, and the client's retry gets it), while the claim's heartbeat
//!    is refreshed; only a process that died stops heartbeating, and its claim goes stale;
//! 5. the answer (any status) is stored and the claim completed. An answer body with a
//!    known length within `max_stored_answer` is read and stored whole; one that is
//!    streamed (no exact length, or `text/event-stream`) or larger is passed on as it
//!    comes, its first byte not held back, and stored as its status only; a route that
//!    panics is stored as 500 `{"detail":"Internal Server Error"}` and the panic goes on.
//!
//! A retry with the same key and fingerprint then gets the stored answer with
//! `Idempotent-Replayed: true` (409 `idempotency_replay_unavailable` with the status, for
//! an answer stored as its status); while the first attempt runs it waits (polling) up to
//! `in_progress_wait` and then gets 409 `idempotency_in_progress`; once the first attempt's
//! heartbeat is older than `stale_after` (by the ledger's clock) it gets 409
//! `idempotency_outcome_unknown`, for good (nobody can know whether the write happened, so
//! nobody may guess). Another request under the same key gets 422 `idempotency_key_reused`.

use crate::answers::{self, detail};
use crate::body::{content_length, read_capped, BoxError, Capped, IdempotencyBody};
use crate::ledger::{Begin, ClaimRequest, ClaimToken, Fingerprint, Ledger, Scope, StoredAnswer};
use crate::settings::Settings;
use futures_util::FutureExt;
use http::header::CONTENT_TYPE;
use http::request::Parts;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::Body;
use sha2::{Digest, Sha256};
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tower_layer::Layer;
use tower_service::Service;
use tracing::Instrument;

/// The request header that carries the key.
pub const KEY_HEADER: &str = "idempotency-key";

/// How the layer learns which account a request acts for: keys are scoped per account.
/// `None` means "no account" (not signed in): the request passes through without
/// idempotency, and the app answers it as it would (typically 401).
///
/// Any `Fn(&Parts) -> Option<String>` is one, e.g. a closure reading the user your
/// authentication middleware put in the request's extensions.
pub trait AccountOf: Send + Sync + 'static {
    /// The account `request` acts for, if any.
    fn account_of(&self, request: &Parts) -> Option<String>;
}

impl<F> AccountOf for F
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    fn account_of(&self, request: &Parts) -> Option<String> {
        self(request)
    }
}

/// The tower layer. Cloning is cheap (shared handles).
#[derive(Clone)]
pub struct IdempotencyLayer {
    ledger: Arc<dyn Ledger>,
    account: Arc<dyn AccountOf>,
    settings: Arc<Settings>,
    last_prune: Arc<Mutex<Option<Instant>>>,
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("ledger", &self.ledger)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl IdempotencyLayer {
    /// The layer on `ledger`, with the design's [`Settings`] and `account` naming each
    /// request's account.
    pub fn new(ledger: Arc<dyn Ledger>, account: impl AccountOf) -> IdempotencyLayer {
        IdempotencyLayer {
            ledger,
            account: Arc::new(account),
            settings: Arc::new(Settings::default()),
            last_prune: Arc::new(Mutex::new(None)),
        }
    }

    /// The same layer with other settings (checked when they were built).
    pub fn with_settings(mut self, settings: Settings) -> IdempotencyLayer {
        self.settings = Arc::new(settings);
        self
    }

    /// The ledger the layer claims keys in.
    pub fn ledger(&self) -> &Arc<dyn Ledger> {
        &self.ledger
    }

    /// The layer's bounds.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Idempotency<S> {
        Idempotency {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service the layer wraps around a route (or a whole router). It takes requests with
/// any body type `ReqB` and hands the route `Request<IdempotencyBody<ReqB>>`; the route
/// may answer with any body type `ResB`, and the client gets
/// `Response<IdempotencyBody<ResB>>`.
#[derive(Clone, Debug)]
pub struct Idempotency<S> {
    inner: S,
    layer: IdempotencyLayer,
}

/// What the layer's future resolves to.
pub type IdempotencyFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, ReqB, ResB> Service<Request<ReqB>> for Idempotency<S>
where
    S: Service<Request<IdempotencyBody<ReqB>>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Body + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ReqB::Data: Send,
    ResB: Body + Send + 'static,
    ResB::Error: Into<BoxError>,
    ResB::Data: Send,
{
    type Response = Response<IdempotencyBody<ResB>>;
    type Error = S::Error;
    type Future = IdempotencyFuture<Self::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        // The clone that was polled ready serves this request; a fresh clone stays.
        let fresh = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, fresh);
        Box::pin(handle(self.layer.clone(), inner, req))
    }
}

fn is_write(method: &Method) -> bool {
    matches!(
        *method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    )
}

async fn pass<S, ReqB, ResB>(
    mut inner: S,
    req: Request<IdempotencyBody<ReqB>>,
) -> Result<Response<IdempotencyBody<ResB>>, S::Error>
where
    S: Service<Request<IdempotencyBody<ReqB>>, Response = Response<ResB>>,
{
    Ok(inner.call(req).await?.map(IdempotencyBody::new))
}

enum KeyOf {
    Absent,
    Invalid,
    Valid(String),
}

fn key_of(parts: &Parts, settings: &Settings) -> KeyOf {
    let mut values = parts.headers.get_all(KEY_HEADER).iter();
    let Some(value) = values.next() else {
        return KeyOf::Absent;
    };
    if values.next().is_some() {
        return KeyOf::Invalid;
    }
    match value.to_str() {
        Ok(k) if settings.key_rule().accepts(k) => KeyOf::Valid(k.to_owned()),
        _ => KeyOf::Invalid,
    }
}

async fn handle<S, ReqB, ResB>(
    layer: IdempotencyLayer,
    inner: S,
    req: Request<ReqB>,
) -> Result<Response<IdempotencyBody<ResB>>, S::Error>
where
    S: Service<Request<IdempotencyBody<ReqB>>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqB: Body + Send + 'static,
    ReqB::Error: Into<BoxError>,
    ReqB::Data: Send,
    ResB: Body + Send + 'static,
    ResB::Error: Into<BoxError>,
    ResB::Data: Send,
{
    if !is_write(req.method()) || !req.headers().contains_key(KEY_HEADER) {
        return pass(inner, req.map(IdempotencyBody::new)).await;
    }
    let (parts, body) = req.into_parts();
    let Some(account) = layer.account.account_of(&parts) else {
        return pass(
            inner,
            Request::from_parts(parts, IdempotencyBody::new(body)),
        )
        .await;
    };
    let key = match key_of(&parts, &layer.settings) {
        KeyOf::Valid(k) => k,
        KeyOf::Invalid => {
            return Ok(answers::detail(
                StatusCode::BAD_REQUEST,
                detail::KEY_INVALID,
            ))
        }
        KeyOf::Absent => {
            return pass(
                inner,
                Request::from_parts(parts, IdempotencyBody::new(body)),
            )
            .await
        }
    };
    let cap = layer.settings.max_request_body();
    if content_length(&parts.headers).is_some_and(|n| n > cap as u64) {
        return pass(
            inner,
            Request::from_parts(parts, IdempotencyBody::new(body)),
        )
        .await;
    }
    let (bytes, trailers) = match read_capped(Box::pin(body), cap).await {
        Ok(Capped::Whole { data, trailers }) => (data, trailers),
        Ok(Capped::Over(body)) => return pass(inner, Request::from_parts(parts, body)).await,
        Err(e) => {
            tracing::debug!(error = %e, "sw-outbox-idempotency: a request body broke off");
            return Ok(answers::detail(
                StatusCode::BAD_REQUEST,
                detail::BODY_UNREADABLE,
            ));
        }
    };
    layer.maybe_prune();
    let fp = Fingerprint::new(
        parts.method.as_str(),
        parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| parts.uri.path().to_owned()),
        Sha256::digest(&bytes).into(),
    );
    let token = match random_token() {
        Ok(t) => ClaimToken(t),
        Err(e) => {
            tracing::error!(error = %e, "sw-outbox-idempotency: no random claim token");
            return Ok(answers::detail(
                StatusCode::INTERNAL_SERVER_ERROR,
                detail::LEDGER_ERROR,
            ));
        }
    };
    let s = &layer.settings;
    let claim = ClaimRequest::new(Scope::new(account, key), fp, token)
        .with_key_ttl(s.key_ttl())
        .with_max_rows(s.max_rows(), s.max_rows_per_account());
    if let Some(answer) = layer.claim(&claim).await {
        return Ok(answer);
    }
    let req = Request::from_parts(parts, IdempotencyBody::held(bytes, trailers));
    // The claimed route runs in a task of its own, to its end, even when the client goes
    // away (hyper drops a request's future when its connection closes): a route cut off
    // midway may have done part of its work with no answer stored, and every retry of the
    // key would then get "outcome unknown", for a person to sort out. Run to its end, the
    // route's answer is stored and the retry gets it. The request body is already read,
    // so nothing of the client is needed.
    let run = async move { layer.run_claimed(claim, inner, req).await };
    match tokio::spawn(run.in_current_span()).await {
        Ok(answer) => answer,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => {
            // Only a runtime shutting down cancels the task.
            tracing::error!(error = %e, "sw-outbox-idempotency: a claimed route was cancelled");
            Ok(answers::detail(
                StatusCode::INTERNAL_SERVER_ERROR,
                detail::LEDGER_ERROR,
            ))
        }
    }
}

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

impl IdempotencyLayer {
    /// Claims the key; `Some(answer)` when the route must not run (a replay, a wait that ran
    /// out, a refusal).
    async fn claim<B>(&self, claim: &ClaimRequest) -> Option<Response<IdempotencyBody<B>>> {
        let s = &*self.settings;
        let wait_until = tokio::time::Instant::now() + s.in_progress_wait();
        loop {
            let since_heartbeat = match self.ledger.begin(claim).await {
                Ok(Begin::Claimed) => return None,
                Ok(Begin::Completed(answer)) => return Some(answers::from_stored(answer, true)),
                Ok(Begin::Reused) => {
                    return Some(answers::detail(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        detail::KEY_REUSED,
                    ))
                }
                Ok(Begin::Full { retry_after }) => {
                    return Some(answers::retry_later(detail::LEDGER_FULL, retry_after))
                }
                Ok(Begin::Running { since_heartbeat }) => since_heartbeat,
                Err(e) if e.is_busy() => {
                    return Some(answers::retry_later(
                        detail::LEDGER_BUSY,
                        Duration::from_secs(1),
                    ))
                }
                Err(e) => {
                    tracing::error!(error = %e, "sw-outbox-idempotency: claiming a key failed");
                    return Some(answers::detail(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        detail::LEDGER_ERROR,
                    ));
                }
            };
            if since_heartbeat > s.stale_after() {
                return Some(answers::detail(
                    StatusCode::CONFLICT,
                    detail::OUTCOME_UNKNOWN,
                ));
            }
            let left = wait_until.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return Some(answers::detail(StatusCode::CONFLICT, detail::IN_PROGRESS));
            }
            tokio::time::sleep(left.min(s.in_progress_poll())).await;
        }
    }

    /// Runs the route under a claimed key, heartbeating, and stores what it answered.
    async fn run_claimed<S, ReqB, ResB>(
        &self,
        claim: ClaimRequest,
        mut inner: S,
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
        let cap = self.settings.max_stored_answer();
        // Reading a stored answer is part of the work (its body may come slowly): the claim
        // stays alive until the answer is stored. A streamed answer is not read here.
        let work = AssertUnwindSafe(async move {
            let resp = inner.call(req).await?;
            let (parts, body) = resp.into_parts();
            let body = Box::pin(body);
            let read = if is_streamed(&parts.headers, body.size_hint().exact(), cap) {
                Read::Passed(body)
            } else {
                Read::Capped(read_capped(body, cap).await)
            };
            Ok::<_, S::Error>((parts, read))
        })
        .catch_unwind();
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

    fn stored_headers(&self, headers: &HeaderMap) -> Vec<(String, String)> {
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

    /// Deletes expired entries in a task of its own, at most once per `prune_every` (timed
    /// by this process's monotonic clock: only the pace, never what expired).
    fn maybe_prune(&self) {
        {
            let mut last = self.last_prune.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            if last.is_some_and(|t| now.duration_since(t) < self.settings.prune_every()) {
                return;
            }
            *last = Some(now);
        }
        let ledger = self.ledger.clone();
        let key_ttl = self.settings.key_ttl();
        tokio::spawn(async move {
            match ledger.prune(key_ttl).await {
                Ok(n) if n > 0 => {
                    tracing::debug!(deleted = n, "sw-outbox-idempotency: pruned expired entries")
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "sw-outbox-idempotency: pruning the ledger failed")
                }
            }
        });
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

/// 32 random bytes from the OS, hex-encoded.
fn random_token() -> Result<String, getrandom::Error> {
    let mut buf = [0u8; 32];
    getrandom::fill(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

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
