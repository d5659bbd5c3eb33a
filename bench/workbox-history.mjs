#!/usr/bin/env node
// Why the old benchmark measured Workbox replaying 1000 writes in 41 s: the replay's cost
// depends on how many records the queue's IndexedDB database has deleted before.
//
//   node bench/workbox-history.mjs [--n=1000] [--deleted=12000] [--reps=1] [--idle=10000]
//
// Each case runs on a fresh origin (its own database) in one headless Chromium, with the
// Workbox subject plus timing (bench/workbox/sw-timed-src.js):
//   fresh             fill n writes offline (10 lanes), then replayRequests()
//   after-deletes     first queue and remove `deleted` records (batches of 1000, the way
//                     the old benchmark emptied the queue between rows: shiftRequest until
//                     empty), then the same fill and replay
//   after-deletes+idle  the same, then the worker stopped and `idle` ms without a connection
//                     to the database before the fill
// Reported: the replay's time, and the median time of one shiftRequest() and of one
// replayed fetch(), and the mean shift of the first and of the last 100 records.
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { CHROMIUM_ARGS } from '../tests/e2e/harness.mjs';
import { bundleWorker } from './harness.mjs';
import { median, r2 } from './report.mjs';

const BENCH = dirname(fileURLToPath(import.meta.url));
const arg = (name, dflt) => {
  const a = process.argv.find((x) => x.startsWith(`--${name}=`));
  return a ? Number(a.slice(name.length + 3)) : dflt;
};
const N = arg('n', 1000);
const DELETED = arg('deleted', 12000);
const REPS = arg('reps', 1);
const IDLE = arg('idle', 10000);

const outDir = join(BENCH, 'out/workbox-timed');
mkdirSync(outDir, { recursive: true });
bundleWorker(join(BENCH, 'workbox/sw-timed-src.js'), join(outDir, 'workbox-timed-sw.js'));

const child = spawn(process.execPath, [join(BENCH, 'server.mjs')], { stdio: ['ignore', 'pipe', 'inherit'] });
const master = await new Promise((ok) => createInterface({ input: child.stdout }).on('line', (l) => { const m = /master on (http:\S+)/.exec(l); if (m) ok(m[1]); }));
const post = async (url, body) => (await fetch(url, { method: 'POST', body: JSON.stringify(body) })).json();
const profile = mkdtempSync(join(tmpdir(), 'sw-outbox-wbhist-'));
const context = await chromium.launchPersistentContext(profile, { executablePath: process.env.CHROMIUM_BIN || '/usr/bin/chromium', headless: true, args: CHROMIUM_ARGS });
const mean = (xs) => xs.reduce((a, b) => a + b, 0) / xs.length;

async function runCase(name, { deleted = 0, idle = false }) {
  const { port } = await post(`${master}/site`, { roots: [outDir, join(BENCH, 'pages')] });
  const origin = `http://127.0.0.1:${port}`;
  const page = await context.newPage();
  try {
    await page.goto(`${origin}/bench.html?subject=workbox`);
    await page.waitForFunction(() => window.benchReady === true);
    await page.evaluate(() => window.bench.register('/workbox-timed-sw.js'));
    let churnMs = 0;
    // (the server down meanwhile: the sync event that pushRequest fires must not send them)
    await post(`${origin}/__bench/down`, { down: true });
    if (deleted) churnMs = (await page.evaluate((a) => window.bench.call({ op: 'churn', ...a }), { count: deleted, batch: 1000, bytes: 1024 })).ms;
    if (idle) {
      const cdp = await context.newCDPSession(page);
      await cdp.send('ServiceWorker.enable');
      await cdp.send('ServiceWorker.stopAllWorkers');
      await cdp.detach();
      await new Promise((r) => setTimeout(r, IDLE));
    }
    await post(`${origin}/__bench/reset`, {});
    const fill = await page.evaluate((a) => window.bench.fill(a), { n: N, workspaces: 10, run: name, bytes: 1024 });
    const queued = (await page.evaluate(() => window.bench.call({ op: 'size' }))).size;
    await post(`${origin}/__bench/down`, { down: false });
    const r = await page.evaluate(() => window.bench.call({ op: 'replay' }));
    const lg = await (await fetch(`${origin}/__bench/log`)).json();
    return {
      name, deleted, idle, churnMs: r2(churnMs), fillMs: r2(fill.totalMs), queued, applied: lg.applied,
      replayMs: r2(r.ms), perSec: r2(N / (r.ms / 1000)),
      shiftP50: r2(median(r.shift)), fetchP50: r2(median(r.fetch)),
      shiftFirst100: r2(mean(r.shift.slice(0, 100))), shiftLast100: r2(mean(r.shift.slice(-101, -1))),
      shiftTotalMs: r2(r.shift.reduce((a, b) => a + b, 0)), fetchTotalMs: r2(r.fetch.reduce((a, b) => a + b, 0)),
    };
  } finally {
    await page.close();
  }
}

try {
  const rows = [];
  for (let rep = 0; rep < REPS; rep++) {
    rows.push(await runCase('fresh', {}));
    rows.push(await runCase('after-deletes', { deleted: DELETED }));
    rows.push(await runCase('after-deletes+idle', { deleted: DELETED, idle: true }));
  }
  console.log(`Workbox replayRequests() of ${N} (10 workspaces), ${DELETED} records deleted before; idle ${IDLE} ms`);
  console.log('case                 replay ms  writes/s  shift p50  first100  last100  fetch p50  shift total  fetch total  queued/applied');
  for (const x of rows) {
    console.log(`${x.name.padEnd(20)} ${String(x.replayMs).padStart(9)} ${String(x.perSec).padStart(9)} ${String(x.shiftP50).padStart(10)} ${String(x.shiftFirst100).padStart(9)} ${String(x.shiftLast100).padStart(8)} ${String(x.fetchP50).padStart(10)} ${String(x.shiftTotalMs).padStart(12)} ${String(x.fetchTotalMs).padStart(12)}  ${x.queued}/${x.applied}`);
  }
  console.log(JSON.stringify(rows));
} finally {
  await context.close();
  await fetch(`${master}/quit`).catch(() => {});
  child.kill();
  rmSync(profile, { recursive: true, force: true });
}
