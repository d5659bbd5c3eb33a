// The reference server for every browser suite (startServer, stopServer, controlClient:
// tests/e2e-engines, tests/interop, tests/e2e/update-handover, bench), Chromium's flags
// (CHROMIUM_ARGS), and a Chromium-only harness (startHarness: one server + one fresh
// headless Chromium profile, playwright-core) for tests/bundler. The server is the real
// binary in `--mode test`, so "offline" is the server dropping connections (a real
// network failure inside the worker's fetch), and /__control/applied is the ground truth
// of what was applied. The end-to-end scenarios run in tests/e2e-engines, in three engines.
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

export const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '../..');

export const CHROMIUM_ARGS = [
  '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--disable-background-networking',
  '--disable-component-update', '--disable-sync', '--no-first-run', '--no-default-browser-check',
  '--disable-quic',
];

/** Fails early, naming the command that fixes it, instead of timing out in the browser. */
function checkPrerequisites({ serverBin, www, requireWorker }) {
  const missing = [];
  if (!existsSync(serverBin)) {
    missing.push(`server binary not found at ${serverBin}: run \`cargo build --release -p sw-outbox-server\` or set SW_OUTBOX_SERVER_BIN`);
  }
  if (requireWorker) {
    for (const f of ['sw.js', 'pkg/sw_outbox.js', 'pkg/sw_outbox_wasm.js']) {
      if (!existsSync(join(www, f))) missing.push(`${join(www, f)} is missing: run ./build.sh to build the worker`);
    }
  }
  if (missing.length) throw new Error(`e2e prerequisites missing:\n  - ${missing.join('\n  - ')}`);
}

/** Starts the server on a free port; resolves with its base URL once it accepts connections.
 * (The three-engine harness, tests/e2e-engines, starts it the same way.) `args`: more
 * flags (e.g. `['--auth', 'bearer']`). */
export function startServer(serverBin, www, args = []) {
  const child = spawn(serverBin, ['--port', '0', '--mode', 'test', '--db', ':memory:', '--www', www, ...args], {
    cwd: repoRoot, stdio: ['ignore', 'pipe', 'pipe'],
  });
  const output = [];
  const note = (line) => { output.push(line); if (output.length > 200) output.shift(); };
  createInterface({ input: child.stderr }).on('line', note);
  const baseUrl = new Promise((resolveUrl, reject) => {
    const timer = setTimeout(() => reject(new Error(`server printed no "listening on" line within 20 s:\n${output.join('\n')}`)), 20000);
    createInterface({ input: child.stdout }).on('line', (line) => {
      note(line);
      const m = /listening on (http:\/\/127\.0\.0\.1:\d+)/.exec(line);
      if (m) { clearTimeout(timer); resolveUrl(m[1]); }
    });
    child.on('error', (err) => { clearTimeout(timer); reject(err); });
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`server exited early (code ${code}, signal ${signal}):\n${output.join('\n')}`));
    });
  });
  return { child, baseUrl, output };
}

/** GET (no body) or POST (JSON body) one /__control/ route of the server at `baseUrl`;
 * returns the parsed JSON. */
export function controlClient(baseUrl) {
  return async function control(path, body) {
    const res = await fetch(`${baseUrl}/__control/${path.replace(/^\/+/, '')}`, body === undefined
      ? { cache: 'no-store' }
      : { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body) });
    const text = await res.text();
    if (!res.ok) throw new Error(`control ${path} answered ${res.status}: ${text}`);
    return text ? JSON.parse(text) : null;
  };
}

export async function stopServer(child) {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise((r) => child.once('exit', r));
  child.kill('SIGTERM');
  const timer = setTimeout(() => child.kill('SIGKILL'), 3000);
  await exited;
  clearTimeout(timer);
}

/**
 * Starts a server and a browser. Call `close()` at the end (in `after`).
 * @param {{requireWorker?: boolean, www?: string}} [options] `requireWorker: false` lets a
 *   test drive the page without the WASM worker (page-only checks); `www` (default: env
 *   SW_OUTBOX_WWW, else <repo>/www) is the directory the server serves.
 */
export async function startHarness({
  requireWorker = true, www = resolve(repoRoot, process.env.SW_OUTBOX_WWW || 'www'),
} = {}) {
  const serverBin = resolve(repoRoot, process.env.SW_OUTBOX_SERVER_BIN || 'target/release/sw-outbox-server');
  checkPrerequisites({ serverBin, www, requireWorker });

  const server = startServer(serverBin, www);
  const baseUrl = await server.baseUrl;
  const profile = await mkdtemp(join(tmpdir(), 'sw-outbox-e2e-'));
  let context;
  try {
    context = await chromium.launchPersistentContext(profile, {
      executablePath: process.env.CHROMIUM_BIN || '/usr/bin/chromium',
      headless: true,
      args: CHROMIUM_ARGS,
    });
  } catch (err) {
    await stopServer(server.child);
    await rm(profile, { recursive: true, force: true });
    throw err;
  }

  /** Everything the browser said that may explain a failure: console errors, page errors. */
  const logs = [];
  context.on('console', (msg) => {
    if (msg.type() === 'error' || msg.type() === 'warning') logs.push(`[${msg.type()}] ${msg.text()} (${msg.location()?.url ?? ''})`);
  });
  context.on('weberror', (e) => logs.push(`[pageerror] ${e.error()?.stack ?? e.error()}`));

  const control = controlClient(baseUrl);

  async function close() {
    await context?.close().catch(() => {});
    await stopServer(server.child);
    await rm(profile, { recursive: true, force: true });
  }

  return {
    baseUrl, context, logs, serverOutput: server.output, control, close,
    applied: async () => (await control('applied')).applied,
    requests: async () => (await control('requests')).requests,
    setNetwork: (up) => control('network', { down: !up }),
    reset: () => control('reset', {}),
    /** The browser's and the server's last words, for a failing test's message. */
    diagnostics: () => `browser:\n${logs.join('\n') || '(nothing)'}\nserver:\n${server.output.slice(-40).join('\n')}`,
  };
}
