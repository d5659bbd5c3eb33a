// A real Vite app using the packed package, as an adopter's would: `npm pack ./package`,
// a fresh app in a temporary folder with `sw-outbox` installed from that tarball and the
// `sw-outbox/vite` plugin in its config, a production build (`vite build`) under a
// non-root base (`/app/`), and `dist/` served by the reference server, so pages and API
// share one origin as in production. Checked: the page is controlled by the worker; a
// write made offline is answered 202, and a flush applies it once; an offline reload is
// served from the shell the plugin precached; a new deploy of the app alone (same
// outbox build) precaches into a new cache and the old one is deleted; `vite dev`
// serves the worker too.
//
// Vite itself is not fetched from the registry: the app links the repository's own
// copy (node_modules/vite, pinned in package.json and installed by `npm ci` from the
// lock file), which keeps the test off the network and CI time down. The tarball has no
// dependencies, so its install is `--offline`.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, readdir, rm, stat, utimes, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { promisify } from 'node:util';
import { after, before, describe, test } from 'node:test';
import { repoRoot, startHarness } from '../e2e/harness.mjs';
import { eventually, withDiagnostics } from '../e2e/outbox-helpers.mjs';

const run = promisify(execFile);
const npmEnv = { ...process.env, npm_config_update_notifier: 'false', npm_config_fund: 'false', npm_config_audit: 'false' };
const BASE = '/app/';

const INDEX_HTML = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>a Vite app using sw-outbox</title></head>
<body><h1>loading</h1><script type="module" src="/src/main.js"></script></body></html>
`;

const MAIN_JS = `import { registerOutbox } from 'sw-outbox';
import { greeting } from './greeting.js';
import './style.css';

document.querySelector('h1').textContent = greeting;
window.app = {};
window.app.ready = registerOutbox({ scriptUrl: import.meta.env.BASE_URL + 'sw.js', scope: import.meta.env.BASE_URL })
  .then((client) => { window.app.client = client; return client.controlled; });
window.app.json = async (method, path, body, headers = {}) => {
  const r = await fetch(path, {
    method, headers: { 'Content-Type': 'application/json', ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: r.status, body: await r.json().catch(() => null) };
};
`;

/** The plugin as an adopter configures it; the dev server proxies the API to `api`. */
const viteConfig = (api) => `import swOutbox from 'sw-outbox/vite';

export default {
  base: '${BASE}',
  build: { outDir: 'dist${BASE}' },
  server: { proxy: { '/api': '${api}' } },
  plugins: [swOutbox({ config: { dbName: 'vite-app-outbox' } })],
};
`;

const greetingModule = (text) => `export const greeting = ${JSON.stringify(text)};\n`;

let dir;
let app;
let h;

/** Runs the app's own `vite build` (its node_modules/vite, a link to the pinned copy). */
async function viteBuild() {
  await run(process.execPath, [join(app, 'node_modules/vite/bin/vite.js'), 'build', '--logLevel', 'warn'], { cwd: app });
}

/** Every cache of the page's origin with the paths it holds (the worker's own record of
 * which registrations use a cache, `/__sw-outbox/cache-owners`, left out: it is not the
 * app's). */
function cacheContents(page) {
  return page.evaluate(async () => {
    const out = {};
    for (const name of await caches.keys()) {
      out[name] = (await (await caches.open(name)).keys()).map((r) => new URL(r.url).pathname)
        .filter((p) => p !== '/__sw-outbox/cache-owners').sort();
    }
    return out;
  });
}

/** The registration's workers, each as `scriptURL state`. */
function workerStates(page) {
  return page.evaluate(async () => {
    const reg = await navigator.serviceWorker.getRegistration();
    const one = (w) => (w ? `${new URL(w.scriptURL).search || w.scriptURL} ${w.state}` : null);
    return reg ? { installing: one(reg.installing), waiting: one(reg.waiting), active: one(reg.active) } : null;
  });
}

/** The files of dist/app as URL paths, the worker's own aside. */
async function builtShell() {
  const assets = await readdir(join(app, 'dist/app/assets'));
  return ['/app/', '/app/index.html', ...assets.map((a) => `/app/assets/${a}`)].sort();
}

/** The outbox's build id (pkg/build.js) and the app's (the plugin's shell build). */
async function buildIds() {
  const outbox = /SW_OUTBOX_BUILD = "([^"]+)"/.exec(await readFile(join(app, 'dist/app/sw-outbox/pkg/build.js'), 'utf8'))?.[1];
  const shell = /SW_OUTBOX_SHELL_BUILD = "([^"]+)"/.exec(await readFile(join(app, 'dist/app/sw.js'), 'utf8'))?.[1];
  return { outbox, shell, cache: `sw-outbox-${outbox}-${shell}` };
}

async function openApp(page) {
  await page.goto(`${h.baseUrl}${BASE}`);
  await page.waitForFunction(() => window.app?.ready);
  await page.evaluate(() => window.app.ready);
}

before(async () => {
  for (const f of ['www/pkg/sw_outbox_wasm.js', 'www/pkg/sw_outbox.js', 'www/pkg/build.js']) {
    if (!existsSync(join(repoRoot, f))) throw new Error(`${f} is missing: run ./build.sh to build the worker`);
  }
  dir = await mkdtemp(join(tmpdir(), 'sw-outbox-vite-'));
  const { stdout } = await run('npm', ['pack', './package', '--json', '--pack-destination', dir], { cwd: repoRoot, env: npmEnv });
  const [packed] = JSON.parse(stdout);

  app = join(dir, 'app');
  await mkdir(join(app, 'src'), { recursive: true });
  await writeFile(join(app, 'package.json'), JSON.stringify({ name: 'a-vite-app', version: '1.0.0', private: true, type: 'module' }));
  await run('npm', ['install', '--offline', '--no-audit', '--no-fund',
    join(dir, packed.filename), join(repoRoot, 'node_modules/vite')], { cwd: app, env: npmEnv });
  await writeFile(join(app, 'index.html'), INDEX_HTML);
  await writeFile(join(app, 'src/main.js'), MAIN_JS);
  await writeFile(join(app, 'src/greeting.js'), greetingModule('first deploy'));
  await writeFile(join(app, 'src/style.css'), 'h1 { color: teal; }\n');
  // The harness serves dist/, so the build under dist/app/ is the site's /app/.
  h = await startHarness({ www: join(app, 'dist'), requireWorker: false });
  await writeFile(join(app, 'vite.config.js'), viteConfig(h.baseUrl));
  await viteBuild();
});

after(async () => {
  await h?.close();
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe('a Vite app built with sw-outbox/vite', () => {
  test('the build holds the outbox and a worker script with the shell and its build id', async () => {
    for (const f of ['sw.js', 'sw-outbox/sw.js', 'sw-outbox/pkg/build.js', 'sw-outbox/pkg/sw_outbox.js', 'sw-outbox/pkg/sw_outbox_wasm.js']) {
      assert.ok(existsSync(join(app, 'dist/app', f)), `dist/app/${f} written`);
    }
    const wasm = await readFile(join(app, 'dist/app/sw-outbox/pkg/sw_outbox_wasm.js'));
    assert.deepEqual(wasm, await readFile(join(repoRoot, 'www/pkg/sw_outbox_wasm.js')), 'the shipped module script, unchanged');
    const script = await readFile(join(app, 'dist/app/sw.js'), 'utf8');
    const config = JSON.parse(/self\.SW_OUTBOX_CONFIG = (\{[\s\S]*?\});/.exec(script)[1]);
    assert.equal(config.dbName, 'vite-app-outbox');
    assert.deepEqual(config.precache.map((u) => new URL(u, `http://x${BASE}`).pathname).sort(), await builtShell());
    assert.match((await buildIds()).shell, /^[0-9a-f]{12}$/);
  });

  test('controlled page → offline write → 202 → flush → applied once', withDiagnostics(() => h, async () => {
    const page = h.context.pages()[0] ?? await h.context.newPage();
    await openApp(page);
    const controller = await page.evaluate(() => navigator.serviceWorker.controller?.scriptURL);
    assert.equal(controller, `${h.baseUrl}${BASE}sw.js`);

    const ids = await buildIds();
    const cached = await cacheContents(page);
    assert.deepEqual(Object.keys(cached), [ids.cache], 'one cache, named after both builds');
    // The shell only: the runtime came with the worker's scripts (issue 37).
    assert.deepEqual(cached[ids.cache], await builtShell());

    const login = await page.evaluate(() => window.app.json('POST', '/api/auth/login', { userId: 'alice', password: 'alice' }));
    assert.equal(login.status, 200, JSON.stringify(login));
    const session = await page.evaluate(() => window.app.client.signedIn('alice'));
    assert.equal(session.ok, true, JSON.stringify(session));

    await h.setNetwork(false);
    const write = await page.evaluate(([token]) => window.app.json('POST', '/api/projects/p1/tasks',
      { title: 'from a Vite build' }, { 'X-CSRF-Token': token }), [login.body.csrfToken]);
    assert.equal(write.status, 202, JSON.stringify(write));
    assert.equal(write.body.queued, true);
    assert.deepEqual(await h.applied(), []);

    await h.setNetwork(true);
    const flushed = await page.evaluate(() => window.app.client.flush());
    assert.equal(flushed.ok, true, JSON.stringify(flushed));
    // A background flush (the worker's offline probe) may have delivered it before this
    // command arrived; what matters is that it was applied once and left the queue.
    assert.ok(flushed.affected <= 1, JSON.stringify(flushed));
    const applied = await h.applied();
    assert.equal(applied.length, 1, JSON.stringify(applied));
    assert.equal(applied[0].user, 'alice');
    assert.equal(applied[0].key, write.body.idempotencyKey);
    assert.equal(JSON.parse(applied[0].body).title, 'from a Vite build');
    assert.deepEqual((await page.evaluate(() => window.app.client.list())).records, []);
  }));

  test('offline, a reload is served from the precached shell, its script included', withDiagnostics(() => h, async () => {
    const page = h.context.pages()[0];
    await h.context.setOffline(true);
    try {
      const reloaded = await page.reload();
      assert.equal(reloaded.status(), 200);
      assert.equal(reloaded.fromServiceWorker(), true, 'answered by the worker');
      await page.waitForFunction(() => document.querySelector('h1')?.textContent === 'first deploy');
      await page.evaluate(() => window.app.ready);
      assert.ok(await page.evaluate(() => navigator.serviceWorker.controller !== null));
    } finally {
      await h.context.setOffline(false);
    }
  }));

  test('a new deploy of the app alone gets a new shell cache and drops the old one', withDiagnostics(() => h, async () => {
    const page = h.context.pages()[0];
    await openApp(page);
    const first = await buildIds();
    const worker = join(app, 'dist/app/sw.js');
    const firstTime = await stat(worker);

    await writeFile(join(app, 'src/greeting.js'), greetingModule('second deploy'));
    await viteBuild();
    // A deploy within the second of the previous one, made certain: the worker script
    // keeps the old file time. A server whose validator is that time answers the browser's
    // update check 304 and the deploy is never seen (this test failed so in CI, by chance
    // of timing, before the reference server's validators followed the bytes).
    await utimes(worker, firstTime.atime, firstTime.mtime);
    const second = await buildIds();
    assert.equal(second.outbox, first.outbox, 'same outbox build');
    assert.notEqual(second.shell, first.shell, 'a new shell build id');

    await page.evaluate(async () => (await navigator.serviceWorker.getRegistration()).update());
    // What was last seen, for a failure: the caches and the registration's workers.
    let seen = null;
    const cached = await eventually(async () => {
      const c = await cacheContents(page);
      seen = { caches: Object.keys(c), workers: await workerStates(page) };
      return Object.keys(c).length === 1 && c[second.cache] ? c : null;
    }, { timeout: 30000, what: `only ${second.cache} left` }).catch((err) => {
      err.message += `; last seen ${JSON.stringify(seen)}`;
      throw err;
    });
    assert.deepEqual(cached[second.cache].filter((p) => !p.includes('/sw-outbox/')), await builtShell());
    await page.waitForFunction(async () => {
      const reg = await navigator.serviceWorker.getRegistration();
      return reg.active?.state === 'activated' && !reg.installing && !reg.waiting;
    });

    await h.context.setOffline(true);
    try {
      const reloaded = await page.reload();
      assert.equal(reloaded.fromServiceWorker(), true);
      await page.waitForFunction(() => document.querySelector('h1')?.textContent === 'second deploy');
    } finally {
      await h.context.setOffline(false);
    }
  }));

  test('vite dev serves the worker without a shell; the page is controlled', withDiagnostics(() => h, async () => {
    const { createServer } = await import(pathToFileURL(join(app, 'node_modules/vite/dist/node/index.js')).href);
    const server = await createServer({ root: app, logLevel: 'warn', server: { host: '127.0.0.1', port: 0, strictPort: false } });
    await server.listen();
    const page = await h.context.newPage();
    try {
      const origin = server.resolvedUrls.local[0].replace(/\/app\/$/, '');
      await page.goto(`${origin}${BASE}`);
      await page.waitForFunction(() => window.app?.ready);
      await page.evaluate(() => window.app.ready);
      assert.equal(await page.evaluate(() => navigator.serviceWorker.controller?.scriptURL), `${origin}${BASE}sw.js`);
      const cached = await cacheContents(page);
      // No shell in dev, and the runtime came with the worker's scripts: no cache at all.
      assert.deepEqual(cached, {}, 'nothing in Cache Storage');
      // The dev server's proxy reaches the reference server through the worker, which
      // knows alice's session: cookies are per host, not per port.
      const me = await page.evaluate(() => window.app.json('GET', '/api/auth/me'));
      assert.equal(me.status, 200, JSON.stringify(me));
      assert.equal(me.body.user.id, 'alice');
    } finally {
      await page.close();
      await server.close();
    }
  }));
});
