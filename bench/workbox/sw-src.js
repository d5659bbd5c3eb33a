// Workbox subject: workbox-background-sync's Queue, the way its docs use it (a fetch handler
// that calls pushRequest when the network fails; replayRequests as the sync handler), with
// one addition for the benchmark: the page can start the replay by a message, and replays
// are serialized (a `sync` event and the message never run replayRequests() concurrently,
// which would send records twice). The browser fires the first `sync` right after the first
// pushRequest, since it believes it is online; that attempt fails against the down server,
// the record goes back, and Chromium retries only minutes later.
// Bundled by run.mjs with esbuild (minified, NODE_ENV=production) into bench/out/workbox/.
// Note: Workbox commits each queued request in its own readwrite transaction with
// durability "relaxed" (lib/QueueDb.js), and answers 202 here only after pushRequest resolved.
import { Queue } from 'workbox-background-sync';

// The benchmark times a worker's start from these User Timing marks (as the product's).
performance.mark('bench:script');

let chain = Promise.resolve();
function replayOnce(queue) {
  chain = chain.catch(() => {}).then(() => queue.replayRequests());
  return chain;
}

const queue = new Queue('bench', { onSync: ({ queue: q }) => replayOnce(q), maxRetentionTime: 7 * 24 * 60 });

self.addEventListener('install', () => { performance.mark('bench:install'); self.skipWaiting(); });
self.addEventListener('activate', (event) => {
  performance.mark('bench:activate');
  event.waitUntil(self.clients.claim().then(() => performance.mark('bench:claimed')));
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
      await queue.pushRequest({ request: copy });
      return new Response(JSON.stringify({ queued: true }), { status: 202, headers: { 'Content-Type': 'application/json' } });
    }
  })());
});

self.addEventListener('message', (event) => {
  const port = event.ports[0];
  const reply = (m) => (port ? port.postMessage(m) : event.source.postMessage(m));
  const op = event.data && event.data.op;
  let work;
  if (op === 'replay') work = replayOnce(queue).then(() => ({ ok: true }));
  else if (op === 'clear') work = (async () => { let n = 0; while (await queue.shiftRequest()) n += 1; return { ok: true, cleared: n }; })();
  // (after any replay in progress: a sync event's attempt holds one shifted record meanwhile)
  else if (op === 'size') work = chain.catch(() => {}).then(() => queue.size()).then((size) => ({ ok: true, size }));
  else work = Promise.resolve({ ok: false, error: `unknown op ${op}` });
  event.waitUntil(work.then(reply, (e) => reply({ ok: false, error: String(e && e.message || e) })));
});

performance.mark('bench:evaluated');
