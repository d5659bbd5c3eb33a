// Applies binaryen's name map to the glue. `wasm-opt
// --minify-imports-and-exports-and-modules` gives the module's imports (about 260
// `__wbg_<name>_<16 hex digits>`, each spelt once in each file, whose hashes compress
// badly), their module and its exports short names, and prints the map as JSON. This
// renames the same names in the glue wasm-bindgen generated, before esbuild minifies it:
// the import object's keys and its module's key, and every `wasm.<export>` read (the
// only way the glue reaches an export). A name not found exactly where it is expected
// fails the build; check-wasm.mjs then instantiates the pair, so a name renamed on one
// side only never reaches a user's browser.
//
//   wasm-opt in.wasm … --minify-imports-and-exports-and-modules -o out.wasm > map.json
//   node scripts/apply-name-map.mjs sw_outbox.js map.json out.wasm
import { readFileSync, writeFileSync } from 'node:fs';

const [glueFile, mapFile, wasmFile] = process.argv.slice(2);
if (!glueFile || !mapFile || !wasmFile) {
  throw new Error('usage: apply-name-map.mjs <glue.js> <map.json> <minified.wasm>');
}
let glue = readFileSync(glueFile, 'utf8');
const map = JSON.parse(readFileSync(mapFile, 'utf8'));
const literal = (s) => s.replace(/[.*+?^${}()|[\]\\/]/g, '\\$&');

/** Replaces the matches of `find` (a regexp source), which must be exactly `times`. */
function replaceExactly(find, to, times, what) {
  const re = new RegExp(find, 'g');
  const found = (glue.match(re) ?? []).length;
  if (found !== times) throw new Error(`${what}: found ${found} times in the glue, expected ${times}`);
  glue = glue.replace(re, to);
}

// Imports: each is one key of the glue's import object, `<name>: function`.
for (const [, name, short] of map.imports) {
  replaceExactly(`(?<![\\w$])${literal(name)}(?=: function)`, short, 1, `import ${name}`);
}
// Their module: the map names the old one; the minified module's imports (read by the
// engine, not by hand) name the new one.
const minified = new WebAssembly.Module(readFileSync(wasmFile));
const before = new Set(map.imports.map(([module]) => module));
const after = new Set(WebAssembly.Module.imports(minified).map((i) => i.module));
if (before.size !== 1 || after.size !== 1) {
  throw new Error(`expected one import module, found ${[...before]} renamed to ${[...after]}`);
}
const [from] = before;
const [to] = after;
replaceExactly(`"${literal(from)}": import0`, `"${to}": import0`, 1, `import module ${from}`);
// Exports: every read through `wasm.`; an export the glue never reads is left.
let exportsRead = 0;
for (const [name, short] of map.exports) {
  const read = new RegExp(`(?<![\\w$])wasm\\.${literal(name)}(?![\\w$])`, 'g');
  if (!read.test(glue)) continue;
  glue = glue.replace(read, `wasm.${short}`);
  exportsRead += 1;
}
// And the other way round: every `wasm.<name>` the glue now reads is an export of the
// minified module (a read the map missed would be `undefined` in a user's browser).
const exported = new Set(WebAssembly.Module.exports(minified).map((e) => e.name));
const missing = [...new Set([...glue.matchAll(/(?<![\w$])wasm\.([\w$]+)/g)].map((m) => m[1]))].filter((n) => !exported.has(n));
if (missing.length) throw new Error(`the glue reads exports the module does not have: ${missing.join(', ')}`);
writeFileSync(glueFile, glue);
console.log(`apply-name-map: ${map.imports.length} imports (module ${to}) and ${exportsRead} exports the glue reads renamed`);
