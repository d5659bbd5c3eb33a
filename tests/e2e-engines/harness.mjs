// End-to-end harness for every engine: one reference server + one fresh browser of the
// given engine per `describe`. As in tests/e2e, the server runs in `--mode test`:
// "offline" is the server dropping connections (a real network failure inside the
// worker's fetch), and /__control/applied is the ground truth of what was applied.
//
// Its shape follows tests/e2e/harness.mjs (openDemo, stopWorkers, applied, requests,
// setNetwork, reset, diagnostics), with `browser` (engines.mjs) where that one has
// playwright's `context`, so a Chromium-only test ports by changing its imports.
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { controlClient, repoRoot, startServer, stopServer } from '../e2e/harness.mjs';
import { launchEngine } from './engines.mjs';
import { atProcessEnd } from './processes.mjs';

export { repoRoot };

function checkPrerequisites({ serverBin, www, requireWorker }) {
  const missing = [];
  if (!existsSync(serverBin)) missing.push(`server binary not found at ${serverBin}: run ./build.sh or set SW_OUTBOX_SERVER_BIN`);
  for (const f of requireWorker ? ['sw.js', 'pkg/sw_outbox.js', 'pkg/sw_outbox_wasm.js'] : []) {
    if (!existsSync(join(www, f))) missing.push(`${join(www, f)} is missing: run ./build.sh to build the worker`);
  }
  if (missing.length) throw new Error(`e2e prerequisites missing:\n  - ${missing.join('\n  - ')}`);
}

/** Installs, once per page load, what the tests and diagnostics read in the page: the
 * page's errors (classic WebDriver has no console log), every message the worker sends,
 * and when the page's controller changed. */
export async function installRecorders(page) {
  await page.evaluate(() => {
    if (window.__recorders) return;
    window.__recorders = true;
    window.__errors = [];
    addEventListener('error', (e) => window.__errors.push(`[error] ${e.message} (${e.filename}:${e.lineno})`));
    addEventListener('unhandledrejection', (e) => window.__errors.push(`[unhandledrejection] ${e.reason?.stack ?? e.reason}`));
    for (const level of ['error', 'warn']) {
      const orig = console[level].bind(console);
      console[level] = (...a) => { window.__errors.push(`[${level}] ${a.map(String).join(' ')}`); orig(...a); };
    }
    // When the page's controller changed (a new version took over), for diagnostics.
    window.__controllerChanges = [];
    navigator.serviceWorker.addEventListener('controllerchange', () => window.__controllerChanges.push(
      `${new Date().toISOString().slice(11, 23)} ${navigator.serviceWorker.controller?.scriptURL.replace(location.origin, '') ?? 'none'}`));
    window.__reportsInstalled = true;
    window.__reports = [];
    window.demo.client.on('*', (m) => { window.__reports.push(JSON.parse(JSON.stringify(m))); });
  });
}

/**
 * Starts a server and a browser of `engine`. Call `close()` in `after`: it ends the
 * browser (with its driver) and the server, whatever failed before. `www` (default: env
 * SW_OUTBOX_WWW, else <repo>/www) is the folder the server serves; `requireWorker:
 * false` serves one that is not the demo (a site of its own, e.g. the npm package's);
 * `serverArgs`: more flags of the server (e.g. `['--auth', 'bearer']`).
 */
export async function startHarness({
  engine, www = resolve(repoRoot, process.env.SW_OUTBOX_WWW || 'www'), requireWorker = true, serverArgs = [],
}) {
  const serverBin = resolve(repoRoot, process.env.SW_OUTBOX_SERVER_BIN || 'target/release/sw-outbox-server');
  checkPrerequisites({ serverBin, www, requireWorker });

  const server = startServer(serverBin, www, serverArgs);
  server.baseUrl.catch(() => {});
  const unhookServer = atProcessEnd(() => server.child.kill('SIGKILL'));
  let browser;
  const close = async () => {
    await browser?.close().catch(() => {});
    await stopServer(server.child).catch(() => {});
    unhookServer();
    browser = null;
  };
  let baseUrl;
  try {
    baseUrl = await server.baseUrl;
    browser = await launchEngine(engine);
  } catch (err) {
    await close();
    throw err;
  }
  const control = controlClient(baseUrl);

  /** Opens the demo (in the first tab unless `page` is given) and waits until the outbox
   * worker controls it and the demo has booted. A load, not a reload: in Firefox a
   * WebDriver Refresh comes up uncontrolled, as a hard reload does. */
  async function openDemo({ page, timeout = 20000, path = '/' } = {}) {
    page ??= browser.pages()[0] ?? await browser.newPage();
    await page.goto(`${baseUrl}${path}`);
    await page.waitForFunction(() => Boolean(window.demo?.client && navigator.serviceWorker.controller), null, { timeout });
    await installRecorders(page);
    await page.evaluate(() => window.demo.ready);
    return page;
  }

  /** The engine's verb, or an error naming why it has none (the test should have been
   * skipped through `lacks`). */
  const verb = (name) => (...args) => {
    if (typeof browser[name] !== 'function') throw new Error(`${engine} has no ${name}`);
    return browser[name](...args);
  };

  return {
    engine, baseUrl, control, openDemo, close,
    /** The browser now (`restartBrowser` replaces it). */
    get browser() { return browser; },
    /**
     * Ends the browser and starts a new one. Only where a new browser starts with no
     * website data (WebKit's automation keeps it in an ephemeral data manager): there it
     * is a pristine origin, whatever the last one held.
     */
    async restartBrowser() {
      await browser?.close().catch(() => {});
      browser = await launchEngine(engine);
      return browser;
    },
    serverOutput: server.output,
    stopWorkers: verb('stopWorkers'),
    workerStarts: verb('workerStarts'),
    dispatchSync: (tag) => verb('dispatchSync')(baseUrl, tag),
    grantNotifications: () => verb('grantNotifications')(baseUrl),
    /** Lets this origin's pages read the clipboard where the engine asks for a
     * permission (Chromium); elsewhere there is nothing to grant (engines.mjs). */
    grantClipboardRead: async () => { await browser.grantClipboardRead?.(baseUrl); },
    /** Shrinks this origin's storage quota to `size` bytes (no size: restores it). */
    overrideQuota: (size) => verb('overrideQuota')(baseUrl, size),
    setOffline: verb('setOffline'),
    clickNotification: verb('clickNotification'),
    /** An automatic flush trigger with no page involved (FEATURES.backgroundFlush). */
    async fireBackgroundFlush() {
      if (engine === 'chromium') return browser.dispatchSync(baseUrl, 'sw-outbox');
      await verb('setOffline')(true);
      return browser.setOffline(false);
    },
    applied: async () => (await control('applied')).applied,
    requests: async () => (await control('requests')).requests,
    setNetwork: (up) => control('network', { down: !up }),
    reset: () => control('reset', {}),
    /** The pages', the browser's and the server's last words, for a failing test. */
    async diagnostics() {
      const pageErrors = [];
      for (const page of browser?.pages() ?? []) {
        try {
          const errs = await page.evaluate(() => (window.__errors ?? []).join('\n'));
          if (errs) pageErrors.push(errs);
        } catch { /* the page may be gone */ }
      }
      return `page errors:\n${pageErrors.join('\n') || '(nothing)'}\nbrowser:\n${(browser?.logs ?? []).slice(-60).join('\n') || '(nothing)'}\nserver:\n${server.output.slice(-40).join('\n')}`;
    },
  };
}

/** Signs in through the login form, as a user would, and waits for the signed-in view. */
export async function signInThroughUi(page, userId) {
  await page.getByTestId('login-user').fill(userId);
  await page.getByTestId('login-password').fill(userId);
  await page.getByTestId('login-submit').click();
  await page.getByTestId('user-name').filter({ hasText: userId }).waitFor();
}
