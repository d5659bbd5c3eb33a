// The package's TypeScript declarations, checked as an adopter gets them: the tarball of
// `npm pack ./package` (whose prepack generates outbox-client.d.ts and vite.d.ts from
// JSDoc) installed into a throwaway project, and `tsc --noEmit --strict` over
// consumer.ts, a fixture that uses every export. Two more checks keep the declarations
// from drifting: the fixture must name every export the declarations have, and the
// protocol's names (commands, messages, reasons, configuration fields) must be exactly
// the ones the Rust source knows. And the page code of the READMEs (every ```js block
// that calls the page helper and imports nothing but sw-outbox) is type-checked as an
// adopter's editor checks JavaScript (`checkJs`, strict) against the same tarball, the
// names it leaves to the reader (`user`, `render`, …) declared in readme-globals.d.ts.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { copyFile, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { after, before, test } from 'node:test';
import { repoRoot } from '../e2e/harness.mjs';

const run = promisify(execFile);
const npmEnv = { ...process.env, npm_config_update_notifier: 'false', npm_config_fund: 'false', npm_config_audit: 'false' };
const here = join(repoRoot, 'tests/types');

let dir;
let tsc; // { code, output } of the one tsc run over the fixture and drift.ts
let readmeTsc; // the same over the READMEs' page code
let readmeBlocks; // [file, source document, code]
let drift; // drift.ts: the Rust source's names, each list asserted equal to a type

/** Without comments, so names in examples or prose are not taken for declarations. */
const code = (text) => text.replace(/\/\*[\s\S]*?\*\//g, '').replace(/\/\/.*$/gm, '');

/** The names a declaration file exports, following `export * from './x.js'`. */
async function exportedNames(file) {
  const text = code(await readFile(file, 'utf8'));
  const names = [...text.matchAll(/^export\s+(?:declare\s+)?(?:interface|type|class|function|const|let|var|enum)\s+(\w+)/gm)]
    .map((m) => m[1]);
  if (/^export\s+default\b/m.test(text)) names.push('default');
  for (const m of text.matchAll(/^export\s+\*\s+from\s+'\.\/([\w.-]+)\.js'/gm)) {
    names.push(...await exportedNames(join(file, '..', `${m[1]}.d.ts`)));
  }
  return names;
}

/** The string literals of `Enum::Variant … => "literal"` arms in one Rust file. */
async function rustArms(file, enumName) {
  const text = await readFile(join(repoRoot, file), 'utf8');
  return [...text.matchAll(new RegExp(`${enumName}::\\w+(?:\\s*\\{\\s*\\.\\.\\s*\\})?\\s*=>\\s*"([^"]+)"`, 'g'))].map((m) => m[1]);
}

/** What the Rust side knows, read from its source. */
async function rustNames() {
  const protocol = await readFile(join(repoRoot, 'src/protocol/mod.rs'), 'utf8');
  const outgoing = /pub enum Outgoing \{([\s\S]*?)\n\}/.exec(protocol)?.[1] ?? '';
  const config = await readFile(join(repoRoot, 'src/core/config.rs'), 'utf8');
  const fields = /pub struct Config \{([\s\S]*?)\n\}/.exec(config)?.[1] ?? '';
  const attention = await rustArms('src/core/record.rs', 'AttentionReason');
  return {
    commands: await rustArms('src/protocol/mod.rs', 'Command'),
    messages: [...outgoing.matchAll(/#\[serde\(rename = "([A-Z_]+)"/g)].map((m) => m[1]),
    attention,
    blocks: [...await rustArms('src/core/planner.rs', 'BlockReason'), ...attention],
    stops: await rustArms('src/core/delivery.rs', 'StopReason'),
    config: [...fields.matchAll(/^\s*pub (\w+):/gm)].map((m) => m[1].replace(/_(\w)/g, (_, c) => c.toUpperCase())),
  };
}

/** The READMEs' page code: ```js blocks calling the page helper, importing only sw-outbox. */
async function readmePageCode() {
  const blocks = [];
  for (const doc of ['README.md', 'package/README.md']) {
    const text = await readFile(join(repoRoot, doc), 'utf8');
    for (const m of text.matchAll(/^( *)```js\n([\s\S]*?)^\1```$/gm)) {
      const code = m[2].split('\n').map((l) => l.slice(m[1].length)).join('\n');
      const imports = [...code.matchAll(/from '([^']+)'/g)].map((i) => i[1]);
      if (!/\boutbox\.\w+\(/.test(code) || /\brequire\(|importScripts\(|\bself\./.test(code)) continue;
      if (!imports.every((i) => i === 'sw-outbox' || i.startsWith('sw-outbox/'))) continue;
      blocks.push([`readme-${blocks.length + 1}.js`, doc, code]);
    }
  }
  return blocks;
}

const union = (names) => [...new Set(names)].map((n) => JSON.stringify(n)).join(' | ');

before(async () => {
  dir = await mkdtemp(join(tmpdir(), 'sw-outbox-types-'));
  const { stdout } = await run('npm', ['pack', './package', '--json', '--pack-destination', dir], { cwd: repoRoot, env: npmEnv });
  const [packed] = JSON.parse(stdout);
  await writeFile(join(dir, 'package.json'), JSON.stringify({ name: 'typed-site', version: '1.0.0', private: true, type: 'module' }));
  // The tarball has no dependencies; vite and @types/node (which a Vite config in
  // TypeScript needs) are linked from the repository's pinned copies.
  await run('npm', ['install', '--offline', '--no-audit', '--no-fund', join(dir, packed.filename),
    join(repoRoot, 'node_modules/vite'), join(repoRoot, 'node_modules/@types/node'),
    join(repoRoot, 'node_modules/react'), join(repoRoot, 'node_modules/@types/react')], { cwd: dir, env: npmEnv });
  await copyFile(join(here, 'consumer.ts'), join(dir, 'consumer.ts'));
  await copyFile(join(here, 'tsconfig.json'), join(dir, 'tsconfig.json'));

  const rust = await rustNames();
  for (const [what, names] of Object.entries(rust)) {
    if (!names.length) throw new Error(`found no ${what} in the Rust source: has it moved? (see rustNames)`);
  }
  drift = `// Generated by types.test.mjs from the Rust source.
import type { AttentionReason, BlockReason, CommandType, OutboxConfig, StopReason, WorkerMessage } from 'sw-outbox';
type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends (<T>() => T extends B ? 1 : 2) ? true : false;
export const commands: Equal<CommandType, ${union(rust.commands)}> = true;
export const messages: Equal<WorkerMessage['type'], ${union(rust.messages)}> = true;
export const attention: Equal<AttentionReason, ${union(rust.attention)}> = true;
export const blocks: Equal<BlockReason, ${union(rust.blocks)}> = true;
export const config: Equal<keyof OutboxConfig, ${union(rust.config)}> = true;
export const stops: Equal<StopReason, ${union(rust.stops)}> = true;
`;
  await writeFile(join(dir, 'drift.ts'), drift);

  const tscBin = createRequire(join(repoRoot, 'package.json')).resolve('typescript/bin/tsc');
  tsc = await run(process.execPath, [tscBin, '--noEmit', '--strict', '-p', dir], { cwd: dir })
    .then(({ stdout }) => ({ code: 0, output: stdout }), (err) => ({ code: err.code, output: `${err.stdout}${err.stderr}` }));

  const readmeDir = join(dir, 'readme');
  await mkdir(readmeDir);
  readmeBlocks = await readmePageCode();
  // Each block a module of its own (its own `outbox`, or the reader's).
  for (const [file, , code] of readmeBlocks) await writeFile(join(readmeDir, file), `${code}\nexport {};\n`);
  await copyFile(join(here, 'readme-globals.d.ts'), join(readmeDir, 'readme-globals.d.ts'));
  await writeFile(join(readmeDir, 'tsconfig.json'), JSON.stringify({
    compilerOptions: {
      allowJs: true, checkJs: true, strict: true, noEmit: true, target: 'es2022', module: 'nodenext',
      moduleResolution: 'nodenext', lib: ['es2022', 'dom', 'dom.iterable'], types: [], skipLibCheck: true,
    },
    include: ['*.js', '*.d.ts'],
  }));
  await writeFile(join(readmeDir, 'package.json'), JSON.stringify({ type: 'module' }));
  readmeTsc = await run(process.execPath, [tscBin, '-p', readmeDir], { cwd: readmeDir })
    .then(({ stdout }) => ({ code: 0, output: stdout }), (err) => ({ code: err.code, output: `${err.stdout}${err.stderr}` }));
});

after(async () => {
  if (dir) await rm(dir, { recursive: true, force: true });
});

test('tsc --noEmit --strict passes over the fixture, against the installed tarball', () => {
  const errors = tsc.output.split('\n').filter((l) => !l.startsWith('drift.ts')).join('\n').trim();
  assert.equal(errors, '', errors);
  // Drift errors are the last test's to report.
  assert.ok(tsc.code === 0 || tsc.output.includes('drift.ts('), tsc.output);
});

test('the fixture uses every export of sw-outbox, sw-outbox/vite and sw-outbox/react', async () => {
  const fixture = code(await readFile(join(here, 'consumer.ts'), 'utf8'));
  const installed = join(dir, 'node_modules/sw-outbox');
  const main = await exportedNames(join(installed, 'index.d.ts'));
  const vite = await exportedNames(join(installed, 'vite.d.ts'));
  assert.ok(main.includes('registerOutbox') && main.includes('OutboxConfig') && vite.includes('default'),
    `the export lists were read: ${main} / ${vite}`);
  const unused = main.filter((n) => !new RegExp(`\\b${n}\\b`).test(fixture));
  assert.deepEqual(unused, [], `exports of sw-outbox the fixture does not use: ${unused}`);
  assert.match(fixture, /import swOutbox\b[^;]*from 'sw-outbox\/vite'/, 'the vite default export');
  const unusedVite = vite.filter((n) => n !== 'default' && !new RegExp(`\\b${n}\\b`).test(fixture));
  assert.deepEqual(unusedVite, [], `exports of sw-outbox/vite the fixture does not use: ${unusedVite}`);
  const react = await exportedNames(join(installed, 'react.d.ts'));
  assert.ok(react.includes('useOutbox'), `the export list was read: ${react}`);
  const unusedReact = react.filter((n) => !new RegExp(`import \\{[^}]*\\b${n}\\b[^}]*\\} from 'sw-outbox/react'`).test(fixture));
  assert.deepEqual(unusedReact, [], `exports of sw-outbox/react the fixture does not import: ${unusedReact}`);
});

test('the declarations name exactly the commands, messages, reasons and config fields of the Rust source', () => {
  const errors = tsc.output.split('\n').filter((l) => l.startsWith('drift.ts')).join('\n').trim();
  assert.equal(errors, '', `outbox-protocol.d.ts and the Rust source disagree:\n${errors}\nthe lists read from Rust (drift.ts):\n${drift}`);
});

test('the READMEs\' page code type-checks against the package (checkJs, strict)', () => {
  assert.ok(readmeBlocks.length >= 5, `blocks found: ${readmeBlocks.map(([f, d]) => `${f} (${d})`)}`);
  const where = readmeBlocks.map(([file, doc, code]) => `${file}: ${doc}, the block starting ${JSON.stringify(code.split('\n')[0])}`).join('\n');
  assert.equal(readmeTsc.output.trim(), '', `${readmeTsc.output}\n${where}`);
  assert.equal(readmeTsc.code, 0);
});
