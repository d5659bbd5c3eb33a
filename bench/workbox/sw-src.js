// Workbox subject: workbox-background-sync's Queue, the way its docs use it, with one
// addition for the benchmark: replays are serialized (a `sync` event and the page's
// "replay" message never run replayRequests() concurrently, which would send records twice).
// Bundled by run.mjs with esbuild (minified, NODE_ENV=production) into bench/out/workbox/.
// Note: Workbox commits each queued request in its own readwrite transaction with
// durability "relaxed" (lib/QueueDb.js), and answers 202 here only after pushRequest resolved.
import { Queue } from 'workbox-background-sync';

let chain = Promise.resolve();
function replayOnce(queue) {
  chain = chain.catch(() => {}).then(() => queue.replayRequests());
  return chain;
}

const queue = new Queue('bench', { onSync: ({ queue: q }) => replayOnce(q), maxRetentionTime: 7 * 24 * 60 });

self.addEventListener('install', () => self.skipWaiting());
self.addEventListener('activate', (event) => event.waitUntil(self.clients.claim()));

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
  else if (op === 'size') work = queue.size().then((size) => ({ ok: true, size }));
  else work = Promise.resolve({ ok: false, error: `unknown op ${op}` });
  event.waitUntil(work.then(reply, (e) => reply({ ok: false, error: String(e && e.message || e) })));
});
