// Renames the module's imports from the glue (`__wbg_<name>_<16 hex digits>`, about 200
// of them) to short names, in the .wasm's import section and in the glue's import
// object alike: each long name is spelt once in each file, and its hash compresses
// badly (about 3.9 KB of the two files gzipped). check-wasm.mjs then instantiates the
// pair, so a name renamed on one side only fails the build, not a user's browser.
//
//   node scripts/short-imports.mjs www/pkg
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const dir = process.argv[2] || 'www/pkg';
const wasmFile = join(dir, 'sw_outbox_bg.wasm');
const glueFile = join(dir, 'sw_outbox.js');
const bytes = readFileSync(wasmFile);
let glue = readFileSync(glueFile, 'utf8');

function leb(buf, at) {
  let n = 0, shift = 0, b;
  do { b = buf[at++]; n += (b & 0x7f) * 2 ** shift; shift += 7; } while (b & 0x80);
  return [n, at];
}
function lebBytes(n) {
  const out = [];
  do { let b = n & 0x7f; n = Math.floor(n / 128); if (n) b |= 0x80; out.push(b); } while (n);
  return Buffer.from(out);
}
const utf8 = (s) => Buffer.from(s, 'utf8');
function name(buf, at) {
  const [len, p] = leb(buf, at);
  return [buf.subarray(p, p + len).toString('utf8'), p + len];
}
function limits(buf, at) {
  const flags = buf[at++];
  let p = leb(buf, at)[1];
  if (flags & 1) p = leb(buf, p)[1];
  return p;
}

// base-36-ish names: a, b, ..., z, A, ..., Z, a0, ... (valid JS identifiers and keys)
const ALPHA = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ';
const ALNUM = ALPHA + '0123456789_$';
function shortName(i) {
  let s = ALPHA[i % ALPHA.length];
  i = Math.floor(i / ALPHA.length);
  while (i > 0) { i -= 1; s += ALNUM[i % ALNUM.length]; i = Math.floor(i / ALNUM.length); }
  return s;
}

// The exports the glue reaches as `<exports>.<name>`: renamed where the glue spells them
// only as such property reads (`memory` and other short names are left as they are).
let exportsRenamed = 0;
function exportSection(body, end) {
  const [count, p0] = leb(bytes, body);
  const out = [lebBytes(count)];
  let p = p0;
  for (let i = 0; i < count; i++) {
    let [field, p1] = name(bytes, p);
    const q = leb(bytes, p1 + 1)[1];
    if (field.length > 8 && /^[A-Za-z_$][\w$]*$/.test(field)) {
      const uses = glue.split(new RegExp(`\\.${field.replace(/\$/g, '\\$')}(?![\\w$])`)).length - 1;
      const all = glue.split(field).length - 1;
      if (uses > 0 && uses === all) {
        const short = `$${shortName(exportsRenamed++)}`;
        glue = glue.replace(new RegExp(`\\.${field.replace(/\$/g, '\\$')}(?![\\w$])`, 'g'), `.${short}`);
        field = short;
      }
    }
    out.push(lebBytes(utf8(field).length), utf8(field), bytes.subarray(p1, q));
    p = q;
  }
  if (p !== end) throw new Error('export section not read to its end');
  const section = Buffer.concat(out);
  return Buffer.concat([Buffer.from([7]), lebBytes(section.length), section]);
}

if (bytes.readUInt32LE(0) !== 0x6d736100) throw new Error(`${wasmFile} is not a WebAssembly module`);
const parts = [bytes.subarray(0, 8)];
let at = 8, renamed = 0;
const taken = new Set();
while (at < bytes.length) {
  const id = bytes[at];
  const [size, body] = leb(bytes, at + 1);
  const end = body + size;
  if (id === 7) {
    parts.push(exportSection(body, end));
    at = end;
    continue;
  }
  if (id !== 2) {
    parts.push(bytes.subarray(at, end));
    at = end;
    continue;
  }
  const [count, p0] = leb(bytes, body);
  const out = [lebBytes(count)];
  let p = p0;
  for (let i = 0; i < count; i++) {
    const [mod, p1] = name(bytes, p);
    let [field, p2] = name(bytes, p1);
    const kind = bytes[p2];
    let q = p2 + 1;
    if (kind === 0) q = leb(bytes, q)[1]; // function: type index
    else if (kind === 1) q = limits(bytes, q + 1); // table: reftype, limits
    else if (kind === 2) q = limits(bytes, q); // memory: limits
    else if (kind === 3) q += 2; // global: valtype, mutability
    else throw new Error(`import kind ${kind} not known`);
    // Only the glue's own imports, whose key occurs exactly once in the glue.
    if (mod === './sw_outbox_bg.js' && /^__wbg|^__wbindgen/.test(field)) {
      const key = `${field}:`;
      const first = glue.indexOf(key);
      if (first < 0 || glue.indexOf(key, first + 1) >= 0) {
        throw new Error(`import ${field}: its key occurs ${first < 0 ? 'nowhere' : 'more than once'} in the glue`);
      }
      let short;
      do { short = shortName(renamed++); } while (taken.has(short));
      taken.add(short);
      glue = glue.slice(0, first) + `${short}:` + glue.slice(first + key.length);
      field = short;
    }
    out.push(lebBytes(utf8(mod).length), utf8(mod), lebBytes(utf8(field).length), utf8(field), bytes.subarray(p2, q));
    p = q;
  }
  if (p !== end) throw new Error('import section not read to its end');
  const section = Buffer.concat(out);
  parts.push(Buffer.from([2]), lebBytes(section.length), section);
  at = end;
}
writeFileSync(wasmFile, Buffer.concat(parts));
writeFileSync(glueFile, glue);
console.log(`short-imports: ${renamed} imports and ${exportsRenamed} exports renamed`);
