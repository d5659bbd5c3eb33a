//! [`IdempotencyLayer`]: the ledger protocol around any axum (tower) service.
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
//! 4. while the route runs, the claim's heartbeat is refreshed inside the request's own
//!    future: a request cancelled (the client went away) or a process that died stops
//!    heartbeating, and its claim goes stale;
//! 5. the answer (any status) is stored and the claim completed; a route that panics is
//!    stored as 500 `{"detail":"Internal Server Error"}` and the panic goes on.
//!
//! A retry with the same key and fingerprint then gets the stored answer with
//! `Idempotent-Replayed: true`; while the first attempt runs it waits (polling) up to
//! `in_progress_wait` and then gets 409 `idempotency_in_progress`; once the first attempt's
//! heartbeat is older than `stale_after` it gets 409 `idempotency_outcome_unknown`, for good
//! (nobody can know whether the write happened, so nobody may guess). Another request under
//! the same key gets 422 `idempotency_key_reused`.

use crate::answers::{self, detail};
use crate::body::{content_length, read_capped, Capped};
use crate::ledger::{Begin, ClaimRequest, ClaimToken, Fingerprint, Ledger, Scope, StoredAnswer};
use crate::settings::Settings;
use axum_core::body::Body;
use bytes::Bytes;
use futures_util::FutureExt;
use http::request::Parts;
use http::{Method, Request, Response, StatusCode};
use sha2::{Digest, Sha256};
use std::convert::Infallible;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The request header that carries the key.
pub const KEY_HEADER: &str = "idempotency-key";

/// How the layer learns which account a request acts for: keys are scoped per account.
/// `None` means "no account" (not signed in): the request passes through without
/// idempotency, and the app answers it as it would (typically 401).
///
/// Any `Fn(&Parts) -> Option<String>` is one, e.g. a closure reading the user your
/// authentication middleware put in the request's extensions.
pub trait AccountOf: Send + Sync + 'static {
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
    last_prune_ms: Arc<AtomicI64>,
}

impl IdempotencyLayer {
    /// The layer on `ledger`, with the design's [`Settings`] and `account` naming each
    /// request's account.
    pub fn new(ledger: Arc<dyn Ledger>, account: impl AccountOf) -> IdempotencyLayer {
        IdempotencyLayer {
            ledger,
            account: Arc::new(account),
            settings: Arc::new(Settings::default()),
            last_prune_ms: Arc::new(AtomicI64::new(0)),
        }
    }

    /// The same layer with other settings.
    pub fn with_settings(mut self, settings: Settings) -> IdempotencyLayer {
        self.settings = Arc::new(settings);
        self
    }

    pub fn ledger(&self) -> &Arc<dyn Ledger> {
        &self.ledger
    }

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

/// The service the layer wraps around a route (or a whole router).
#[derive(Clone)]
pub struct Idempotency<S> {
    inner: S,
    layer: IdempotencyLayer,
}

impl<S, ResB> Service<Request<Body>> for Idempotency<S>
where
    S: Service<Request<Body>, Response = Response<ResB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
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

async fn pass<S, ResB>(mut inner: S, req: Request<Body>) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<ResB>>,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    Ok(inner.call(req).await?.map(Body::new))
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
        Ok(k) if settings.key_rule.accepts(k) => KeyOf::Valid(k.to_owned()),
        _ => KeyOf::Invalid,
    }
}

async fn handle<S, ResB>(
    layer: IdempotencyLayer,
    inner: S,
    req: Request<Body>,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<Body>, Response = Response<ResB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ResB: http_body::Body<Data = Bytes> + Send + 'static,
    ResB::Error: Into<BoxError>,
{
    if !is_write(req.method()) || !req.headers().contains_key(KEY_HEADER) {
        return pass(inner, req).await;
    }
    let (parts, body) = req.into_parts();
    let Some(account) = layer.account.account_of(&parts) else {
        return pass(inner, Request::from_parts(parts, body)).await;
    };
    let key = match key_of(&parts, &layer.settings) {
        KeyOf::Valid(k) => k,
        KeyOf::Invalid => {
            return Ok(answers::detail(
                StatusCode::BAD_REQUEST,
                detail::KEY_INVALID,
            ))
        }
        KeyOf::Absent => return pass(inner, Request::from_parts(parts, body)).await,
    };
    let cap = layer.settings.max_request_body;
    if content_length(&parts.headers).is_some_and(|n| n > cap as u64) {
        return pass(inner, Request::from_parts(parts, body)).await;
    }
    let bytes = match read_capped(body, cap).await {
        Ok(Capped::Whole(b)) => b,
        Ok(Capped::Over(body)) => return pass(inner, Request::from_parts(parts, body)).await,
        Err(_) => {
            return Ok(answers::detail(
                StatusCode::BAD_REQUEST,
                detail::BODY_UNREADABLE,
            ))
        }
    };
    layer.maybe_prune();
    let scope = Scope { account, key };
    let fp = Fingerprint {
        method: parts.method.as_str().to_owned(),
        path: parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| parts.uri.path().to_owned()),
        body_sha256: Sha256::digest(&bytes).into(),
    };
    let token = match random_token() {
        Ok(t) => ClaimToken(t),
        Err(e) => {
            eprintln!("sw-outbox-idempotency: no random claim token: {e}");
            return Ok(answers::detail(
                StatusCode::INTERNAL_SERVER_ERROR,
                detail::LEDGER_ERROR,
            ));
        }
    };
    if let Some(answer) = layer.claim(&scope, &fp, &token).await {
        return Ok(answer);
    }
    layer
        .run_claimed(
            scope,
            token,
            inner,
            Request::from_parts(parts, Body::from(bytes)),
        )
        .await
}

impl IdempotencyLayer {
    /// Claims the key; `Some(answer)` when the route must not run (a replay, a wait that ran
    /// out, a refusal).
    async fn claim(
        &self,
        scope: &Scope,
        fp: &Fingerprint,
        token: &ClaimToken,
    ) -> Option<Response<Body>> {
        let s = &*self.settings;
        let wait_until = Instant::now() + s.in_progress_wait;
        loop {
            let now = now_ms();
            let claim = ClaimRequest {
                scope,
                fingerprint: fp,
                token,
                now_ms: now,
                expired_before_ms: now.saturating_sub(ms(s.key_ttl)),
                max_rows: s.max_rows,
            };
            let running_since = match self.ledger.begin(claim).await {
                Ok(Begin::Claimed) => return None,
                Ok(Begin::Completed(answer)) => return Some(answers::from_stored(answer, true)),
                Ok(Begin::Reused) => {
                    return Some(answers::detail(
                        StatusCode::UNPROCESSABLE_ENTITY,
                        detail::KEY_REUSED,
                    ))
                }
                Ok(Begin::Full) => return Some(answers::retry_soon(detail::LEDGER_FULL)),
                Ok(Begin::Running { heartbeat_ms }) => heartbeat_ms,
                Err(e) if e.is_busy() => return Some(answers::retry_soon(detail::LEDGER_BUSY)),
                Err(e) => {
                    eprintln!("sw-outbox-idempotency: claiming a key failed: {e}");
                    return Some(answers::detail(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        detail::LEDGER_ERROR,
                    ));
                }
            };
            if now_ms().saturating_sub(running_since) > ms(s.stale_after) {
                return Some(answers::detail(
                    StatusCode::CONFLICT,
                    detail::OUTCOME_UNKNOWN,
                ));
            }
            let left = wait_until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Some(answers::detail(StatusCode::CONFLICT, detail::IN_PROGRESS));
            }
            tokio::time::sleep(left.min(s.in_progress_poll.max(Duration::from_millis(1)))).await;
        }
    }

    /// Runs the route under a claimed key, heartbeating, and stores what it answered.
    async fn run_claimed<S, ResB>(
        &self,
        scope: Scope,
        token: ClaimToken,
        mut inner: S,
        req: Request<Body>,
    ) -> Result<Response<Body>, S::Error>
    where
        S: Service<Request<Body>, Response = Response<ResB>> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
        ResB: http_body::Body<Data = Bytes> + Send + 'static,
        ResB::Error: Into<BoxError>,
    {
        let cap = self.settings.max_stored_answer;
        // Reading the answer is part of the work: a route may stream its body slowly, and
        // the claim must stay alive until the answer is stored.
        let work = AssertUnwindSafe(async move {
            let resp = inner.call(req).await?;
            let (parts, body) = resp.into_parts();
            let read = read_capped(Body::new(body), cap).await;
            Ok::<_, S::Error>((parts, read))
        })
        .catch_unwind();
        let every = self.settings.heartbeat_every.max(Duration::from_millis(1));
        let outcome = tokio::select! {
            outcome = work => outcome,
            never = heartbeat(self.ledger.as_ref(), &scope, &token, every) => match never {},
        };
        match outcome {
            Err(panic) => {
                self.complete(&scope, &token, &answers::internal_error_answer())
                    .await;
                std::panic::resume_unwind(panic)
            }
            Ok(Err(e)) => {
                // The service failed without an answer; it may have done part of the work.
                self.complete(&scope, &token, &answers::internal_error_answer())
                    .await;
                Err(e)
            }
            Ok(Ok((parts, Ok(Capped::Whole(bytes))))) => {
                let answer = StoredAnswer {
                    status: parts.status.as_u16(),
                    headers: self.stored_headers(&parts.headers),
                    body: Some(bytes.to_vec()),
                };
                self.complete(&scope, &token, &answer).await;
                Ok(Response::from_parts(parts, Body::from(bytes)))
            }
            Ok(Ok((parts, Ok(Capped::Over(body))))) => {
                let answer = StoredAnswer {
                    status: parts.status.as_u16(),
                    headers: self.stored_headers(&parts.headers),
                    body: None,
                };
                self.complete(&scope, &token, &answer).await;
                Ok(Response::from_parts(parts, body))
            }
            Ok(Ok((_, Err(e)))) => {
                // The route ran but its answer broke off: a 500 is stored so that retries do
                // not run it again.
                eprintln!("sw-outbox-idempotency: reading a route's answer failed: {e}");
                let answer = answers::internal_error_answer();
                self.complete(&scope, &token, &answer).await;
                Ok(answers::from_stored(answer, false))
            }
        }
    }

    fn stored_headers(&self, headers: &http::HeaderMap) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for name in &self.settings.stored_headers {
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
                    eprintln!("sw-outbox-idempotency: storing an answer failed: {e}");
                    return;
                }
            }
        }
    }

    /// Deletes expired entries in a task of its own, at most once per `prune_every`.
    fn maybe_prune(&self) {
        let now = now_ms();
        let last = self.last_prune_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) < ms(self.settings.prune_every) {
            return;
        }
        if self
            .last_prune_ms
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return; // another request took this turn
        }
        let ledger = self.ledger.clone();
        let cutoff = now.saturating_sub(ms(self.settings.key_ttl));
        tokio::spawn(async move {
            if let Err(e) = ledger.prune(cutoff).await {
                eprintln!("sw-outbox-idempotency: pruning the ledger failed: {e}");
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
    let mut tick = tokio::time::interval_at(Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = ledger.heartbeat(scope, token, now_ms()).await {
            eprintln!("sw-outbox-idempotency: heartbeat failed: {e}");
        }
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Wall-clock milliseconds since the Unix epoch. Ledger times are wall-clock (not
/// `Instant`) because they are stored and compared across processes and restarts.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(ms)
        .unwrap_or(0)
}

/// 32 random bytes from the OS, hex-encoded.
fn random_token() -> Result<String, getrandom::Error> {
    let mut buf = [0u8; 32];
    getrandom::fill(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}
