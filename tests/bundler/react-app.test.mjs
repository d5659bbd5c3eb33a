// A React app built from the package README alone, as an adopter's would be: `npm pack
// ./package`, a fresh Vite app in a temporary folder with `sw-outbox` installed from that
// tarball, React, ReactDOM and TanStack Query, the `sw-outbox/vite` plugin, and the
// README's snippets copied as they are (each code block whose first line names its file,
// `// src/outbox.ts`, `// src/tasks.ts`, `// src/PendingBadge.tsx`), type-checked with
// `tsc --strict` and built by Vite. Only `src/main.jsx`, which puts them on a page and
// lets the test see what renders, is the test's own. Its `dist/` is served by the
// reference server, which checks the CSRF token of every write. In every engine the
// harness runs:
// - the TanStack Query recipe: an online add carries the CSRF token and succeeds with the
//   server's task; two offline adds are pending, each with its row, and after the replay
//   each mutation succeeds with its server id, applied once, while the task list is
//   fetched once for the replay run, not per write; `useOutbox` with a selector renders
//   a count only when it changes (counted renders), where the hook without one renders
//   on every change of the state;
// - an offline reload: `/auth/me` answered 503 by the worker, the page says no account,
//   and the page helper shows the account the worker holds and its pending write.
//
// React, ReactDOM, TanStack Query, Vite and TypeScript are not fetched: the app links the
// repository's pinned copies (package.json devDependencies, installed by `npm ci` from the
// lock file); the tarball has no dependencies, so its install is `--offline`.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { after, test } from 'node:test';
import { repoRoot } from '../e2e-engines/harness.mjs';
import { eventually, forEachEngine, withDiagnostics } from '../e2e-engines/outbox-helpers.mjs';

const run = promisify(execFile);
const npmEnv = { ...process.env, npm_config_update_notifier: 'false', npm_config_fund: 'false', npm_config_audit: 'false' };

/** The package README's files, in the order an adopter meets them. */
const README_FILES = ['src/outbox.ts', 'src/tasks.ts', 'src/PendingBadge.tsx'];

/**
 * The code blocks of `markdown` whose first line is `// <file>`, dedented (a block in a
 * list item is indented), by file.
 */
export function namedSnippets(markdown) {
  const found = new Map();
  for (const m of markdown.matchAll(/^( *)```\w*\n([\s\S]*?)^\1```$/gm)) {
    const code = m[2].split('\n').map((l) => l.slice(m[1].length)).join('\n');
    const name = /^\/\/ (src\/[\w./-]+)\n/.exec(code)?.[1];
    if (name) found.set(name, code);
  }
  return found;
}

const INDEX_HTML = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>a React app using sw-outbox</title></head>
<body><div id="root"></div><script type="module" src="/src/main.jsx"></script></body></html>
`;

// The test's own page around the README's modules. The root never re-renders, so each of
// its components renders only for its own hooks.
const MAIN_JSX = `import { createRoot } from 'react-dom/client';
import { QueryClientProvider, focusManager, useMutationState } from '@tanstack/react-query';
import { useOutbox } from 'sw-outbox/react';
import { outbox, session, checkSession } from './outbox';
import { queryClient, useAddTask, useTasks } from './tasks';
import { PendingBadge } from './PendingBadge';

const replayRuns = [];
outbox.on('MUTATIONS_REPLAYED', (m) => replayRuns.push(m));
outbox.on('MUTATIONS_PARTIAL', (m) => replayRuns.push(m));
window.app = { outbox, session, checkSession, queryClient, replayRuns, countRenders: [], idsRenders: [], stateRenders: 0, results: [] };
// The test counts the list's fetches: none on a focus change the browser's automation makes.
focusManager.setEventListener(() => () => {});

// With a selector: one entry per render, the count it rendered.
function CountWithSelector() {
  const count = useOutbox(outbox, (s) => s.pending.length);
  window.app.countRenders.push(count);
  return <p>selected count: <span data-testid="count">{count}</span></p>;
}

// A selector that builds a new array each time, with an equality: one entry per render.
const sameIds = (a, b) => a.length === b.length && a.every((id, i) => id === b[i]);
function IdsWithSelector() {
  const ids = useOutbox(outbox, (s) => s.pending.map((r) => r.id), sameIds);
  window.app.idsRenders.push(ids.join(','));
  return <p>pending ids: <span data-testid="ids">{ids.join(',')}</span></p>;
}

// Without one: renders on every change of the state.
function WholeState() {
  const { ready, account, accountFrom } = useOutbox(outbox);
  window.app.stateRenders += 1;
  return <p>ready: <span data-testid="ready">{String(ready)}</span>
    account: <span data-testid="account">{(account ?? '') + '/' + (accountFrom ?? '')}</span></p>;
}

function Tasks() {
  const tasks = useTasks('p1');
  const add = useAddTask('p1');
  const waiting = useMutationState({
    filters: { mutationKey: ['add-task', 'p1'], status: 'pending' },
    select: (m) => m.state.variables,
  });
  window.app.add = (title) => add.mutateAsync(title).then(
    (task) => { window.app.results.push({ title, task }); },
    (error) => { window.app.results.push({ title, error: String(error) }); },
  );
  return (
    <section>
      <ul>{(tasks.data ?? []).map((t) => (
        <li key={t.id} data-testid="task">{t.title} #{t.id}{t.pending ? ' (pending)' : ''}</li>
      ))}</ul>
      <p data-testid="waiting">{waiting.join('|')}</p>
    </section>
  );
}

createRoot(document.getElementById('root')).render(
  <>
    <CountWithSelector />
    <IdsWithSelector />
    <WholeState />
    <p data-testid="badge"><PendingBadge /></p>
    <QueryClientProvider client={queryClient}><Tasks /></QueryClientProvider>
  </>,
);
window.app.loaded = true;
`;

const VITE_CONFIG = `import swOutbox from 'sw-outbox/vite';

export default {
  plugins: [swOutbox({ config: { dbName: 'react-app-outbox' } })],
};
`;

// As an adopter's TypeScript app would check it (Vite's templates: bundler resolution,
// react-jsx), strict.
const TSCONFIG = JSON.stringify({
  compilerOptions: {
    strict: true, noEmit: true, target: 'es2022', module: 'esnext', moduleResolution: 'bundler',
    jsx: 'react-jsx', lib: ['es2022', 'dom', 'dom.iterable'], types: [], skipLibCheck: true,
  },
  include: ['src/**/*.ts', 'src/**/*.tsx'],
}, null, 2);

let dir;
let building;

/** The README's snippets, every one this app needs. */
async function readmeFiles() {
  const snippets = namedSnippets(await readFile(join(repoRoot, 'package/README.md'), 'utf8'));
  const missing = README_FILES.filter((f) => !snippets.has(f));
  if (missing.length) throw new Error(`package/README.md has no code block starting // ${missing.join(', // ')}`);
  return README_FILES.map((f) => [f, snippets.get(f)]);
}

/** Packs the package, makes the app, type-checks and builds it once; resolves with its dist/. */
function buildApp() {
  building ??= (async () => {
    for (const f of ['www/pkg/sw_outbox_wasm.js', 'www/pkg/sw_outbox.js', 'www/pkg/build.js']) {
      if (!existsSync(join(repoRoot, f))) throw new Error(`${f} is missing: run ./build.sh to build the worker`);
    }
    dir = await mkdtemp(join(tmpdir(), 'sw-outbox-react-'));
    const { stdout } = await run('npm', ['pack', './package', '--json', '--pack-destination', dir], { cwd: repoRoot, env: npmEnv });
    const [packed] = JSON.parse(stdout);
    const app = join(dir, 'app');
    await mkdir(join(app, 'src'), { recursive: true });
    await writeFile(join(app, 'package.json'), JSON.stringify({ name: 'a-react-app', version: '1.0.0', private: true, type: 'module' }));
    await run('npm', ['install', '--offline', '--no-audit', '--no-fund', join(dir, packed.filename),
      ...['vite', 'react', 'react-dom', '@tanstack/react-query', '@types/react'].map((m) => join(repoRoot, 'node_modules', m))],
    { cwd: app, env: npmEnv });
    for (const [file, code] of await readmeFiles()) await writeFile(join(app, file), code);
    await writeFile(join(app, 'index.html'), INDEX_HTML);
    await writeFile(join(app, 'src/main.jsx'), MAIN_JSX);
    await writeFile(join(app, 'vite.config.js'), VITE_CONFIG);
    await writeFile(join(app, 'tsconfig.json'), TSCONFIG);
    const tsc = createRequire(join(repoRoot, 'package.json')).resolve('typescript/bin/tsc');
    await run(process.execPath, [tsc, '-p', app], { cwd: app }).catch((err) => {
      throw new Error(`tsc --strict over the README's snippets failed:\n${err.stdout}${err.stderr}`);
    });
    await run(process.execPath, [join(app, 'node_modules/vite/bin/vite.js'), 'build', '--logLevel', 'warn'], { cwd: app });
    return join(app, 'dist');
  })();
  return building;
}

after(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** The rendered text of each element with a test id. */
const rendered = (page, id) => page.evaluate((t) => [...document.querySelectorAll(`[data-testid="${t}"]`)].map((n) => n.textContent), id);

/** Waits until the element with `id` reads `text`. */
const renderedAs = (page, id, text, timeout = 30000) => page.waitForFunction(
  ([t, want]) => document.querySelector(`[data-testid="${t}"]`)?.textContent === want, [id, text], { timeout });

/** Loads the app and waits until the worker controls it and the queue was read. */
async function openApp(h) {
  const page = h.browser.pages()[0] ?? await h.browser.newPage();
  await page.goto(`${h.baseUrl}/`);
  await page.waitForFunction(() => window.app?.loaded === true);
  await page.evaluate(() => window.app.outbox.controlled);
  await renderedAs(page, 'ready', 'true');
  return page;
}

/** Signs alice in on the server, then the README's checkSession tells the worker. */
async function signIn(page) {
  const login = await page.evaluate(async () => {
    const r = await fetch('/api/auth/login', {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ userId: 'alice', password: 'alice' }),
    });
    return r.status;
  });
  assert.equal(login, 200);
  await page.evaluate(() => window.app.checkSession());
  await renderedAs(page, 'account', 'alice/page');
  // The list, read again as the signed-in account (the one read before sign-in failed).
  await page.evaluate(() => window.app.queryClient.refetchQueries());
}

/** The server's GETs of p1's task list after `seq`. */
const listFetches = async (h, seq) => (await h.requests())
  .filter((r) => r.seq > seq && r.method === 'GET' && r.path === '/api/projects/p1/tasks');

forEachEngine((engine, harness) => {
  test('the README\'s TanStack Query recipe: online with its CSRF token; offline adds pending, each applied once, the list fetched once per replay run; a selector renders only its changes',
    withDiagnostics(harness, async () => {
      const h = harness();
      await h.reset();
      const page = await openApp(h);
      await signIn(page);

      // Online: the write goes through as the page made it, CSRF token included.
      await page.evaluate(() => window.app.add('added online'));
      const online = (await page.evaluate(() => window.app.results))[0];
      assert.equal(online.error, undefined, JSON.stringify(online));
      assert.equal(online.task.title, 'added online');
      const [write] = (await h.requests()).filter((r) => r.method === 'POST' && r.path === '/api/projects/p1/tasks');
      assert.equal(write.status, 201, JSON.stringify(write));
      assert.ok(write.csrf, 'the page\'s write carried X-CSRF-Token');

      // Offline (the server drops every connection: the browser sees no network change,
      // so TanStack's own refetch on reconnect stays out of the count): two adds.
      await h.setNetwork(false);
      await page.evaluate(() => { window.app.countRenders.length = 0; window.app.idsRenders.length = 0; window.app.stateRenders = 0; });
      await page.evaluate(() => { window.app.add('offline one'); window.app.add('offline two'); });
      await renderedAs(page, 'count', '2');
      await renderedAs(page, 'waiting', 'offline one|offline two');
      const rows = await rendered(page, 'task');
      assert.deepEqual(rows.filter((r) => r.endsWith('(pending)')).length, 2, JSON.stringify(rows));
      assert.deepEqual(await rendered(page, 'badge'), ['2 not sent yet']);
      assert.deepEqual(await h.applied().then((a) => a.length), 1, 'only the online add applied');

      const before = Math.max(...(await h.requests()).map((r) => r.seq));
      const runsBefore = await page.evaluate(() => window.app.replayRuns.length);
      await h.setNetwork(true);
      await page.evaluate(() => window.app.outbox.flush());
      await page.waitForFunction(() => window.app.results.length === 3, null, { timeout: 30000 });
      await renderedAs(page, 'count', '0');
      await renderedAs(page, 'waiting', '');
      const results = await page.evaluate(() => window.app.results);
      const applied = await h.applied();
      assert.deepEqual(applied.map((a) => [a.user, JSON.parse(a.body).title]),
        [['alice', 'added online'], ['alice', 'offline one'], ['alice', 'offline two']], 'each applied once, as alice');
      for (const r of results.slice(1)) {
        assert.equal(r.error, undefined, JSON.stringify(r));
        assert.equal(typeof r.task.id, 'number', `${r.title}: the server's task, its id: ${JSON.stringify(r)}`);
      }
      // The list: fetched once per replay run that delivered, not per write.
      const delivered = await eventually(async () => {
        const runs = (await page.evaluate(() => window.app.replayRuns)).slice(runsBefore)
          .filter((m) => (m.count ?? m.replayed) > 0);
        return runs.length ? runs : null;
      }, { what: 'a replay run that delivered' });
      await eventually(async () => (await listFetches(h, before)).length >= delivered.length, { what: 'the list refetched' });
      await new Promise((r) => setTimeout(r, 1500));
      const fetches = await listFetches(h, before);
      assert.equal(fetches.length, delivered.length,
        `GET /api/projects/p1/tasks ${fetches.length} times for ${delivered.length} replay run(s): ${JSON.stringify(delivered)}`);
      const titles = (await rendered(page, 'task')).map((t) => t.replace(/ #\d+$/, ''));
      assert.deepEqual(titles, ['added online', 'offline one', 'offline two'], 'the list as the server has it');

      // The selector's component rendered only when its count changed; the whole state's
      // rendered on every change (more often), so the selector is what saved the renders.
      const { countRenders, idsRenders, stateRenders } = await page.evaluate(() => ({
        countRenders: window.app.countRenders, idsRenders: window.app.idsRenders, stateRenders: window.app.stateRenders,
      }));
      const repeats = countRenders.filter((c, i) => i > 0 && c === countRenders[i - 1]);
      assert.deepEqual(repeats, [], `renders of the selected count: ${countRenders}`);
      // A new array per state, kept while equal: it too renders only when the ids changed.
      const idsRepeats = idsRenders.filter((c, i) => i > 0 && c === idsRenders[i - 1]);
      assert.deepEqual(idsRepeats, [], `renders of the selected ids: ${JSON.stringify(idsRenders)}`);
      assert.equal(idsRenders.at(-1), '', JSON.stringify(idsRenders));
      assert.deepEqual([countRenders[0], countRenders.at(-1)], [1, 0], `renders of the selected count: ${countRenders}`);
      assert.ok(stateRenders > countRenders.length, `without a selector ${stateRenders} renders, with one ${countRenders.length}`);
    }));

  test('an offline reload: /auth/me answered 503 by the worker, and the account the worker holds has its write pending',
    withDiagnostics(harness, async () => {
      const h = harness();
      await h.reset();
      let page = await openApp(h);
      await signIn(page);
      await h.setNetwork(false);
      try {
        const queued = await page.evaluate(async (csrf) => {
          const r = await fetch('/api/projects/p1/tasks', {
            method: 'POST', headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': csrf }, body: JSON.stringify({ title: 'before the reload' }),
          });
          return { status: r.status, body: await r.json() };
        }, await page.evaluate(() => window.app.session.csrfToken));
        assert.equal(queued.status, 202, JSON.stringify(queued));

        // Reloaded with the server unreachable: the shell from the precache, and the
        // README's checkSession meets the worker's 503 and says nothing.
        page = await openApp(h);
        const me = await page.evaluate(async () => {
          const r = await fetch('/api/auth/me');
          return { status: r.status, body: await r.json() };
        });
        assert.deepEqual(me, { status: 503, body: { error: 'offline' } });
        await renderedAs(page, 'account', 'alice/worker');
        await renderedAs(page, 'count', '1');
        assert.deepEqual(await rendered(page, 'badge'), ['1 not sent yet (offline, as alice)']);
        const pending = await page.evaluate(() => window.app.outbox.state.pending.map((r) => [r.id, r.ownerId, r.path]));
        assert.deepEqual(pending, [[queued.body.id, 'alice', '/projects/p1/tasks']]);
      } finally {
        await h.setNetwork(true);
      }
      // Back online, the page's word: the same account, and its write delivered.
      await page.evaluate(() => window.app.checkSession());
      await renderedAs(page, 'account', 'alice/page');
      await renderedAs(page, 'count', '0');
      const applied = await h.applied();
      assert.deepEqual(applied.map((a) => [a.user, JSON.parse(a.body).title]), [['alice', 'before the reload']]);
    }));
}, { name: 'a Vite + React app from the package README', setup: async () => ({ www: await buildApp(), requireWorker: false }) });
