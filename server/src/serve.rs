//! The connection loop. axum's own `serve` always answers; this one can also close a
//! connection without a byte, which is how the network-down switch and the `refuse` /
//! `drop-after-commit` faults look like real network failures to a browser.
//!
//! Slow clients are bounded: a connection that takes longer than `header_read_timeout`
//! to send a request's headers, or sits idle that long between requests, is closed
//! (hyper's header read timer, which starts when the connection opens and again after
//! each answer); a request body that pauses longer than `body_read_timeout` fails the
//! request (408). Without them, a client trickling bytes holds a connection, its task
//! and a file descriptor for ever.

use crate::app;
use crate::auth::ClientAddr;
use crate::config::Config;
use crate::http_util::{now_ms, DropConnection};
use crate::state::App;
use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinSet;
use tower::ServiceExt;
use tower_http::timeout::TimeoutBody;

/// How long a connection may take over what (see the module documentation).
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    pub header_read: Duration,
    pub body_read: Duration,
}

/// A server started by [`spawn`].
pub struct RunningServer {
    /// The bound address (the real port when the config said 0).
    pub addr: SocketAddr,
    pub app: App,
    shutdown: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningServer {
    /// Stops accepting, lets open connections finish (up to the grace period), and waits.
    pub async fn shutdown(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let _ = (&mut self.task).await;
    }

    /// Waits until the server stops (it only stops through [`RunningServer::shutdown`]
    /// or its `stop` future).
    pub async fn wait(&mut self) {
        let _ = (&mut self.task).await;
    }
}

/// Opens the database (and connects the PostgreSQL ledger, if configured), binds, and
/// serves in a background task until `shutdown` is called. The listener is accepting
/// (kernel backlog) when this returns.
pub async fn spawn(config: Config) -> Result<RunningServer, String> {
    let app = App::connect(&config).await?;
    let listener = TcpListener::bind((config.host, config.port))
        .await
        .map_err(|e| format!("binding {}:{}: {e}", config.host, config.port))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let router = app::router(app.clone(), &config.www);
    let (tx, rx) = oneshot::channel::<()>();
    let pruner = tokio::spawn(prune_loop(app.clone(), config.prune_every));
    let grace = config.shutdown_grace;
    // With faults possible, every connection carries one request. Chromium (and Firefox)
    // silently re-send a request, POST included, when a *reused* keep-alive connection closes
    // without an answer; a dropped write would then reach the server twice and the page
    // would never see the network error the switch exists to produce. On a fresh
    // connection the browser reports the failure instead.
    let keep_alive = !config.mode.has_control();
    let timeouts = Timeouts {
        header_read: config.header_read_timeout,
        body_read: config.body_read_timeout,
    };
    let task = tokio::spawn(async move {
        serve(
            listener,
            router,
            async {
                let _ = rx.await;
            },
            grace,
            keep_alive,
            timeouts,
        )
        .await;
        pruner.abort();
    });
    Ok(RunningServer {
        addr,
        app,
        shutdown: Some(tx),
        task,
    })
}

/// Deletes expired sessions and forgets idle throttle entries now and then. (The ledger
/// prunes itself: the idempotency layer does it as keyed writes come in.)
async fn prune_loop(app: App, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        if let Err(e) = app.store.prune_sessions(now_ms(), app.session_life) {
            eprintln!("sw-outbox-server: pruning sessions failed: {e}");
        }
        let grace = i64::try_from(app.token_ttl.as_millis()).unwrap_or(i64::MAX);
        if let Err(e) = app.store.prune_access_tokens(now_ms(), grace) {
            eprintln!("sw-outbox-server: pruning access tokens failed: {e}");
        }
        let now = Instant::now();
        app.login_throttle.prune(now);
        app.write_budget.prune(now);
    }
}

/// Accepts HTTP/1.1 connections until `stop` resolves, then shuts down gracefully.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    stop: impl std::future::Future<Output = ()>,
    grace: Duration,
    keep_alive: bool,
    timeouts: Timeouts,
) {
    let (closing_tx, closing_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        eprintln!("sw-outbox-server: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                conns.spawn(connection(stream, peer, router.clone(), closing_rx.clone(), keep_alive, timeouts));
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    let _ = closing_tx.send(true);
    let drained =
        tokio::time::timeout(grace, async { while conns.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        conns.abort_all();
    }
}

async fn connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    router: Router,
    mut closing: watch::Receiver<bool>,
    keep_alive: bool,
    timeouts: Timeouts,
) {
    let service = service_fn(move |req: hyper::Request<Incoming>| {
        let router = router.clone();
        let mut req = req.map(|body| TimeoutBody::new(timeouts.body_read, body));
        req.extensions_mut().insert(ClientAddr(peer));
        async move {
            let resp = match router.oneshot(req).await {
                Ok(resp) => resp,
                Err(never) => match never {},
            };
            // An error from the service makes hyper close the connection without writing
            // a response: exactly a network failure from the client's point of view.
            if resp.extensions().get::<DropConnection>().is_some() {
                Err(DropConnection)
            } else {
                Ok(resp)
            }
        }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.header_read)
        .keep_alive(keep_alive)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = async { let _ = closing.wait_for(|c| *c).await; } => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}
