// The sw-outbox demo PWA: two projects, account-level notes, and an outbox panel.
// Plain DOM code on purpose: the point is to show what a page must do around the
// outbox worker (session, CSRF, result handling, recovery), not a framework.
import { registerOutbox } from './outbox-client.js';

const PROJECTS = { p1: 'Website', p2: 'Mobile app' };
const NEEDS_ATTENTION = new Set(['outcome-unknown', 'key-reused', 'rejected', 'repeated-5xx', 'expired',
  'redirected', 'conflict', 'key-expired']);
const REMEMBERED_USER = 'sw-outbox-demo:user';
/** Where a bearer-mode sign-in keeps its tokens (the reference server's `--auth bearer`). */
const TOKENS = 'sw-outbox-demo:tokens';

const $ = (id) => document.querySelector(`[data-testid="${id}"]`);

const state = {
  user: null,           // {id} of the signed-in account
  csrf: null,           // the session's CSRF token, sent on every write
  auth: null,           // bearer mode: {accessToken, refreshToken}; no cookie at all
  client: null,         // OutboxClient, once the worker controls the page
  reachable: null,      // 'online' | 'unreachable' | null (not known yet)
  tasks: { p1: [], p2: [] },
  notes: [],
  outbox: null,         // the page helper's state (client.state): records, blocked, delivery
  pending: [],          // {recordId, kind, pid?, text}: what the page queued, to show in lists
  opened: new Map(),    // id -> READ_RECORD's record, for the write a person is looking at
  focus: null,          // the record id a notification (or ?outboxRecord=) asked to show
};

/** The handle tests use; `client` is set once the page is controlled. */
const demo = { client: null, state, lastResult: null, sessionSynced: false, api, refreshOutbox, loadData, refreshTokens };
window.demo = demo;

// ---------- small DOM helpers ----------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v == null || v === false) continue;
    if (k === 'class') node.className = v;
    else if (k.startsWith('on')) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? '' : v);
  }
  node.append(...children.flat().filter((c) => c != null));
  return node;
}

function message(text, isError = false) {
  const m = $('session-message');
  m.textContent = text;
  m.classList.toggle('error', isError);
}

// ---------- network ----------

/**
 * One API call. Writes carry the CSRF token and the expected account, so the server
 * (and the worker, on replay) can refuse a write that would land in the wrong account.
 */
async function api(method, path, body) {
  const isWrite = method !== 'GET';
  const headers = {};
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (isWrite && state.csrf) headers['X-CSRF-Token'] = state.csrf;
  if (isWrite && state.user && !path.startsWith('/api/auth/')) headers['X-PM-Expected-Account'] = state.user.id;
  if (state.auth) headers.Authorization = `Bearer ${state.auth.accessToken}`;
  let res;
  try {
    res = await fetch(path, {
      method, headers, credentials: 'same-origin', cache: 'no-store',
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (err) {
    // Without a worker (or for auth routes) a dead network is a thrown fetch.
    setReachable('unreachable');
    return { status: 0, body: { error: err.message }, networkError: true };
  }
  let text;
  try {
    text = await res.text();
  } catch (err) {
    // The answer's body was cut off (the connection dropped after the headers): as
    // uncertain as a failed fetch, so reported the same way (seen in WebKit: "Load failed").
    setReachable('unreachable');
    return { status: 0, body: { error: err.message }, networkError: true };
  }
  let json = null;
  try { json = text ? JSON.parse(text) : null; } catch { json = { raw: text }; }
  const offline = (res.status === 503 && json?.error === 'offline') || (res.status === 202 && json?.queued === true);
  setReachable(offline ? 'unreachable' : 'online');
  // Bearer mode: an expired access token is refreshed and the call made once more.
  if (res.status === 401 && json?.detail === 'token_expired' && !path.startsWith('/api/auth/') && await refreshTokens()) {
    if (state.user) state.client?.authSession(state.user.id, authorization()).catch(() => {});
    return api(method, path, body);
  }
  return { status: res.status, body: json };
}

function setReachable(value) {
  state.reachable = value;
  renderNet();
}

function renderNet() {
  const pill = $('net-status');
  let [s, text] = ['unknown', 'checking…'];
  if (!navigator.onLine) [s, text] = ['offline', 'offline'];
  else if (state.reachable === 'unreachable') {
    [s, text] = ['unreachable', state.client ? 'server unreachable: writes are queued' : 'server unreachable'];
  }
  else if (state.reachable === 'online') [s, text] = ['online', 'online'];
  pill.dataset.state = s;
  pill.textContent = text;
}

// ---------- bearer tokens (the server's `--auth bearer`) ----------

function setTokens(auth) {
  state.auth = auth;
  if (auth) localStorage.setItem(TOKENS, JSON.stringify(auth));
  else localStorage.removeItem(TOKENS);
}

/** The `Authorization` value of the bearer session, if this is one. */
function authorization() {
  return state.auth ? `Bearer ${state.auth.accessToken}` : undefined;
}

/** Trades the refresh token for a new access token; whether it worked. */
async function refreshTokens() {
  if (!state.auth?.refreshToken) return false;
  const r = await api('POST', '/api/auth/refresh', { refreshToken: state.auth.refreshToken });
  if (r.status !== 200 || !r.body?.accessToken) return false;
  setTokens({ ...state.auth, accessToken: r.body.accessToken });
  return true;
}

/** The worker asks for a credential (AUTH_NEEDED): its token expired, or the worker
 * restarted without it. A new access token, or null when the session is over. */
async function getAuthorization(userId) {
  if (!state.auth || state.user?.id !== userId) return null;
  return (await refreshTokens()) ? authorization() : null;
}

// ---------- writes and their results ----------

/** Sends a write and shows its outcome: applied, queued (with its key) or refused. */
async function write(label, method, path, body, pendingEntry) {
  const r = await api(method, path, body);
  demo.lastResult = { label, method, path, ...r };
  let outcome; let detail;
  if (r.status === 202 && r.body?.queued === true) {
    outcome = 'queued';
    detail = [`queued as #${r.body.id}, key `, el('code', { class: 'key', 'data-testid': 'result-key' }, r.body.idempotencyKey)];
    if (pendingEntry) state.pending.push({ ...pendingEntry, recordId: r.body.id });
  } else if (r.status >= 200 && r.status < 300) {
    outcome = 'applied';
    detail = `applied (${r.status})`;
  } else if (r.body?.queued === false) {
    outcome = 'refused';
    detail = `refused (${r.status}): ${r.body.error ?? 'not stored'}`;
  } else {
    outcome = 'failed';
    detail = r.status === 0 ? `failed: ${r.body.error}` : `failed (${r.status}): ${r.body?.detail ?? r.body?.error ?? ''}`;
  }
  const log = $('write-log');
  log.prepend(el('li', { class: outcome, 'data-testid': 'write-result', 'data-outcome': outcome },
    el('strong', {}, label), ': ', detail));
  while (log.children.length > 30) log.lastChild.remove();
  return r;
}

// ---------- data ----------

async function loadData() {
  if (!state.user) return;
  const [p1, p2, notes] = await Promise.all([
    api('GET', '/api/projects/p1/tasks'), api('GET', '/api/projects/p2/tasks'), api('GET', '/api/notes'),
  ]);
  // Offline, keep showing the last lists rather than blanking them.
  if (p1.status === 200) state.tasks.p1 = p1.body.tasks ?? [];
  if (p2.status === 200) state.tasks.p2 = p2.body.tasks ?? [];
  if (notes.status === 200) state.notes = notes.body.notes ?? [];
  renderLists();
}

function renderLists() {
  for (const pid of Object.keys(PROJECTS)) {
    renderList($(`task-list-${pid}`), state.tasks[pid].map((t) => t.title),
      state.pending.filter((p) => p.kind === 'task' && p.pid === pid), 'task', 'No tasks yet');
  }
  renderList($('note-list'), state.notes.map((n) => n.text),
    state.pending.filter((p) => p.kind === 'note'), 'note', 'No notes yet');
}

function renderList(list, texts, pending, testid, emptyText) {
  list.replaceChildren(
    ...texts.map((t) => el('li', { 'data-testid': testid }, t)),
    ...pending.map((p) => el('li', { class: 'pending', 'data-testid': `${testid}-pending` }, `${p.text} (queued)`)),
  );
  if (!list.children.length) list.append(el('li', { class: 'empty' }, emptyText));
}

// ---------- session ----------

function renderSession() {
  const signedIn = Boolean(state.user);
  $('login-form').hidden = signedIn;
  $('signed-in').hidden = !signedIn;
  $('workspace').hidden = !signedIn;
  $('signout-dialog').hidden = true;
  $('user-name').textContent = state.user?.id ?? '';
}

async function setUser(user, csrf) {
  state.user = user;
  state.csrf = csrf;
  if (user) localStorage.setItem(REMEMBERED_USER, user.id);
  else localStorage.removeItem(REMEMBERED_USER);
  renderSession();
  if (user) {
    loadData();
    await syncSession();
  }
}

/** The opt-in to delivery notifications; the permission prompt comes from this click. */
async function notifyToggled(event) {
  const box = event.target;
  if (!state.client || !state.user) { box.checked = false; return; }
  const r = box.checked
    ? await state.client.enableNotifications(state.user.id)
    : await state.client.disableNotifications(state.user.id);
  if (!r.ok) {
    box.checked = false;
    message(`Notifications: ${r.reason}`, true);
  }
}

/** Binds the worker to the signed-in account and sends what it queued (contract 7). */
async function syncSession() {
  if (!state.client || !state.user) return;
  try {
    const r = await state.client.signedIn(state.user.id, authorization());
    demo.sessionSynced = true;
    openFocused();
    if (!r.ok) message(`Outbox: ${r.command} refused: ${r.reason}`, true);
  } catch (err) {
    message(err.message, true);
  }
}

async function signIn(event) {
  event.preventDefault();
  const form = event.target;
  const userId = form.userId.value.trim();
  const r = await api('POST', '/api/auth/login', { userId, password: form.password.value });
  if (r.status === 200 && r.body?.user?.id) {
    form.reset();
    message('');
    // Bearer mode answers tokens instead of setting a cookie.
    setTokens(r.body.accessToken ? { accessToken: r.body.accessToken, refreshToken: r.body.refreshToken } : null);
    await setUser(r.body.user, r.body.csrfToken ?? null);
  } else if (r.status === 401) {
    message('Wrong account or password.', true);
  } else {
    message('Cannot sign in right now (the server is unreachable). Signing in needs the network.', true);
  }
}

/** Sign-out warns first when this device still holds unsent work. */
async function signOutClicked() {
  if (state.client) {
    try {
      const { records = [] } = await state.client.list();
      if (records.length) {
        $('signout-count').textContent = String(records.length);
        $('signout-dialog').hidden = false;
        return;
      }
    } catch (err) {
      message(err.message, true);
    }
  }
  await signOut();
}

async function signOut() {
  const r = state.auth
    ? await fetch('/api/auth/logout', {
      method: 'POST', headers: { 'Content-Type': 'application/json', Authorization: authorization() },
      body: JSON.stringify({ refreshToken: state.auth.refreshToken }),
    }).then((res) => ({ status: res.status }), () => ({ status: 0 }))
    : await api('POST', '/api/auth/logout');
  setTokens(null);
  if (r.status !== 200) message('Signed out on this device; the server could not be told (offline).');
  else message('Signed out.');
  if (state.client) await state.client.authSession(null).catch((err) => message(err.message, true));
  state.tasks = { p1: [], p2: [] };
  state.notes = [];
  state.pending = [];
  await setUser(null, null);
  demo.sessionSynced = false;
  refreshOutbox();
}

async function sendFirst() {
  const r = await state.client.flush().catch((err) => ({ ok: false, reason: err.message }));
  const { records = [] } = await state.client.list().catch(() => ({}));
  if (r.ok && records.length === 0) return signOut();
  $('signout-count').textContent = String(records.length);
  message(r.ok ? `${records.length} change(s) could not be sent; see the outbox.` : `Could not send: ${r.reason}`, true);
}

async function clearDevice() {
  const r = await state.client.clearDevice().catch((err) => ({ ok: false, reason: err.message }));
  if (!r.ok) return message(`Could not clear this device: ${r.reason}`, true);
  await signOut();
}

// ---------- outbox panel ----------

const REASONS = {
  'auth-route': () => 'a sign-in request; these are never replayed',
  'no-session': () => 'nobody is signed in; sign in to send it',
  'unknown-owner': () => 'queued while signed out: no account is recorded for it',
  'owner-mismatch': (r) => `belongs to another account (${r.ownerId})`,
  'outcome-unknown': () => 'the server may or may not have applied this',
  'key-reused': () => 'the server already saw its key with a different request',
  'rejected': (r) => `the server rejected it (status ${r.attentionStatus ?? r.status ?? r.lastStatus ?? '4xx'})`,
  'repeated-5xx': () => 'the server failed on it repeatedly (5xx)',
  'expired': () => 'older than 7 days: never sent automatically',
  'redirected': () => 'the server redirected it (a sign-in page?): it was not applied there',
  'conflict': () => 'the server kept saying another request with its key was still running',
  'key-expired': () => 'sent once more than a day ago: it may already have been applied; check, then retry as new or discard',
  'workspace-order': (r) => (r.workspace ? 'waiting for an earlier change in this project' : 'waiting for an earlier change'),
  'corrupt-record': () => 'the stored record is damaged and cannot be sent',
};

/** A reason code in plain words. */
function explain(reason, record = {}) {
  return REASONS[reason]?.(record) ?? reason;
}

/** The page helper's state of the outbox (kept current from the worker's reports). */
function outboxState() {
  return state.client?.state ?? state.outbox ?? { records: [], blocked: [], delivery: {}, background: null };
}

/** Re-reads the queue (one LIST_QUEUE; the page helper's state takes the answer). */
async function refreshOutbox() {
  if (!state.client) return renderOutbox();
  try {
    await state.client.list();
  } catch (err) {
    $('outbox-summary').textContent = err.message;
  }
}

/** The page helper's state changed: the panel and the lists' queued entries follow it.
 * Only what changed is drawn again: the flushes that retry while offline change the
 * delivery status alone, and rebuilding the list under a person's click would lose it. */
function onOutboxState(next) {
  const last = state.outbox;
  state.outbox = next;
  if (last && next.records === last.records && next.blocked === last.blocked && next.account === last.account) {
    renderDelivery();
    return;
  }
  // Ids only grow: a write newer than every record known was queued after this state.
  const ids = new Set(next.records.map((r) => r.id));
  const newest = Math.max(0, ...ids);
  state.pending = state.pending.filter((p) => ids.has(p.recordId) || p.recordId > newest);
  renderOutbox();
  renderLists();
}

const STOPS = {
  offline: 'the server cannot be reached',
  'signed-out': 'nobody is signed in',
  'identity-check': 'the server could not say who is signed in',
  unauthorized: 'the server did not accept the session: sign in again',
  'rate-limited': 'the server asked to wait',
  'account-mismatch': 'the server is signed in to another account',
  budget: 'there was more to send than one try allows',
  storage: 'this device could not store the outbox',
};

/** A time of day as a person reads it: "10:42". */
const clock = (ms) => new Date(ms).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' });

/** Delivery status: why the outbox waits, when it tries again, whether it can send with
 * no page open ("will be sent next time you open the app" where there is no Background
 * Sync). */
function renderDelivery() {
  const node = $('delivery-status');
  const { records, delivery = {}, background } = outboxState();
  const user = state.user?.id;
  const waiting = records.filter((r) => r.state === 'queued' && (!r.ownerId || r.ownerId === user));
  node.dataset.stoppedBy = delivery.stoppedBy ?? '';
  node.dataset.retryAt = delivery.retryAt == null ? '' : String(delivery.retryAt);
  node.dataset.background = background == null ? '' : String(background);
  if (!waiting.length) {
    node.textContent = '';
    return;
  }
  const parts = [];
  if (delivery.stoppedBy) parts.push(`Not sent yet: ${STOPS[delivery.stoppedBy] ?? delivery.stoppedBy}.`);
  if (delivery.retryAt) parts.push(`Will retry at ${clock(delivery.retryAt)}.`);
  else if (delivery.stoppedBy) parts.push('Will retry when you are back online or signed in.');
  parts.push(background === false
    ? 'Saved on this device: sent while this page is open, else it will be sent next time you open the app.'
    : 'Saved on this device: sent in the background, even after you close the app.');
  node.textContent = parts.join(' ');
}

function renderOutbox() {
  $('outbox-count').textContent = String(outboxState().records.length);
  const list = $('outbox-list');
  const user = state.user?.id;
  const records = outboxState().records;
  // Another account's writes are not shown one by one: only that they exist (privacy on
  // a shared device), with the way to clear them.
  const mine = records.filter((r) => !r.ownerId || r.ownerId === user);
  const others = records.length - mine.length;
  list.replaceChildren(...mine.map(renderRecord));
  if (others) {
    list.append(el('li', { 'data-testid': 'other-accounts' },
      el('span', {}, `${others} unsent change${others === 1 ? '' : 's'} of another account`),
      el('span', { class: 'muted' }, 'they are sent when their owner signs in on this device'),
      el('div', { class: 'row' }, action('clear-others', 'Clear this device', async () => { await clearDevice(); return { ok: true }; }, 'danger'))));
  }
  if (!records.length) list.append(el('li', { class: 'empty' }, 'Nothing waiting.'));
  renderDelivery();
  if (state.focus !== null) {
    document.querySelector(`[data-testid="record-${state.focus}"]`)?.scrollIntoView({ block: 'center' });
  }
}

function renderRecord(rec) {
  const blocked = outboxState().blocked.find((b) => b.id === rec.id);
  const info = { ...rec, ...blocked };
  const reason = rec.state === 'needs-attention' ? (rec.attentionReason ?? blocked?.reason) : blocked?.reason;
  const where = rec.workspace ? (PROJECTS[rec.workspace] ?? `project ${rec.workspace}`) : 'account-level';
  const user = state.user?.id;
  const buttons = [];
  if (reason === 'unknown-owner' && user) {
    buttons.push(action(`adopt-${rec.id}`, `Adopt as ${user}`, () => state.client.adopt(user, [rec.id])));
  }
  const own = user && rec.ownerId === user;
  if (own && (rec.state === 'needs-attention' || rec.state === 'queued')) {
    buttons.push(action(`show-${rec.id}`, 'Show', () => openRecord(rec.id)));
  }
  // A write not delivered yet can be cancelled, offline too (checked against the session).
  if (own && rec.state === 'queued') {
    buttons.push(action(`cancel-${rec.id}`, 'Cancel', () => state.client.discard(rec.id, user), 'danger'));
  }
  if (rec.state === 'needs-attention' && NEEDS_ATTENTION.has(reason) && own) {
    buttons.push(action(`retry-${rec.id}`, 'Retry as new', () => state.client.retry(rec.id, user)));
    buttons.push(action(`discard-${rec.id}`, 'Discard', () => state.client.discard(rec.id, user), 'danger'));
  }
  if (rec.state === 'corrupt' && user) {
    buttons.push(action(`discard-${rec.id}`, 'Discard', () => state.client.discard(rec.id, user), 'danger'));
  }
  const opened = state.opened.get(rec.id);
  return el('li', {
    'data-testid': `record-${rec.id}`, 'data-state': rec.state, 'data-blocked': String(Boolean(blocked)),
    'data-reason': reason ?? '', class: state.focus === rec.id ? 'focus' : '',
  },
  el('span', { class: 'meta' }, rec.method ? `#${rec.id} ${rec.method} /api${rec.path}` : `#${rec.id} (unreadable)`),
  el('span', { class: 'muted' }, `${where} · ${rec.ownerId ?? 'no account'}${rec.timestamp ? ` · ${new Date(rec.timestamp).toLocaleTimeString()}` : ''}`),
  el('span', { class: 'reason', 'data-testid': `reason-${rec.id}` }, reason ? explain(reason, info) : 'waiting to be sent'),
  buttons.length ? el('div', { class: 'row' }, buttons) : null,
  opened ? renderOpened(rec, opened) : null);
}

/** Reads a record's content (the worker checks the account with the server first). */
async function openRecord(id) {
  const r = await state.client.read(id, state.user?.id);
  if (r.type !== 'RECORD') return r;
  state.opened.set(id, r.record);
  renderOutbox();
  return { ok: true };
}

/** A stuck write's content, to copy, or to edit and resend under a new key. */
function renderOpened(rec, opened) {
  const text = opened.bodyEncoding === 'text' ? opened.body : null;
  const area = el('textarea', { 'data-testid': `edit-body-${rec.id}`, rows: 4, readOnly: text === null });
  area.value = text ?? `(binary, base64) ${opened.body}`;
  return el('div', { class: 'opened', 'data-testid': `opened-${rec.id}` },
    el('span', { class: 'muted' }, `${opened.contentType ?? 'no Content-Type'}${opened.lastStatus ? ` · last answer ${opened.lastStatus}` : ''}`),
    opened.sentBefore ? el('span', { class: 'warning' }, 'It was sent before: it may already have been applied.') : null,
    area,
    el('div', { class: 'row' },
      action(`copy-${rec.id}`, 'Copy', async () => {
        await navigator.clipboard.writeText(area.value);
        return { ok: true };
      }),
      text === null ? null : action(`resend-${rec.id}`, 'Resend edited', async () => {
        const r = await state.client.edit(rec.id, state.user?.id, area.value);
        if (r.ok) state.opened.delete(rec.id);
        return r;
      }),
      action(`close-${rec.id}`, 'Close', async () => { state.opened.delete(rec.id); renderOutbox(); return { ok: true }; })));
}

function action(testid, label, run, cls = 'secondary') {
  return el('button', {
    type: 'button', class: cls, 'data-testid': testid,
    onclick: async (e) => {
      e.target.disabled = true;
      const r = await run().catch((err) => ({ ok: false, reason: err.message }));
      const said = r.ok ? `${label}: done` : `${label} refused: ${r.reason}`;
      $('outbox-summary').textContent = said;
      // Kept apart too: the report of the flush that follows a change rewrites the summary.
      $('action-result').textContent = said;
      refreshOutbox();
    },
  }, label);
}

function onReport(m) {
  if (m.type === 'SHOW_RECORD') {
    showRecord(m.id);
    return;
  }
  if (m.type === 'MUTATIONS_REPLAYED') {
    // An empty flush proves nothing about the network; a replay does.
    if (m.count > 0) {
      $('outbox-summary').textContent = `Sent ${m.count} change(s); nothing left.`;
      setReachable('online');
      loadData();
    }
  } else if (m.type === 'MUTATIONS_PARTIAL') {
    $('outbox-summary').textContent = `Sent ${m.replayed}; ${m.remaining} still waiting.`;
    loadData();
  }
}

/** Opens the recovery view at a record (a notification click, or ?outboxRecord=<id>):
 * at once when someone is signed in and the worker controls the page, else as soon as
 * both are true (the page may still be asking who is signed in). */
let toOpen = null;
function showRecord(id) {
  state.focus = Number(id);
  toOpen = state.focus;
  openFocused();
  refreshOutbox();
}

function openFocused() {
  if (toOpen === null || !state.user || !state.client) return;
  const id = toOpen;
  toOpen = null;
  openRecord(id).catch(() => {});
}

async function sendNow() {
  if (!state.client) return;
  const r = await state.client.flush().catch((err) => ({ ok: false, reason: err.message }));
  if (!r.ok) $('outbox-summary').textContent = `Send refused: ${r.reason}`;
  refreshOutbox();
}

// ---------- demo-mode outage switch ----------

/** Shows the outage toggle only where the server has its /__control/ routes. */
async function probeControl() {
  const res = await fetch('/__control/applied', { cache: 'no-store' }).catch(() => null);
  if (!res?.ok) return;
  $('outage').hidden = false;
  $('outage-toggle').addEventListener('change', async (e) => {
    const down = e.target.checked;
    await fetch('/__control/network', {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ down }),
    });
    // The device never went offline, so no `online` event will come: send what waits.
    if (!down) { setReachable('online'); sendNow(); loadData(); }
  });
}

// ---------- start ----------

async function startOutbox() {
  const status = $('worker-status');
  try {
    // `?swconfig=<json>` on the demo's URL is handed to the worker (tests use it).
    const swConfig = new URLSearchParams(location.search).get('swconfig');
    const scriptUrl = swConfig ? `/sw.js?config=${encodeURIComponent(swConfig)}` : '/sw.js';
    // At once: the page renders while the worker installs; commands wait for it.
    const client = await registerOutbox({ scriptUrl, persist: 'first-queued', getAuthorization });
    state.client = demo.client = client;
    client.on('*', (m) => { if (m.type !== 'COMMAND_RESULT' && m.type !== 'QUEUE_STATE') onReport(m); });
    client.subscribe(onOutboxState);
    status.textContent = 'outbox: starting';
    await client.controlled;
    status.dataset.state = 'online';
    status.textContent = 'outbox: active';
    await syncSession();
    const asked = new URLSearchParams(location.search).get('outboxRecord');
    if (asked) showRecord(asked);
    else refreshOutbox();
  } catch (err) {
    status.dataset.state = 'offline';
    status.textContent = 'outbox: unavailable';
    status.title = err.message;
    console.warn(err);
  }
}

async function boot() {
  $('login-form').addEventListener('submit', signIn);
  $('sign-out').addEventListener('click', signOutClicked);
  $('notify-toggle').addEventListener('change', notifyToggled);
  $('signout-send-first').addEventListener('click', sendFirst);
  $('signout-clear').addEventListener('click', clearDevice);
  $('signout-keep').addEventListener('click', signOut);
  $('signout-cancel').addEventListener('click', () => { $('signout-dialog').hidden = true; });
  $('outbox-flush').addEventListener('click', sendNow);
  for (const pid of Object.keys(PROJECTS)) {
    $(`task-form-${pid}`).addEventListener('submit', async (e) => {
      e.preventDefault();
      const title = e.target.title.value.trim();
      e.target.reset();
      const r = await write(`Task in ${PROJECTS[pid]}`, 'POST', `/api/projects/${pid}/tasks`, { title }, { kind: 'task', pid, text: title });
      if (r.status >= 200 && r.status < 300 && !r.body?.queued) loadData();
      else renderLists();
    });
  }
  $('note-form').addEventListener('submit', async (e) => {
    e.preventDefault();
    const text = e.target.text.value.trim();
    e.target.reset();
    const r = await write('Note', 'POST', '/api/notes', { text }, { kind: 'note', text });
    if (r.status >= 200 && r.status < 300 && !r.body?.queued) loadData();
    else renderLists();
  });
  addEventListener('online', () => { renderNet(); loadData(); });
  addEventListener('offline', renderNet);
  renderNet();
  renderOutbox();
  probeControl();

  const outbox = startOutbox();
  try { state.auth = JSON.parse(localStorage.getItem(TOKENS) ?? 'null'); } catch { state.auth = null; }
  let me = await api('GET', '/api/auth/me');
  if (me.status === 401 && me.body?.detail === 'token_expired' && await refreshTokens()) {
    me = await api('GET', '/api/auth/me');
  }
  if (me.status === 401) setTokens(null);
  if (me.status === 200 && me.body?.user?.id) {
    await setUser(me.body.user, me.body.csrfToken ?? null);
  } else if (me.status === 401) {
    await setUser(null, null);
  } else {
    // Offline start: keep working as the last account; writes queue and the worker
    // re-checks the session with the server before replaying anything.
    const remembered = localStorage.getItem(REMEMBERED_USER);
    await setUser(remembered ? { id: remembered } : null, null);
    if (remembered) message(`Offline: showing the last session (${remembered}).`);
  }
  await outbox;
}

demo.ready = boot();
