// What the benchmark's tools share: the bench server as a child process, JSON over HTTP to
// it, and a CDP session into a service worker.
import { spawn, spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

const BENCH = dirname(fileURLToPath(import.meta.url));

export async function startServer({ fault = null } = {}) {
  const env = { ...process.env, BENCH_FAULT: fault ?? '' };
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

export async function http(url, body) {
  const res = await fetch(url, body === undefined ? {} : { method: 'POST', body: JSON.stringify(body) });
  const text = await res.text();
  if (!res.ok) throw new Error(`${url} answered ${res.status}: ${text}`);
  return JSON.parse(text);
}

// ---------------------------------------------------------------- CDP into a service worker
// Playwright's newCDPSession accepts only pages and frames, so this attaches to the worker
// target from a page's session in the (non-flattened) Target.sendMessageToTarget mode.
export class WorkerCDP {
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


/** Bundles a Workbox worker source the way the benchmark measures it (minified, production). */
export function bundleWorker(src, outFile) {
  const es = spawnSync(join(BENCH, '..', 'node_modules/.bin/esbuild'), [
    src, '--bundle', '--minify', '--format=iife', '--target=es2020',
    '--define:process.env.NODE_ENV="production"', `--outfile=${outFile}`, '--log-level=warning',
  ], { cwd: join(BENCH, '..'), encoding: 'utf8' });
  if (es.status !== 0) throw new Error(`esbuild ${src} failed: ${es.stderr}`);
  return outFile;
}

/** The fixed loop of raw-sw.js's `busy`, as an expression for Runtime.evaluate in a worker. */
export const BUSY_EXPRESSION = '(() => { const t0 = performance.now(); let h = 0x811c9dc5; for (let i = 0; i < 2e7; i++) h = Math.imul(h ^ i, 0x01000193) >>> 0; return performance.now() - t0 + (h & 0); })()';
