// The per-fetch-event floor (issue 36, 5): a worker that answers every API write 202 from
// memory, storing nothing. What is left of a write's time here is the browser's own work
// around one fetch event (dispatch to the worker, the request body read, the answer
// handed back), which every outbox in a service worker pays; row 2 reports the product's
// writes/s as a fraction of this one's.
'use strict';
self.addEventListener('install', () => { performance.mark('bench:install'); self.skipWaiting(); });
self.addEventListener('activate', (event) => {
  event.waitUntil(self.clients.claim().then(() => performance.mark('bench:claimed')));
});
self.addEventListener('fetch', (event) => {
  const request = event.request;
  const url = new URL(request.url);
  if (url.origin !== self.location.origin || !url.pathname.startsWith('/api/') || request.method !== 'POST') return;
  // The body is read, as an outbox must read it to store it.
  event.respondWith(request.arrayBuffer().then(() => new Response('{"queued":true}', {
    status: 202, headers: { 'Content-Type': 'application/json' },
  })));
});
