// The three engines behind one small driver interface, so a scenario is written once.
//
// A browser (what launchEngine resolves with) has:
//   name                       'chromium' | 'firefox' | 'webkit'
//   pages(), newPage()         tabs; a page has playwright's Page verbs the tests use:
//                              goto, evaluate(fn, arg), waitForFunction(fn, arg, {timeout}),
//                              getByTestId(id).click/fill/isVisible/waitFor/filter, close
//                              (in Chromium it is playwright's own Page)
//   logs                       the browser's or its driver's last words, for diagnostics
//   close()
// and, where the engine has a way (FEATURES says which and why not):
//   stopWorkers()              stop every service worker, as the browser does to an idle one
//                              (resolves once they are stopped)
//   workerStarts()             how many times a service worker was started (so far)
//   dispatchSync(origin, tag)  fire a Background Sync event at the origin's registration
//   watchBackgroundSync()      the browser's own record of sync registrations and events
//   setOffline(offline)        the browser's own network state (the worker's fetches fail;
//                              back online, the worker gets `online` where it fires one)
//   overrideQuota(origin, size) shrink the origin's storage quota (no size: restore it)
//   grantNotifications(origin)
//   grantClipboardRead(origin)  let the origin's pages read the clipboard (Chromium asks for a
//                              permission; Firefox and WebKit let a page read what its own
//                              origin wrote, WebKit in a click only, so they have no verb)
//   openPages()                every tab, those the browser opened itself included (async)
//   clickNotification()        click the notification the browser shows, as a person would
//   kill()                     SIGKILL the browser's processes (a launch given the same
//                              `profile` starts it again on what the crash left)
// and, in the harness, fireBackgroundFlush(): an automatic flush trigger with no page
// involved (Chromium: a sync event through CDP; Firefox: the worker's online event, the
// browser switched offline and back).
import { launchChromium } from './chromium.mjs';
import { launchFirefox } from './firefox.mjs';
import { launchWebKit } from './webkit.mjs';

export const ENGINES = ['chromium', 'firefox', 'webkit'];

const NO_SYNC = 'has no Background Sync (registration.sync is absent)';
const NO_QUOTA = 'its automation has no command that shrinks an origin\'s storage quota (CDP\'s Storage.overrideQuotaForOrigin is Chromium\'s), so a storage failure cannot be caused from a test';

/**
 * What each engine's automation can do, or why it cannot: `true`, or the reason a test
 * needing it is skipped (printed as the skip's reason, and listed in the README).
 * `updateMidRun` is the browser's own: whether a new worker version can take over while
 * the page and the old worker are busy without wedging IndexedDB or losing requests.
 */
export const FEATURES = {
  chromium: {
    stopWorkers: true,
    dispatchSync: true,
    watchBackgroundSync: true,
    backgroundSync: true,
    setOffline: true,
    overrideQuota: true,
    grantNotifications: true,
    backgroundFlush: true,
    clickNotification: 'headless Chromium shows no notification UI, and neither CDP nor playwright has a command that clicks one',
    noBackgroundSync: 'Chromium has Background Sync: its own sync retries may drain the queue first, so the no-sync fallbacks are tested where sync is absent',
    updateMidRun: true,
    restartOnProfile: true,
  },
  firefox: {
    stopWorkers: true,
    dispatchSync: `Firefox ${NO_SYNC}`,
    watchBackgroundSync: `Firefox ${NO_SYNC}`,
    backgroundSync: `Firefox ${NO_SYNC}`,
    setOffline: true,
    overrideQuota: NO_QUOTA,
    grantNotifications: true,
    backgroundFlush: true,
    clickNotification: true,
    noBackgroundSync: true,
    updateMidRun: true,
    restartOnProfile: true,
  },
  webkit: {
    stopWorkers: 'WebKitWebDriver has no command that stops a service worker (nor does MiniBrowser\'s automation)',
    dispatchSync: `WebKit ${NO_SYNC}`,
    watchBackgroundSync: `WebKit ${NO_SYNC}`,
    backgroundSync: `WebKit ${NO_SYNC}`,
    overrideQuota: NO_QUOTA,
    setOffline: 'WebKitWebDriver has no network emulation or offline switch, so a test cannot make the browser itself go offline and back',
    grantNotifications: 'WebKitWebDriver has no permission command, and MiniBrowser answers Notification.requestPermission() with "denied" (showNotification then throws)',
    backgroundFlush: 'no automatic flush can be caused from a test: no sync event (no Background Sync) and no worker online event (no offline switch)',
    clickNotification: 'MiniBrowser shows no notification here (permission denied, see grantNotifications), and WebKitWebDriver has no command that clicks one',
    noBackgroundSync: true,
    restartOnProfile: 'WebKitWebDriver runs MiniBrowser in automation mode, whose website data (service worker registrations, IndexedDB, cookies) lives in an ephemeral data manager: a browser started again has none of it, so there is no profile to restart on after a kill',
    updateMidRun: 'an update that stops the old worker while it starts IndexedDB transactions leaves one of them unfinished in WebKit, and the new version\'s read-write transactions on that store then wait, minutes and more (browser-update.test.mjs); WebKit also drops a fetch or message on its way to the old worker at that moment',
  },
};

/** The engines this run covers: E2E_ENGINES=chromium,webkit, or all three. */
export function selectedEngines() {
  const wanted = (process.env.E2E_ENGINES || ENGINES.join(',')).split(',').map((s) => s.trim()).filter(Boolean);
  const unknown = wanted.filter((e) => !ENGINES.includes(e));
  if (unknown.length) throw new Error(`E2E_ENGINES: unknown engine(s) ${unknown.join(', ')} (known: ${ENGINES.join(', ')})`);
  return wanted;
}

/**
 * For node:test's `skip` option: false when `engine` has every feature named, else the
 * reason it has not (so the skip is listed with it).
 */
export function lacks(engine, ...features) {
  for (const f of features) {
    const v = FEATURES[engine]?.[f];
    if (v === undefined) throw new Error(`unknown feature ${f}`);
    if (v !== true) return `${engine}: ${v}`;
  }
  return false;
}

export function launchEngine(name) {
  switch (name) {
    case 'chromium': return launchChromium();
    case 'firefox': return launchFirefox();
    case 'webkit': return launchWebKit();
    default: throw new Error(`unknown engine ${name}`);
  }
}
