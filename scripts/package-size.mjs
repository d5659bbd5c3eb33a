// The size line of package/README.md, measured from the build: the worker's files as the
// package ships them (`sw.js`, `worker.js` and every file under `pkg/` in
// package/package.json's `files`, taken from www/, where ./build.sh puts them; sw.js
// as shipped, without its comments: scripts/shipped-sw.mjs), each gzipped at level 9,
// summed. The module ships once, as base64 in pkg/sw_outbox_wasm.js;
// the printout sets its gzip beside the raw .wasm's.
//
//   node scripts/package-size.mjs           prints the measure and the README's claim
//   node scripts/package-size.mjs --write   rewrites the README's line to the measure
//
// tests/docs/claims.test.mjs holds the README to it, so a build that grows or shrinks the
// worker fails there until the line is written again.
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { gzipSync } from 'node:zlib';
import { shippedSw } from './shipped-sw.mjs';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const README = join(root, 'package/README.md');

/** The line's shape; the number is KiB (1024 bytes), rounded. */
const LINE = /^Size: the worker's files \(`sw\.js` and `pkg\/`: the WebAssembly module, its glue and its loaders\) are (\d+) KiB gzipped\.$/m;

/** The worker's files the package ships (package/package.json `files`), as built in www/. */
export function workerFiles() {
  const { files } = JSON.parse(readFileSync(join(root, 'package/package.json'), 'utf8'));
  return files.filter((f) => f === 'sw.js' || f === 'worker.js' || f.startsWith('pkg/')).map((f) => join('www', f));
}

/** Each worker file's gzip -9 size, and their total, in bytes. */
export function measure() {
  const files = workerFiles().map((file) => {
    const path = join(root, file);
    if (!existsSync(path)) throw new Error(`${file} is missing: run ./build.sh to build the worker first`);
    // sw.js ships without its comments (scripts/shipped-sw.mjs).
    const bytes = file === join('www', 'sw.js') ? Buffer.from(shippedSw()) : readFileSync(path);
    return { file, raw: bytes.length, gzip: gzipSync(bytes, { level: 9 }).length };
  });
  return { files, total: files.reduce((sum, f) => sum + f.gzip, 0) };
}

/** The KiB the README claims, or null when its line is missing. */
export function claimedKiB(text = readFileSync(README, 'utf8')) {
  const m = LINE.exec(text);
  return m ? Number(m[1]) : null;
}

/** The line for `totalBytes`. */
export function sizeLine(totalBytes) {
  return `Size: the worker's files (\`sw.js\` and \`pkg/\`: the WebAssembly module, its glue and its loaders) are ${Math.round(totalBytes / 1024)} KiB gzipped.`;
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const { files, total } = measure();
  for (const f of files) console.log(`${f.file}${f.file.endsWith('sw.js') ? ' (as shipped)' : ''}: ${f.raw} B, ${f.gzip} B gzip -9`);
  const wasm = join(root, 'www/pkg/sw_outbox_bg.wasm');
  if (existsSync(wasm)) {
    const bytes = readFileSync(wasm);
    console.log(`(the raw module, not shipped: www/pkg/sw_outbox_bg.wasm: ${bytes.length} B, ${gzipSync(bytes, { level: 9 }).length} B gzip -9)`);
  }
  console.log(`total: ${total} B gzip -9 = ${(total / 1024).toFixed(1)} KiB; package/README.md says ${claimedKiB()} KiB`);
  if (process.argv.includes('--write')) {
    const text = readFileSync(README, 'utf8');
    if (!LINE.test(text)) throw new Error('package/README.md has no size line to rewrite');
    writeFileSync(README, text.replace(LINE, sizeLine(total)));
    console.log(`package/README.md: ${sizeLine(total)}`);
  }
}
