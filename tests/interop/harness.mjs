// Interop harness: the Express + express-idempotency app of server.mjs (a server this
// project did not write the idempotency of) and, for browser tests, one fresh headless
// Chromium profile per test file. "Offline" is the server dropping connections (a real
// network failure in the worker's fetch); /__control/applied is the ground truth.
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { chromium } from 'playwright-core';
import { CHROMIUM_ARGS, controlClient, repoRoot, stopServer } from '../e2e/harness.mjs';

const SERVER = resolve(repoRoot, 'tests/interop/server.mjs');

/** Fails early, naming the command that fixes it, instead of timing out in the browser. */
function checkWorkerBuilt(www) {
  const missing = ['sw.js', 'outbox-client.js', 'pkg/sw_outbox.js', 'pkg/sw_outbox_wasm.js']
    .filter((f) => !existsSync(join(www, f)));
  if (missing.length) {
    throw new Error(`interop prerequisites missing in ${www}: ${missing.join(', ')}: run ./build.sh to build the worker`);
  }
  if (!existsSync(resolve(repoRoot, 'node_modules/express-idempotency'))) {
    throw new Error('node_modules/express-idempotency is missing: run npm ci (./build.sh does)');
  }
}

/**
 * Starts server.mjs on a free port, as deployed (NODE_ENV=production: Express's error
 * pages carry no stack trace). Resolves with its base URL and a control client.
 */
export async function startInteropServer({
  www = resolve(repoRoot, process.env.SW_OUTBOX_WWW || 'www'),
  // Another app of this folder (nest-server.mjs, core-server.mjs), and its arguments.
  script = SERVER,
  args = ['--www', www],
} = {}) {
  const child = spawn(process.execPath, [script, '--port', '0', ...args], {
    cwd: repoRoot, stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, NODE_ENV: 'production' },
  });
  const output = [];
  const note = (line) => { output.push(line); if (output.length > 200) output.shift(); };
  createInterface({ input: child.stderr }).on('line', note);
  const baseUrl = await new Promise((resolveUrl, reject) => {
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
  const control = controlClient(baseUrl);
  return {
    baseUrl,
    output,
    control,
    stop: () => stopServer(child),
    applied: async () => (await control('applied')).applied,
    requests: async () => (await control('requests')).requests,
    running: async () => (await control('running')).running,
    setNetwork: (up) => control('network', { down: !up }),
    /** Arms a one-shot fault for the write handler's next real run. */
    fault: (kind, ms) => control('fault', ms === undefined ? { kind } : { kind, ms }),
    release: () => control('release', {}),
    /** `session` or `device` CSRF tokens (server.mjs). */
    csrfMode: (mode) => control('csrf', { mode }),
    /** Every task write waits `ms` before it is applied: in the route (`at: 'route'`,
     * the default) or on arrival, before the middleware (`'arrival'`). */
    hold: (ms, at = 'route') => control('hold', { ms, at }),
    reset: () => control('reset', {}),
  };
}

/**
 * Starts the server (server.mjs, or the app `script` names) and a browser with a fresh
 * profile. Call `close()` in `after`.
 */
export async function startInteropHarness({ script } = {}) {
  const www = resolve(repoRoot, process.env.SW_OUTBOX_WWW || 'www');
  checkWorkerBuilt(www);
  const server = await startInteropServer({ www, script });
  const profile = await mkdtemp(join(tmpdir(), 'sw-outbox-interop-'));
  let context;
  try {
    context = await chromium.launchPersistentContext(profile, {
      executablePath: process.env.CHROMIUM_BIN || '/usr/bin/chromium',
      headless: true,
      args: CHROMIUM_ARGS,
    });
  } catch (err) {
    await server.stop();
    await rm(profile, { recursive: true, force: true });
    throw err;
  }

  const logs = [];
  context.on('console', (msg) => {
    if (msg.type() === 'error' || msg.type() === 'warning') logs.push(`[${msg.type()}] ${msg.text()} (${msg.location()?.url ?? ''})`);
  });
  context.on('weberror', (e) => logs.push(`[pageerror] ${e.error()?.stack ?? e.error()}`));

  /** Opens the test page and waits until the outbox worker controls it. */
  async function openPage(page) {
    page ??= context.pages()[0] ?? await context.newPage();
    await page.goto(`${server.baseUrl}/`);
    await page.waitForFunction(
      () => window.interop && (window.interop.startError
        || (window.interop.client && navigator.serviceWorker.controller)),
      null, { timeout: 30000 },
    );
    const startError = await page.evaluate(() => window.interop.startError ?? null);
    if (startError) throw new Error(`the test page could not start the outbox: ${startError}`);
    return page;
  }

  async function close() {
    await context?.close().catch(() => {});
    await server.stop();
    await rm(profile, { recursive: true, force: true });
  }

  return {
    ...server,
    context,
    logs,
    openPage,
    close,
    /** The browser's and the server's last words, for a failing test's message. */
    diagnostics: () => `browser:\n${logs.join('\n') || '(nothing)'}\nserver:\n${server.output.slice(-40).join('\n')}`,
  };
}
