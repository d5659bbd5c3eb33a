// Benchmark server: node:http, no dependencies. Run as a child process of run.mjs so its
// event loop is not shared with the driver's.
//
// A master port (printed as `bench-server master on http://127.0.0.1:<port>`) creates
// *sites*: POST /site {"roots":[dir,...], "latencyMs":0, "keepAlive":false} → {"port"}. Each
// site is its own origin (its own service worker registration and IndexedDB in the browser)
// and has its own write log:
//
//   GET  <static file>          first root that has it; Cache-Control: no-store
//   GET  /api/auth/me           {"user":{"id":"bench"},"csrfToken":"t"}
//   POST|PUT|PATCH|DELETE /api/… recorded in arrival order (path, Idempotency-Key, body);
//                               a key seen before is answered with the stored answer and
//                               counted as a duplicate attempt, never applied twice.
//                               While the site is "down" the socket is destroyed on arrival:
//                               a network-level failure, not an HTTP answer.
//   POST /__bench/down {"down":bool}   POST /__bench/reset   GET /__bench/log
//   POST /__bench/close         answers, then closes this site's server (frees its log)
//   GET  /__bench/wait?count=N&timeoutMs=T  answers when N writes are applied (or timeout),
//                               with `reachedNs`: process.hrtime (CLOCK_MONOTONIC, shared
//                               with the driver process) of the N-th apply.
//
// latencyMs simulates a round trip for every /api/ request: the answer (or, while the site
// is down, the dropped connection) comes latencyMs after the request arrived; a write is
// applied (and its `ns` taken) when its answer is sent. Static files are not delayed,
// except the page-load row's (/load.html and /load/*), answered loadPageDelayMs after the
// request arrived (run.mjs: 5 ms plus the setting's latency).
//
// keepAlive false (the default): every answer carries `Connection: close`, so each request
// opens a new connection (a dropped connection is then always a fresh network error, never
// a silent retry on a reused socket). keepAlive true: answers keep the connection open, as
// a production server does.
import http from 'node:http';
import { readFile, stat } from 'node:fs/promises';
import { extname, join, normalize, resolve } from 'node:path';

const TYPES = {
  '.html': 'text/html; charset=utf-8', '.js': 'text/javascript; charset=utf-8', '.mjs': 'text/javascript; charset=utf-8',
  '.css': 'text/css', '.json': 'application/json', '.wasm': 'application/wasm', '.svg': 'image/svg+xml',
  '.webmanifest': 'application/manifest+json',
};
const FAULT = process.env.BENCH_FAULT || null; // 'duplicate' | 'drop': only for run.mjs --fault
const WRITE = new Set(['POST', 'PUT', 'PATCH', 'DELETE']);

function send(res, status, body, type = 'application/json') {
  const data = typeof body === 'string' || Buffer.isBuffer(body) ? body : JSON.stringify(body);
  const headers = { 'Content-Type': type, 'Cache-Control': 'no-store', 'Content-Length': Buffer.byteLength(data) };
  if (!res.keepAlive) headers.Connection = 'close';
  res.writeHead(status, headers);
  res.end(data);
}

const delay = (ms) => (ms > 0 ? new Promise((r) => setTimeout(r, ms)) : null);

function readBody(req) {
  return new Promise((ok, fail) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => ok(Buffer.concat(chunks)));
    req.on('error', fail);
  });
}

function newLog() {
  return { applied: [], byKey: new Map(), duplicateAttempts: 0, dropped: 0, attempts: 0, waiters: [] };
}

function createSite(roots, { latencyMs = 0, keepAlive = false, loadPageDelayMs = 0 } = {}) {
  const site = { roots: roots.map((r) => resolve(r)), down: false, log: newLog(), latencyMs, keepAlive, loadPageDelayMs };
  const server = http.createServer(async (req, res) => {
    res.keepAlive = site.keepAlive;
    try {
      const url = new URL(req.url, 'http://x');
      const path = url.pathname;
      if (path.startsWith('/__bench/')) return control(site, req, res, url);
      if (path.startsWith('/api/')) {
        if (WRITE.has(req.method)) {
          if (site.down) {
            site.log.dropped += 1;
            await delay(site.latencyMs);
            req.socket.destroy();
            return;
          }
          return write(site, req, res, url);
        }
        await delay(site.latencyMs);
        if (path === '/api/auth/me') return send(res, 200, { user: { id: 'bench' }, csrfToken: 't' });
        return send(res, 404, { error: 'not found' });
      }
      if (req.method !== 'GET' && req.method !== 'HEAD') return send(res, 405, { error: 'method' });
      if (path === '/load.html' || path.startsWith('/load/')) await delay(site.loadPageDelayMs);
      return staticFile(site, path, res);
    } catch (err) {
      if (!res.headersSent) send(res, 500, { error: String(err) });
    }
  });
  server.keepAliveTimeout = keepAlive ? 60000 : 0;
  site.server = server;
  return { site, server };
}

async function staticFile(site, path, res) {
  const rel = normalize(decodeURIComponent(path)).replace(/^([/\\])+/, '');
  if (rel.split(/[/\\]/).includes('..')) return send(res, 403, { error: 'path' });
  for (const root of site.roots) {
    let file = join(root, rel || 'index.html');
    try {
      if ((await stat(file)).isDirectory()) file = join(file, 'index.html');
      const data = await readFile(file);
      return send(res, 200, data, TYPES[extname(file)] || 'application/octet-stream');
    } catch { /* next root */ }
  }
  return send(res, 404, 'not found', 'text/plain');
}

async function write(site, req, res, url) {
  const log = site.log;
  log.attempts += 1;
  const body = await readBody(req);
  await delay(site.latencyMs);
  const key = req.headers['idempotency-key'] || null;
  if (key && log.byKey.has(key)) {
    log.duplicateAttempts += 1;
    const stored = log.byKey.get(key);
    return send(res, stored.status, stored.body);
  }
  const entry = { i: log.applied.length, method: req.method, path: url.pathname + url.search, key, body: body.toString('utf8'), ns: process.hrtime.bigint() };
  // Self-test of the benchmark's checks (run.mjs --fault=…): a broken server must make it fail.
  log.seen = (log.seen || 0) + 1;
  const faulty = FAULT && log.seen % 7 === 3;
  if (!(faulty && FAULT === 'drop')) log.applied.push(entry);
  if (faulty && FAULT === 'duplicate') log.applied.push({ ...entry, i: log.applied.length });
  const answer = { status: 201, body: JSON.stringify({ ok: true, i: entry.i }) };
  if (key) log.byKey.set(key, answer);
  for (const w of [...log.waiters]) if (log.applied.length >= w.count) w.done();
  return send(res, answer.status, answer.body);
}

async function control(site, req, res, url) {
  const what = url.pathname.slice('/__bench/'.length);
  const body = req.method === 'POST' ? await readBody(req) : Buffer.alloc(0);
  const json = body.length ? JSON.parse(body.toString('utf8')) : {};
  switch (what) {
    case 'down': site.down = !!json.down; return send(res, 200, { down: site.down });
    case 'reset':
      for (const w of site.log.waiters) w.done();
      site.log = newLog();
      return send(res, 200, { ok: true });
    case 'close':
      send(res, 200, { ok: true });
      res.on('finish', () => { site.server.close(); site.server.closeAllConnections(); site.log = newLog(); });
      return undefined;
    case 'now': return send(res, 200, { ns: String(process.hrtime.bigint()) });
    case 'log': {
      const log = site.log;
      const full = url.searchParams.get('full') === '1';
      return send(res, 200, {
        applied: log.applied.length, attempts: log.attempts, duplicateAttempts: log.duplicateAttempts, dropped: log.dropped,
        entries: full ? log.applied.map((e) => ({ i: e.i, method: e.method, path: e.path, key: e.key, body: e.body, ns: String(e.ns) })) : undefined,
        firstNs: log.applied.length ? String(log.applied[0].ns) : null,
        lastNs: log.applied.length ? String(log.applied[log.applied.length - 1].ns) : null,
      });
    }
    case 'wait': {
      const count = Number(url.searchParams.get('count'));
      const timeoutMs = Number(url.searchParams.get('timeoutMs') || 60000);
      const log = site.log;
      const answer = () => send(res, 200, {
        applied: log.applied.length, reached: log.applied.length >= count,
        reachedNs: log.applied.length >= count ? String(log.applied[count - 1].ns) : null,
      });
      if (log.applied.length >= count) return answer();
      await new Promise((done) => {
        const w = { count, done: () => { clearTimeout(timer); log.waiters.splice(log.waiters.indexOf(w), 1); done(); } };
        const timer = setTimeout(() => w.done(), timeoutMs);
        log.waiters.push(w);
      });
      return answer();
    }
    default: return send(res, 404, { error: 'no such control' });
  }
}

function listen(server) {
  return new Promise((ok) => server.listen(0, '127.0.0.1', () => ok(server.address().port)));
}

async function main() {
  const sites = [];
  const master = http.createServer(async (req, res) => {
    try {
      if (req.method === 'POST' && req.url === '/site') {
        const { roots, latencyMs, keepAlive, loadPageDelayMs } = JSON.parse((await readBody(req)).toString('utf8'));
        const s = createSite(roots, { latencyMs: Number(latencyMs) || 0, keepAlive: !!keepAlive, loadPageDelayMs: Number(loadPageDelayMs) || 0 });
        const port = await listen(s.server);
        sites.push(s);
        return send(res, 200, { port });
      }
      if (req.url === '/quit') { send(res, 200, { ok: true }); setTimeout(() => process.exit(0), 10); return; }
      return send(res, 404, { error: 'no' });
    } catch (err) { send(res, 500, { error: String(err) }); }
  });
  master.keepAliveTimeout = 0;
  const port = await listen(master);
  console.log(`bench-server master on http://127.0.0.1:${port}`);
}

main();
