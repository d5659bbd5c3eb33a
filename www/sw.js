/* sw-outbox service worker: a classic worker shim around the WASM outbox.
 *
 * It adds every listener during the first evaluation (listeners added after an await are
 * ignored), starts loading the module at once, and hands each event to Rust once the
 * module is ready, so nothing that arrives while it loads is dropped. The module's bytes
 * come in a script (`pkg/sw_outbox_wasm.js`, made by build.sh) loaded here with
 * `importScripts`: the browser keeps such scripts with the worker's version, so a worker
 * restarted offline still starts, whatever the site's other code does to Cache Storage
 * (SvelteKit's documented worker deletes every cache but its own, issue 37).
 *
 * Whether a request is the outbox's is decided here, synchronously, from the
 * configuration alone, before the module has loaded (contract 1, r3): a request that is
 * not the outbox's gets no `respondWith`, so the browser, or the next listener of the
 * site's worker (Workbox, Serwist), handles it as if the outbox were not there. The rule
 * is `core::route::owner`'s; `swOutboxRoute` below is its mirror, which
 * tests/service_worker_route.rs runs beside the Rust over every route class. The app
 * shell's answers (network first, the precached copy when that fails) need no module
 * either and are given here; API reads are answered here while the module loads. Only
 * the outbox's writes and auth routes wait for it.
 *
 * Install (precache) and activation (cache cleanup) stay here, in JavaScript: the app
 * shell's answers need them before the module has loaded. The cache name (`sw-outbox-<build>`) and the
 * cleanup rule (only older `sw-outbox-*` caches) are the ones `core::shell` states and
 * the Rust side reads the shell from.
 *
 * A site configures it by defining `self.SW_OUTBOX_CONFIG` before this script runs, in
 * its own worker script:
 *
 *   self.SW_OUTBOX_CONFIG = { precache: ['/', '/app.js'] };
 *   self.SW_OUTBOX_BASE = '/sw-outbox/';   // where this file and pkg/ are served
 *   importScripts('/sw-outbox/sw.js');
 *
 * `SW_OUTBOX_BASE` defaults to the registered script's directory (right when this file
 * itself is registered). Relative `precache` and `shellUrl` entries are resolved against
 * the registered script's URL. Unset fields take the defaults of the contract; without
 * SW_OUTBOX_CONFIG the demo's DEMO_CONFIG below applies.
 *
 * `self.SW_OUTBOX_SHELL_BUILD` (optional) is the site's own build id, e.g. a hash of its
 * shell: the cache is then `sw-outbox-<outbox build>-<site build>`, so a deploy that
 * changes only the site's files still precaches into a new cache, and activation deletes
 * the old one. It is not a configuration field: the Rust side only gets the composed
 * `build`.
 */
/* global wasm_bindgen */
'use strict';

/** A User Timing mark of the worker's start (`sw-outbox:<step>`): DevTools shows them,
 * and the benchmark reads them to time each step of a start (bench/run.mjs). */
const mark = (step) => { try { performance.mark(`sw-outbox:${step}`); } catch (e) { /* no User Timing */ } };
mark('script');

const BASE = new URL(self.SW_OUTBOX_BASE || './', self.location).href;

// ---- generated from Rust: begin
// Written by `SW_RULES_WRITE=1 cargo test --test sw_rules` from the Rust definitions
// (tests/sw_rules.rs); `cargo test` fails when it differs. Not edited by hand.
const SW_OUTBOX_RULES = {
  "authNames": [
    "auth",
    "login",
    "logout",
    "signin",
    "signout",
    "sign-in",
    "sign-out",
    "session",
    "sessions",
    "token",
    "tokens",
    "refresh",
    "oauth"
  ],
  "authParents": [
    "",
    "/api",
    "/accounts"
  ],
  "cachePrefix": "sw-outbox-",
  "cachesLock": "sw-outbox:caches",
  "config": {
    "apiPrefix": "/api/",
    "authRoutePattern": "^/(?:(?:api|accounts)/)?(?:auth|login|logout|signin|signout|sign-in|sign-out|sessions?|tokens?|refresh|oauth)(?:/|\\?|$)",
    "build": "dev",
    "dbName": null,
    "expectedAccountHeader": "X-PM-Expected-Account",
    "precache": [],
    "shellUrl": null,
    "skipWaiting": true,
    "staticRoutes": false
  },
  "database": {
    "keys": {
      "generation": "generation",
      "scope": "scope",
      "session": "current"
    },
    "name": "sw-outbox",
    "stores": {
      "mutations": "mutations",
      "session": "session"
    },
    "version": 3
  },
  "idempotencyKeyHeader": "Idempotency-Key",
  "notStarted": {
    "body": {
      "error": "the outbox could not start ({why}), so this write was neither sent nor stored: try again",
      "queued": false
    },
    "status": 503,
    "why": "{why}"
  },
  "offline": {
    "body": {
      "error": "offline"
    },
    "status": 503
  },
  "shellStatuses": [
    500,
    502,
    503,
    504
  ],
  "writeMethods": [
    "POST",
    "PUT",
    "PATCH",
    "DELETE"
  ]
};
// ---- generated from Rust: end

/** The demo's own settings: its app shell, and the key window of the reference server
 * it runs against (`--key-ttl 24h`, which `./build.sh demo` passes): a matching pair. */
const DEMO_CONFIG = {
  precache: ['./', './index.html', './app.js', './app.css', './outbox-client.js',
    './manifest.webmanifest', './icon.svg'],
  serverKeyTtlMs: 24 * 60 * 60 * 1000,
};

const CONFIG = Object.assign({}, self.SW_OUTBOX_CONFIG || DEMO_CONFIG);
// `sw.js?config=<json>` overrides fields, for tests and demos (the demo page passes its
// own `?swconfig=` through). A malformed value stops the worker from installing.
const OVERRIDE = new URL(self.location.href).searchParams.get('config');
if (OVERRIDE) Object.assign(CONFIG, JSON.parse(OVERRIDE));

// ---- early database: begin ----------------------------------------------------------
// The database, opened at the first evaluation (issue 36): the browser opens it while
// the module's scripts are parsed and the module decoded and instantiated, and the rows
// a start reads are read while it instantiates; the start adopts both
// (`worker::early`). Self-contained but for the generated block: the module's tests
// (tests/service_worker_early.rs) evaluate it on its own and hand its result to a start.

/** The database's name, version, stores and keys (`core::layout`, generated). */
const DB_LAYOUT = SW_OUTBOX_RULES.database;

/** Opens database `name` at the module's version: the connection, or null. One that
 * does not exist yet, or needs an upgrade, is left to the module, which holds the
 * schema: the upgrade is aborted here, so nothing is created or changed. */
function openEarly(name) {
  return new Promise((resolve) => {
    let open;
    let settled = false;
    const give = (db) => {
      if (settled) { if (db) db.close(); return; }
      settled = true;
      resolve(db);
    };
    try {
      open = indexedDB.open(name, DB_LAYOUT.version);
    } catch (e) {
      give(null);
      return;
    }
    open.onupgradeneeded = () => { try { open.transaction.abort(); } catch (e) { /* done */ } };
    open.onblocked = () => give(null);
    open.onerror = (e) => { e.preventDefault(); give(null); };
    open.onsuccess = () => {
      const db = open.result;
      db.onversionchange = () => db.close();
      give(db);
    };
  });
}

/** The rows a start reads, in one transaction: `{db, rows}`, or `{db}` when they could
 * not be read (the start reads them itself). */
function readEarly(db) {
  return new Promise((resolve) => {
    try {
      const { stores, keys } = DB_LAYOUT;
      const tx = db.transaction([stores.mutations, stores.session], 'readonly');
      const session = tx.objectStore(stores.session);
      const asked = {
        scope: session.get(keys.scope),
        generation: session.get(keys.generation),
        session: session.get(keys.session),
        all: tx.objectStore(stores.mutations).getAll(),
      };
      tx.oncomplete = () => {
        const rows = {};
        for (const [name, request] of Object.entries(asked)) rows[name] = request.result;
        resolve({ db, rows });
      };
      tx.onabort = () => resolve({ db });
    } catch (e) {
      resolve({ db });
    }
  });
}
// ---- early database: end ------------------------------------------------------------

/** The connection opened at the first evaluation, and the rows once asked for: the
 * first start takes them (`takeEarly`); a later one (after a failed start) opens and
 * reads itself. */
const DB_NAME = typeof CONFIG.dbName === 'string' && CONFIG.dbName ? CONFIG.dbName
  : (SW_OUTBOX_RULES.config.dbName ?? DB_LAYOUT.name);
let earlyDb = null;
let earlyOpening = openEarly(DB_NAME).then((db) => (earlyDb = db));
function takeEarly() {
  const opening = earlyOpening;
  earlyOpening = null;
  if (!opening) return null;
  // Already open: the read goes out now, before the module's decoding takes the thread.
  return earlyDb ? readEarly(earlyDb) : opening.then((db) => db && readEarly(db));
}

/**
 * The module's scripts: its glue and its bytes (half a megabyte of script text). A
 * browser keeps only the scripts a worker imported while it was installing, so the
 * first evaluation of a version imports them; a worker of that version started again
 * later (the browser stops idle workers) imports them only when an event first needs
 * the module (issue 36): a page's navigation and files, which the outbox does not
 * answer, then wait for no parse of the module's script. Where the engine does not say
 * the worker's state (Firefox), they are imported at once, as while installing. A
 * module worker (`sw-outbox/worker`, pkg/worker.js) has imported them already: there
 * `importScripts` throws.
 */
function importModuleScripts() {
  if (typeof self.SW_OUTBOX_WASM === 'string') return;
  importScripts(BASE + 'pkg/sw_outbox.js', BASE + 'pkg/sw_outbox_wasm.js');
  mark('module-scripts');
}
if (typeof self.SW_OUTBOX_WASM !== 'string') importScripts(BASE + 'pkg/build.js');
const RESTARTED = !!self.serviceWorker && self.serviceWorker.state === 'activated';
if (!RESTARTED) importModuleScripts();
mark('glue');
const SHELL_BUILD = self.SW_OUTBOX_SHELL_BUILD;
if (SHELL_BUILD !== undefined && !(typeof SHELL_BUILD === 'string' && /^[\w.-]+$/.test(SHELL_BUILD))) {
  throw new Error('sw-outbox: SW_OUTBOX_SHELL_BUILD may hold letters, digits, ".", "_" and "-" only');
}
CONFIG.build = (self.SW_OUTBOX_BUILD || SW_OUTBOX_RULES.config.build) + (SHELL_BUILD ? `-${SHELL_BUILD}` : '');
CONFIG.precache = (CONFIG.precache || SW_OUTBOX_RULES.config.precache).map((u) => new URL(u, self.location).href);
if (CONFIG.shellUrl) CONFIG.shellUrl = new URL(CONFIG.shellUrl, self.location).href;

const CACHE_PREFIX = SW_OUTBOX_RULES.cachePrefix;
const CACHE = CACHE_PREFIX + CONFIG.build;

/** The module's bytes, from pkg/sw_outbox_wasm.js's text (one character per byte). */
function moduleBytes() {
  const text = self.SW_OUTBOX_WASM;
  if (typeof text !== 'string') throw new Error('sw-outbox: pkg/sw_outbox_wasm.js did not load');
  const bytes = new Uint8Array(text.length);
  for (let i = 0; i < text.length; i += 1) bytes[i] = text.charCodeAt(i);
  return bytes;
}

// ---- route: begin -------------------------------------------------------------------
// The route rule and the answers that need no module. Self-contained but for the
// generated block above (only that and the platform's URL, RegExp, Response, fetch and
// caches): tests/service_worker_route.rs evaluates the two on their own and holds them
// to the Rust (`core::route::owner`, `core::shell`, `core::config::Config::default`).

/** Every configuration field's default (`Config::default`, generated). */
const CONFIG_DEFAULTS = SW_OUTBOX_RULES.config;

/** The statuses after which the shell's cached copy answers (`core::shell::use_shell`). */
const SHELL_STATUSES = SW_OUTBOX_RULES.shellStatuses;

/** The write methods (`core::route::WRITE_METHODS`). */
const WRITE_METHODS = SW_OUTBOX_RULES.writeMethods;

/** A page rather than an asset, by its path's last segment (`core::shell::is_page`). */
function isPage(url) {
  let path = url.split(/[?#]/)[0];
  const scheme = path.indexOf('://');
  if (scheme >= 0) {
    const slash = path.indexOf('/', scheme + 3);
    path = slash < 0 ? '/' : path.slice(slash);
  }
  const last = path.slice(path.lastIndexOf('/') + 1);
  if (last === '' || last === '.') return true;
  return /\.html?$/i.test(last) || !last.includes('.');
}

/**
 * The rule: `(method, url, navigate)` → `'write' | 'read' | 'auth'` (under `apiPrefix`),
 * `'observe'` (an auth route outside it: no respondWith, but the sign-in barrier is
 * raised, r4), `{shell: <cached URL>}` (the app shell's), or null (not the outbox's).
 * `config.precache` and `config.shellUrl` are absolute URLs here, as the module gets them.
 */
function swOutboxRoute(config, origin) {
  const prefix = config.apiPrefix ?? CONFIG_DEFAULTS.apiPrefix;
  const base = prefix.replace(/\/+$/, '');
  const auth = new RegExp(config.authRoutePattern ?? CONFIG_DEFAULTS.authRoutePattern, 'i');
  const precache = config.precache ?? CONFIG_DEFAULTS.precache;
  const shell = config.shellUrl ?? CONFIG_DEFAULTS.shellUrl ?? precache.find(isPage) ?? null;
  const underApi = (path) => path.startsWith(prefix) || path === base || path.startsWith(`${base}?`);
  return (method, url, navigate) => {
    let u;
    try { u = new URL(url); } catch (e) { return null; }
    if (u.origin !== origin) return null;
    const path = u.pathname + u.search;
    if (path.startsWith(prefix)) {
      if (auth.test(path)) return 'auth';
      return WRITE_METHODS.includes(method.toUpperCase()) ? 'write' : 'read';
    }
    if (auth.test(path)) return 'observe';
    if (!/^get$/i.test(method) || underApi(path)) return null;
    if (navigate) return shell === null ? null : { shell };
    const bare = url.split('#')[0];
    return precache.includes(bare) ? { shell: bare } : null;
  };
}

/** A JSON answer of the worker's own, never cached. */
function jsonAnswer(status, body) {
  return new Response(JSON.stringify(body), {
    status, headers: { 'Content-Type': 'application/json', 'Cache-Control': 'no-store' },
  });
}

/** A read (or auth request) to the network; `503 {"error":"offline"}` when it fails. */
async function networkOrOffline(request) {
  try {
    return await fetch(request);
  } catch (e) {
    return jsonAnswer(SW_OUTBOX_RULES.offline.status, SW_OUTBOX_RULES.offline.body);
  }
}

/** An auth request without the outbox's headers (they never go to an auth route). */
function withoutOutboxHeaders(request, config) {
  const names = [SW_OUTBOX_RULES.idempotencyKeyHeader,
    config.expectedAccountHeader ?? CONFIG_DEFAULTS.expectedAccountHeader];
  if (!names.some((n) => request.headers.has(n))) return request;
  const headers = new Headers(request.headers);
  for (const n of names) headers.delete(n);
  return new Request(request, { headers });
}

/** A write of the outbox's that arrived while the module cannot start: never sent
 * around the outbox (without its key and expected account), never claimed queued. */
function notStarted(why) {
  const { status, body, why: slot } = SW_OUTBOX_RULES.notStarted;
  return jsonAnswer(status, { ...body, error: body.error.replace(slot, () => why) });
}

/** The cached copy of `url` in the cache `cacheName` (never created by looking), or
 * null. A copy that had followed a redirect is re-made: browsers refuse a redirected
 * response for a navigation. */
async function shellCopy(cacheName, url) {
  try {
    if (!(await caches.has(cacheName))) return null;
    const hit = await (await caches.open(cacheName)).match(url);
    if (!hit || !hit.redirected) return hit ?? null;
    return new Response(await hit.arrayBuffer(), { status: hit.status, statusText: hit.statusText, headers: hit.headers });
  } catch (e) {
    return null;
  }
}

/** The shell's answer: the network's, unless it failed or answered a server error and
 * this build's cache holds the copy; without a copy the network's answer (or failure)
 * stands. */
async function shellAnswer(network, cacheName, url) {
  let answer = null;
  let failure = null;
  try {
    answer = await network;
  } catch (e) {
    failure = e;
  }
  if (answer && !SHELL_STATUSES.includes(answer.status)) return answer;
  const copy = await shellCopy(cacheName, url);
  if (copy) return copy;
  if (answer) return answer;
  throw failure;
}
// ---- route: end ---------------------------------------------------------------------

const route = swOutboxRoute(CONFIG, self.location.origin);

let loaded = null; // the Outbox once ready
let loading = null; // its promise
/** Whether this worker takes over as soon as it installed: the site's `skipWaiting`
 * (default true), or a page's `SKIP_WAITING` (a prompt-to-update flow) once it came. */
let skipRequested = (CONFIG.skipWaiting ?? CONFIG_DEFAULTS.skipWaiting) !== false;
let startup = null; // the flush run once per worker start, once this worker is active
let startupKept = false; // whether an event already waits for it

/** Resolves with the module's loading once something asked for it (see startWhenIdle). */
let asked;
const askedFor = new Promise((resolve) => { asked = resolve; });

/** Instantiates the module (its bytes came with the worker's scripts) and starts the
 * outbox. */
function outbox() {
  clearTimeout(idleStart);
  if (!loading) {
    loading = (async () => {
      const handover = takeEarly();
      importModuleScripts();
      const bytes = moduleBytes();
      mark('module-found');
      await wasm_bindgen({ module_or_path: bytes });
      mark('module-instantiated');
      const early = handover ? await handover : null;
      let o;
      try {
        o = await wasm_bindgen.start(CONFIG, early ?? undefined);
      } catch (e) {
        if (early) early.db.close(); // adopted or not, no outbox holds it
        throw e;
      }
      mark('started');
      loaded = o;
      if (isActive()) startFlush(o);
      return o;
    })();
    loading.catch((e) => {
      console.error('sw-outbox: the module did not start', e);
      loading = null; // the next event tries again
    });
    asked(loading);
  }
  return loading;
}

/**
 * A worker the browser started for requests that are not the outbox's (a page's
 * navigation and files) starts its module only once they stopped coming: IDLE_START_MS
 * after the last of them, at most IDLE_START_MAX_MS after the first. Instantiating the
 * module and opening the database take the worker's thread for a while (bench/README.md,
 * start-up steps), and every request of a controlled page is dispatched on that thread,
 * answered or not. It still starts on every start, for its start-up flush; an event that
 * needs it starts it at once.
 */
const IDLE_START_MS = 2000;
const IDLE_START_MAX_MS = 10000;
let idleStart = null;
let idleDeadline = 0;
function startWhenIdle() {
  if (loading) return;
  const now = Date.now();
  if (!idleDeadline) idleDeadline = now + IDLE_START_MAX_MS;
  clearTimeout(idleStart);
  idleStart = setTimeout(() => { outbox().catch(() => {}); }, Math.max(0, Math.min(IDLE_START_MS, idleDeadline - now)));
}

/** Whether this worker is the registration's active one. An installing or waiting
 * worker (during an update) only installs: it neither flushes nor takes the queue's
 * Web Lock from the active worker, which is the one pages talk to. Where the engine does
 * not give a worker its own state (Firefox), a worker that saw its `install` and not yet
 * its `activate` is installing or waiting; one that saw neither was started again as the
 * active one (r4: only the active version flushes). */
let installSeen = false;
let activateSeen = false;
function isActive() {
  const me = self.serviceWorker;
  if (me) return me.state === 'activating' || me.state === 'activated';
  return !installSeen || activateSeen;
}

/** The once-per-start flush (a non-empty queue left by an earlier run is sent). It
 * also puts back app-shell entries a CLEAR_DEVICE could not fetch again (offline). */
function startFlush(o) {
  if (!startup) {
    startup = Promise.all([
      o.handle_start().catch((e) => console.error('sw-outbox: start flush', e)),
      restoreShell(o.config().attemptTimeoutMs),
    ]);
  }
  return startup;
}

/** A request for a file to precache: from the server, never from the HTTP cache. A
 * revalidation could be answered 304 for a changed file by a host that validates by file
 * time (one-second resolution, or one fixed time for every file of a reproducible build)
 * and size, and the old copy would be precached under the new build's name
 * (tests/e2e-engines/static-host.test.mjs); and after a CLEAR_DEVICE the HTTP cache may
 * hold the previous account's page.
 * `no-store`, not `reload`: Firefox's offline mode answers a `reload` from its cache. */
const fresh = (url) => new Request(url, { cache: 'no-store' });

/** A request for a file to precache at the first install of this registration (issue 37,
 * 5): the page that registered the worker has just loaded these files, so the HTTP cache
 * may answer (`default`: a fresh copy as it is, a stale one revalidated) instead of a
 * second download. An update (an active worker exists) takes `fresh`: there a 304 for a
 * changed file would put the old copy under the new build's name. */
const firstCopy = (url) => new Request(url, { cache: 'default' });

/** Adds back precached files missing from this build's cache, fetched outside the
 * origin's caches lock, each within the outbox's `attemptTimeoutMs` (`limitMs`): that
 * lock is every registration's activation cleanup, so it is never held across a fetch
 * (issue 34, 8e). Under it, the copies go only into a cache that still exists: its
 * successor's activation may have deleted it (opening would create it again, and it
 * would outlive this build), so the check and the puts cannot interleave with that
 * deletion. Missing entries are found without opening the cache. */
async function restoreShell(limitMs) {
  try {
    const missing = [];
    for (const url of CONFIG.precache) {
      if (!(await caches.match(url, { cacheName: CACHE }))) missing.push(url);
    }
    if (!missing.length) return;
    const copies = (await Promise.all(missing.map((url) => freshCopy(url, limitMs)))).filter(Boolean);
    if (!copies.length) return;
    const add = async () => {
      if (!(await caches.has(CACHE))) return;
      const cache = await caches.open(CACHE);
      for (const [url, copy] of copies) {
        if (!(await cache.match(url))) await cache.put(url, copy).catch(() => {});
      }
    };
    const locks = self.navigator && self.navigator.locks;
    await (locks ? locks.request(CACHES_LOCK, add) : add());
  } catch (e) {
    console.warn('sw-outbox: app shell not restored', e);
  }
}

/** `[url, response]` of a file to precache, read whole within `limitMs`, or null. */
async function freshCopy(url, limitMs) {
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), limitMs);
  try {
    const answer = await fetch(fresh(url), { signal: abort.signal });
    if (!answer.ok) return null;
    const body = await answer.arrayBuffer();
    return [url, new Response(body, { status: answer.status, statusText: answer.statusText, headers: answer.headers })];
  } catch (e) {
    return null;
  } finally {
    clearTimeout(timer);
  }
}

/** The message an active worker sends a waiting one to renew its skipWaiting(). */
const NUDGE = 'SW_OUTBOX_SKIP_WAITING';

/** During an update the new worker activates once this (old) one is idle, and Chromium
 * asks this one to stop as soon as it is. An event that reaches this worker while it stops
 * restarts it, and the restarted instance has forgotten that request: the update then
 * waits for its idle timeout (30 s), or for the five-minute limit while DevTools is
 * attached. A restarted active worker that sees a waiting one asks it to call
 * skipWaiting() again, which renews the request. It asks from its first event, not while
 * its script runs: Chromium renews the request only for a running worker, and it acts on
 * a waiting worker's first pending skipWaiting() only, so an early ask would spend it. */
let nudged = false;
function nudgeWaiting() {
  if (nudged) return;
  nudged = true;
  const reg = self.registration;
  const waiting = reg && reg.waiting;
  if (waiting && waiting !== self.serviceWorker && isActive()) {
    try {
      waiting.postMessage({ type: NUDGE });
    } catch (e) {
      console.warn('sw-outbox: could not reach the waiting worker', e);
    }
  }
}

/** Keeps the worker alive for the start-up flush: the first event after start only, so
 * no later event is held by it (a fetch the outbox does not answer included: its
 * `waitUntil` holds the worker, not the request, and it waits for the module's idle
 * start without asking for the module itself). */
function keepAlive(event) {
  if (startupKept) return;
  startupKept = true;
  event.waitUntil(askedFor.then((l) => l).then(() => startup).catch(() => {}));
}

/** The default `authRoutePattern`'s names and the segments they may follow, as
 * URLPatterns can say them (Chromium refuses a pattern with a regular-expression group,
 * so the alternation becomes one pattern per name). */
/** The default auth pattern's names and places, as lists (`core::config`). */
const AUTH_NAMES = SW_OUTBOX_RULES.authNames;
const AUTH_PARENTS = SW_OUTBOX_RULES.authParents;

/** A URLPattern pathname matching `text` literally. */
const patternText = (text) => text.replace(/[\\*+?(){}:]/g, '\\$&');

/** The literal start of an anchored regular expression's source (`^/accounts/(?:…)` →
 * `/accounts/`): every match begins with it. '' when there is none that is certain: not
 * anchored, an alternation at its top level, or a character other than a plain path one
 * (a class, an escape for a class, a percent sign). A character a quantifier follows is
 * left out (it may be absent). */
function literalStart(source) {
  let depth = 0;
  for (let i = 0, inClass = false; i < source.length; i++) {
    const c = source[i];
    if (c === '\\') i++;
    else if (inClass) inClass = c !== ']';
    else if (c === '[') inClass = true;
    else if (c === '(') depth++;
    else if (c === ')') depth--;
    else if (c === '|' && depth === 0) return '';
  }
  if (!source.startsWith('^')) return '';
  let out = '';
  for (let i = 1; i < source.length; i++) {
    let c = source[i];
    if (c === '\\' && /^[/.\-_~]$/.test(source[i + 1] ?? '')) c = source[++i];
    else if (!/^[A-Za-z0-9/_~-]$/.test(c)) {
      if (/^[?*{]$/.test(c)) out = out.slice(0, -1);
      break;
    }
    if (/^[?*{]$/.test(source[i + 1] ?? '')) break;
    out += c;
  }
  return out;
}

/**
 * The static routes of `staticRoutes: true` (contract 1, r4): one rule sending to the
 * network every request outside what may be the outbox's, so a page's navigation and
 * files never start the worker. What may be the outbox's is what `swOutboxRoute` may
 * claim, or wider, never narrower: paths under `apiPrefix` (any origin); the auth
 * routes, case-insensitively — the default pattern exactly (one URLPattern per name and
 * place), a site's own pattern by its literal start (`^/accounts/…` keeps every
 * `/accounts/…`) — and, with an app shell, every navigation and the precached files'
 * paths. null (no routes: every request reaches the listener, as without static
 * routing) when that cannot be said: a site's pattern without a certain literal start,
 * or an `apiPrefix` holding `?` or `#`.
 */
function staticRouteRules(config) {
  const prefix = config.apiPrefix ?? CONFIG_DEFAULTS.apiPrefix;
  if (/[?#]/.test(prefix)) return null;
  const keep = [{ urlPattern: new URLPattern({ pathname: `${patternText(prefix)}*` }) }];
  const caseless = (pathname) => ({ urlPattern: new URLPattern({ pathname }, { ignoreCase: true }) });
  const auth = config.authRoutePattern ?? CONFIG_DEFAULTS.authRoutePattern;
  if (auth === CONFIG_DEFAULTS.authRoutePattern) {
    for (const parent of AUTH_PARENTS) {
      for (const name of AUTH_NAMES) keep.push(caseless(`${parent}/${name}`), caseless(`${parent}/${name}/*`));
    }
  } else {
    const start = literalStart(auth);
    if (start.replace(/\/+/g, '') === '') return null;
    keep.push(caseless(`${patternText(start)}*`));
  }
  const precache = config.precache ?? CONFIG_DEFAULTS.precache;
  if ((config.shellUrl ?? precache.find(isPage)) != null) keep.push({ requestMode: 'navigate' });
  for (const url of precache) keep.push({ urlPattern: new URLPattern({ pathname: patternText(new URL(url).pathname) }) });
  return [{ condition: { not: { or: keep } }, source: 'network' }];
}

/** Declares the static routes where the engine offers them (`staticRoutes: true`); a
 * refusal is logged and changes nothing: every request then reaches the listener. */
function addStaticRoutes(event) {
  if ((CONFIG.staticRoutes ?? CONFIG_DEFAULTS.staticRoutes) !== true || typeof event.addRoutes !== 'function') return;
  try {
    const rules = staticRouteRules(CONFIG);
    if (!rules) {
      console.warn('sw-outbox: staticRoutes: no request is routed around the worker (an authRoutePattern without a certain literal start, or an apiPrefix holding "?" or "#")');
      return;
    }
    event.waitUntil(event.addRoutes(rules).then(() => mark('static-routes'),
      (e) => console.warn('sw-outbox: static routes refused', e)));
  } catch (e) {
    console.warn('sw-outbox: static routes not added', e);
  }
}

self.addEventListener('install', (event) => {
  installSeen = true;
  mark('install');
  addStaticRoutes(event);
  event.waitUntil((async () => {
    // Only the app shell: the runtime came with the worker's scripts. Without a shell no
    // cache is made.
    const request = self.registration.active ? fresh : firstCopy;
    if (CONFIG.precache.length) await (await caches.open(CACHE)).addAll(CONFIG.precache.map(request));
    mark('precached');
    await outbox(); // a build whose module does not start must not install
    // With `skipWaiting: false` the new version waits for a page's SKIP_WAITING (or for
    // every page of the old one to close), so a site can prompt before it takes over.
    if (skipRequested) await self.skipWaiting();
  })().catch((e) => {
    console.error('sw-outbox: this version did not install', e);
    throw e;
  }));
});

/** Cache Storage is the origin's, shared by all its registrations: two registrations
 * (two scopes) of one build precache into the same `sw-outbox-<build>`. Each cache
 * records the scopes whose worker activated with it (a synthetic entry, never fetched
 * nor answered), and activation deletes an older build's cache only once no other
 * registration is listed in it: a registration that has not updated yet can still start
 * offline from its cache (issue 27, 6). A cache written before this record existed lists
 * nobody and is deleted as before. Under a Web Lock where there is one, so two
 * registrations activating at once do not lose each other's entry. */
/** The Web Lock under which caches of this origin's builds are deleted or added to. */
const CACHES_LOCK = SW_OUTBOX_RULES.cachesLock;
const CACHE_OWNERS = new URL('/__sw-outbox/cache-owners', self.location.href).href;

async function cacheOwners(cache) {
  const entry = await cache.match(CACHE_OWNERS);
  if (!entry) return [];
  try {
    const scopes = await entry.json();
    return Array.isArray(scopes) ? scopes.filter((s) => typeof s === 'string') : [];
  } catch (e) {
    return [];
  }
}

const putCacheOwners = (cache, scopes) => cache.put(CACHE_OWNERS,
  new Response(JSON.stringify(scopes), { headers: { 'Content-Type': 'application/json' } }));

async function dropOlderCaches() {
  const me = self.registration.scope;
  // A worker without a shell has no cache of its own to record itself in.
  if (CONFIG.precache.length) {
    const current = await caches.open(CACHE);
    const owners = await cacheOwners(current);
    if (!owners.includes(me)) await putCacheOwners(current, [...owners, me]);
  }
  for (const name of await caches.keys()) {
    if (!name.startsWith(CACHE_PREFIX) || name === CACHE) continue;
    const cache = await caches.open(name);
    const listed = await cacheOwners(cache);
    const others = listed.filter((s) => s !== me);
    if (!others.length) await caches.delete(name);
    else if (others.length !== listed.length) await putCacheOwners(cache, others);
  }
}

self.addEventListener('activate', (event) => {
  activateSeen = true;
  mark('activate');
  event.waitUntil((async () => {
    const locks = self.navigator && self.navigator.locks;
    await (locks ? locks.request(CACHES_LOCK, dropOlderCaches) : dropOlderCaches())
      .catch((e) => console.warn('sw-outbox: older caches not cleaned up', e));
    mark('caches-cleaned');
    // Another version may have changed the session or the queue while this one
    // waited: its view is checked here. (Chromium may hand it a page's fetch before
    // this runs, while it is still activating: such a write reads the database itself,
    // worker::view.)
    await outbox().then((o) => o.handle_activate()).catch(() => {});
    mark('view-checked');
    await self.clients.claim();
    mark('claimed');
    // The start flush runs now that this worker is active; activation does not wait
    // for it.
    outbox().then(startFlush).catch(() => {});
  })());
});

let fetchSeen = false;
self.addEventListener('fetch', (event) => {
  const first = !fetchSeen;
  if (first) {
    fetchSeen = true;
    mark('first-fetch');
  }
  nudgeWaiting();
  const request = event.request;
  const owner = route(request.method, request.url, request.mode === 'navigate');
  let answer;
  if (owner === null) {
    // Not the outbox's: no respondWith, decided before (and without) the module.
    startWhenIdle();
  } else if (owner === 'observe') {
    // A sign-in outside apiPrefix (r4): left to the network and the site's listeners (no
    // respondWith); the module raises the sign-in barrier for it.
    event.waitUntil(loaded ? loaded.observe_sign_in(event)
      : outbox().then((o) => o.observe_sign_in(event)).catch(() => {}));
  } else if (typeof owner === 'object') {
    answer = shellAnswer(fetch(request), CACHE, owner.shell);
    startWhenIdle();
  } else if (loaded) {
    answer = moduleAnswer(loaded, owner, request, event);
  } else if (owner === 'read') {
    // A read is network only: it need not wait for the module.
    answer = networkOrOffline(request);
    startWhenIdle();
  } else {
    // A write (stored by the module when the network fails) or an auth route (the
    // sign-in barrier must see it) waits for the module; if it cannot start, a write
    // is refused, never sent around the outbox, and an auth route goes to the network.
    answer = outbox().then(
      (o) => moduleAnswer(o, owner, request, event),
      (e) => withoutModule(owner, request, describe(e)),
    );
  }
  if (answer) {
    event.respondWith(answer);
    if (first) answer.then(() => mark('first-answer'), () => {});
  }
  keepAlive(event);
});

/** The module's answer to a request of the outbox's. A synchronous throw of
 * `handle_fetch` (a defect, issue 34 8d) must neither escape the listener (the browser
 * would then send a write itself, without its key) nor reject the answer: it is answered
 * as when the module cannot start. */
function moduleAnswer(o, owner, request, event) {
  try {
    return o.handle_fetch(request, event);
  } catch (e) {
    console.error('sw-outbox: handle_fetch threw', e);
    return withoutModule(owner, request, `handle_fetch threw: ${describe(e)}`);
  }
}

/** A request of the outbox's answered without the module: a write is refused (never sent
 * around the outbox), anything else goes to the network without the outbox's headers. */
function withoutModule(owner, request, why) {
  return owner === 'write' ? Promise.resolve(notStarted(why)) : networkOrOffline(withoutOutboxHeaders(request, CONFIG));
}

/** An error's message, for an answer or a log line. */
function describe(e) {
  return String((e && e.message) || e);
}

/** What a page posts a waiting worker to make it take over (a prompt-to-update flow);
 * workbox-window's `messageSkipWaiting()` and vite-plugin-pwa's `updateSW()` send the
 * same. Not a command of the outbox: it gets no COMMAND_RESULT. */
const SKIP_WAITING = 'SKIP_WAITING';

self.addEventListener('message', (event) => {
  const data = event.data;
  const type = data && typeof data === 'object' ? data.type : undefined;
  const fromWorker = typeof ServiceWorker !== 'undefined' && event.source instanceof ServiceWorker;
  if (type === NUDGE && fromWorker) {
    // Only another worker of this origin can send this; it is not a page command. It
    // renews a skipWaiting() this worker made; one waiting for a prompt keeps waiting.
    if (skipRequested) event.waitUntil(self.skipWaiting());
    return;
  }
  if (type === SKIP_WAITING && !fromWorker) {
    skipRequested = true;
    event.waitUntil(self.skipWaiting());
    return;
  }
  nudgeWaiting();
  const work = outbox();
  event.waitUntil(work.then((o) => o.handle_message(event), (e) => refuse(event, type, e)));
  keepAlive(event);
});

/** A command that arrived while the module cannot start gets a clear refusal, not
 * silence (a page would wait out its timeout), where the module would have answered: the
 * message's first transferred port, else its source (`worker::clients::ReplyTo`). */
function refuse(event, type, e) {
  const requestId = event.data && typeof event.data === 'object' ? event.data.requestId : undefined;
  try {
    (event.ports?.[0] ?? event.source)?.postMessage({
      type: 'COMMAND_RESULT', command: typeof type === 'string' ? type : null, ok: false,
      reason: `the outbox could not start: ${describe(e)}`, ...(requestId == null ? {} : { requestId }),
    });
  } catch (err) { /* the page is gone */ }
}

self.addEventListener('sync', (event) => {
  nudgeWaiting();
  event.waitUntil(outbox().then((o) => o.handle_sync(event.tag, event.lastChance === true)));
});

self.addEventListener('notificationclick', (event) => {
  // Only the outbox's own notification (its tag and the mark in its data): a site's
  // other notifications are left to its own listeners, neither closed nor followed.
  const notification = event.notification;
  const data = notification.data;
  if (notification.tag !== 'sw-outbox' || !data || data.swOutbox !== true) return;
  nudgeWaiting();
  notification.close();
  event.waitUntil(outbox().then((o) => o.handle_notification_click(data)));
});

self.addEventListener('online', () => {
  // Only the active version flushes (r4): an installing or waiting one starts nothing.
  if (!isActive()) return;
  outbox().then((o) => o.handle_online()).catch(() => {});
});

startWhenIdle();
