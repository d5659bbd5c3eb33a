#!/usr/bin/env node
// Where a service worker's time goes: a V8 CPU profile of the worker of one subject while
//  - `--phase=enqueue` (default): a page sends N writes (`--inflight` at a time; 1 = one
//    after another) and the bench server drops every connection (real network failures);
//  - `--phase=replay`: N writes are queued offline over `--workspaces` workspaces (as row 3
//    of bench/run.mjs), the server comes back, and the profile covers the replay only.
// Prints records/s, how busy the worker thread was, its busy time per record grouped by
// kind (wasm, JS of the worker, browser natives, GC, …) and the functions with the most
// self time.
//
//   node bench/profile.mjs [--phase=enqueue|replay] [--subject=product|workbox|plain|floor]
//        [--n=500] [--inflight=16] [--workspaces=10] [--cpu=1] [--latency=0] [--www=DIR]
//        [--config=JSON] [--top=20] [--json=FILE]
//
// --cpu=4 runs the browser under the CPU quota of slow-cpu.mjs, calibrated with a loop
// timed inside this very worker. The profiler slows the worker down; the figures are for
// finding hot spots and how they grow, not for comparing subjects' speed (bench/run.mjs).
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { CHROMIUM_ARGS } from '../tests/e2e/harness.mjs';
import { BUSY_EXPRESSION, bundleWorker, http, startServer, WorkerCDP } from './harness.mjs';
import { median, pct, r2 } from './report.mjs';
import { createSlowCpu } from './slow-cpu.mjs';

const BENCH = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(BENCH, '..');
const arg = (name, dflt) => {
  const a = process.argv.find((x) => x.startsWith(`--${name}=`));
  return a ? a.slice(name.length + 3) : dflt;
};
const PHASE = arg('phase', 'enqueue');
const SUBJECT = arg('subject', 'product');
const WORKSPACES = Number(arg('workspaces', 10));
const N = Number(arg('n', 500));
const IN_FLIGHT = Number(arg('inflight', 16));
const CPU = Number(arg('cpu', 1));
const LATENCY = Number(arg('latency', 0));
const TOP = Number(arg('top', 20));
const JSON_OUT = arg('json', null);
const www = resolve(ROOT, arg('www', 'www'));
const CHROMIUM = process.env.CHROMIUM_BIN || '/usr/bin/chromium';

const out = join(BENCH, 'out/profile');
mkdirSync(out, { recursive: true });
const roots = {
  product: [www, join(BENCH, 'pages')],
  workbox: [join(out, 'workbox'), join(BENCH, 'pages')],
  plain: [join(BENCH, 'raw'), join(BENCH, 'pages')],
  floor: [join(BENCH, 'raw'), join(BENCH, 'pages')],
};
const SW = {
  product: `/sw.js?config=${encodeURIComponent(arg('config', JSON.stringify({ precache: [], replayConcurrency: 10 })))}`,
  workbox: '/workbox-sw.js',
  plain: '/plain-outbox-sw.js',
  floor: '/floor-sw.js',
};
if (!['enqueue', 'replay'].includes(PHASE)) throw new Error('--phase: enqueue or replay');
if (!roots[SUBJECT]) throw new Error(`--subject: one of ${Object.keys(roots).join(', ')}`);
if (SUBJECT === 'workbox') bundleWorker(join(BENCH, 'workbox/sw-src.js'), join(out, 'workbox/workbox-sw.js'));

/** A frame's kind, for the grouped table. */
function kindOf({ functionName, url }) {
  if (['(idle)', '(program)', '(garbage collector)', '(root)'].includes(functionName)) return functionName;
  if (url.includes('.wasm') || url.startsWith('wasm://') || /^\$?wasm-function|^\$func/.test(functionName)) return 'wasm';
  if (url.endsWith('sw_outbox.js')) return 'JS: wasm-bindgen glue';
  if (url) return `JS: ${url.split('/').pop().split('?')[0]}`;
  if (functionName.startsWith('js-to-wasm') || functionName.startsWith('wasm-to-js')) return 'JS↔wasm crossings';
  return functionName ? 'browser natives (no script)' : '(anonymous, no script)';
}

const server = await startServer();
let slow = null;
if (CPU !== 1) {
  slow = createSlowCpu({ name: `sw-outbox-profile-${process.pid}`, wrapperDir: join(out, 'slow-cpu'), chromium: CHROMIUM });
  if (slow.error) throw new Error(`--cpu=${CPU}: ${slow.error}`);
}
const profileDir = mkdtempSync(join(tmpdir(), 'sw-outbox-profile-'));
const context = await chromium.launchPersistentContext(profileDir, { executablePath: slow ? slow.wrapper : CHROMIUM, headless: true, args: CHROMIUM_ARGS });
try {
  const { port } = await http(`${server.master}/site`, { roots: roots[SUBJECT], latencyMs: LATENCY });
  const origin = `http://127.0.0.1:${port}`;
  const page = await context.newPage();
  await page.goto(`${origin}/bench.html?subject=${SUBJECT}`);
  await page.waitForFunction(() => window.benchReady === true);
  await page.evaluate((u) => window.bench.register(u), SW[SUBJECT]);
  await http(`${origin}/__bench/down`, { down: true });
  const writes = (n, ws) => (IN_FLIGHT === 1
    ? page.evaluate((a) => window.bench.sequential(a), { n, run: ws, ws })
    : page.evaluate((a) => window.bench.concurrent(a), { n, inFlight: IN_FLIGHT, run: ws, ws }));
  await writes(50, 'warm-up');
  if (PHASE === 'replay') {
    // The warm-up's writes go first, unprofiled; then the queue that is profiled.
    await http(`${origin}/__bench/down`, { down: false });
    await page.evaluate(() => window.bench.replay());
    await http(`${origin}/__bench/down`, { down: true });
    const fill = await page.evaluate((a) => window.bench.fill(a), { n: N, workspaces: WORKSPACES, run: 'profiled' });
    if (Object.keys(fill.statuses).join() !== '202') throw new Error(`fill: ${JSON.stringify(fill.statuses)}`);
    await http(`${origin}/__bench/down`, { down: false });
  }

  const worker = await WorkerCDP.attach(context, page, origin);
  if (!worker) throw new Error('no service worker target');
  const loop = async () => (await worker.send('Runtime.evaluate', { expression: BUSY_EXPRESSION, returnByValue: true })).result.value;
  const cpu = slow ? await slow.calibrate(loop, CPU) : { factor: 1, slowMs: median([await loop(), await loop(), await loop()]) };
  await worker.send('Profiler.enable');
  await worker.send('Profiler.setSamplingInterval', { interval: 200 });
  await worker.send('Profiler.start');
  const t0 = Date.now();
  const result = PHASE === 'replay'
    ? await page.evaluate(() => window.bench.replay())
    : await writes(N, 'profiled');
  const wallMs = Date.now() - t0;
  const { profile } = await worker.send('Profiler.stop');
  await worker.detach();

  const nodes = new Map(profile.nodes.map((x) => [x.id, x]));
  const selfUs = new Map(); const kindUs = new Map();
  profile.samples.forEach((id, i) => {
    const { callFrame } = nodes.get(id);
    const name = `${callFrame.functionName || '(anonymous)'}${callFrame.url ? ` ${callFrame.url.split('/').pop().split('?')[0]}:${callFrame.lineNumber + 1}` : ''}`;
    const dt = profile.timeDeltas[i] ?? 0;
    selfUs.set(name, (selfUs.get(name) ?? 0) + dt);
    const k = kindOf(callFrame);
    kindUs.set(k, (kindUs.get(k) ?? 0) + dt);
  });
  const total = [...selfUs.values()].reduce((a, b) => a + b, 0);
  const idle = kindUs.get('(idle)') ?? 0;
  const statuses = PHASE === 'replay' ? { replay: result.ok, flushes: result.flushes } : result.statuses;
  const perSec = N / (wallMs / 1000);
  const p50 = result.ms ? pct(result.ms, 50) : null;
  const what = PHASE === 'replay' ? `replay of ${N} over ${WORKSPACES} workspaces` : `${N} writes, ${IN_FLIGHT} in flight`;
  console.log(`${SUBJECT}: ${what}, latency ${LATENCY} ms, CPU ${slow ? `quota ${cpu.quotaUs}/${cpu.periodUs} µs, a loop in this worker ${r2(cpu.factor)}× slower (${r2(cpu.baseMs)} → ${r2(cpu.slowMs)} ms)` : `unthrottled (loop ${r2(cpu.slowMs)} ms)`}`);
  console.log(`${JSON.stringify(statuses)}: ${perSec.toFixed(0)} records/s under the profiler${p50 != null ? `, p50 ${r2(p50)} ms` : ''}`);
  console.log(`worker thread busy ${(100 * (1 - idle / total)).toFixed(0)}% of ${(total / 1000).toFixed(0)} ms: ${((total - idle) / 1000 / N).toFixed(3)} ms per record`);
  console.log('busy time per record by kind (ms):');
  const kinds = [...kindUs].filter(([k]) => k !== '(idle)').sort((a, b) => b[1] - a[1]);
  for (const [k, us] of kinds) console.log(`${(us / 1000 / N).toFixed(3).padStart(9)}  ${k}`);
  console.log(`self time (ms over ${N} records), top ${TOP}:`);
  for (const [name, us] of [...selfUs].sort((a, b) => b[1] - a[1]).slice(0, TOP)) console.log(`${(us / 1000).toFixed(1).padStart(9)}  ${name}`);
  if (JSON_OUT) {
    writeFileSync(JSON_OUT, JSON.stringify({
      phase: PHASE, subject: SUBJECT, n: N, workspaces: WORKSPACES, inflight: IN_FLIGHT, latencyMs: LATENCY, cpu, wallMs, perSec: r2(perSec), p50, statuses,
      totalMs: r2(total / 1000), idleMs: r2(idle / 1000),
      kindsMsPerRecord: Object.fromEntries(kinds.map(([k, us]) => [k, r2(us / 1000 / N * 1000) / 1000])),
      top: [...selfUs].sort((a, b) => b[1] - a[1]).slice(0, 60).map(([name, us]) => ({ name, ms: r2(us / 1000) })),
    }, null, 2));
  }
} finally {
  await context.close().catch(() => {});
  await fetch(`${server.master}/quit`).catch(() => {});
  server.child.kill();
  rmSync(profileDir, { recursive: true, force: true });
  if (slow) await slow.dispose();
}
