// Firefox: the outbox worker installs, activates and controls the demo, precaches its
// shell, answers commands, and refuses malformed ones with a reason naming the field.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import {
  freshStart, listQueue, queuedWrite, send, signIn, startHarness, withDiagnostics,
} from './harness.mjs';

let h;
before(async () => { h = await startHarness(); });
after(async () => { await h?.close(); });

test('the worker installs, activates and controls the page', withDiagnostics(() => h, async () => {
  await h.openDemo();
  const state = await h.evaluate(async () => {
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
  // The app shell and the module itself were precached at install.
  assert.equal(state.caches.filter((n) => n.startsWith('sw-outbox-')).length, 1, JSON.stringify(state.caches));
  for (const path of ['/', '/app.js', '/outbox-client.js', '/pkg/sw_outbox_bg.wasm', '/pkg/sw_outbox.js']) {
    assert.ok(state.cached.includes(path), `${path} precached: ${JSON.stringify(state.cached)}`);
  }

  const qs = await send(h, { type: 'LIST_QUEUE', requestId: 7 });
  assert.deepEqual(qs, { type: 'QUEUE_STATE', records: [], requestId: 7 }, 'LIST_QUEUE answered with its requestId');
}));

test('a malformed command is answered ok:false with a reason naming the field, and changes nothing', withDiagnostics(() => h, async () => {
  await freshStart(h);
  await signIn(h, 'alice');
  await h.setNetwork(false);
  const q = await queuedWrite(h, '/api/projects/p1/tasks', { title: 'kept' });
  const before = await listQueue(h);
  assert.deepEqual(before.map((r) => [r.id, r.ownerId, r.state]), [[q.id, 'alice', 'queued']]);

  const cases = [
    [{ type: 'RECOVER_RECORD', id: 'x', ownerId: 'alice', action: 'discard' }, 'RECOVER_RECORD', /\bid\b/],
    [{ type: 'RECOVER_RECORD', id: q.id, ownerId: 'alice', action: 'explode' }, 'RECOVER_RECORD', /\baction\b/],
    [{ type: 'REBIND_RECORDS', ownerId: 'alice', ids: 'all' }, 'REBIND_RECORDS', /\bids\b/],
    [{ type: 'AUTH_SESSION', userId: 5 }, 'AUTH_SESSION', /\buserId\b/],
    [{ type: 'FLUSH_EVERYTHING' }, 'FLUSH_EVERYTHING', /\btype\b/],
    [{ kind: 'FLUSH_QUEUE' }, null, /\btype\b/],
  ];
  for (const [message, command, field] of cases) {
    const r = await send(h, message);
    const what = `${JSON.stringify(message)} → ${JSON.stringify(r)}`;
    assert.equal(r.type, 'COMMAND_RESULT', what);
    assert.equal(r.ok, false, what);
    assert.equal(r.command, command, `command holds the type as sent: ${what}`);
    assert.equal(typeof r.reason, 'string', what);
    assert.match(r.reason, field, `the reason names the field: ${what}`);
  }
  assert.deepEqual(await listQueue(h), before, 'the queue is unchanged');

  // The refused AUTH_SESSION changed nothing: a write without the page's header is still alice's.
  const next = await h.evaluate(() => fetch('/api/notes', {
    method: 'POST', headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': window.demo.state.csrf },
    body: JSON.stringify({ text: 'bound by the worker' }),
  }).then((r) => r.json()));
  await h.setNetwork(true);
  assert.equal(next.queued, true, JSON.stringify(next));
  const rec = (await listQueue(h)).find((r) => r.id === next.id);
  assert.equal(rec?.ownerId, 'alice', `the session is still alice: ${JSON.stringify(rec)}`);
}));
