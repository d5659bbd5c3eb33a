// A React app built with Vite and the packed package, as an adopter's would be: `npm pack
// ./package`, a fresh app in a temporary folder with `sw-outbox` installed from that
// tarball, React and ReactDOM, JSX compiled by Vite itself (no React plugin), the
// `sw-outbox/vite` plugin, and its components reading the outbox through
// `useOutbox` (`sw-outbox/react`). Its `dist/` is served by the reference server (pages
// and API on one origin). In every engine the harness runs: a write made offline is
// answered 202 and the rendered pending count becomes 1; back online, a flush replays it
// once, the count goes back to 0 and the settled result (the created task with its server
// id, from MUTATION_SETTLED) is rendered.
//
// React, ReactDOM and Vite are not fetched: the app links the repository's pinned copies
// (package.json devDependencies, installed by `npm ci` from the lock file); the tarball
// has no dependencies, so its install is `--offline`.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { after, test } from 'node:test';
import { repoRoot } from '../e2e-engines/harness.mjs';
import { eventually, forEachEngine, withDiagnostics } from '../e2e-engines/outbox-helpers.mjs';

const run = promisify(execFile);
const npmEnv = { ...process.env, npm_config_update_notifier: 'false', npm_config_fund: 'false', npm_config_audit: 'false' };

const INDEX_HTML = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>a React app using sw-outbox</title></head>
<body><div id="root"></div><script type="module" src="/src/main.jsx"></script></body></html>
`;

const MAIN_JSX = `import { createRoot } from 'react-dom/client';
import { registerOutbox } from 'sw-outbox';
import { useOutbox } from 'sw-outbox/react';

function Outbox({ outbox }) {
  const { ready, pending, settled, delivery } = useOutbox(outbox);
  return (
    <section>
      <p>ready: <span data-testid="ready">{String(ready)}</span></p>
      <p>waiting to be sent: <span data-testid="pending-count">{pending.length}</span></p>
      <p data-testid="stopped-by">{delivery.stoppedBy ?? ''}</p>
      <ul>
        {settled.map((s) => {
          const task = JSON.parse(s.body ?? '{}');
          return <li key={s.id} data-testid="settled">{task.title} #{task.id}</li>;
        })}
      </ul>
    </section>
  );
}

const root = createRoot(document.getElementById('root'));
// Rendered before the client exists (the hook's initial state), then with it.
root.render(<Outbox outbox={null} />);
window.app = {};
window.app.ready = registerOutbox({ scriptUrl: '/sw.js' }).then((client) => {
  window.app.client = client;
  root.render(<Outbox outbox={client} />);
  return client.controlled;
});
window.app.json = async (method, path, body, headers = {}) => {
  const r = await fetch(path, {
    method, headers: { 'Content-Type': 'application/json', ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  return { status: r.status, body: await r.json().catch(() => null) };
};
`;

const VITE_CONFIG = `import swOutbox from 'sw-outbox/vite';

export default {
  plugins: [swOutbox({ config: { dbName: 'react-app-outbox' } })],
};
`;

let dir;
let building;

/** Packs the package, makes the app and builds it once; resolves with its dist/. */
function buildApp() {
  building ??= (async () => {
    for (const f of ['www/pkg/sw_outbox_bg.wasm', 'www/pkg/sw_outbox.js', 'www/pkg/build.js']) {
      if (!existsSync(join(repoRoot, f))) throw new Error(`${f} is missing: run ./build.sh to build the worker`);
    }
    dir = await mkdtemp(join(tmpdir(), 'sw-outbox-react-'));
    const { stdout } = await run('npm', ['pack', './package', '--json', '--pack-destination', dir], { cwd: repoRoot, env: npmEnv });
    const [packed] = JSON.parse(stdout);
    const app = join(dir, 'app');
    await mkdir(join(app, 'src'), { recursive: true });
    await writeFile(join(app, 'package.json'), JSON.stringify({ name: 'a-react-app', version: '1.0.0', private: true, type: 'module' }));
    await run('npm', ['install', '--offline', '--no-audit', '--no-fund', join(dir, packed.filename),
      ...['vite', 'react', 'react-dom'].map((m) => join(repoRoot, 'node_modules', m))], { cwd: app, env: npmEnv });
    await writeFile(join(app, 'index.html'), INDEX_HTML);
    await writeFile(join(app, 'src/main.jsx'), MAIN_JSX);
    await writeFile(join(app, 'vite.config.js'), VITE_CONFIG);
    await run(process.execPath, [join(app, 'node_modules/vite/bin/vite.js'), 'build', '--logLevel', 'warn'], { cwd: app });
    return join(app, 'dist');
  })();
  return building;
}

after(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** The rendered text of a test id. */
const rendered = (page, id) => page.evaluate((t) => [...document.querySelectorAll(`[data-testid="${t}"]`)].map((n) => n.textContent), id);

forEachEngine((engine, harness) => {
  test('useOutbox renders the pending count of an offline write, and its settled result after the replay',
    withDiagnostics(harness, async () => {
      const h = harness();
      const page = h.browser.pages()[0] ?? await h.browser.newPage();
      await page.goto(`${h.baseUrl}/`);
      // Before the client exists the hook gives the initial state.
      await page.waitForFunction(() => document.querySelector('[data-testid="ready"]') !== null);
      await page.waitForFunction(() => window.app?.ready);
      await page.evaluate(() => window.app.ready);
      await page.waitForFunction(() => document.querySelector('[data-testid="ready"]')?.textContent === 'true');

      const login = await page.evaluate(() => window.app.json('POST', '/api/auth/login', { userId: 'alice', password: 'alice' }));
      assert.equal(login.status, 200, JSON.stringify(login));
      const session = await page.evaluate(() => window.app.client.signedIn('alice'));
      assert.equal(session.ok, true, JSON.stringify(session));

      await h.setNetwork(false);
      const write = await page.evaluate((token) => window.app.json('POST', '/api/projects/p1/tasks',
        { title: 'from a React app' }, { 'X-CSRF-Token': token, 'X-PM-Expected-Account': 'alice' }), login.body.csrfToken);
      assert.equal(write.status, 202, JSON.stringify(write));
      await page.waitForFunction(() => document.querySelector('[data-testid="pending-count"]')?.textContent === '1');
      assert.deepEqual(await h.applied(), []);

      await h.setNetwork(true);
      const flushed = await page.evaluate(() => window.app.client.flush());
      assert.equal(flushed.ok, true, JSON.stringify(flushed));
      await page.waitForFunction(() => document.querySelector('[data-testid="pending-count"]')?.textContent === '0');
      const applied = await eventually(async () => {
        const a = await h.applied();
        return a.length ? a : null;
      }, { what: 'the replay applied' });
      assert.deepEqual(applied.map((a) => [a.user, a.key]), [['alice', write.body.idempotencyKey]], 'applied once, as alice');
      const task = (await page.evaluate(() => window.app.json('GET', '/api/projects/p1/tasks'))).body.tasks[0];
      await page.waitForFunction(() => document.querySelectorAll('[data-testid="settled"]').length === 1);
      assert.deepEqual(await rendered(page, 'settled'), [`from a React app #${task.id}`], 'the settled result, its server id');
    }));
}, { name: 'a Vite + React app', setup: async () => ({ www: await buildApp(), requireWorker: false }) });
