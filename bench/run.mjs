#!/usr/bin/env node
// sw-outbox benchmark: this product vs workbox-background-sync vs a plain-JS outbox vs the
// raw browser limit, side by side in one headless Chromium (Debian's /usr/bin/chromium via
// playwright-core), in every *setting*: simulated API round trip (--latency) × CPU
// (--cpu: 1 = this machine, 4 = the browser under a CPU quota that makes a loop inside the
// service worker 4× slower; see slow-cpu.mjs).
//
//   node bench/run.mjs            full run: N=1000, scale 10000, medians of 3, settings
//                                 latency 0,50 × cpu 1,4
//   node bench/run.mjs --smoke    tiny N, every subject once, checks only (no timing asserts)
//   options: --n=1000 --scale=10000 --no-scale --reps=3 --inflight=16 --bytes=1024
//            --workspaces=10 --latency=0,50 --cpu=1,4 --raw-n=200 --keep-alive --www=DIR
//            --only=cold,seq,conc,offline,raw,replay,first,firstonline,pageload
//            --out=bench/out/results.json
//            --loads=8  page loads per subject and round in the page-load row
//            --browser-arg=--disable-features=X  one more Chromium switch (e.g. to see what
//                                    a browser feature costs in a row; the run says so)
//            --report=a.json,b.json  print the tables and draw the SVG from earlier runs
//            --fault=duplicate|drop  self-test: the server applies some writes twice / not at
//                                    all, so the checks must report the subjects broken
//
// Every measurement of every subject runs on a fresh origin (its own registration and
// IndexedDB), so no subject carries the records deleted by an earlier row (see README:
// that history is what made Workbox's replay 41 s).
//
// Exits 1 when a subject is broken (a write not answered 202 while offline, a replay that
// lost, duplicated or reordered writes, a queue not empty after replay), 2 when the harness
// failed. No time is ever asserted.
import { spawnSync } from 'node:child_process';
import { copyFileSync, cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, tmpdir, totalmem } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { CHROMIUM_ARGS } from '../tests/e2e/harness.mjs';
import { bundleWorker, http, startServer, WorkerCDP } from './harness.mjs';
import { shippedSw } from '../scripts/shipped-sw.mjs';
import { createSlowCpu } from './slow-cpu.mjs';
import { renderSvg } from './svg.mjs';
import { median, pct, r2, settingLabel, summaryMarkdown, targetsMarkdown } from './report.mjs';

const BENCH = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(BENCH, '..');
const OUT = join(BENCH, 'out');
const CHROMIUM = process.env.CHROMIUM_BIN || '/usr/bin/chromium';

// ---------------------------------------------------------------- options
const argv = Object.fromEntries(process.argv.slice(2).map((a) => {
  const m = /^--([^=]+)(?:=(.*))?$/.exec(a);
  if (!m) throw new Error(`unknown argument ${a}`);
  return [m[1], m[2] ?? true];
}));
const SMOKE = !!argv.smoke;
const list = (v) => String(v).split(',').filter(Boolean).map(Number);
const PHASES = ['cold', 'seq', 'conc', 'offline', 'raw', 'replay', 'first', 'firstonline', 'pageload'];
const n = Number(argv.n ?? (SMOKE ? 20 : 1000));
const opt = {
  n,
  scale: argv['no-scale'] ? 0 : Number(argv.scale ?? (SMOKE ? 40 : 10000)),
  reps: Number(argv.reps ?? (SMOKE ? 1 : 3)),
  inflight: Number(argv.inflight ?? 16),
  bytes: Number(argv.bytes ?? 1024),
  workspaces: Number(argv.workspaces ?? 10),
  warmup: SMOKE ? 3 : 20,
  settleMs: SMOKE ? 200 : 500, // after stopping the workers, before the first write
  latencies: list(argv.latency ?? (SMOKE ? '0' : '0,50')),
  cpus: list(argv.cpu ?? (SMOKE ? '1' : '1,4')),
  rawN: Number(argv['raw-n'] ?? Math.min(n, 200)), // raw POST loops when latency > 0
  keepAlive: !!argv['keep-alive'], // the server keeps connections open (default: Connection: close)
  www: resolve(argv.www ? String(argv.www) : join(ROOT, 'www')), // the product build to measure
  phases: argv.only ? String(argv.only).split(',') : PHASES,
  scaleSubjects: String(argv['scale-subjects'] ?? (SMOKE ? 'product' : 'product,workbox')).split(','),
  loads: Number(argv.loads ?? (SMOKE ? 2 : 8)), // page loads per subject and round (row 7)
  out: resolve(argv.out ?? join(OUT, SMOKE ? 'smoke.json' : 'results.json')),
  browserArgs: argv['browser-arg'] ? [String(argv['browser-arg'])] : [],
};
for (const p of opt.phases) if (![...PHASES, 'scale'].includes(p)) throw new Error(`--only: unknown phase ${p}`);
const problems = [];
const T0 = Date.now();
const log = (...a) => console.error(`[bench ${((Date.now() - T0) / 1000).toFixed(1)}s]`, ...a);

// ---------------------------------------------------------------- prepare subjects
function prepare() {
  if (!existsSync(join(opt.www, 'pkg/sw_outbox_wasm.js'))) {
    if (opt.www !== join(ROOT, 'www')) throw new Error(`${opt.www}/pkg/sw_outbox_wasm.js is missing`);
    log('www/pkg missing: running ./build.sh');
    const b = spawnSync('./build.sh', { cwd: ROOT, stdio: 'inherit' });
    if (b.status !== 0) throw new Error('./build.sh failed');
  }
  mkdirSync(OUT, { recursive: true });
  // A snapshot, so a concurrent rebuild of www/ cannot change the subject mid-run.
  const www = join(OUT, 'www');
  rmSync(www, { recursive: true, force: true });
  cpSync(opt.www, www, { recursive: true });
  const wb = join(OUT, 'workbox');
  mkdirSync(wb, { recursive: true });
  bundleWorker(join(BENCH, 'workbox/sw-src.js'), join(wb, 'workbox-sw.js'));
  return { www, wb, load: writeLoadPage(join(OUT, 'load')) };
}

/** The page of row 7: /load.html with LOAD_FILES subresources (scripts, style sheets,
 * images, a third each), under /load/. Written at start; the server answers each after
 * 5 ms plus the setting's latency (server.mjs). */
const LOAD_FILES = 24;
function writeLoadPage(dir) {
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(join(dir, 'load'), { recursive: true });
  const files = [];
  const pad = (n) => `/* ${'x'.repeat(n)} */`;
  for (let i = 0; i < LOAD_FILES; i++) {
    const kind = ['js', 'css', 'svg'][i % 3];
    const name = `/load/f${i}.${kind}`;
    files.push(name);
    const body = kind === 'js' ? `${pad(2000)}\nwindow.__loaded = (window.__loaded || 0) + 1;\n`
      : kind === 'css' ? `${pad(2000)}\n.f${i} { color: #${(i * 4099).toString(16).padStart(6, '0').slice(0, 6)}; }\n`
        : `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16"><rect width="16" height="16" fill="#${(i * 2731).toString(16).padStart(6, '0').slice(0, 6)}"/></svg>\n`;
    writeFileSync(join(dir, name), body);
  }
  const tag = (f) => (f.endsWith('.js') ? `<script src="${f}"></script>` : f.endsWith('.css') ? `<link rel="stylesheet" href="${f}">` : `<img src="${f}" alt="">`);
  writeFileSync(join(dir, 'load.html'), `<!doctype html>\n<meta charset="utf-8">\n<link rel="icon" href="data:,">\n<title>a page of ${LOAD_FILES} files</title>\n${files.filter((f) => !f.endsWith('.svg')).map(tag).join('\n')}\n<p>a page of ${LOAD_FILES} files</p>\n${files.filter((f) => f.endsWith('.svg')).map(tag).join('\n')}\n`);
  return { dir, files: ['/load.html', ...files] };
}

function gzip9(file, bytes = readFileSync(file)) {
  const g = spawnSync('gzip', ['-9', '-c'], { input: bytes, maxBuffer: 64 << 20 });
  if (g.status !== 0) throw new Error(`gzip -9 ${file} failed`);
  return g.stdout.length;
}

function sizes(www, wb) {
  // The module ships as pkg/sw_outbox_wasm.js (its bytes in a script, issue 37).
  const files = { wasm: 'pkg/sw_outbox_wasm.js', glue: 'pkg/sw_outbox.js', 'sw.js': 'sw.js' };
  const product = {};
  for (const [k, f] of Object.entries(files)) {
    const p = join(www, f);
    // sw.js as the package ships it, without its comments (scripts/shipped-sw.mjs).
    const bytes = f === 'sw.js' ? Buffer.from(shippedSw(readFileSync(p, 'utf8'))) : readFileSync(p);
    product[k] = { raw: bytes.length, gzip9: gzip9(p, bytes) };
  }
  const three = Object.keys(files);
  product.total = { raw: three.reduce((s, k) => s + product[k].raw, 0), gzip9: three.reduce((s, k) => s + product[k].gzip9, 0) };
  const wbFile = join(wb, 'workbox-sw.js');
  const plainFile = join(BENCH, 'raw/plain-outbox-sw.js');
  return {
    product,
    workbox: { raw: readFileSync(wbFile).length, gzip9: gzip9(wbFile) },
    plain: { raw: readFileSync(plainFile).length, gzip9: gzip9(plainFile) },
  };
}

// ---------------------------------------------------------------- subjects
const PRODUCT_CFG = { precache: [], replayConcurrency: 10 };
const PRODUCT_C4_CFG = { precache: [] }; // replayConcurrency: the product's default (4)
const SUBJECT_SW = {
  product: (cfg) => `/sw.js?config=${encodeURIComponent(JSON.stringify(cfg))}`,
  workbox: () => '/workbox-sw.js',
  plain: () => '/plain-outbox-sw.js',
  raw: () => '/raw-sw.js',
  floor: () => '/floor-sw.js', // row 2's floor: every write 202 from memory, nothing stored
  none: () => null, // row 7's page without a worker
};
const SUBJECTS = ['product', 'workbox', 'plain']; // the outboxes of rows 1–4
/** Row 2's subjects: the outboxes and the per-fetch-event floor (issue 36, 5). */
const CONC_SUBJECTS = [...SUBJECTS, 'floor'];
/** The first online write's subjects (issue 36, 1): the outboxes and a page without a
 * worker (`none`: its writes go straight to the server). */
const ONLINE_SUBJECTS = [...SUBJECTS, 'none'];
/** Row 7's subjects: [name, subject served, configuration]. `productShell` is the
 * product with the load page as its app shell (every file of the page is then the
 * outbox's, answered network-first by sw.js without the module); `none` registers no
 * worker. */
const LOADERS = (files) => [
  ['product', 'product', PRODUCT_CFG], ['productShell', 'product', { precache: files }],
  ['productStatic', 'product', { ...PRODUCT_CFG, staticRoutes: true }],
  ['workbox', 'workbox'], ['none', 'none'],
];
const REPLAYERS = [['product', 'product', PRODUCT_CFG], ['productC4', 'product', PRODUCT_C4_CFG], ['workbox', 'workbox'], ['plain', 'plain']];

// ---------------------------------------------------------------- one setting
async function runSetting(setting, env) {
  const { latencyMs, cpu } = setting;
  const label = settingLabel(setting);
  const started = Date.now();
  const out = { key: setting.key, latencyMs, cpu, label, loadStart: loadavg().map(r2) };
  log(`=== setting ${label} (load ${out.loadStart.join(' ')})`);
  let slow = null;
  if (cpu !== 1) {
    slow = createSlowCpu({ name: `sw-outbox-bench-${process.pid}-${setting.key}`, wrapperDir: join(OUT, 'slow-cpu'), chromium: CHROMIUM });
    if (slow.error) throw new Error(`--cpu=${cpu}: ${slow.error}`);
    env.cleanups.add(slow.dispose);
  }
  const profile = mkdtempSync(join(tmpdir(), 'sw-outbox-bench-'));
  const launch = (dir) => chromium.launchPersistentContext(dir, {
    executablePath: slow ? slow.wrapper : CHROMIUM, headless: true, args: [...CHROMIUM_ARGS, ...opt.browserArgs],
  });
  const context = await launch(profile);
  env.browser ??= context.browser()?.version() ?? spawnSync(CHROMIUM, ['--version'], { encoding: 'utf8' }).stdout.trim();
  const consoleErrors = [];
  context.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
  context.on('weberror', (e) => consoleErrors.push(String(e.error())));
  let runId = 0;
  const nextRun = () => `r${Date.now().toString(36)}-${setting.key}-${++runId}`;
  const expect202 = (what, statuses, count) => {
    if ((statuses['202'] || 0) !== count) problems.push(`${label}: ${what}: expected ${count} × 202, got ${JSON.stringify(statuses)}`);
  };

  async function newSite(subject, cfg = PRODUCT_CFG, browserContext = context) {
    const { port } = await http(`${env.server.master}/site`, { roots: env.roots[subject], latencyMs, keepAlive: opt.keepAlive, loadPageDelayMs: 5 + latencyMs });
    const origin = `http://127.0.0.1:${port}`;
    const page = await browserContext.newPage();
    await page.goto(`${origin}/bench.html?subject=${subject}`);
    await page.waitForFunction(() => window.benchReady === true);
    const swUrl = SUBJECT_SW[subject](cfg);
    return {
      subject, origin, page, swUrl, fills: 0,
      control: (what, body) => http(`${origin}/__bench/${what}`, body),
      down: (down) => http(`${origin}/__bench/down`, { down }),
      reset: () => http(`${origin}/__bench/reset`, {}),
      register: () => page.evaluate((u) => window.bench.register(u), swUrl),
      ev: (fn, arg) => page.evaluate(fn, arg),
      async dispose({ stopWorker = true } = {}) {
        await page.evaluate(() => window.bench.unregister()).catch(() => {});
        // and stop it: nothing of a finished measurement may run beside the next one
        if (stopWorker) await env.stopWorkers?.().catch(() => {});
        await page.close().catch(() => {});
        await http(`${origin}/__bench/close`, {}).catch(() => {});
      },
    };
  }
  /** A fresh origin with its worker registered and ready; disposed after `fn`. */
  /** When each step of the restarted worker's start happened, in ms after the page's
   * fetch began (epoch times on both sides): the worker's time origin, then its User
   * Timing marks (the product's `sw-outbox:*` in www/sw.js, the peers' `bench:*`), then
   * the page's answer. */
  async function workerStartSteps(site, fetchAt, answeredMs, answered = 'answer read by the page') {
    const worker = await WorkerCDP.attach(context, site.page, site.origin);
    if (!worker) return null;
    try {
      const { result } = await worker.send('Runtime.evaluate', {
        returnByValue: true,
        expression: 'JSON.stringify({ origin: performance.timeOrigin, marks: performance.getEntriesByType("mark").map((m) => [m.name, m.startTime]) })',
      });
      const { origin, marks } = JSON.parse(result.value);
      const steps = { 'worker thread started': origin - fetchAt };
      for (const [name, t] of marks) if (!(name in steps)) steps[name] = origin + t - fetchAt;
      steps[answered] = answeredMs;
      return steps;
    } finally { await worker.detach(); }
  }
  /** The median of each step over the runs that have it. */
  function medianSteps(runs) {
    const names = [...new Set(runs.filter(Boolean).flatMap((r) => Object.keys(r)))];
    return Object.fromEntries(names.map((n) => [n, r2(median(runs.filter((r) => r && n in r).map((r) => r[n])))]));
  }

  async function fresh(subject, cfg, fn, { browserContext, ...disposal } = {}) {
    const site = await newSite(subject, cfg, browserContext);
    try {
      await site.page.bringToFront();
      await site.register();
      return await fn(site);
    } finally { await site.dispose(disposal); }
  }
  const has = (phase) => opt.phases.includes(phase);

  try {
    // ---- the CPU: a fixed loop inside a service worker (and on a page), calibrated when slowed
    const rawSite = await newSite('raw');
    await rawSite.register();
    const swCdp = await context.newCDPSession(rawSite.page);
    await swCdp.send('ServiceWorker.enable');
    env.stopWorkers = () => swCdp.send('ServiceWorker.stopAllWorkers');
    // Worker starts per origin, as the browser reports them (a version's running status
    // becoming `running`): row 7 counts the cold loads that started the worker.
    const workerStarts = new Map();
    const lastStatus = new Map();
    swCdp.on('ServiceWorker.workerVersionUpdated', (e) => {
      for (const v of e.versions) {
        if (v.runningStatus === 'running' && lastStatus.get(v.versionId) !== 'running') {
          const o = new URL(v.scriptURL).origin;
          workerStarts.set(o, (workerStarts.get(o) ?? 0) + 1);
        }
        lastStatus.set(v.versionId, v.runningStatus);
      }
    });
    const startsOf = (origin) => workerStarts.get(origin) ?? 0;
    const workerBusy = async () => (await rawSite.ev(() => window.bench.call({ op: 'busy', iterations: 2e7 }))).ms;
    const pageBusy = async () => (await rawSite.ev(() => window.bench.busy(2e7))).ms;
    const med3 = async (f) => median([await f(), await f(), await f()]);
    out.cpuCheck = { requested: cpu };
    if (slow) {
      out.cpuCheck.calibration = await slow.calibrate(workerBusy, cpu);
      log(`cpu quota ${out.cpuCheck.calibration.quotaUs}/${slow.periodUs} µs: a loop in a service worker ${r2(out.cpuCheck.calibration.baseMs)} → ${r2(out.cpuCheck.calibration.slowMs)} ms (${r2(out.cpuCheck.calibration.factor)}×)`);
    }
    out.cpuCheck.workerLoopMsStart = r2(await med3(workerBusy));
    out.cpuCheck.pageLoopMsStart = r2(await med3(pageBusy));

    // ---- 4a. cold start: register() → controlled page, on a fresh origin each time
    if (has('cold')) {
      log('cold start: register() → controlled');
      const cold = Object.fromEntries(SUBJECTS.map((s) => [s, []]));
      const coldSteps = Object.fromEntries(SUBJECTS.map((s) => [s, []]));
      for (let rep = 0; rep < opt.reps; rep++) {
        for (const s of SUBJECTS) {
          const site = await newSite(s);
          await site.page.bringToFront();
          const r = await site.register();
          cold[s].push(r.ms);
          // when each step of install and activation happened, in ms after register()
          coldSteps[s].push(await workerStartSteps(site, r.at, r.ms, 'page controlled'));
          await site.dispose();
        }
      }
      out.coldRegister = Object.fromEntries(SUBJECTS.map((s) => [s, {
        runsMs: cold[s].map(r2), medianMs: r2(median(cold[s])), steps: medianSteps(coldSteps[s]),
      }]));
    }

    // ---- 1. offline enqueue, sequential (the server drops every connection)
    if (has('seq')) {
      log(`enqueue sequential: N=${opt.n} × ${opt.reps}`);
      const seq = Object.fromEntries(SUBJECTS.map((s) => [s, []]));
      const samples = Object.fromEntries(SUBJECTS.map((s) => [s, []]));
      for (let rep = 0; rep < opt.reps; rep++) {
        for (const s of SUBJECTS) {
          await fresh(s, PRODUCT_CFG, async (site) => {
            await site.down(true);
            await site.ev((a) => window.bench.sequential(a), { n: opt.warmup, run: nextRun(), bytes: opt.bytes, ws: 'warm' });
            const r = await site.ev((a) => window.bench.sequential(a), { n: opt.n, run: nextRun(), bytes: opt.bytes });
            expect202(`${s} sequential enqueue`, r.statuses, opt.n);
            seq[s].push({ p50: pct(r.ms, 50), p95: pct(r.ms, 95), p99: pct(r.ms, 99), mean: r.ms.reduce((a, b) => a + b, 0) / r.ms.length });
            samples[s].push(...r.ms.map(r2));
          });
        }
      }
      out.enqueueSequential = Object.fromEntries(SUBJECTS.map((s) => [s, {
        runs: seq[s].map((x) => Object.fromEntries(Object.entries(x).map(([k, v]) => [k, r2(v)]))),
        p50: r2(median(seq[s].map((x) => x.p50))), p95: r2(median(seq[s].map((x) => x.p95))), p99: r2(median(seq[s].map((x) => x.p99))),
        samples: samples[s],
      }]));
    }

    // ---- 2. offline enqueue, K in flight
    if (has('conc')) {
      log(`enqueue concurrent: N=${opt.n}, ${opt.inflight} in flight × ${opt.reps}`);
      const conc = Object.fromEntries(CONC_SUBJECTS.map((s) => [s, []]));
      for (let rep = 0; rep < opt.reps; rep++) {
        for (const s of CONC_SUBJECTS) {
          await fresh(s, PRODUCT_CFG, async (site) => {
            await site.down(true);
            await site.ev((a) => window.bench.concurrent(a), { n: opt.warmup, inFlight: opt.inflight, run: nextRun(), bytes: opt.bytes, ws: 'warm' });
            const r = await site.ev((a) => window.bench.concurrent(a), { n: opt.n, inFlight: opt.inflight, run: nextRun(), bytes: opt.bytes });
            expect202(`${s} concurrent enqueue`, r.statuses, opt.n);
            conc[s].push((opt.n / r.totalMs) * 1000);
          });
        }
      }
      out.enqueueConcurrent = Object.fromEntries(CONC_SUBJECTS.map((s) => [s, { runsPerSec: conc[s].map(r2), writesPerSec: r2(median(conc[s])) }]));
    }

    // ---- 1'/2' the same with the browser offline (context.setOffline): the failed attempt
    // costs nothing, so what is left is the worker's own path (informative; no server is
    // involved, so only at latency 0)
    if (has('offline') && latencyMs === 0) {
      log('enqueue with the browser offline (context.setOffline)');
      const bo = Object.fromEntries(SUBJECTS.map((s) => [s, { seq: [], conc: [] }]));
      // A browser of its own (same executable, same flags, a fresh profile): in one
      // context, playwright's setOffline and CDP's ServiceWorker.stopAllWorkers (which
      // every other phase uses between measurements) do not mix. The CI smoke hung on it:
      // after both had been used, the next page never answered an evaluate.
      const offlineProfile = mkdtempSync(join(tmpdir(), 'sw-outbox-bench-offline-'));
      const offline = await launch(offlineProfile);
      try {
        for (let rep = 0; rep < opt.reps; rep++) {
          for (const s of SUBJECTS) {
            // Its worker is not stopped through CDP (see above): it is unregistered, its page
            // closed and its site's server closed before the browser is back online, so it
            // cannot reach anything.
            try {
              await fresh(s, PRODUCT_CFG, async (site) => {
                await offline.setOffline(true);
                await site.ev((a) => window.bench.sequential(a), { n: opt.warmup, run: nextRun(), bytes: opt.bytes, ws: 'warm' });
                const q = await site.ev((a) => window.bench.sequential(a), { n: opt.n, run: nextRun(), bytes: opt.bytes });
                expect202(`${s} sequential enqueue (browser offline)`, q.statuses, opt.n);
                bo[s].seq.push(pct(q.ms, 50));
                const c2 = await site.ev((a) => window.bench.concurrent(a), { n: opt.n, inFlight: opt.inflight, run: nextRun(), bytes: opt.bytes });
                expect202(`${s} concurrent enqueue (browser offline)`, c2.statuses, opt.n);
                bo[s].conc.push((opt.n / c2.totalMs) * 1000);
              }, { stopWorker: false, browserContext: offline });
            } finally { await offline.setOffline(false); }
          }
        }
      } finally {
        await offline.close().catch(() => {});
        rmSync(offlineProfile, { recursive: true, force: true });
      }
      out.enqueueBrowserOffline = Object.fromEntries(SUBJECTS.map((s) => [s, {
        seqP50Runs: bo[s].seq.map(r2), seqP50: r2(median(bo[s].seq)), concRunsPerSec: bo[s].conc.map(r2), concWritesPerSec: r2(median(bo[s].conc)),
      }]));
    }

    // ---- raw limits inside the raw worker
    if (has('raw')) {
      log('raw limits');
      const postN = latencyMs > 0 ? Math.min(opt.n, opt.rawN) : opt.n;
      const rawOps = [
        ['idb-strict', {}], ['idb-default', {}], ['idb-one', {}], ['post', { lanes: 1 }], ['post', { lanes: opt.workspaces }],
        ['post-fail', { lanes: 1 }], ['post-fail', { lanes: opt.inflight }],
      ];
      const raw = {};
      await rawSite.page.bringToFront();
      for (let rep = 0; rep < opt.reps; rep++) {
        for (const [op, extra] of rawOps) {
          await rawSite.down(op === 'post-fail');
          const name = op.startsWith('post') ? `${op}-${extra.lanes}-lanes` : op;
          const count = op.startsWith('post') ? postN : opt.n;
          const r = await rawSite.ev((m) => window.bench.call(m), { op, n: count, bytes: opt.bytes, ...extra });
          if (!r.ok) problems.push(`${label}: raw ${name}: ${r.error}`);
          (raw[name] ??= []).push({ n: count, totalMs: r.totalMs, p50: r.per?.length ? pct(r.per, 50) : null });
        }
      }
      await rawSite.down(false); await rawSite.reset();
      out.rawLimit = Object.fromEntries(Object.entries(raw).map(([k, v]) => [k, {
        n: v[0].n, totalMs: r2(median(v.map((x) => x.totalMs))), perOpMs: r2(median(v.map((x) => x.totalMs)) / v[0].n),
        perSec: r2(v[0].n / (median(v.map((x) => x.totalMs)) / 1000)),
        p50: v[0].p50 == null ? null : r2(median(v.map((x) => x.p50))),
      }]));
    }

    // ---- 3. replay over W workspaces
    async function fillAndReplay(site, count, { sampler = false } = {}) {
      const run = nextRun();
      await site.page.bringToFront();
      if (site.fills++ > 0) await site.ev(() => window.bench.clear());
      await site.reset(); await site.down(true);
      // The wasm memory's baseline is read before the fill, so its growth covers the fill
      // and the replay: Chromium 156's renderer crashed during the replay in 12 of 44 smoke
      // runs when Runtime.queryObjects had run on the worker just before it (0 of 20 with
      // the query before the fill; 0 of 16 with only a forced GC before the replay).
      let wasmBefore = null;
      if (sampler) {
        const probe = await WorkerCDP.attach(context, site.page, site.origin);
        if (probe) { wasmBefore = await probe.wasmMemory().catch(() => null); await probe.detach(); }
      }
      const fill = await site.ev((a) => window.bench.fill(a), { n: count, workspaces: opt.workspaces, run, bytes: opt.bytes });
      expect202(`${site.label ?? site.subject} fill ${count}`, fill.statuses, count);
      if (!sampler) {
        // (not before a memory-sampled replay: the product's LIST_QUEUE of every record
        // would raise the wasm memory high-water mark and hide the replay's own growth)
        const queued = await site.ev(() => window.bench.size());
        if (queued !== count) problems.push(`${label}: ${site.label ?? site.subject}: ${queued} records queued after filling ${count}`);
      }
      await site.down(false);
      let mem = null; let stopSampling = null; const samples = [];
      if (sampler) {
        mem = await WorkerCDP.attach(context, site.page, site.origin);
        if (mem) {
          await mem.send('HeapProfiler.collectGarbage').catch(() => {}); // a clean baseline
          samples.push({ t: 0, ...(await mem.heap()) });
          let on = true;
          const loop = (async () => {
            const t0 = Date.now();
            let k = 0;
            while (on) {
              // Every 10th sample (~2 s) after a forced GC: what the worker *retains*, as
              // opposed to garbage not yet collected (each cursor step deserializes a body).
              const gc = ++k % 10 === 0;
              if (gc) await mem.send('HeapProfiler.collectGarbage').catch(() => {});
              samples.push({ t: Date.now() - t0, gc, ...(await mem.heap()) });
              await new Promise((r) => setTimeout(r, 200));
            }
          })();
          stopSampling = async () => { on = false; await loop; };
        }
      }
      const t0 = process.hrtime.bigint();
      const rep = await site.ev(() => window.bench.replay());
      // The replay answers after its last request was answered, so the server has them all
      // by now; the time is the server's clock at the n-th apply (the log keeps it), so
      // this check's own latency is not in it.
      const w = await http(`${site.origin}/__bench/wait?count=${count}&timeoutMs=5000`);
      const ms = w.reached ? Number(BigInt(w.reachedNs) - t0) / 1e6 : NaN;
      if (stopSampling) await stopSampling();
      let memory = null;
      if (mem) {
        const wasm = await mem.wasmMemory().catch(() => null);
        const peak = (k) => Math.max(...samples.map((x) => x[k]));
        const gcd = samples.filter((x) => x.gc);
        memory = {
          baselineUsed: samples[0].usedSize, peakUsed: peak('usedSize'), peakTotal: peak('totalSize'),
          peakRetainedAfterGc: gcd.length ? Math.max(...gcd.map((x) => x.usedSize)) : null, gcSamples: gcd.length,
          wasmMemoryBefore: wasmBefore, wasmMemoryAfter: wasm, samples: samples.length,
        };
        await mem.detach();
      }
      const check = await verify(site, run, count);
      const left = await site.ev(() => window.bench.size());
      if (left !== 0) problems.push(`${label}: ${site.label ?? site.subject}: ${left} records still queued after replay of ${count}`);
      if (!rep.ok) problems.push(`${label}: ${site.label ?? site.subject} replay answered ${JSON.stringify(rep)}`);
      return { n: count, ms, perRecordMs: ms / count, fillMs: fill.totalMs, replayAnswer: rep, check, memory, left };
    }

    async function verify(site, run, count) {
      const lg = await site.control('log?full=1');
      const seen = new Set(); const last = new Map();
      let duplicates = 0; let orderViolations = 0; let wrongPath = 0;
      for (const e of lg.entries) {
        let b; try { b = JSON.parse(e.body); } catch { continue; }
        if (b.run !== run) continue;
        const id = `${b.ws}/${b.seq}`;
        if (seen.has(id)) { duplicates += 1; continue; }
        seen.add(id);
        if (e.path !== `/api/projects/${b.ws}/tasks`) wrongPath += 1;
        const prev = last.get(b.ws) ?? -1;
        if (b.seq !== prev + 1) orderViolations += 1;
        last.set(b.ws, b.seq);
      }
      const check = { applied: seen.size, missing: count - seen.size, duplicates, duplicateKeyAttempts: lg.duplicateAttempts, orderViolations, wrongPath };
      const bad = Object.entries(check).filter(([k, v]) => k !== 'applied' && v !== 0);
      if (bad.length) problems.push(`${label}: ${site.label ?? site.subject} replay of ${count}: ${JSON.stringify(check)}`);
      return check;
    }

    if (has('replay')) {
      log(`replay: ${opt.n} writes over ${opt.workspaces} workspaces × ${opt.reps}`);
      const replay = {};
      for (let rep = 0; rep < opt.reps; rep++) {
        for (const [name, subject, cfg] of REPLAYERS) {
          const r = await fresh(subject, cfg, (site) => { site.label = name; return fillAndReplay(site, opt.n); });
          (replay[name] ??= []).push(r);
        }
      }
      out.replay = Object.fromEntries(Object.entries(replay).map(([k, v]) => {
        const medianMs = median(v.map((x) => x.ms));
        return [k, {
          runsMs: v.map((x) => r2(x.ms)), medianMs: r2(medianMs), perSec: r2(opt.n / (medianMs / 1000)),
          fillMsMedian: r2(median(v.map((x) => x.fillMs))), checks: v.map((x) => x.check), flushes: v.map((x) => x.replayAnswer.flushes ?? null),
        }];
      }));
    }

    // ---- 4b. first write after the worker was stopped
    if (has('first')) {
      log('first write after stopped worker');
      const firstWrite = Object.fromEntries(SUBJECTS.map((s) => [s, []]));
      const startSteps = Object.fromEntries(SUBJECTS.map((s) => [s, []]));
      for (let rep = 0; rep < opt.reps; rep++) {
        for (const s of SUBJECTS) {
          await fresh(s, PRODUCT_CFG, async (site) => {
            await site.down(true);
            // a worker that has run (the module compiled, the database opened), queue emptied
            await site.ev((a) => window.bench.sequential(a), { n: opt.warmup, run: nextRun(), bytes: opt.bytes, ws: 'warm' });
            await site.ev(() => window.bench.clear());
            const cdp = await context.newCDPSession(site.page);
            await cdp.send('ServiceWorker.enable');
            await cdp.send('ServiceWorker.stopAllWorkers');
            await cdp.detach();
            await new Promise((r) => setTimeout(r, opt.settleMs));
            const r = await site.ev((a) => window.bench.sequential(a), { n: 1, run: nextRun(), bytes: opt.bytes, ws: 'cold' });
            expect202(`${s} first write after stop`, r.statuses, 1);
            firstWrite[s].push(r.ms[0]);
            const steps = await workerStartSteps(site, r.at[0], r.ms[0]);
            // The row times a cold start: a worker woken during the pause (a sync event
            // fired at a stopped worker, say) makes it a warm one.
            if (steps && steps['worker thread started'] < 0) problems.push(`${label}: ${s} first write after stop: the worker started ${-r2(steps['worker thread started'])} ms before the write, not for it`);
            startSteps[s].push(steps);
          });
        }
      }
      out.firstWriteAfterStop = Object.fromEntries(SUBJECTS.map((s) => [s, {
        runsMs: firstWrite[s].map(r2), medianMs: r2(median(firstWrite[s])), steps: medianSteps(startSteps[s]),
      }]));
    }

    // ---- 4c. first ONLINE write after the worker was stopped (issue 36, 1): the server
    // answers 201; the same stop and pause as 4b. `none` has no worker: its write goes
    // straight to the server (the floor of this row).
    if (has('firstonline')) {
      log('first online write after stopped worker');
      const firstOnline = Object.fromEntries(ONLINE_SUBJECTS.map((s) => [s, []]));
      const startSteps = Object.fromEntries(ONLINE_SUBJECTS.map((s) => [s, []]));
      for (let rep = 0; rep < opt.reps; rep++) {
        for (const s of ONLINE_SUBJECTS) {
          const site = await newSite(s);
          try {
            await site.page.bringToFront();
            if (s !== 'none') await site.register();
            // a worker that has run (the module compiled, the database opened)
            const warm = await site.ev((a) => window.bench.sequential(a), { n: opt.warmup, run: nextRun(), bytes: opt.bytes, ws: 'warm' });
            if ((warm.statuses['201'] || 0) !== opt.warmup) problems.push(`${label}: ${s} online warm-up: ${JSON.stringify(warm.statuses)}`);
            await env.stopWorkers();
            await new Promise((r) => setTimeout(r, opt.settleMs));
            const r = await site.ev((a) => window.bench.sequential(a), { n: 1, run: nextRun(), bytes: opt.bytes, ws: 'cold' });
            if ((r.statuses['201'] || 0) !== 1) problems.push(`${label}: ${s} first online write after stop: expected 201, got ${JSON.stringify(r.statuses)}`);
            firstOnline[s].push(r.ms[0]);
            if (s !== 'none') {
              const steps = await workerStartSteps(site, r.at[0], r.ms[0]);
              if (steps && steps['worker thread started'] < 0) problems.push(`${label}: ${s} first online write after stop: the worker started ${-r2(steps['worker thread started'])} ms before the write, not for it`);
              startSteps[s].push(steps);
            }
          } finally { await site.dispose(); }
        }
      }
      out.firstOnlineWriteAfterStop = Object.fromEntries(ONLINE_SUBJECTS.map((s) => [s, {
        runsMs: firstOnline[s].map(r2), medianMs: r2(median(firstOnline[s])),
        ...(s === 'none' ? {} : { steps: medianSteps(startSteps[s]) }),
      }]));
    }

    // ---- 7. a page of LOAD_FILES files loaded after the worker was stopped (cold) and
    // again with it running (warm): the navigation's time to first byte and its `load`,
    // from the Navigation Timing entry (ms after the navigation started). Loads of the
    // subjects are interleaved; medians of reps × loads.
    if (has('pageload')) {
      log(`page load: ${LOAD_FILES} files, ${opt.reps} × ${opt.loads} cold and warm loads per subject`);
      const loaders = LOADERS(env.loadFiles);
      const sites = {};
      const runs = {};
      try {
        for (const [name, subject, cfg] of loaders) {
          const site = await newSite(subject, cfg);
          site.label = name;
          if (subject !== 'none') await site.register();
          sites[name] = site;
          runs[name] = { cold: [], warm: [] };
          // Once, so the browser has the files it keeps (the worker's scripts, compiled code).
          await loadPage(site, name);
        }
        for (let rep = 0; rep < opt.reps; rep++) {
          for (let i = 0; i < opt.loads; i++) {
            for (const [name] of loaders) {
              const site = sites[name];
              await site.page.bringToFront();
              await env.stopWorkers();
              await new Promise((r) => setTimeout(r, opt.settleMs));
              const before = startsOf(site.origin);
              const cold = await loadPage(site, name);
              // Whether the browser started the worker for this load (its own record, CDP):
              // with static routes it should not have.
              cold.started = startsOf(site.origin) > before;
              runs[name].cold.push(cold);
              runs[name].warm.push(await loadPage(site, name));
            }
          }
        }
      } finally {
        for (const site of Object.values(sites)) {
          await site.page.goto(`${site.origin}/bench.html?subject=${site.subject}`).catch(() => {});
          await site.dispose();
        }
      }
      const med = (xs, k) => r2(median(xs.map((x) => x[k])));
      out.pageLoad = Object.fromEntries(Object.entries(runs).map(([name, r]) => [name, {
        cold: {
          ttfbMs: med(r.cold, 'ttfb'), loadMs: med(r.cold, 'load'), runs: r.cold,
          workerStarted: r.cold.filter((x) => x.started).length,
          routedToNetwork: r.cold.filter((x) => x.source === 'network').length,
          steps: Object.fromEntries(Object.keys(r.cold[0]?.steps ?? {}).map((k) => {
            const xs = r.cold.map((x) => x.steps[k]).filter((v) => v != null);
            return [k, xs.length ? r2(median(xs)) : null];
          })),
        },
        warm: { ttfbMs: med(r.warm, 'ttfb'), loadMs: med(r.warm, 'load'), runs: r.warm },
      }]));
    }

    /** One load of the load page; its timing, and a problem noted when a worker should
     * have controlled it and did not (the figure would not be the subject's). */
    async function loadPage(site, name) {
      await site.page.goto(`${site.origin}/load.html`, { waitUntil: 'load' });
      const t = await site.page.evaluate(() => {
        const e = performance.getEntriesByType('navigation')[0];
        // Where the time before the first byte went (0 where the step did not happen):
        // the worker's start, the static router's evaluation, the network's request.
        const steps = {};
        for (const k of ['workerStart', 'workerRouterEvaluationStart', 'fetchStart', 'connectStart', 'requestStart']) steps[k] = e[k] ?? null;
        return {
          steps,
          ttfb: e.responseStart, load: e.loadEventStart, files: window.__loaded ?? 0,
          controlled: navigator.serviceWorker.controller !== null,
          // the static route the browser matched, where it reports one (Chromium)
          source: e.workerMatchedSourceType ?? null,
        };
      });
      if (t.controlled !== (site.subject !== 'none')) problems.push(`${label}: page load of ${name}: controlled=${t.controlled}`);
      if (t.files !== LOAD_FILES / 3) problems.push(`${label}: page load of ${name}: ${t.files} of ${LOAD_FILES / 3} scripts ran`);
      const steps = Object.fromEntries(Object.entries(t.steps).map(([k, v]) => [k, v == null ? null : r2(v)]));
      return { ttfb: r2(t.ttfb), load: r2(t.load), source: t.source, steps };
    }

    // ---- 6. scale: replay cost per record at `scale` vs `n`, and the worker's memory
    if (opt.scale && env.scaleHere(setting)) {
      log(`scale: replay of ${opt.n} then ${opt.scale} with memory sampling`);
      out.scale = {};
      for (const name of opt.scaleSubjects) {
        const t = Date.now();
        const [small, big] = await fresh(name, PRODUCT_CFG, async (site) => [
          await fillAndReplay(site, opt.n, { sampler: true }), await fillAndReplay(site, opt.scale, { sampler: true }),
        ]);
        const pick = (x) => ({ n: x.n, ms: r2(x.ms), perRecordMs: r2(x.perRecordMs), fillMs: r2(x.fillMs), memory: x.memory, check: x.check, flushes: x.replayAnswer.flushes ?? null });
        out.scale[name] = { small: pick(small), big: pick(big), perRecordRatio: r2(big.perRecordMs / small.perRecordMs), wallSeconds: r2((Date.now() - t) / 1000) };
      }
    }

    out.cpuCheck.workerLoopMsEnd = r2(await med3(workerBusy));
    out.cpuCheck.pageLoopMsEnd = r2(await med3(pageBusy));
    env.stopWorkers = null;
    await swCdp.detach().catch(() => {});
    await rawSite.dispose();
  } finally {
    env.stopWorkers = null;
    await context.close().catch(() => {});
    rmSync(profile, { recursive: true, force: true });
    if (slow) { await slow.dispose(); env.cleanups.delete(slow.dispose); }
  }
  out.consoleErrors = consoleErrors.slice(0, 20);
  out.loadEnd = loadavg().map(r2);
  out.wallSeconds = r2((Date.now() - started) / 1000);
  log(`=== ${label} done in ${out.wallSeconds} s (load ${out.loadEnd.join(' ')})`);
  return out;
}

// ---------------------------------------------------------------- output
function writeOutputs(results, { svgCopy }) {
  mkdirSync(dirname(opt.out), { recursive: true });
  writeFileSync(opt.out, JSON.stringify(results, null, 2));
  const md = `${summaryMarkdown(results)}\n\n${targetsMarkdown(results)}\n`;
  const base = opt.out.replace(/\.json$/, '');
  writeFileSync(`${base}.md`, md);
  const svg = renderSvg(results);
  writeFileSync(`${base}.svg`, svg);
  if (svgCopy) copyFileSync(`${base}.svg`, join(BENCH, 'results.svg'));
  console.log(md);
  console.log(`JSON: ${opt.out}\ntables: ${base}.md\npicture: ${base}.svg${svgCopy ? ` (copied to ${join(BENCH, 'results.svg')})` : ''}`);
}

async function main() {
  if (argv.report) {
    // Merge the settings of earlier runs (e.g. one per setting) into one report.
    const files = String(argv.report).split(',');
    const runs = files.map((f) => JSON.parse(readFileSync(f, 'utf8')));
    const merged = { ...runs[0], settings: runs.flatMap((r) => r.settings), mergedFrom: files };
    merged.problems = runs.flatMap((r) => r.problems ?? []);
    writeOutputs(merged, { svgCopy: !argv['no-svg-copy'] });
    return;
  }
  const started = Date.now();
  const { www, wb, load } = prepare();
  const size = sizes(www, wb);
  // One line for CI logs (grep 'bench size:'): a size regression shows in every run,
  // the smoke included, before any timing.
  const z = size.product;
  console.log(`bench size: wasm ${z.wasm.gzip9} + glue ${z.glue.gzip9} + sw.js ${z['sw.js'].gzip9} = ${z.total.gzip9} B gzip -9 (${(z.total.gzip9 / 1024).toFixed(1)} KB; issue 30 target 120 KB; raw ${z.total.raw} B)`);
  const server = await startServer({ fault: argv.fault ? String(argv.fault) : null });
  const env = {
    server,
    roots: {
      product: [www, join(BENCH, 'pages'), load.dir], workbox: [wb, join(BENCH, 'pages'), load.dir],
      plain: [join(BENCH, 'raw'), join(BENCH, 'pages')], raw: [join(BENCH, 'raw'), join(BENCH, 'pages')],
      floor: [join(BENCH, 'raw'), join(BENCH, 'pages')],
      none: [join(BENCH, 'pages'), load.dir],
    },
    loadFiles: load.files,
    cleanups: new Set(),
    // phase 6 once per run: in the first setting at normal CPU
    scaleHere: (s) => s.cpu === 1 && s.latencyMs === opt.latencies[0],
    browser: null,
  };
  const onSignal = async () => { server.child.kill(); for (const c of env.cleanups) await c(); process.exit(130); };
  process.once('SIGINT', onSignal); process.once('SIGTERM', onSignal);
  const results = { options: { ...opt, phases: opt.phases }, smoke: SMOKE, sizes: size, settings: [] };
  try {
    for (const cpu of opt.cpus) {
      for (const latencyMs of opt.latencies) {
        results.settings.push(await runSetting({ key: `lat${latencyMs}-cpu${cpu}`, latencyMs, cpu }, env));
      }
    }
  } finally {
    await fetch(`${server.master}/quit`).catch(() => {});
    server.child.kill();
  }
  results.machine = {
    cpus: cpus().length, cpuModel: cpus()[0]?.model, memGB: r2(totalmem() / 2 ** 30), node: process.version,
    browser: env.browser, browserArgs: opt.browserArgs, date: new Date().toISOString(), wallSeconds: r2((Date.now() - started) / 1000),
  };
  results.problems = problems;
  writeOutputs(results, { svgCopy: !SMOKE && !argv['no-svg-copy'] });
  if (problems.length) {
    console.log(`\nBROKEN (${problems.length}):\n  - ${problems.join('\n  - ')}`);
    process.exitCode = 1;
  } else console.log(`\nall subjects correct (no duplicates, order intact, every write applied); ${results.machine.wallSeconds} s`);
}

main().catch((err) => { console.error(err); process.exit(2); });
