// Delivery notifications, opt-in per account: after a background flush (Chromium: the
// Background Sync event through CDP; Firefox: the worker's own `online` event, the
// browser switched offline and back) that sent queued changes while no page of the app
// was open, the worker shows one notification with no user content (none with a page
// open, none for an account that opted out). A click on it, made
// by the browser's automation on the notification the browser itself shows (Firefox's
// alert window, clicked with a WebDriver pointer action), reaches the worker as a real
// `notificationclick`: it opens the app at `notificationUrl` when no window of it is
// open, and otherwise opens none (it focuses the open one).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { lacks } from './engines.mjs';
import { eventually, forEachEngine, queuedWrite, send, signIn, withDiagnostics } from './outbox-helpers.mjs';

/** The notifications the worker's registration currently shows. */
const shown = (page) => page.evaluate(async () => {
  const reg = await navigator.serviceWorker.ready;
  return (await reg.getNotifications()).map((n) => ({ title: n.title, body: n.body, tag: n.tag }));
});

forEachEngine((engine, harness) => {
  /**
   * Queues one write from a signed-in, opted-in app page, closes every app page (a blank
   * tab stays), brings the server back and fires background flushes until the write is
   * applied: one that lands inside the backoff left by the failed offline attempt is
   * refused by design. Resolves with the blank tab and the write.
   */
  async function backgroundDelivery(h, title) {
    const app = await h.openDemo({ page: await h.browser.newPage() });
    if (!await app.evaluate(() => window.demo.state.user?.id === 'alice')) await signIn(app, 'alice');
    await h.setNetwork(false);
    const w = await queuedWrite(app, '/api/projects/p1/tasks', { title });
    const before = (await h.applied()).length;
    for (const p of await h.browser.openPages()) if (p !== h.blank) await p.close();
    await h.setNetwork(true);
    await eventually(async () => {
      if ((await h.applied()).length > before) return true;
      await h.fireBackgroundFlush();
      return (await h.applied()).length > before;
    }, { interval: 1000, timeout: 60000, what: 'a background flush to apply the write' });
    return w;
  }

  test('a background flush with no page open shows one content-free notification, for an opted-in account',
    { skip: lacks(engine, 'grantNotifications', 'backgroundFlush') }, withDiagnostics(harness, async () => {
      const h = harness();
      await h.reset();
      await h.grantNotifications();
      h.blank = h.browser.pages()[0];
      const page = await h.openDemo({ page: await h.browser.newPage() });
      await signIn(page, 'alice');
      const on = await page.evaluate(() => window.demo.client.enableNotifications('alice'));
      assert.equal(on.ok, true, JSON.stringify(on));
      const refused = await page.evaluate(() => window.demo.client.enableNotifications('bob'));
      assert.equal(refused.ok, false, 'only the signed-in account may opt in');

      const w = await backgroundDelivery(h, 'secret title');
      assert.equal((await h.applied()).at(-1).key, w.key);
      const again = await h.openDemo({ page: await h.browser.newPage() });
      const notes = await eventually(async () => { const n = await shown(again); return n.length ? n : null; },
        { what: 'the notification' });
      assert.deepEqual(notes, [{ title: 'Queued changes', body: '1 queued change was sent: 1 new', tag: 'sw-outbox' }]);
      assert.ok(!JSON.stringify(notes).includes('secret'), 'no user content in the notification');
      await again.evaluate(async () => {
        for (const n of await (await navigator.serviceWorker.ready).getNotifications()) n.close();
      });

      // With a window open the page gets the reports: no notification.
      await h.setNetwork(false);
      await queuedWrite(again, '/api/projects/p1/tasks', { title: 'second' });
      await h.setNetwork(true);
      await eventually(async () => {
        if ((await h.applied()).length >= 2) return true;
        await h.fireBackgroundFlush();
        return (await h.applied()).length >= 2;
      }, { interval: 1000, timeout: 60000, what: 'the second write applied' });
      assert.deepEqual(await shown(again), [], 'no notification while a page is open');
      await again.close();
    }));

  test('an account that opted out gets no notification after a background flush, even with no page open',
    { skip: lacks(engine, 'grantNotifications', 'backgroundFlush') }, withDiagnostics(harness, async () => {
      const h = harness();
      await h.reset();
      await h.grantNotifications();
      h.blank = h.browser.pages()[0];
      const page = await h.openDemo({ page: await h.browser.newPage() });
      await signIn(page, 'alice');
      assert.equal((await page.evaluate(() => window.demo.client.enableNotifications('alice'))).ok, true);
      const off = await page.evaluate(() => window.demo.client.disableNotifications('alice'));
      assert.equal(off.ok, true, JSON.stringify(off));
      // One a flush of the previous test showed after its page closed (it was opted in
      // then) is not this test's: closed first.
      await page.evaluate(async () => {
        for (const n of await (await navigator.serviceWorker.ready).getNotifications()) n.close();
      });

      const w = await backgroundDelivery(h, 'third');
      assert.equal((await h.applied()).at(-1).key, w.key);
      const last = await h.openDemo({ page: await h.browser.newPage() });
      assert.deepEqual(await shown(last), [], 'an opted-out account gets no notification');
      await last.close();
    }));

  test('clicking the notification the browser shows opens the app at notificationUrl when no window of it is open',
    { skip: lacks(engine, 'grantNotifications', 'backgroundFlush', 'clickNotification') }, withDiagnostics(harness, async () => {
      const h = harness();
      await h.reset();
      await h.grantNotifications();
      h.blank = h.browser.pages()[0];
      const setup = await h.openDemo({ page: await h.browser.newPage() });
      await signIn(setup, 'alice');
      assert.equal((await setup.evaluate(() => window.demo.client.enableNotifications('alice'))).ok, true);
      await backgroundDelivery(h, 'click me');

      const clicked = await eventually(() => h.clickNotification(), { what: 'a notification to click' });
      assert.deepEqual(clicked, { title: 'Queued changes', body: '1 queued change was sent: 1 new' });
      // The worker's notificationclick found no window of the app and opened one.
      const opened = await eventually(async () => {
        for (const p of await h.browser.openPages()) {
          if (p !== h.blank && await p.url().catch(() => '') === `${h.baseUrl}/`) return p;
        }
        return null;
      }, { what: 'the click to open the app at notificationUrl (/)' });
      await opened.waitForFunction(() => Boolean(window.demo?.client && navigator.serviceWorker.controller));
      assert.deepEqual(await shown(opened), [], 'the click closed the notification');
      assert.equal((await h.browser.openPages()).length, 2, 'the blank tab and the one the click opened');
      await opened.close();
    }));

  test('clicking the notification with a window of the app open opens no other window',
    { skip: lacks(engine, 'grantNotifications', 'backgroundFlush', 'clickNotification') }, withDiagnostics(harness, async () => {
      const h = harness();
      await h.reset();
      await h.grantNotifications();
      h.blank = h.browser.pages()[0];
      const setup = await h.openDemo({ page: await h.browser.newPage() });
      await signIn(setup, 'alice');
      assert.equal((await setup.evaluate(() => window.demo.client.enableNotifications('alice'))).ok, true);
      await backgroundDelivery(h, 'focus me');

      // A window of the app is open (in a background tab: the blank one is shown).
      const app = await h.openDemo({ page: await h.browser.newPage() });
      await h.blank.goto('about:blank');
      const clicked = await eventually(() => h.clickNotification(), { what: 'a notification to click' });
      assert.equal(clicked?.title, 'Queued changes');
      await eventually(async () => (await shown(app)).length === 0, { what: 'the click to close the notification' });
      // The worker found the open window (it focuses it) instead of opening another.
      // Firefox headless does not bring that tab to the front (seen: the shown tab
      // stays the blank one), so what is checked is that no window was opened.
      await send(app, { type: 'LIST_QUEUE' });
      assert.deepEqual((await Promise.all((await h.browser.openPages()).map((p) => p.url()))).sort(),
        ['about:blank', `${h.baseUrl}/`].sort(), 'no window opened: the blank tab and the app');
      await app.close();
    }));

  test('clicking a notification about a write that needs attention opens the app at that write',
    { skip: lacks(engine, 'grantNotifications', 'backgroundFlush', 'clickNotification') }, withDiagnostics(harness, async () => {
      const h = harness();
      await h.reset();
      await h.grantNotifications();
      h.blank = h.browser.pages()[0];
      const app = await h.openDemo({ page: await h.browser.newPage() });
      await signIn(app, 'alice');
      assert.equal((await app.evaluate(() => window.demo.client.enableNotifications('alice'))).ok, true);
      await h.setNetwork(false);
      const w = await queuedWrite(app, '/api/projects/p1/tasks', { title: 'refused in the background' });
      await h.control('faults', { rules: [{ path: '/api/projects/p1/tasks', method: 'POST', kind: 'status', status: 422, detail: 'nope' }] });
      for (const p of await h.browser.openPages()) if (p !== h.blank) await p.close();
      await h.setNetwork(true);
      await eventually(async () => {
        const refused = (await h.requests()).some((r) => r.key === w.key && r.status === 422);
        if (!refused) await h.fireBackgroundFlush();
        return refused;
      }, { interval: 1000, timeout: 60000, what: 'a background flush to meet the 422' });
      await h.control('faults', { rules: [] });

      const clicked = await eventually(() => h.clickNotification(), { what: 'a notification to click' });
      assert.deepEqual(clicked, { title: 'Queued changes', body: '1 queued change needs attention' });
      const opened = await eventually(async () => {
        for (const p of await h.browser.openPages()) {
          if (p !== h.blank && await p.url().catch(() => '') === `${h.baseUrl}/?outboxRecord=${w.id}`) return p;
        }
        return null;
      }, { what: `the click to open the app at the record (/?outboxRecord=${w.id})` });
      await opened.waitForFunction(() => Boolean(window.demo?.client && navigator.serviceWorker.controller));
      // The app's recovery view opens on it, with its content.
      await opened.waitForFunction((id) => Boolean(document.querySelector(`[data-testid="opened-${id}"]`)), w.id, { timeout: 20000 });
      const body = await opened.evaluate((id) => document.querySelector(`[data-testid="edit-body-${id}"]`).value, w.id);
      assert.deepEqual(JSON.parse(body), { title: 'refused in the background' });
      await opened.close();
    }));
});
