// The plain-JS outbox: what a developer writes by hand without a library, as a full subject
// of the benchmark. No dependencies, no build step.
//   enqueue  the fetch handler tries the network; on a network failure it stores
//            {method, path, content type, body bytes} with one readwrite transaction
//            (durability "strict") and answers 202.
//   replay   on a page message: one lane, sequential. Read the oldest record, send it, and
//            delete it after a 2xx; stop at the first network error or non-2xx answer (the
//            record stays queued). Two replays never run at once.
// The next record is read with a cursor that starts after the last key sent, so each step
// seeks past the records already deleted instead of walking over them.
'use strict';
// The benchmark times a worker's start from these User Timing marks (as the product's).
performance.mark('bench:script');
let dbp = null;
function db() {
  dbp = dbp || new Promise((ok, fail) => {
    const r = indexedDB.open('plain-outbox', 1);
    r.onupgradeneeded = () => r.result.createObjectStore('outbox', { keyPath: 'id', autoIncrement: true });
    r.onsuccess = () => ok(r.result);
    r.onerror = () => fail(r.error);
  });
  return dbp;
}
function done(tx) {
  return new Promise((ok, fail) => { tx.oncomplete = ok; tx.onerror = tx.onabort = () => fail(tx.error); });
}
function request(r) {
  return new Promise((ok, fail) => { r.onsuccess = () => ok(r.result); r.onerror = () => fail(r.error); });
}

async function enqueue(record) {
  const tx = (await db()).transaction('outbox', 'readwrite', { durability: 'strict' });
  tx.objectStore('outbox').add(record);
  await done(tx);
}

/** The oldest record with a key above `after` (undefined: the oldest of all), or null. */
async function next(after) {
  const tx = (await db()).transaction('outbox', 'readonly');
  const range = after === undefined ? undefined : IDBKeyRange.lowerBound(after, true);
  const cursor = await request(tx.objectStore('outbox').openCursor(range));
  return cursor ? cursor.value : null;
}

async function remove(id) {
  const tx = (await db()).transaction('outbox', 'readwrite');
  tx.objectStore('outbox').delete(id);
  await done(tx);
}

async function replayOnce() {
  let sent = 0;
  let after;
  for (let rec = await next(after); rec; rec = await next(after)) {
    let res;
    try {
      res = await fetch(rec.path, { method: rec.method, headers: { 'Content-Type': rec.contentType }, body: rec.body });
      await res.arrayBuffer();
    } catch (e) {
      return { ok: false, sent, reason: `network: ${e && e.message}` };
    }
    if (!res.ok) return { ok: false, sent, reason: `status ${res.status}` };
    await remove(rec.id);
    after = rec.id;
    sent += 1;
  }
  return { ok: true, sent };
}

let chain = Promise.resolve();
function replay() {
  const run = chain.then(replayOnce);
  chain = run.catch(() => {});
  return run;
}

async function clearAll() {
  const tx = (await db()).transaction('outbox', 'readwrite', { durability: 'strict' });
  tx.objectStore('outbox').clear();
  await done(tx);
  return { ok: true };
}

async function size() {
  const tx = (await db()).transaction('outbox', 'readonly');
  return { ok: true, size: await request(tx.objectStore('outbox').count()) };
}

self.addEventListener('install', () => { performance.mark('bench:install'); self.skipWaiting(); });
self.addEventListener('activate', (event) => {
  performance.mark('bench:activate');
  event.waitUntil(self.clients.claim().then(() => performance.mark('bench:claimed')));
});

self.addEventListener('message', (event) => {
  const port = event.ports[0];
  const reply = (m) => (port ? port.postMessage(m) : event.source.postMessage(m));
  const op = event.data && event.data.op;
  let work;
  if (op === 'replay') work = replay();
  else if (op === 'clear') work = clearAll();
  else if (op === 'size') work = size();
  else work = Promise.resolve({ ok: false, error: `unknown op ${op}` });
  event.waitUntil(work.then(reply, (e) => reply({ ok: false, error: String(e && e.message || e) })));
});

const WRITES = new Set(['POST', 'PUT', 'PATCH', 'DELETE']);
self.addEventListener('fetch', (event) => {
  const req = event.request;
  const url = new URL(req.url);
  if (url.origin !== self.location.origin || !url.pathname.startsWith('/api/') || !WRITES.has(req.method)) return;
  event.respondWith((async () => {
    const copy = req.clone();
    try {
      return await fetch(req);
    } catch {
      const body = new Uint8Array(await copy.arrayBuffer());
      await enqueue({ method: req.method, path: url.pathname + url.search, contentType: req.headers.get('Content-Type'), body, timestamp: Date.now() });
      return new Response('{"queued":true}', { status: 202, headers: { 'Content-Type': 'application/json' } });
    }
  })());
});

performance.mark('bench:evaluated');
