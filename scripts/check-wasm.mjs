// Instantiates the optimised module through its own glue before it ships: a wasm-opt
// that breaks wasm-bindgen output fails here, not in a user's browser.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import vm from 'node:vm';

const dir = process.argv[2] || 'www/pkg';
const glue = readFileSync(join(dir, 'sw_outbox.js'), 'utf8');
const bytes = readFileSync(join(dir, 'sw_outbox_bg.wasm'));
const context = vm.createContext({ self: {}, console, TextEncoder, TextDecoder, WebAssembly, URL });
vm.runInContext(`${glue}\nself.wasm_bindgen = wasm_bindgen;`, context);
const bindgen = context.self.wasm_bindgen;
bindgen.initSync({ module: bytes });
for (const name of ['start', 'Outbox']) {
  if (typeof bindgen[name] !== 'function') throw new Error(`export ${name} missing`);
}
console.log(`check-wasm: ${bytes.length} bytes instantiate; exports start and Outbox present`);
