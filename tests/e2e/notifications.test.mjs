// Delivery notifications, opt-in per account: after a background flush (here the
// Background Sync event, dispatched through CDP) that sent queued changes while no page
// of the app was open, the worker shows one notification with no user content; with a
// page open it shows none (the page has the reports).
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { startHarness } from './harness.mjs';
import { eventually, queuedWrite, signIn, withDiagnostics } from './outbox-helpers.mjs';

let h;
before(async () => { h = await startHarness(); });
after(async () => { await h?.close(); });

/** A CDP session on a blank tab (not a client of the app) that can fire sync events. */
async function syncDispatcher(blank) {
  const cdp = await h.context.newCDPSession(blank);
  const registrations = [];
  cdp.on('ServiceWorker.workerRegistrationUpdated', (e) => registrations.push(...e.registrations));
  await cdp.send('ServiceWorker.enable');
  return {
    async fire(tag) {
      const reg = await eventually(() => registrations.find((r) => r.scopeURL.startsWith(h.baseUrl) && !r.isDeleted),
        { what: 'the outbox registration' });
      await cdp.send('ServiceWorker.dispatchSyncEvent', {
        origin: h.baseUrl, registrationId: reg.registrationId, tag, lastChance: false,
      });
    },
  };
}

/** The notifications the worker's registration currently shows. */
function shown(page) {
  return page.evaluate(async () => {
    const reg = await navigator.serviceWorker.ready;
    return (await reg.getNotifications()).map((n) => ({ title: n.title, body: n.body, tag: n.tag }));
  });
}

test('a background flush with no page open shows one content-free notification, for an opted-in account',
  withDiagnostics(() => h, async () => {
    await h.context.grantPermissions(['notifications'], { origin: h.baseUrl });
    const page = await h.openDemo();
    await signIn(page, 'alice');
    const on = await page.evaluate(() => window.demo.client.enableNotifications('alice'));
    assert.equal(on.ok, true, JSON.stringify(on));
    const refused = await page.evaluate(() => window.demo.client.enableNotifications('bob'));
    assert.equal(refused.ok, false, 'only the signed-in account may opt in');

    await h.setNetwork(false);
    const w = await queuedWrite(page, '/api/projects/p1/tasks', { title: 'secret title' });
    const blank = await h.context.newPage();
    const sync = await syncDispatcher(blank);
    await page.close();
    await h.setNetwork(true);
    // A sync that lands inside the backoff left by the failed attempt while offline is
    // refused (the browser would retry it later): fire again until it runs.
    await eventually(async () => {
      if ((await h.applied()).length >= 1) return true;
      await sync.fire('sw-outbox');
      return (await h.applied()).length >= 1;
    }, { interval: 500, what: 'the background flush to apply the write' });
    assert.equal((await h.applied())[0].key, w.key);

    const again = await h.openDemo({ page: await h.context.newPage() });
    const notes = await eventually(async () => { const n = await shown(again); return n.length ? n : null; },
      { what: 'the notification' });
    assert.equal(notes.length, 1, JSON.stringify(notes));
    assert.equal(notes[0].body, '1 queued change was sent');
    assert.ok(!JSON.stringify(notes).includes('secret'), 'no user content in the notification');
    await again.evaluate(async () => {
      for (const n of await (await navigator.serviceWorker.ready).getNotifications()) n.close();
    });

    // With a window open the page gets the reports: no notification.
    await h.setNetwork(false);
    await queuedWrite(again, '/api/projects/p1/tasks', { title: 'second' });
    await h.setNetwork(true);
    // A sync that lands inside the backoff left by the failed attempt while offline is
    // refused (the browser would retry it later): fire again until it runs.
    await eventually(async () => {
      if ((await h.applied()).length >= 2) return true;
      await sync.fire('sw-outbox');
      return (await h.applied()).length >= 2;
    }, { interval: 500, what: 'the second write applied' });
    assert.deepEqual(await shown(again), [], 'no notification while a page is open');

    // Opted out: nothing either, even with no page open.
    const off = await again.evaluate(() => window.demo.client.disableNotifications('alice'));
    assert.equal(off.ok, true);
    await h.setNetwork(false);
    await queuedWrite(again, '/api/projects/p2/tasks', { title: 'third' });
    await again.close();
    await h.setNetwork(true);
    // A sync that lands inside the backoff left by the failed attempt while offline is
    // refused (the browser would retry it later): fire again until it runs.
    await eventually(async () => {
      if ((await h.applied()).length >= 3) return true;
      await sync.fire('sw-outbox');
      return (await h.applied()).length >= 3;
    }, { interval: 500, what: 'the third write applied' });
    const last = await h.openDemo({ page: await h.context.newPage() });
    assert.deepEqual(await shown(last), [], 'an opted-out account gets no notification');
    await blank.close();
  }));
