// Firefox end-to-end harness: one reference server + one headless Debian firefox-esr
// (driven through geckodriver's W3C WebDriver API) with a fresh profile per test file.
// As in tests/e2e, the server runs in `--mode test`: "offline" is the server dropping
// connections (a real network failure inside the worker's fetch), and /__control/applied
// is the ground truth of what was applied.
import assert from 'node:assert/strict';
import { existsSync, rmSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { homedir, tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { controlClient, startServer as startReferenceServer, stopServer as stopReferenceServer } from '../e2e/harness.mjs';
import { FIREFOX_PREFS, Session, atProcessEnd, startGeckodriver } from './webdriver.mjs';

export const repoRoot = resolve(dirname(fileURLToPath(import.meta.url)), '../..');

function checkPrerequisites({ serverBin, www, firefox, geckodriver }) {
  const missing = [];
  if (!existsSync(serverBin)) missing.push(`server binary not found at ${serverBin}: run ./build.sh or set SW_OUTBOX_SERVER_BIN`);
  for (const f of ['sw.js', 'pkg/sw_outbox.js', 'pkg/sw_outbox_bg.wasm']) {
    if (!existsSync(join(www, f))) missing.push(`${join(www, f)} is missing: run ./build.sh to build the worker`);
  }
  if (!existsSync(firefox)) missing.push(`${firefox} not found: ./build.sh installs Debian's firefox-esr (or set FIREFOX_BIN)`);
  if (!existsSync(geckodriver)) missing.push(`${geckodriver} not found: ./build.sh installs it (or set GECKODRIVER)`);
  if (missing.length) throw new Error(`Firefox e2e prerequisites missing:\n  - ${missing.join('\n  - ')}`);
}

/** The reference server, started by tests/e2e/harness.mjs's own function; killed too if
 * this process dies before `close()`. */
function startServer(serverBin, www) {
  const server = startReferenceServer(serverBin, www);
  server.baseUrl.catch(() => {});
  server.child.unhook = atProcessEnd(() => server.child.kill('SIGKILL'));
  return server;
}

async function stopServer(child) {
  child.unhook?.();
  await stopReferenceServer(child);
}

/** Polls `fn` until it returns a truthy value; returns it. */
export async function eventually(fn, { timeout = 20000, interval = 100, what = 'condition' } = {}) {
  const end = Date.now() + timeout;
  for (;;) {
    const v = await fn();
    if (v) return v;
    if (Date.now() > end) throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, interval));
  }
}

/**
 * Starts the server, geckodriver and Firefox. Call `close()` in `after`: it ends the
 * session, geckodriver (with Firefox) and the server, and removes the profile, whatever
 * failed before.
 */
export async function startHarness({ www = resolve(repoRoot, process.env.SW_OUTBOX_WWW || 'www') } = {}) {
  const serverBin = resolve(repoRoot, process.env.SW_OUTBOX_SERVER_BIN || 'target/release/sw-outbox-server');
  const firefox = process.env.FIREFOX_BIN || '/usr/bin/firefox-esr';
  const geckodriverBin = process.env.GECKODRIVER || join(homedir(), '.cargo/bin/geckodriver');
  checkPrerequisites({ serverBin, www, firefox, geckodriver: geckodriverBin });

  const browserOutput = [];
  let server; let driver; let session; let profile; let unhookProfile;
  async function close() {
    if (session) await session.delete().catch(() => {});
    if (driver) await driver.stop().catch(() => {});
    if (server) await stopServer(server.child).catch(() => {});
    if (profile) await rm(profile, { recursive: true, force: true }).catch(() => {});
    unhookProfile?.();
    session = driver = server = profile = null;
  }

  let baseUrl;
  try {
    server = startServer(serverBin, www);
    baseUrl = await server.baseUrl;
    profile = await mkdtemp(join(tmpdir(), 'sw-outbox-e2e-firefox-'));
    const dir = profile;
    unhookProfile = atProcessEnd(() => rmSync(dir, { recursive: true, force: true }));
    driver = await startGeckodriver({ bin: geckodriverBin, output: browserOutput });
    session = await Session.create(driver.url, {
      browserName: 'firefox',
      acceptInsecureCerts: false,
      pageLoadStrategy: 'normal',
      'moz:firefoxOptions': {
        binary: firefox,
        args: ['-headless', '-profile', profile],
        prefs: FIREFOX_PREFS,
        log: { level: 'warn' },
      },
    });
    await session.setTimeouts({ script: 90000, pageLoad: 30000, implicit: 0 });
  } catch (err) {
    await close();
    throw err;
  }
  const serverOutput = server.output;

  const control = controlClient(baseUrl);

  const h = {
    baseUrl, session, control, close,
    evaluate: (fn, ...args) => session.evaluate(fn, ...args),
    applied: async () => (await control('applied')).applied,
    requests: async () => (await control('requests')).requests,
    setNetwork: (up) => control('network', { down: !up }),
    reset: () => control('reset', {}),
    /** The page's recorded errors, the browser's and the server's last words. */
    async diagnostics() {
      let page = '(page not readable)';
      try {
        page = (await session.evaluate(() => (window.__errors ?? []).join('\n'))) || '(nothing)';
      } catch { /* the page may be gone */ }
      return `page errors:\n${page}\nbrowser:\n${browserOutput.slice(-60).join('\n') || '(nothing)'}\nserver:\n${serverOutput.slice(-40).join('\n')}`;
    },
  };

  /**
   * Loads the demo (`path`, default /) and waits until the outbox worker controls it and
   * the demo has booted; installs the page-side recorders (errors, reports). A load, not
   * WebDriver's Refresh: in Firefox that reload comes up uncontrolled, as a hard reload.
   */
  h.openDemo = async ({ path = '/', timeout = 20000 } = {}) => {
    await session.navigate(`${baseUrl}${path}`);
    await eventually(() => session.evaluate(() => Boolean(window.demo?.client && navigator.serviceWorker.controller)),
      { timeout, what: 'the demo to be controlled by the outbox worker' });
    await session.evaluate(() => {
      if (window.__recorders) return;
      window.__recorders = true;
      // Classic WebDriver has no console log: keep what the page saw go wrong (the
      // console also reaches Firefox's stdout, shown with the browser's lines).
      window.__errors = [];
      addEventListener('error', (e) => window.__errors.push(`[error] ${e.message} (${e.filename}:${e.lineno})`));
      addEventListener('unhandledrejection', (e) => window.__errors.push(`[unhandledrejection] ${e.reason?.stack ?? e.reason}`));
      for (const level of ['error', 'warn']) {
        const orig = console[level].bind(console);
        console[level] = (...a) => { window.__errors.push(`[${level}] ${a.map(String).join(' ')}`); orig(...a); };
      }
      // Every message the worker sends this page: reports and command answers.
      window.__reports = [];
      window.demo.client.on('*', (m) => { window.__reports.push(JSON.parse(JSON.stringify(m))); });
    });
    await session.evaluate(() => window.demo.ready);
  };

  return h;
}

// ---------- the demo, driven through its page as tests/e2e does ----------

/** Forgets the reports received so far. */
export const clearReports = (h) => h.evaluate(() => { window.__reports.length = 0; });

/** Reports (not command answers) received since the last clearReports. */
export const reports = (h) => h.evaluate(() => window.__reports.filter((m) => m.type !== 'COMMAND_RESULT' && m.type !== 'QUEUE_STATE'));

/** Every message (answers included) received since the last clearReports. */
export const messages = (h) => h.evaluate(() => window.__reports.slice());

/**
 * Waits for a flush summary (MUTATIONS_REPLAYED or MUTATIONS_PARTIAL) since the last
 * clearReports; returns {blocked, summary, all}, `blocked` being the MUTATIONS_BLOCKED
 * just before the summary.
 */
export async function waitForFlushReports(h, { timeout = 30000 } = {}) {
  const isSummary = (m) => m.type === 'MUTATIONS_REPLAYED' || m.type === 'MUTATIONS_PARTIAL';
  const all = await eventually(async () => {
    const rs = await reports(h);
    return rs.some(isSummary) ? rs : null;
  }, { timeout, what: 'a flush report (MUTATIONS_REPLAYED or MUTATIONS_PARTIAL)' });
  const at = all.findIndex(isSummary);
  const blocked = all.slice(0, at).reverse().find((m) => m.type === 'MUTATIONS_BLOCKED');
  return { blocked, summary: all[at], all };
}

/** One API call through the page (`window.demo.api`: CSRF and expected account as the demo sets them). */
export const apiCall = (h, method, path, body) => h.evaluate((m, p, b) => window.demo.api(m, p, b ?? undefined), method, path, body ?? null);

/** A write the worker must queue: asserts the 202 and returns its body and what was sent. */
export async function queuedWrite(h, path, body, method = 'POST') {
  const r = await apiCall(h, method, path, body);
  assert.equal(r.status, 202, `${method} ${path} should have been queued: ${JSON.stringify(r)}`);
  assert.equal(r.body?.queued, true, `${method} ${path}: ${JSON.stringify(r)}`);
  assert.equal(typeof r.body.id, 'number');
  assert.match(r.body.idempotencyKey, /^[A-Za-z0-9_-]{22,64}$/);
  return { ...r.body, key: r.body.idempotencyKey, path, method, body };
}

/** Any command through the page helper; resolves with the worker's answer. */
export const send = (h, message) => h.evaluate((m) => window.demo.client.send(m, { timeoutMs: 20000 }), message);

/** LIST_QUEUE's records. */
export async function listQueue(h) {
  const qs = await h.evaluate(() => window.demo.client.list());
  assert.equal(qs.type, 'QUEUE_STATE', `LIST_QUEUE answered ${JSON.stringify(qs)}`);
  return qs.records;
}

/** FLUSH_QUEUE; asserts it was answered as a COMMAND_RESULT and returns the answer. */
export async function flush(h) {
  const r = await h.evaluate(() => window.demo.client.flush());
  assert.equal(r.type, 'COMMAND_RESULT', JSON.stringify(r));
  assert.equal(r.command, 'FLUSH_QUEUE', JSON.stringify(r));
  return r;
}

/** Signs in through the demo's login form and waits until it has bound the worker and flushed. */
export async function signIn(h, userId) {
  await h.evaluate(async (id) => {
    const $ = (t) => document.querySelector(`[data-testid="${t}"]`);
    if ($('login-form').hidden) throw new Error(`the login form is hidden (signed in as ${window.demo.state.user?.id})`);
    $('login-user').value = id;
    $('login-password').value = id;
    $('login-form').requestSubmit();
  }, userId);
  await eventually(() => h.evaluate((id) => window.demo.state.user?.id === id && window.demo.sessionSynced === true, userId),
    { timeout: 30000, what: `the demo to be signed in as ${userId} and synced with the worker` });
}

/** Signs out through the demo's button; with unsent work it answers "Sign out, keep them here". */
export async function signOut(h) {
  await h.evaluate(() => document.querySelector('[data-testid="sign-out"]').click());
  const seen = await eventually(() => h.evaluate(() => {
    const $ = (t) => document.querySelector(`[data-testid="${t}"]`);
    if (!$('signout-dialog').hidden) return 'dialog';
    if (!$('login-form').hidden) return 'form';
    return null;
  }), { what: 'the sign-out dialog or the login form' });
  if (seen === 'dialog') await h.evaluate(() => document.querySelector('[data-testid="signout-keep"]').click());
  await eventually(() => h.evaluate(() => window.demo.state.user === null && window.demo.sessionSynced === false
    && !document.querySelector('[data-testid="login-form"]').hidden), { what: 'the demo to be signed out' });
}

/**
 * A clean start for one test: the worker's queue and session cleared, the server reset,
 * the demo reloaded, signed out, with an empty queue.
 */
export async function freshStart(h) {
  const controlled = await h.evaluate(() => Boolean(window.demo?.client && navigator.serviceWorker.controller)).catch(() => false);
  if (controlled) {
    const r = await h.evaluate(() => window.demo.client.clearDevice());
    assert.equal(r.ok, true, `CLEAR_DEVICE refused: ${JSON.stringify(r)}`);
  }
  await h.reset();
  await h.openDemo();
  await eventually(() => h.evaluate(() => window.demo.state.user === null
    && !document.querySelector('[data-testid="login-form"]').hidden), { what: 'the signed-out demo' });
  assert.deepEqual(await listQueue(h), [], 'a fresh start has an empty queue');
}

/** The writes in the requests log (auth routes and reads excluded), after a seq. */
export function writesIn(requests, afterSeq = -Infinity) {
  return requests.filter((r) => r.seq > afterSeq && r.method !== 'GET' && !/^\/api\/auth(\/|$)/i.test(r.path));
}

/** The highest seq in the requests log so far (-1 when empty). */
export async function lastSeq(h) {
  const rs = await h.requests();
  return rs.length ? Math.max(...rs.map((r) => r.seq)) : -1;
}

/** Runs a test body, appending the page's, the browser's and the server's last words to a failure. */
export function withDiagnostics(harness, fn) {
  return async (t) => {
    try {
      await fn(t);
    } catch (err) {
      const h = harness();
      if (h && err && typeof err === 'object') err.message += `\n${await h.diagnostics()}`;
      throw err;
    }
  };
}
