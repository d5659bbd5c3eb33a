// Every engine: the outbox worker installs, activates and controls the demo, precaches
// its shell and answers commands (malformed ones: recovery.test.mjs).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { forEachEngine, send, withDiagnostics } from './outbox-helpers.mjs';

forEachEngine((engine, harness) => {
  test('the worker installs, activates and controls the page', withDiagnostics(harness, async () => {
    const h = harness();
    const page = await h.openDemo();
    const state = await page.evaluate(async () => {
      const reg = await navigator.serviceWorker.getRegistration('/');
      const names = await caches.keys();
      const shell = names.find((n) => n.startsWith('sw-outbox-'));
      const cached = shell ? (await (await caches.open(shell)).keys()).map((r) => new URL(r.url).pathname) : [];
      return {
        controller: navigator.serviceWorker.controller?.scriptURL ?? null,
        controllerState: navigator.serviceWorker.controller?.state ?? null,
        active: reg?.active?.scriptURL ?? null,
        activeState: reg?.active?.state ?? null,
        scope: reg?.scope ?? null,
        caches: names,
        cached,
        status: document.querySelector('[data-testid="worker-status"]').textContent,
      };
    });
    assert.equal(new URL(state.controller ?? 'x:').pathname, '/sw.js', JSON.stringify(state));
    assert.equal(state.controllerState, 'activated', JSON.stringify(state));
    assert.equal(state.active, state.controller, 'the controller is the registration\'s active worker');
    assert.equal(state.activeState, 'activated');
    assert.equal(state.scope, `${h.baseUrl}/`);
    assert.equal(state.status, 'outbox: active', 'the demo shows the outbox active');
    // The app shell was precached at install; the runtime came with the worker's scripts.
    assert.equal(state.caches.filter((n) => n.startsWith('sw-outbox-')).length, 1, JSON.stringify(state.caches));
    for (const path of ['/', '/app.js', '/outbox-client.js']) {
      assert.ok(state.cached.includes(path), `${path} precached: ${JSON.stringify(state.cached)}`);
    }
    assert.deepEqual(state.cached.filter((p) => p.startsWith('/pkg/')), [], 'no runtime file in Cache Storage');

    const qs = await send(page, { type: 'LIST_QUEUE', requestId: 7 });
    assert.deepEqual(qs, {
      type: 'QUEUE_STATE', records: [], delivery: { stoppedBy: null, retryAt: null, lastAttemptAt: null }, account: null, requestId: 7,
    }, 'LIST_QUEUE answered with its requestId (an empty queue: nothing stalled; nobody signed in yet)');
  }));
});
