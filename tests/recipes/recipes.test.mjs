// The package README's recipes, each built as its libraries' docs say and run end to end
// in every engine that can: the outbox beside workbox-precaching + workbox-routing in one
// worker (bundled with esbuild, manifest injected by workbox-build); beside Serwist
// (esbuild, @serwist/build); with vite-plugin-pwa (`injectManifest`, `registerType:
// 'prompt'`, next to `sw-outbox/vite`); and a plain static site (the outbox alone, its own
// shell). Each app is built twice (a first deploy and a second one that changes the app)
// from the packed package (`npm pack ./package`) and the repository's pinned copies of the
// libraries (package.json devDependencies, installed by `npm ci`; linked, not fetched).
//
// Each recipe, in each engine, served by the reference server behind the site host
// (tests/e2e-engines/site-host.mjs, which can drop every connection):
// 1. the page is controlled; the other library precached the app, the outbox nothing but
//    its own files;
// 2. a cold start offline: the worker stopped (Chromium, Firefox; WebKit's automation
//    cannot stop one, so there the worker is whatever the browser kept), every connection
//    dropped, a deep link launches the app from the other library's precache;
// 3. an API write made then is queued by the outbox (202) and, once the site is back,
//    replayed once with its key under the account that made it;
// 4. the second deploy's worker installs and waits for the prompt (`skipWaiting: false`;
//    still waiting seconds later), then takes over when the page asks, and the page runs
//    the second deploy.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { cp, mkdir, mkdtemp, readdir, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { promisify } from 'node:util';
import { after, before, test } from 'node:test';
import { build as esbuild } from 'esbuild';
import { lacks } from '../e2e-engines/engines.mjs';
import { repoRoot } from '../e2e-engines/harness.mjs';
import { eventually, forEachEngine, withDiagnostics } from '../e2e-engines/outbox-helpers.mjs';
import { startSiteHost } from '../e2e-engines/site-host.mjs';

const run = promisify(execFile);
const npmEnv = { ...process.env, npm_config_update_notifier: 'false', npm_config_fund: 'false', npm_config_audit: 'false' };

/** The libraries the recipes use, linked from the repository's node_modules. */
const LIBRARIES = ['vite', 'vite-plugin-pwa', 'workbox-precaching', 'workbox-routing', 'workbox-build', 'workbox-window', 'serwist', '@serwist/build'];

let dir; // everything built here
let tarball; // the packed package

const INDEX_HTML = (entry, css = '<link rel="stylesheet" href="/app.css">') => `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>a recipe app</title>
${css}<script type="module" src="${entry}"></script></head>
<body><h1 data-testid="version">loading</h1></body></html>
`;

const APP_CSS = 'h1 { color: teal; }\n';

/**
 * The app's page code for a deploy: what the tests read is on window.app. `helper` is
 * the page helper's import specifier; `prompt` the recipe's update prompt.
 */
const appJs = (deploy, { helper, header = '', prompt }) => `${header}import { registerOutbox } from '${helper}';
const app = window.app = { deploy: ${JSON.stringify(deploy)}, waitingSeen: 0 };
document.querySelector('h1').textContent = app.deploy;
app.json = async (method, path, body, headers = {}) => {
  const r = await fetch(path, {
    method, headers: { 'Content-Type': 'application/json', ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: r.status, body: await r.json().catch(() => null) };
};
app.ready = registerOutbox({ scriptUrl: '/sw.js' }).then((client) => {
  app.client = client;
  return client.controlled;
});
${prompt}
`;

/** The update prompt through the page helper (the Workbox, Serwist and static recipes). */
const HELPER_PROMPT = `app.ready.then(() => {
  app.client.onUpdateWaiting(() => { app.waitingSeen += 1; });
  app.client.onControlling(({ isUpdate }) => { if (isUpdate) location.reload(); });
});
app.prompt = () => app.client.applyUpdate();`;

/** The outbox's lines of a worker script that also runs another library. */
const OUTBOX_LINES = `// The outbox first, for the API only (precache: []): its listeners come before the
// library's, and it calls respondWith for nothing else. A new version waits for the
// page's prompt.
self.SW_OUTBOX_CONFIG = { precache: [], skipWaiting: false };
self.SW_OUTBOX_BASE = '/sw-outbox/';`;

const WORKBOX_SW = `${OUTBOX_LINES}
importScripts('/sw-outbox/sw.js');

import { cleanupOutdatedCaches, createHandlerBoundToURL, precacheAndRoute } from 'workbox-precaching';
import { NavigationRoute, registerRoute } from 'workbox-routing';

precacheAndRoute(self.__WB_MANIFEST);
cleanupOutdatedCaches();
// Deep links get the app shell; the API is the outbox's.
registerRoute(new NavigationRoute(createHandlerBoundToURL('/index.html'), { denylist: [/^\\/api\\//] }));
`;

const SERWIST_SW = `import { Serwist } from 'serwist';

${OUTBOX_LINES}

const serwist = new Serwist({
  importScripts: ['/sw-outbox/sw.js'], // run at once, before Serwist adds its listeners
  precacheEntries: self.__SW_MANIFEST,
  precacheOptions: { navigateFallback: '/index.html', navigateFallbackDenylist: [/^\\/api\\//] },
  skipWaiting: false,
  clientsClaim: false,
});
serwist.addEventListeners();
`;

// vite-plugin-pwa's injectManifest source: the outbox's worker script written by
// sw-outbox/vite (sw-outbox-setup.js), then Workbox as vite-plugin-pwa's docs show it for
// registerType 'prompt' (the SKIP_WAITING listener is theirs; the outbox answers it too).
const VITE_PWA_SW = `importScripts('./sw-outbox-setup.js');

import { cleanupOutdatedCaches, createHandlerBoundToURL, precacheAndRoute } from 'workbox-precaching';
import { NavigationRoute, registerRoute } from 'workbox-routing';

precacheAndRoute(self.__WB_MANIFEST);
cleanupOutdatedCaches();
registerRoute(new NavigationRoute(createHandlerBoundToURL('index.html'), { denylist: [/^\\/api\\//] }));

self.addEventListener('message', (event) => {
  if (event.data && event.data.type === 'SKIP_WAITING') self.skipWaiting();
});
`;

const VITE_CONFIG = `import { VitePWA } from 'vite-plugin-pwa';
import swOutbox from 'sw-outbox/vite';

export default {
  plugins: [
    // The outbox's worker script under its own name, for the API only.
    swOutbox({ swFileName: 'sw-outbox-setup.js', precache: [], config: { skipWaiting: false } }),
    VitePWA({
      strategies: 'injectManifest',
      srcDir: 'src',
      filename: 'sw.js',
      registerType: 'prompt',
      injectRegister: false,
      manifest: false,
      // A classic worker, so that it can importScripts the outbox.
      injectManifest: { rollupFormat: 'iife', globIgnores: ['sw-outbox/**', 'sw-outbox-setup.js'] },
    }),
  ],
};
`;

/** vite-plugin-pwa's own registration and prompt, beside the page helper. */
const VITE_PWA_PROMPT = `import { registerSW } from 'virtual:pwa-register';
`;
const VITE_PWA_PROMPT_BODY = `const updateSW = registerSW({ immediate: true, onNeedRefresh() { app.waitingSeen += 1; } });
app.prompt = () => updateSW(true); // vite-plugin-pwa reloads the page once the new version controls it`;

const STATIC_SW = (deploy) => `// The site's worker script: the outbox with its own app shell.
self.SW_OUTBOX_CONFIG = {
  precache: ['/', '/app.js', '/app.css', '/sw-outbox/outbox-client.js'],
  skipWaiting: false,
};
self.SW_OUTBOX_SHELL_BUILD = ${JSON.stringify(deploy.replace(/\W+/g, "-"))};
self.SW_OUTBOX_BASE = '/sw-outbox/';
importScripts('/sw-outbox/sw.js');
`;

/** A fresh app folder with the packed package and the linked libraries installed. */
async function newApp(name) {
  const app = join(dir, name);
  const modules = join(app, 'node_modules');
  await mkdir(join(modules, 'sw-outbox'), { recursive: true });
  await mkdir(join(modules, '@serwist'), { recursive: true });
  await run('tar', ['-xzf', tarball, '-C', join(modules, 'sw-outbox'), '--strip-components=1']);
  for (const lib of LIBRARIES) await symlink(join(repoRoot, 'node_modules', lib), join(modules, lib), 'dir');
  await writeFile(join(app, 'package.json'), JSON.stringify({ name: `recipe-${name}`, private: true, type: 'module' }));
  return app;
}

/** The outbox's files into `out/sw-outbox/`, as the package README's step 1 copies them. */
async function copyOutbox(app, out) {
  const pkg = join(app, 'node_modules/sw-outbox');
  for (const f of ['sw.js', 'pkg', 'outbox-client.js']) await cp(join(pkg, f), join(out, 'sw-outbox', f), { recursive: true });
}

/** A classic worker bundle of `src` (esbuild, as the libraries' docs allow any bundler). */
async function bundleWorker(app, src, outfile) {
  await writeFile(join(app, 'sw-src.js'), src);
  await esbuild({
    entryPoints: [join(app, 'sw-src.js')], bundle: true, format: 'iife', minify: true, outfile,
    define: { 'process.env.NODE_ENV': '"production"' }, logLevel: 'warning', absWorkingDir: app,
  });
}

/** The static files of a deploy of a non-Vite app into `out`. */
async function staticFiles(app, out, deploy, { header = '', prompt = HELPER_PROMPT } = {}) {
  await mkdir(out, { recursive: true });
  await writeFile(join(out, 'index.html'), INDEX_HTML('/app.js'));
  await writeFile(join(out, 'app.css'), APP_CSS);
  await writeFile(join(out, 'app.js'), appJs(deploy, { helper: '/sw-outbox/outbox-client.js', header, prompt }));
  await copyOutbox(app, out);
}

/** What the library precaches: the app's files, the page helper included (the page
 * imports it), the worker's own files not (the browser keeps them, and the outbox
 * caches its module itself). */
const GLOB = { globPatterns: ['**/*.{html,js,css}'], globIgnores: ['sw.js', 'sw-outbox/sw.js', 'sw-outbox/pkg/**'] };

/** Each recipe: how its deploys are built, and the cache its library precaches into. */
const RECIPES = {
  workbox: {
    title: 'beside workbox-precaching and workbox-routing',
    precacheCache: /^workbox-precache/,
    async build(app, out, deploy) {
      await staticFiles(app, out, deploy);
      const bundled = join(app, 'sw.bundle.js');
      await bundleWorker(app, WORKBOX_SW, bundled);
      const wb = await import(pathToFileURL(join(app, 'node_modules/workbox-build/build/index.js')).href);
      const { count } = await (wb.injectManifest ?? wb.default.injectManifest)({ swSrc: bundled, swDest: join(out, 'sw.js'), globDirectory: out, ...GLOB });
      assert.ok(count >= 3, `workbox-build precached ${count} files`);
    },
  },
  serwist: {
    title: 'beside Serwist',
    precacheCache: /^serwist-precache/,
    async build(app, out, deploy) {
      await staticFiles(app, out, deploy);
      const bundled = join(app, 'sw.bundle.js');
      await bundleWorker(app, SERWIST_SW, bundled);
      const { injectManifest } = await import(pathToFileURL(join(app, 'node_modules/@serwist/build/dist/index.mjs')).href);
      const { count } = await injectManifest({ swSrc: bundled, swDest: join(out, 'sw.js'), globDirectory: out, ...GLOB });
      assert.ok(count >= 3, `@serwist/build precached ${count} files`);
    },
  },
  'vite-plugin-pwa': {
    title: 'with vite-plugin-pwa (injectManifest, registerType prompt)',
    precacheCache: /^workbox-precache/,
    async build(app, out, deploy) {
      await mkdir(join(app, 'src'), { recursive: true });
      await writeFile(join(app, 'index.html'), INDEX_HTML('/src/app.js', ''));
      await writeFile(join(app, 'src/app.css'), APP_CSS);
      await writeFile(join(app, 'src/app.js'), appJs(deploy, {
        helper: 'sw-outbox', header: `${VITE_PWA_PROMPT}import './app.css';\n`, prompt: VITE_PWA_PROMPT_BODY,
      }));
      await writeFile(join(app, 'src/sw.js'), VITE_PWA_SW);
      await writeFile(join(app, 'vite.config.js'), VITE_CONFIG);
      await run(process.execPath, [join(app, 'node_modules/vite/bin/vite.js'), 'build', '--logLevel', 'warn', '--outDir', out, '--emptyOutDir'], { cwd: app, env: npmEnv });
    },
  },
  static: {
    title: 'a plain static site (the outbox alone, with its shell)',
    precacheCache: /^sw-outbox-/,
    async build(app, out, deploy) {
      await staticFiles(app, out, deploy);
      await writeFile(join(out, 'sw.js'), STATIC_SW(deploy));
    },
  },
};

before(async () => {
  dir = await mkdtemp(join(tmpdir(), 'sw-outbox-recipes-'));
  const { stdout } = await run('npm', ['pack', './package', '--json', '--pack-destination', dir], { cwd: repoRoot, env: npmEnv });
  tarball = join(dir, JSON.parse(stdout)[0].filename);
  for (const [name, recipe] of Object.entries(RECIPES)) {
    const app = await newApp(name);
    for (const deploy of ['first deploy', 'second deploy']) {
      await recipe.build(app, join(dir, `${name}-${deploy.split(' ')[0]}`), deploy);
    }
  }
});

after(async () => {
  // RECIPES_KEEP=1 keeps the built apps to look at (the folder is printed).
  if (process.env.RECIPES_KEEP) console.log(`recipes: built apps kept in ${dir}`);
  else if (dir) await rm(dir, { recursive: true, force: true });
});

/** Replaces the served folder's files with `from`'s (a deploy). */
async function deploy(from, to) {
  for (const entry of await readdir(to)) await rm(join(to, entry), { recursive: true, force: true });
  await cp(from, to, { recursive: true });
}

/** Every cache of the page's origin with the paths it holds. */
const cacheContents = (page) => page.evaluate(async () => {
  const out = {};
  for (const name of await caches.keys()) {
    out[name] = (await (await caches.open(name)).keys()).map((r) => new URL(r.url).pathname).sort();
  }
  return out;
});

/** Loads `path` and waits until the app's page code ran (not for the worker). */
async function load(page, url) {
  const answer = await page.goto(url);
  await page.waitForFunction(() => Boolean(window.app?.client));
  return answer;
}

const served = new Map(); // engine → recipe → the folder the reference server serves

for (const [name, recipe] of Object.entries(RECIPES)) {
  forEachEngine((engine, harness) => {
    let host;
    before(async () => { host = await startSiteHost(harness().baseUrl); });
    after(async () => { await host?.close(); });

    test(`${name}: a cold worker launches the app offline from the precache, a write made then is queued and replayed once, and an update waits for the prompt`,
      withDiagnostics(harness, async (t) => {
        const h = harness();
        const www = served.get(`${engine}/${name}`);
        const { origin } = host;
        const page = h.browser.pages()[0] ?? await h.browser.newPage();

        // 1. Controlled; the library precached the app, the outbox only its own files.
        await load(page, `${origin}/`);
        await page.evaluate(() => window.app.ready);
        assert.equal(await page.evaluate(() => document.querySelector('h1').textContent), 'first deploy');
        const caches = await cacheContents(page);
        const precache = Object.keys(caches).find((c) => recipe.precacheCache.test(c));
        assert.ok(precache, `the library's precache is there: ${JSON.stringify(Object.keys(caches))}`);
        assert.ok(caches[precache].some((p) => p === '/' || p === '/index.html'), `the page is precached: ${caches[precache]}`);
        if (name !== 'static') {
          // With no shell of its own (precache: []) the outbox has no cache: its module
          // came with the worker's scripts (issue 37).
          const outbox = Object.keys(caches).filter((c) => c.startsWith('sw-outbox-'));
          assert.deepEqual(outbox, [], JSON.stringify(Object.keys(caches)));
        } else {
          const own = caches[precache].filter((p) => p.startsWith('/sw-outbox/pkg/'));
          assert.deepEqual(own, [], `the runtime is not in Cache Storage: ${caches[precache]}`);
        }
        const login = await page.evaluate(() => window.app.json('POST', '/api/auth/login', { userId: 'alice', password: 'alice' }));
        assert.equal(login.status, 200, JSON.stringify(login));
        const session = await page.evaluate(() => window.app.client.signedIn('alice'));
        assert.equal(session.ok, true, JSON.stringify(session));

        // 2. A cold start with the site unreachable: a deep link launches from the precache.
        const cold = !lacks(engine, 'stopWorkers');
        if (cold) await h.stopWorkers();
        else t.diagnostic(`${engine}: ${lacks(engine, 'stopWorkers')}; the offline launch runs with the worker the browser kept`);
        host.setDown(true);
        let write;
        try {
          const launched = await load(page, `${origin}/projects/p1?tab=tasks`);
          if (engine === 'chromium') assert.equal(launched.fromServiceWorker(), true);
          assert.equal(await page.evaluate(() => document.querySelector('h1').textContent), 'first deploy');
          await page.evaluate(() => window.app.ready);

          // 3. A write now is the outbox's: queued.
          write = await page.evaluate(() => window.app.json('POST', '/api/projects/p1/tasks', { title: 'made offline' }));
          assert.equal(write.status, 202, JSON.stringify(write));
          assert.equal(write.body.queued, true);
          assert.deepEqual(await h.applied(), []);
        } finally {
          host.setDown(false);
        }
        const flushed = await page.evaluate(() => window.app.client.flush());
        assert.equal(flushed.ok, true, JSON.stringify(flushed));
        const applied = await eventually(async () => {
          const a = await h.applied();
          return a.length ? a : null;
        }, { what: 'the write applied' });
        assert.equal(applied.length, 1, JSON.stringify(applied));
        assert.equal(applied[0].key, write.body.idempotencyKey);
        assert.equal(applied[0].user, 'alice');
        assert.equal(JSON.parse(applied[0].body).title, 'made offline');

        // 4. The second deploy waits for the prompt, then takes over. (From the start page:
        // a static host without a catch-all answers a deep link 404 once it is online,
        // and the outbox's shell passes a 404 on, section 9.)
        await load(page, `${origin}/`);
        await page.evaluate(() => window.app.ready);
        await deploy(join(dir, `${name}-second`), www);
        await page.evaluate(async () => (await navigator.serviceWorker.getRegistration()).update());
        await page.waitForFunction(() => window.app.waitingSeen > 0, null, { timeout: 30000 });
        await new Promise((r) => setTimeout(r, 3000));
        const waiting = await page.evaluate(async () => {
          const reg = await navigator.serviceWorker.getRegistration();
          return { waiting: reg.waiting?.state ?? null, page: document.querySelector('h1').textContent };
        });
        assert.deepEqual(waiting, { waiting: 'installed', page: 'first deploy' }, 'the new version waits for the prompt');
        await page.evaluate(() => { window.app.prompt(); });
        // The page reloads once the new version controls it, and runs the second deploy.
        try {
          await page.waitForFunction(() => window.app?.deploy === 'second deploy' && navigator.serviceWorker.controller !== null,
            null, { timeout: 30000 });
        } catch (e) {
          e.message += `\nthe page: ${await page.evaluate(() => `${location.href} ${document.title} ${document.body?.innerText?.slice(0, 200)}`).catch((x) => x.message)}`;
          throw e;
        }
        await page.evaluate(() => window.app.ready);
        const done = await page.evaluate(async () => {
          const reg = await navigator.serviceWorker.getRegistration();
          return { waiting: reg.waiting, active: reg.active?.state };
        });
        // (WebKit leaves `activating` on the objects of a page loaded while its controller
        // activated: a document opened later sees `activated`. The worker answers either way.)
        assert.equal(done.waiting, null);
        assert.ok(done.active === 'activated' || (engine === 'webkit' && done.active === 'activating'), JSON.stringify(done));
        const listed = await page.evaluate(() => window.app.client.list());
        assert.deepEqual(listed.records, [], 'the new version runs the outbox, with nothing left queued');
      }));
  }, {
    name: `recipe ${recipe.title}`,
    async setup(engine) {
      const www = await mkdtemp(join(tmpdir(), `sw-outbox-recipe-${name}-${engine}-`));
      await cp(join(dir, `${name}-first`), www, { recursive: true });
      served.set(`${engine}/${name}`, www);
      return { www, requireWorker: false };
    },
    async teardown(engine) {
      const www = served.get(`${engine}/${name}`);
      if (www) await rm(www, { recursive: true, force: true });
    },
  });
}
