// A small Express app that uses a third-party idempotency middleware, express-idempotency
// (npm, pinned), on its write route, set up as that package's README says: default
// in-memory adapter, default validators, `app.post('*', idempotency())`, and a route
// handler that returns early on `isHit(req)`. The outbox was not written for it; the
// interop tests check that it still delivers exactly once against it.
//
//   node tests/interop/server.mjs --port 0 --www www
//
// prints `listening on http://127.0.0.1:<port>` once it listens. `--www` is the directory
// of the worker's files (sw.js, pkg/, outbox-client.js); tests/interop/public (the test
// page) is served before it.
//
// Test-only control routes under /__control/ (JSON, never affected by the network switch
// or the faults): see tests/interop/README.md.
import { randomBytes } from 'node:crypto';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const require = createRequire(import.meta.url);
const express = require('express');
// A CommonJS package compiled from TypeScript; required, not imported, so its exports
// are read as it defines them.
const { idempotency, getSharedIdempotencyService } = require('express-idempotency');

const here = dirname(fileURLToPath(import.meta.url));

const { values: args } = parseArgs({
  options: {
    port: { type: 'string', default: '0' },
    host: { type: 'string', default: '127.0.0.1' },
    www: { type: 'string', default: resolve(here, '../../www') },
  },
});

const ACCOUNTS = new Map([['alice', 'alice'], ['bob', 'bob']]);
const FAULT_KINDS = new Set(['drop-after-apply', 'slow', 'fail-once']);

/** Everything a reset clears: the app's data, sessions, logs, faults and the middleware's store. */
function freshState() {
  return {
    /** sid → {userId, csrfToken} */
    sessions: new Map(),
    /** Every write the route really ran, in order: the ground truth of the tests. */
    applied: [],
    /** Every /api/ request seen, in arrival order; `status` is filled when it is answered. */
    requests: [],
    /** One-shot faults, taken in order by the write handler's next real run. */
    faults: [],
    /** Write handlers between entry and answer (or drop). */
    running: 0,
    /** Wake-ups of the `slow` handlers still waiting. */
    waiting: new Set(),
    networkDown: false,
    nextTaskId: 1,
    /** `session` (the default): each sign-in gets its own CSRF token. `device`: the token
     * belongs to the browser (a `did` cookie, as csurf's cookie-stored secret does) and
     * outlives a sign-in as another account: a write carrying the token read before the
     * sign-in still passes, so only the outbox can keep it from landing under the new
     * account (the sign-in race, tests/e2e-engines/sign-in-race.test.mjs). `rotate`: a
     * session's token is replaced by a new one after every write that passed the check (a
     * server that rotates its token per request; /auth/me tells the current one). */
    csrf: 'session',
    /** Device id → CSRF token, in `device` mode. */
    deviceTokens: new Map(),
    /** Every real run of the task handler waits this long (after the account was read
     * from the request), so that a flush of several records takes a while. */
    holdMs: 0,
    /** Where `holdMs` holds a task write: `route` (in the handler, after the middleware
     * claimed its key), or `arrival` (before the middleware: a write whose client went
     * away meanwhile is dropped unprocessed, as a server that never got to it). */
    holdAt: 'route',
    // A new middleware instance brings a new default in-memory adapter: the same as
    // restarting the app, without touching the package's code.
    idempotent: idempotency(),
  };
}

let state = freshState();

function parseCookies(header) {
  const out = new Map();
  for (const part of (header ?? '').split(';')) {
    const at = part.indexOf('=');
    if (at > 0) out.set(part.slice(0, at).trim(), decodeURIComponent(part.slice(at + 1).trim()));
  }
  return out;
}

function sessionOf(req) {
  const sid = parseCookies(req.headers.cookie).get('sid');
  return sid ? { sid, ...state.sessions.get(sid) } : null;
}

function signedIn(req) {
  const s = sessionOf(req);
  return s?.userId ? s : null;
}

/** The browser's device id in `device` CSRF mode (set on its first sign-in). */
const deviceOf = (req) => parseCookies(req.headers.cookie).get('did') ?? null;

/** The CSRF token a request must carry: its session's, or (`device` mode) its browser's. */
function csrfTokenOf(req, session) {
  if (state.csrf !== 'device') return session?.csrfToken ?? null;
  const did = deviceOf(req);
  return did ? state.deviceTokens.get(did) ?? null : null;
}

const app = express();

// Before anything else: no keep-alive (a browser silently re-sends a POST when a reused
// connection closes without an answer, which would hide the dropped connections the
// tests make), the requests log, and the network switch.
app.use((req, res, next) => {
  res.setHeader('Connection', 'close');
  if (!req.path.startsWith('/api/')) return next();
  const entry = {
    seq: state.requests.length,
    method: req.method,
    path: req.originalUrl,
    key: req.get('idempotency-key') ?? null,
    csrf: req.get('x-csrf-token') ?? null,
    user: signedIn(req)?.userId ?? null,
    status: null,
  };
  state.requests.push(entry);
  res.on('finish', () => { entry.status = res.statusCode; });
  if (state.networkDown) {
    req.socket.destroy();
    return undefined;
  }
  res.setHeader('Cache-Control', 'no-store');
  return next();
});

// ---- control routes (tests only) ----
const control = express.Router();
control.use(express.json());
control.get('/applied', (req, res) => res.json({ applied: state.applied }));
control.get('/requests', (req, res) => res.json({ requests: state.requests }));
control.get('/running', (req, res) => res.json({ running: state.running, waiting: state.waiting.size }));
control.get('/network', (req, res) => res.json({ down: state.networkDown }));
control.post('/network', (req, res) => {
  if (typeof req.body?.down !== 'boolean') return res.status(400).json({ detail: 'down must be a boolean' });
  state.networkDown = req.body.down;
  return res.json({ down: state.networkDown });
});
// `{"kind":"drop-after-apply"|"fail-once"}` or `{"kind":"slow","ms":N}`: armed for the
// next real run of the write handler (a replay the middleware answers from its store
// never reaches it).
control.post('/fault', (req, res) => {
  const { kind, ms } = req.body ?? {};
  if (!FAULT_KINDS.has(kind)) return res.status(400).json({ detail: `kind must be one of ${[...FAULT_KINDS].join(', ')}` });
  if (kind === 'slow' && !(Number.isSafeInteger(ms) && ms > 0)) return res.status(400).json({ detail: 'slow needs a positive integer ms' });
  state.faults.push(kind === 'slow' ? { kind, ms } : { kind });
  return res.json({ faults: state.faults });
});
// Ends the wait of every `slow` handler now, so a test need not guess how long it takes.
control.post('/release', (req, res) => {
  const released = state.waiting.size;
  for (const wake of state.waiting) wake();
  return res.json({ released });
});
control.post('/csrf', (req, res) => {
  const mode = req.body?.mode;
  if (!['session', 'device', 'rotate'].includes(mode)) return res.status(400).json({ detail: 'mode must be "session", "device" or "rotate"' });
  state.csrf = mode;
  return res.json({ mode });
});
control.post('/hold', (req, res) => {
  const { ms, at = 'route' } = req.body ?? {};
  if (!(Number.isSafeInteger(ms) && ms >= 0)) return res.status(400).json({ detail: 'ms must be a non-negative integer' });
  if (at !== 'route' && at !== 'arrival') return res.status(400).json({ detail: 'at must be "route" or "arrival"' });
  state.holdMs = ms;
  state.holdAt = at;
  return res.json({ ms, at });
});
control.post('/reset', (req, res) => {
  for (const wake of state.waiting) wake();
  state = freshState();
  res.json({ ok: true });
});
app.use('/__control', control);

// ---- the application ----
app.use('/api', express.json({
  // The raw text is kept for the applied log: the tests compare what the page sent.
  verify: (req, res, buf) => { req.rawBody = buf.toString('utf8'); },
}));

app.post('/api/auth/login', (req, res) => {
  const { userId, password } = req.body ?? {};
  if (typeof userId !== 'string' || ACCOUNTS.get(userId) !== password) {
    return res.status(401).json({ detail: 'invalid_credentials' });
  }
  const old = sessionOf(req);
  if (old) state.sessions.delete(old.sid);
  const sid = randomBytes(18).toString('base64url');
  let csrfToken = randomBytes(18).toString('base64url');
  if (state.csrf === 'device') {
    let did = deviceOf(req);
    if (!did || !state.deviceTokens.has(did)) {
      did = randomBytes(12).toString('base64url');
      state.deviceTokens.set(did, csrfToken);
      res.cookie('did', did, { httpOnly: true, sameSite: 'lax', path: '/' });
    }
    csrfToken = state.deviceTokens.get(did);
  }
  state.sessions.set(sid, { userId, csrfToken });
  res.cookie('sid', sid, { httpOnly: true, sameSite: 'lax', path: '/' });
  return res.json({ user: { id: userId }, csrfToken });
});

app.post('/api/auth/logout', (req, res) => {
  const s = sessionOf(req);
  if (s) state.sessions.delete(s.sid);
  res.clearCookie('sid', { httpOnly: true, sameSite: 'lax', path: '/' });
  res.json({ ok: true });
});

app.get('/api/auth/me', (req, res) => {
  const s = signedIn(req);
  if (!s) return res.status(401).json({ user: null });
  return res.json({ user: { id: s.userId }, csrfToken: csrfTokenOf(req, s) });
});

// Every other /api/ route needs the session; writes also need the CSRF token.
app.use('/api', (req, res, next) => {
  const s = signedIn(req);
  if (!s) return res.status(401).json({ detail: 'not_signed_in' });
  if (req.method !== 'GET' && req.method !== 'HEAD' && req.get('x-csrf-token') !== csrfTokenOf(req, s)) {
    return res.status(403).json({ detail: 'csrf_failed' });
  }
  if (state.csrf === 'rotate' && req.method !== 'GET' && req.method !== 'HEAD') {
    state.sessions.get(s.sid).csrfToken = randomBytes(18).toString('base64url');
  }
  req.account = s.userId;
  return next();
});

// `hold` at arrival: before the middleware sees the write.
app.post('/api/projects/:pid/tasks', async (req, res, next) => {
  const run = state;
  if (run.holdAt !== 'arrival' || run.holdMs === 0) return next();
  await waitOrRelease(run.holdMs);
  if (state !== run || req.socket.destroyed) { req.socket.destroy(); return undefined; }
  return next();
});

// The package's README: `app.post('*', idempotency())`. Through a wrapper only so that a
// reset can swap in a fresh instance.
app.post('*', (req, res, next) => state.idempotent(req, res, next));

/** Waits `ms`, or until /__control/release or a reset. */
function waitOrRelease(ms) {
  return new Promise((done) => {
    const wake = () => { clearTimeout(timer); state.waiting.delete(wake); done(); };
    const timer = setTimeout(wake, ms);
    state.waiting.add(wake);
  });
}

app.post('/api/projects/:pid/tasks', async (req, res) => {
  // The README's pattern: the middleware has already answered from its store.
  if (getSharedIdempotencyService().isHit(req)) return;
  const { title } = req.body ?? {};
  if (typeof title !== 'string' || title === '') {
    res.status(400).json({ detail: 'invalid_body' });
    return;
  }
  const run = state;
  const fault = run.faults.shift() ?? null;
  run.running += 1;
  try {
    if (run.holdMs > 0 && run.holdAt === 'route') {
      await waitOrRelease(run.holdMs);
      if (state !== run) { req.socket.destroy(); return; }
    }
    if (fault?.kind === 'slow') {
      await waitOrRelease(fault.ms);
      // Reset meanwhile: this request belongs to a test that is over.
      if (state !== run) { req.socket.destroy(); return; }
    }
    if (fault?.kind === 'fail-once') {
      res.status(500).json({ detail: 'injected' });
      return;
    }
    const key = req.get('idempotency-key') ?? null;
    run.applied.push({
      seq: run.applied.length, key, account: req.account, pid: req.params.pid, title, body: req.rawBody,
    });
    const task = { id: run.nextTaskId++, projectId: req.params.pid, title, done: false, owner: req.account };
    // A lost response: applied, answered (so the middleware stores the 201), but the
    // connection is gone before a byte of the answer reaches the client.
    if (fault?.kind === 'drop-after-apply') req.socket.destroy();
    res.status(201).location(`/api/projects/${encodeURIComponent(req.params.pid)}/tasks/${task.id}`).json(task);
  } finally {
    run.running -= 1;
  }
});

app.use('/api', (req, res) => res.status(404).json({ detail: 'not_found' }));

// ---- static files: the test page, then the worker's files ----
const staticOptions = {
  setHeaders(res, path) {
    res.setHeader('Cache-Control', 'no-cache');
    if (path.endsWith('.wasm')) res.setHeader('Content-Type', 'application/wasm');
    if (path.endsWith('.js') || path.endsWith('.mjs')) res.setHeader('Content-Type', 'text/javascript; charset=utf-8');
  },
};
app.use(express.static(join(here, 'public'), staticOptions));
app.use(express.static(resolve(args.www), staticOptions));

const server = app.listen(Number(args.port), args.host, () => {
  const { port } = server.address();
  console.log(`listening on http://127.0.0.1:${port}`);
});
server.keepAliveTimeout = 0;
process.on('SIGTERM', () => { server.close(); server.closeAllConnections(); process.exit(0); });
