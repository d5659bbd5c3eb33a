// Every engine: recovery people can use. A stuck write can be read (its content shown),
// copied to the clipboard, edited and resent under a new key in its lane's place; another
// account's writes are neither readable nor shown or reported by path; a corrupt record is
// discarded alone; a never-queued route answers 503 offline and stores nothing.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import {
  clearReports, eventually, flush, forEachEngine, listQueue, openWith, queuedWrite, readClipboard, readMutations, signIn,
  signOutThroughUi, waitForFlushReports, withDiagnostics,
} from './outbox-helpers.mjs';

const P = (pid) => `/api/projects/${pid}/tasks`;

forEachEngine((engine, harness) => {
  test('a 422-rejected write is read, edited in the demo and applied once with a new key, in its lane\'s order',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openWith(h, {});
      await h.setNetwork(false);
      const bad = await queuedWrite(page, P('p1'), { title: 'x'.repeat(30) });
      const later = await queuedWrite(page, P('p1'), { title: 'written after it' });
      await h.control('faults', { rules: [{ path: P('p1'), method: 'POST', kind: 'status', status: 422, detail: 'title too long', times: 1 }] });
      await h.setNetwork(true);
      await eventually(async () => (await listQueue(page)).find((r) => r.id === bad.id)?.state === 'needs-attention'
        || ((await flush(page)) && false), { what: 'the write to be rejected' });
      const q = await listQueue(page);
      assert.equal(q.find((r) => r.id === bad.id).attentionReason, 'rejected');
      assert.equal(q.find((r) => r.id === later.id).state, 'queued', 'the later write waits behind it');

      const read = await page.evaluate((id) => window.demo.client.read(id, 'alice'), bad.id);
      assert.equal(read.type, 'RECORD', JSON.stringify(read));
      assert.equal(read.record.bodyEncoding, 'text');
      assert.deepEqual(JSON.parse(read.record.body), { title: 'x'.repeat(30) }, 'the content is shown');
      assert.equal(read.record.contentType, 'application/json');
      assert.equal(read.record.lastStatus, 422);
      assert.equal(read.record.sentBefore, true);

      // In the demo: Show, edit, Resend edited.
      await page.getByTestId(`show-${bad.id}`).click();
      const area = page.getByTestId(`edit-body-${bad.id}`);
      await area.waitFor();
      assert.deepEqual(JSON.parse(await area.inputValue()), { title: 'x'.repeat(30) });
      // Edited and resent in one go: a report arriving between a fill and a click (the
      // worker's own retries send them, r3) re-renders the panel, and the click would
      // resend the stored body.
      await page.evaluate(([id, text]) => {
        const box = document.querySelector(`[data-testid="edit-body-${id}"]`);
        box.value = text;
        box.dispatchEvent(new Event('input', { bubbles: true }));
        document.querySelector(`[data-testid="resend-${id}"]`).click();
      }, [bad.id, JSON.stringify({ title: 'short now' })]);
      await eventually(async () => (await listQueue(page)).length === 0 || ((await flush(page)) && false),
        { timeout: 20000, what: 'the edited write and the one behind it to be delivered' });
      const applied = await h.applied();
      assert.deepEqual(applied.map((a) => JSON.parse(a.body).title), ['short now', 'written after it'],
        'the edited write first, in its place; each once');
      assert.notEqual(applied[0].key, bad.key, 'resent under a new key');
      assert.equal(applied[1].key, later.key);
    }));

  test('the recovery panel\'s Copy puts the stuck write\'s body on the clipboard',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openWith(h, {});
      await h.setNetwork(false);
      const stuck = await queuedWrite(page, P('p1'), { title: 'copy me before I am lost', note: 'ünïcode ✓' });
      await h.control('faults', { rules: [{ path: P('p1'), method: 'POST', kind: 'status', status: 422, detail: 'refused', times: 1 }] });
      await h.setNetwork(true);
      await eventually(async () => (await listQueue(page)).find((r) => r.id === stuck.id)?.state === 'needs-attention'
        || ((await flush(page)) && false), { what: 'the write to be rejected' });
      const read = await page.evaluate((id) => window.demo.client.read(id, 'alice'), stuck.id);
      assert.equal(read.type, 'RECORD', JSON.stringify(read));

      await page.getByTestId(`show-${stuck.id}`).click();
      await page.getByTestId(`edit-body-${stuck.id}`).waitFor();
      // Every text the demo's summary line takes (a report may replace it right after).
      await page.evaluate(() => {
        window.__summaries = [];
        new MutationObserver(() => window.__summaries.push(document.querySelector('[data-testid="outbox-summary"]').textContent))
          .observe(document.querySelector('[data-testid="outbox-summary"]'), { childList: true, characterData: true, subtree: true });
      });
      await page.getByTestId(`copy-${stuck.id}`).click();
      await page.waitForFunction(() => window.__summaries.some((t) => t.startsWith('Copy')), null, { timeout: 10000 });
      const said = await page.evaluate(() => window.__summaries.find((t) => t.startsWith('Copy')));
      assert.equal(said, 'Copy: done', 'the browser took the text');
      const copied = await readClipboard(h, page);
      assert.equal(copied, read.record.body, 'the clipboard holds the record\'s body');
      assert.deepEqual(JSON.parse(copied), stuck.body, 'as the page wrote it');
    }));

  test('MUTATIONS_BLOCKED names nothing of another account\'s record, and keeps the details of the signed-in account\'s and of an unknown owner\'s',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openWith(h, {});
      await h.setNetwork(false);
      const alices = await queuedWrite(page, P('secret'), { title: 'alice only' });
      await h.setNetwork(true);
      const keepAlices = { path: P('secret'), method: 'POST', kind: 'refuse' };
      await h.control('faults', { rules: [keepAlices] });
      await signOutThroughUi(page);
      // Signed out and offline: a write bound to no account.
      await h.setNetwork(false);
      const nobodys = await queuedWrite(page, P('p2'), { title: 'written signed out' });
      await h.setNetwork(true);
      await signIn(page, 'bob');
      await h.setNetwork(false);
      const bobs = await queuedWrite(page, P('p1'), { title: 'bob\'s, rejected' });
      await h.control('faults', { rules: [keepAlices, { path: P('p1'), method: 'POST', kind: 'status', status: 422, detail: 'refused', times: 1 }] });
      await h.setNetwork(true);
      await eventually(async () => (await listQueue(page)).find((r) => r.id === bobs.id)?.state === 'needs-attention'
        || ((await flush(page)) && false), { what: 'bob\'s write to be rejected' });

      await clearReports(page);
      await flush(page);
      const { blocked } = await waitForFlushReports(page);
      const entry = (id) => {
        const b = blocked.blocked.find((x) => x.id === id);
        assert.ok(b, `record ${id} is reported: ${JSON.stringify(blocked)}`);
        return b;
      };
      const other = entry(alices.id);
      assert.deepEqual(Object.keys(other).filter((k) => other[k] !== null).sort(), ['id', 'ownerId', 'reason', 'state'],
        `only id, owner, state and reason of alice's record reach bob's page: ${JSON.stringify(other)}`);
      assert.deepEqual([other.ownerId, other.state, other.reason], ['alice', 'queued', 'owner-mismatch']);
      assert.ok(!JSON.stringify(blocked).includes('secret'), 'no path of alice\'s in the report');
      const own = entry(bobs.id);
      assert.deepEqual([own.method, own.path, own.workspace, own.ownerId, own.state, own.reason],
        ['POST', '/projects/p1/tasks', 'p1', 'bob', 'needs-attention', 'rejected'], JSON.stringify(own));
      const unknown = entry(nobodys.id);
      assert.deepEqual([unknown.method, unknown.path, unknown.workspace, unknown.ownerId, unknown.reason],
        ['POST', '/projects/p2/tasks', 'p2', null, 'unknown-owner'], JSON.stringify(unknown));
      await h.control('faults', { rules: [] });
    }));

  test('another account\'s record can be read by no one else and is shown without its path',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openWith(h, {});
      await h.setNetwork(false);
      const alices = await queuedWrite(page, P('secret'), { title: 'alice only' });
      await h.control('faults', { rules: [{ path: '/api/projects/secret/tasks', method: 'POST', kind: 'refuse' }] });
      await h.setNetwork(true);
      await signOutThroughUi(page);
      await signIn(page, 'bob');
      for (const owner of ['alice', 'bob']) {
        const r = await page.evaluate(([id, o]) => window.demo.client.read(id, o), [alices.id, owner]);
        assert.equal(r.type, 'COMMAND_RESULT', `refused when asked as ${owner}: ${JSON.stringify(r)}`);
        assert.equal(r.ok, false);
      }
      const listed = (await listQueue(page)).find((r) => r.id === alices.id);
      assert.deepEqual([listed.path, listed.method, listed.workspace], [null, null, null], JSON.stringify(listed));
      const shown = await page.getByTestId('other-accounts').textContent();
      assert.match(shown, /1 unsent change of another account/);
      assert.ok(!(await page.getByTestId('outbox-list').textContent()).includes('secret'), 'no path of alice\'s on bob\'s screen');
      await h.control('faults', { rules: [] });
    }));

  test('a corrupt record is discarded alone by whoever is signed in', withDiagnostics(harness, async () => {
    const h = harness();
    const page = await openWith(h, {});
    await h.setNetwork(false);
    const kept = await queuedWrite(page, P('p1'), { title: 'kept' });
    const corruptId = await page.evaluate(() => new Promise((resolve, reject) => {
      const req = indexedDB.open('sw-outbox');
      req.onsuccess = () => {
        const tx = req.result.transaction('mutations', 'readwrite');
        let id;
        tx.objectStore('mutations').add({ method: 42, path: ['x'], timestamp: 'never' }).onsuccess = (e) => { id = e.target.result; };
        tx.oncomplete = () => { req.result.close(); resolve(id); };
        tx.onerror = () => reject(tx.error);
      };
    }));
    await h.setNetwork(true);
    await signOutThroughUi(page);
    await signIn(page, 'bob');
    const r = await page.evaluate((id) => window.demo.client.discard(id, 'bob'), corruptId);
    assert.equal(r.ok, true, JSON.stringify(r));
    const retried = await page.evaluate((id) => window.demo.client.retry(id, 'bob'), kept.id);
    assert.equal(retried.ok, false, 'another account\'s record is not bob\'s to recover');
    assert.deepEqual((await listQueue(page)).map((x) => x.id), [kept.id], 'only the corrupt record went');
  }));

  test('a value stored under a key the outbox never gives is listed by LIST_QUEUE and can be discarded',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openWith(h, {});
      await h.setNetwork(false);
      const kept = await queuedWrite(page, P('p1'), { title: 'kept' });
      // Another script (an old build, a devtools edit) put a value under a string key.
      await page.evaluate(() => new Promise((resolve, reject) => {
        const req = indexedDB.open('sw-outbox');
        req.onsuccess = () => {
          const tx = req.result.transaction('mutations', 'readwrite');
          tx.objectStore('mutations').put({ id: 'planted-by-hand', method: 'POST', path: '/projects/p1/tasks' });
          tx.oncomplete = () => { req.result.close(); resolve(); };
          tx.onerror = () => reject(tx.error);
        };
        req.onerror = () => reject(req.error);
      }));
      // No flush first: the list alone must show it, with an id a page can name.
      const listed = await listQueue(page);
      const strange = listed.filter((x) => x.id !== kept.id);
      assert.equal(strange.length, 1, `the planted value is listed: ${JSON.stringify(listed)}`);
      assert.equal(strange[0].state, 'corrupt', JSON.stringify(strange[0]));
      assert.equal(typeof strange[0].id, 'number');
      assert.ok(strange[0].id > kept.id, 'given a new id after every record');

      await h.setNetwork(true); // a discard is checked with the server's /auth/me
      const r = await page.evaluate((id) => window.demo.client.discard(id, 'alice'), strange[0].id);
      assert.equal(r.ok, true, JSON.stringify(r));
      assert.deepEqual((await listQueue(page)).map((x) => x.id).filter((id) => id !== kept.id), [], 'the planted value went');
      const keys = await readMutations(page, 'getAllKeys');
      // (kept may be gone already: the worker's offline probe flushes once the server answers.)
      assert.deepEqual(keys.filter((k) => k !== kept.id), [], `nothing is left under the foreign key either: ${JSON.stringify(keys)}`);
      await flush(page);
      assert.deepEqual((await h.applied()).map((x) => x.key), [kept.key], 'the kept record is applied once');
    }));

  test('a never-queued route is sent like any write but answers 503 offline and stores nothing',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openWith(h, { neverQueuePattern: '/merge$' });
      await h.setNetwork(false);
      const r = await page.evaluate(() => window.demo.api('POST', '/api/projects/p1/merge', { from: 'a' }));
      assert.equal(r.status, 503, JSON.stringify(r));
      assert.equal(r.body.queued, false);
      assert.match(r.body.error, /never queued/);
      assert.deepEqual(await listQueue(page), [], 'nothing stored');
      const normal = await queuedWrite(page, P('p1'), { title: 'an ordinary write is still queued' });
      assert.ok(normal.id);
      await h.setNetwork(true);
    }));
});
