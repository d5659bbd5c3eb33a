// Firefox (the engine that fires `online` in workers and has an offline switch): only the
// active version of a registration flushes (contract 4.5, r4; issue 34, item 2). A new
// version installed beside the running one waits (`skipWaiting: false`); when the network
// comes back both get the worker's `online` event, and only the active one may start a
// flush. The waiting version is told apart by its own `authMePath` (`/api/auth/me?v=2`):
// any request to it is a flush of the waiting version.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { lacks } from './engines.mjs';
import { eventually, forEachEngine, openWith, queuedWrite, withDiagnostics } from './outbox-helpers.mjs';

const P1 = '/api/projects/p1/tasks';

forEachEngine((engine, harness) => {
  const skip = engine !== 'firefox'
    ? `${engine}: only Firefox both fires \`online\` in a worker and lets a test switch the browser offline (Chromium fires none in workers; WebKit has no offline switch)`
    : lacks(engine, 'setOffline');
  test('an installed version waiting beside the active one starts no flush on `online`', { skip },
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openWith(h, { skipWaiting: false, precache: [] });
      // The next version: another script URL on the same scope, its own authMePath.
      const next = await page.evaluate(async () => {
        const config = encodeURIComponent(JSON.stringify({ skipWaiting: false, precache: [], authMePath: '/api/auth/me?v=2' }));
        const reg = await navigator.serviceWorker.register(`/sw.js?config=${config}`, { scope: '/' });
        const w = reg.installing || reg.waiting;
        if (w && w.state !== 'installed') {
          await new Promise((res) => w.addEventListener('statechange', () => { if (w.state === 'installed' || w.state === 'redundant') res(); }));
        }
        return { waiting: Boolean(reg.waiting), active: reg.active?.scriptURL ?? null };
      });
      assert.equal(next.waiting, true, `the next version waits: ${JSON.stringify(next)}`);
      await h.setOffline(true);
      const w = await queuedWrite(page, P1, { title: 'queued while both versions run' });
      const seq = (await h.requests()).length;
      await h.setOffline(false);
      await eventually(async () => (await h.applied()).some((x) => x.key === w.key),
        { timeout: 30000, what: 'the active version\'s flush on online' });
      // The waiting version's own flush would follow the active one's (the queue's lock):
      // give it that time, then look.
      await new Promise((r) => setTimeout(r, 3000));
      const rs = (await h.requests()).slice(seq);
      assert.deepEqual(rs.filter((r) => r.path.includes('v=2')), [], 'the waiting version checked an identity: it flushed');
      assert.ok(rs.some((r) => r.path === '/api/auth/me'), 'the active version flushed');
      assert.equal(await page.evaluate(async () => Boolean((await navigator.serviceWorker.getRegistration('/')).waiting)), true,
        'still waiting');
    }));
}, { name: 'active version' });
