// Raw limit: what the browser itself costs, measured inside a service worker of the same
// browser. On a message it runs one loop and reports per-operation times:
//   idb-strict  N sequential adds, one readwrite transaction each, durability "strict"
//   idb-default the same with the browser's default durability
//   idb-one     N adds in one readwrite transaction (default durability)
//   post        N POSTs to the live server, `lanes` at a time (1 = sequential)
//   post-fail   N POSTs while the server drops connections: the cost of the failed attempt
// Its fetch handler is also a minimal plain-JS outbox (the floor for enqueue): try the
// network; on a network failure store {path, body bytes} with one strict transaction, 202.
'use strict';
let dbp = null;
function db() {
  dbp = dbp || new Promise((ok, fail) => {
    const r = indexedDB.open('raw-limit', 1);
    r.onupgradeneeded = () => {
      r.result.createObjectStore('loop', { keyPath: 'id', autoIncrement: true });
      r.result.createObjectStore('outbox', { keyPath: 'id', autoIncrement: true });
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

async function loop({ op, n, bytes = 1024, lanes = 1 }) {
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
  let work;
  if (m.op === 'clear') work = db().then((d) => clearStore(d, 'outbox')).then(() => ({ ok: true }));
  else work = loop(m);
  event.waitUntil(work.then(reply, (e) => reply({ ok: false, error: String(e && e.message || e) })));
});

const WRITES = new Set(['POST', 'PUT', 'PATCH', 'DELETE']);
self.addEventListener('fetch', (event) => {
  const request = event.request;
  const url = new URL(request.url);
  if (url.origin !== self.location.origin || !url.pathname.startsWith('/api/') || !WRITES.has(request.method)) return;
  event.respondWith((async () => {
    const copy = request.clone();
    try {
      return await fetch(request);
    } catch {
      const body = new Uint8Array(await copy.arrayBuffer());
      await add(await db(), 'outbox', { path: url.pathname + url.search, body, timestamp: Date.now() }, 'strict');
      return new Response('{"queued":true}', { status: 202, headers: { 'Content-Type': 'application/json' } });
    }
  })());
});
