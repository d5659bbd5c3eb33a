// Every engine: targeted reliability scenarios. A hanging first attempt, a version-1 database upgraded
// in a real browser, a corrupt record, a storage failure, and two tabs with an old and a
// new worker during an update. The server's /__control/applied is the ground truth.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { statSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { lacks } from './engines.mjs';
import { repoRoot, startHarness } from './harness.mjs';
import {
  clearReports, eventually, flush, forEachEngine, lastSeq, listQueue, openWith, pristine, queuedWrite,
  sentWithKey as keySent, reports, signIn, swPath, waitForFlushReports, withDiagnostics, writesIn,
} from './outbox-helpers.mjs';

const P = (pid) => `/api/projects/${pid}/tasks`;

forEachEngine((engine, harness) => {
  const pristineOrigin = () => pristine(harness());
  const openConfigured = (config, options) => openWith(harness(), config, options);
  const sentWithKey = (key) => keySent(harness(), key);

  test('a storage failure answers 503 queued:false and loses no earlier record',
    { skip: lacks(engine, 'overrideQuota') }, withDiagnostics(harness, async (t) => {
      // navigator.storage.estimate() never shows the override, even when it is enforced.
      // Observed in this Chromium: Storage.overrideQuotaForOrigin is not applied to the
      // worker's IndexedDB writes once the origin has used storage in this browser (a 600 KB
      // record still committed), while in a browser whose quota was shrunk before the origin
      // stored anything the same write fails with QuotaExceededError. So this test runs in a
      // browser of its own, with the quota shrunk first: room for the demo's precache, its
      // registration and a few small records, not for a 600 KB incompressible body.
      const h2 = await startHarness({ engine });
      try {
        const www = resolve(repoRoot, process.env.SW_OUTBOX_WWW || 'www');
        const cached = ['index.html', 'index.html',
          'app.js', 'app.css', 'outbox-client.js', 'manifest.webmanifest', 'icon.svg'];
        const files = cached.reduce((n, f) => n + statSync(join(www, f)).size, 0);
        const quotaSize = Math.round(files * 1.3) + 64 * 1024 + 128 * 1024;
        const page = h2.browser.pages()[0] ?? await h2.browser.newPage();
        await page.goto(`${h2.baseUrl}/icon.svg`);
        await h2.overrideQuota(quotaSize);
        await h2.openDemo({ page, path: swPath({}) });
        await signIn(page, 'alice');
        await h2.setNetwork(false);
        const small = await queuedWrite(page, P('p1'), { title: 'small, queued first' });
        // Room for small writes, not for a 600 KB one: the quota is shrunk again to what is
        // used now plus 256 KB (the first override sized it for the install).
        const used = (await page.evaluate(() => navigator.storage.estimate())).usage;
        await h2.overrideQuota(used + 256 * 1024);
        // Incompressible bodies of ~600 KB (under maxBodyBytes) until one cannot be stored.
        // Chromium applies the shrunk quota lazily (seen: the first one committed in 1 of 4
        // otherwise identical runs), so a few are tried; each one accepted stays queued.
        const accepted = [];
        let big = null;
        for (let i = 0; i < 6 && !big; i += 1) {
          const r = await page.evaluate(async () => {
            const raw = new Uint8Array(450 * 1024);
            for (let k = 0; k < raw.length; k += 65536) crypto.getRandomValues(raw.subarray(k, k + 65536));
            let bin = '';
            for (let k = 0; k < raw.length; k += 1) bin += String.fromCharCode(raw[k]);
            return window.demo.api('POST', '/api/projects/p3/tasks', { title: btoa(bin) });
          });
          if (r.status === 202) accepted.push({ id: r.body.id, key: r.body.idempotencyKey });
          else big = r;
        }
        const estimate = await page.evaluate(() => navigator.storage.estimate());
        assert.ok(big, `no big write was refused in 6: quota ${quotaSize}, estimate ${JSON.stringify(estimate)}`);
        assert.equal(big.status, 503, `the big write cannot be stored: ${JSON.stringify(big).slice(0, 300)}`);
        assert.equal(big.body?.queued, false, JSON.stringify(big.body));
        assert.equal(typeof big.body?.error, 'string');
        assert.notEqual(big.body?.error, 'offline');
        // Back to the normal quota (Chromium may still count the refused write's space for a
        // moment: seen, a small write right after it refused too): the worker goes on.
        await h2.overrideQuota();
        const later = await queuedWrite(page, P('p2'), { title: 'small, after the refusal' });
        const queue = await listQueue(page);
        assert.deepEqual(queue.map((x) => x.id), [small.id, ...accepted.map((a) => a.id), later.id],
          'every earlier record is still there; the refused one never was');

        await h2.setNetwork(true);
        await eventually(async () => (await flush(page)).ok && (await listQueue(page)).length === 0,
          { timeout: 60000, what: 'the queue to drain' });
        const applied = await h2.applied();
        // Independent lanes: compare as sets; each once, the refused one never.
        assert.deepEqual(applied.map((x) => x.key).sort(),
          [small.key, ...accepted.map((a) => a.key), later.key].sort(),
          'the queued writes applied once each; the refused one never');
        t.diagnostic(`${accepted.length} big write(s) stored before the refusal`);
        t.diagnostic(`storage failure answered: ${JSON.stringify(big.body)}`);
      } catch (err) {
        if (err && typeof err === 'object') err.message += `\n(second browser) ${await h2.diagnostics()}`;
        throw err;
      } finally {
        await h2.close();
      }
    }));

  test('a hanging first attempt is aborted after attemptTimeoutMs, answered 202, and applied once by a later flush',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openConfigured({ attemptTimeoutMs: 1000 });
      await h.control('faults', { rules: [{ path: P('p1'), method: 'POST', kind: 'hang' }] });
      const since = await lastSeq(h);
      const w = await queuedWrite(page, P('p1'), { title: 'hung first' });

      const firstSends = await sentWithKey(w.key);
      assert.ok(firstSends.length >= 1, 'the first attempt reached the server with the key of the 202');
      assert.equal(firstSends[0].seq, writesIn(await h.requests(), since)[0].seq, 'the first write sent was this one');
      assert.ok(firstSends.every((r) => r.status === null), `every attempt so far hung: ${JSON.stringify(firstSends)}`);
      assert.equal(firstSends[0].expectedAccount, 'alice');
      assert.deepEqual(await h.applied(), [], 'a hung request applied nothing');
      const queue = await listQueue(page);
      assert.deepEqual(queue.map((r) => [r.id, r.ownerId, r.workspace, r.state]), [[w.id, 'alice', 'p1', 'queued']]);

      await h.control('faults', { rules: [] });
      await eventually(async () => {
        const r = await flush(page);
        return r.ok && (await listQueue(page)).length === 0;
      }, { timeout: 30000, what: 'the queue to drain once the fault is cleared' });
      const applied = await h.applied();
      assert.deepEqual(applied.map((a) => [a.user, a.path, a.key, JSON.parse(a.body).title]),
        [['alice', P('p1'), w.key, 'hung first']], 'applied once, with the key of its 202');
      const sends = await sentWithKey(w.key);
      assert.deepEqual(sends.filter((r) => r.status !== null).map((r) => r.status), [201],
        `one answered request, the replay: ${JSON.stringify(sends)}`);
    }));

  test('a version-1 database is upgraded in the browser: every record kept as unknown-owner, adopted, applied once with its body',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await pristineOrigin();
      const now = Date.now();
      const v1 = [
        { method: 'POST', path: '/projects/p1/tasks', body: JSON.stringify({ title: 'v1 first p1' }), contentType: 'application/json', timestamp: now - 4000 },
        { method: 'POST', path: '/projects/p2/tasks', body: JSON.stringify({ title: 'v1 p2 — ünïcødé' }), contentType: 'application/json', timestamp: now - 3000 },
        { method: 'POST', path: '/notes', body: JSON.stringify({ text: 'v1 note' }), contentType: 'application/json', timestamp: now - 2000 },
        { method: 'POST', path: '/projects/p1/tasks', body: JSON.stringify({ title: 'v1 second p1' }), contentType: 'application/json', timestamp: now - 1000 },
      ];
      const ids = await page.evaluate((records) => new Promise((resolve, reject) => {
        const req = indexedDB.open('sw-outbox', 1);
        req.onupgradeneeded = () => { req.result.createObjectStore('mutations', { keyPath: 'id', autoIncrement: true }); };
        req.onerror = () => reject(req.error);
        req.onsuccess = () => {
          const db = req.result;
          const tx = db.transaction('mutations', 'readwrite');
          const out = [];
          for (const r of records) tx.objectStore('mutations').add(r).onsuccess = (e) => out.push(e.target.result);
          tx.oncomplete = () => { db.close(); resolve(out); };
          tx.onerror = () => reject(tx.error);
        };
      }), v1);
      assert.equal(ids.length, v1.length);

      // The worker starts on this database (signed out: nothing can be sent).
      await h.openDemo({ page, path: swPath({}) });
      const queue = await listQueue(page);
      const bytes = (s) => Buffer.byteLength(s, 'utf8');
      assert.deepEqual(
        queue.map((r) => ({ id: r.id, method: r.method, path: r.path, ownerId: r.ownerId, workspace: r.workspace, state: r.state, bodySize: r.bodySize })),
        v1.map((r, i) => ({ id: ids[i], method: 'POST', path: r.path, ownerId: null, workspace: [ 'p1', 'p2', null, 'p1' ][i], state: 'queued', bodySize: bytes(r.body) })),
        'every v1 record kept, unknown owner, workspace derived from its path',
      );
      const dbVersion = await page.evaluate(async () => (await indexedDB.databases()).find((d) => d.name === 'sw-outbox')?.version);
      assert.equal(dbVersion, 3, 'the database was upgraded to version 3');

      await clearReports(page);
      await signIn(page, 'alice');
      // The worker's start flush (signed out: no-session) may report after the clear; the
      // sign-in flush's report is the one that is not no-session.
      const blocked = await eventually(async () => (await reports(page))
        .filter((m) => m.type === 'MUTATIONS_BLOCKED')
        .find((m) => m.blocked.length && m.blocked.every((b) => b.reason !== 'no-session')),
      { what: 'the sign-in flush\'s report' });
      assert.deepEqual(blocked.blocked.map((b) => [b.id, b.reason]), ids.map((id) => [id, 'unknown-owner']),
        'alice\'s sign-in flush lists them unknown-owner and sends nothing');
      assert.deepEqual(await h.applied(), []);

      const adopted = await page.evaluate(() => window.demo.client.adopt('alice'));
      assert.equal(adopted.ok, true, JSON.stringify(adopted));
      assert.equal(adopted.affected, v1.length);
      await eventually(async () => (await listQueue(page)).length === 0 || ((await flush(page)) && false),
        { timeout: 30000, what: 'the adopted records to be replayed' });
      const applied = await h.applied();
      const rows = applied.map((a) => [a.user, a.method, a.path, a.body]);
      const want = v1.map((r) => ['alice', 'POST', `/api${r.path}`, r.body]);
      assert.deepEqual([...rows].sort(), [...want].sort(), 'each applied once, bodies byte for byte');
      // p1 and p2 are independent lanes; the note is a barrier: after both earlier records,
      // before the later p1 one.
      const at = want.map((w) => rows.findIndex((r) => JSON.stringify(r) === JSON.stringify(w)));
      assert.ok(at[2] > at[0] && at[2] > at[1] && at[3] > at[2], `replay order respects the lanes and the barrier: ${at}`);
      const keys = applied.map((a) => a.key);
      assert.ok(keys.every((k) => /^[A-Za-z0-9_-]{22,64}$/.test(k ?? '')), `each sent with a key: ${keys}`);
      assert.equal(new Set(keys).size, keys.length, 'distinct keys');
    }));

  test('a corrupt record is reported corrupt-record and blocks nothing else in its workspace',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = await openConfigured({});
      await h.setNetwork(false);
      const a = await queuedWrite(page, P('p1'), { title: 'before the corrupt one' });
      if (!lacks(engine, 'stopWorkers')) await h.stopWorkers();
      const corruptId = await page.evaluate(() => new Promise((resolve, reject) => {
        const req = indexedDB.open('sw-outbox', 3);
        req.onerror = () => reject(req.error);
        req.onupgradeneeded = () => reject(new Error('the database should exist at version 3'));
        req.onsuccess = () => {
          const db = req.result;
          const tx = db.transaction('mutations', 'readwrite');
          let id;
          // Claims alice and p1, so that if it were read as a record it would hold p1 back.
          tx.objectStore('mutations').add({
            method: 42, path: ['not', 'a', 'path'], body: { not: 'bytes' }, contentType: 7,
            timestamp: 'yesterday', ownerId: 'alice', workspace: 'p1', idempotencyKey: 12345,
            state: 'queued', attentionReason: null, serverFailures: 'many',
          }).onsuccess = (e) => { id = e.target.result; };
          tx.oncomplete = () => { db.close(); resolve(id); };
          tx.onerror = () => reject(tx.error);
        };
      }));
      assert.ok(corruptId > a.id);
      const b = await queuedWrite(page, P('p1'), { title: 'after the corrupt one' });
      assert.ok(b.id > corruptId);
      await h.setNetwork(true);

      await clearReports(page);
      const r = await flush(page);
      assert.equal(r.ok, true, JSON.stringify(r));
      const { blocked, summary } = await waitForFlushReports(page);
      assert.deepEqual(blocked?.blocked.map((x) => [x.id, x.reason]), [[corruptId, 'corrupt-record']],
        'only the corrupt record is blocked');
      // b was queued behind a (lane order); its sync registration may start a flush that
      // replays both before this one does: between them, both were replayed.
      assert.equal(summary?.type, 'MUTATIONS_PARTIAL', JSON.stringify(summary));
      assert.equal(summary.remaining, 1, JSON.stringify(summary));
      const applied = await eventually(async () => { const x = await h.applied(); return x.length >= 2 ? x : null; },
        { what: 'both p1 records to be applied' });
      assert.deepEqual(applied.map((x) => x.key), [a.key, b.key], 'both p1 records applied once, in order');
      const queue = await listQueue(page);
      assert.deepEqual(queue.map((x) => x.id), [corruptId], 'the corrupt record is kept');
      assert.notEqual(queue[0].state, 'queued', `it is not presented as a sendable record: ${JSON.stringify(queue[0])}`);
    }));

  /**
   * Polls the requests log while `run` runs and finds keys sent while an earlier request
   * with the same key was still running on the server (seen unanswered at a poll taken after
   * the later one arrived, and answered afterwards). A request that never gets an answer
   * (its client went away) cannot be judged and is listed apart.
   */
  async function watchConcurrentKeys(h, run) {
    const since = await lastSeq(h); // earlier requests (first attempts) are not this run's
    const firstSeen = new Map(); // seq -> poll index
    const answeredAt = new Map(); // seq -> poll index
    const unansweredAt = new Map(); // seq -> last poll index it was unanswered
    const entries = new Map();
    let poll = 0;
    let stop = false;
    const poller = (async () => {
      while (!stop) {
        const rs = await h.requests();
        for (const r of rs) {
          if (!r.key || r.seq <= since) continue;
          entries.set(r.seq, r);
          if (!firstSeen.has(r.seq)) firstSeen.set(r.seq, poll);
          if (r.status === null) unansweredAt.set(r.seq, poll);
          else if (!answeredAt.has(r.seq)) answeredAt.set(r.seq, poll);
        }
        poll += 1;
        await new Promise((res) => setTimeout(res, 40));
      }
    })();
    try {
      await run();
    } finally {
      stop = true;
      await poller;
    }
    const byKey = new Map();
    for (const r of entries.values()) byKey.set(r.key, [...(byKey.get(r.key) ?? []), r]);
    const concurrent = [];
    const abandoned = [];
    for (const [key, rs] of byKey) {
      rs.sort((x, y) => x.seq - y.seq);
      for (const r of rs) if (r.status === null) abandoned.push(r);
      for (let i = 0; i < rs.length; i += 1) {
        for (let j = i + 1; j < rs.length; j += 1) {
          const [x, y] = [rs[i], rs[j]];
          // y arrived before poll firstSeen(y); x was still unanswered at or after it and answered later.
          if (answeredAt.has(x.seq) && (unansweredAt.get(x.seq) ?? -1) >= firstSeen.get(y.seq)) {
            concurrent.push({ key, first: x, second: y });
          }
        }
      }
    }
    return { concurrent, abandoned, byKey };
  }

  test('two tabs flushing at once, and an old and a new worker during an update, send no record twice',
    { timeout: 420000 }, withDiagnostics(harness, async (t) => {
      const h = harness();
      const page = await openConfigured({});
      const page2 = await h.browser.newPage();
      await h.openDemo({ page: page2, path: swPath({}) });
      await page2.waitForFunction(() => window.demo.state.user?.id === 'alice' && window.demo.sessionSynced === true);

      // Part 1: both tabs queue, then both flush at once.
      await h.setNetwork(false);
      const first = [];
      for (let i = 0; i < 6; i += 1) {
        first.push(await queuedWrite(i % 2 ? page2 : page, P(i % 3 ? 'p1' : 'p2'), { title: `two tabs ${i}` }));
      }
      await h.control('faults', { rules: [{ path: '/api/projects/*/tasks', method: 'POST', kind: 'delay', delayMs: 300 }] });
      await h.setNetwork(true);
      const part1 = await watchConcurrentKeys(h, async () => {
        const [r1, r2] = await Promise.all([flush(page), flush(page2)]);
        assert.equal(r1.ok && r2.ok, true, `${JSON.stringify(r1)} ${JSON.stringify(r2)}`);
        // A sync event started by the queued writes may have replayed some first, and a
        // FLUSH_QUEUE that joins a flush under way also counts what that flush delivers after
        // it asked (docs/PROTOCOL.md): each tab counts at most the queue, and sending once is
        // checked on the wire below.
        for (const r of [r1, r2]) assert.ok(r.affected <= first.length, `${r1.affected}, ${r2.affected} replayed of ${first.length}`);
      });
      assert.deepEqual(await listQueue(page), []);
      let applied = await h.applied();
      assert.deepEqual(applied.map((a) => a.key).sort(), first.map((w) => w.key).sort(), 'each applied once');
      for (const ws of ['p1', 'p2']) {
        assert.deepEqual(applied.filter((a) => a.path === P(ws)).map((a) => a.key),
          first.filter((w) => w.path === P(ws)).map((w) => w.key), `${ws} in issue order`);
      }
      assert.deepEqual(part1.concurrent, [], 'no key was sent while a request with it was running');
      for (const w of first) {
        assert.equal(part1.byKey.get(w.key)?.length, 1, `record ${w.id} was sent exactly once: ${JSON.stringify(part1.byKey.get(w.key))}`);
      }

      // Part 2: a slow flush under way in the old worker when a new version installs.
      // The versions' statuses, for the diagnostics, where the engine reports them (CDP).
      const watch = h.browser.watchWorkerVersions ? await h.browser.watchWorkerVersions() : null;
      const versions = watch?.versions ?? [];
      const t0 = Date.now();
      const steps = [];
      const step = (what) => steps.push(`${((Date.now() - t0) / 1000).toFixed(1)}s ${what}`);
      await h.setNetwork(false);
      const second = [];
      for (let i = 0; i < 5; i += 1) {
        second.push(await queuedWrite(i % 2 ? page2 : page, P(i < 3 ? 'p1' : 'p3'), { title: `update ${i}` }));
      }
      await h.control('faults', { rules: [{ path: '/api/projects/*/tasks', method: 'POST', kind: 'delay', delayMs: 1500 }] });
      const since = await lastSeq(h);
      await h.setNetwork(true);
      const oldScript = await page.evaluate(() => navigator.serviceWorker.controller.scriptURL);
      const newConfig = { replayConcurrency: 2 };
      const part2 = await watchConcurrentKeys(h, async () => {
        step('slow flush asked (old worker)');
        const slowFlush = page.evaluate(() => window.demo.client.flush().catch((e) => ({ lost: e.message })));
        // Once the old worker's first replay is running on the server, install a new version.
        await eventually(async () => writesIn(await h.requests(), since).some((r) => r.status === null),
          { timeout: 15000, interval: 20, what: 'the old worker\'s first replay to be under way' });
        step('first replay under way; registering a new version');
        const registeredAt = Date.now();
        const newScript = await page2.evaluate(async (cfg) => {
          const url = `/sw.js?config=${encodeURIComponent(JSON.stringify(cfg))}`;
          const reg = await navigator.serviceWorker.register(url, { scope: '/' });
          await new Promise((res) => {
            const done = () => reg.active?.scriptURL.endsWith(url) && navigator.serviceWorker.controller?.scriptURL.endsWith(url);
            if (done()) return res();
            const timer = setInterval(() => { if (done()) { clearInterval(timer); res(); } }, 20);
          });
          return navigator.serviceWorker.controller.scriptURL;
        }, newConfig);
        step('new version active and controlling');
        assert.notEqual(newScript, oldScript, 'a new worker version controls the tabs');
        // The old worker's flush ends within its budget; the new version should take over
        // soon after. A page event that restarts the old worker while Chromium stops it
        // holds the update until Chromium's lame-duck limit (five minutes, because DevTools
        // is attached here; the 30 s idle timeout without it). The worker's nudge
        // (docs/PROTOCOL.md section 8) renews the stop request once per update, so a second
        // restart can still wait for the limit. Reported here; update-handover.test.mjs
        // asserts the hand-over after one forced restart.
        const takeover = Date.now() - registeredAt;
        t.diagnostic(`take-over after ${(takeover / 1000).toFixed(1)} s${takeover > 60000 ? ' (held by the lame-duck limit)' : ''}`);
        // Both tabs flush through the new worker while the old one may still be flushing.
        const [a, b] = await Promise.all([
          page.evaluate(() => window.demo.client.flush().catch((e) => ({ lost: e.message }))),
          page2.evaluate(() => window.demo.client.flush().catch((e) => ({ lost: e.message }))),
        ]);
        step('both tabs\' flushes answered');
        const old = await slowFlush;
        step('old worker\'s flush answered');
        t.diagnostic(`old worker's flush answered ${JSON.stringify(old)}; new worker's: ${JSON.stringify(a)} ${JSON.stringify(b)}`);
        await h.control('faults', { rules: [] });
        await eventually(async () => {
          const r = await page.evaluate(() => window.demo.client.flush().catch((e) => ({ ok: false, reason: e.message })));
          const q = await listQueue(page);
          return r.ok && q.every((x) => x.state !== 'queued');
        }, { timeout: 60000, interval: 300, what: 'the queue to settle after the update' });
      });
      step('settled');
      await watch?.stop();
      t.diagnostic(`timeline: ${steps.join('; ')}`);

      applied = await h.applied();
      const keys = applied.map((a) => a.key);
      assert.equal(new Set(keys).size, keys.length, `no key applied twice: ${JSON.stringify(applied)}`);
      const left = await listQueue(page);
      for (const w of second) {
        const times = keys.filter((k) => k === w.key).length;
        const rec = left.find((x) => x.id === w.id);
        if (rec) {
          // Only outcome-unknown may remain: the old worker went away mid-request.
          assert.equal(rec.attentionReason, 'outcome-unknown', `record ${w.id} left as ${JSON.stringify(rec)}`);
          assert.ok(times <= 1);
        } else {
          assert.equal(times, 1, `record ${w.id} applied exactly once`);
        }
      }
      assert.deepEqual(part2.concurrent.map((c) => [c.key, c.first.seq, c.second.seq]), [],
        'no key was sent while a request with it was still running (one Web Lock across the two workers)');
      const resent = second.filter((w) => (part2.byKey.get(w.key)?.length ?? 0) > 1)
        .map((w) => `#${w.id}: ${part2.byKey.get(w.key).map((r) => `seq ${r.seq} status ${r.status}`).join(', ')}`);
      const seen = [...new Map(versions.map((v) => [v.id, v])).values()];
      if (watch) t.diagnostic(`worker versions seen: ${JSON.stringify(versions.filter((v, i, all) => i === 0 || JSON.stringify({ ...v, at: 0 }) !== JSON.stringify({ ...all[i - 1], at: 0 })).map((v) => `${v.at}s ${v.id}:${v.status}/${v.running}`))}`);
      // Whether this run met the race: the old version started again after the new one had installed.
      const installedAt = versions.findIndex((v) => v.id !== versions[0].id && v.status === 'installed');
      const raced = installedAt >= 0 && versions.slice(installedAt)
        .some((v) => v.id === versions[0].id && v.status === 'activated' && v.running === 'starting');
      if (watch) t.diagnostic(`old worker restarted while the new one waited: ${raced ? 'yes' : 'no'}`);
      t.diagnostic(`distinct versions: ${watch ? seen.length : 'not reported by this engine'}; records sent more than once (sequentially): ${resent.length ? resent.join('; ') : 'none'}; left: ${JSON.stringify(left.map((x) => [x.id, x.state, x.attentionReason]))}`);
      await page2.close();
    }));
});
