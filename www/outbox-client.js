/**
 * outbox-client.js — the page side of sw-outbox.
 *
 * A dependency-free ES module that registers the outbox service worker and speaks the
 * command protocol of the behaviour contract (docs: outbox-contract sections 5–7): every
 * command carries a unique `requestId` and its promise resolves with the worker's answer
 * carrying that id back. Registering never holds up a page: `registerOutbox` resolves at
 * once, and commands wait until the worker controls the page. It also follows the
 * worker's updates (a new version waiting, taking over), as a prompt-to-update flow
 * needs.
 *
 * Answers are resolved as they are, `ok:false` included: a refused command is an answer,
 * not a transport failure, so callers check `result.ok`. A promise rejects only when no
 * answer came (timeout) or no worker controls the page.
 *
 * Its JSDoc is the one source of its TypeScript declarations: the package's
 * `outbox-client.d.ts` is generated from it (`tsc --declaration --allowJs`, checked
 * with `checkJs`); the messages' types are `outbox-protocol.d.ts`'s. A new method is one
 * JSDoc'd method here.
 *
 * @example
 *   import { registerOutbox } from '/outbox-client.js';
 *   const outbox = await registerOutbox(); // at once: the first render does not wait
 *   outbox.on('MUTATIONS_BLOCKED', (m) => render(m.blocked));
 *   await outbox.signedIn('alice');        // waits until the worker controls the page
 */

/**
 * @import {
 *   Answer, Command, CommandResult, ListQueueCommand, QueueState, ReadRecordCommand,
 *   RecordAnswer, RecordId, Report, ReportType, WorkerMessage, BlockedRecord, Delivery,
 *   MutationSettled, QueueRecord,
 * } from './outbox-protocol.js'
 */


/**
 * Report types the worker broadcasts to every window of its scope (contract 5).
 * @type {readonly ReportType[]}
 */
export const REPORT_TYPES = Object.freeze([
  'MUTATIONS_BLOCKED', 'MUTATIONS_REPLAYED', 'MUTATIONS_PARTIAL', 'MUTATION_QUEUED',
  'SHOW_RECORD', 'MUTATION_SETTLED', 'AUTH_NEEDED',
]);

/** Answer types the worker sends only to the client that asked (contract 6). */
const ANSWER_TYPES = new Set(['COMMAND_RESULT', 'QUEUE_STATE', 'RECORD']);

/**
 * Commands that may run twice with the effect of once: sent again to a new controller
 * when the one they were sent to was replaced before answering (`onControllerChange`).
 * Not CLEAR_DEVICE (a second clear would discard writes queued after the first),
 * RECOVER_RECORD (a second edit or retry-new would re-key a record the first may have
 * handed to a flush already) nor REBIND_RECORDS (without ids, a second adoption would
 * also take records queued signed-out after the first).
 */
const RESENDABLE = new Set([
  'AUTH_SESSION', 'FLUSH_QUEUE', 'LIST_QUEUE', 'READ_RECORD', 'SET_NOTIFICATIONS', 'ABORT_WRITE',
]);

let requestCounter = 0;

/** A request id unique within this page and unlikely to collide with another tab's. */
/** The page's own retry backoff without Background Sync (see `keepRetrying`). */
const RETRY_FIRST_MS = 2000;
const RETRY_MAX_MS = 5 * 60 * 1000;

/** How long a new version must stay `installed` to count as waiting (see followUpdates). */
const WAITING_SETTLE_MS = 200;

/** How long a page that an activated worker did not take stays uncontrolled before
 * `controlled` says it will not be (the worker's claim reaches the page first). */
const NOT_CONTROLLED_GRACE_MS = 1000;

/** A fresh Idempotency-Key (a UUID v4 from the browser's cryptographic source). */
function newKey() {
  if (crypto.randomUUID) return crypto.randomUUID();
  const b = crypto.getRandomValues(new Uint8Array(16));
  b[6] = (b[6] & 0x0f) | 0x40;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = [...b].map((x) => x.toString(16).padStart(2, '0')).join('');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/**
 * What a fetch aborted by `signal` rejects with.
 * @param {AbortSignal} signal
 * @returns {unknown}
 */
function abortReason(signal) {
  return signal.reason ?? new DOMException('The operation was aborted.', 'AbortError');
}

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
   * @param {'never' | 'first-queued' | 'now'} [options.persist='never'] when to ask for
   *   persistent storage ({@link registerOutbox}); `'now'` is asked by `track`
   * @param {AuthorizationProvider} [options.getAuthorization] see {@link registerOutbox}
   */
  constructor({ commandTimeoutMs = 60000, persist = 'never', getAuthorization } = {}) {
    this.commandTimeoutMs = commandTimeoutMs;
    /**
     * A bearer app's token provider, asked on AUTH_NEEDED.
     * @private
     * @type {AuthorizationProvider | undefined}
     */
    this.getAuthorization = getAuthorization;
    /**
     * The answer to the AUTH_NEEDED being handled, by account: one provider call at a
     * time per account, however many reports ask.
     * @private
     * @type {Map<string, Promise<void>>}
     */
    this.authorizing = new Map();
    /**
     * Commands waiting for their answer, by requestId, in the order they were sent,
     * with what `onControllerChange` needs to send one again.
     * @private
     * @type {Map<string, {resolve: (answer: Answer) => void, reject: (err: Error) => void, timer: ReturnType<typeof setTimeout>, message: {type?: unknown, requestId: unknown}, timeoutMs: number}>}
     */
    this.pending = new Map();
    /**
     * @private
     * @type {Map<string, Set<Function>>}
     */
    this.listeners = new Map();
    /**
     * The outbox's state for a UI ({@link OutboxClient.state}), fed by every report and
     * by the answers to this client's commands.
     * @private
     */
    this.store = new OutboxStore({ relist: () => this.relist() });
    /**
     * A LIST_QUEUE of the store's under way, and whether another is wanted after it.
     * @private
     * @type {{again: boolean} | null}
     */
    this.relisting = null;
    /** @private */
    this.onMessage = this.onMessage.bind(this);
    this.subscribe = this.subscribe.bind(this);
    /** @private */
    this.onControllerChange = this.onControllerChange.bind(this);
    /** @private */
    this.onOnline = () => { this.flush().catch(() => {}); };
    /**
     * @private
     * @type {ReturnType<typeof setTimeout> | null} the page's own retry timer where the
     *   browser has no Background Sync (`keepRetrying`)
     */
    this.retryTimer = null;
    /** @private */
    this.retryDelayMs = RETRY_FIRST_MS;
    /**
     * The worker's registration, once the browser registered it ({@link registerOutbox}).
     * @type {ServiceWorkerRegistration | undefined}
     */
    this.registration = undefined;
    /**
     * Resolves with the registration ({@link registerOutbox}); rejects when the browser
     * refused it (a script that failed to load or evaluate, a bad scope).
     * @type {Promise<ServiceWorkerRegistration> | undefined}
     */
    this.registered = undefined;
    /**
     * Resolves once an activated outbox worker controls this page; rejects, with the
     * reason, when it will not: the worker failed to install, the page was loaded
     * bypassing service workers (Shift+Reload; a normal reload brings it back), it lies
     * outside the worker's scope, or no worker took it within `timeoutMs`. Commands wait
     * for it ({@link registerOutbox}).
     * @type {Promise<void> | undefined}
     */
    this.controlled = undefined;
    /**
     * Whether persistent storage was granted, once asked ({@link OutboxClient.persist}).
     * @type {Promise<boolean> | undefined}
     */
    this.persisted = undefined;
    /**
     * When to ask for persistent storage on the page's behalf: on the first write queued
     * (`MUTATION_QUEUED`) with `'first-queued'`.
     * @private
     * @type {'never' | 'first-queued' | 'now'}
     */
    this.persistWhen = persist;
    /**
     * Listeners of the update lifecycle.
     * @private
     * @type {{waiting: Set<(worker: ServiceWorker) => void>, controlling: Set<(event: {isUpdate: boolean}) => void>}}
     */
    this.lifecycle = { waiting: new Set(), controlling: new Set() };
    /**
     * The new version that installed and waits to take over, once seen.
     * @private
     * @type {ServiceWorker | null}
     */
    this.waitingWorker = null;
    /**
     * Whether a worker controlled this page before the latest controller change.
     * @private
     */
    this.wasControlled = typeof navigator !== 'undefined' && Boolean(navigator.serviceWorker?.controller);
  }

  /**
   * Follows the outbox worker's registration (registerOutbox calls it with its
   * `navigator.serviceWorker.register(…)`): sets {@link OutboxClient.registered} and
   * {@link OutboxClient.controlled}, and watches for new versions.
   * @param {Promise<ServiceWorkerRegistration>} registering
   * @param {{scriptUrl?: string, timeoutMs?: number}} [options]
   */
  track(registering, { scriptUrl = '/sw.js', timeoutMs = 60000 } = {}) {
    this.registered = registering.then((registration) => {
      this.registration = registration;
      this.store.backgroundAvailable('sync' in registration);
      this.followUpdates(registration);
      return registration;
    });
    this.controlled = this.registered.then((registration) => controlOf(registration, scriptUrl, timeoutMs));
    // The store reads the queue once the worker can answer (and after each takeover).
    this.controlled.then(() => this.relist(), () => {});
    // A refusal is an answer for whoever waits for it (every command does), not an
    // unhandled rejection of the page.
    this.registered.catch(() => {});
    this.controlled.catch(() => {});
    if (this.persistWhen === 'now') this.persist();
  }

  /** Starts listening; called by registerOutbox before the worker can send anything. */
  attach() {
    navigator.serviceWorker.addEventListener('message', this.onMessage);
    navigator.serviceWorker.addEventListener('controllerchange', this.onControllerChange);
    // Messages to a page are held until the page opts in; addEventListener alone does not.
    navigator.serviceWorker.startMessages?.();
    // Chromium fires no `online` event in workers, so the page triggers the replay (contract 4).
    window.addEventListener('online', this.onOnline);
  }

  /** Stops listening and rejects every pending command. */
  detach() {
    navigator.serviceWorker.removeEventListener('message', this.onMessage);
    navigator.serviceWorker.removeEventListener('controllerchange', this.onControllerChange);
    window.removeEventListener('online', this.onOnline);
    for (const [id, p] of this.pending) {
      clearTimeout(p.timer);
      p.reject(new Error(`outbox: client detached before the answer to ${id}`));
    }
    this.pending.clear();
  }

  /**
   * @private
   * @param {MessageEvent} event
   */
  onMessage(event) {
    const data = event.data;
    if (!data || typeof data !== 'object' || typeof data.type !== 'string') return;
    this.keepRetrying(data.type);
    if (data.type === 'AUTH_NEEDED' && typeof data.userId === 'string') this.authorize(data.userId);
    if (data.type === 'MUTATION_QUEUED' && this.persistWhen === 'first-queued') this.persist();
    if (!ANSWER_TYPES.has(data.type)) this.store.onMessage(data);
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
   * @overload
   * @param {ListQueueCommand} message
   * @param {{timeoutMs?: number}} [options]
   * @returns {Promise<QueueState>}
   */
  /**
   * @overload
   * @param {ReadRecordCommand} message
   * @param {{timeoutMs?: number}} [options]
   * @returns {Promise<RecordAnswer | CommandResult>}
   */
  /**
   * @overload
   * @param {Exclude<Command, ListQueueCommand | ReadRecordCommand>} message
   * @param {{timeoutMs?: number}} [options]
   * @returns {Promise<CommandResult>}
   */
  /**
   * Malformed or future messages: answered by a refusal.
   * @overload
   * @param {{type?: unknown, [field: string]: unknown}} message
   * @param {{timeoutMs?: number}} [options]
   * @returns {Promise<Answer>}
   */
  /**
   * @param {{type?: unknown, requestId?: unknown}} message a command of contract 6;
   *   `requestId` is added when absent
   * @param {{timeoutMs?: number}} [options]
   * @returns {Promise<Answer>}
   */
  send(message, { timeoutMs = this.commandTimeoutMs } = {}) {
    const controller = navigator.serviceWorker.controller;
    if (controller) return this.post(controller, message, timeoutMs);
    if (!this.controlled) {
      return Promise.reject(new Error(
        'outbox: this page is not controlled by the outbox worker (register it with registerOutbox)'));
    }
    // Not yet controlled (the worker is still installing): the command waits for it.
    return this.controlled.then(() => {
      const now = navigator.serviceWorker.controller;
      if (!now) throw new Error('outbox: this page is no longer controlled by the outbox worker');
      return this.post(now, message, timeoutMs);
    });
  }

  /**
   * Posts `message` to `controller` with a `requestId` and waits for the answer.
   * @private
   * @param {ServiceWorker} controller
   * @param {{type?: unknown, requestId?: unknown}} message
   * @param {number} timeoutMs
   * @returns {Promise<Answer>}
   */
  post(controller, message, timeoutMs) {
    const requestId = message.requestId ?? nextRequestId();
    const sent = { ...message, requestId };
    const mark = this.store.mark();
    return new Promise((settle, reject) => {
      /** @param {Answer} answer */
      const resolve = (answer) => {
        this.store.onAnswer(sent, answer, mark);
        settle(answer);
      };
      const timer = this.answerTimer(sent, timeoutMs, reject);
      this.pending.set(String(requestId), { resolve, reject, timer, message: sent, timeoutMs });
      controller.postMessage(sent);
    });
  }

  /**
   * The timer that rejects `sent` when no answer came within `timeoutMs`.
   * @private
   * @param {{type?: unknown, requestId: unknown}} sent
   * @param {number} timeoutMs
   * @param {(err: Error) => void} reject
   * @returns {ReturnType<typeof setTimeout>}
   */
  answerTimer(sent, timeoutMs, reject) {
    return setTimeout(() => {
      this.pending.delete(String(sent.requestId));
      reject(new Error(`outbox: no answer to ${sent.type} (requestId ${sent.requestId}) within ${timeoutMs} ms`));
    }, timeoutMs);
  }

  /**
   * A new version of the worker took over this page. A command sent to the version it
   * replaced may never be answered: WebKit drops a message still on its way to a worker
   * when a new version activates and the old one is stopped (seen in the chaos run: a
   * FLUSH_QUEUE sent 5 ms before the activation reached neither worker, and the page
   * waited out its timeout). Commands that may run twice ({@link RESENDABLE}) are sent
   * again to the new controller, in the order they were first sent and under the same
   * requestId, with a fresh timeout; the first answer settles the promise and a later
   * one is ignored. The others keep waiting for their answer or their timeout.
   * @private
   */
  onControllerChange() {
    const controller = navigator.serviceWorker.controller;
    const isUpdate = this.wasControlled;
    this.wasControlled = Boolean(controller);
    if (!controller) return;
    if (controller === this.waitingWorker) this.waitingWorker = null;
    for (const fn of [...this.lifecycle.controlling]) {
      try { fn({ isUpdate }); } catch (err) { console.error('outbox: listener failed', err); }
    }
    for (const p of this.pending.values()) {
      if (!RESENDABLE.has(/** @type {string} */ (p.message.type))) continue;
      clearTimeout(p.timer);
      p.timer = this.answerTimer(p.message, p.timeoutMs, p.reject);
      controller.postMessage(p.message);
    }
    // A new version may have started from another view of the queue (an update).
    this.relist();
  }

  /**
   * What a UI shows of the outbox, kept current from the worker's reports and the
   * answers to this client's commands, never by polling: the signed-in account's pending
   * writes, the blocked ones with their reasons, the delivery status, the settled results
   * and whether delivery can happen with no page open. A new frozen object per change
   * (React: `useSyncExternalStore(outbox.subscribe, () => outbox.state)`, or the
   * `useOutbox` hook of `sw-outbox/react`).
   * @returns {OutboxState}
   */
  get state() {
    return this.store.state;
  }

  /**
   * Calls `listener` with the new {@link OutboxClient.state} after every change. Bound:
   * `outbox.subscribe` can be passed on as it is.
   * @param {OutboxListener} listener
   * @returns {() => void} unsubscribe
   */
  subscribe(listener) {
    return this.store.subscribe(listener);
  }

  /**
   * The server's answer to a queued write, once it is replayed: resolves with its
   * MUTATION_SETTLED (status, and the body when it is text or JSON: the created entity),
   * at once when it already came; rejects (`WriteNotSettledError`) when the write leaves
   * the outbox otherwise (cancelled, or the device cleared). A write that needs attention
   * keeps it waiting. Use it to hold a mutation pending until the server applied it.
   * @param {RecordId} id the `id` of the write's 202 answer
   * @returns {Promise<SettledWrite>}
   */
  settlement(id) {
    return this.store.settlement(id);
  }

  /**
   * One LIST_QUEUE for the store at a time; asked again during one, it runs once more.
   * @private
   */
  relist() {
    if (this.relisting) {
      this.relisting.again = true;
      return;
    }
    const run = { again: false };
    this.relisting = run;
    this.list().catch(() => {}).finally(() => {
      this.relisting = null;
      if (run.again) this.relist();
    });
  }

  /**
   * Where the browser has no Background Sync (Firefox, Safari) and the user stays on the
   * page, a queued write is retried without waiting for a reload: the worker retries
   * while it lives, and the page asks again on a backoff of its own (2 s doubling to
   * 5 min, back to 2 s once the queue drained), since a browser stops an idle worker.
   * @param {string} type the report just received
   */
  keepRetrying(type) {
    if (!this.registration || 'sync' in this.registration) return;
    if (type === 'MUTATIONS_REPLAYED') {
      if (this.retryTimer) clearTimeout(this.retryTimer);
      this.retryTimer = null;
      this.retryDelayMs = RETRY_FIRST_MS;
      return;
    }
    if (type !== 'MUTATION_QUEUED' && type !== 'MUTATIONS_PARTIAL') return;
    if (this.retryTimer) return;
    this.retryTimer = setTimeout(() => {
      this.retryTimer = null;
      this.retryDelayMs = Math.min(this.retryDelayMs * 2, RETRY_MAX_MS);
      this.flush().catch(() => {});
    }, this.retryDelayMs);
  }

  /**
   * A write through the outbox that honours `init.signal` (contract 2.8): the page's
   * abort reaches the worker even where the browser does not forward the signal
   * (Chromium). It sets an `Idempotency-Key` when the write has none. When the signal
   * aborts before the worker stored the write, the worker aborts its attempt and
   * queues nothing, and this rejects with the signal's reason; when the write was
   * already stored (or answered), it resolves with that answer (a 202 means it is
   * queued and will be delivered).
   * @param {RequestInfo | URL} input
   * @param {RequestInit} [init]
   * @returns {Promise<Response>}
   */
  async fetch(input, init = {}) {
    const { signal, ...rest } = init;
    const headers = new Headers(rest.headers ?? (input instanceof Request ? input.headers : undefined));
    if (!headers.has('Idempotency-Key')) headers.set('Idempotency-Key', newKey());
    const idempotencyKey = /** @type {string} */ (headers.get('Idempotency-Key'));
    if (signal?.aborted) throw abortReason(signal);
    const answer = fetch(input, { ...rest, headers });
    if (!signal) return answer;
    return new Promise((resolve, reject) => {
      let settled = false;
      const onAbort = async () => {
        const r = await this.send({ type: 'ABORT_WRITE', idempotencyKey }).catch(() => null);
        if (r?.ok && (r.affected ?? 0) > 0 && !settled) {
          settled = true;
          answer.catch(() => {}); // the worker answers an aborted write with a network error
          reject(abortReason(signal));
        }
      };
      signal.addEventListener('abort', onAbort, { once: true });
      answer.then(
        (response) => { if (!settled) { settled = true; resolve(response); } },
        (err) => { if (!settled) { settled = true; reject(signal.aborted ? abortReason(signal) : err); } },
      ).finally(() => signal.removeEventListener('abort', onAbort));
    });
  }

  /**
   * Aborts the first attempt of the write with this key, if it is still in flight
   * (ABORT_WRITE); `affected` 0 when it was already stored, answered, or is unknown.
   * @param {string} idempotencyKey
   * @returns {Promise<CommandResult>}
   */
  abortWrite(idempotencyKey) {
    return this.send({ type: 'ABORT_WRITE', idempotencyKey });
  }

  /**
   * The worker asked for a credential of `userId` (AUTH_NEEDED: the server refused the
   * one it had, or a restarted worker holds none): the `getAuthorization` option is
   * called, and what it resolves with is sent as AUTH_SESSION's `authorization`, after
   * which the worker resumes delivery. Nothing is sent when there is no provider, or it
   * resolves with nothing (the person must sign in again), or throws. One call at a
   * time per account.
   * @private
   * @param {string} userId
   */
  authorize(userId) {
    const provider = this.getAuthorization;
    if (!provider || this.authorizing.has(userId)) return;
    const done = (async () => {
      const authorization = await provider(userId);
      if (typeof authorization !== 'string' || !authorization) return;
      await this.send({ type: 'AUTH_SESSION', userId, authorization });
    })().catch((err) => console.warn('outbox: getAuthorization failed', err))
      .finally(() => this.authorizing.delete(userId));
    this.authorizing.set(userId, done);
  }

  /**
   * Tells the worker who is signed in (null: nobody). Later writes are bound to it. An
   * app that authenticates with a token instead of a cookie passes it as
   * `authorization` (`'Bearer …'`): the worker's identity checks and that account's
   * replays carry it (it is never stored with a queued write), until the next
   * AUTH_SESSION replaces it or a sign-out deletes it.
   * @param {string|null} userId
   * @param {string} [authorization] the `Authorization` header value of `userId`'s session
   * @returns {Promise<CommandResult>}
   */
  authSession(userId, authorization) {
    /** @type {import('./outbox-protocol.js').AuthSessionCommand} */
    const message = { type: 'AUTH_SESSION', userId: userId ?? null };
    if (authorization !== undefined) message.authorization = authorization;
    return this.send(message);
  }

  /**
   * Runs a flush; resolves after it with `affected` = records replayed.
   * @returns {Promise<CommandResult>}
   */
  flush() {
    return this.send({ type: 'FLUSH_QUEUE' });
  }

  /**
   * Every record's metadata, bodies excluded.
   * @returns {Promise<QueueState>}
   */
  list() {
    return this.send({ type: 'LIST_QUEUE' });
  }

  /**
   * Adopts unknown-owner records (all, or the given ids) for `ownerId`; the worker
   * checks with the server that `ownerId` really is signed in.
   * @param {string} ownerId
   * @param {RecordId[]} [ids]
   * @returns {Promise<CommandResult>}
   */
  adopt(ownerId, ids) {
    /** @type {import('./outbox-protocol.js').RebindRecordsCommand} */
    const message = { type: 'REBIND_RECORDS', ownerId };
    if (ids !== undefined) message.ids = ids;
    return this.send(message);
  }

  /**
   * Puts a needs-attention record back in the queue under a fresh idempotency key.
   * @param {RecordId} id
   * @param {string} ownerId the record's owner, who must be signed in
   * @returns {Promise<CommandResult>}
   */
  retry(id, ownerId) {
    return this.send({ type: 'RECOVER_RECORD', id, ownerId, action: 'retry-new' });
  }

  /**
   * A record of `ownerId`, with its body (as text when its Content-Type is textual, else
   * base64), after the worker checked with the server that `ownerId` is signed in: a
   * `RECORD` answer, or a refusal (another account's, corrupt, gone, not confirmed).
   * @param {RecordId} id
   * @param {string} ownerId the record's owner, who must be signed in
   * @returns {Promise<RecordAnswer | CommandResult>}
   */
  read(id, ownerId) {
    return this.send({ type: 'READ_RECORD', id, ownerId });
  }

  /**
   * Replaces a queued or needs-attention record's body and sends it again under a fresh
   * key, in its place among the writes of its workspace (RECOVER_RECORD `edit`).
   * @param {RecordId} id
   * @param {string} ownerId the record's owner, who must be signed in
   * @param {string} body the new body: text, or base64 with `bodyEncoding: 'base64'`
   * @param {{contentType?: string, bodyEncoding?: 'text' | 'base64'}} [options]
   * @returns {Promise<CommandResult>}
   */
  edit(id, ownerId, body, { contentType, bodyEncoding } = {}) {
    return this.send({
      type: 'RECOVER_RECORD', id, ownerId, action: 'edit', body,
      ...(contentType === undefined ? {} : { contentType }),
      ...(bodyEncoding === undefined ? {} : { bodyEncoding }),
    });
  }

  /**
   * Deletes a needs-attention record for good.
   * @param {RecordId} id
   * @param {string} ownerId the record's owner, who must be signed in
   * @returns {Promise<CommandResult>}
   */
  discard(id, ownerId) {
    return this.send({ type: 'RECOVER_RECORD', id, ownerId, action: 'discard' });
  }

  /**
   * Deletes every record and the session: sign-out on a shared device.
   * @returns {Promise<CommandResult>}
   */
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
    /** @type {(reason: string) => CommandResult} */
    const refused = (reason) => ({ type: 'COMMAND_RESULT', command: 'SET_NOTIFICATIONS', ok: false, reason });
    if (typeof Notification === 'undefined') return refused('this browser has no notifications');
    const permission = Notification.permission === 'granted'
      ? 'granted' : await Notification.requestPermission();
    if (permission !== 'granted') return refused(`notification permission is ${permission}`);
    return this.send({ type: 'SET_NOTIFICATIONS', userId, enabled: true });
  }

  /**
   * Opts `userId` out of delivery notifications.
   * @param {string} userId
   * @returns {Promise<CommandResult>}
   */
  disableNotifications(userId) {
    return this.send({ type: 'SET_NOTIFICATIONS', userId, enabled: false });
  }

  /**
   * Sign-in (or signed-in page load) in one step: AUTH_SESSION, then FLUSH_QUEUE so work
   * queued earlier by this account goes out now (contract 7).
   * @param {string} userId
   * @param {string} [authorization] a bearer app's `Authorization` value (see
   *   {@link OutboxClient.authSession})
   * @returns {Promise<CommandResult>} the flush's answer, or the AUTH_SESSION answer if
   *   that was refused (then no flush is asked for)
   */
  async signedIn(userId, authorization) {
    const session = await this.authSession(userId, authorization);
    if (!session.ok) return session;
    return this.flush();
  }

  /**
   * Asks the browser to keep this origin's storage (`navigator.storage.persist()`), once:
   * queued writes are exactly the data an eviction must not take. Firefox asks the person
   * with a prompt, so ask when the site decides to (from a click, or on the first write
   * queued: registerOutbox's `persist: 'first-queued'`), not on page load. Only a window
   * can ask; the worker never does.
   * @returns {Promise<boolean>} whether storage is persistent
   */
  persist() {
    this.persisted ??= navigator.storage?.persist
      ? navigator.storage.persist().catch(() => false)
      : Promise.resolve(false);
    return this.persisted;
  }

  /**
   * A new version of the worker installed and waits to take over: with `skipWaiting:
   * false` in its configuration it waits until {@link OutboxClient.applyUpdate} (a
   * prompt-to-update flow), otherwise until the old version is idle. `fn` gets the
   * waiting worker; when one waits already it is called at once (in a microtask).
   * @param {(worker: ServiceWorker) => void} fn
   * @returns {() => void} unsubscribe
   */
  onUpdateWaiting(fn) {
    this.lifecycle.waiting.add(fn);
    const waiting = this.waitingWorker;
    if (waiting) queueMicrotask(() => { if (this.lifecycle.waiting.has(fn) && this.waitingWorker === waiting) fn(waiting); });
    return () => { this.lifecycle.waiting.delete(fn); };
  }

  /**
   * A worker took control of this page: `isUpdate` when another version controlled it
   * before (a site reloads then, so that the page runs with the version now serving it).
   * @param {(event: {isUpdate: boolean}) => void} fn
   * @returns {() => void} unsubscribe
   */
  onControlling(fn) {
    this.lifecycle.controlling.add(fn);
    return () => { this.lifecycle.controlling.delete(fn); };
  }

  /**
   * The new version that installed and waits to take over, or null.
   * @returns {ServiceWorker | null}
   */
  get waiting() {
    return this.waitingWorker;
  }

  /**
   * Tells the waiting version to take over (`{"type":"SKIP_WAITING"}`, as workbox-window
   * and vite-plugin-pwa send it) and resolves once it is activated and controls this
   * page: true; false at once when no version waits. It rejects when the waiting version is discarded or does
   * not take over within `timeoutMs`.
   * @param {{timeoutMs?: number}} [options]
   * @returns {Promise<boolean>}
   */
  async applyUpdate({ timeoutMs = this.commandTimeoutMs } = {}) {
    const worker = this.registration?.waiting;
    if (!worker) return false;
    const container = navigator.serviceWorker;
    const took = waitUntil(
      () => {
        if (worker.state === 'redundant') throw new Error('outbox: the waiting version was discarded');
        return container.controller === worker && worker.state === 'activated';
      },
      [[container, 'controllerchange'], [worker, 'statechange']],
      timeoutMs,
      () => `the waiting version did not take over (state: ${worker.state})`,
    );
    worker.postMessage({ type: 'SKIP_WAITING' });
    await took;
    return true;
  }

  /**
   * Asks the browser to look for a new version of the worker now (it also does on
   * navigations); a new version then installs, and waits or takes over.
   * @returns {Promise<void>}
   */
  async update() {
    if (!this.registered) throw new Error('outbox: no registration (register it with registerOutbox)');
    await (await this.registered).update();
  }

  /**
   * Follows the registration's new versions, to tell {@link OutboxClient.onUpdateWaiting}'s
   * listeners about one that waits. A version that takes over by itself passes through
   * `installed` too, for a moment: it counts as waiting only when it is still there
   * {@link WAITING_SETTLE_MS} later (as workbox-window does).
   * @private
   * @param {ServiceWorkerRegistration} registration
   */
  followUpdates(registration) {
    const container = navigator.serviceWorker;
    /** @param {ServiceWorker} worker */
    const announce = (worker) => {
      // A waiting worker with no controller is a first install finishing, not an update.
      if (registration.waiting !== worker || !container.controller || this.waitingWorker === worker) return;
      this.waitingWorker = worker;
      worker.addEventListener('statechange', () => {
        if (worker.state !== 'installed' && this.waitingWorker === worker) this.waitingWorker = null;
      });
      for (const fn of [...this.lifecycle.waiting]) {
        try { fn(worker); } catch (err) { console.error('outbox: listener failed', err); }
      }
    };
    /** @param {ServiceWorker | null} worker */
    const follow = (worker) => {
      if (!worker) return;
      const check = () => {
        if (worker.state === 'installed') setTimeout(() => announce(worker), WAITING_SETTLE_MS);
      };
      worker.addEventListener('statechange', check);
      check();
    };
    registration.addEventListener('updatefound', () => follow(registration.installing));
    follow(registration.installing);
    follow(registration.waiting);
  }

  /**
   * Subscribes to worker messages of one type (a report type, or '*' for every message).
   * @template {ReportType} T
   * @overload
   * @param {T} type
   * @param {(message: Extract<Report, {type: T}>) => void} fn
   * @returns {() => void} unsubscribe
   */
  /**
   * @overload
   * @param {'*'} type
   * @param {(message: WorkerMessage) => void} fn
   * @returns {() => void} unsubscribe
   */
  /**
   * @param {string} type
   * @param {(message: any) => void} fn
   * @returns {() => void} unsubscribe
   */
  on(type, fn) {
    let listeners = this.listeners.get(type);
    if (!listeners) this.listeners.set(type, listeners = new Set());
    listeners.add(fn);
    return () => this.off(/** @type {ReportType} */ (type), fn);
  }

  /**
   * Removes a listener added with {@link OutboxClient.on}.
   * @param {ReportType | '*'} type
   * @param {(message: never) => void} fn
   */
  off(type, fn) {
    this.listeners.get(type)?.delete(fn);
  }
}

/**
 * A bearer app's token provider: resolves with the `Authorization` header value of
 * `userId`'s session (`'Bearer …'`, refreshed if it must be), or with null when it
 * cannot (the person must sign in again).
 * @callback AuthorizationProvider
 * @param {string} userId the account the worker asks a credential for
 * @returns {Promise<string | null | undefined> | string | null | undefined}
 */

/**
 * Resolves when `check()` holds, re-checking on the given events; rejects when it throws,
 * or after `timeoutMs` with `what()`.
 * @param {() => boolean} check
 * @param {[EventTarget, string][]} targets
 * @param {number} timeoutMs
 * @param {() => string} what
 * @returns {Promise<void>}
 */
function waitUntil(check, targets, timeoutMs, what) {
  return new Promise((resolve, reject) => {
    /** @type {(() => void)[]} */
    const cleanups = [];
    /** @type {(fn: (value?: any) => void, value?: unknown) => void} */
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
 * Registers the outbox worker and resolves at once with its handle, so a page's first
 * render never waits for the worker's install (its precache can be a whole build).
 * Commands sent through the handle wait until an activated worker controls the page
 * (`client.controlled`); when the page will not be controlled (Shift+Reload, outside the
 * scope, an install that failed) they reject with that reason. The worker claims its
 * clients, so even a first visit ends up controlled.
 *
 * Persistent storage is asked for only when the site says so (`persist`), since Firefox
 * asks the person with a prompt.
 *
 * @param {object} [options]
 * @param {string} [options.scriptUrl='/sw.js']
 * @param {string} [options.scope='/']
 * @param {WorkerType} [options.type='classic'] `'module'` for a worker script that is an
 *   ES module (it imports `sw-outbox/worker`), e.g. SvelteKit's under `vite dev`
 * @param {number} [options.timeoutMs=60000] how long `controlled` (and a command sent
 *   before it) waits for the worker to install, activate and take the page
 * @param {number} [options.commandTimeoutMs=60000] see {@link OutboxClient}
 * @param {'never' | 'first-queued' | 'now'} [options.persist='never'] when to ask for
 *   persistent storage: never (the site calls `client.persist()` itself, e.g. from a
 *   click), on the first write the worker queues, or now
 * @param {AuthorizationProvider} [options.getAuthorization] for an app that authenticates
 *   with a token instead of a cookie: called when the worker asks for a credential
 *   (AUTH_NEEDED: the server answered 401 to the one it had, or a restarted worker holds
 *   none), e.g. `async (userId) => 'Bearer ' + (await refreshToken()).accessToken`; its
 *   result is sent as AUTH_SESSION's `authorization`, and delivery resumes. Give the
 *   token at sign-in too: `signedIn(userId, 'Bearer …')`.
 * @returns {Promise<OutboxClient>}
 */
export async function registerOutbox({
  scriptUrl = '/sw.js', scope = '/', type = 'classic', timeoutMs = 60000, commandTimeoutMs = 60000, persist = 'never',
  getAuthorization,
} = {}) {
  if (!('serviceWorker' in navigator)) {
    throw new Error('outbox: service workers are not available (insecure origin or unsupported browser)');
  }
  if (!['never', 'first-queued', 'now'].includes(persist)) {
    throw new Error(`outbox: persist must be 'never', 'first-queued' or 'now', not ${JSON.stringify(persist)}`);
  }
  const client = new OutboxClient({ commandTimeoutMs, persist, getAuthorization });
  client.attach(); // before register, so no early report is missed
  client.track(navigator.serviceWorker.register(scriptUrl, { scope, type }), { scriptUrl, timeoutMs });
  return client;
}

/**
 * Resolves once a worker controls this page (`navigator.serviceWorker.ready` alone may
 * resolve before any does); rejects when the install failed, when the worker is active
 * and the page stays uncontrolled (Shift+Reload, outside the scope), or after
 * `timeoutMs`.
 * @param {ServiceWorkerRegistration} registration
 * @param {string} scriptUrl
 * @param {number} timeoutMs
 * @returns {Promise<void>}
 */
function controlOf(registration, scriptUrl, timeoutMs) {
  const container = navigator.serviceWorker;
  const newest = () => registration.installing || registration.waiting || registration.active;
  // The worker object changes as an update progresses; follow the newest one's state.
  /** @type {ServiceWorker | null} */
  let watched = null;
  const stateTarget = new EventTarget();
  const relay = () => stateTarget.dispatchEvent(new Event('change'));
  const follow = () => {
    const w = newest();
    if (w && w !== watched) {
      watched?.removeEventListener('statechange', relay);
      watched = w;
      w.addEventListener('statechange', relay);
    }
    relay();
  };
  registration.addEventListener('updatefound', follow);
  follow();
  let graceOver = false;
  /** @type {ReturnType<typeof setTimeout> | null} */
  let grace = null;
  return waitUntil(
    () => {
      // A worker whose script throws or whose install fails goes straight to redundant.
      if (!newest() && watched?.state === 'redundant') {
        throw new Error(`outbox: the worker at ${scriptUrl} failed to install (see its console)`);
      }
      // Controlled by a worker that is activated, or activating: WebKit never tells a page
      // loaded while its controller was activating that it became activated (its
      // ServiceWorker objects stay `activating`; a document opened later sees
      // `activated`), and an activating worker answers messages already.
      const state = container.controller?.state;
      if (state === 'activated' || state === 'activating') return true;
      const active = registration.active?.state === 'activated';
      // Active, and nothing installing that would claim this page: its claim came first,
      // so an uncontrolled page stays so (give the claim a moment all the same).
      if (active && !registration.installing) {
        if (graceOver) {
          throw new Error('outbox: this page is not controlled by the outbox worker: it was loaded '
            + 'bypassing service workers (Shift+Reload: a normal reload brings it back) or lies outside '
            + 'the worker\'s scope');
        }
        grace ??= setTimeout(() => { graceOver = true; relay(); }, NOT_CONTROLLED_GRACE_MS);
      }
      return false;
    },
    [[stateTarget, 'change'], [container, 'controllerchange']],
    timeoutMs,
    () => (registration.active?.state === 'activated'
      ? 'the page did not become controlled'
      : `the worker did not activate (state: ${newest()?.state ?? 'none'})`),
  ).finally(() => {
    if (grace) clearTimeout(grace);
    registration.removeEventListener('updatefound', follow);
    // (`follow` assigns it; the cast keeps TypeScript from narrowing it to null here.)
    /** @type {ServiceWorker | null} */ (watched)?.removeEventListener('statechange', relay);
  });
}

// ---------------------------------------------------------------- the state a UI shows
//
// What a page's UI needs to know about the outbox, in one store (`outbox.state`,
// `outbox.subscribe`). The client feeds it every report the worker broadcasts and the
// answers to its own commands; it keeps one immutable snapshot (a new frozen object per
// change, so React's `useSyncExternalStore` and any `===` check see a change) and calls
// its subscribers. It never polls: the queue is read (LIST_QUEUE, through `relist`) when
// the worker first controls the page, after a controller change, after a change of
// account, and when a report says something the reports before it cannot explain (a
// flush that left a different number of records than the page knows of: another
// window's writes, another account's settlements). It uses no browser API. It lives in
// this file so that a site without a bundler still copies one file.

/**
 * What a UI shows of the outbox (`outbox.state`). Every array and object is frozen and
 * replaced, never changed in place.
 * @typedef {object} OutboxState
 * @property {boolean} ready whether the queue has been read once (before: the lists are
 *   what this page saw queued since it loaded)
 * @property {string | null} account whose writes `pending` lists: the account this page
 *   last gave the worker (`signedIn` / `authSession`), or, until it gives one, the
 *   account of the session the worker holds (persisted from an earlier page's
 *   `AUTH_SESSION`), so a page reloaded offline, which cannot ask the server who is
 *   signed in, still shows that account's pending writes; null: nobody, or not known yet
 * @property {'page' | 'worker' | null} accountFrom where `account` comes from: `'page'`
 *   once this page said who is signed in (sign-out included), `'worker'` while it shows
 *   the worker's session (a UI may say "offline: last signed in as …"), null before
 *   either
 * @property {readonly QueueRecord[]} records every write in the outbox, in queue order
 *   (another account's without method, path or workspace: contract 5)
 * @property {readonly QueueRecord[]} pending the writes of `account` still in the
 *   outbox (waiting, or needing attention), in queue order
 * @property {readonly BlockedRecord[]} blocked the writes the last flush did not send,
 *   each with its reason (MUTATIONS_BLOCKED)
 * @property {Delivery} delivery how delivery stands: why the last flush stopped
 *   (`stoppedBy`), when the worker tries again on its own (`retryAt`), when a flush last
 *   ran (`lastAttemptAt`, as this page heard of it)
 * @property {boolean | null} background whether a queued write can be delivered while no
 *   page of the site is open (Background Sync): the last MUTATION_QUEUED's or 202's
 *   `background`; before any, whether the browser has Background Sync; null: not known
 * @property {readonly SettledWrite[]} settled what the server answered the writes
 *   replayed since the page loaded (MUTATION_SETTLED), oldest first, the last
 *   {@link SETTLED_KEPT}
 */

/**
 * A replayed write the server answered 2xx (MUTATION_SETTLED), with when the page heard.
 * @typedef {MutationSettled & {settledAt: number}} SettledWrite
 */

/**
 * A listener of the store: called after each change with the new state.
 * @callback OutboxListener
 * @param {OutboxState} state
 * @returns {void}
 */

/** How many settled results the state keeps (the oldest go first). */
export const SETTLED_KEPT = 50;

/** @type {Delivery} */
const NO_DELIVERY = Object.freeze({ stoppedBy: null, retryAt: null, lastAttemptAt: null });

/** @type {OutboxState} */
export const INITIAL_STATE = Object.freeze({
  ready: false,
  account: null,
  accountFrom: null,
  records: Object.freeze([]),
  pending: Object.freeze([]),
  blocked: Object.freeze([]),
  delivery: NO_DELIVERY,
  background: null,
  settled: Object.freeze([]),
});

/**
 * Why a settlement promise ({@link OutboxStore.settlement}) gave up: the write left the
 * outbox without an answer this page heard of (cancelled, cleared from the device).
 */
export class WriteNotSettledError extends Error {
  /**
   * @param {RecordId} id
   * @param {string} why
   */
  constructor(id, why) {
    super(`outbox: write #${id} was not delivered: ${why}`);
    this.name = 'WriteNotSettledError';
    /** The record id of the write. */
    this.id = id;
  }
}

/**
 * The store. The page helper owns one (`outbox.state`, `outbox.subscribe`); made by hand
 * it is fed with {@link OutboxStore.onMessage} and {@link OutboxStore.onAnswer}.
 */
export class OutboxStore {
  /**
   * @param {object} [options]
   * @param {() => void} [options.relist] asks the worker for the queue (LIST_QUEUE);
   *   its answer comes back through {@link OutboxStore.onAnswer}
   * @param {() => number} [options.now] the clock (ms since the epoch)
   */
  constructor({ relist = () => {}, now = () => Date.now() } = {}) {
    /** @private */
    this.relist = relist;
    /** @private */
    this.now = now;
    /** @private @type {OutboxState} */
    this.current = INITIAL_STATE;
    /** @private @type {Set<OutboxListener>} */
    this.listeners = new Set();
    /**
     * Writes queued since the last MUTATIONS_BLOCKED (a flush's first word): they may be
     * newer than the queue a flush's summary describes.
     * @private @type {Set<RecordId>}
     */
    this.queuedSinceFlush = new Set();
    /**
     * When each write this page heard queued was heard (a count, not a time), so an
     * answer to a LIST_QUEUE sent before it does not hide it.
     * @private @type {Map<RecordId, number>}
     */
    this.queuedAt = new Map();
    /** @private */
    this.heard = 0;
    /**
     * Promises waiting for a write's settlement, by record id.
     * @private @type {Map<RecordId, {resolve: (m: SettledWrite) => void, reject: (e: Error) => void}[]>}
     */
    this.waiting = new Map();
    this.subscribe = this.subscribe.bind(this);
    this.getState = this.getState.bind(this);
  }

  /** The current snapshot. @returns {OutboxState} */
  get state() {
    return this.current;
  }

  /** The current snapshot (a function, for `useSyncExternalStore`). @returns {OutboxState} */
  getState() {
    return this.current;
  }

  /**
   * Calls `listener` after every change; bound, so it can be passed on as it is.
   * @param {OutboxListener} listener
   * @returns {() => void} unsubscribe
   */
  subscribe(listener) {
    this.listeners.add(listener);
    return () => { this.listeners.delete(listener); };
  }

  /**
   * Resolves with the server's answer to the write queued as `id` once it was replayed
   * (MUTATION_SETTLED; at once when it already was); rejects with a
   * {@link WriteNotSettledError} when it leaves the outbox otherwise (cancelled, cleared,
   * or delivered without this page hearing the answer, e.g. under another account).
   * A write that needs attention keeps it waiting: a person may still retry it.
   * @param {RecordId} id the 202's `id`
   * @returns {Promise<SettledWrite>}
   */
  settlement(id) {
    const done = this.current.settled.find((s) => s.id === id);
    if (done) return Promise.resolve(done);
    return new Promise((resolve, reject) => {
      const list = this.waiting.get(id) ?? [];
      list.push({ resolve, reject });
      this.waiting.set(id, list);
    });
  }

  /**
   * A report the worker broadcast (contract 5); answers come through
   * {@link OutboxStore.onAnswer}, with the command they answer.
   * @param {WorkerMessage | {type: string}} message
   */
  onMessage(message) {
    const m = /** @type {WorkerMessage} */ (message);
    switch (m.type) {
      case 'MUTATION_QUEUED': {
        this.heard += 1;
        this.queuedAt.set(m.id, this.heard);
        this.queuedSinceFlush.add(m.id);
        /** @type {QueueRecord} */
        const record = {
          id: m.id, method: m.method, path: m.path, ownerId: m.ownerId, workspace: m.workspace,
          state: 'queued', attentionReason: null, lastStatus: null, timestamp: this.now(), bodySize: null,
        };
        const known = this.current.records.some((r) => r.id === m.id);
        this.update({
          records: known ? this.current.records : sortById([...this.current.records, record]),
          background: typeof m.background === 'boolean' ? m.background : this.current.background,
        });
        break;
      }
      case 'MUTATION_SETTLED': {
        /** @type {SettledWrite} */
        const settled = Object.freeze({ ...m, settledAt: this.now() });
        this.update({
          records: this.current.records.filter((r) => r.id !== m.id),
          blocked: this.current.blocked.filter((b) => b.id !== m.id),
          settled: [...this.current.settled, settled].slice(-SETTLED_KEPT),
        });
        for (const w of this.take(m.id)) w.resolve(settled);
        break;
      }
      case 'MUTATIONS_BLOCKED': {
        this.queuedSinceFlush.clear();
        const byId = new Map(m.blocked.map((b) => [b.id, b]));
        const records = this.current.records.map((r) => {
          const b = byId.get(r.id);
          if (!b) return r;
          byId.delete(r.id);
          return { ...r, state: stateOf(b), attentionReason: attentionOf(b, r) };
        });
        // Writes this page had not heard of (queued before it loaded, by another window).
        for (const b of byId.values()) records.push(fromBlocked(b));
        this.update({ records: sortById(records), blocked: m.blocked });
        break;
      }
      case 'MUTATIONS_REPLAYED': {
        // The queue was empty when the flush re-read it: what this page knew is gone,
        // except writes queued meanwhile, which the queue is read again to be sure of.
        const newer = this.current.records.filter((r) => this.queuedSinceFlush.has(r.id));
        for (const r of this.current.records) {
          if (!newer.includes(r)) this.gone(r.id, 'it left the outbox without an answer this page heard of');
        }
        this.update({
          records: newer,
          blocked: this.current.blocked.filter((b) => newer.some((r) => r.id === b.id)),
          delivery: { stoppedBy: null, retryAt: null, lastAttemptAt: this.now() },
        });
        if (newer.length) this.relist();
        break;
      }
      case 'MUTATIONS_PARTIAL': {
        this.update({
          delivery: { stoppedBy: m.stoppedBy ?? null, retryAt: m.retryAt ?? null, lastAttemptAt: this.now() },
        });
        if (this.current.records.length !== m.remaining) this.relist();
        break;
      }
      default:
        break;
    }
  }

  /**
   * The answer to one of the page's own commands, with the command it answers (the
   * helper calls this before resolving the command's promise).
   * @param {{type?: unknown, [field: string]: unknown}} command
   * @param {WorkerMessage} answer
   * @param {number} [sentAt] {@link OutboxStore.mark} when the command was sent
   */
  onAnswer(command, answer, sentAt = 0) {
    if (answer.type === 'QUEUE_STATE') {
      this.onQueueState(answer, sentAt);
      return;
    }
    if (answer.type !== 'COMMAND_RESULT' || !answer.ok) return;
    this.onResult(command, answer);
  }

  /** A mark to give {@link OutboxStore.onAnswer} for a command sent now. @returns {number} */
  mark() {
    return this.heard;
  }

  /**
   * Whether the browser has Background Sync, before any write says (`background`).
   * @param {boolean} available
   */
  backgroundAvailable(available) {
    if (this.current.background === null) this.update({ background: available });
  }

  /**
   * @private
   * @param {{type?: unknown, [field: string]: unknown}} command
   * @param {CommandResult} result
   */
  onResult(command, result) {
    switch (command.type) {
      case 'AUTH_SESSION': {
        const account = typeof command.userId === 'string' ? command.userId : null;
        if (account === this.current.account) {
          // The worker's session, now said by the page: the list is already that
          // account's view.
          if (this.current.accountFrom !== 'page') this.update({ accountFrom: 'page' });
          return;
        }
        this.update({ account, accountFrom: 'page' });
        // Another account's writes are listed without their details: read them so.
        this.relist();
        return;
      }
      case 'RECOVER_RECORD': {
        const id = /** @type {RecordId} */ (command.id);
        if (command.action === 'discard') {
          this.update({
            records: this.current.records.filter((r) => r.id !== id),
            blocked: this.current.blocked.filter((b) => b.id !== id),
          });
          this.gone(id, 'it was discarded');
        } else {
          // retry-new and edit: back in the queue, under a new key, in its place.
          this.update({
            records: this.current.records.map((r) => (r.id === id
              ? { ...r, state: 'queued', attentionReason: null, lastStatus: null } : r)),
            blocked: this.current.blocked.filter((b) => b.id !== id),
          });
        }
        return;
      }
      case 'REBIND_RECORDS':
        if ((result.affected ?? 0) > 0) this.relist();
        return;
      case 'CLEAR_DEVICE':
        for (const r of this.current.records) this.gone(r.id, 'the device was cleared');
        // The worker's session went with the device; the page's own word stands.
        this.update({
          records: [], blocked: [], delivery: NO_DELIVERY,
          ...(this.current.accountFrom === 'worker' ? { account: null, accountFrom: null } : {}),
        });
        return;
      default:
    }
  }

  /**
   * The queue as the worker listed it; writes heard queued after the LIST_QUEUE was
   * sent (`sentAt`) and missing from it are kept.
   * @private
   * @param {QueueState} qs
   * @param {number} sentAt
   */
  onQueueState(qs, sentAt) {
    if (!Array.isArray(qs.records)) return;
    const listed = new Set(qs.records.map((r) => r.id));
    const later = this.current.records.filter((r) => !listed.has(r.id) && (this.queuedAt.get(r.id) ?? 0) > sentAt);
    for (const r of this.current.records) {
      if (!listed.has(r.id) && !later.includes(r)) this.gone(r.id, 'it is no longer in the outbox');
    }
    const records = sortById([...qs.records, ...later]);
    // Until the page says who is signed in, the worker's session says whose writes are
    // pending (an offline reload: the page cannot ask the server). Workers before 0.1.0's
    // release did not name it.
    const worker = this.current.accountFrom !== 'page' && qs.account !== undefined
      ? { account: qs.account, accountFrom: qs.account === null ? null : /** @type {'worker'} */ ('worker') }
      : {};
    this.update({
      ready: true,
      records,
      blocked: this.current.blocked.filter((b) => listed.has(b.id)),
      delivery: qs.delivery ?? this.current.delivery,
      ...worker,
    });
  }

  /**
   * Rejects the settlement promises of a write that left the outbox unanswered.
   * @private
   * @param {RecordId} id
   * @param {string} why
   */
  gone(id, why) {
    for (const w of this.take(id)) w.reject(new WriteNotSettledError(id, why));
  }

  /**
   * @private
   * @param {RecordId} id
   */
  take(id) {
    const list = this.waiting.get(id) ?? [];
    this.waiting.delete(id);
    return list;
  }

  /**
   * A new snapshot with `patch` applied (and `pending` derived), then the listeners.
   * @private
   * @param {Partial<OutboxState>} patch
   */
  update(patch) {
    const prev = this.current;
    // What the patch does not change keeps its identity, so a UI that compares parts
    // (`state.records !== last.records`) redraws only what changed.
    const records = patch.records && patch.records !== prev.records
      ? Object.freeze(patch.records.map((r) => Object.freeze(r))) : prev.records;
    const account = patch.account !== undefined ? patch.account : prev.account;
    const pending = records === prev.records && account === prev.account
      ? prev.pending
      : Object.freeze(account === null ? [] : records.filter((r) => r.ownerId === account));
    this.current = Object.freeze({
      ...prev,
      ...patch,
      records,
      account,
      pending,
      blocked: patch.blocked ? Object.freeze([...patch.blocked]) : prev.blocked,
      delivery: patch.delivery ? Object.freeze({ ...patch.delivery }) : prev.delivery,
      settled: patch.settled ? Object.freeze([...patch.settled]) : prev.settled,
    });
    for (const fn of [...this.listeners]) {
      try { fn(this.current); } catch (err) { console.error('outbox: state listener failed', err); }
    }
  }
}

/**
 * @param {QueueRecord[]} records
 * @returns {QueueRecord[]}
 */
function sortById(records) {
  return records.sort((a, b) => a.id - b.id);
}

/** The block reasons that are a needs-attention record's own (contract 4.5). */
const ATTENTION = new Set(['outcome-unknown', 'key-reused', 'repeated-5xx', 'rejected', 'expired', 'redirected', 'conflict', 'key-expired']);

/**
 * A record's state from its MUTATIONS_BLOCKED entry. The reason decides: a worker
 * before 0.1.0's release listed a write its flush had just moved to needs-attention
 * with its state as the flush began, `queued`.
 * @param {BlockedRecord} b
 * @returns {QueueRecord['state']}
 */
function stateOf(b) {
  return ATTENTION.has(b.reason) ? 'needs-attention' : b.state;
}

/**
 * A record's attention reason, from its MUTATIONS_BLOCKED entry.
 * @param {BlockedRecord} b
 * @param {QueueRecord} [r]
 * @returns {QueueRecord['attentionReason']}
 */
function attentionOf(b, r) {
  if (ATTENTION.has(b.reason)) return /** @type {QueueRecord['attentionReason']} */ (b.reason);
  return stateOf(b) === 'needs-attention' ? (r?.attentionReason ?? null) : null;
}

/**
 * A record known only from a MUTATIONS_BLOCKED entry.
 * @param {BlockedRecord} b
 * @returns {QueueRecord}
 */
function fromBlocked(b) {
  return {
    id: b.id, method: b.method, path: b.path, ownerId: b.ownerId, workspace: b.workspace, state: stateOf(b),
    attentionReason: attentionOf(b), lastStatus: null, timestamp: null, bodySize: null,
  };
}
