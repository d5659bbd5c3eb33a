// What the READMEs claim, held to what is built and run: the package README's size line
// against the worker's files as ./build.sh built them (scripts/package-size.mjs), the
// top-level README's length, commands and code, and that the documents' links and
// docs/TESTING.md's suite list follow the repository. (The package README's recipes are
// compiled under `tsc --strict` and run in tests/bundler/react-app.test.mjs.)
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { test } from 'node:test';
import { claimedKiB, measure } from '../../scripts/package-size.mjs';

const run = promisify(execFile);
const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const read = (file) => readFile(join(root, file), 'utf8');

/** The fenced code blocks of a markdown text, with their language. */
const codeBlocks = (text) => [...text.matchAll(/^```(\w*)\n([\s\S]*?)^```$/gm)].map((m) => ({ lang: m[1], code: m[2] }));

test('the package README\'s size is the built worker\'s, within a KiB', () => {
  const { files, total } = measure();
  const claimed = claimedKiB();
  assert.notEqual(claimed, null, 'package/README.md has its size line');
  assert.ok(files.some((f) => f.file.startsWith('www/pkg/')) && files.some((f) => f.file === 'www/sw.js'), JSON.stringify(files));
  assert.ok(Math.abs(claimed * 1024 - total) <= 1024,
    `package/README.md says ${claimed} KiB, the build is ${(total / 1024).toFixed(1)} KiB (${total} B gzip -9): `
    + 'run `node scripts/package-size.mjs --write` after the build');
});

test('README.md is read in five minutes: at most 250 lines, its two commands those of build.sh', async () => {
  const readme = await read('README.md');
  const lines = readme.split('\n').length;
  assert.ok(lines <= 250, `README.md has ${lines} lines`);
  const build = await read('build.sh');
  for (const command of ['demo', 'test']) {
    assert.match(readme, new RegExp(`^\\./build\\.sh ${command}\\b`, 'm'), `README.md shows ./build.sh ${command}`);
    assert.match(build, new RegExp(`^\\s*${command}\\)`, 'm'), `build.sh has a ${command} command`);
  }
});

test('README.md\'s JavaScript parses', async () => {
  const blocks = codeBlocks(await read('README.md')).filter((b) => b.lang === 'js');
  assert.ok(blocks.length >= 1, 'README.md has its adoption example');
  const dir = await mkdtemp(join(tmpdir(), 'sw-outbox-readme-'));
  try {
    for (const [i, { code }] of blocks.entries()) {
      const file = join(dir, `block-${i}.mjs`);
      await writeFile(file, code);
      await run(process.execPath, ['--check', file]).catch((err) => {
        assert.fail(`README.md's js block ${i + 1} does not parse:\n${code}\n${err.stderr}`);
      });
    }
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test('the documents\' links to files of the repository resolve', async () => {
  const broken = [];
  for (const doc of ['README.md', 'docs/TESTING.md', 'package/README.md', 'docs/ARCHITECTURE.md']) {
    const text = await read(doc);
    for (const [, target] of text.matchAll(/\]\(([^)\s]+)\)/g)) {
      if (/^[a-z]+:/i.test(target) || target.startsWith('#')) continue;
      const path = target.split('#')[0];
      if (!existsSync(join(root, dirname(doc), path))) broken.push(`${doc}: ${target}`);
    }
  }
  assert.deepEqual(broken, []);
});

test('docs/TESTING.md has a row for every suite build.sh runs', async () => {
  const build = await read('build.sh');
  const body = /^run_tests\(\) \{([\s\S]*?)^\}/m.exec(build)?.[1] ?? '';
  const suites = [...body.matchAll(/^\s*suite\s+("?)([\w$-]+)\1/gm)].map((m) => m[2])
    .flatMap((s) => (s.includes('$engine') ? ['chromium', 'firefox', 'webkit'].map((e) => s.replace('$engine', e)) : [s]));
  assert.ok(suites.length >= 10 && suites.includes('lint'), `suites read from build.sh: ${suites}`);
  const testing = await read('docs/TESTING.md');
  const rows = new Set([...testing.matchAll(/^\| `?([\w-]+)`? \|/gm)].map((m) => m[1]));
  const missing = suites.filter((s) => !rows.has(s));
  assert.deepEqual(missing, [], `suites of build.sh without a row in docs/TESTING.md: ${missing}`);
});
