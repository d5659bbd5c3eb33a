// A NestJS app whose write route is made idempotent by a second third-party layer,
// @node-idempotency/nestjs (npm, pinned), set up as that package's README says: the
// module registered with the in-memory storage, the route decorated `@Idempotent()`. Its
// "still running" answer is a 409 with `Retry-After: 1` and a JSON message; the outbox was
// not written for it. Plain JavaScript: the decorators are applied as the TypeScript
// compiler would (`Reflect.decorate`), so no build step is needed.
//
//   node tests/interop/nest-server.mjs --port 0 --www www
//
// prints `listening on http://127.0.0.1:<port>` once it listens. The same test page, sign-in
// and CSRF rules as server.mjs, and the control routes the interop harness uses (applied,
// requests, running, network, fault `slow`, release, reset) under /__control/.
import 'reflect-metadata';
import { randomBytes } from 'node:crypto';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';

const require = createRequire(import.meta.url);
const express = require('express');
const { Module, Controller, Post, Req, Res, HttpCode } = require('@nestjs/common');
const { NestFactory } = require('@nestjs/core');
const { ExpressAdapter } = require('@nestjs/platform-express');
const { NodeIdempotencyModule, Idempotent } = require('@node-idempotency/nestjs');

const here = dirname(fileURLToPath(import.meta.url));
const { values: args } = parseArgs({
  options: {
    port: { type: 'string', default: '0' },
    host: { type: 'string', default: '127.0.0.1' },
    www: { type: 'string', default: resolve(here, '../../www') },
  },
});

const ACCOUNTS = new Map([['alice', 'alice'], ['bob', 'bob']]);

function freshState() {
  return {
    sessions: new Map(),
    applied: [],
    requests: [],
    faults: [],
    running: 0,
    waiting: new Set(),
    networkDown: false,
    nextTaskId: 1,
  };
}
let state = freshState();

function sessionOf(req) {
  for (const part of (req.headers.cookie ?? '').split(';')) {
    const [name, value] = part.trim().split('=');
    if (name === 'sid' && state.sessions.has(value)) return { sid: value, ...state.sessions.get(value) };
  }
  return null;
}

function waitOrRelease(ms) {
  return new Promise((done) => {
    const wake = () => { clearTimeout(timer); state.waiting.delete(wake); done(); };
    const timer = setTimeout(wake, ms);
    state.waiting.add(wake);
  });
}

const server = express();
server.use((req, res, next) => {
  res.setHeader('Connection', 'close');
  if (!req.path.startsWith('/api/')) return next();
  const entry = {
    seq: state.requests.length,
    method: req.method,
    path: req.originalUrl,
    key: req.get('idempotency-key') ?? null,
    csrf: req.get('x-csrf-token') ?? null,
    user: sessionOf(req)?.userId ?? null,
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

const control = express.Router();
control.use(express.json());
control.get('/applied', (req, res) => res.json({ applied: state.applied }));
control.get('/requests', (req, res) => res.json({ requests: state.requests }));
control.get('/running', (req, res) => res.json({ running: state.running, waiting: state.waiting.size }));
control.post('/network', (req, res) => {
  if (typeof req.body?.down !== 'boolean') return res.status(400).json({ detail: 'down must be a boolean' });
  state.networkDown = req.body.down;
  return res.json({ down: state.networkDown });
});
control.post('/fault', (req, res) => {
  const { kind, ms } = req.body ?? {};
  if (kind !== 'slow' || !(Number.isSafeInteger(ms) && ms > 0)) {
    return res.status(400).json({ detail: 'only {"kind":"slow","ms":N} is known here' });
  }
  state.faults.push({ kind, ms });
  return res.json({ faults: state.faults });
});
control.post('/release', (req, res) => {
  const released = state.waiting.size;
  for (const wake of state.waiting) wake();
  return res.json({ released });
});
control.post('/reset', (req, res) => {
  for (const wake of state.waiting) wake();
  state = freshState();
  // The middleware's in-memory store is the module's: a reset starts a new app instead
  // (see `start` below), so a key of an earlier test is never met again.
  restart().then(() => res.json({ ok: true }), (err) => res.status(500).json({ detail: String(err) }));
});
server.use('/__control', control);

server.use('/api', express.json({ verify: (req, res, buf) => { req.rawBody = buf.toString('utf8'); } }));

server.post('/api/auth/login', (req, res) => {
  const { userId, password } = req.body ?? {};
  if (typeof userId !== 'string' || ACCOUNTS.get(userId) !== password) {
    return res.status(401).json({ detail: 'invalid_credentials' });
  }
  const sid = randomBytes(18).toString('base64url');
  const csrfToken = randomBytes(18).toString('base64url');
  state.sessions.set(sid, { userId, csrfToken });
  res.cookie('sid', sid, { httpOnly: true, sameSite: 'lax', path: '/' });
  return res.json({ user: { id: userId }, csrfToken });
});

server.get('/api/auth/me', (req, res) => {
  const s = sessionOf(req);
  if (!s) return res.status(401).json({ user: null });
  return res.json({ user: { id: s.userId }, csrfToken: s.csrfToken });
});

server.use('/api', (req, res, next) => {
  const s = sessionOf(req);
  if (!s) return res.status(401).json({ detail: 'not_signed_in' });
  if (req.method !== 'GET' && req.get('x-csrf-token') !== s.csrfToken) {
    return res.status(403).json({ detail: 'csrf_failed' });
  }
  req.account = s.userId;
  return next();
});

/** The write route: runs (and is logged as applied) once per real run. */
class TasksController {
  async create(req, res) {
    const run = state;
    const { title } = req.body ?? {};
    if (typeof title !== 'string' || title === '') {
      res.status(400);
      return { detail: 'invalid_body' };
    }
    const fault = run.faults.shift() ?? null;
    run.running += 1;
    try {
      if (fault?.kind === 'slow') {
        await waitOrRelease(fault.ms);
        if (state !== run) { req.socket.destroy(); return undefined; }
      }
      run.applied.push({
        seq: run.applied.length,
        key: req.get('idempotency-key') ?? null,
        account: req.account,
        pid: req.params.pid,
        title,
        body: req.rawBody,
      });
      return { id: run.nextTaskId++, projectId: req.params.pid, title, done: false, owner: req.account };
    } finally {
      run.running -= 1;
    }
  }
}
// What `@Controller('api') class … { @Post(…) @HttpCode(201) @Idempotent() create(@Req()
// req, @Res({passthrough: true}) res) }` compiles to.
Reflect.decorate([Controller('api')], TasksController);
const create = Object.getOwnPropertyDescriptor(TasksController.prototype, 'create');
Reflect.decorate([Post('projects/:pid/tasks'), HttpCode(201), Idempotent()], TasksController.prototype, 'create', create);
Req()(TasksController.prototype, 'create', 0);
Res({ passthrough: true })(TasksController.prototype, 'create', 1);

class AppModule {}
Reflect.decorate([Module({
  imports: [NodeIdempotencyModule.forRootAsync({ storage: { adapter: 'memory' } })],
  controllers: [TasksController],
})], AppModule);

async function restart() {
  const old = nest;
  const inner = express();
  const app = await NestFactory.create(AppModule, new ExpressAdapter(inner), { logger: ['error'], bodyParser: false });
  await app.init();
  nest = app;
  nestHandler = inner;
  await old?.close();
}

const staticOptions = {
  setHeaders(res, path) {
    res.setHeader('Cache-Control', 'no-cache');
    if (path.endsWith('.wasm')) res.setHeader('Content-Type', 'application/wasm');
    if (path.endsWith('.js') || path.endsWith('.mjs')) res.setHeader('Content-Type', 'text/javascript; charset=utf-8');
  },
};
server.use(express.static(join(here, 'public'), staticOptions));
server.use(express.static(resolve(args.www), staticOptions));

// Nest handles what the routes and files above did not; a reset mounts a new Nest app (a new
// middleware store) in place of the old one.
let nest = null;
let nestHandler = null;
server.use((req, res, next) => (nestHandler ? nestHandler(req, res, next) : next()));


await restart();
const listener = server.listen(Number(args.port), args.host, () => {
  const { port } = listener.address();
  console.log(`listening on http://127.0.0.1:${port}`);
});
listener.keepAliveTimeout = 0;
process.on('SIGTERM', () => { listener.close(); listener.closeAllConnections(); process.exit(0); });
