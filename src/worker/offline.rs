//! The known-offline fast path (a choice; docs/PROTOCOL.md section 2.4): after the
//! network failed under a first attempt, a replay or the identity check, later writes
//! are queued at once, without a first attempt that can only fail, until the network
//! answers again: a probe (`GET authMePath`) every `offlineProbeMs` while this worker
//! lives, the worker's `online` event, or any answer the worker sees (a read passing
//! through, an identity check). When a probe is answered a flush follows, so a write
//! made after the network came back waits at most about one probe interval.
//!
//! A write queued this way never left the worker (`firstSentAt` null): the server's key
//! window does not apply to it. A worker that starts knows nothing and attempts.

use super::http::identity;
use super::{absolute, flush, Inner, Trigger};
use std::cell::{Cell, RefCell};
use std::rc::Rc;

#[derive(Default)]
pub struct Offline {
    down: Cell<bool>,
    probe: RefCell<Option<gloo_timers::callback::Timeout>>,
}

impl Inner {
    /// Whether writes are queued without a first attempt now.
    pub(crate) fn known_offline(&self) -> bool {
        self.offline.down.get()
    }

    /// The network failed: queue without attempts, and probe until it answers.
    pub(crate) fn network_failed(self: &Rc<Self>) {
        if self.offline.down.replace(true) {
            return;
        }
        self.arm_probe();
    }

    /// The network answered (any HTTP status): attempts are made again.
    pub(crate) fn network_answered(&self) {
        if self.offline.down.replace(false) {
            self.offline.probe.borrow_mut().take();
        }
    }

    fn arm_probe(self: &Rc<Self>) {
        let me = self.clone();
        let timer = gloo_timers::callback::Timeout::new(self.config.offline_probe_ms, move || {
            wasm_bindgen_futures::spawn_local(async move { me.probe().await });
        });
        *self.offline.probe.borrow_mut() = Some(timer);
    }

    async fn probe(self: Rc<Self>) {
        self.offline.probe.borrow_mut().take();
        if !self.offline.down.get() {
            return;
        }
        let cfg = &self.config;
        let url = absolute(&cfg.auth_me_path);
        let answer = identity(&url, None, None, cfg.attempt_timeout_ms, &cfg.csrf_header).await;
        if answer.network_answered() {
            self.network_answered();
            if self.store.count().await.unwrap_or(0) > 0 {
                flush::request(&self, Trigger::Probe).await;
            }
        } else {
            self.arm_probe();
        }
    }
}
