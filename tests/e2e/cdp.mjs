// A minimal Chrome DevTools Protocol client over --remote-debugging-pipe, for the tests
// and tools that must choose which service worker has DevTools attached. Playwright
// attaches DevTools to every worker, and Chromium never idle-terminates a worker DevTools
// is attached to; this client attaches to the tabs it opens and to whatever else its
// caller attaches to (Target.attachToTarget), nothing more.
import { spawn } from 'node:child_process';
import { EventEmitter } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CHROMIUM_ARGS } from './harness.mjs';

/**
 * Launches headless Chromium with a fresh profile and a CDP pipe.
 * Returns `{ send(method, params, sessionId), events, openTab(url), watchVersions(tab), close() }`.
 */
export async function launchChromium() {
  const profile = await mkdtemp(join(tmpdir(), 'sw-outbox-cdp-'));
  const child = spawn(process.env.CHROMIUM_BIN || '/usr/bin/chromium', [
    ...CHROMIUM_ARGS, '--headless', '--remote-debugging-pipe', `--user-data-dir=${profile}`, 'about:blank',
  ], { stdio: ['ignore', 'ignore', 'pipe', 'pipe', 'pipe'] });
  const stderr = [];
  child.stderr.on('data', (d) => { stderr.push(String(d)); if (stderr.length > 50) stderr.shift(); });
  const toBrowser = child.stdio[3];
  const fromBrowser = child.stdio[4];
  const events = new EventEmitter();
  const pending = new Map();
  let nextId = 1;
  let buffered = '';
  fromBrowser.on('data', (chunk) => {
    buffered += chunk;
    let end;
    while ((end = buffered.indexOf('\0')) >= 0) {
      const msg = JSON.parse(buffered.slice(0, end));
      buffered = buffered.slice(end + 1);
      if (msg.id !== undefined) {
        const p = pending.get(msg.id);
        pending.delete(msg.id);
        if (!p) continue;
        if (msg.error) p.reject(new Error(`${p.method}: ${msg.error.message}`));
        else p.resolve(msg.result);
      } else {
        events.emit(msg.method, msg.params, msg.sessionId);
      }
    }
  });
  const exited = new Promise((res) => child.once('exit', res));
  exited.then(() => {
    for (const p of pending.values()) p.reject(new Error(`chromium exited: ${stderr.join('').slice(-2000)}`));
    pending.clear();
  });

  function send(method, params = {}, sessionId = undefined) {
    const id = nextId;
    nextId += 1;
    return new Promise((resolve, reject) => {
      pending.set(id, { resolve, reject, method });
      toBrowser.write(`${JSON.stringify({ id, method, params, ...(sessionId ? { sessionId } : {}) })}\0`);
    });
  }

  /** Opens a tab at `url` and attaches to it (flattened session); no auto-attach. */
  async function openTab(url) {
    const { targetId } = await send('Target.createTarget', { url });
    const { sessionId } = await send('Target.attachToTarget', { targetId, flatten: true });
    return {
      targetId,
      sessionId,
      send: (method, params) => send(method, params, sessionId),
      /** Runs `fn(arg)` in the page and returns its (awaited, JSON-able) result. */
      async evaluate(fn, arg) {
        const r = await send('Runtime.evaluate', {
          expression: `(${fn})(${JSON.stringify(arg ?? null)})`, awaitPromise: true, returnByValue: true,
        }, sessionId);
        if (r.exceptionDetails) {
          throw new Error(`page threw: ${r.exceptionDetails.exception?.description ?? r.exceptionDetails.text}`);
        }
        return r.result.value;
      },
      navigate: (to) => send('Page.navigate', { url: to }, sessionId),
      /** Polls `fn(arg)` in the page until it returns a truthy value; returns it. */
      async until(fn, { arg, timeout = 20000, what = String(fn) } = {}) {
        const end = Date.now() + timeout;
        for (;;) {
          const v = await this.evaluate(fn, arg).catch(() => undefined); // a navigating page throws
          if (v) return v;
          if (Date.now() > end) throw new Error(`timed out after ${timeout} ms waiting for ${what}`);
          await new Promise((r) => setTimeout(r, 50));
        }
      },
      /** Signs in to the demo through its form and waits until the worker is bound. */
      async signIn(user) {
        await this.evaluate(async (u) => {
          await window.demo.ready;
          document.querySelector('[data-testid=login-user]').value = u;
          document.querySelector('[data-testid=login-password]').value = u;
          document.querySelector('[data-testid=login-form]').requestSubmit();
        }, user);
        await this.until(() => window.demo.sessionSynced === true, { what: `signed in as ${user}` });
      },
      /** Signs out through the demo's button, keeping unsent work on the device. */
      async signOut() {
        await this.evaluate(() => document.querySelector('[data-testid=sign-out]').click());
        await this.until(() => {
          const keep = document.querySelector('[data-testid=signout-keep]');
          if (keep && keep.offsetParent !== null) keep.click();
          return window.demo.state.user === null && window.demo.sessionSynced === false;
        }, { what: 'signed out' });
      },
    };
  }

  /**
   * Follows the service-worker versions seen from `tab` (CDP ServiceWorker domain):
   * `versions` maps a version id to {url, status, running, registration}, `log` lists
   * every change with its time since `t0`, `idOf(suffix)` is the newest version whose
   * script URL ends with `suffix`.
   */
  async function watchVersions(tab) {
    const versions = new Map();
    const log = [];
    const watch = { versions, log, t0: Date.now() };
    watch.at = () => `${((Date.now() - watch.t0) / 1000).toFixed(1)}s`;
    events.on('ServiceWorker.workerVersionUpdated', (p, sessionId) => {
      if (sessionId !== tab.sessionId) return;
      for (const v of p.versions) {
        const prev = versions.get(v.versionId);
        if (prev && prev.status === v.status && prev.running === v.runningStatus) continue;
        versions.set(v.versionId, { url: v.scriptURL, status: v.status, running: v.runningStatus, registration: v.registrationId });
        log.push(`${watch.at()} ${v.versionId}:${v.status}/${v.runningStatus}`);
      }
    });
    await tab.send('ServiceWorker.enable');
    watch.idOf = (suffix) => [...versions].filter(([, v]) => v.url.endsWith(suffix)).map(([id]) => id).pop();
    return watch;
  }

  async function close() {
    await send('Browser.close').catch(() => {});
    const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
    await exited;
    clearTimeout(timer);
    await rm(profile, { recursive: true, force: true });
  }

  return { send, events, openTab, watchVersions, close, stderr };
}
