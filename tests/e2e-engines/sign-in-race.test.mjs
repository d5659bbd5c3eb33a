// Every engine: the sign-in barrier (contract 4.5 end, r3; issue 27, 0) against a server
// that does not check X-PM-Expected-Account: the Express + express-idempotency app of
// tests/interop (not written for the outbox), with CSRF tokens that belong to the
// browser (`device` mode: a token read before a sign-in still passes after it, as with
// csurf's cookie-stored secret) and every write held a little (`hold`), so a flush of a
// few records takes long enough for a sign-in to land in the middle of it.
//
// Each run: alice queues RACE_RECORDS writes offline, the network comes back and a flush
// starts; once the server holds the first replay, after a random part of the flush's
// length, the page signs in as bob (POST /api/auth/login through the worker, then
// AUTH_SESSION, as an app does). Without the barrier the records the flush sends after
// the sign-in carry bob's cookie and alice's token, and the server applies them as bob
// (seen: issue 27). The check, over every run: no write of alice's is ever applied under
// another account, and none of bob's exists. The runs where the sign-in landed with some
// of alice's writes applied and some not are counted: the race must have been met.
//
//   RACE_RUNS=<n> (default 20) runs per engine; E2E_ENGINES as for the other suites.
import assert from 'node:assert/strict';
import { describe, after, before, test } from 'node:test';
import { launchEngine, selectedEngines } from './engines.mjs';
import { startInteropServer } from '../interop/harness.mjs';
import { atProcessEnd } from './processes.mjs';

const RUNS = Number(process.env.RACE_RUNS || 20);
const RECORDS = 4;
const HOLD_MS = 150;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function eventually(fn, what, timeout = 30000, interval = 20) {
  const end = Date.now() + timeout;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
    await sleep(interval);
  }
}

for (const engine of selectedEngines()) {
  describe(`${engine}: sign-in race`, () => {
    let server;
    let browser;
    let unhook = () => {};
    before(async () => {
      server = await startInteropServer();
      unhook = atProcessEnd(() => server.stop());
      browser = await launchEngine(engine);
    });
    after(async () => {
      await browser?.close().catch(() => {});
      await server?.stop().catch(() => {});
      unhook();
    });

    /** Opens the interop page, waits until the worker controls it. */
    async function openPage() {
      const page = browser.pages()[0] ?? await browser.newPage();
      await page.goto(`${server.baseUrl}/`);
      await page.waitForFunction(() => window.interop
        && (window.interop.startError || (window.interop.client && navigator.serviceWorker.controller)),
      null, { timeout: 30000 });
      const startError = await page.evaluate(() => window.interop.startError ?? null);
      if (startError) throw new Error(`the interop page could not start the outbox: ${startError}`);
      return page;
    }

    test(`a sign-in during a flush never gets another account's writes applied (${RUNS} runs)`,
      { timeout: RUNS * 60000 + 60000 },
      async (t) => {
        const page = await openPage();
        const violations = [];
        let raced = 0;
        const outcomes = [];
        for (let run = 0; run < RUNS; run += 1) {
          // A clean start: the device cleared, the server reset, alice signed in.
          const cleared = await page.evaluate(() => window.interop.clearDevice());
          assert.equal(cleared.ok, true, `CLEAR_DEVICE: ${JSON.stringify(cleared)}`);
          await server.reset();
          await server.csrfMode('device');
          const alice = await page.evaluate(() => window.interop.signIn('alice'));
          assert.equal(alice.status, 200, `alice signs in: ${JSON.stringify(alice)}`);
          assert.equal(alice.session?.ok, true, JSON.stringify(alice.session));

          // Offline: alice's writes are queued.
          await server.setNetwork(false);
          const keys = [];
          for (let i = 0; i < RECORDS; i += 1) {
            const r = await page.evaluate((t) => window.interop.write('p1', t), `run ${run} #${i}`);
            assert.equal(r.status, 202, `queued: ${JSON.stringify(r)}`);
            keys.push(r.body.idempotencyKey);
          }
          // Back online, each replay held: a flush starts (the page's; the worker's own
          // triggers may start one first, which the page's joins).
          await server.hold(HOLD_MS);
          await server.setNetwork(true);
          await page.evaluate(() => { window.__raceFlush = window.interop.flush(); return true; });
          await eventually(async () => (await server.running()) > 0, 'the first replay to reach the server');
          await sleep(Math.floor(Math.random() * HOLD_MS * (RECORDS - 1)));
          const bob = await page.evaluate(() => window.interop.signIn('bob'));
          assert.equal(bob.status, 200, `bob signs in: ${JSON.stringify(bob)}`);
          // Settled: nothing running for a while.
          let quiet = 0;
          await eventually(async () => {
            quiet = (await server.running()) === 0 ? quiet + 1 : 0;
            return quiet >= 10;
          }, 'the flushes to settle', 60000, 50);
          await server.hold(0);

          const applied = await server.applied();
          const ofAlice = applied.filter((a) => keys.includes(a.key));
          for (const a of applied) {
            if (!keys.includes(a.key) || a.account !== 'alice') violations.push({ run, ...a });
          }
          const aliceApplied = ofAlice.filter((a) => a.account === 'alice').length;
          outcomes.push(aliceApplied);
          if (aliceApplied > 0 && aliceApplied < RECORDS) raced += 1;
        }
        assert.deepEqual(violations, [], `writes applied under another account than alice's (runs: ${RUNS}, alice's applied per run: ${outcomes.join(',')})`);
        // The race was met: some runs had the sign-in land between alice's replays.
        assert.ok(raced >= Math.max(1, Math.floor(RUNS / 5)),
          `the sign-in landed mid-flush in only ${raced} of ${RUNS} runs (alice's applied per run: ${outcomes.join(',')}): the race was not exercised`);
        t.diagnostic(`sign-in landed mid-flush in ${raced} of ${RUNS} runs; alice's applied per run: ${outcomes.join(',')}`);
      });
  });
}
