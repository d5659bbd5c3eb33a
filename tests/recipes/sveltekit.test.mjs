// The package README's SvelteKit recipe, built as SvelteKit's docs say and run end to end:
// a SvelteKit 2 app (adapter-static, prerendered) whose src/service-worker.js is
// SvelteKit's documented worker, with the outbox beside it (`import 'sw-outbox/worker'`).
// That worker's `activate` deletes every cache but its own, so the outbox must not keep
// anything it needs to start in Cache Storage (issue 37): its module comes with the
// worker's scripts. Built twice (two deploys) from the packed package (`npm pack
// ./package`) and the repository's pinned SvelteKit, Svelte and Vite (linked, not fetched).
//
// In each engine, served by the reference server behind the site host
// (tests/e2e-engines/site-host.mjs, which can drop every connection):
// 1. the page is controlled; SvelteKit's cache is there;
// 2. a cold start offline (the worker stopped, where the engine's automation can stop
//    one): the page reloads from SvelteKit's cache, and a write made then is queued (202),
//    then replayed once with its key under the account that made it; the outbox has no
//    cache at all;
// 3. a redeploy: the second deploy's worker takes over (SvelteKit's activate deletes the
//    first deploy's cache), the page runs the second deploy, and a write made offline
//    after another cold start is again queued and replayed once.
// And under `vite dev` (Chromium), where SvelteKit's worker is an ES module (registered
// with `type: 'module'`, no importScripts): the outbox runs in it, and after a cold start
// offline a write is queued and replayed once.
//
// RECIPES_SVELTEKIT_CLASSIC=1 builds the worker as issue 37 found adopters doing it, with
// the outbox's files copied into static/sw-outbox/ and `importScripts('/sw-outbox/sw.js')`
// (a classic worker: built mode only), which an older package also runs; with
// RECIPES_TARBALL=<its packed .tgz> this shows the runtime that kept its module in Cache
// Storage failing here.
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { cp, mkdir, mkdtemp, readdir, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { after, before, describe, test } from 'node:test';
import { lacks, selectedEngines } from '../e2e-engines/engines.mjs';
import { repoRoot, startHarness } from '../e2e-engines/harness.mjs';
import { eventually, forEachEngine, withDiagnostics } from '../e2e-engines/outbox-helpers.mjs';
import { startSiteHost } from '../e2e-engines/site-host.mjs';

const run = promisify(execFile);
const npmEnv = { ...process.env, npm_config_update_notifier: 'false', npm_config_fund: 'false', npm_config_audit: 'false' };

/** The libraries, linked from the repository's node_modules. */
const LIBRARIES = ['vite', 'svelte', '@sveltejs/kit', '@sveltejs/adapter-static', '@sveltejs/vite-plugin-svelte'];

/** See the header: the outbox through importScripts of copied files. */
const CLASSIC = Boolean(process.env.RECIPES_SVELTEKIT_CLASSIC);

let dir; // everything built here
let tarball; // the packed package (RECIPES_TARBALL: another one, e.g. an older build's)

const SVELTE_CONFIG = `import adapter from '@sveltejs/adapter-static';

export default {
  kit: {
    adapter: adapter(),
    // The page helper registers the worker (registerOutbox), as SvelteKit would.
    serviceWorker: { register: false },
  },
};
`;

/** Vite's config; under \`vite dev\` the API goes to the reference server (API_TARGET). */
const VITE_CONFIG = `import { sveltekit } from '@sveltejs/kit/vite';

export default {
  plugins: [sveltekit()],
  server: {
    hmr: false,
    proxy: process.env.API_TARGET ? { '/api': { target: process.env.API_TARGET } } : undefined,
  },
};
`;

const APP_HTML = `<!doctype html>
<html lang="en"><head><meta charset="utf-8">%sveltekit.head%</head>
<body><div style="display: contents">%sveltekit.body%</div></body></html>
`;

/** The page: the page helper registers the worker with the type SvelteKit gives it (an ES
 * module under \`vite dev\`); what the tests read is on window.app. */
const PAGE = (deploy) => `<script>
  import { onMount } from 'svelte';
  import { dev } from '$app/environment';
  import { registerOutbox } from 'sw-outbox';

  const deploy = ${JSON.stringify(deploy)};
  onMount(() => {
    const app = window.app = { deploy };
    app.json = async (method, path, body) => {
      const r = await fetch(path, {
        method, headers: { 'Content-Type': 'application/json' },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      return { status: r.status, body: await r.json().catch(() => null) };
    };
    app.ready = registerOutbox({ scriptUrl: '/service-worker.js', type: dev ? 'module' : 'classic' })
      .then((client) => { app.client = client; return client.controlled; });
  });
</script>

<h1 data-testid="version">{deploy}</h1>
`;

/** The outbox's configuration, in a module of its own: imports run before the code of
 * the module that imports them, so it must be imported before \`sw-outbox/worker\`. */
const OUTBOX_CONFIG = `// The outbox for the API only: SvelteKit's worker below caches the app.
self.SW_OUTBOX_CONFIG = { precache: [] };
`;

/** SvelteKit's documented service worker (its "Service workers" page), with the outbox's
 * two imports first and one line that leaves the API to the outbox. */
const SERVICE_WORKER = `/// <reference types="@sveltejs/kit" />
import './outbox-config.js';
import 'sw-outbox/worker';
import { build, files, version } from '$service-worker';

const CACHE = \`cache-\${version}\`;
const ASSETS = [...build, ...files];

self.addEventListener('install', (event) => {
  async function addFilesToCache() {
    const cache = await caches.open(CACHE);
    await cache.addAll(ASSETS);
  }
  event.waitUntil(addFilesToCache());
});

self.addEventListener('activate', (event) => {
  async function deleteOldCaches() {
    for (const key of await caches.keys()) {
      if (key !== CACHE) await caches.delete(key);
    }
  }
  event.waitUntil(deleteOldCaches());
});

self.addEventListener('fetch', (event) => {
  if (event.request.method !== 'GET') return;
  const url = new URL(event.request.url);
  if (url.pathname.startsWith('/api/')) return; // the outbox's
  async function respond() {
    const cache = await caches.open(CACHE);
    if (ASSETS.includes(url.pathname)) {
      const response = await cache.match(url.pathname);
      if (response) return response;
    }
    try {
      const response = await fetch(event.request);
      if (!(response instanceof Response)) throw new Error('invalid response from fetch');
      if (response.status === 200) cache.put(event.request, response.clone());
      return response;
    } catch (err) {
      const response = await cache.match(event.request);
      if (response) return response;
      throw err;
    }
  }
  event.respondWith(respond());
});
`;

/** A fresh SvelteKit app of `deploy` with the packed package and the linked libraries. */
async function newApp(name, deploy) {
  const app = join(dir, name);
  const modules = join(app, 'node_modules');
  await mkdir(join(modules, 'sw-outbox'), { recursive: true });
  await mkdir(join(modules, '@sveltejs'), { recursive: true });
  await run('tar', ['-xzf', tarball, '-C', join(modules, 'sw-outbox'), '--strip-components=1']);
  for (const lib of LIBRARIES) await symlink(join(repoRoot, 'node_modules', lib), join(modules, lib), 'dir');
  await writeFile(join(app, 'package.json'), JSON.stringify({ name: `recipe-${name}`, private: true, type: 'module' }));
  await mkdir(join(app, 'src/routes'), { recursive: true });
  await writeFile(join(app, 'svelte.config.js'), SVELTE_CONFIG);
  await writeFile(join(app, 'vite.config.js'), VITE_CONFIG);
  await writeFile(join(app, 'src/app.html'), APP_HTML);
  await writeFile(join(app, 'src/routes/+layout.js'), 'export const prerender = true;\n');
  await writeFile(join(app, 'src/routes/+page.svelte'), PAGE(deploy));
  await writeFile(join(app, 'src/outbox-config.js'), OUTBOX_CONFIG);
  if (CLASSIC) {
    for (const f of ['sw.js', 'pkg']) await cp(join(modules, 'sw-outbox', f), join(app, 'static/sw-outbox', f), { recursive: true });
    await writeFile(join(app, 'src/service-worker.js'), SERVICE_WORKER.replace(
      "import './outbox-config.js';\nimport 'sw-outbox/worker';\n",
      "import './outbox-config.js';\nself.SW_OUTBOX_BASE = '/sw-outbox/';\nimportScripts('/sw-outbox/sw.js');\n"));
  } else {
    await writeFile(join(app, 'src/service-worker.js'), SERVICE_WORKER);
  }
  return app;
}

const vite = (app) => join(app, 'node_modules/vite/bin/vite.js');

before(async () => {
  dir = await mkdtemp(join(tmpdir(), 'sw-outbox-sveltekit-'));
  if (process.env.RECIPES_TARBALL) {
    tarball = process.env.RECIPES_TARBALL;
  } else {
    const { stdout } = await run('npm', ['pack', './package', '--json', '--pack-destination', dir], { cwd: repoRoot, env: npmEnv });
    tarball = join(dir, JSON.parse(stdout)[0].filename);
  }
  for (const deploy of ['first', 'second']) {
    const app = await newApp(`app-${deploy}`, `${deploy} deploy`);
    // SvelteKit reads svelte.config.js from the working directory.
    await run(process.execPath, [vite(app), 'build', '--logLevel', 'warn'], { cwd: app, env: npmEnv });
  }
});

after(async () => {
  if (process.env.RECIPES_KEEP) console.log(`sveltekit recipe: built apps kept in ${dir}`);
  else if (dir) await rm(dir, { recursive: true, force: true });
});

/** Replaces the served folder's files with `from`'s (a deploy). */
async function deployTo(from, to) {
  for (const entry of await readdir(to)) await rm(join(to, entry), { recursive: true, force: true });
  await cp(from, to, { recursive: true });
}

/** Loads `url` and waits until the page's code ran and a worker controls it. */
async function load(page, url) {
  await page.goto(url);
  await page.waitForFunction(() => Boolean(window.app?.client));
  await page.evaluate(() => window.app.ready);
}

/** The names of the caches of the page's origin. */
const cacheNames = (page) => page.evaluate(() => caches.keys());

/** Signs `user` in on the server and in the page helper. */
async function signIn(page, user) {
  const login = await page.evaluate((u) => window.app.json('POST', '/api/auth/login', { userId: u, password: u }), user);
  assert.equal(login.status, 200, JSON.stringify(login));
  const session = await page.evaluate((u) => window.app.client.signedIn(u), user);
  assert.equal(session.ok, true, JSON.stringify(session));
}

/** A write made with the site unreachable: queued by the outbox. */
async function offlineWrite(page, host, title) {
  host.setDown(true);
  try {
    const write = await page.evaluate((t) => window.app.json('POST', '/api/projects/p1/tasks', { title: t }), title);
    assert.equal(write.status, 202, `the outbox queues the write: ${JSON.stringify(write)}`);
    assert.equal(write.body.queued, true);
    return write;
  } finally {
    host.setDown(false);
  }
}

/** Flushes and waits until `count` writes are applied; checks the last is `write`'s. */
async function replayed(h, page, write, count, title) {
  const flushed = await page.evaluate(() => window.app.client.flush());
  assert.equal(flushed.ok, true, JSON.stringify(flushed));
  const applied = await eventually(async () => {
    const a = await h.applied();
    return a.length >= count ? a : null;
  }, { what: `${count} writes applied` });
  assert.equal(applied.length, count, JSON.stringify(applied));
  const last = applied[count - 1];
  assert.equal(last.key, write.body.idempotencyKey);
  assert.equal(last.user, 'alice');
  assert.equal(JSON.parse(last.body).title, title);
}

/** Stops the workers where the engine's automation can (a cold start next). */
async function stopWorkers(engine, h, t) {
  if (!lacks(engine, 'stopWorkers')) return h.stopWorkers();
  t.diagnostic(`${engine}: ${lacks(engine, 'stopWorkers')}; the offline steps run with the worker the browser kept`);
  return undefined;
}

const served = new Map(); // engine → the folder the reference server serves

forEachEngine((engine, harness) => {
  let host;
  before(async () => { host = await startSiteHost(harness().baseUrl); });
  after(async () => { await host?.close(); });

  test('sveltekit: beside SvelteKit\'s documented worker (which deletes every other cache), a cold worker offline queues a write that is replayed once, before and after a redeploy',
    withDiagnostics(harness, async (t) => {
      const h = harness();
      const { origin } = host;
      const page = h.browser.pages()[0] ?? await h.browser.newPage();

      // 1. Controlled; SvelteKit's cache is there.
      await load(page, `${origin}/`);
      assert.equal(await page.evaluate(() => window.app.deploy), 'first deploy');
      const names = await cacheNames(page);
      assert.ok(names.some((n) => n.startsWith('cache-')), `SvelteKit's cache: ${JSON.stringify(names)}`);
      await signIn(page, 'alice');
      // A controlled load, so SvelteKit's worker caches the page for the offline reload.
      await load(page, `${origin}/`);

      // 2. A cold start with the site unreachable: the page reloads from SvelteKit's
      // cache, and a write made then is the outbox's.
      await stopWorkers(engine, h, t);
      host.setDown(true);
      try {
        await load(page, `${origin}/`);
      } finally {
        host.setDown(false);
      }
      assert.equal(await page.evaluate(() => window.app.deploy), 'first deploy');
      await stopWorkers(engine, h, t);
      const first = await offlineWrite(page, host, 'made offline');
      assert.deepEqual(await h.applied(), []);
      await replayed(h, page, first, 1, 'made offline');
      const kept = await cacheNames(page);
      assert.deepEqual(kept.filter((n) => n.startsWith('sw-outbox-')), [], `the outbox keeps nothing in Cache Storage: ${kept}`);

      // 3. A redeploy: the new worker takes over and SvelteKit's activate deletes the first
      // deploy's cache; the outbox still starts cold and offline.
      await deployTo(join(dir, 'app-second/build'), served.get(engine));
      await page.evaluate(async () => (await navigator.serviceWorker.getRegistration()).update());
      await eventually(async () => {
        const state = await page.evaluate(async () => {
          const reg = await navigator.serviceWorker.getRegistration();
          return { installing: Boolean(reg.installing), waiting: Boolean(reg.waiting), active: reg.active?.state };
        });
        return !state.installing && !state.waiting && state.active === 'activated' ? state : null;
      }, { timeout: 30000, what: 'the second deploy\'s worker activated' });
      await load(page, `${origin}/`);
      assert.equal(await page.evaluate(() => window.app.deploy), 'second deploy');
      const after = await cacheNames(page);
      assert.equal(after.filter((n) => n.startsWith('cache-')).length, 1, JSON.stringify(after));
      assert.deepEqual(after.filter((n) => n.startsWith('sw-outbox-')), [], JSON.stringify(after));
      await stopWorkers(engine, h, t);
      const second = await offlineWrite(page, host, 'made offline after the redeploy');
      await replayed(h, page, second, 2, 'made offline after the redeploy');
      const listed = await page.evaluate(() => window.app.client.list());
      assert.deepEqual(listed.records, [], 'nothing left queued');
    }));
}, {
  name: 'recipe SvelteKit (its documented service worker)',
  async setup(engine) {
    const www = await mkdtemp(join(tmpdir(), `sw-outbox-sveltekit-${engine}-`));
    await cp(join(dir, 'app-first/build'), www, { recursive: true });
    served.set(engine, www);
    return { www, requireWorker: false };
  },
  async teardown(engine) {
    const www = served.get(engine);
    if (www) await rm(www, { recursive: true, force: true });
  },
});

/** Starts `vite dev` in `app` (the API proxied to `apiTarget`); resolves with its origin
 * and a stop function. */
async function startViteDev(app, apiTarget) {
  const child = spawn(process.execPath, [vite(app), 'dev', '--host', '127.0.0.1', '--port', '0', '--strictPort=false'], {
    cwd: app, env: { ...npmEnv, API_TARGET: apiTarget }, stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  const origin = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`vite dev did not start:\n${output}`)), 60000);
    const onData = (chunk) => {
      output += chunk;
      // eslint-disable-next-line no-control-regex
      const m = /Local:\s+(http:\/\/127\.0\.0\.1:\d+)/.exec(output.replace(/\x1b\[[0-9;]*m/g, ''));
      if (m) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', onData);
    child.on('exit', (code) => reject(new Error(`vite dev exited (${code}):\n${output}`)));
  });
  return { origin, output: () => output, stop: () => child.kill('SIGTERM') };
}

if (selectedEngines().includes('chromium') && !CLASSIC) {
  describe('chromium: recipe SvelteKit under vite dev (a module worker)', () => {
    let h;
    let www;
    let dev;
    let host;
    const harness = () => h;
    before(async () => {
      www = await mkdtemp(join(tmpdir(), 'sw-outbox-sveltekit-dev-'));
      h = await startHarness({ engine: 'chromium', www, requireWorker: false });
      dev = await startViteDev(join(dir, 'app-first'), h.baseUrl);
      host = await startSiteHost(dev.origin);
    });
    after(async () => {
      await host?.close();
      dev?.stop();
      await h?.close();
      if (www) await rm(www, { recursive: true, force: true });
    });
    test('sveltekit under vite dev: the outbox runs in SvelteKit\'s module worker, and a cold start offline queues a write that is replayed once',
      withDiagnostics(harness, async () => {
        const h = harness();
        const { origin } = host;
        const page = h.browser.pages()[0] ?? await h.browser.newPage();
        await load(page, `${origin}/`);
        assert.equal(await page.evaluate(() => navigator.serviceWorker.controller?.scriptURL), `${origin}/service-worker.js`);
        await signIn(page, 'alice');
        // The outbox answers in the module worker.
        const listed = await page.evaluate(() => window.app.client.list());
        assert.deepEqual(listed.records, [], JSON.stringify(listed));
        // A cold start offline: the module worker starts again from what the browser kept.
        await h.stopWorkers();
        const write = await offlineWrite(page, host, 'made offline in dev');
        await replayed(h, page, write, 1, 'made offline in dev');
      }));
  });
}
