// Instantiates the optimised module through its own glue before it ships: a wasm-opt
// that breaks wasm-bindgen output fails here, not in a user's browser.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import vm from 'node:vm';

const dir = process.argv[2] || 'www/pkg';
const glue = readFileSync(join(dir, 'sw_outbox.js'), 'utf8');
const bytes = readFileSync(join(dir, 'sw_outbox_bg.wasm'));
const context = vm.createContext({ self: {}, console, TextEncoder, TextDecoder, WebAssembly, URL, bytes });
// The init argument is built inside the context: the glue checks its prototype.
vm.runInContext(`${glue}\nself.wasm_bindgen = wasm_bindgen;\nwasm_bindgen.initSync({ module: bytes });`, context);
const bindgen = context.self.wasm_bindgen;
for (const name of ['start', 'Outbox']) {
  if (typeof bindgen[name] !== 'function') throw new Error(`export ${name} missing`);
}
console.log(`check-wasm: ${bytes.length} bytes instantiate; exports start and Outbox present`);
