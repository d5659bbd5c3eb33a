// Writes pkg/sw_outbox_wasm.js: the optimised module's bytes as a classic script,
// `self.SW_OUTBOX_WASM = "…";`, one character per byte (code 0-255), which www/sw.js
// loads with importScripts and www/worker.js imports. A script the worker loads is kept
// by the browser with the worker's version, so the module starts offline whatever the
// site's own code deletes from Cache Storage (issue 37).
//
// Why one character per byte and not base64: the text stays byte-aligned, so gzip finds
// the module's repeats as in the .wasm (measured on the 431,438-byte module: 181,194 B
// gzip -9 against the .wasm's 174,120, +4%; base64 226,921, +30%), and the decoding is a
// charCodeAt loop (no atob copy). Worker scripts are always read as UTF-8, where codes
// 128-255 take two bytes; only `"`, `\`, LF and CR need an escape in a string literal.
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const ESCAPES = { 0x22: '\\"', 0x5c: '\\\\', 0x0a: '\\n', 0x0d: '\\r' };

/** The module's bytes as a JavaScript string literal's contents. */
export function literal(bytes) {
  const parts = [];
  for (const b of bytes) parts.push(ESCAPES[b] ?? String.fromCharCode(b));
  return parts.join('');
}

const dir = process.argv[2] || 'www/pkg';
const bytes = readFileSync(join(dir, 'sw_outbox_bg.wasm'));
const script = Buffer.from(`self.SW_OUTBOX_WASM = "${literal(bytes)}";\n`, 'utf8');
writeFileSync(join(dir, 'sw_outbox_wasm.js'), script);
// The round trip, as sw.js decodes it.
const context = {};
new Function('self', script.toString('utf8'))(context);
const text = context.SW_OUTBOX_WASM;
let same = typeof text === 'string' && text.length === bytes.length;
for (let i = 0; same && i < bytes.length; i += 1) same = text.charCodeAt(i) === bytes[i];
if (!same) throw new Error('wasm-script: the script does not give the module back');
console.log(`wasm-script: ${dir}/sw_outbox_wasm.js, ${script.length} bytes for ${bytes.length} of module`);
