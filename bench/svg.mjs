// The benchmark's picture, hand-written SVG (no chart library): per setting (latency × CPU)
//   1. time per write of sequential offline enqueue, per subject: a box (p25–p75), whiskers
//      (p5–p95), the median as a bar and p99 as a dot, on a log scale, with the raw strict
//      IndexedDB add of the same setting as a dashed mark;
//   2. offline enqueue with 16 in flight, writes/s per subject;
//   3. replay throughput, writes/s per subject, with the raw POST limit as a dashed mark.
import { NAMES, ordered, pct, settingLabel } from './report.mjs';

const COLOR = { product: '#1f63b4', productC4: '#7aa9de', workbox: '#e07b12', plain: '#2f9e44' };
const W = 1000;
const LEFT = 250; // label column
const RIGHT = 70;
const PLOT = W - LEFT - RIGHT;
const ROW = 15;
const GAP = 12;

const esc = (s) => String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');
const num = (x) => (x >= 100 ? Math.round(x) : x >= 10 ? Math.round(x * 10) / 10 : Math.round(x * 100) / 100);
const text = (x, y, s, extra = '') => `<text x="${x.toFixed(1)}" y="${y.toFixed(1)}" ${extra}>${esc(s)}</text>`;

function logTicks(lo, hi) {
  const t = [];
  for (let d = Math.floor(Math.log10(lo)); d <= Math.ceil(Math.log10(hi)); d++) {
    for (const m of [1, 2, 5]) { const v = m * 10 ** d; if (v >= lo && v <= hi) t.push(v); }
  }
  return t;
}
function linTicks(hi) {
  const step = 10 ** Math.floor(Math.log10(hi / 4 || 1));
  const k = [1, 2, 5, 10].find((m) => hi / (m * step) <= 6) * step;
  const t = [0];
  for (let i = 1; t[t.length - 1] < hi; i++) t.push(Math.round(i * k * 1e6) / 1e6);
  return t;
}

/** A panel of grouped horizontal rows; `draw(y, setting, key)` draws one row's mark. */
function panel(out, { y0, title, settings, keys, scale, ticks, tickFmt, draw, mark }) {
  let y = y0;
  out.push(text(10, y + 14, title, 'class="h"'));
  y += 26;
  const top = y;
  for (const s of settings) {
    const present = keys.filter((k) => draw.has(s, k));
    if (!present.length) continue;
    const gTop = y;
    out.push(text(10, y + 11, settingLabel(s), 'class="g"'));
    for (const k of present) {
      out.push(text(LEFT - 8, y + 11, NAMES[k] ?? k, 'text-anchor="end"'));
      out.push(draw.row(y, s, k));
      y += ROW;
    }
    if (mark) out.push(mark(gTop, y, s));
    y += GAP;
  }
  const bottom = y - GAP + 4;
  // axis and grid
  for (const t of ticks) {
    const x = LEFT + scale(t);
    out.push(`<line x1="${x.toFixed(1)}" y1="${top - 4}" x2="${x.toFixed(1)}" y2="${bottom}" class="grid"/>`);
    out.push(text(x, bottom + 13, tickFmt(t), 'text-anchor="middle" class="tick"'));
  }
  return bottom + 24;
}

export function renderSvg(r) {
  const S = ordered(r);
  const out = [];
  let y = 0;
  const subjects = ['product', 'workbox', 'plain'];

  // ---- 1. sequential enqueue distribution
  const q = (s, k) => {
    const e = s.enqueueSequential?.[k];
    if (!e) return null;
    const xs = e.samples?.length ? e.samples : null;
    return xs ? { p5: pct(xs, 5), p25: pct(xs, 25), p50: pct(xs, 50), p75: pct(xs, 75), p95: pct(xs, 95), p99: pct(xs, 99) }
      : { p50: e.p50, p95: e.p95, p99: e.p99 };
  };
  const all = S.flatMap((s) => subjects.map((k) => q(s, k)).filter(Boolean));
  const strict = (s) => s.rawLimit?.['idb-strict']?.p50;
  if (all.length) {
    const lo = 10 ** Math.floor(Math.log10(Math.max(0.1, Math.min(...all.map((x) => x.p5 ?? x.p50), ...S.map(strict).filter(Boolean)))));
    const hi = 10 ** Math.ceil(Math.log10(Math.max(...all.map((x) => x.p99))));
    const sc = (v) => (Math.log10(Math.max(lo, Math.min(hi, v))) - Math.log10(lo)) / (Math.log10(hi) - Math.log10(lo)) * PLOT;
    y = panel(out, {
      y0: y, settings: S, keys: subjects,
      title: `1 · Offline enqueue, one write at a time: ms per write (page fetch → 202), log scale; box p25–p75, whiskers p5–p95, bar median, dot p99`,
      scale: sc, ticks: logTicks(lo, hi), tickFmt: (t) => `${t}`,
      draw: {
        has: (s, k) => Boolean(q(s, k)),
        row: (yy, s, k) => {
          const v = q(s, k); const c = COLOR[k]; const mid = yy + ROW / 2;
          const X = (t) => (LEFT + sc(t)).toFixed(1);
          const parts = [];
          if (v.p5 != null) {
            parts.push(`<line x1="${X(v.p5)}" y1="${mid}" x2="${X(v.p95)}" y2="${mid}" stroke="${c}" stroke-width="1.2"/>`);
            parts.push(`<rect x="${X(v.p25)}" y="${yy + 3}" width="${Math.max(1, sc(v.p75) - sc(v.p25)).toFixed(1)}" height="${ROW - 6}" fill="${c}" fill-opacity="0.35" stroke="${c}"/>`);
          } else {
            parts.push(`<line x1="${X(v.p50)}" y1="${mid}" x2="${X(v.p95)}" y2="${mid}" stroke="${c}" stroke-width="1.2"/>`);
          }
          parts.push(`<line x1="${X(v.p50)}" y1="${yy + 1.5}" x2="${X(v.p50)}" y2="${yy + ROW - 1.5}" stroke="${c}" stroke-width="3"/>`);
          parts.push(`<circle cx="${X(v.p99)}" cy="${mid}" r="2.5" fill="${c}"/>`);
          parts.push(text(LEFT + PLOT + 6, yy + 11, `${num(v.p50)}`, 'class="v"'));
          return parts.join('');
        },
      },
      mark: (gTop, gBottom, s) => {
        const v = strict(s);
        if (!v) return '';
        const x = (LEFT + sc(v)).toFixed(1);
        return `<line x1="${x}" y1="${gTop}" x2="${x}" y2="${gBottom}" class="limit"/>${text(Number(x) + 3, gTop + 8, 'strict add', 'class="lim"')}`;
      },
    });
  }

  // ---- 2. 16 in flight
  const conc = (s, k) => s.enqueueConcurrent?.[k]?.writesPerSec;
  const cmax = Math.max(1, ...S.flatMap((s) => subjects.map((k) => conc(s, k) ?? 0)));
  const cTicks = linTicks(cmax);
  const cs = (v) => v / cTicks[cTicks.length - 1] * PLOT;
  const bar = (value) => (yy, s, k) => {
    const v = value(s, k);
    return `<rect x="${LEFT}" y="${yy + 2}" width="${Math.max(1, cs(v)).toFixed(1)}" height="${ROW - 4}" fill="${COLOR[k]}"/>${text(LEFT + cs(v) + 4, yy + 11, `${num(v)}`, 'class="v"')}`;
  };
  if (S.some((s) => s.enqueueConcurrent)) {
    y = panel(out, {
      y0: y, settings: S, keys: subjects, title: `2 · Offline enqueue, ${r.options.inflight} in flight: writes/s`,
      scale: cs, ticks: cTicks, tickFmt: (t) => `${t}`, draw: { has: (s, k) => Number.isFinite(conc(s, k)), row: bar(conc) },
    });
  }

  // ---- 3. replay throughput
  const rp = (s, k) => s.replay?.[k]?.perSec;
  const lim = (s) => s.rawLimit?.[`post-${r.options.workspaces}-lanes`]?.perSec;
  const rkeys = ['product', 'productC4', 'workbox', 'plain'];
  const rmax = Math.max(1, ...S.flatMap((s) => [...rkeys.map((k) => rp(s, k) ?? 0), lim(s) ?? 0]));
  const rTicks = linTicks(rmax);
  const rsc = (v) => v / rTicks[rTicks.length - 1] * PLOT;
  if (S.some((s) => s.replay)) {
    y = panel(out, {
      y0: y, settings: S, keys: rkeys,
      title: `3 · Replay of ${r.options.n} writes over ${r.options.workspaces} workspaces: writes/s (dashed: raw POST limit, ${r.options.workspaces} lanes)`,
      scale: rsc, ticks: rTicks, tickFmt: (t) => `${t}`,
      draw: { has: (s, k) => Number.isFinite(rp(s, k)), row: (yy, s, k) => { const v = rp(s, k); return `<rect x="${LEFT}" y="${yy + 2}" width="${Math.max(1, rsc(v)).toFixed(1)}" height="${ROW - 4}" fill="${COLOR[k]}"/>${text(LEFT + rsc(v) + 4, yy + 11, `${num(v)}`, 'class="v"')}`; } },
      mark: (gTop, gBottom, s) => {
        const v = lim(s);
        if (!v) return '';
        const x = (LEFT + rsc(v)).toFixed(1);
        return `<line x1="${x}" y1="${gTop}" x2="${x}" y2="${gBottom}" class="limit"/>`;
      },
    });
  }

  // ---- footer
  const m = r.machine ?? {};
  const cpuNote = S.filter((s) => s.cpuCheck?.calibration).map((s) => `${settingLabel(s)}: ${num(s.cpuCheck.calibration.baseMs)} → ${num(s.cpuCheck.calibration.slowMs)} ms (${num(s.cpuCheck.calibration.factor)}×)`).join('; ');
  const lines = [
    `sw-outbox benchmark${r.smoke ? ' (SMOKE: tiny N, figures meaningless)' : ''}: N=${r.options.n}, bodies ${r.options.bytes} B, medians of ${r.options.reps}; Chromium ${m.browser ?? ''} headless; ${m.cpus ?? '?'} × ${m.cpuModel ?? '?'}; ${m.date ?? ''}`,
    'latency: simulated round trip per API request (the bench server delays each answer and each dropped connection)',
    `CPU ÷4: the whole browser under a CPU quota of 1/4 core${cpuNote ? `; a fixed loop in a service worker without → with it: ${cpuNote}` : ''}`,
    `load average (1 min) per setting, start/end: ${S.map((s) => `${settingLabel(s)} ${s.loadStart?.[0] ?? '?'}/${s.loadEnd?.[0] ?? '?'}`).join('; ')}`,
  ];
  lines.forEach((l, i) => out.push(text(10, y + 4 + i * 14, l, 'class="foot"')));
  y += 8 + lines.length * 14;
  const legend = ['product', 'productC4', 'workbox', 'plain'].map((k, i) => `<rect x="${10 + i * 230}" y="${y}" width="12" height="10" fill="${COLOR[k]}"/>${text(26 + i * 230, y + 9, NAMES[k])}`).join('');
  out.push(legend);
  y += 22;

  return `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${Math.ceil(y)}" viewBox="0 0 ${W} ${Math.ceil(y)}" font-family="DejaVu Sans, Arial, sans-serif" font-size="11">
<style>.h{font-weight:bold;font-size:12px}.g{font-weight:bold}.tick{fill:#555;font-size:10px}.v{fill:#222;font-size:10px}.grid{stroke:#ddd;stroke-width:1}.limit{stroke:#222;stroke-dasharray:3 2;stroke-width:1.2}.lim{font-size:9px;fill:#222}.foot{fill:#444;font-size:10px}</style>
<rect width="100%" height="100%" fill="#fff"/>
${out.join('\n')}
</svg>
`;
}
