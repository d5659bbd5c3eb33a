// The npm package as a site would use it: `npm pack` of this repository, the tarball
// installed into a throwaway site, the site's own worker script configuring the shim from
// node_modules (SW_OUTBOX_BASE), the page helper imported from node_modules too, all
// served by the reference server; one write made offline → 202 → flush → applied once.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { after, before, test } from 'node:test';
import { repoRoot, startHarness } from './harness.mjs';
import { withDiagnostics } from './outbox-helpers.mjs';

const run = promisify(execFile);
const npmEnv = { ...process.env, npm_config_update_notifier: 'false', npm_config_fund: 'false', npm_config_audit: 'false' };

/** The files a site needs, and only those (plus what npm always adds). */
const EXPECTED_FILES = [
  'README.md', 'package.json',
  'www/outbox-client.d.ts', 'www/outbox-client.js', 'www/sw.js',
  'www/pkg/build.js', 'www/pkg/sw_outbox.js', 'www/pkg/sw_outbox_bg.wasm',
];

const SITE_SW = `// The site's own worker script: its configuration, then the installed shim.
self.SW_OUTBOX_CONFIG = {
  precache: ['/', '/site.js'],
  dbName: 'site-outbox',
};
self.SW_OUTBOX_BASE = '/node_modules/sw-outbox/www/';
importScripts('/node_modules/sw-outbox/www/sw.js');
`;

const SITE_HTML = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>a site using sw-outbox</title>
<script type="module" src="/site.js"></script></head>
<body><h1>A site</h1></body></html>
`;

const SITE_JS = `import { registerOutbox } from '/node_modules/sw-outbox/www/outbox-client.js';
window.site = {};
window.site.ready = registerOutbox({ scriptUrl: '/sw.js' }).then((client) => { window.site.client = client; });
window.site.json = async (method, path, body, headers = {}) => {
  const r = await fetch(path, {
    method, headers: { 'Content-Type': 'application/json', ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: r.status, body: await r.json().catch(() => null) };
};
`;

let h;
let dir;
let packed;

before(async () => {
  for (const f of ['www/pkg/sw_outbox_bg.wasm', 'www/pkg/sw_outbox.js', 'www/pkg/build.js']) {
    if (!existsSync(join(repoRoot, f))) throw new Error(`${f} is missing: run ./build.sh to build the worker`);
  }
  dir = await mkdtemp(join(tmpdir(), 'sw-outbox-npm-'));
  const { stdout } = await run('npm', ['pack', '--json', '--pack-destination', dir], { cwd: repoRoot, env: npmEnv });
  [packed] = JSON.parse(stdout);

  const site = join(dir, 'site');
  await mkdir(site);
  await writeFile(join(site, 'package.json'), JSON.stringify({ name: 'outbox-site', version: '1.0.0', private: true }));
  // A local tarball without dependencies installs without the network.
  await run('npm', ['install', '--offline', '--no-audit', '--no-fund', join(dir, packed.filename)], { cwd: site, env: npmEnv });
  await writeFile(join(site, 'sw.js'), SITE_SW);
  await writeFile(join(site, 'index.html'), SITE_HTML);
  await writeFile(join(site, 'site.js'), SITE_JS);
  h = await startHarness({ www: site, requireWorker: false });
});

after(async () => {
  await h?.close();
  if (dir) await rm(dir, { recursive: true, force: true });
});

test('npm pack ships the worker, its shim, the page helper and its types', () => {
  assert.deepEqual(packed.files.map((f) => f.path).sort(), [...EXPECTED_FILES].sort());
  const wasm = packed.files.find((f) => f.path === 'www/pkg/sw_outbox_bg.wasm');
  assert.ok(wasm.size > 1000, `the .wasm is real: ${wasm.size} bytes`);
});

test('a site using the installed package queues a write offline and replays it once', withDiagnostics(() => h, async () => {
  const page = h.context.pages()[0] ?? await h.context.newPage();
  await page.goto(`${h.baseUrl}/`);
  await page.evaluate(() => window.site.ready);
  assert.ok(await page.evaluate(() => navigator.serviceWorker.controller?.scriptURL.endsWith('/sw.js')));

  // The shim found its module under node_modules and cached it with the site's shell.
  const cached = await page.evaluate(async () => {
    const names = await caches.keys();
    const urls = [];
    for (const n of names) for (const r of await (await caches.open(n)).keys()) urls.push(new URL(r.url).pathname);
    return { names, urls };
  });
  assert.equal(cached.names.length, 1, JSON.stringify(cached));
  assert.match(cached.names[0], /^sw-outbox-/);
  for (const p of ['/', '/site.js', '/node_modules/sw-outbox/www/pkg/sw_outbox_bg.wasm']) {
    assert.ok(cached.urls.includes(p), `${p} cached: ${cached.urls}`);
  }

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
  assert.equal(flushed.affected, 1);
  const applied = await h.applied();
  assert.equal(applied.length, 1, JSON.stringify(applied));
  assert.equal(applied[0].user, 'alice');
  assert.equal(applied[0].path, '/api/projects/p1/tasks');
  assert.equal(applied[0].key, write.body.idempotencyKey);
  assert.equal(JSON.parse(applied[0].body).title, 'from an npm-installed outbox');
  const state = await page.evaluate(() => window.site.client.list());
  assert.deepEqual(state.records, []);
}));
