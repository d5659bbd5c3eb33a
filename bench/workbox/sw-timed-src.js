// Workbox subject with timing, for bench/workbox-history.mjs only: the same Queue and fetch
// handler as sw-src.js, plus the time of each shiftRequest() and each replayed fetch(), and
// a "churn" message that queues and then removes records (in the worker, no page fetches)
// to give the database the history a long benchmark run gave it.
import { Queue } from 'workbox-background-sync';

const timing = { shift: [], fetch: [], on: false };
let chain = Promise.resolve();
function replayOnce(queue) {
  chain = chain.catch(() => {}).then(() => queue.replayRequests());
  return chain;
}
const queue = new Queue('bench', { onSync: ({ queue: q }) => replayOnce(q) });

const shift = queue.shiftRequest.bind(queue);
queue.shiftRequest = async () => {
  const t = performance.now();
  const entry = await shift();
  if (timing.on) timing.shift.push(performance.now() - t);
  return entry;
};
const networkFetch = self.fetch.bind(self);
self.fetch = async (...args) => {
  const t = performance.now();
  try { return await networkFetch(...args); } finally { if (timing.on) timing.fetch.push(performance.now() - t); }
};

self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (event) => event.waitUntil(self.clients.claim()));

self.addEventListener('fetch', (event) => {
  const request = event.request;
  const url = new URL(request.url);
  if (url.origin !== self.location.origin || !url.pathname.startsWith('/api/') || request.method !== 'POST') return;
  event.respondWith((async () => {
    const copy = request.clone();
    try {
      return await networkFetch(request);
    } catch {
      await queue.pushRequest({ request: copy });
      return new Response(JSON.stringify({ queued: true }), { status: 202, headers: { 'Content-Type': 'application/json' } });
    }
  })());
});

async function churn({ count, batch, bytes }) {
  const body = 'x'.repeat(bytes);
  const t0 = performance.now();
  for (let done = 0; done < count; done += batch) {
    for (let i = 0; i < batch; i++) {
      await queue.pushRequest({ request: new Request('/api/churn', { method: 'POST', body, headers: { 'Content-Type': 'text/plain' } }) });
    }
    while (await shift());
  }
  return { ok: true, ms: performance.now() - t0 };
}

async function replayTimed() {
  timing.shift = []; timing.fetch = []; timing.on = true;
  const t0 = performance.now();
  try { await replayOnce(queue); } finally { timing.on = false; }
  return { ok: true, ms: performance.now() - t0, shift: timing.shift, fetch: timing.fetch };
}

self.addEventListener('message', (event) => {
  const port = event.ports[0];
  const op = event.data && event.data.op;
  let work;
  if (op === 'replay') work = replayTimed();
  else if (op === 'churn') work = chain.catch(() => {}).then(() => churn(event.data));
  else if (op === 'size') work = chain.catch(() => {}).then(() => queue.size()).then((size) => ({ ok: true, size }));
  else work = Promise.resolve({ ok: false, error: `unknown op ${op}` });
  event.waitUntil(work.then((m) => port.postMessage(m), (e) => port.postMessage({ ok: false, error: String(e && e.message || e) })));
});
