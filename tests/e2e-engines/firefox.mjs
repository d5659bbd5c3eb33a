// Firefox: Debian's firefox-esr, headless, through geckodriver's W3C WebDriver API
// (selenium-webdriver as the client). playwright-core cannot drive it: it needs
// Playwright's patched build, and its experimental WebDriver BiDi channel fails on this
// ESR (see README, "Browser support").
//
// The worker verbs use Firefox's privileged ("chrome") context, which geckodriver opens
// with --allow-system-access: the service-worker manager stops a worker
// (nsIServiceWorkerInfo.terminateWorker, as about:debugging does), the I/O service
// switches the browser offline and back (the worker's `online` event), and a notification
// is Firefox's own alert window, clicked with a WebDriver pointer action.
import { rmSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { homedir, tmpdir } from 'node:os';
import { join } from 'node:path';
import { Builder, By } from 'selenium-webdriver';
import { atProcessEnd, killProcessesUsing, startDriver } from './processes.mjs';
import { WebDriverTabs } from './webdriver-page.mjs';

/** A quiet test profile: nothing reaches the network on its own, service workers on
 * plain http://127.0.0.1, offline mode that cuts 127.0.0.1 too, notifications in Firefox's own alert window (there is no
 * desktop notification service here), the page's console on stdout. */
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
  'alerts.useSystemBackend': false,
  // Offline mode (setOffline) cuts loopback connections too, as it does every other one:
  // the test server is on 127.0.0.1, which Firefox otherwise still reaches offline.
  'network.disable-localhost-when-offline': true,
  'devtools.console.stdout.content': true,
  // Started again after a SIGKILL (crash.test.mjs): no restore of the crashed session.
  'browser.sessionstore.resume_from_crash': false,
  'toolkit.startup.max_resumed_crashes': -1,
};

/** Privileged scripts: each is the body of an async function of `args`. */
const CHROME = {
  terminateWorkers: `
    const swm = Cc['@mozilla.org/serviceworkers/manager;1'].getService(Ci.nsIServiceWorkerManager);
    const regs = swm.getAllRegistrations();
    let stopped = 0;
    for (let i = 0; i < regs.length; i += 1) {
      const reg = regs.queryElementAt(i, Ci.nsIServiceWorkerRegistrationInfo);
      for (const w of [reg.activeWorker, reg.waitingWorker, reg.installingWorker]) {
        if (w) { w.terminateWorker(); stopped += 1; }
      }
    }
    return stopped;`,
  launchCount: `
    const swm = Cc['@mozilla.org/serviceworkers/manager;1'].getService(Ci.nsIServiceWorkerManager);
    const regs = swm.getAllRegistrations();
    let launches = 0;
    for (let i = 0; i < regs.length; i += 1) {
      const w = regs.queryElementAt(i, Ci.nsIServiceWorkerRegistrationInfo).activeWorker;
      if (w) launches += w.launchCount;
    }
    return launches;`,
  setOffline: `
    Services.io.manageOfflineStatus = false;
    Services.io.offline = args[0];
    return Services.io.offline;`,
  // Every response a service worker synthesized (a navigation's included), as Firefox's
  // network monitor learns them: Navigation Timing's workerStart stays 0 here.
  watchWorkerAnswers: `
    if (!window.__swOutboxAnswers) {
      window.__swOutboxAnswers = [];
      window.__swOutboxAnswersObserver = {
        observe(subject) {
          try { window.__swOutboxAnswers.push(subject.QueryInterface(Ci.nsIChannel).URI.spec); } catch (e) { window.__swOutboxAnswers.push(String(e)); }
        },
      };
      Services.obs.addObserver(window.__swOutboxAnswersObserver, 'service-worker-synthesized-response');
    }
    return window.__swOutboxAnswers.length;`,
  workerAnswersSince: `
    return (window.__swOutboxAnswers || []).slice(args[0]);`,
  grantNotifications: `
    const principal = Services.scriptSecurityManager.createContentPrincipalFromOrigin(args[0]);
    Services.perms.addFromPrincipal(principal, 'desktop-notification', Services.perms.ALLOW_ACTION);
    return Services.perms.testPermissionFromPrincipal(principal, 'desktop-notification');`,
};

/** `profile`: a profile directory to use (and keep) instead of a fresh one removed at
 * close: a browser started again on it is the same browser after a crash. */
export async function launchFirefox({ profile: given } = {}) {
  const firefox = process.env.FIREFOX_BIN || '/usr/bin/firefox-esr';
  const geckodriver = process.env.GECKODRIVER || join(homedir(), '.cargo/bin/geckodriver');
  const profile = given ?? await mkdtemp(join(tmpdir(), 'sw-outbox-e2e-engines-firefox-'));
  const unhookProfile = given ? () => {} : atProcessEnd(() => rmSync(profile, { recursive: true, force: true }));
  let server;
  let driver;
  const close = async () => {
    if (driver) await driver.quit().catch(() => {});
    if (server) await server.stop().catch(() => {});
    if (!given) await rm(profile, { recursive: true, force: true }).catch(() => {});
    unhookProfile();
    driver = server = null;
  };
  try {
    server = await startDriver({
      name: 'geckodriver',
      bin: geckodriver,
      args: ['--port', '0', '--websocket-port', '0', '--allow-system-access'],
      listenLine: /Listening on (\S+:\d+)/,
    });
    driver = await new Builder().disableEnvironmentOverrides().usingServer(server.url).withCapabilities({
      browserName: 'firefox',
      pageLoadStrategy: 'normal',
      'moz:firefoxOptions': {
        binary: firefox,
        args: ['-headless', '-profile', profile],
        prefs: FIREFOX_PREFS,
        log: { level: 'warn' },
      },
    }).build();
    await driver.manage().setTimeouts({ script: 90000, pageLoad: 30000, implicit: 0 });
  } catch (err) {
    await close();
    throw err;
  }

  let chrome = null; // set below: it needs the tabs' lock
  const tabs = await new WebDriverTabs(driver, {
    workerAnswers: {
      mark: () => chrome(CHROME.watchWorkerAnswers),
      since: (token) => chrome(CHROME.workerAnswersSince, token),
    },
  }).init();
  const { lock } = tabs;

  /** Runs a privileged script (one of CHROME) in the browser's parent process. */
  chrome = (body, ...args) => lock.run(null, async (d) => {
    await d.setContext('chrome');
    try {
      return await d.executeAsyncScript(`const done = arguments[arguments.length - 1];
        const args = Array.prototype.slice.call(arguments, 0, -1);
        (async () => { ${body} })().then((v) => done({ ok: true, v }), (e) => done({ ok: false, e: String(e) }));`, ...args);
    } finally {
      await d.setContext('content');
    }
  }).then((r) => {
    if (!r?.ok) throw new Error(`privileged script failed: ${r?.e ?? JSON.stringify(r)}`);
    return r.v;
  });

  return {
    name: 'firefox',
    driver,
    logs: server.output,
    pages: () => tabs.pages(),
    openPages: () => tabs.openPages(),
    newPage: () => tabs.newPage(),
    /** SIGKILLs Firefox's processes (the parent and its content processes), as a
     * phone's system does; the profile stays as the crash left it. */
    kill: () => killProcessesUsing(profile),
    /** Stops every service worker through Firefox's service-worker manager. */
    stopWorkers: () => chrome(CHROME.terminateWorkers),
    /** How often the active workers were launched (Firefox's own count). */
    workerStarts: () => chrome(CHROME.launchCount),
    grantNotifications: (origin) => chrome(CHROME.grantNotifications, origin),
    /** Firefox's offline mode: every fetch fails; going back online fires `online` in
     * the worker as in the page. */
    setOffline: (offline) => chrome(CHROME.setOffline, offline),
    /**
     * Clicks the notification Firefox shows (its alert window, in the privileged
     * context) with a WebDriver pointer action, as a person would: Firefox then
     * dispatches `notificationclick` to the worker. Resolves with the clicked
     * notification's {title, body}, or null when no notification is shown.
     */
    clickNotification: () => lock.run(null, async (d) => {
      const back = lock.current;
      await d.setContext('chrome');
      try {
        for (const handle of await d.getAllWindowHandles()) {
          await d.switchTo().window(handle);
          if (!String(await d.executeScript('return document.documentURI')).includes('/alerts/alert.xhtml')) continue;
          const shown = await d.executeScript(`const text = (id) => {
              const el = document.getElementById(id);
              return el ? (el.getAttribute('value') || el.textContent || '') : null;
            };
            return { title: text('alertTitleLabel'), body: text('alertTextLabel') };`);
          const box = await d.findElement(By.id('alertBox'));
          await d.actions().move({ origin: box }).click().perform();
          return shown;
        }
        return null;
      } finally {
        await d.setContext('content');
        if (back && tabs.byHandle.has(back)) await d.switchTo().window(back);
        lock.current = back && tabs.byHandle.has(back) ? back : null;
      }
    }),
    close,
  };
}
