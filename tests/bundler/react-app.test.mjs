// A React app built with Vite and the packed package, as an adopter's would be: `npm pack
// ./package`, a fresh app in a temporary folder with `sw-outbox` installed from that
// tarball, React and ReactDOM, JSX compiled by Vite itself (no React plugin), the
// `sw-outbox/vite` plugin, and its components reading the outbox through
// `useOutbox` (`sw-outbox/react`). Its `dist/` is served by the reference server (pages
// and API on one origin). In every engine the harness runs: a write made offline is
// answered 202 and the rendered pending count becomes 1; back online, a flush replays it
// once, the count goes back to 0 and the settled result (the created task with its server
// id, from MUTATION_SETTLED) is rendered. And the package README's TanStack Query recipe
// (@tanstack/react-query, `networkMode: 'always'`, `outbox.settlement`): a mutation made
// offline runs, stays pending while its write is queued, and succeeds with the server's
// answer once it is replayed.
//
// React, ReactDOM, TanStack Query and Vite are not fetched: the app links the repository's pinned copies
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
import { lacks } from '../e2e-engines/engines.mjs';
import { repoRoot } from '../e2e-engines/harness.mjs';
import { eventually, forEachEngine, withDiagnostics } from '../e2e-engines/outbox-helpers.mjs';

const run = promisify(execFile);
const npmEnv = { ...process.env, npm_config_update_notifier: 'false', npm_config_fund: 'false', npm_config_audit: 'false' };

const INDEX_HTML = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>a React app using sw-outbox</title></head>
<body><div id="root"></div><script type="module" src="/src/main.jsx"></script></body></html>
`;

const MAIN_JSX = `import { createRoot } from 'react-dom/client';
import { QueryClient, QueryClientProvider, useMutation } from '@tanstack/react-query';
import { registerOutbox } from 'sw-outbox';
import { useOutbox } from 'sw-outbox/react';

let outbox = null;

// The package README's TanStack Query recipe: never paused (the outbox answers offline),
// no retry of TanStack's own, and a queued write pending until the server applied it.
const queryClient = new QueryClient({ defaultOptions: { mutations: { networkMode: 'always', retry: 0 } } });

async function addTask(title) {
  const res = await fetch('/api/projects/p1/tasks', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': window.app.csrf, 'X-PM-Expected-Account': 'alice' },
    body: JSON.stringify({ title }),
  });
  if (res.status === 202) {
    const queued = await res.json();
    window.app.queued = queued;
    const settled = await outbox.settlement(queued.id);
    return JSON.parse(settled.body);
  }
  if (!res.ok) throw new Error('could not add the task (' + res.status + ')');
  return res.json();
}

function AddTask() {
  const mutation = useMutation({ mutationFn: addTask });
  window.app.mutate = mutation.mutate;
  return (
    <p>
      mutation: <span data-testid="mutation-status">{mutation.status}</span>
      {' '}<span data-testid="mutation-data">{mutation.data ? mutation.data.title + ' #' + mutation.data.id : ''}</span>
    </p>
  );
}

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
const render = (client) => root.render(
  <QueryClientProvider client={queryClient}>
    <Outbox outbox={client} />
    <AddTask />
  </QueryClientProvider>,
);
// Rendered before the client exists (the hook's initial state), then with it.
window.app = {};
render(null);
window.app.ready = registerOutbox({ scriptUrl: '/sw.js' }).then((client) => {
  outbox = window.app.client = client;
  render(client);
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
      ...['vite', 'react', 'react-dom', '@tanstack/react-query'].map((m) => join(repoRoot, 'node_modules', m))], { cwd: app, env: npmEnv });
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

/** Signs alice in on the server and in the worker; keeps the CSRF token on window.app. */
async function signIn(page) {
  const login = await page.evaluate(() => window.app.json('POST', '/api/auth/login', { userId: 'alice', password: 'alice' }));
  assert.equal(login.status, 200, JSON.stringify(login));
  await page.evaluate((token) => { window.app.csrf = token; }, login.body.csrfToken);
  const session = await page.evaluate(() => window.app.client.signedIn('alice'));
  assert.equal(session.ok, true, JSON.stringify(session));
  return login.body.csrfToken;
}

/** Loads the app and waits until the worker controls it and the state was read. */
async function openApp(h) {
  const page = h.browser.pages()[0] ?? await h.browser.newPage();
  await page.goto(`${h.baseUrl}/`);
  // Before the client exists the hook gives the initial state.
  await page.waitForFunction(() => document.querySelector('[data-testid="ready"]') !== null);
  await page.waitForFunction(() => Boolean(window.app?.ready));
  await page.evaluate(() => window.app.ready);
  await page.waitForFunction(() => document.querySelector('[data-testid="ready"]')?.textContent === 'true');
  return page;
}

forEachEngine((engine, harness) => {
  test('useOutbox renders the pending count of an offline write, and its settled result after the replay',
    withDiagnostics(harness, async () => {
      const h = harness();
      await h.reset();
      const page = await openApp(h);
      const csrf = await signIn(page);

      await h.setNetwork(false);
      const write = await page.evaluate((token) => window.app.json('POST', '/api/projects/p1/tasks',
        { title: 'from a React app' }, { 'X-CSRF-Token': token, 'X-PM-Expected-Account': 'alice' }), csrf);
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

  test('the README\'s TanStack Query recipe: offline, the mutation runs, stays pending while its write is queued, and succeeds with the server\'s answer after the replay',
    withDiagnostics(harness, async () => {
      const h = harness();
      await h.reset();
      const page = await openApp(h);
      await signIn(page);
      // The browser's own offline switch where it has one (TanStack's default networkMode
      // would pause the mutation there); else the server drops every connection.
      const offline = (on) => (lacks(engine, 'setOffline') ? h.setNetwork(!on) : h.setOffline(on));
      await offline(true);
      try {
        await page.evaluate(() => window.app.mutate('from TanStack Query'));
        await page.waitForFunction(() => window.app.queued?.queued === true, null, { timeout: 20000 });
        await page.waitForFunction(() => document.querySelector('[data-testid="pending-count"]')?.textContent === '1');
        await new Promise((r) => setTimeout(r, 1000));
        assert.deepEqual(await rendered(page, 'mutation-status'), ['pending'], 'pending while queued, not failed');
      } finally {
        await offline(false);
      }
      const queued = await page.evaluate(() => window.app.queued);
      await page.evaluate(() => window.app.client.flush());
      await page.waitForFunction(() => document.querySelector('[data-testid="mutation-status"]')?.textContent === 'success',
        null, { timeout: 30000 });
      const applied = await h.applied();
      assert.deepEqual(applied.map((a) => [a.user, a.key]), [['alice', queued.idempotencyKey]], 'applied once, as alice');
      const task = (await page.evaluate(() => window.app.json('GET', '/api/projects/p1/tasks'))).body.tasks[0];
      assert.deepEqual(await rendered(page, 'mutation-data'), [`from TanStack Query #${task.id}`], 'the mutation\'s data: the server\'s answer');
    }));
}, { name: 'a Vite + React app', setup: async () => ({ www: await buildApp(), requireWorker: false }) });
