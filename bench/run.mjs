#!/usr/bin/env node
// sw-outbox benchmark: this product vs workbox-background-sync vs the raw browser limit,
// side by side in one headless Chromium (Debian's /usr/bin/chromium via playwright-core).
//
//   node bench/run.mjs            full run (N=1000, scale 10000, medians of 3)
//   node bench/run.mjs --smoke    tiny N, every subject once, checks only (no timing asserts)
//   options: --n=1000 --scale=10000 --reps=3 --inflight=16 --bytes=1024 --workspaces=10
//            --no-scale --out=bench/out/results.json
//            --fault=duplicate|drop  self-test: the server applies some writes twice / not at
//                                    all, so the checks must report the subjects broken
//
// Exits non-zero only when a subject is broken: a write not answered 202 while offline, a
// replay that lost, duplicated or reordered writes, or a queue not empty after replay.
import { spawn, spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, tmpdir, totalmem } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { CHROMIUM_ARGS } from '../tests/e2e/harness.mjs';

const BENCH = dirname(fileURLToPath(import.meta.url));
const ROOT = resolve(BENCH, '..');
const OUT = join(BENCH, 'out');

// ---------------------------------------------------------------- options
const argv = Object.fromEntries(process.argv.slice(2).map((a) => {
  const m = /^--([^=]+)(?:=(.*))?$/.exec(a);
  if (!m) throw new Error(`unknown argument ${a}`);
  return [m[1], m[2] ?? true];
}));
const SMOKE = !!argv.smoke;
const opt = {
  n: Number(argv.n ?? (SMOKE ? 20 : 1000)),
  scale: argv['no-scale'] ? 0 : Number(argv.scale ?? (SMOKE ? 40 : 10000)),
  reps: Number(argv.reps ?? (SMOKE ? 1 : 3)),
  inflight: Number(argv.inflight ?? 16),
  bytes: Number(argv.bytes ?? 1024),
  workspaces: Number(argv.workspaces ?? 10),
  warmup: SMOKE ? 3 : 20,
  www: resolve(argv.www ? String(argv.www) : join(ROOT, 'www')), // the product build to measure
  only: argv.only ? String(argv.only) : null, // 'scale': only phase 6 (for a focused re-measure)
  scaleSubjects: String(argv['scale-subjects'] ?? 'product,workbox').split(','),
  out: resolve(argv.out ?? join(OUT, SMOKE ? 'smoke.json' : 'results.json')),
};
const problems = [];
const log = (...a) => console.error('[bench]', ...a);

// ---------------------------------------------------------------- stats
const sorted = (xs) => [...xs].sort((a, b) => a - b);
const pct = (xs, p) => { const s = sorted(xs); return s.length ? s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)] : NaN; };
const median = (xs) => pct(xs, 50);
const r2 = (x) => (Number.isFinite(x) ? Math.round(x * 100) / 100 : x);

// ---------------------------------------------------------------- prepare subjects
function prepare() {
  if (!existsSync(join(ROOT, 'www/pkg/sw_outbox_bg.wasm'))) {
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
  const es = spawnSync(join(ROOT, 'node_modules/.bin/esbuild'), [
    join(BENCH, 'workbox/sw-src.js'), '--bundle', '--minify', '--format=iife', '--target=es2020',
    '--define:process.env.NODE_ENV="production"', `--outfile=${join(wb, 'workbox-sw.js')}`, '--log-level=warning',
  ], { cwd: ROOT, encoding: 'utf8' });
  if (es.status !== 0) throw new Error(`esbuild failed: ${es.stderr}`);
  return { www, wb };
}

function gzip9(file) {
  const g = spawnSync('gzip', ['-9', '-c', file], { maxBuffer: 64 << 20 });
  if (g.status !== 0) throw new Error(`gzip -9 ${file} failed`);
  return g.stdout.length;
}

function sizes(www, wb) {
  const files = { wasm: 'pkg/sw_outbox_bg.wasm', glue: 'pkg/sw_outbox.js', 'sw.js': 'sw.js', 'build.js': 'pkg/build.js' };
  const product = {};
  for (const [k, f] of Object.entries(files)) {
    const p = join(www, f);
    product[k] = { raw: readFileSync(p).length, gzip9: gzip9(p) };
  }
  const three = ['wasm', 'glue', 'sw.js'];
  product.total = {
    raw: three.reduce((s, k) => s + product[k].raw, 0),
    gzip9: three.reduce((s, k) => s + product[k].gzip9, 0),
  };
  const wbFile = join(wb, 'workbox-sw.js');
  return { product, workbox: { raw: readFileSync(wbFile).length, gzip9: gzip9(wbFile) } };
}

// ---------------------------------------------------------------- server
async function startServer() {
  const env = { ...process.env, BENCH_FAULT: argv.fault ? String(argv.fault) : '' };
  const child = spawn(process.execPath, [join(BENCH, 'server.mjs')], { stdio: ['ignore', 'pipe', 'inherit'], env });
  const master = await new Promise((ok, fail) => {
    const t = setTimeout(() => fail(new Error('bench server did not start')), 10000);
    createInterface({ input: child.stdout }).on('line', (line) => {
      const m = /master on (http:\S+)/.exec(line);
      if (m) { clearTimeout(t); ok(m[1]); }
    });
    child.on('exit', (c) => fail(new Error(`bench server exited ${c}`)));
  });
  return { child, master };
}

async function http(url, body) {
  const res = await fetch(url, body === undefined ? {} : { method: 'POST', body: JSON.stringify(body) });
  const text = await res.text();
  if (!res.ok) throw new Error(`${url} answered ${res.status}: ${text}`);
  return JSON.parse(text);
}

// ---------------------------------------------------------------- CDP into a service worker
// Playwright's newCDPSession accepts only pages and frames, so this attaches to the worker
// target from a page's session in the (non-flattened) Target.sendMessageToTarget mode.
class WorkerCDP {
  static async attach(context, page, origin) {
    const cdp = await context.newCDPSession(page);
    const { targetInfos } = await cdp.send('Target.getTargets');
    const t = targetInfos.find((x) => x.type === 'service_worker' && x.url.startsWith(origin + '/'));
    if (!t) { await cdp.detach(); return null; }
    const { sessionId } = await cdp.send('Target.attachToTarget', { targetId: t.targetId, flatten: false });
    return new WorkerCDP(cdp, sessionId);
  }
  constructor(cdp, sessionId) {
    this.cdp = cdp; this.sessionId = sessionId; this.id = 0; this.waiting = new Map();
    cdp.on('Target.receivedMessageFromTarget', (m) => {
      if (m.sessionId !== this.sessionId) return;
      const msg = JSON.parse(m.message);
      const w = msg.id != null && this.waiting.get(msg.id);
      if (w) { this.waiting.delete(msg.id); msg.error ? w.fail(new Error(msg.error.message)) : w.ok(msg.result); }
    });
  }
  send(method, params = {}) {
    const id = ++this.id;
    return new Promise((ok, fail) => {
      this.waiting.set(id, { ok, fail });
      this.cdp.send('Target.sendMessageToTarget', { sessionId: this.sessionId, message: JSON.stringify({ id, method, params }) }).catch(fail);
    });
  }
  heap() { return this.send('Runtime.getHeapUsage'); }
  /** Bytes of every WebAssembly.Memory alive in the worker (queryObjects forces a GC). */
  async wasmMemory() {
    const proto = await this.send('Runtime.evaluate', { expression: 'WebAssembly.Memory.prototype' });
    const { objects } = await this.send('Runtime.queryObjects', { prototypeObjectId: proto.result.objectId });
    const r = await this.send('Runtime.callFunctionOn', {
      objectId: objects.objectId, returnByValue: true,
      functionDeclaration: 'function () { return this.reduce((s, m) => s + m.buffer.byteLength, 0); }',
    });
    return r.result.value;
  }
  async detach() { await this.cdp.detach().catch(() => {}); }
}

// ---------------------------------------------------------------- the run
const SUBJECT_SW = {
  product: (cfg) => `/sw.js?config=${encodeURIComponent(JSON.stringify(cfg))}`,
  workbox: () => '/workbox-sw.js',
  raw: () => '/raw-sw.js',
};

async function main() {
  const started = Date.now();
  const { www, wb } = prepare();
  const size = sizes(www, wb);
  const roots = { product: [www, join(BENCH, 'pages')], workbox: [wb, join(BENCH, 'pages')], raw: [join(BENCH, 'raw'), join(BENCH, 'pages')] };
  const server = await startServer();
  const profile = mkdtempSync(join(tmpdir(), 'sw-outbox-bench-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM_BIN || '/usr/bin/chromium', headless: true, args: CHROMIUM_ARGS,
  });
  const browserVersion = context.browser()?.version() ?? spawnSync('/usr/bin/chromium', ['--version'], { encoding: 'utf8' }).stdout.trim();
  const consoleErrors = [];
  context.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
  context.on('weberror', (e) => consoleErrors.push(String(e.error())));

  const PRODUCT_CFG = { precache: [], replayConcurrency: 10 };
  const PRODUCT_C4_CFG = { precache: [] }; // replayConcurrency: the default (4)

  async function newSite(subject, cfg) {
    const { port } = await http(`${server.master}/site`, { roots: roots[subject] });
    const origin = `http://127.0.0.1:${port}`;
    const page = await context.newPage();
    await page.goto(`${origin}/bench.html?subject=${subject}`);
    await page.waitForFunction(() => window.benchReady === true);
    const swUrl = SUBJECT_SW[subject](cfg);
    const site = {
      subject, origin, page, swUrl,
      control: (what, body) => http(`${origin}/__bench/${what}`, body),
      down: (down) => http(`${origin}/__bench/down`, { down }),
      reset: () => http(`${origin}/__bench/reset`, {}),
      register: () => page.evaluate((u) => window.bench.register(u), swUrl),
      ev: (fn, arg) => page.evaluate(fn, arg),
    };
    return site;
  }

  const results = { options: opt, smoke: SMOKE, sizes: size };
  const SUBJECTS = ['product', 'workbox', 'raw'];
  let runId = 0;
  const nextRun = () => `r${Date.now().toString(36)}-${++runId}`;
  const expect202 = (label, statuses, n) => {
    if ((statuses['202'] || 0) !== n) problems.push(`${label}: expected ${n} × 202, got ${JSON.stringify(statuses)}`);
  };

  try {
    if (!opt.only) {
// ---- 4a. cold start: register() → controlled page, on a fresh origin each time
    log('cold start: register() → controlled');
    const cold = { product: [], workbox: [], raw: [] };
    for (let rep = 0; rep < opt.reps; rep++) {
      for (const s of SUBJECTS) {
        const site = await newSite(s, PRODUCT_CFG);
        cold[s].push((await site.register()).ms);
        await site.page.close();
      }
    }
    results.coldRegister = Object.fromEntries(SUBJECTS.map((s) => [s, { runsMs: cold[s].map(r2), medianMs: r2(median(cold[s])) }]));

    }
    // ---- the long-lived sites
    const sites = {};
    for (const s of SUBJECTS) { sites[s] = await newSite(s, PRODUCT_CFG); await sites[s].register(); }
    sites.productC4 = await newSite('product', PRODUCT_C4_CFG); sites.productC4.label = 'product (replayConcurrency 4)'; await sites.productC4.register();
    const front = async (site) => { await site.page.bringToFront(); };
    const clearAll = async () => { for (const s of SUBJECTS) await sites[s].ev(() => window.bench.clear()); };

    if (!opt.only) {
// ---- 1. offline enqueue, sequential
    log(`enqueue sequential: N=${opt.n} × ${opt.reps}`);
    const seq = { product: [], workbox: [], raw: [] };
    for (let rep = 0; rep < opt.reps; rep++) {
      for (const s of SUBJECTS) {
        const site = sites[s];
        await front(site); await site.down(true);
        await site.ev((a) => window.bench.sequential(a), { n: opt.warmup, run: nextRun(), bytes: opt.bytes, ws: 'warm' });
        const r = await site.ev((a) => window.bench.sequential(a), { n: opt.n, run: nextRun(), bytes: opt.bytes });
        expect202(`${s} sequential enqueue`, r.statuses, opt.n);
        seq[s].push({ p50: pct(r.ms, 50), p95: pct(r.ms, 95), p99: pct(r.ms, 99), mean: r.ms.reduce((a, b) => a + b, 0) / r.ms.length });
        await site.ev(() => window.bench.clear());
      }
    }
    results.enqueueSequential = Object.fromEntries(SUBJECTS.map((s) => [s, {
      runs: seq[s].map((x) => Object.fromEntries(Object.entries(x).map(([k, v]) => [k, r2(v)]))),
      p50: r2(median(seq[s].map((x) => x.p50))), p95: r2(median(seq[s].map((x) => x.p95))), p99: r2(median(seq[s].map((x) => x.p99))),
    }]));

    // ---- 2. offline enqueue, K in flight
    log(`enqueue concurrent: N=${opt.n}, ${opt.inflight} in flight × ${opt.reps}`);
    const conc = { product: [], workbox: [], raw: [] };
    for (let rep = 0; rep < opt.reps; rep++) {
      for (const s of SUBJECTS) {
        const site = sites[s];
        await front(site); await site.down(true);
        await site.ev((a) => window.bench.concurrent(a), { n: opt.warmup, inFlight: opt.inflight, run: nextRun(), bytes: opt.bytes, ws: 'warm' });
        const r = await site.ev((a) => window.bench.concurrent(a), { n: opt.n, inFlight: opt.inflight, run: nextRun(), bytes: opt.bytes });
        expect202(`${s} concurrent enqueue`, r.statuses, opt.n);
        conc[s].push((opt.n / r.totalMs) * 1000);
        await site.ev(() => window.bench.clear());
      }
    }
    results.enqueueConcurrent = Object.fromEntries(SUBJECTS.map((s) => [s, { runsPerSec: conc[s].map(r2), writesPerSec: r2(median(conc[s])) }]));

    // ---- 1'/2' the same with the browser offline (context.setOffline): the failed attempt
    // costs nothing, so what is left is the worker's own path (informative, not a target)
    log('enqueue with the browser offline (context.setOffline)');
    const bo = { product: { seq: [], conc: [] }, workbox: { seq: [], conc: [] }, raw: { seq: [], conc: [] } };
    await context.setOffline(true);
    try {
      for (let rep = 0; rep < opt.reps; rep++) {
        for (const s of SUBJECTS) {
          const site = sites[s];
          await front(site);
          await site.ev((a) => window.bench.sequential(a), { n: opt.warmup, run: nextRun(), bytes: opt.bytes, ws: 'warm' });
          const q = await site.ev((a) => window.bench.sequential(a), { n: opt.n, run: nextRun(), bytes: opt.bytes });
          expect202(`${s} sequential enqueue (browser offline)`, q.statuses, opt.n);
          bo[s].seq.push(pct(q.ms, 50));
          const c2 = await site.ev((a) => window.bench.concurrent(a), { n: opt.n, inFlight: opt.inflight, run: nextRun(), bytes: opt.bytes });
          expect202(`${s} concurrent enqueue (browser offline)`, c2.statuses, opt.n);
          bo[s].conc.push((opt.n / c2.totalMs) * 1000);
          await site.ev(() => window.bench.clear());
        }
      }
    } finally { await context.setOffline(false); }
    results.enqueueBrowserOffline = Object.fromEntries(SUBJECTS.map((s) => [s, {
      seqP50Runs: bo[s].seq.map(r2), seqP50: r2(median(bo[s].seq)), concRunsPerSec: bo[s].conc.map(r2), concWritesPerSec: r2(median(bo[s].conc)),
    }]));

    // ---- raw limits inside the raw worker
    log('raw limits');
    const rawOps = [
      ['idb-strict', {}], ['idb-default', {}], ['idb-one', {}], ['post', { lanes: 1 }], ['post', { lanes: opt.workspaces }],
      ['post-fail', { lanes: 1 }], ['post-fail', { lanes: opt.inflight }],
    ];
    const raw = {};
    await front(sites.raw);
    for (let rep = 0; rep < opt.reps; rep++) {
      for (const [op, extra] of rawOps) {
        await sites.raw.down(op === 'post-fail');
        const name = op.startsWith('post') ? `${op}-${extra.lanes}-lanes` : op;
        const r = await sites.raw.ev((m) => window.bench.call(m), { op, n: opt.n, bytes: opt.bytes, ...extra });
        if (!r.ok) problems.push(`raw ${name}: ${r.error}`);
        (raw[name] ??= []).push({ totalMs: r.totalMs, p50: r.per?.length ? pct(r.per, 50) : null });
      }
    }
    await sites.raw.down(false); await sites.raw.reset();
    results.rawLimit = Object.fromEntries(Object.entries(raw).map(([k, v]) => [k, {
      totalMs: r2(median(v.map((x) => x.totalMs))), perOpMs: r2(median(v.map((x) => x.totalMs)) / opt.n),
      p50: v[0].p50 == null ? null : r2(median(v.map((x) => x.p50))),
    }]));

    }
    // ---- 3. replay over W workspaces
    async function fillAndReplay(site, n, { sampler = false } = {}) {
      const run = nextRun();
      await front(site);
      await site.ev(() => window.bench.clear());
      await site.reset(); await site.down(true);
      const fill = await site.ev((a) => window.bench.fill(a), { n, workspaces: opt.workspaces, run, bytes: opt.bytes });
      expect202(`${site.subject} fill ${n}`, fill.statuses, n);
      if (!sampler) {
        // (not before a memory-sampled replay: the product's LIST_QUEUE of every record
        // would raise the wasm memory high-water mark and hide the replay's own growth)
        const queued = await site.ev(() => window.bench.size());
        if (queued !== n) problems.push(`${site.label ?? site.subject}: ${queued} records queued after filling ${n}`);
      }
      await site.down(false);
      let mem = null; let stopSampling = null; const samples = []; let wasmBefore = null;
      if (sampler) {
        mem = await WorkerCDP.attach(context, site.page, site.origin);
        if (mem) {
          wasmBefore = await mem.wasmMemory().catch(() => null); // also a full GC: a clean baseline
          const base = await mem.heap();
          samples.push({ t: 0, ...base });
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
      const w = await http(`${site.origin}/__bench/wait?count=${n}&timeoutMs=5000`);
      const ms = w.reached ? Number(BigInt(w.reachedNs) - t0) / 1e6 : NaN;
      if (stopSampling) await stopSampling();
      let memory = null;
      if (mem) {
        const wasm = await mem.wasmMemory().catch(() => null);
        const peak = (k) => Math.max(...samples.map((x) => x[k]));
        const gcd = samples.filter((x) => x.gc);
        memory = {
          baselineUsed: samples[0].usedSize, peakUsed: peak('usedSize'), peakTotal: peak('totalSize'),
          peakBacking: peak('backingStorageSize'),
          peakRetainedAfterGc: gcd.length ? Math.max(...gcd.map((x) => x.usedSize)) : null, gcSamples: gcd.length,
          wasmMemoryBefore: wasmBefore, wasmMemoryAfter: wasm, samples: samples.length,
        };
        await mem.detach();
      }
      const check = await verify(site, run, n);
      const left = await site.ev(() => window.bench.size());
      if (left !== 0) problems.push(`${site.label ?? site.subject}: ${left} records still queued after replay of ${n}`);
      if (!rep.ok) problems.push(`${site.label ?? site.subject} replay answered ${JSON.stringify(rep)}`);
      return { n, ms, perRecordMs: ms / n, fillMs: fill.totalMs, replayAnswer: rep, check, memory, left };
    }

    async function verify(site, run, n) {
      const lg = await site.control('log?full=1');
      const seen = new Set(); const last = new Map();
      let duplicates = 0; let orderViolations = 0; let wrongPath = 0; let mine = 0;
      for (const e of lg.entries) {
        let b; try { b = JSON.parse(e.body); } catch { continue; }
        if (b.run !== run) continue;
        mine += 1;
        const id = `${b.ws}/${b.seq}`;
        if (seen.has(id)) { duplicates += 1; continue; }
        seen.add(id);
        if (e.path !== `/api/projects/${b.ws}/tasks`) wrongPath += 1;
        const prev = last.get(b.ws) ?? -1;
        if (b.seq !== prev + 1) orderViolations += 1;
        last.set(b.ws, b.seq);
      }
      const check = { applied: seen.size, missing: n - seen.size, duplicates, duplicateKeyAttempts: lg.duplicateAttempts, orderViolations, wrongPath };
      const bad = Object.entries(check).filter(([k, v]) => k !== 'applied' && v !== 0);
      if (bad.length) problems.push(`${site.label ?? site.subject} replay of ${n}: ${JSON.stringify(check)}`);
      return check;
    }

    if (!opt.only) {
log(`replay: ${opt.n} writes over ${opt.workspaces} workspaces × ${opt.reps}`);
    const replaySubjects = [['product', sites.product], ['workbox', sites.workbox], ['productC4', sites.productC4]];
    const replay = {};
    for (let rep = 0; rep < opt.reps; rep++) {
      for (const [name, site] of replaySubjects) (replay[name] ??= []).push(await fillAndReplay(site, opt.n));
    }
    results.replay = Object.fromEntries(Object.entries(replay).map(([k, v]) => [k, {
      runsMs: v.map((x) => r2(x.ms)), medianMs: r2(median(v.map((x) => x.ms))), fillMsMedian: r2(median(v.map((x) => x.fillMs))),
      checks: v.map((x) => x.check), flushes: v.map((x) => x.replayAnswer.flushes ?? null),
    }]));

    // ---- 4b. first write after the worker was stopped
    log('first write after stopped worker');
    await clearAll();
    const firstWrite = { product: [], workbox: [], raw: [] };
    const cdp = await context.newCDPSession(sites.product.page);
    await cdp.send('ServiceWorker.enable');
    for (let rep = 0; rep < opt.reps; rep++) {
      for (const s of SUBJECTS) {
        const site = sites[s];
        await front(site); await site.down(true);
        await site.ev(() => window.bench.clear());
        await cdp.send('ServiceWorker.stopAllWorkers');
        await new Promise((r) => setTimeout(r, 500));
        const r = await site.ev((a) => window.bench.sequential(a), { n: 1, run: nextRun(), bytes: opt.bytes, ws: 'cold' });
        expect202(`${s} first write after stop`, r.statuses, 1);
        firstWrite[s].push(r.ms[0]);
      }
    }
    await cdp.detach();
    await clearAll();
    results.firstWriteAfterStop = Object.fromEntries(SUBJECTS.map((s) => [s, { runsMs: firstWrite[s].map(r2), medianMs: r2(median(firstWrite[s])) }]));

    }
    // ---- 6. scale: replay cost per record at `scale` vs `n`, and the worker's memory
    if (opt.scale) {
      log(`scale: replay of ${opt.n} then ${opt.scale} with memory sampling`);
      results.scale = {};
      for (const [name, site] of opt.scaleSubjects.map((k) => [k, sites[k]])) {
        const t = Date.now();
        const small = await fillAndReplay(site, opt.n, { sampler: true });
        const big = await fillAndReplay(site, opt.scale, { sampler: true });
        results.scale[name] = {
          small: { n: small.n, ms: r2(small.ms), perRecordMs: r2(small.perRecordMs), fillMs: r2(small.fillMs), memory: small.memory, check: small.check, flushes: small.replayAnswer.flushes ?? null },
          big: { n: big.n, ms: r2(big.ms), perRecordMs: r2(big.perRecordMs), fillMs: r2(big.fillMs), memory: big.memory, check: big.check, flushes: big.replayAnswer.flushes ?? null },
          perRecordRatio: r2(big.perRecordMs / small.perRecordMs),
          wallSeconds: r2((Date.now() - t) / 1000),
        };
      }
    }
    results.consoleErrors = consoleErrors.slice(0, 50);
  } finally {
    await context.close().catch(() => {});
    await fetch(`${server.master}/quit`).catch(() => {});
    server.child.kill();
    rmSync(profile, { recursive: true, force: true });
  }

  results.machine = {
    cpus: cpus().length, cpuModel: cpus()[0]?.model, memGB: r2(totalmem() / 2 ** 30), node: process.version,
    browser: browserVersion, date: new Date().toISOString(), wallSeconds: r2((Date.now() - started) / 1000),
  };
  if (opt.only) {
    writeFileSync(opt.out, JSON.stringify(results, null, 2));
    console.log(JSON.stringify(results.scale, null, 2));
    if (problems.length) { console.log(problems.join('\n')); process.exitCode = 1; }
    return;
  }
  results.targets = targets(results);
  results.problems = problems;
  mkdirSync(dirname(opt.out), { recursive: true });
  writeFileSync(opt.out, JSON.stringify(results, null, 2));
  console.log(table(results));
  console.log(`\nJSON: ${opt.out}`);
  if (problems.length) {
    console.log(`\nBROKEN (${problems.length}):\n  - ${problems.join('\n  - ')}`);
    process.exitCode = 1;
  } else console.log(`\nall subjects correct (no duplicates, order intact, every write applied); ${results.machine.wallSeconds} s`);
}

// ---------------------------------------------------------------- targets and table
function targets(r) {
  const t = [];
  const add = (id, what, value, limit, cmp, unit = '×') => {
    const met = cmp === '<=' ? value <= limit : value >= limit;
    const miss = cmp === '<=' ? `${r2((value / limit - 1) * 100)}% over the target` : `${r2((1 - value / limit) * 100)}% short of the target`;
    t.push({ id, what, value: r2(value), limit, unit, met: Number.isFinite(value) ? met : false, missedBy: met ? null : miss });
  };
  const s = r.enqueueSequential; const c = r.enqueueConcurrent;
  add(1, 'sequential enqueue p50 vs Workbox', s.product.p50 / s.workbox.p50, 0.9, '<=');
  add(2, `concurrent enqueue (${r.options.inflight} in flight) writes/s vs Workbox`, c.product.writesPerSec / c.workbox.writesPerSec, 3, '>=');
  add(3, `replay time, ${r.options.n} over ${r.options.workspaces} workspaces, vs Workbox`, r.replay.product.medianMs / r.replay.workbox.medianMs, 0.35, '<=');
  add('4a', 'cold start register()→controlled vs Workbox', r.coldRegister.product.medianMs / r.coldRegister.workbox.medianMs, 1.5, '<=');
  add('4b', 'first write after stopped worker vs Workbox', r.firstWriteAfterStop.product.medianMs / r.firstWriteAfterStop.workbox.medianMs, 1.5, '<=');
  add(5, '.wasm + glue + sw.js, gzip -9 (KB)', r.sizes.product.total.gzip9 / 1024, 120, '<=', 'KB');
  if (r.scale) {
    add(6, `replay per-record cost at ${r.options.scale} vs ${r.options.n}`, r.scale.product.perRecordRatio, 1.2, '<=');
    const m = r.scale.product;
    if (m.small.memory && m.big.memory) {
      // Holding every body would grow the peak by about (scale - n) × bytes.
      // Growth = (peak retained JS heap, after forced GCs, above its pre-replay baseline + wasm memory grown during the
      // replay) at scale minus the same at n.
      const above = (mm) => ((mm.peakRetainedAfterGc ?? mm.peakUsed) - mm.baselineUsed) + ((mm.wasmMemoryAfter ?? 0) - (mm.wasmMemoryBefore ?? 0));
      const growth = above(m.big.memory) - above(m.small.memory);
      const bodies = (r.options.scale - r.options.n) * r.options.bytes;
      add('6m', 'memory growth (JS heap peak + wasm) as a share of the extra bodies', growth / bodies, 0.1, '<=');
    }
  }
  const dupes = [r.replay.product, r.replay.productC4].flatMap((x) => x.checks).reduce((a, k) => a + k.duplicates + k.duplicateKeyAttempts + k.orderViolations + k.missing, 0);
  t.push({ id: '3c', what: 'replay: duplicates + order violations + missing (product)', value: dupes, limit: 0, met: dupes === 0, missedBy: dupes ? String(dupes) : null });
  return t;
}

function table(r) {
  const L = [];
  const row = (cells, w) => L.push(cells.map((c, i) => String(c).padEnd(w[i] ?? 14)).join(' '));
  const x = (a, b) => (Number.isFinite(a / b) ? `${r2(a / b)}×` : '–');
  const W = [44, 12, 12, 12, 14, 14];
  L.push(`sw-outbox benchmark${r.smoke ? ' (SMOKE: tiny N, figures meaningless)' : ''} — N=${r.options.n}, body ${r.options.bytes} B, medians of ${r.options.reps}`);
  L.push(`${r.machine.browser}; ${r.machine.cpus} × ${r.machine.cpuModel}; node ${r.machine.node}`);
  L.push('');
  row(['measure', 'product', 'Workbox†', 'raw limit', 'prod/Workbox', 'prod/raw'], W);
  L.push('-'.repeat(112));
  const s = r.enqueueSequential;
  for (const p of ['p50', 'p95', 'p99']) row([`1 offline enqueue sequential ${p} (ms)`, s.product[p], s.workbox[p], s.raw[p], x(s.product[p], s.workbox[p]), x(s.product[p], s.raw[p])], W);
  const c = r.enqueueConcurrent;
  row([`2 offline enqueue ${r.options.inflight} in flight (writes/s)`, c.product.writesPerSec, c.workbox.writesPerSec, c.raw.writesPerSec, x(c.product.writesPerSec, c.workbox.writesPerSec), x(c.product.writesPerSec, c.raw.writesPerSec)], W);
  const bo = r.enqueueBrowserOffline;
  if (bo) {
    row(['1\' same, browser offline: sequential p50 (ms)', bo.product.seqP50, bo.workbox.seqP50, bo.raw.seqP50, x(bo.product.seqP50, bo.workbox.seqP50), x(bo.product.seqP50, bo.raw.seqP50)], W);
    row([`2' same, browser offline: ${r.options.inflight} in flight (w/s)`, bo.product.concWritesPerSec, bo.workbox.concWritesPerSec, bo.raw.concWritesPerSec, x(bo.product.concWritesPerSec, bo.workbox.concWritesPerSec), x(bo.product.concWritesPerSec, bo.raw.concWritesPerSec)], W);
  }
  const rp = r.replay; const lim = r.rawLimit[`post-${r.options.workspaces}-lanes`]; const lim1 = r.rawLimit['post-1-lanes'];
  row([`3 replay ${r.options.n} / ${r.options.workspaces} ws, c=10 (ms)`, rp.product.medianMs, rp.workbox.medianMs, lim.totalMs, x(rp.product.medianMs, rp.workbox.medianMs), x(rp.product.medianMs, lim.totalMs)], W);
  row([`3 replay, default replayConcurrency 4 (ms)`, rp.productC4.medianMs, rp.workbox.medianMs, lim.totalMs, x(rp.productC4.medianMs, rp.workbox.medianMs), x(rp.productC4.medianMs, lim.totalMs)], W);
  row([`3 fill ${r.options.n} over ${r.options.workspaces} ws, offline (ms)`, rp.product.fillMsMedian, rp.workbox.fillMsMedian, '', x(rp.product.fillMsMedian, rp.workbox.fillMsMedian), ''], W);
  const dup = (k) => k.reduce((a, y) => `${a}${a ? ' ' : ''}${y.duplicates + y.duplicateKeyAttempts}/${y.orderViolations}/${y.missing}`, '');
  row(['3 dup/order/missing per run', dup(rp.product.checks), dup(rp.workbox.checks), '', '', ''], W);
  const cr = r.coldRegister; const fw = r.firstWriteAfterStop;
  row(['4 cold register() → controlled (ms)', cr.product.medianMs, cr.workbox.medianMs, cr.raw.medianMs, x(cr.product.medianMs, cr.workbox.medianMs), x(cr.product.medianMs, cr.raw.medianMs)], W);
  row(['4 first write after stopped worker (ms)', fw.product.medianMs, fw.workbox.medianMs, fw.raw.medianMs, x(fw.product.medianMs, fw.workbox.medianMs), x(fw.product.medianMs, fw.raw.medianMs)], W);
  const z = r.sizes;
  row(['5 size raw (KB): wasm+glue+sw.js | bundle', r2(z.product.total.raw / 1024), r2(z.workbox.raw / 1024), '', x(z.product.total.raw, z.workbox.raw), ''], W);
  row(['5 size gzip -9 (KB)', r2(z.product.total.gzip9 / 1024), r2(z.workbox.gzip9 / 1024), '', x(z.product.total.gzip9, z.workbox.gzip9), ''], W);
  if (r.scale) {
    for (const k of ['product', 'workbox']) {
      const q = r.scale[k];
      row([`6 ${k}: replay ms/record at ${q.small.n} | ${q.big.n}`, q.small.perRecordMs, q.big.perRecordMs, '', `ratio ${q.perRecordRatio}×`, ''], W);
      if (q.small.memory) {
        const mb = (b) => (b == null ? '–' : r2(b / 2 ** 20));
        row([`6 ${k}: JS heap MB peak (base) at ${q.small.n} | ${q.big.n}`, `${mb(q.small.memory.peakUsed)} (${mb(q.small.memory.baselineUsed)})`, `${mb(q.big.memory.peakUsed)} (${mb(q.big.memory.baselineUsed)})`, '', '', ''], W);
        if (k === 'product') row([`6 ${k}: wasm MB before→after replay ${q.small.n} | ${q.big.n}`, `${mb(q.small.memory.wasmMemoryBefore)}→${mb(q.small.memory.wasmMemoryAfter)}`, `${mb(q.big.memory.wasmMemoryBefore)}→${mb(q.big.memory.wasmMemoryAfter)}`, '', '', ''], W);
      }
    }
  }
  L.push('');
  L.push('raw limit (inside one service worker, per operation, N sequential unless noted):');
  for (const [k, v] of Object.entries(r.rawLimit)) L.push(`  ${k.padEnd(18)} total ${v.totalMs} ms, ${v.perOpMs} ms/op${v.p50 != null ? `, p50 ${v.p50} ms` : ''}`);
  L.push(`  (raw limit column: rows 1–2 = a plain-JS worker that stores each failed write with one strict transaction; row 3 = ${r.options.n} POSTs in ${r.options.workspaces} lanes from a worker, ${lim1.totalMs} ms in 1 lane)`);
  L.push('† Workbox commits relaxed (durability "relaxed", lib/QueueDb.js); the product and the raw enqueue commit "strict".');
  L.push('');
  L.push('targets of the issue:');
  for (const t of r.targets) L.push(`  ${String(t.id).padEnd(3)} ${t.what}: ${t.value}${t.unit === 'KB' ? ' KB' : t.unit === '×' ? '×' : ''} (target ${String(t.id) === '2' ? '≥' : t.id === '3c' ? '=' : '≤'} ${t.limit}${t.unit === 'KB' ? ' KB' : ''}) — ${t.met ? 'met' : `MISSED: ${t.missedBy}`}`);
  return L.join('\n');
}

main().catch((err) => { console.error(err); process.exit(2); });
