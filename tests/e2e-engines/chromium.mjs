// Chromium through playwright-core (Debian's chromium), a fresh persistent profile per
// browser. Its pages are playwright's own; the worker verbs go through CDP.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';
import { CHROMIUM_ARGS } from '../e2e/harness.mjs';
import { killProcessesUsing } from './processes.mjs';

/** `profile`: a profile directory to use (and keep) instead of a fresh one removed at
 * close: a browser started again on it is the same browser after a crash. */
export async function launchChromium({ profile: given } = {}) {
  const profile = given ?? await mkdtemp(join(tmpdir(), 'sw-outbox-e2e-engines-chromium-'));
  let context;
  try {
    context = await chromium.launchPersistentContext(profile, {
      executablePath: process.env.CHROMIUM_BIN || '/usr/bin/chromium',
      headless: true,
      args: CHROMIUM_ARGS,
    });
  } catch (err) {
    if (!given) await rm(profile, { recursive: true, force: true });
    throw err;
  }
  const logs = [];
  context.on('console', (msg) => {
    if (msg.type() === 'error' || msg.type() === 'warning') logs.push(`[${msg.type()}] ${msg.text()} (${msg.location()?.url ?? ''})`);
  });
  context.on('weberror', (e) => logs.push(`[pageerror] ${e.error()?.stack ?? e.error()}`));

  /** The outbox registration as CDP knows it, for the ServiceWorker domain's commands. */
  async function withServiceWorkerDomain(fn) {
    const page = context.pages()[0] ?? await context.newPage();
    const cdp = await context.newCDPSession(page);
    try {
      const registrations = [];
      cdp.on('ServiceWorker.workerRegistrationUpdated', (e) => registrations.push(...e.registrations));
      await cdp.send('ServiceWorker.enable');
      return await fn(cdp, registrations);
    } finally {
      await cdp.detach().catch(() => {});
    }
  }

  let quotaSession = null;

  /** Worker starts seen through CDP since the first call: a version's running status
   * becoming `running` counts once each time. */
  let tracker = null;
  async function workerStarts() {
    if (!tracker) {
      const page = context.pages()[0] ?? await context.newPage();
      const cdp = await context.newCDPSession(page);
      const last = new Map();
      tracker = { starts: 0 };
      cdp.on('ServiceWorker.workerVersionUpdated', (e) => {
        for (const v of e.versions) {
          if (v.runningStatus === 'running' && last.get(v.versionId) !== 'running') tracker.starts += 1;
          last.set(v.versionId, v.runningStatus);
        }
      });
      await cdp.send('ServiceWorker.enable');
    }
    return tracker.starts;
  }

  return {
    name: 'chromium',
    workerStarts,
    context,
    logs,
    pages: () => context.pages(),
    openPages: async () => context.pages(),
    newPage: () => context.newPage(),
    /** Stops every service worker, as the browser does to an idle one (CDP), and waits
     * until CDP has reported each of them stopped (an event may start one again at once). */
    stopWorkers: () => withServiceWorkerDomain(async (cdp) => {
      const running = new Set();
      let stopping = false;
      cdp.on('ServiceWorker.workerVersionUpdated', (e) => {
        for (const v of e.versions) {
          if (v.runningStatus === 'stopped') running.delete(v.versionId);
          else if (!stopping) running.add(v.versionId);
        }
      });
      await new Promise((r) => setTimeout(r, 50)); // the versions' states as enable reports them
      stopping = true;
      await cdp.send('ServiceWorker.stopAllWorkers');
      const end = Date.now() + 10000;
      while (running.size) {
        if (Date.now() > end) throw new Error(`workers not seen stopped: ${[...running].join(', ')}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    }),
    /** Shrinks the storage quota of `origin` to `quotaSize` bytes, or restores it (no
     * size): CDP's Storage.overrideQuotaForOrigin, on a session kept until the restore. */
    async overrideQuota(origin, quotaSize) {
      quotaSession ??= await context.newCDPSession(context.pages()[0] ?? await context.newPage());
      await quotaSession.send('Storage.overrideQuotaForOrigin', quotaSize === undefined ? { origin } : { origin, quotaSize });
      if (quotaSize === undefined) {
        await quotaSession.detach().catch(() => {});
        quotaSession = null;
      }
    },
    /** Fires a Background Sync event at the registration of `origin` (CDP). */
    dispatchSync: (origin, tag) => withServiceWorkerDomain(async (cdp, registrations) => {
      const end = Date.now() + 10000;
      let reg;
      while (!(reg = registrations.find((r) => r.scopeURL.startsWith(origin) && !r.isDeleted))) {
        if (Date.now() > end) throw new Error(`no service worker registration for ${origin}`);
        await new Promise((r) => setTimeout(r, 50));
      }
      await cdp.send('ServiceWorker.dispatchSyncEvent', { origin, registrationId: reg.registrationId, tag, lastChance: false });
    }),
    /**
     * Follows every service-worker version's status through CDP (for diagnostics):
     * `versions` lists each change {at, id, url, status, running}; `stop()` ends it.
     */
    async watchWorkerVersions() {
      const cdp = await context.newCDPSession(context.pages()[0] ?? await context.newPage());
      const t0 = Date.now();
      const versions = [];
      cdp.on('ServiceWorker.workerVersionUpdated', (e) => {
        for (const v of e.versions) versions.push({ at: ((Date.now() - t0) / 1000).toFixed(1), id: v.versionId, url: v.scriptURL, status: v.status, running: v.runningStatus });
      });
      await cdp.send('ServiceWorker.enable');
      return { versions, stop: () => cdp.detach().catch(() => {}) };
    },
    /**
     * Follows Background Sync as the browser records it (CDP's BackgroundService domain,
     * what DevTools' Application panel shows): `events` lists each {at (ms), name, tag}
     * ('Registered sync', 'Dispatched sync event', 'Sync completed', …); `stop()` ends it.
     */
    async watchBackgroundSync() {
      const cdp = await context.newCDPSession(context.pages()[0] ?? await context.newPage());
      const t0 = Date.now();
      const events = [];
      cdp.on('BackgroundService.backgroundServiceEventReceived', ({ backgroundServiceEvent: e }) => {
        events.push({ at: Date.now() - t0, name: e.eventName, tag: e.instanceId, meta: e.eventMetadata });
      });
      await cdp.send('BackgroundService.startObserving', { service: 'backgroundSync' });
      await cdp.send('BackgroundService.setRecording', { shouldRecord: true, service: 'backgroundSync' });
      return {
        events,
        stop: async () => {
          await cdp.send('BackgroundService.setRecording', { shouldRecord: false, service: 'backgroundSync' }).catch(() => {});
          await cdp.detach().catch(() => {});
        },
      };
    },
    grantNotifications: (origin) => context.grantPermissions(['notifications'], { origin }),
    /** Lets pages of `origin` read the clipboard (navigator.clipboard.readText), which
     * headless Chromium otherwise refuses: there is no one to answer its prompt. */
    grantClipboardRead: (origin) => context.grantPermissions(['clipboard-read'], { origin }),
    /** The browser's own network state (offline: every fetch fails, the worker's too). */
    setOffline: (offline) => context.setOffline(offline),
    /** SIGKILLs the browser's processes (the main one and its children), as a phone's
     * system does; the profile stays as the crash left it. */
    kill: () => killProcessesUsing(`--user-data-dir=${profile}`),
    close: async () => {
      await context.close().catch(() => {});
      if (!given) await rm(profile, { recursive: true, force: true });
    },
  };
}
