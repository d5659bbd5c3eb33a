// Raw limit: what the browser itself costs, measured inside a service worker of the same
// browser. On a message it runs one loop and reports per-operation times:
//   idb-strict  N sequential adds, one readwrite transaction each, durability "strict"
//   idb-default the same with the browser's default durability
//   idb-one     N adds in one readwrite transaction (default durability)
//   post        N POSTs to the live server, `lanes` at a time (1 = sequential)
//   post-fail   N POSTs while the server drops connections: the cost of the failed attempt
//   busy        a fixed tight loop (no I/O): how fast this worker's thread runs, so a run can
//               check that a CPU slowdown really reaches the service worker thread
// (The plain-JS outbox subject is plain-outbox-sw.js; this worker has no fetch handler.)
'use strict';
let dbp = null;
function db() {
  dbp = dbp || new Promise((ok, fail) => {
    const r = indexedDB.open('raw-limit', 1);
    r.onupgradeneeded = () => {
      r.result.createObjectStore('loop', { keyPath: 'id', autoIncrement: true });
    };
    r.onsuccess = () => ok(r.result);
    r.onerror = () => fail(r.error);
  });
  return dbp;
}
function done(tx) {
  return new Promise((ok, fail) => { tx.oncomplete = ok; tx.onerror = tx.onabort = () => fail(tx.error); });
}
function add(d, store, value, durability) {
  const tx = d.transaction(store, 'readwrite', durability ? { durability } : undefined);
  tx.objectStore(store).add(value);
  return done(tx);
}
function clearStore(d, store) {
  const tx = d.transaction(store, 'readwrite', { durability: 'strict' });
  tx.objectStore(store).clear();
  return done(tx);
}
const value = (i, bytes) => ({ path: `/raw/${i}`, body: new Uint8Array(bytes), timestamp: Date.now() });

/** A fixed amount of pure computation (integer mixing), timed on this thread. */
function busy(iterations) {
  const t0 = performance.now();
  let h = 0x811c9dc5;
  for (let i = 0; i < iterations; i++) h = Math.imul(h ^ i, 0x01000193) >>> 0;
  return { ms: performance.now() - t0, h };
}

async function loop({ op, n, bytes = 1024, lanes = 1, iterations = 2e7 }) {
  if (op === 'busy') return { ok: true, op, ...busy(iterations) };
  const d = await db();
  await clearStore(d, 'loop');
  const per = [];
  const t0 = performance.now();
  if (op === 'idb-strict' || op === 'idb-default') {
    for (let i = 0; i < n; i++) {
      const t = performance.now();
      await add(d, 'loop', value(i, bytes), op === 'idb-strict' ? 'strict' : undefined);
      per.push(performance.now() - t);
    }
  } else if (op === 'idb-one') {
    const tx = d.transaction('loop', 'readwrite');
    const store = tx.objectStore('loop');
    for (let i = 0; i < n; i++) store.add(value(i, bytes));
    await done(tx);
  } else if (op === 'post' || op === 'post-fail') {
    // post-fail: the server drops every connection; each fetch must reject (network error).
    let next = 0;
    const body = 'x'.repeat(bytes);
    const lane = async () => {
      while (next < n) {
        const i = next++;
        const t = performance.now();
        let failed = false;
        try {
          const res = await fetch(`/api/raw/lane/${i % lanes}`, { method: 'POST', headers: { 'Content-Type': 'text/plain' }, body });
          await res.arrayBuffer();
        } catch (e) { failed = true; }
        if (failed !== (op === 'post-fail')) throw new Error(`${op}: request ${i} ${failed ? 'failed' : 'succeeded'}`);
        per.push(performance.now() - t);
      }
    };
    await Promise.all(Array.from({ length: lanes }, lane));
  } else throw new Error(`unknown op ${op}`);
  const totalMs = performance.now() - t0;
  await clearStore(d, 'loop');
  return { ok: true, op, n, lanes, totalMs, per };
}

self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (event) => event.waitUntil(self.clients.claim()));

self.addEventListener('message', (event) => {
  const port = event.ports[0];
  const reply = (m) => (port ? port.postMessage(m) : event.source.postMessage(m));
  const m = event.data || {};
  const work = loop(m);
  event.waitUntil(work.then(reply, (e) => reply({ ok: false, error: String(e && e.message || e) })));
});
