// The worker shim as the package ships it: www/sw.js without its comments and spaces
// (esbuild's whitespace and syntax minification; names are kept, so its globals,
// marks and messages read the same). The comments are the repository's documentation of
// the shim and are most of its bytes: 13.0 KB gzipped as written, 5.9 KB shipped. The
// demo serves www/sw.js as written; scripts/stage-package.mjs writes this one into the
// package and scripts/package-size.mjs measures it.
import { readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { transformSync } from 'esbuild';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');

/** The shipped text of www/sw.js. */
export function shippedSw(source = readFileSync(join(root, 'www/sw.js'), 'utf8')) {
  return transformSync(source, {
    loader: 'js',
    minifyWhitespace: true,
    minifySyntax: true,
    legalComments: 'none',
    banner: '/* sw-outbox service worker shim (sw-outbox/sw.js); its commented source is www/sw.js in the repository. */',
  }).code;
}
