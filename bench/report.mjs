// The benchmark's tables: one Markdown table with a column per setting (latency × CPU),
// and the issue's targets evaluated in each setting. Pure functions of results.json.

export const sorted = (xs) => [...xs].sort((a, b) => a - b);
export const pct = (xs, p) => { const s = sorted(xs); return s.length ? s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)] : NaN; };
export const median = (xs) => pct(xs, 50);
export const r2 = (x) => (Number.isFinite(x) ? Math.round(x * 100) / 100 : x);

export const settingLabel = (s) => `${s.latencyMs} ms${s.cpu === 1 ? '' : `, CPU ÷${s.cpu}`}`;
export const NAMES = { product: 'product', productC4: 'product, replayConcurrency 4', workbox: 'Workbox', plain: 'plain-JS', floor: 'floor: 202 from memory, no storage', none: 'no worker' };

/** Settings in display order: latency, then CPU. */
export const ordered = (r) => [...r.settings].sort((a, b) => a.latencyMs - b.latencyMs || a.cpu - b.cpu);

const fmt = (x) => {
  if (x == null || !Number.isFinite(x)) return '–';
  const a = Math.abs(x);
  return String(a >= 100 ? Math.round(x) : a >= 10 ? Math.round(x * 10) / 10 : Math.round(x * 100) / 100);
};
const ratio = (a, b) => (Number.isFinite(a / b) ? `${fmt(a / b)}×` : '–');

/** The targets of issue 15 in one setting: {id, what, value, limit, cmp, met}. */
export function settingTargets(r, s) {
  const t = [];
  const add = (id, what, value, limit, cmp) => {
    if (!Number.isFinite(value)) return;
    t.push({ id, what, value: r2(value), limit, cmp, met: cmp === '<=' ? value <= limit : value >= limit });
  };
  const rp = s.replay;
  if (rp && s.latencyMs === 0) add('1a', 'replay writes/s vs the plain-JS outbox (latency 0)', rp.product.perSec / rp.plain.perSec, 2, '>=');
  if (rp && s.latencyMs > 0) add('1b', 'replay time vs Workbox (with latency)', rp.product.medianMs / rp.workbox.medianMs, 0.2, '<=');
  if (s.scale?.product) {
    const m = s.scale.product;
    add('1c', `replay cost per record at ${m.big.n} vs ${m.small.n}`, m.perRecordRatio, 1.2, '<=');
    const mem = m.big.memory;
    if (mem?.wasmMemoryAfter != null && mem.wasmMemoryBefore != null) {
      add('1d', `wasm memory growth during the fill and replay of ${m.big.n} (KB per record)`, (mem.wasmMemoryAfter - mem.wasmMemoryBefore) / 1024 / m.big.n, 0.1, '<=');
    }
  }
  if (s.enqueueSequential && s.rawLimit) {
    add('3', 'sequential offline enqueue p50 vs the raw strict add p50', s.enqueueSequential.product.p50 / s.rawLimit['idb-strict'].p50, 1.5, '<=');
  }
  if (s.coldRegister) add('4a', 'cold register → controlled vs Workbox (neither precaches)', s.coldRegister.product.medianMs / s.coldRegister.workbox.medianMs, 1.2, '<=');
  if (s.firstWriteAfterStop) add('4b', 'first write after a stopped worker vs Workbox', s.firstWriteAfterStop.product.medianMs / s.firstWriteAfterStop.workbox.medianMs, 1.2, '<=');
  if (s.firstOnlineWriteAfterStop) add('4c', 'first online write after a stopped worker vs Workbox', s.firstOnlineWriteAfterStop.product.medianMs / s.firstOnlineWriteAfterStop.workbox.medianMs, 1.2, '<=');
  if (s.enqueueConcurrent) add('5', `${r.options.inflight} in flight writes/s vs Workbox`, s.enqueueConcurrent.product.writesPerSec / s.enqueueConcurrent.workbox.writesPerSec, 3, '>=');
  if (s.enqueueConcurrent?.floor) add('5b', `${r.options.inflight} in flight writes/s vs the floor (202 from memory)`, s.enqueueConcurrent.product.writesPerSec / s.enqueueConcurrent.floor.writesPerSec, 0.8, '>=');
  const pl = s.pageLoad;
  if (pl?.product && pl.workbox) {
    add('7a', 'page load, worker stopped: navigation first byte vs Workbox', pl.product.cold.ttfbMs / pl.workbox.cold.ttfbMs, 1.15, '<=');
    add('7b', 'page load, worker stopped: `load` vs Workbox', pl.product.cold.loadMs / pl.workbox.cold.loadMs, 1.05, '<=');
    add('7c', 'page load, worker running: navigation first byte vs Workbox', pl.product.warm.ttfbMs / pl.workbox.warm.ttfbMs, 1.15, '<=');
    add('7d', 'page load, worker running: `load` vs Workbox', pl.product.warm.loadMs / pl.workbox.warm.loadMs, 1.05, '<=');
  }
  if (pl?.productStatic && pl.none) add('7e', 'page load, worker stopped, `staticRoutes: true`: navigation first byte vs no worker', pl.productStatic.cold.ttfbMs / pl.none.cold.ttfbMs, 1.05, '<=');
  if (s.replay) {
    const dup = ['product', 'productC4'].flatMap((k) => s.replay[k]?.checks ?? []).reduce((a, k) => a + k.duplicates + k.duplicateKeyAttempts + k.orderViolations + k.missing, 0);
    add('3c', 'replay: duplicates + order violations + missing (product)', dup, 0, '<=');
  }
  return t;
}

export function targetsMarkdown(r) {
  const S = ordered(r);
  const rows = new Map();
  for (const s of S) for (const t of settingTargets(r, s)) {
    if (!rows.has(t.id)) rows.set(t.id, { id: t.id, what: t.what, limit: t.limit, cmp: t.cmp, by: {} });
    rows.get(t.id).by[s.key] = t;
  }
  const L = [];
  L.push(`| # | target | limit | ${S.map(settingLabel).join(' | ')} |`);
  L.push(`|---|---|---|${S.map(() => '---').join('|')}|`);
  const sizeKb = r.sizes.product.total.gzip9 / 1024;
  for (const row of [...rows.values()].sort((a, b) => String(a.id).localeCompare(String(b.id), 'en', { numeric: true }))) {
    const cells = S.map((s) => { const t = row.by[s.key]; return t ? `${fmt(t.value)} ${t.met ? 'met' : '**missed**'}` : ''; });
    L.push(`| ${row.id} | ${row.what} | ${row.cmp === '<=' ? '≤' : '≥'} ${row.limit} | ${cells.join(' | ')} |`);
  }
  L.push(`| 6 | wasm + glue + sw.js, gzip -9 (KB) | ≤ 120 | ${fmt(sizeKb)} ${sizeKb <= 120 ? 'met' : '**missed**'} (every setting) |${S.slice(1).map(() => '').join('|')}${S.length > 1 ? '|' : ''}`);
  return L.join('\n');
}

/** One Markdown table: a row per measure and subject, a column per setting. */
export function summaryMarkdown(r) {
  const S = ordered(r);
  const L = [];
  const m = r.machine ?? {};
  L.push(`sw-outbox benchmark${r.smoke ? ' (SMOKE: tiny N, figures meaningless)' : ''}: N=${r.options.n}, bodies ${r.options.bytes} B, medians of ${r.options.reps}; ${m.browser ?? ''}; ${m.cpus ?? '?'} × ${m.cpuModel ?? '?'}; node ${m.node ?? '?'}; ${m.date ?? ''}`);
  L.push('');
  L.push(`| measure | subject | ${S.map(settingLabel).join(' | ')} |`);
  L.push(`|---|---|${S.map(() => '---:').join('|')}|`);
  const row = (measure, subject, f) => L.push(`| ${measure} | ${subject} | ${S.map((s) => { try { const v = f(s); return typeof v === 'string' ? v : fmt(v); } catch { return '–'; } }).join(' | ')} |`);
  const rat = (f, g) => (s) => ratio(f(s), g(s));

  for (const p of ['p50', 'p95', 'p99']) {
    const m1 = `1 offline enqueue, sequential, ${p} (ms)`;
    for (const k of ['product', 'workbox', 'plain']) row(k === 'product' ? m1 : '', NAMES[k], (s) => s.enqueueSequential[k][p]);
    if (p === 'p50') row('', 'raw limit: strict add p50', (s) => s.rawLimit['idb-strict'].p50);
    row('', 'product / Workbox', rat((s) => s.enqueueSequential.product[p], (s) => s.enqueueSequential.workbox[p]));
    row('', 'product / plain-JS', rat((s) => s.enqueueSequential.product[p], (s) => s.enqueueSequential.plain[p]));
    if (p === 'p50') row('', 'product / raw strict add', rat((s) => s.enqueueSequential.product.p50, (s) => s.rawLimit['idb-strict'].p50));
  }
  const c = (s) => s.enqueueConcurrent;
  const m2 = `2 offline enqueue, ${r.options.inflight} in flight (writes/s)`;
  for (const k of ['product', 'workbox', 'plain']) row(k === 'product' ? m2 : '', NAMES[k], (s) => c(s)[k].writesPerSec);
  row('', 'product / Workbox', rat((s) => c(s).product.writesPerSec, (s) => c(s).workbox.writesPerSec));
  row('', 'product / plain-JS', rat((s) => c(s).product.writesPerSec, (s) => c(s).plain.writesPerSec));
  if (S.some((s) => c(s)?.floor)) {
    row('', NAMES.floor, (s) => c(s).floor.writesPerSec);
    row('', 'product / floor', rat((s) => c(s).product.writesPerSec, (s) => c(s).floor.writesPerSec));
  }
  if (S.some((s) => s.enqueueBrowserOffline)) {
    for (const k of ['product', 'workbox', 'plain']) row(k === 'product' ? '1′ browser offline: sequential p50 (ms)' : '', NAMES[k], (s) => s.enqueueBrowserOffline[k].seqP50);
    for (const k of ['product', 'workbox', 'plain']) row(k === 'product' ? `2′ browser offline: ${r.options.inflight} in flight (writes/s)` : '', NAMES[k], (s) => s.enqueueBrowserOffline[k].concWritesPerSec);
  }
  const rp = (s) => s.replay;
  const m3 = `3 replay ${r.options.n} over ${r.options.workspaces} workspaces (writes/s)`;
  for (const k of ['product', 'productC4', 'workbox', 'plain']) row(k === 'product' ? m3 : '', NAMES[k], (s) => rp(s)[k].perSec);
  row('', `raw limit: POST, ${r.options.workspaces} lanes`, (s) => s.rawLimit[`post-${r.options.workspaces}-lanes`].perSec);
  row('', 'raw limit: POST, 1 lane', (s) => s.rawLimit['post-1-lanes'].perSec);
  row('', 'product / plain-JS (throughput)', rat((s) => rp(s).product.perSec, (s) => rp(s).plain.perSec));
  row('', 'product / Workbox (time)', rat((s) => rp(s).product.medianMs, (s) => rp(s).workbox.medianMs));
  for (const k of ['product', 'productC4', 'workbox', 'plain']) row(k === 'product' ? '3 replay time (ms)' : '', NAMES[k], (s) => rp(s)[k].medianMs);
  for (const k of ['product', 'workbox', 'plain']) row(k === 'product' ? `3 fill: ${r.options.n} offline writes, ${r.options.workspaces} lanes (ms)` : '', NAMES[k], (s) => rp(s)[k].fillMsMedian);
  const dup = (k) => (s) => rp(s)[k].checks.map((y) => `${y.duplicates + y.duplicateKeyAttempts}/${y.orderViolations}/${y.missing}`).join(' ');
  for (const k of ['product', 'productC4', 'workbox', 'plain']) row(k === 'product' ? '3 duplicates/order/missing per run' : '', NAMES[k], dup(k));
  for (const k of ['product', 'workbox', 'plain']) row(k === 'product' ? '4 cold register() → controlled (ms)' : '', NAMES[k], (s) => s.coldRegister[k].medianMs);
  row('', 'product / Workbox', rat((s) => s.coldRegister.product.medianMs, (s) => s.coldRegister.workbox.medianMs));
  for (const k of ['product', 'workbox', 'plain']) row(k === 'product' ? '4 first write after a stopped worker (ms)' : '', NAMES[k], (s) => s.firstWriteAfterStop[k].medianMs);
  row('', 'product / Workbox', rat((s) => s.firstWriteAfterStop.product.medianMs, (s) => s.firstWriteAfterStop.workbox.medianMs));
  if (S.some((s) => s.firstOnlineWriteAfterStop)) {
    const fo = (s) => s.firstOnlineWriteAfterStop;
    for (const k of ['product', 'workbox', 'plain', 'none']) row(k === 'product' ? '4 first online write (201) after a stopped worker (ms)' : '', NAMES[k], (s) => fo(s)[k].medianMs);
    row('', 'product / Workbox', rat((s) => fo(s).product.medianMs, (s) => fo(s).workbox.medianMs));
    row('', 'product / no worker', rat((s) => fo(s).product.medianMs, (s) => fo(s).none.medianMs));
  }
  if (S.some((s) => s.pageLoad)) {
    const who = { product: 'product (API only)', productShell: 'product, the page as its shell', productStatic: 'product, `staticRoutes: true`', workbox: 'Workbox', none: 'no worker' };
    for (const warmth of ['cold', 'warm']) {
      for (const [k, what] of [['ttfbMs', 'navigation first byte'], ['loadMs', '`load`']]) {
        const m = `7 page of 24 files, worker ${warmth === 'cold' ? 'stopped' : 'running'}: ${what} (ms)`;
        Object.entries(who).forEach(([p, n], i) => row(i ? '' : m, n, (s) => s.pageLoad[p][warmth][k]));
        row('', 'product / Workbox', rat((s) => s.pageLoad.product[warmth][k], (s) => s.pageLoad.workbox[warmth][k]));
        if (S.some((s) => s.pageLoad.productStatic)) row('', 'product, `staticRoutes` / no worker', rat((s) => s.pageLoad.productStatic[warmth][k], (s) => s.pageLoad.none[warmth][k]));
      }
    }
    if (S.some((s) => s.pageLoad.productStatic)) {
      const started = (p) => (s) => { const x = s.pageLoad[p]?.cold; return x ? `${x.workerStarted ?? '–'} of ${x.runs.length}` : '–'; };
      row('7 stopped-worker loads that started the worker (CDP)', NAMES.product, started('product'));
      row('', 'product, `staticRoutes: true`', started('productStatic'));
      row('', 'product, `staticRoutes: true`: navigations the browser routed to the network', (s) => { const x = s.pageLoad.productStatic?.cold; return x ? `${x.routedToNetwork ?? '–'} of ${x.runs.length}` : '–'; });
    }
    if (S.some((s) => s.pageLoad.none?.cold?.steps)) {
      // Where a stopped-worker load's time before its first byte goes (Navigation Timing).
      const steps = ['workerStart', 'workerRouterEvaluationStart', 'fetchStart', 'requestStart'];
      Object.entries(who).forEach(([p, n], i) => row(i ? '' : '7 worker stopped: the navigation\'s steps, ms (workerStart / router evaluated / fetchStart / requestStart)', n,
        (s) => steps.map((k) => fmt(s.pageLoad[p]?.cold?.steps?.[k])).join(' / ')));
    }
  }
  row('CPU check: a fixed loop in a service worker (ms), start / end', '', (s) => `${fmt(s.cpuCheck.workerLoopMsStart)} / ${fmt(s.cpuCheck.workerLoopMsEnd)}`);
  row('CPU check: the same loop on a page (ms), start / end', '', (s) => `${fmt(s.cpuCheck.pageLoopMsStart)} / ${fmt(s.cpuCheck.pageLoopMsEnd)}`);
  row('CPU quota (µs per period): the loop without → with it', '', (s) => { const c = s.cpuCheck.calibration; return c ? `${c.quotaUs} / ${c.periodUs}: ${fmt(c.baseMs)} → ${fmt(c.slowMs)} (${fmt(c.factor)}×)` : 'none'; });
  row('load average (1 min) at start / end', '', (s) => `${fmt(s.loadStart?.[0])} / ${fmt(s.loadEnd?.[0])}`);
  row('wall time of the setting (s)', '', (s) => s.wallSeconds);
  const z = r.sizes;
  L.push('');
  L.push(`Size (gzip -9, each file compressed separately): product wasm + glue + sw.js (as shipped) ${fmt(z.product.total.gzip9 / 1024)} KB (raw ${fmt(z.product.total.raw / 1024)} KB); Workbox bundle ${fmt(z.workbox.gzip9 / 1024)} KB; plain-JS outbox ${fmt(z.plain.gzip9 / 1024)} KB.`);
  L.push('Workbox commits each queued request with durability "relaxed" (lib/QueueDb.js); the product and the plain-JS outbox commit "strict".');
  const sc = S.find((s) => s.scale);
  if (sc) {
    L.push('');
    L.push(`Scale (setting ${settingLabel(sc)}): replay of ${r.options.n}, then of ${r.options.scale}, in one worker`);
    L.push('');
    L.push('| subject | ms/record at n | ms/record at scale | ratio | JS heap retained after GC, peak (MB) n / scale | wasm memory before → after (MB) n / scale |');
    L.push('|---|---:|---:|---:|---|---|');
    const mb = (b) => (b == null ? '–' : fmt(b / 2 ** 20));
    for (const [k, q] of Object.entries(sc.scale)) {
      L.push(`| ${NAMES[k] ?? k} | ${fmt(q.small.perRecordMs)} | ${fmt(q.big.perRecordMs)} | ${fmt(q.perRecordRatio)}× | ${mb(q.small.memory?.peakRetainedAfterGc)} / ${mb(q.big.memory?.peakRetainedAfterGc)} | ${mb(q.small.memory?.wasmMemoryBefore)} → ${mb(q.small.memory?.wasmMemoryAfter)} / ${mb(q.big.memory?.wasmMemoryBefore)} → ${mb(q.big.memory?.wasmMemoryAfter)} |`);
    }
  }
  const stepTable = (row, title) => {
    const st = S.filter((s) => s[row]?.product?.steps);
    if (!st.length) return;
    L.push('');
    L.push(title);
    L.push('');
    L.push(`| subject | step | ${st.map(settingLabel).join(' | ')} |`);
    L.push(`|---|---|${st.map(() => '---:').join('|')}|`);
    for (const k of ['product', 'workbox', 'plain'].filter((x) => st.some((s) => s[row][x]))) {
      const names = [...new Set(st.flatMap((s) => Object.keys(s[row][k]?.steps ?? {})))];
      names.forEach((n, i) => L.push(`| ${i ? '' : NAMES[k]} | ${n} | ${st.map((s) => fmt(s[row][k]?.steps?.[n])).join(' | ')} |`));
    }
  };
  stepTable('coldRegister', 'Cold `register()` → controlled, step by step: when each step was reached, in ms after `register()` (medians; the worker\'s time origin, then its User Timing marks, then the page seeing itself controlled):');
  stepTable('firstWriteAfterStop', 'First write after a stopped worker, step by step: when each step was reached, in ms after the page\'s `fetch()` (medians; the worker\'s time origin, then its User Timing marks, then the page\'s answer):');
  stepTable('firstOnlineWriteAfterStop', 'First online write (201) after a stopped worker, step by step (as above):');
  L.push('');
  L.push('Raw limits inside one service worker (N sequential unless noted; POST loops under latency use --raw-n records):');
  L.push('');
  L.push(`| op | ${S.map(settingLabel).join(' | ')} |`);
  L.push(`|---|${S.map(() => '---:').join('|')}|`);
  const ops = [...new Set(S.flatMap((s) => Object.keys(s.rawLimit ?? {})))];
  for (const op of ops) L.push(`| ${op} (ms/op, p50) | ${S.map((s) => { const v = s.rawLimit?.[op]; return v ? `${fmt(v.perOpMs)}${v.p50 != null ? `, ${fmt(v.p50)}` : ''}` : '–'; }).join(' | ')} |`);
  return L.join('\n');
}
