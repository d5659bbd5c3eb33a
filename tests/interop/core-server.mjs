// An Express app whose write route is made idempotent by @node-idempotency/core 1.0.11
// (npm, pinned) called directly, as its README's "usage" shows: `onRequest` before the
// handler (a stored answer is sent back; an error is mapped to its HTTP status as the
// package's own Nest interceptor maps it), `onResponse` with the handler's answer, on the
// package's in-memory storage adapter. The conformance check judges it
// (conformance.test.mjs), beside express-idempotency (server.mjs) and
// @node-idempotency/nestjs (nest-server.mjs).
//
//   node tests/interop/core-server.mjs --port 0
//
// prints `listening on http://127.0.0.1:<port>`. Accounts alice/alice and bob/bob: cookie
// sessions with a CSRF token, checked before the idempotency layer (as in server.mjs).
// Test-only control routes: `GET /__control/applied` (every run of the write handler),
// `POST /__control/fault {"kind":"slow","ms":N}` (the next run waits N ms),
// `POST /__control/reset` (the applied list and faults; the package's store stays, which
// fresh keys make harmless).
import { randomBytes } from 'node:crypto';
import { createRequire } from 'node:module';
import { parseArgs } from 'node:util';

const require = createRequire(import.meta.url);
const express = require('express');

const { values: args } = parseArgs({
  options: {
    port: { type: 'string', default: '0' },
    www: { type: 'string' }, // accepted, unused: the harness passes it to every app
  },
});

const ACCOUNTS = new Map([['alice', 'alice'], ['bob', 'bob']]);
const sessions = new Map();
let applied = [];
let faults = [];
let nextId = 1;

function sessionOf(req) {
  const sid = /(?:^|;\s*)sid=([^;]+)/.exec(req.headers.cookie ?? '')?.[1];
  return sid ? sessions.get(sid) ?? null : null;
}

const ex = express();
ex.use((req, res, next) => { res.setHeader('Connection', 'close'); next(); });
ex.use(express.json());
ex.get('/__control/applied', (req, res) => res.json({ applied }));
ex.post('/__control/fault', (req, res) => {
  const { kind, ms } = req.body ?? {};
  if (kind !== 'slow' || !(Number.isSafeInteger(ms) && ms > 0)) return res.status(400).json({ detail: 'kind must be "slow", with a positive ms' });
  faults.push({ kind, ms });
  return res.json({ faults });
});
ex.post('/__control/reset', (req, res) => { applied = []; faults = []; res.json({ ok: true }); });

ex.post('/api/auth/login', (req, res) => {
  const { userId, password } = req.body ?? {};
  if (typeof userId !== 'string' || ACCOUNTS.get(userId) !== password) return res.status(401).json({ detail: 'invalid_credentials' });
  const sid = randomBytes(18).toString('base64url');
  const csrfToken = randomBytes(18).toString('base64url');
  sessions.set(sid, { userId, csrfToken });
  res.setHeader('Set-Cookie', `sid=${sid}; HttpOnly; SameSite=Lax; Path=/`);
  return res.json({ user: { id: userId }, csrfToken });
});
ex.get('/api/auth/me', (req, res) => {
  const s = sessionOf(req);
  if (!s) return res.status(401).json({ user: null });
  return res.json({ user: { id: s.userId }, csrfToken: s.csrfToken });
});
// Every other /api/ route: a session, and for writes its CSRF token, before the package.
ex.use('/api', (req, res, next) => {
  const s = sessionOf(req);
  if (!s) return res.status(401).json({ detail: 'not_signed_in' });
  if (req.method !== 'GET' && req.get('x-csrf-token') !== s.csrfToken) return res.status(403).json({ detail: 'csrf_failed' });
  req.account = s.userId;
  return next();
});

/** The write: a task appended to the applied list (after a `slow` fault's wait). */
async function createTask(req) {
  const fault = faults.shift();
  if (fault) await new Promise((done) => { setTimeout(done, fault.ms); });
  const title = req.body?.title;
  const task = { id: nextId++, projectId: req.params.pid, title, done: false, owner: req.account };
  applied.push({ seq: applied.length, key: req.get('idempotency-key') ?? null, account: req.account, title });
  return task;
}

async function withCore() {
  const { Idempotency, IdempotencyError } = require('@node-idempotency/core');
  const { MemoryStorageAdapter } = require('@node-idempotency/storage-adapter-memory');
  const { idempotency2HttpCodeMap } = require('@node-idempotency/shared');
  const idempotency = new Idempotency(new MemoryStorageAdapter(), {});

  ex.post('/api/projects/:pid/tasks', async (req, res) => {
    const request = { method: req.method, headers: req.headers, body: req.body, path: req.originalUrl };
    try {
      const stored = await idempotency.onRequest(request);
      if (stored) {
        res.setHeader('Idempotent-Replayed', 'true');
        return res.status(stored.additional?.statusCode ?? 200).json(stored.body);
      }
    } catch (err) {
      if (err instanceof IdempotencyError) {
        return res.status(idempotency2HttpCodeMap[err.code] ?? 500).json({ message: err.message, code: err.code });
      }
      return res.status(500).json({ message: 'Internal Server Error' });
    }
    const task = await createTask(req);
    await idempotency.onResponse(request, { body: task, additional: { statusCode: 201 } });
    return res.status(201).location(`/api/projects/${encodeURIComponent(task.projectId)}/tasks/${task.id}`).json(task);
  });
  return new Promise((done) => { const s = ex.listen(Number(args.port), '127.0.0.1', () => done(s)); });
}

const server = await withCore();
console.log(`listening on http://127.0.0.1:${server.address().port}`);
process.on('SIGTERM', () => { server.close(); process.exit(0); });
