// A small W3C WebDriver client for geckodriver, with Node's global fetch. playwright-core
// cannot drive Debian's firefox-esr (it needs Playwright's patched build), so the Firefox
// end-to-end tests speak the standard protocol to geckodriver directly.
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';

/** Preferences for a quiet, test-only profile: service workers on plain http://127.0.0.1,
 * nothing that reaches the network on its own, the page's console on stdout (read back
 * as diagnostics, since classic WebDriver has no console log). */
export const FIREFOX_PREFS = {
  'dom.serviceWorkers.enabled': true,
  'dom.serviceWorkers.testing.enabled': true,
  'browser.shell.checkDefaultBrowser': false,
  'browser.startup.page': 0,
  'browser.aboutwelcome.enabled': false,
  'app.update.enabled': false,
  'app.update.auto': false,
  'datareporting.policy.dataSubmissionEnabled': false,
  'datareporting.healthreport.uploadEnabled': false,
  'toolkit.telemetry.enabled': false,
  'toolkit.telemetry.unified': false,
  'network.proxy.type': 0,
  'network.captive-portal-service.enabled': false,
  'network.connectivity-service.enabled': false,
  'network.dns.disablePrefetch': true,
  'network.prefetch-next': false,
  'browser.safebrowsing.malware.enabled': false,
  'browser.safebrowsing.phishing.enabled': false,
  'browser.safebrowsing.downloads.enabled': false,
  'browser.safebrowsing.blockedURIs.enabled': false,
  'browser.safebrowsing.provider.mozilla.updateURL': '',
  'extensions.update.enabled': false,
  'extensions.getAddons.cache.enabled': false,
  'extensions.blocklist.enabled': false,
  'media.gmp-manager.url': '',
  'browser.newtabpage.enabled': false,
  'browser.topsites.contile.enabled': false,
  'devtools.console.stdout.content': true,
};

// A test process that ends anyway (an uncaught error, Ctrl-C, the runner's SIGTERM) must
// not leave a browser or a server behind: synchronous kills registered here run then.
const endHooks = new Set();
let endHooked = false;
/** Registers `fn` (synchronous) to run when the process ends; returns its remover. */
export function atProcessEnd(fn) {
  if (!endHooked) {
    endHooked = true;
    // Last registered first: the browser is killed before its profile is removed.
    const runAll = () => {
      for (const f of [...endHooks].reverse()) { try { f(); } catch { /* best effort */ } }
      endHooks.clear();
    };
    process.on('exit', runAll);
    for (const [signal, code] of [['SIGINT', 130], ['SIGTERM', 143]]) {
      process.once(signal, () => { runAll(); process.exit(code); });
    }
  }
  endHooks.add(fn);
  return () => endHooks.delete(fn);
}

/** Error of a WebDriver command, with the remote error code and message. */
export class WebDriverError extends Error {
  constructor(command, status, value) {
    super(`WebDriver ${command} → ${status} ${value?.error ?? ''}: ${value?.message ?? JSON.stringify(value)}`);
    this.code = value?.error;
  }
}

/**
 * Starts geckodriver on a free port in its own process group (so Firefox, its child, can
 * be ended with it). Resolves with {url, child, output, stop}.
 */
export async function startGeckodriver({ bin, output = [] }) {
  const note = (line) => { output.push(line); if (output.length > 400) output.shift(); };
  const child = spawn(bin, ['--port', '0', '--websocket-port', '0'], {
    stdio: ['ignore', 'pipe', 'pipe'], detached: true,
  });
  createInterface({ input: child.stderr }).on('line', (l) => note(`[geckodriver] ${l}`));
  const url = await new Promise((resolveUrl, reject) => {
    const timer = setTimeout(() => reject(new Error(`geckodriver printed no "Listening on" line within 15 s:\n${output.join('\n')}`)), 15000);
    createInterface({ input: child.stdout }).on('line', (line) => {
      note(line);
      const m = /Listening on (\S+:\d+)/.exec(line);
      if (m) { clearTimeout(timer); resolveUrl(`http://${m[1].replace(/^https?:\/\//, '')}`); }
    });
    child.on('error', (err) => { clearTimeout(timer); reject(err); });
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`geckodriver exited early (code ${code}, signal ${signal}):\n${output.join('\n')}`));
    });
  });
  const killGroup = (signal) => { try { process.kill(-child.pid, signal); } catch { /* gone */ } };
  const unhook = atProcessEnd(() => killGroup('SIGKILL'));
  async function stop() {
    unhook();
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((r) => child.once('exit', r));
      killGroup('SIGTERM');
      const timer = setTimeout(() => killGroup('SIGKILL'), 5000);
      await exited;
      clearTimeout(timer);
    }
    // Firefox's own processes share the group; make sure none outlives the driver.
    killGroup('SIGKILL');
  }
  return { url, child, output, stop };
}

/** One WebDriver session. */
export class Session {
  constructor(driverUrl, id) {
    this.driverUrl = driverUrl;
    this.id = id;
  }

  static async create(driverUrl, capabilities) {
    const value = await command(driverUrl, 'POST', '/session', { capabilities: { alwaysMatch: capabilities } }, 'new session');
    return new Session(driverUrl, value.sessionId);
  }

  cmd(method, path, body) {
    return command(this.driverUrl, method, `/session/${this.id}${path}`, body, `${method} ${path}`);
  }

  setTimeouts(t) { return this.cmd('POST', '/timeouts', t); }
  navigate(url) { return this.cmd('POST', '/url', { url }); }
  currentUrl() { return this.cmd('GET', '/url'); }

  /**
   * Runs `fn` (a function, or its source) in the page with `args`, awaiting what it
   * returns; resolves with its JSON value. A throw or rejection in the page rejects here
   * with the page's stack.
   */
  async evaluate(fn, ...args) {
    const script = `const done = arguments[arguments.length - 1];
      const args = Array.prototype.slice.call(arguments, 0, -1);
      Promise.resolve().then(() => (${String(fn)})(...args)).then(
        (value) => done({ ok: true, value: value === undefined ? null : value }),
        (e) => done({ ok: false, error: String((e && e.stack) ? (e.message + '\\n' + e.stack) : e) }));`;
    const r = await this.cmd('POST', '/execute/async', { script, args });
    if (!r || typeof r !== 'object' || !('ok' in r)) throw new Error(`page script answered ${JSON.stringify(r)}`);
    if (!r.ok) throw new Error(`in the page: ${r.error}`);
    return r.value;
  }

  delete() {
    return command(this.driverUrl, 'DELETE', `/session/${this.id}`, undefined, 'delete session');
  }
}

async function command(base, method, path, body, what) {
  const res = await fetch(`${base}${path}`, {
    method,
    headers: body === undefined ? {} : { 'Content-Type': 'application/json; charset=utf-8' },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  let json;
  try { json = JSON.parse(text); } catch { throw new Error(`WebDriver ${what} → ${res.status}, not JSON: ${text.slice(0, 500)}`); }
  if (!res.ok) throw new WebDriverError(what, res.status, json.value);
  return json.value;
}
