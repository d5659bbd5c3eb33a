// The app shell behind a static host this project did not write: Express's own
// `express.static` (serve-static), set up as its docs say, serving a site whose files
// all carry one fixed time, as reproducible builds leave them (SOURCE_DATE_EPOCH, Nix,
// many container images). Such a host validates by that time and the size alone
// (`Last-Modified`, and a weak `ETag` of size and time), so a redeployed `index.html` of
// the same length — a new asset hash in it, say — is answered 304 to a revalidation.
//
// Checked: a deploy precaches the new `index.html`, not the copy in the browser's HTTP
// cache. An update's install (an active worker exists) fetches what it precaches with
// `cache: 'no-store'` (a registration's first install takes the HTTP cache's copies of
// the files the page just loaded, first-load.test.mjs); with the
// default mode the install revalidates, gets that 304, and puts the old page into the new
// build's cache: Chromium and Firefox did so when the mode was the default (this test
// failed there); WebKit precached the new page either way. (The browser's update check of `sw.js` meets the same 304, which the
// worker cannot help: this deploy changes the length of `sw.js` so that the check sees
// it, and the package README asks hosts for validators that follow the bytes.)
//
// And the package README's Express setting ("Serving the worker's files", its `// server.js`
// block run as it is): with it, a deploy that keeps `sw.js`'s length and time is seen by
// the browser's update check, which the default setting answers 304.
import assert from 'node:assert/strict';
import { cp, mkdir, mkdtemp, readdir, rm, stat, utimes, writeFile } from 'node:fs/promises';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readFile } from 'node:fs/promises';
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
/** A second site behind the README's setting. */
const readmeHost = { site: '', server: null, origin: '' };

/** The package README's Express lines (its `// server.js` block), run on `app` for `folder`. */
async function readmeExpressSetting(app, folder) {
  const readme = await readFile(join(repoRoot, 'package/README.md'), 'utf8');
  const block = /^```js\n\/\/ server\.js\n([\s\S]*?)^```$/m.exec(readme)?.[1];
  if (!block) throw new Error('package/README.md has no ```js block starting // server.js');
  new Function('app', 'express', block.replace("'dist'", JSON.stringify(folder)))(app, express);
}

async function listen(app) {
  let s;
  await new Promise((resolve, reject) => {
    s = app.listen(0, '127.0.0.1', resolve).on('error', reject);
  });
  return { server: s, origin: `http://127.0.0.1:${s.address().port}` };
}

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
  ({ server, origin } = await listen(app));

  readmeHost.site = join(dir, 'readme-host');
  await cp(site, readmeHost.site, { recursive: true });
  await writeFile(join(readmeHost.site, 'sw.js'), siteWorker('r1'));
  await fixTimes(readmeHost.site);
  const readmeApp = express();
  await readmeExpressSetting(readmeApp, readmeHost.site);
  ({ server: readmeHost.server, origin: readmeHost.origin } = await listen(readmeApp));
});

after(async () => {
  for (const s of [server, readmeHost.server]) {
    if (!s) continue;
    const closed = new Promise((resolve) => s.close(resolve));
    s.closeAllConnections();
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

  test('behind the package README\'s Express setting, a deploy that keeps sw.js\'s length and time is seen by the update check', withDiagnostics(harness, async () => {
    const h = harness();
    const page = h.browser.pages()[0] ?? await h.browser.newPage();
    {
      const o = readmeHost.origin;
      await page.goto(`${o}/`);
      await page.evaluate(() => window.site.ready);
      const sw = await fetch(`${o}/sw.js`);
      assert.deepEqual([sw.headers.get('etag'), sw.headers.get('last-modified'), sw.headers.get('cache-control')],
        [null, null, 'no-cache'], 'no validator made of time and size; no-cache');
      await sw.arrayBuffer();
      const first = await page.evaluate(async () => (await caches.keys()).filter((n) => n.startsWith('sw-outbox-')));
      assert.equal(first.length, 1, JSON.stringify(first));
      assert.match(first[0], /-r1$/);

      // The next deploy: sw.js of the same length, every file at the fixed time again. The
      // default setting calls the old copy fresh (the first test's hazard, for sw.js).
      const worker = join(readmeHost.site, 'sw.js');
      const length = (await stat(worker)).size;
      await writeFile(worker, siteWorker('r2'));
      await fixTimes(readmeHost.site);
      assert.equal((await stat(worker)).size, length, 'same length');
      const defaultWorker = join(site, 'sw.js');
      const defaults = await fetch(`${origin}/sw.js`);
      await defaults.arrayBuffer();
      await writeFile(defaultWorker, (await readFile(defaultWorker, 'utf8')).replace(/'(\w+)';\n/, (m, b) => `'${b.slice(0, -1)}x';\n`));
      await fixTimes(site);
      assert.equal(await statusOf('/sw.js', { 'If-None-Match': defaults.headers.get('etag'), 'If-Modified-Since': defaults.headers.get('last-modified') }),
        304, 'behind express.static\'s defaults the same change is answered 304');

      await page.evaluate(async () => (await navigator.serviceWorker.getRegistration()).update());
      const next = first[0].replace(/-r1$/, '-r2');
      await eventually(async () => {
        const names = await page.evaluate(() => caches.keys());
        return names.includes(next) && !names.includes(first[0]);
      }, { timeout: 30000, what: `the new deploy's cache ${next}, and the old one gone` });
    }
  }));
}, { name: 'a static host that validates by file time' });
