// The page side of the benchmark, the same for every subject. `?subject=` picks how the
// worker is registered and told to replay; everything timed here uses performance.now()
// in the page: a fetch() until its response body was read.
const params = new URLSearchParams(location.search);
const subject = params.get('subject');

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Registers `url` and resolves once an activated worker controls this page. Woken by
 * each worker's state change as well as `controllerchange`: a worker that claims the page
 * before its activation ends is `activated` only after the `controllerchange`, and
 * waiting out a poll interval then would be timed as the subject's. */
async function registerAndControl(url) {
  const container = navigator.serviceWorker;
  const reg = await container.register(url, { scope: '/' });
  for (;;) {
    if (reg.active?.state === 'activated' && container.controller) return reg;
    await new Promise((r) => {
      const t = setTimeout(r, 50);
      const wake = () => { clearTimeout(t); r(); };
      container.addEventListener('controllerchange', wake, { once: true });
      for (const w of [reg.installing, reg.waiting, reg.active]) w?.addEventListener('statechange', wake, { once: true });
    });
  }
}

function call(message, timeoutMs = 600000) {
  return new Promise((resolve, reject) => {
    const ch = new MessageChannel();
    const timer = setTimeout(() => reject(new Error(`no answer to ${message.op}`)), timeoutMs);
    ch.port1.onmessage = (e) => { clearTimeout(timer); resolve(e.data); };
    navigator.serviceWorker.controller.postMessage(message, [ch.port2]);
  });
}

let client = null; // the product's OutboxClient

const adapters = {
  product: {
    // The page helper is loaded before the clock starts (`preload`): a site's page has its
    // own script loaded when it registers, as the peers' pages here have theirs.
    preload: () => import('/outbox-client.js'),
    async register(url) {
      const { registerOutbox } = await import('/outbox-client.js');
      client = await registerOutbox({ scriptUrl: url, timeoutMs: 60000, commandTimeoutMs: 600000 });
      await client.controlled;
    },
    async ready() {
      const r = await client.authSession('bench');
      if (!r.ok) throw new Error(`AUTH_SESSION refused: ${JSON.stringify(r)}`);
    },
    async replay() {
      // FLUSH_QUEUE until one replays nothing: a flush stops handing out records after
      // flushBudgetMs (25 s), so a long queue takes several.
      const flushes = [];
      for (;;) {
        const r = await client.flush();
        flushes.push(r.affected ?? null);
        if (!r.ok) return { ok: false, flushes, reason: r.reason };
        if (!r.affected) return { ok: true, flushes };
      }
    },
    async clear() {
      const r = await client.clearDevice();
      if (!r.ok) throw new Error(`CLEAR_DEVICE refused: ${JSON.stringify(r)}`);
      await adapters.product.ready(); // CLEAR_DEVICE also forgets the session
    },
    async size() { return (await client.list()).records.length; },
  },
  workbox: {
    async register(url) { await registerAndControl(url); },
    async ready() {},
    async replay() { return call({ op: 'replay' }); },
    async clear() { const r = await call({ op: 'clear' }); if (!r.ok) throw new Error(r.error); },
    async size() { return (await call({ op: 'size' })).size; },
  },
  // The plain-JS outbox (bench/raw/plain-outbox-sw.js): a message runs its replay.
  plain: {
    async register(url) { await registerAndControl(url); },
    async ready() {},
    async replay() { return call({ op: 'replay' }); },
    async clear() { const r = await call({ op: 'clear' }); if (!r.ok) throw new Error(r.error); },
    async size() { return (await call({ op: 'size' })).size; },
  },
  // The per-fetch-event floor (bench/raw/floor-sw.js): every write answered 202 from
  // memory, nothing stored, nothing to replay.
  floor: {
    async register(url) { await registerAndControl(url); },
    async ready() {},
    async replay() { return { ok: false, reason: 'the floor worker stores nothing' }; },
    async clear() {},
    async size() { return null; },
  },
  // The raw-limit worker (bench/raw/raw-sw.js): loops only, no outbox.
  raw: {
    async register(url) { await registerAndControl(url); },
    async ready() {},
    async replay() { return { ok: false, reason: 'the raw-limit worker has no outbox' }; },
    async clear() {},
    async size() { return null; },
  },
};
const adapter = adapters[subject];

function bodyFor(run, ws, seq, bytes) {
  const head = JSON.stringify({ run, ws, seq, pad: '' });
  return JSON.stringify({ run, ws, seq, pad: 'x'.repeat(Math.max(0, bytes - head.length)) });
}

async function write(path, body) {
  const t = performance.now();
  const res = await fetch(path, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body });
  await res.arrayBuffer();
  return { ms: performance.now() - t, status: res.status, at: performance.timeOrigin + t };
}

window.bench = {
  subject,
  async register(url) {
    await adapter.preload?.();
    const t0 = performance.now();
    await adapter.register(url);
    const ms = performance.now() - t0;
    await adapter.ready();
    return { ms, at: performance.timeOrigin + t0 };
  },
  ready: () => adapter.ready(),
  clear: () => adapter.clear(),
  size: () => adapter.size(),
  call,
  /** n writes one after another; per-write times and statuses. */
  async sequential({ n, run, bytes = 1024, ws = 'seq' }) {
    const ms = []; const statuses = {}; const at = [];
    for (let i = 0; i < n; i++) {
      const r = await write(`/api/projects/${ws}/tasks`, bodyFor(run, ws, i, bytes));
      ms.push(r.ms); at.push(r.at); statuses[r.status] = (statuses[r.status] || 0) + 1;
    }
    return { ms, statuses, at };
  },
  /** n writes, `inFlight` at a time; total time and statuses. */
  async concurrent({ n, inFlight, run, bytes = 1024, ws = 'conc' }) {
    let next = 0; const statuses = {};
    const t0 = performance.now();
    await Promise.all(Array.from({ length: inFlight }, async () => {
      while (next < n) {
        const i = next++;
        const r = await write(`/api/projects/${ws}/tasks`, bodyFor(run, ws, i, bytes));
        statuses[r.status] = (statuses[r.status] || 0) + 1;
      }
    }));
    return { totalMs: performance.now() - t0, statuses };
  },
  /** n writes over `workspaces` workspaces w0..: one lane per workspace, so each
   *  workspace's writes are queued in their seq order. */
  async fill({ n, workspaces, run, bytes = 1024 }) {
    const statuses = {};
    const t0 = performance.now();
    await Promise.all(Array.from({ length: workspaces }, async (_, w) => {
      let seq = 0;
      for (let i = w; i < n; i += workspaces) {
        const r = await write(`/api/projects/w${w}/tasks`, bodyFor(run, `w${w}`, seq++, bytes));
        statuses[r.status] = (statuses[r.status] || 0) + 1;
      }
    }));
    return { totalMs: performance.now() - t0, statuses };
  },
  replay: () => adapter.replay(),
  /** Unregisters this origin's worker, so it stops once the page is closed. */
  async unregister() {
    const reg = await navigator.serviceWorker.getRegistration('/');
    return reg ? reg.unregister() : false;
  },
  /** The same tight loop as the raw worker's `busy`, timed on the page's thread. */
  busy(iterations = 2e7) {
    const t0 = performance.now();
    let h = 0x811c9dc5;
    for (let i = 0; i < iterations; i++) h = Math.imul(h ^ i, 0x01000193) >>> 0;
    return { ms: performance.now() - t0, h };
  },
  sleep,
};
window.benchReady = true;
