/* sw-outbox for a module service worker (`navigator.serviceWorker.register(url,
 * {type: 'module'})`, as SvelteKit's and Vite's development servers register theirs),
 * where `importScripts` does not exist: `import 'sw-outbox/worker'` sets up the same
 * outbox as `importScripts('…/sw.js')` does in a classic worker, with the module's bytes
 * in the worker's own scripts. A bundler that inlines it into a classic worker (SvelteKit's
 * production build) gets the same. Define `self.SW_OUTBOX_CONFIG` in a module imported
 * before this one: imports run before the importing module's own code. */
import './pkg/build.js';
import './pkg/sw_outbox.js';
import './pkg/sw_outbox_wasm.js';
import './sw.js';
