// The npm package as a site without a bundler would use it: `npm pack ./package`, the
// tarball installed into a throwaway site, its files copied into the site's public folder
// as the package README's recipe does (a site serves its own files, never node_modules),
// the site's own worker script configuring the shim (SW_OUTBOX_BASE), the page helper
// imported from the copy, all served by the reference server; one write made offline →
// 202 → flush → applied once. The tarball's contents, README and exports map are checked
// too, once per run; the site's write in every engine. (Bundlers:
// tests/bundler/vite-app.test.mjs.)
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { cp, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { after, before, test } from 'node:test';
import { repoRoot } from './harness.mjs';
import { forEachEngine, withDiagnostics } from './outbox-helpers.mjs';

const run = promisify(execFile);
const npmEnv = { ...process.env, npm_config_update_notifier: 'false', npm_config_fund: 'false', npm_config_audit: 'false' };

/** The files an adopter needs, and only those. */
const EXPECTED_FILES = [
  'README.md', 'package.json', 'CHANGELOG.md', 'docs/PROTOCOL.md', 'docs/SERVER-API.md',
  'index.d.ts', 'outbox-client.js', 'outbox-client.d.ts', 'outbox-protocol.d.ts',
  'sw.js', 'worker.js', 'pkg/build.js', 'pkg/sw_outbox.js', 'pkg/sw_outbox_wasm.js',
  'vite.js', 'vite.d.ts', 'react.js', 'react.d.ts',
];

const SITE_SW = `// The site's own worker script: its configuration, then the installed shim.
self.SW_OUTBOX_CONFIG = {
  precache: ['/', '/site.js'],
  dbName: 'site-outbox',
};
self.SW_OUTBOX_BASE = '/sw-outbox/';
importScripts('/sw-outbox/sw.js');
`;

const SITE_HTML = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>a site using sw-outbox</title>
<script type="module" src="/site.js"></script></head>
<body><h1>A site</h1></body></html>
`;

const SITE_JS = `import { registerOutbox } from '/sw-outbox/outbox-client.js';
window.site = {};
window.site.ready = registerOutbox({ scriptUrl: '/sw.js' }).then((client) => { window.site.client = client; return client.controlled; });
window.site.json = async (method, path, body, headers = {}) => {
  const r = await fetch(path, {
    method, headers: { 'Content-Type': 'application/json', ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: r.status, body: await r.json().catch(() => null) };
};
`;

let dir;
let site;
let packed;

before(async () => {
  for (const f of ['www/pkg/sw_outbox_wasm.js', 'www/pkg/sw_outbox.js', 'www/pkg/build.js']) {
    if (!existsSync(join(repoRoot, f))) throw new Error(`${f} is missing: run ./build.sh to build the worker`);
  }
  dir = await mkdtemp(join(tmpdir(), 'sw-outbox-npm-'));
  const { stdout } = await run('npm', ['pack', './package', '--json', '--pack-destination', dir], { cwd: repoRoot, env: npmEnv });
  [packed] = JSON.parse(stdout);

  site = join(dir, 'site');
  const pub = join(site, 'public');
  await mkdir(pub, { recursive: true });
  await writeFile(join(site, 'package.json'), JSON.stringify({ name: 'outbox-site', version: '1.0.0', private: true }));
  // A local tarball without dependencies installs without the network.
  await run('npm', ['install', '--offline', '--no-audit', '--no-fund', join(dir, packed.filename)], { cwd: site, env: npmEnv });
  // The README's recipe: copy sw.js, pkg/ and the page helper into the served folder.
  const installed = join(site, 'node_modules/sw-outbox');
  for (const f of ['sw.js', 'pkg', 'outbox-client.js']) {
    await cp(join(installed, f), join(pub, 'sw-outbox', f), { recursive: true });
  }
  await writeFile(join(pub, 'sw.js'), SITE_SW);
  await writeFile(join(pub, 'index.html'), SITE_HTML);
  await writeFile(join(pub, 'site.js'), SITE_JS);
});

after(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

test('npm pack ships the worker, its shim, the page helper, the Vite plugin, the React hook and their types', () => {
  assert.deepEqual(packed.files.map((f) => f.path).sort(), [...EXPECTED_FILES].sort());
  const wasm = packed.files.find((f) => f.path === 'pkg/sw_outbox_wasm.js');
  assert.ok(wasm.size > 1000, `the module's script is real: ${wasm.size} bytes`);
  assert.equal(packed.name, 'sw-outbox');
});

test('the package carries the adopter README, not the repository one', async () => {
  const readme = await readFile(join(site, 'node_modules/sw-outbox/README.md'), 'utf8');
  assert.equal(readme, await readFile(join(repoRoot, 'package/README.md'), 'utf8'));
  assert.notEqual(readme, await readFile(join(repoRoot, 'README.md'), 'utf8'));
  for (const section of ['npm install sw-outbox', 'sw-outbox/vite', 'What your server must do', 'Browser support', '| `apiPrefix` |']) {
    assert.ok(readme.includes(section), `the README has ${section}`);
  }
  for (const repoOnly of ['./build.sh demo', 'The two commands', 'Benchmark', 'chaos']) {
    assert.ok(!readme.includes(repoOnly), `no ${repoOnly} in the adopter README`);
  }
});

test('the exports map gives the page helper, the worker files, the plugin, the React hook and nothing else', async () => {
  const manifest = JSON.parse(await readFile(join(site, 'node_modules/sw-outbox/package.json'), 'utf8'));
  assert.equal(manifest.private, undefined, 'publishable');
  const resolve = createRequire(join(site, 'package.json')).resolve;
  const installed = join(site, 'node_modules/sw-outbox');
  assert.equal(resolve('sw-outbox'), join(installed, 'outbox-client.js'));
  assert.equal(resolve('sw-outbox/vite'), join(installed, 'vite.js'));
  assert.equal(resolve('sw-outbox/react'), join(installed, 'react.js'));
  assert.equal(manifest.exports['./react'].types, './react.d.ts');
  assert.equal(manifest.peerDependenciesMeta.react.optional, true, 'React only for sw-outbox/react');
  assert.equal(resolve('sw-outbox/sw.js'), join(installed, 'sw.js'));
  assert.equal(resolve('sw-outbox/pkg/sw_outbox_wasm.js'), join(installed, 'pkg/sw_outbox_wasm.js'));
  assert.equal(resolve('sw-outbox/worker'), join(installed, 'worker.js'));
  assert.equal(resolve('sw-outbox/package.json'), join(installed, 'package.json'));
  assert.equal(manifest.exports['.'].types, './index.d.ts');
  assert.throws(() => resolve('sw-outbox/docs/PROTOCOL.md'), { code: 'ERR_PACKAGE_PATH_NOT_EXPORTED' });
});

forEachEngine((engine, harness) => {
  test('a site using the installed package queues a write offline and replays it once', withDiagnostics(harness, async () => {
    const h = harness();
    const page = h.browser.pages()[0] ?? await h.browser.newPage();
    await page.goto(`${h.baseUrl}/`);
    await page.evaluate(() => window.site.ready);
    assert.ok(await page.evaluate(() => navigator.serviceWorker.controller?.scriptURL.endsWith('/sw.js')));

    // The shim cached the site's shell; its module came with the worker's scripts.
    const cached = await page.evaluate(async () => {
      const names = await caches.keys();
      const urls = [];
      for (const n of names) for (const r of await (await caches.open(n)).keys()) urls.push(new URL(r.url).pathname);
      return { names, urls };
    });
    assert.equal(cached.names.length, 1, JSON.stringify(cached));
    assert.match(cached.names[0], /^sw-outbox-/);
    for (const p of ['/', '/site.js']) {
      assert.ok(cached.urls.includes(p), `${p} cached: ${cached.urls}`);
    }
    assert.deepEqual(cached.urls.filter((p) => p.startsWith('/sw-outbox/')), [], 'no runtime file in Cache Storage');

    const login = await page.evaluate(() => window.site.json('POST', '/api/auth/login', { userId: 'alice', password: 'alice' }));
    assert.equal(login.status, 200, JSON.stringify(login));
    const csrf = login.body.csrfToken;
    const session = await page.evaluate(() => window.site.client.signedIn('alice'));
    assert.equal(session.ok, true, JSON.stringify(session));

    await h.setNetwork(false);
    const write = await page.evaluate(([token]) => window.site.json('POST', '/api/projects/p1/tasks',
      { title: 'from an npm-installed outbox' }, { 'X-CSRF-Token': token }), [csrf]);
    assert.equal(write.status, 202, JSON.stringify(write));
    assert.equal(write.body.queued, true);
    assert.deepEqual(await h.applied(), []);

    await h.setNetwork(true);
    const flushed = await page.evaluate(() => window.site.client.flush());
    assert.equal(flushed.ok, true, JSON.stringify(flushed));
    // A background flush (the worker's offline probe) may have delivered it before this
    // command arrived; what matters is that it was applied once and left the queue.
    assert.ok(flushed.affected <= 1, JSON.stringify(flushed));
    const applied = await h.applied();
    assert.equal(applied.length, 1, JSON.stringify(applied));
    assert.equal(applied[0].user, 'alice');
    assert.equal(applied[0].path, '/api/projects/p1/tasks');
    assert.equal(applied[0].key, write.body.idempotencyKey);
    assert.equal(JSON.parse(applied[0].body).title, 'from an npm-installed outbox');
    const state = await page.evaluate(() => window.site.client.list());
    assert.deepEqual(state.records, []);
  }));
}, { name: 'a site using the package', setup: () => ({ www: join(site, 'public'), requireWorker: false }) });
