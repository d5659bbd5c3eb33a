//! [`IdempotencyLayer`]: the ledger protocol around any tower HTTP service.
//!
//! For a write (POST, PUT, PATCH, DELETE) with an `Idempotency-Key` from a known account:
//!
//! 1. the key is checked against the [`KeyRule`](crate::KeyRule) (400
//!    `idempotency_key_invalid`);
//! 2. the body is read, up to `max_request_body`; a larger one is refused (413
//!    `idempotency_body_too_large`, naming the bound) rather than run unprotected;
//! 3. [`Ledger::begin`] commits a running claim **before** the route runs, so a crash
//!    mid-route leaves a claim that every retry reads as "outcome unknown" instead of
//!    applying the write a second time (transactional mode instead holds the claim in the
//!    route's own transaction: see `transactional`, feature `postgres`);
//! 4. the claim and the route run in a task of their own (`claimed`): a client that hangs
//!    up before the route started has its claim removed, and one that hangs up later does
//!    not cut the route off: it runs to its end (its answer is stored, and the client's
//!    retry gets it), while the claim's heartbeat is refreshed; only a process that died
//!    stops heartbeating, and its claim goes stale;
//! 5. the answer (any status) is stored and the claim completed (`route`). An answer body
//!    with a known length within `max_stored_answer` is read and stored whole; one that is
//!    streamed (no exact length, or `text/event-stream`) or larger is passed on as it
//!    comes, its first byte not held back, and stored as its status only; a route that
//!    panics is stored as 500 `{"detail":"Internal Server Error"}` and the panic goes on.
//!
//! A retry with the same key and fingerprint (method, path and query, body, and
//! `Content-Type`) then gets the stored answer with `Idempotent-Replayed: true` (409
//! `idempotency_replay_unavailable` with the status, for an answer stored as its status);
//! while the first attempt runs it waits (polling) up to `in_progress_wait` and then gets
//! 409 `idempotency_in_progress`; once the first attempt's heartbeat is older than
//! `stale_after` (by the ledger's clock) it gets 409 `idempotency_outcome_unknown`, for
//! good (nobody can know whether the write happened, so nobody may guess). Another request
//! under the same key gets 422 `idempotency_key_reused`. Each of these answers is traced at
//! debug level with the key's account and route.

use crate::answers::{self, detail};
use crate::body::{content_length, read_capped, BoxError, Capped, IdempotencyBody};
use crate::hold::Holder;
use crate::ledger::{ClaimRequest, ClaimToken, Fingerprint, Ledger, Scope};
use crate::settings::Settings;
use http::header::CONTENT_TYPE;
use http::request::Parts;
use http::{Method, Request, Response, StatusCode};
use http_body::Body;
use sha2::{Digest, Sha256};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tower_layer::Layer;
use tower_service::Service;

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
    pub(crate) ledger: Arc<dyn Ledger>,
    /// Transactional mode: the ledger that hands the route the claim's transaction.
    pub(crate) holder: Option<Arc<dyn Holder>>,
    account: Arc<dyn AccountOf>,
    pub(crate) settings: Arc<Settings>,
    last_prune: Arc<Mutex<Option<Instant>>>,
    /// Whether a keyed write without an account was logged already (once per layer).
    warned_without_account: Arc<AtomicBool>,
}

impl fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("ledger", &self.ledger)
            .field("transactional", &self.holder.is_some())
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
            holder: None,
            account: Arc::new(account),
            settings: Arc::new(Settings::default()),
            last_prune: Arc::new(Mutex::new(None)),
            warned_without_account: Arc::new(AtomicBool::new(false)),
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

    /// Whether routes get the claim's transaction (`PgLedger`'s transactional mode).
    pub fn is_transactional(&self) -> bool {
        self.holder.is_some()
    }

    /// A request the layer does not claim: on to the route as it is (in transactional
    /// mode with a transaction of its own, begun when the route first asks for it and
    /// committed after the route returns).
    async fn pass<S, ReqB, ResB>(
        &self,
        mut inner: S,
        mut req: Request<IdempotencyBody<ReqB>>,
    ) -> Result<Response<IdempotencyBody<ResB>>, S::Error>
    where
        S: Service<Request<IdempotencyBody<ReqB>>, Response = Response<ResB>>,
    {
        let Some(holder) = &self.holder else {
            return Ok(inner.call(req).await?.map(IdempotencyBody::new));
        };
        let tx = holder.unclaimed();
        tx.expose(req.extensions_mut());
        // An error or a panic drops the transaction: rolled back.
        let resp = inner.call(req).await?;
        match tx.commit(None).await {
            Ok(()) => Ok(resp.map(IdempotencyBody::new)),
            Err(e) => {
                tracing::error!(error = %e, "sw-outbox-idempotency: a route's transaction did not commit");
                Ok(answers::retry_later(
                    detail::NOT_COMMITTED,
                    Duration::from_secs(1),
                ))
            }
        }
    }

    /// A keyed write with no account passes unprotected: most often because authentication
    /// runs inside the layer (added before it), so the account is not known yet. Said
    /// once, loudly, instead of letting every retry run again in silence.
    fn warn_once_without_account(&self, parts: &Parts) {
        if self.warned_without_account.swap(true, Ordering::SeqCst) {
            tracing::debug!(method = %parts.method, path = %parts.uri.path(), "sw-outbox-idempotency: a keyed write with no account passed through");
            return;
        }
        tracing::warn!(
            method = %parts.method,
            path = %parts.uri.path(),
            "sw-outbox-idempotency: a write with an Idempotency-Key reached the layer with no \
             account, so it ran without idempotency (a retry runs it again). If it was \
             signed in, authentication most likely runs inside the layer: add the \
             authentication layer after the IdempotencyLayer (`.layer(idempotency)` first, \
             then `.layer(auth)`), so it runs first and the account is known. (Logged once; \
             later ones at debug level.)"
        );
    }
}

/// Who a keyed write acts for and where it goes, for the layer's debug traces.
pub(crate) struct Trace {
    pub(crate) account: String,
    pub(crate) route: String,
    key: String,
}

impl Trace {
    fn new(account: &str, key: &str, parts: &Parts) -> Trace {
        Trace {
            account: account.to_owned(),
            route: format!("{} {}", parts.method, parts.uri.path()),
            key: key.to_owned(),
        }
    }

    /// The layer answered in the route's place (a replay, a 409, a 422, a refusal).
    pub(crate) fn answered(&self, status: u16, what: &str) {
        tracing::debug!(account = %self.account, route = %self.route, key = %self.key, status, what, "sw-outbox-idempotency: answered from the ledger");
    }

    /// A claim removed because its client went away before the route started.
    pub(crate) fn removed(&self) {
        tracing::debug!(account = %self.account, route = %self.route, key = %self.key, "sw-outbox-idempotency: claim removed, its client went away before the route started");
    }

    fn refused_too_large(&self, cap: usize) {
        tracing::debug!(account = %self.account, route = %self.route, key = %self.key, max_request_body = cap, "sw-outbox-idempotency: keyed write refused, its body is over the bound");
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
        return layer.pass(inner, req.map(IdempotencyBody::new)).await;
    }
    let (parts, body) = req.into_parts();
    let Some(account) = layer.account.account_of(&parts) else {
        layer.warn_once_without_account(&parts);
        return layer
            .pass(
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
            return layer
                .pass(
                    inner,
                    Request::from_parts(parts, IdempotencyBody::new(body)),
                )
                .await
        }
    };
    let trace = Trace::new(&account, &key, &parts);
    // Fail closed: a keyed write the layer cannot fingerprint is refused, never run
    // unprotected (a retry of it would run it again).
    let cap = layer.settings.max_request_body();
    if content_length(&parts.headers).is_some_and(|n| n > cap as u64) {
        trace.refused_too_large(cap);
        return Ok(answers::body_too_large(cap));
    }
    let (bytes, trailers) = match read_capped(Box::pin(body), cap).await {
        Ok(Capped::Whole { data, trailers }) => (data, trailers),
        Ok(Capped::Over(_)) => {
            trace.refused_too_large(cap);
            return Ok(answers::body_too_large(cap));
        }
        Err(e) => {
            tracing::debug!(error = %e, "sw-outbox-idempotency: a request body broke off");
            return Ok(answers::detail(
                StatusCode::BAD_REQUEST,
                detail::BODY_UNREADABLE,
            ));
        }
    };
    layer.maybe_prune();
    let mut fp = Fingerprint::new(
        parts.method.as_str(),
        parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_else(|| parts.uri.path().to_owned()),
        Sha256::digest(&bytes).into(),
    );
    if let Some(ct) = parts.headers.get(CONTENT_TYPE) {
        fp = fp.with_content_type(&String::from_utf8_lossy(ct.as_bytes()));
    }
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
    let req = Request::from_parts(parts, IdempotencyBody::held(bytes, trailers));
    layer.claim_and_run(claim, trace, inner, req).await
}

impl IdempotencyLayer {
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

/// 32 random bytes from the OS, hex-encoded.
fn random_token() -> Result<String, getrandom::Error> {
    let mut buf = [0u8; 32];
    getrandom::fill(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}
