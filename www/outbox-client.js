/**
 * outbox-client.js — the page side of sw-outbox.
 *
 * A dependency-free ES module that registers the outbox service worker, waits until it
 * controls the page, and speaks the command protocol of the behaviour contract
 * (docs: outbox-contract sections 5–7): every command carries a unique `requestId` and
 * its promise resolves with the worker's answer carrying that id back.
 *
 * Answers are resolved as they are, `ok:false` included: a refused command is an answer,
 * not a transport failure, so callers check `result.ok`. A promise rejects only when no
 * answer came (timeout) or no worker controls the page.
 *
 * @example
 *   import { registerOutbox } from '/outbox-client.js';
 *   const outbox = await registerOutbox();
 *   outbox.on('MUTATIONS_BLOCKED', (m) => render(m.blocked));
 *   await outbox.signedIn('alice');
 */

/** Report types the worker broadcasts to every window of its scope (contract 5). */
export const REPORT_TYPES = Object.freeze([
  'MUTATIONS_BLOCKED', 'MUTATIONS_REPLAYED', 'MUTATIONS_PARTIAL', 'MUTATION_QUEUED',
]);

/** Answer types the worker sends only to the client that asked (contract 6). */
const ANSWER_TYPES = new Set(['COMMAND_RESULT', 'QUEUE_STATE']);

/**
 * @typedef {object} CommandResult
 * @property {'COMMAND_RESULT'} type
 * @property {string|null} command   the command's `type` as sent
 * @property {boolean} ok
 * @property {string} [reason]       why it was refused, when `ok` is false
 * @property {number} [affected]     records replayed / adopted / changed
 * @property {string|number} [requestId]
 */

/**
 * @typedef {object} QueueRecord  metadata of one queued record (never its body)
 * @property {number} id
 * @property {string} method
 * @property {string} path            relative to `/api`, query included
 * @property {string|null} ownerId
 * @property {string|null} workspace
 * @property {'queued'|'needs-attention'} state
 * @property {string|null} [attentionReason]
 * @property {number} timestamp
 */

/**
 * @typedef {object} QueueState
 * @property {'QUEUE_STATE'} type
 * @property {QueueRecord[]} records
 * @property {string|number} [requestId]
 */

let requestCounter = 0;

/** A request id unique within this page and unlikely to collide with another tab's. */
function nextRequestId() {
  requestCounter += 1;
  return `oc-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}-${requestCounter}`;
}

/**
 * The page's handle on the outbox worker. Create it with {@link registerOutbox}.
 */
export class OutboxClient {
  /**
   * @param {object} [options]
   * @param {number} [options.commandTimeoutMs=60000] how long a command waits for its
   *   answer. Generous on purpose: commands run one at a time in the worker, so even a
   *   LIST_QUEUE may wait behind a flush, and a flush may legitimately take its whole
   *   budget (25 s) plus one attempt's timeout.
   */
  constructor({ commandTimeoutMs = 60000 } = {}) {
    this.commandTimeoutMs = commandTimeoutMs;
    /** @type {Map<string, {resolve: Function, reject: Function, timer: any}>} */
    this.pending = new Map();
    /** @type {Map<string, Set<Function>>} */
    this.listeners = new Map();
    this.onMessage = this.onMessage.bind(this);
    this.onOnline = () => { this.flush().catch(() => {}); };
  }

  /** Starts listening; called by registerOutbox before the worker can send anything. */
  attach() {
    navigator.serviceWorker.addEventListener('message', this.onMessage);
    // Messages to a page are held until the page opts in; addEventListener alone does not.
    navigator.serviceWorker.startMessages?.();
    // Chromium fires no `online` event in workers, so the page triggers the replay (contract 4).
    window.addEventListener('online', this.onOnline);
  }

  /** Stops listening and rejects every pending command. */
  detach() {
    navigator.serviceWorker.removeEventListener('message', this.onMessage);
    window.removeEventListener('online', this.onOnline);
    for (const [id, p] of this.pending) {
      clearTimeout(p.timer);
      p.reject(new Error(`outbox: client detached before the answer to ${id}`));
    }
    this.pending.clear();
  }

  /** @param {MessageEvent} event */
  onMessage(event) {
    const data = event.data;
    if (!data || typeof data !== 'object' || typeof data.type !== 'string') return;
    if (ANSWER_TYPES.has(data.type) && data.requestId != null) {
      const p = this.pending.get(String(data.requestId));
      if (p) {
        this.pending.delete(String(data.requestId));
        clearTimeout(p.timer);
        p.resolve(data);
      }
    }
    for (const key of [data.type, '*']) {
      for (const fn of this.listeners.get(key) ?? []) {
        try { fn(data); } catch (err) { console.error('outbox: listener failed', err); }
      }
    }
  }

  /**
   * Posts any command to the controlling worker and waits for the answer with its
   * `requestId`. The named methods below are thin wrappers; this one is public so tests
   * can send malformed or future commands.
   * @param {object} message a command of contract 6; `requestId` is added when absent
   * @param {{timeoutMs?: number}} [options]
   * @returns {Promise<CommandResult|QueueState>}
   */
  send(message, { timeoutMs = this.commandTimeoutMs } = {}) {
    const controller = navigator.serviceWorker.controller;
    if (!controller) {
      return Promise.reject(new Error(
        'outbox: this page is not controlled by the outbox worker (first load not claimed, or a hard reload)'));
    }
    const requestId = message.requestId ?? nextRequestId();
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(String(requestId));
        reject(new Error(`outbox: no answer to ${message.type} (requestId ${requestId}) within ${timeoutMs} ms`));
      }, timeoutMs);
      this.pending.set(String(requestId), { resolve, reject, timer });
      controller.postMessage({ ...message, requestId });
    });
  }

  /**
   * Tells the worker who is signed in (null: nobody). Later writes are bound to it.
   * @param {string|null} userId
   * @returns {Promise<CommandResult>}
   */
  authSession(userId) {
    return this.send({ type: 'AUTH_SESSION', userId: userId ?? null });
  }

  /** Runs a flush; resolves after it with `affected` = records replayed. @returns {Promise<CommandResult>} */
  flush() {
    return this.send({ type: 'FLUSH_QUEUE' });
  }

  /** Every record's metadata, bodies excluded. @returns {Promise<QueueState>} */
  list() {
    return this.send({ type: 'LIST_QUEUE' });
  }

  /**
   * Adopts unknown-owner records (all, or the given ids) for `ownerId`; the worker
   * checks with the server that `ownerId` really is signed in.
   * @param {string} ownerId
   * @param {number[]} [ids]
   * @returns {Promise<CommandResult>}
   */
  adopt(ownerId, ids) {
    const message = { type: 'REBIND_RECORDS', ownerId };
    if (ids !== undefined) message.ids = ids;
    return this.send(message);
  }

  /**
   * Puts a needs-attention record back in the queue under a fresh idempotency key.
   * @param {number} id
   * @param {string} ownerId the record's owner, who must be signed in
   * @returns {Promise<CommandResult>}
   */
  retry(id, ownerId) {
    return this.send({ type: 'RECOVER_RECORD', id, ownerId, action: 'retry-new' });
  }

  /**
   * Deletes a needs-attention record for good.
   * @param {number} id
   * @param {string} ownerId the record's owner, who must be signed in
   * @returns {Promise<CommandResult>}
   */
  discard(id, ownerId) {
    return this.send({ type: 'RECOVER_RECORD', id, ownerId, action: 'discard' });
  }

  /** Deletes every record and the session: sign-out on a shared device. @returns {Promise<CommandResult>} */
  clearDevice() {
    return this.send({ type: 'CLEAR_DEVICE' });
  }

  /**
   * Opts `userId` (the signed-in account) in to delivery notifications: after a
   * background flush that sent or blocked queued changes while no page was open, the
   * worker shows one notification without user content. The browser's permission is
   * asked here, so call this from a user gesture (a click); the worker never asks.
   * @param {string} userId
   * @returns {Promise<CommandResult>} `ok:false` with the reason when permission is refused
   */
  async enableNotifications(userId) {
    const refused = (reason) => ({ type: 'COMMAND_RESULT', command: 'SET_NOTIFICATIONS', ok: false, reason });
    if (typeof Notification === 'undefined') return refused('this browser has no notifications');
    const permission = Notification.permission === 'granted'
      ? 'granted' : await Notification.requestPermission();
    if (permission !== 'granted') return refused(`notification permission is ${permission}`);
    return this.send({ type: 'SET_NOTIFICATIONS', userId, enabled: true });
  }

  /** Opts `userId` out of delivery notifications. @param {string} userId @returns {Promise<CommandResult>} */
  disableNotifications(userId) {
    return this.send({ type: 'SET_NOTIFICATIONS', userId, enabled: false });
  }

  /**
   * Sign-in (or signed-in page load) in one step: AUTH_SESSION, then FLUSH_QUEUE so work
   * queued earlier by this account goes out now (contract 7).
   * @param {string} userId
   * @returns {Promise<CommandResult>} the flush's answer, or the AUTH_SESSION answer if
   *   that was refused (then no flush is asked for)
   */
  async signedIn(userId) {
    const session = await this.authSession(userId);
    if (!session.ok) return session;
    return this.flush();
  }

  /**
   * Subscribes to worker messages of one type (a report type, or '*' for every message).
   * @param {string} type
   * @param {(message: object) => void} fn
   * @returns {() => void} unsubscribe
   */
  on(type, fn) {
    if (!this.listeners.has(type)) this.listeners.set(type, new Set());
    this.listeners.get(type).add(fn);
    return () => this.off(type, fn);
  }

  /** @param {string} type @param {Function} fn */
  off(type, fn) {
    this.listeners.get(type)?.delete(fn);
  }
}

/**
 * Resolves when `check()` holds, re-checking on the given events; rejects when it throws,
 * or after `timeoutMs` with `what()`.
 */
function waitUntil(check, targets, timeoutMs, what) {
  return new Promise((resolve, reject) => {
    const cleanups = [];
    const done = (fn, value) => {
      clearTimeout(timer);
      cleanups.forEach((c) => c());
      fn(value);
    };
    const test = () => {
      try { if (check()) done(resolve); } catch (err) { done(reject, err); }
    };
    const timer = setTimeout(() => done(reject, new Error(`outbox: ${what()} within ${timeoutMs} ms`)), timeoutMs);
    for (const [target, event] of targets) {
      target.addEventListener(event, test);
      cleanups.push(() => target.removeEventListener(event, test));
    }
    test();
  });
}

/**
 * Registers the outbox worker and resolves once this page is controlled by an
 * activated worker (`navigator.serviceWorker.ready` alone may resolve while the worker
 * is still activating, before it can answer). The worker claims its clients, so even a
 * first visit ends up controlled.
 *
 * @param {object} [options]
 * @param {string} [options.scriptUrl='/sw.js']
 * @param {string} [options.scope='/']
 * @param {number} [options.timeoutMs=10000] how long to wait for registration and control
 * @param {number} [options.commandTimeoutMs=60000] see {@link OutboxClient}
 * @returns {Promise<OutboxClient>}
 */
export async function registerOutbox({
  scriptUrl = '/sw.js', scope = '/', timeoutMs = 10000, commandTimeoutMs = 60000,
} = {}) {
  if (!('serviceWorker' in navigator)) {
    throw new Error('outbox: service workers are not available (insecure origin or unsupported browser)');
  }
  const container = navigator.serviceWorker;
  const client = new OutboxClient({ commandTimeoutMs });
  client.attach(); // before register, so no early report is missed

  try {
    const registration = await container.register(scriptUrl, { scope });
    const newest = () => registration.installing || registration.waiting || registration.active;
    // The worker object changes as an update progresses; follow the newest one's state.
    let watched = null;
    const stateTarget = new EventTarget();
    const follow = () => {
      const w = newest();
      if (w && w !== watched) {
        watched?.removeEventListener('statechange', relay);
        watched = w;
        w.addEventListener('statechange', relay);
      }
      stateTarget.dispatchEvent(new Event('change'));
    };
    const relay = () => stateTarget.dispatchEvent(new Event('change'));
    registration.addEventListener('updatefound', follow);
    follow();
    try {
      await waitUntil(
        () => {
          // A worker whose script throws or whose install fails goes straight to redundant.
          if (!newest() && watched?.state === 'redundant') {
            throw new Error(`outbox: the worker at ${scriptUrl} failed to install (see its console)`);
          }
          return registration.active?.state === 'activated' && container.controller !== null;
        },
        [[stateTarget, 'change'], [container, 'controllerchange']],
        timeoutMs,
        () => (registration.active?.state === 'activated'
          ? 'the page did not become controlled (hard reload?)'
          : `the worker did not activate (state: ${newest()?.state ?? 'none'})`),
      );
    } finally {
      registration.removeEventListener('updatefound', follow);
      watched?.removeEventListener('statechange', relay);
    }
    client.registration = registration;
  } catch (err) {
    client.detach();
    throw err;
  }

  // Only a window may ask; queued writes are exactly the data eviction must not take.
  client.persisted = navigator.storage?.persist
    ? navigator.storage.persist().catch(() => false)
    : Promise.resolve(false);
  return client;
}
