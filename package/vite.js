/**
 * sw-outbox/vite — puts the outbox into a Vite build.
 *
 * Vite bundles pages, not service workers: it does not follow `importScripts`, and a
 * module worker could not call it anyway. So this plugin copies the outbox's worker
 * files (`sw.js` and `pkg/`) into the build output as they are, and writes the site's
 * worker script beside the pages with the site's configuration: the shell to precache
 * (by default every file of the build) and the site's build id (a hash of that build),
 * which names the shell cache so a new deploy gets a new cache.
 *
 * In `vite dev` the same worker script is served, with no shell (`precache: []`): dev
 * modules change on every edit and must not be served from a cache.
 *
 * @example
 *   // vite.config.js
 *   import swOutbox from 'sw-outbox/vite';
 *   export default { plugins: [swOutbox({ config: { apiPrefix: '/api/' } })] };
 */
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';

/** @import { OutboxConfig } from './outbox-protocol.js' */
/** @import { Plugin } from 'vite' */

/** The outbox's own files, copied under `dir` (the shim loads them with importScripts;
 * the module's bytes are in pkg/sw_outbox_wasm.js). */
const RUNTIME = ['sw.js', 'pkg/build.js', 'pkg/sw_outbox.js', 'pkg/sw_outbox_wasm.js'];

/**
 * @typedef {object} SwOutboxOptions
 * @property {Omit<OutboxConfig, 'precache' | 'build'>} [config] the worker's
 *   configuration (`self.SW_OUTBOX_CONFIG`), every field but `precache`
 * @property {'bundle' | string[] | ((files: string[]) => string[])} [precache='bundle']
 *   the app shell: `'bundle'` is `./` and every file of the build (source maps aside);
 *   a list is taken as it is (`[]`: no shell, e.g. when Workbox or Serwist precaches);
 *   a function gets that list and returns the one to use (to drop large assets or add
 *   files of `public/`). URLs are relative to the worker script, i.e. to Vite's `base`.
 * @property {string} [shellBuild] the site's build id naming the shell cache; default:
 *   a hash of the build's files when there is a shell, none without one
 * @property {string} [swFileName='sw.js'] the site's worker script, written at the root
 *   of the output; register it with `scope: import.meta.env.BASE_URL`
 * @property {string} [dir='sw-outbox'] the output folder receiving the outbox's files
 */

/**
 * The Vite plugin.
 * @param {SwOutboxOptions} [options]
 * @returns {Plugin}
 */
export default function swOutbox(options = {}) {
  const { config = {}, precache = 'bundle', shellBuild, swFileName = 'sw.js', dir = 'sw-outbox' } = options;
  for (const field of ['precache', 'build']) {
    if (field in config) throw new Error(`sw-outbox/vite: config.${field} is set by the plugin (use its own options)`);
  }
  if (shellBuild !== undefined && !/^[\w.-]+$/.test(shellBuild)) {
    throw new Error('sw-outbox/vite: shellBuild may hold letters, digits, ".", "_" and "-" only');
  }
  /** @param {string} f */
  const runtimeFile = (f) => readFileSync(new URL(f, import.meta.url));
  let base = '/';

  return {
    name: 'sw-outbox',
    configResolved(resolved) {
      base = resolved.base;
    },
    configureServer(server) {
      const script = workerScript(config, [], undefined, dir);
      server.middlewares.use((req, res, next) => {
        const path = (req.url ?? '').split('?')[0];
        const file = path === base + swFileName ? null : RUNTIME.find((f) => path === `${base}${dir}/${f}`);
        if (path !== base + swFileName && !file) return next();
        res.setHeader('Content-Type', 'text/javascript');
        res.setHeader('Cache-Control', 'no-cache');
        res.end(file ? runtimeFile(file) : script);
      });
    },
    generateBundle: {
      // After Vite's own plugins, so the pages (emitted by its HTML plugin) are there.
      order: 'post',
      handler(_, bundle) {
        // An SSR build has no pages to serve offline.
        if (this.environment && this.environment.config.consumer !== 'client') return;
        const files = Object.keys(bundle).filter((name) => !name.endsWith('.map')).sort();
        const bundled = ['./', ...files.map((name) => `./${name}`)];
        const shell = precache === 'bundle' ? bundled
          : typeof precache === 'function' ? precache(bundled) : precache;
        const hash = createHash('sha256');
        for (const name of files) {
          const out = bundle[name];
          hash.update(name).update('\0').update(out.type === 'chunk' ? out.code : out.source).update('\0');
        }
        const build = shellBuild ?? (shell.length ? hash.digest('hex').slice(0, 12) : undefined);
        for (const f of RUNTIME) this.emitFile({ type: 'asset', fileName: `${dir}/${f}`, source: runtimeFile(f) });
        this.emitFile({ type: 'asset', fileName: swFileName, source: workerScript(config, shell, build, dir) });
      },
    },
  };
}

/**
 * The site's worker script: its configuration, then the outbox's shim. Paths are
 * relative to the script itself, so it works under any `base`.
 * @param {object} config
 * @param {string[]} precache
 * @param {string | undefined} shellBuild
 * @param {string} dir
 * @returns {string}
 */
function workerScript(config, precache, shellBuild, dir) {
  return [
    '// Written by sw-outbox/vite: the outbox\'s configuration, then its worker.',
    `self.SW_OUTBOX_CONFIG = ${JSON.stringify({ ...config, precache }, null, 2)};`,
    ...(shellBuild ? [`self.SW_OUTBOX_SHELL_BUILD = ${JSON.stringify(shellBuild)};`] : []),
    `self.SW_OUTBOX_BASE = ${JSON.stringify(`./${dir}/`)};`,
    `importScripts(${JSON.stringify(`./${dir}/sw.js`)});`,
    '',
  ].join('\n');
}
