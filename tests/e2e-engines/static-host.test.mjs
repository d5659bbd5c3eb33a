// The app shell behind a static host this project did not write: Express's own
// `express.static` (serve-static), set up as its docs say, serving a site whose files
// all carry one fixed time, as reproducible builds leave them (SOURCE_DATE_EPOCH, Nix,
// many container images). Such a host validates by that time and the size alone
// (`Last-Modified`, and a weak `ETag` of size and time), so a redeployed `index.html` of
// the same length — a new asset hash in it, say — is answered 304 to a revalidation.
//
// Checked: a deploy precaches the new `index.html`, not the copy in the browser's HTTP
// cache. The worker's install fetches what it precaches with `cache: 'no-store'`; with the
// default mode the install revalidates, gets that 304, and puts the old page into the new
// build's cache: Chromium and Firefox did so when the mode was the default (this test
// failed there); WebKit precached the new page either way. (The browser's update check of `sw.js` meets the same 304, which the
// worker cannot help: this deploy changes the length of `sw.js` so that the check sees
// it, and the package README asks hosts for validators that follow the bytes.)
import assert from 'node:assert/strict';
import { cp, mkdir, mkdtemp, readdir, rm, stat, utimes, writeFile } from 'node:fs/promises';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import express from 'express';
import { repoRoot } from './harness.mjs';
import { eventually, forEachEngine, withDiagnostics } from './outbox-helpers.mjs';

/** One fixed file time for every file, as a reproducible build sets it. */
const FIXED_TIME = new Date('2026-01-01T00:00:00Z');

const siteWorker = (shellBuild) => `// The site's worker script.
self.SW_OUTBOX_CONFIG = { precache: ['/', '/site.js'], dbName: 'static-host-outbox' };
self.SW_OUTBOX_SHELL_BUILD = '${shellBuild}';
self.SW_OUTBOX_BASE = '/sw-outbox/';
importScripts('/sw-outbox/sw.js');
`;

/** The page; `deploy` is five letters in both deploys, so the file keeps its length. */
const siteHtml = (deploy) => `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>a statically hosted site</title>
<script type="module" src="/site.js"></script></head>
<body><h1>${deploy} deploy</h1></body></html>
`;

const SITE_JS = `import { registerOutbox } from '/sw-outbox/outbox-client.js';
window.site = { ready: registerOutbox({ scriptUrl: '/sw.js' }).then((client) => client.controlled) };
`;

let dir;
let site;
let server;
let origin;

/** Every file of the site gets FIXED_TIME. */
async function fixTimes(folder) {
  for (const entry of await readdir(folder, { withFileTypes: true })) {
    const path = join(folder, entry.name);
    if (entry.isDirectory()) await fixTimes(path);
    await utimes(path, FIXED_TIME, FIXED_TIME);
  }
}

before(async () => {
  dir = await mkdtemp(join(tmpdir(), 'sw-outbox-static-host-'));
  site = join(dir, 'public');
  await mkdir(join(site, 'sw-outbox'), { recursive: true });
  await cp(join(repoRoot, 'www/sw.js'), join(site, 'sw-outbox/sw.js'));
  await cp(join(repoRoot, 'www/outbox-client.js'), join(site, 'sw-outbox/outbox-client.js'));
  await cp(join(repoRoot, 'www/pkg'), join(site, 'sw-outbox/pkg'), { recursive: true });
  await writeFile(join(site, 'sw.js'), siteWorker('s1'));
  await writeFile(join(site, 'index.html'), siteHtml('first'));
  await writeFile(join(site, 'site.js'), SITE_JS);
  await fixTimes(site);
  const app = express();
  app.use(express.static(site));
  await new Promise((resolve, reject) => {
    server = app.listen(0, '127.0.0.1', resolve).on('error', reject);
  });
  origin = `http://127.0.0.1:${server.address().port}`;
});

after(async () => {
  if (server) {
    const closed = new Promise((resolve) => server.close(resolve));
    server.closeAllConnections();
    await closed;
  }
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** The status the host answers a GET of `path` with `headers`. Through node:http, not
 * fetch: fetch adds `Cache-Control: no-cache` to a request carrying validators, and the
 * host rightly answers that in full. */
const statusOf = (path, headers) => new Promise((resolve, reject) => {
  http.get(`${origin}${path}`, { headers }, (res) => {
    res.resume();
    resolve(res.statusCode);
  }).on('error', reject);
});

/** The text of the `/` entry in the cache named `name`, or null. */
const cachedPage = (page, name) => page.evaluate(async (n) => {
  if (!(await caches.has(n))) return null;
  const hit = await (await caches.open(n)).match('/');
  return hit ? hit.text() : null;
}, name);

forEachEngine((engine, harness) => {
  test('a deploy precaches the new page, not the HTTP cache\'s copy that a time-validating host calls fresh', withDiagnostics(harness, async () => {
    const h = harness();
    const page = h.browser.pages()[0] ?? await h.browser.newPage();
    await page.goto(`${origin}/`);
    await page.evaluate(() => window.site.ready);
    const build = await page.evaluate(async () => {
      const names = await caches.keys();
      return names.length === 1 ? names[0] : JSON.stringify(names);
    });
    assert.match(build, /^sw-outbox-.+-s1$/, 'one cache, of the first deploy');
    assert.match(await cachedPage(page, build) ?? '', /first deploy/);

    // The host's answer to a revalidation of the page, as the browser will send it.
    const first = await fetch(`${origin}/`);
    const validators = { 'If-None-Match': first.headers.get('etag'), 'If-Modified-Since': first.headers.get('last-modified') };
    await first.arrayBuffer();

    // The next deploy: a page of the same length, every file at the fixed time again.
    const html = join(site, 'index.html');
    const length = (await stat(html)).size;
    await writeFile(html, siteHtml('later'));
    await writeFile(join(site, 'sw.js'), siteWorker('s22'));
    await fixTimes(site);
    assert.equal((await stat(html)).size, length, 'same length');
    assert.equal(await statusOf('/', validators), 304, 'the host calls the old copy fresh: the hazard is real');

    await page.evaluate(async () => (await navigator.serviceWorker.getRegistration()).update());
    const next = build.replace(/-s1$/, '-s22');
    const text = await eventually(async () => {
      const names = await page.evaluate(() => caches.keys());
      return names.length === 1 && names[0] === next ? cachedPage(page, next) : null;
    }, { timeout: 30000, what: `only ${next} left` });
    assert.match(text, /later deploy/, 'the new build\'s cache holds the new page');
  }));
}, { name: 'a static host that validates by file time' });
