// Chromium and Firefox: the browser process killed with SIGKILL, as a phone kills a
// browser, and started again on the same profile (issue 27, "Crashes"; contract 2.4,
// 8). A seeded sequence of rounds (CRASH_SEED, printed; CRASH_ROUNDS, default 4): a
// burst of writes made while the server is unreachable (each answered 202), then the
// browser killed at once — or, with the server back and every write held by it, killed
// while a replay is on the wire (the server goes on, applies it and answers a closed
// connection: the worker never learns). After each restart the page is opened again,
// signed in again (the session cookie is a session's), and the queue drained.
// The server is the Express + express-idempotency app of tests/interop, whose route runs
// to the end when the client is gone, as most servers' do. What a cut replay then comes
// to is the server's: express-idempotency keeps the key's entry without an answer (the
// response never finished) and answers every resend 409, so the record ends
// `needs-attention` / `conflict` and holds its workspace (the reference server's axum
// drops the request instead, and its ledger's claim becomes `outcome-unknown`); either
// way a person decides, as the contract says. The checks, against the server's ground
// truth (/__control/applied and its requests log): every write answered 202 is applied
// exactly once, under alice, in its workspace's order of issue — or, only when it is a
// replay the crash cut or stands behind one in its workspace, kept in the queue, applied
// at most once; nothing is applied twice or lost; a replay cut by the crash is sent
// again with its key.
// WebKit: skipped (lacks 'restartOnProfile', engines.mjs says why).
import assert from 'node:assert/strict';
import { randomInt } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, after, before, test } from 'node:test';
import { startInteropServer } from '../interop/harness.mjs';
import { lacks, selectedEngines } from './engines.mjs';
import { launchChromium } from './chromium.mjs';
import { launchFirefox } from './firefox.mjs';
import { eventually } from './outbox-helpers.mjs';
import { atProcessEnd } from './processes.mjs';

const SEED = process.env.CRASH_SEED ? Number(process.env.CRASH_SEED) >>> 0 : randomInt(0, 2 ** 32 - 1);
const ROUNDS = Number(process.env.CRASH_ROUNDS || 4);
process.stdout.write(`crash: seed=${SEED} rounds=${ROUNDS} (replay: CRASH_SEED=${SEED})\n`);

/** mulberry32, as in the chaos run. */
function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6D2B79F5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const WORKSPACES = ['p1', 'p2', 'p3'];

for (const engine of selectedEngines()) {
  describe(`${engine}: browser killed and restarted`, { skip: lacks(engine, 'restartOnProfile') }, () => {
    let server;
    let profile;
    let browser = null;
    let unhook = () => {};
    const launch = () => (engine === 'chromium' ? launchChromium({ profile }) : launchFirefox({ profile }));

    before(async () => {
      server = await startInteropServer();
      unhook = atProcessEnd(() => server.stop());
      profile = await mkdtemp(join(tmpdir(), `sw-outbox-crash-${engine}-`));
    });
    after(async () => {
      await browser?.close().catch(() => {});
      await server?.stop().catch(() => {});
      unhook();
      if (profile) await rm(profile, { recursive: true, force: true });
    });

    /** The interop page in the first tab, controlled, signed in as alice. */
    async function openPage() {
      const page = browser.pages()[0] ?? await browser.newPage();
      await page.goto(`${server.baseUrl}/`);
      await page.waitForFunction(() => window.interop
        && (window.interop.startError || (window.interop.client && navigator.serviceWorker.controller)),
      null, { timeout: 30000 });
      const startError = await page.evaluate(() => window.interop.startError ?? null);
      if (startError) throw new Error(`the interop page could not start the outbox: ${startError}`);
      const signed = await page.evaluate(() => window.interop.signIn('alice'));
      assert.equal(signed.status, 200, `alice signs in: ${JSON.stringify(signed)}`);
      assert.equal(signed.session?.ok, true, JSON.stringify(signed.session));
      return page;
    }

    const listQueue = async (page) => (await page.evaluate(() => window.interop.list())).records;

    test(`every write answered 202 survives a SIGKILL of the browser: applied once, in order, or kept for a person when the server cannot tell (seed ${SEED})`,
      { timeout: ROUNDS * 120000 + 60000 }, async (t) => {
        const rng = mulberry32(SEED);
        await server.reset();
        browser = await launch();
        let page = await openPage();
        /** Every write answered 202, in order of issue: {key, ws, title}. */
        const queued = [];
        const cut = [];
        for (let round = 0; round < ROUNDS; round += 1) {
          await server.setNetwork(false);
          const n = 2 + Math.floor(rng() * 4);
          for (let i = 0; i < n; i += 1) {
            const ws = WORKSPACES[Math.floor(rng() * WORKSPACES.length)];
            const title = `round ${round} write ${i}`;
            const r = await page.evaluate(([w, tt]) => window.interop.write(w, tt), [ws, title]);
            assert.equal(r.status, 202, `${title} queued: ${JSON.stringify(r)}`);
            queued.push({ key: r.body.idempotencyKey, id: r.body.id, ws, title });
          }
          const onTheWire = rng() < 0.5;
          let inFlight = null;
          let since = null;
          if (onTheWire) {
            // The server back, each write held: kill while a replay is in its hands.
            // Held on arrival half the time (the crash cuts a write the server never got
            // to: resent, applied once), else in the route, its key claimed (the route
            // goes on without its client; what the resend meets is the server's).
            await server.hold(3000, rng() < 0.5 ? 'arrival' : 'route');
            since = (await server.requests()).length;
            await server.setNetwork(true);
            await page.evaluate(() => { window.interop.flush().catch(() => null); return true; });
            inFlight = await eventually(async () => (await server.requests()).slice(since)
              .find((r) => r.method === 'POST' && r.status === null && queued.some((q) => q.key === r.key)),
            { timeout: 20000, interval: 50, what: 'a replay on the wire' }).catch(() => null);
            // Every lane may wait behind a record an earlier cut left to a person: then
            // nothing goes on the wire, and the kill comes after the burst.
          }
          const killed = await browser.kill();
          assert.ok(killed > 0, 'the browser\'s processes were found and killed');
          // Every replay the kill cut: lanes of several workspaces may be on the wire at once
          // (replayConcurrency), each held by the server (seed 2553252475: two, in p1 and p3).
          const wire = since === null ? [] : (await server.requests()).slice(since)
            .filter((r) => r.method === 'POST' && r.status === null && queued.some((q) => q.key === r.key))
            .map((r) => r.key);
          cut.push(...new Set(wire));
          t.diagnostic(`round ${round}: ${n} writes queued, killed ${inFlight ? `with ${wire.join(', ')} on the wire` : 'right after the burst'}`);
          await browser.close().catch(() => {});
          browser = null;
          await server.hold(0);
          await server.setNetwork(true);
          browser = await launch();
          page = await openPage();
        }
        // Drain: flushes until nothing can move: every record left needs a person, or waits
        // behind one that does in its workspace.
        const settled = (q) => q.every((r) => r.state === 'needs-attention'
          || q.some((a) => a.state === 'needs-attention' && a.workspace === r.workspace && a.id < r.id));
        let left;
        try {
          left = await eventually(async () => {
            const q = await listQueue(page);
            if (settled(q)) return q;
            await page.evaluate(() => window.interop.flush().catch(() => null));
            return null;
          }, { timeout: 90000, interval: 1000, what: 'the queue to drain after the last restart' });
        } catch (e) {
          const rs = (await server.requests()).slice(-15).map((r) => `${r.seq} ${r.method} ${r.path} ${r.status} ${r.user ?? '-'} ${r.key ?? ''}`);
          e.message += `\nqueue: ${JSON.stringify(await listQueue(page).catch((x) => String(x)))}\nlast requests:\n${rs.join('\n')}`;
          throw e;
        }

        const applied = await server.applied();
        const cutIds = queued.filter((q) => cut.includes(q.key)).map((q) => q.id);
        for (const r of left) {
          if (r.state === 'needs-attention') {
            assert.ok(cutIds.includes(r.id) && ['conflict', 'outcome-unknown'].includes(r.attentionReason),
              `only a replay the crash cut needs a person (the server cannot tell its outcome): ${JSON.stringify(r)}`);
          }
        }
        for (const q of queued) {
          const rows = applied.filter((a) => a.key === q.key);
          assert.ok(rows.length <= 1, `${q.title} (${q.key}) never applied twice: ${JSON.stringify(rows)}`);
          const kept = left.some((r) => r.id === q.id);
          assert.ok(rows.length === 1 || kept, `${q.title} (${q.key}) is applied or kept, never lost`);
          if (!cut.includes(q.key) && kept) {
            assert.ok(left.some((r) => r.state === 'needs-attention' && r.workspace === q.ws && r.id < q.id),
              `${q.title} is kept only behind a cut replay of its workspace: ${JSON.stringify(left)}`);
          }
          if (rows.length) assert.equal(rows[0].account, 'alice', `${q.title} applied under alice`);
        }
        assert.ok(applied.every((a) => queued.some((q) => q.key === a.key)), 'nothing else was applied');
        for (const ws of WORKSPACES) {
          const appliedKeys = new Set(applied.map((a) => a.key));
          const issued = queued.filter((q) => q.ws === ws && appliedKeys.has(q.key)).map((q) => q.key);
          const order = applied.filter((a) => a.pid === ws).map((a) => a.key);
          assert.deepEqual(order, issued, `${ws}: applied in the order of issue`);
        }
        t.diagnostic(`${queued.length} writes: ${applied.length} applied, ${left.length} kept (${cut.length} replays cut)`);
        const requests = await server.requests();
        for (const key of cut) {
          const sends = requests.filter((r) => r.key === key && r.method === 'POST');
          assert.ok(sends.length >= 2, `the replay cut by the crash (${key}) was sent again with its key: ${JSON.stringify(sends)}`);
        }
      });
  });
}
