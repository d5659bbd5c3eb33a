// Every engine: contract revision 2 against the reference server (issue "real servers"): replays never
// follow a redirect (to another origin neither), keep the page's conditional headers (a
// stale If-Match gets its 412), never resend a key the server may have forgotten, bound a
// server's Retry-After, take a stored 5xx as final, check the identity again once after a
// CSRF refusal, and read no more than 64 KiB of an answer's body. The server's
// /__control/applied and /__control/requests are the ground truth.
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { test } from 'node:test';
import {
  apiCall, eventually, flush, forEachEngine, lastSeq, listQueue, openWith, queuedWrite, send, sentWithKey,
  storedRecord, withDiagnostics, writesIn,
} from './outbox-helpers.mjs';

const P = (pid) => `/api/projects/${pid}/tasks`;

/** The queue's record `id`, asserting it is there. */
async function record(page, id) {
  const r = (await listQueue(page)).find((x) => x.id === id);
  assert.ok(r, `record ${id} is still queued`);
  return r;
}

/** A second session of `user` made from Node, as another device of the same person. */
async function otherDevice(h, user) {
  const login = await fetch(`${h.baseUrl}/api/auth/login`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ userId: user, password: user }),
  });
  const text = await login.text();
  assert.equal(login.status, 200, text);
  const cookie = login.headers.get('set-cookie').split(';')[0];
  const { csrfToken } = JSON.parse(text);
  return async (method, path, body, headers = {}) => {
    const r = await fetch(`${h.baseUrl}${path}`, {
      method,
      headers: { cookie, 'X-CSRF-Token': csrfToken, 'Content-Type': 'application/json', ...headers },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await r.text();
    return { status: r.status, etag: r.headers.get('etag'), body: text ? JSON.parse(text) : null };
  };
}

/**
 * Another origin (another port of 127.0.0.1) that would accept anything: CORS granted to
 * any origin, credentials included, so a browser that followed a redirect there would
 * deliver the write. `requests` lists what reached it.
 */
async function otherOrigin() {
  const requests = [];
  const server = createServer((req, res) => {
    let size = 0;
    req.on('data', (c) => { size += c.length; });
    req.on('end', () => {
      requests.push({ method: req.method, url: req.url, bodyBytes: size });
      res.writeHead(req.method === 'OPTIONS' ? 204 : 201, {
        'Access-Control-Allow-Origin': req.headers.origin ?? '*',
        'Access-Control-Allow-Credentials': 'true',
        'Access-Control-Allow-Methods': req.headers['access-control-request-method'] ?? 'POST',
        'Access-Control-Allow-Headers': req.headers['access-control-request-headers'] ?? '*',
        'Content-Type': 'application/json',
      });
      res.end(req.method === 'OPTIONS' ? undefined : '{"id":1}');
    });
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    origin: `http://127.0.0.1:${server.address().port}`,
    requests,
    close: () => new Promise((resolve) => { server.closeAllConnections(); server.close(resolve); }),
  };
}

forEachEngine((engine, harness) => {
  test('a redirected replay keeps its record (redirected) and nothing is applied or followed',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openWith(h, {});
      await h.setNetwork(false);
      const w = await queuedWrite(page, P('p1'), { title: 'sent to an SSO gateway' });
      const since = await lastSeq(h);
      await h.control('faults', { rules: [{ path: P('p1'), method: 'POST', kind: 'redirect', status: 303, location: '/login' }] });
      await h.setNetwork(true);
      const r = await flush(page); // or an automatic flush before it: either meets the redirect
      assert.equal(r.ok, true, JSON.stringify(r));
      assert.equal(r.affected, 0, 'a redirect is never counted as replayed');
      const rec = await record(page, w.id);
      assert.equal(rec.state, 'needs-attention', JSON.stringify(rec));
      assert.equal(rec.attentionReason, 'redirected');
      assert.equal(rec.lastStatus, 0, 'an opaque redirect (redirect: "manual")');
      assert.deepEqual(await h.applied(), []);
      const after = (await h.requests()).filter((x) => x.seq > since);
      assert.deepEqual(after.filter((x) => /login/.test(x.path)), [], 'the redirect was not followed');
      assert.equal(after.filter((x) => x.key === w.key).length, 1, 'sent once, not resent elsewhere');
    }));

  // 307 and 308 keep the method and body when followed, 301 turns a POST into a GET: to
  // another origin, each would hand the write (or its headers) to a server it was never
  // meant for.
  for (const status of [301, 307, 308]) {
    test(`a replay answered ${status} to another origin keeps its record (redirected) and nothing reaches that origin`,
      withDiagnostics(harness, async () => {
        const h = harness();
        const other = await otherOrigin();
        try {
          const page = await openWith(h, {});
          await h.setNetwork(false);
          const w = await queuedWrite(page, P('p1'), { title: `moved by a ${status}` });
          await h.control('faults', { rules: [{ path: P('p1'), method: 'POST', kind: 'redirect', status, location: `${other.origin}${P('p1')}` }] });
          await h.setNetwork(true);
          const r = await flush(page); // or an automatic flush before it: either meets the redirect
          assert.equal(r.ok, true, JSON.stringify(r));
          assert.equal(r.affected, 0, 'a redirect is never counted as replayed');
          const rec = await record(page, w.id);
          assert.equal(rec.state, 'needs-attention', JSON.stringify(rec));
          assert.equal(rec.attentionReason, 'redirected');
          assert.equal(rec.lastStatus, 0, 'an opaque redirect (redirect: "manual")');
          assert.deepEqual(other.requests, [], `nothing reached ${other.origin}`);
          assert.deepEqual(await h.applied(), []);
          const sends = (await sentWithKey(h, w.key)).filter((x) => x.status !== null);
          assert.deepEqual(sends.map((x) => x.status), [status], 'answered once, resent nowhere');
        } finally {
          await other.close();
        }
      }));
  }

  // Contract 4.7: an answer's body is read at most 64 KiB. The server's endless-body rule
  // sends the status, the first bytes of a page, then spaces without end. attemptTimeoutMs
  // (which also bounds reading a body) is 60 s here: a reader that did not stop at 64 KiB
  // would read until then, and this FLUSH_QUEUE (20 s, `send`) would not be answered.
  test('a replay answered with a 422 whose body never ends is classified from its first 64 KiB and holds nothing',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openWith(h, { attemptTimeoutMs: 60000 });
      await h.setNetwork(false);
      const endless = await queuedWrite(page, P('p1'), { title: 'answered by a page that never ends' });
      const other = await queuedWrite(page, P('p2'), { title: 'in another lane' });
      await h.control('faults', { rules: [{
        path: P('p1'), method: 'POST', kind: 'endless-body', status: 422, contentType: 'text/html',
        body: '<h1>422: this idempotency key was already used with another request</h1>',
      }] });
      await h.setNetwork(true);
      const r = await send(page, { type: 'FLUSH_QUEUE' });
      assert.equal(r.type, 'COMMAND_RESULT', `the flush came back: ${JSON.stringify(r)}`);
      assert.equal(r.ok, true, JSON.stringify(r));
      const rec = await record(page, endless.id);
      assert.equal(rec.state, 'needs-attention', JSON.stringify(rec));
      assert.equal(rec.attentionReason, 'key-reused', 'classified by the words at the start of the body');
      assert.equal(rec.lastStatus, 422);
      assert.deepEqual((await h.applied()).map((x) => x.key), [other.key], 'the other lane was delivered');
      const sends = (await sentWithKey(h, endless.key)).filter((x) => x.status !== null);
      assert.deepEqual(sends.map((x) => x.status), [422], 'answered once');
      // The queue is free: a new write goes through at once.
      const next = await apiCall(page, 'POST', P('p3'), { title: 'after it' });
      assert.equal(next.status, 201, JSON.stringify(next));
    }));

  test('a replay keeps the page\'s If-Match: a stale queued edit gets its 412 instead of overwriting newer state',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openWith(h, {});
      const created = await apiCall(page, 'POST', P('p1'), { title: 'v1' });
      assert.equal(created.status, 201, JSON.stringify(created));
      const task = `${P('p1')}/${created.body.id}`;
      const etag = `"${created.body.version}"`;

      await h.setNetwork(false);
      // The stale edit: made offline against version 1, with credentials the page must not
      // see stored (an Authorization header is never kept for replays).
      const stale = await page.evaluate(async ([path, tag]) => {
        const r = await fetch(path, {
          method: 'PATCH',
          headers: {
            'Content-Type': 'application/json', 'If-Match': tag, Authorization: 'Bearer not-for-the-queue',
            'X-CSRF-Token': window.demo.state.csrf, 'X-PM-Expected-Account': 'alice',
          },
          body: JSON.stringify({ title: 'stale offline edit' }),
        });
        return { status: r.status, body: await r.json() };
      }, [task, etag]);
      assert.equal(stale.status, 202, JSON.stringify(stale));
      const stored = await storedRecord(page, stale.body.id);
      // The browser adds replay headers of its own to every fetch (Accept everywhere;
      // Firefox also Accept-Language): stored as the browser sent them.
      const browserOwn = ['accept', 'accept-language'];
      assert.deepEqual(stored.headers.filter(([n]) => !browserOwn.includes(n)), [['if-match', etag]],
        `only allowed headers are stored (the browser's own Accept and Accept-Language are): ${JSON.stringify(stored.headers)}`);
      assert.equal(stored.credentials, 'same-origin', 'the page\'s credentials mode is kept');

      await h.setNetwork(true);
      // Meanwhile another device of the same person edits the task: version 2.
      const device = await otherDevice(h, 'alice');
      const newer = await device('PATCH', task, { title: 'newer edit from another device' });
      assert.equal(newer.status, 200, JSON.stringify(newer));
      assert.equal(newer.etag, '"2"');

      const r = await flush(page);
      assert.equal(r.ok, true, JSON.stringify(r));
      const rec = await record(page, stale.body.id);
      assert.equal(rec.attentionReason, 'rejected', JSON.stringify(rec));
      assert.equal(rec.lastStatus, 412, 'the server refused the stale precondition');
      const now = await device('GET', task);
      assert.equal(now.body.title, 'newer edit from another device', 'the newer state was not overwritten');
      const sends = await sentWithKey(h, stale.body.idempotencyKey);
      assert.ok(sends.some((s) => s.status === 412), JSON.stringify(sends));
    }));

  test('a record sent once and older than serverKeyTtlMs is key-expired and never resent; one never sent replays normally',
    withDiagnostics(harness, async () => {
      const h = harness();
      const ttl = 2000;
      const page = await openWith(h, { serverKeyTtlMs: ttl, attemptTimeoutMs: 1500 });
      await h.setNetwork(false);
      // A's first attempt goes out (and fails): it may have reached the server. B arrives
      // behind A in its lane and is queued without an attempt: it never left the worker.
      const a = await queuedWrite(page, P('p1'), { title: 'A: sent once' });
      const b = await queuedWrite(page, P('p1'), { title: 'B: queued behind A, never sent' });
      const sentB = await sentWithKey(h, b.key);
      assert.deepEqual(sentB, [], 'B never reached the server');
      await new Promise((r) => setTimeout(r, ttl + 500));
      await h.setNetwork(true);
      const since = await lastSeq(h);

      const r = await flush(page);
      assert.equal(r.ok, true, JSON.stringify(r));
      const recA = await record(page, a.id);
      assert.equal(recA.state, 'needs-attention', JSON.stringify(recA));
      assert.equal(recA.attentionReason, 'key-expired');
      const recB = await record(page, b.id);
      assert.equal(recB.state, 'queued', 'B waits behind A, not key-expired itself');
      assert.deepEqual(writesIn(await h.requests(), since).filter((x) => x.key === a.key), [],
        'A is never sent again with its old key');

      // The person decides A was not applied and discards it: B, older than the key window
      // but never sent, replays normally under its own key.
      const d = await page.evaluate((id) => window.demo.client.discard(id, 'alice'), a.id);
      assert.equal(d.ok, true, JSON.stringify(d));
      await eventually(async () => (await listQueue(page)).length === 0 || ((await flush(page)) && false),
        { timeout: 20000, what: 'B to be replayed' });
      assert.deepEqual((await h.applied()).map((x) => x.key), [b.key], 'B applied once; A never');
    }));

  test('a Retry-After of a year holds delivery no longer than maxRetryAfterMs', withDiagnostics(harness, async () => {
    const h = harness();
    const hold = 3000;
    const page = await openWith(h, { maxRetryAfterMs: hold });
    await h.setNetwork(false);
    const w = await queuedWrite(page, P('p1'), { title: 'behind a year-long Retry-After' });
    await h.control('faults', { rules: [{ path: P('p1'), method: 'POST', kind: 'status', status: 503, retryAfter: '31536000', times: 1 }] });
    await h.setNetwork(true);
    await flush(page); // or the Background Sync flush: either meets the 503
    await eventually(async () => (await sentWithKey(h, w.key)).some((x) => x.status === 503), { what: 'the 503' });
    const held = await flush(page);
    assert.equal(held.ok, false, `inside the hold a flush is refused: ${JSON.stringify(held)}`);
    // Delivered once the bounded hold is over (a year-long one would time this out).
    await eventually(async () => (await flush(page)).ok && (await listQueue(page)).length === 0,
      { timeout: hold + 15000, interval: 500, what: 'the hold to end within maxRetryAfterMs' });
    assert.deepEqual((await h.applied()).map((x) => x.key), [w.key], 'applied once when the hold ended');
  }));

  test('a 5xx the server stored in its ledger (Idempotent-Replayed) needs attention at once, not after maxServerFailures',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openWith(h, {});
      await h.setNetwork(false);
      const w = await queuedWrite(page, P('p1'), { title: 'its route fails once, and that is stored' });
      await h.control('faults', { rules: [{ path: P('p1'), method: 'POST', kind: 'stored-status', status: 500, detail: 'boom', times: 1 }] });
      await h.setNetwork(true);
      const rec = await eventually(async () => {
        await flush(page);
        const r = await record(page, w.id);
        return r.state === 'needs-attention' ? r : null;
      }, { timeout: 30000, interval: 300, what: 'the record to need attention' });
      assert.equal(rec.attentionReason, 'repeated-5xx', `the replayed 500 is final: ${JSON.stringify(rec)}`);
      const fives = (await sentWithKey(h, w.key)).filter((s) => s.status === 500);
      assert.equal(fives.length, 2, `the stored 500, then its replay; not maxServerFailures (3): ${JSON.stringify(fives)}`);
      assert.deepEqual(await h.applied(), []);
    }));

  test('a CSRF refusal mid-flush checks the identity again once and resends; a second one is a refusal (r3): needs-attention, rejected, 403 kept',
    withDiagnostics(harness, async () => {
      const h = harness();
      // A Background Sync flush may take a record before the test's own flush does: the
      // assertions are on what the server saw and applied, not on which flush did it.
      const page = await openWith(h, {});
      await h.setNetwork(false);
      const w = await queuedWrite(page, P('p1'), { title: 'replayed after a fresh sign-in elsewhere' });
      await h.control('faults', { rules: [{ path: P('p1'), method: 'POST', kind: 'status', status: 403, detail: 'csrf_failed', times: 1 }] });
      await h.setNetwork(true);
      const r = await flush(page);
      assert.equal(r.ok, true, JSON.stringify(r));
      await eventually(async () => (await h.applied()).length === 1, { what: 'w to be applied' });
      assert.deepEqual((await h.applied()).map((x) => x.key), [w.key]);
      // A first attempt made offline reached no route (status null), and once the worker
      // knows it is offline (its fast path, docs/ARCHITECTURE.md) there is none at all:
      // only answered sends are compared.
      const answered = async (key) => (await sentWithKey(h, key)).filter((x) => x.status !== null).map((x) => x.status);
      assert.deepEqual(await answered(w.key), [403, 201],
        'refused, checked again, resent once in the same flush');

      await h.setNetwork(false);
      const v = await queuedWrite(page, P('p1'), { title: 'refused twice' });
      await h.control('faults', { rules: [{ path: P('p1'), method: 'POST', kind: 'status', status: 403, detail: 'csrf_failed', times: 2 }] });
      await h.setNetwork(true);
      await flush(page);
      await eventually(async () => (await sentWithKey(h, v.key)).filter((x) => x.status === 403).length === 2,
        { what: 'two refusals' });
      // After the one re-check and resend, the same refusal is the server's answer, not a
      // stale identity: the record needs a person, and the queue does not stall on it.
      const rec = await eventually(async () => (await listQueue(page)).find((x) => x.id === v.id && x.state === 'needs-attention'),
        { what: 'v to need attention' });
      assert.deepEqual([rec.attentionReason, rec.lastStatus], ['rejected', 403], JSON.stringify(rec));
      assert.deepEqual((await h.applied()).map((x) => x.key), [w.key], 'v was not applied');
      assert.deepEqual(await answered(v.key), [403, 403], 'sent once, re-checked, resent once: never a third time');
    }));

  test('a 409 account_mismatch mid-flush checks the identity again once and resends under the same account',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openWith(h, {});
      await h.setNetwork(false);
      const w = await queuedWrite(page, P('p1'), { title: 'replayed after the session was renewed elsewhere' });
      await h.control('faults', { rules: [{ path: P('p1'), method: 'POST', kind: 'status', status: 409, detail: 'account_mismatch', times: 1 }] });
      await h.setNetwork(true);
      const r = await flush(page);
      assert.equal(r.ok, true, JSON.stringify(r));
      // Within this one flush, not by a later retry: a plain 409 would leave it for the next.
      assert.equal(r.affected, 1, JSON.stringify(r));
      assert.deepEqual((await h.applied()).map((x) => [x.key, x.user]), [[w.key, 'alice']], 'applied once, as alice');
      const answered = (await sentWithKey(h, w.key)).filter((x) => x.status !== null).map((x) => x.status);
      assert.deepEqual(answered, [409, 201], 'refused, checked again, resent once; never rejected');
      assert.deepEqual(await listQueue(page), [], 'nothing left for a person');
    }));

  test('page keys of other shapes go through the reference server and are replayed under that key',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openWith(h, {});
      const keys = ['order_1234', 'k:7f3e', 'a'.repeat(80)];
      await h.setNetwork(false);
      for (const key of keys) {
        const r = await page.evaluate(async ([path, k]) => {
          const res = await fetch(path, {
            method: 'POST',
            headers: { 'Content-Type': 'application/json', 'Idempotency-Key': k, 'X-CSRF-Token': window.demo.state.csrf },
            body: JSON.stringify({ title: k }),
          });
          return { status: res.status, body: await res.json() };
        }, [P('p2'), key]);
        assert.equal(r.status, 202, JSON.stringify(r));
        assert.equal(r.body.idempotencyKey, key);
      }
      await h.setNetwork(true);
      await eventually(async () => (await listQueue(page)).length === 0 || ((await flush(page)) && false),
        { timeout: 20000, what: 'the queue to drain' });
      assert.deepEqual((await h.applied()).map((x) => x.key), keys, 'each applied once, under the page\'s key');
    }));
});
