// Every engine: a seeded chaos run against the real worker and the real server.
//
// A small PRNG (mulberry32, seed from CHAOS_SEED or random, printed first) drives one
// browser of each engine, with the same seed (the same step sequence), through a few hundred steps: writes from the page by two accounts (alice, bob)
// into three workspaces (p1..p3) and account-level notes; the network switched down and
// up; per-path fault rules (refuse, drop-after-commit, hang, 500, 503/429 with
// Retry-After, outcome-unknown); the worker stopped (where the engine's automation can:
// a skipped step where it cannot, so the sequence stays the seed's); account switches;
// flushes; a new build of the worker deployed mid-run (a real update: the page registers
// a worker of another configuration, which installs, skips waiting and takes over while
// the old one may be mid-flush; a skipped step where the browser cannot take one
// mid-run, WebKit: browser-update.test.mjs); and a sign-out with CLEAR_DEVICE while a
// write is on its first attempt. Then recovery (faults cleared, network up, each account
// signed in and flushed until its queue stops changing) and the checks, against
// /__control/applied (the server's ground truth) and what the page was answered:
//   (a) every write answered 202 (queued) or 2xx (applied) is applied exactly once, except
//       records still in the queue for a reason the contract states (listed);
//   (b) nothing applied twice: no (user, key) twice in the applied log, no write twice;
//   (c) per (account, workspace), the order of application is the order of issue;
//   (d) nothing applied under another account than the one that issued it;
//   (e) the final LIST_QUEUE holds only records blocked for a stated reason.
// A write queued before a CLEAR_DEVICE may be gone unapplied (the user cleared it); one
// still on its first attempt when the clear committed is answered 503 and never stored.
// Replay a failure with CHAOS_SEED=<seed> CHAOS_WRITES=<n> E2E_ENGINES=<engine> node --test
// tests/e2e-engines/chaos.test.mjs (the step sequence is the seed's; the browser's own
// timing still varies a little from run to run). A failure names the step under way and
// what the page, its workers (registration, controller changes, unanswered commands, a
// LIST_QUEUE) and the server (its last requests) said then; a write left unanswered is a
// failure after WRITE_ANSWER_MS, not a silent hang.
import assert from 'node:assert/strict';
import { randomInt } from 'node:crypto';
import { appendFileSync, writeFileSync } from 'node:fs';
import { test } from 'node:test';
import { lacks } from './engines.mjs';
import {
  captureReports, clearReports, forEachEngine, listQueue, outboxState, signIn, signOutThroughUi, swPath,
  waitForFlushReports, withDiagnostics,
} from './outbox-helpers.mjs';

const SEED = process.env.CHAOS_SEED !== undefined && process.env.CHAOS_SEED !== ''
  ? Number(process.env.CHAOS_SEED) >>> 0
  : randomInt(0, 2 ** 32 - 1);
const WRITES = Number(process.env.CHAOS_WRITES || 200);
/** The chaos phase stops issuing steps after this long, whatever the number of writes. */
const PHASE_MS = Number(process.env.CHAOS_PHASE_MS || 180000);
const ATTEMPT_TIMEOUT_MS = 800;
/** How long a sign-in or sign-out may wait for the demo's commands. The demo's sign-in
 * waits for its FLUSH_QUEUE, which is answered after the flush under way (up to
 * flushBudgetMs, 25 s, plus an attempt) and one more: under the run's faults that passed
 * the helpers' 30 s (seen: Firefox's sign-in, Chromium's sign-out, in CI). */
const SESSION_WAIT = { timeout: 90000 };
/** How long a write from the page may go unanswered before the run fails, naming it. The
 * worker answers a write within attemptTimeoutMs (800 ms here) and one IndexedDB commit:
 * 11 056 writes of WebKit runs on a loaded 2-core machine took 2 s at most (median 75 ms).
 * Without it a page that never gets its answer holds the run until WebDriver's 90 s
 * script timeout (WebKit, Firefox) or the test's own timeout (Chromium), saying only
 * that a script timed out. */
const WRITE_ANSWER_MS = 30000;

process.stdout.write(`chaos: seed=${SEED} writes=${WRITES} (replay: CHAOS_SEED=${SEED} CHAOS_WRITES=${WRITES})\n`);

/** mulberry32: a tiny seeded PRNG, uniform in [0, 1). */
function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6D2B79F5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const ACCOUNTS = ['alice', 'bob'];
const WORKSPACES = ['p1', 'p2', 'p3', null]; // null: account-level notes
const pathOf = (ws) => (ws ? `/api/projects/${ws}/tasks` : '/api/notes');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Reasons a record may legitimately stay in the queue after recovery (contract 4.2, 4.5). */
const ATTENTION_ALLOWED = new Set(['outcome-unknown', 'repeated-5xx', 'conflict']);

/** A write request without an Idempotency-Key (sign-in and sign-out carry none). */
const isKeylessWrite = (q) => q.method === 'POST' && !q.key && !q.path.startsWith('/api/auth/');

/**
 * Appends `report.now()` to a failure: the run sets it once its page is open, to say
 * which step was under way and what the page, its workers and the server said then.
 */
function withReport(report, fn) {
  return async (t) => {
    try {
      await fn(t);
    } catch (err) {
      if (report.now && err && typeof err === 'object') {
        const text = await report.now().catch((e) => `(no report: ${e.message})`);
        if (text) err.message += `\n${text}`;
      }
      throw err;
    }
  };
}

forEachEngine((engine, harness) => {
  const report = { now: null };
  test(`chaos run (seed ${SEED}, ${WRITES} writes): exactly once, in order, under the right account`,
    { timeout: PHASE_MS + 240000 },
    withDiagnostics(harness, withReport(report, async (t) => {
      const h = harness();
      /** Why this engine cannot stop a worker (the step is skipped), or false. */
      const noStop = lacks(engine, 'stopWorkers');
      /** Why this engine cannot take a new build mid-run (the step is skipped), or false. */
      const noDeploy = lacks(engine, 'updateMidRun');
      const rng = mulberry32(SEED);
      const pick = (xs) => xs[Math.floor(rng() * xs.length)];
      const chance = (p) => rng() < p;

      await h.reset();
      const config = { attemptTimeoutMs: ATTEMPT_TIMEOUT_MS };
      const demoPath = swPath(config);
      const page = await h.openDemo({ path: demoPath });
      await signIn(page, 'alice', SESSION_WAIT);
      const events = [];
      // CHAOS_TRACE=<file> keeps every step of the run in <file>.<engine>, written as it
      // goes, so a run that fails or hangs leaves its full story.
      const trace = process.env.CHAOS_TRACE ? `${process.env.CHAOS_TRACE}.${engine}` : null;
      if (trace) writeFileSync(trace, '');
      const note = (line) => {
        events.push(line);
        if (trace) appendFileSync(trace, `${new Date().toISOString().slice(11, 23)} ${line}\n`);
      };
      if (process.env.CHAOS_DEBUG && engine === 'chromium') {
        const cdp = await h.browser.context.newCDPSession(page);
        cdp.on('ServiceWorker.workerVersionUpdated', ({ versions }) => {
          for (const v of versions) note(`  sw v${v.versionId} ${v.scriptURL.slice(-6)} ${v.runningStatus}/${v.status}`);
        });
        cdp.on('ServiceWorker.workerErrorReported', ({ errorMessage }) => note(`  sw error ${JSON.stringify(errorMessage)}`));
        await cdp.send('ServiceWorker.enable');
      }

      let current = 'alice';
      let netUp = true;
      let rules = [];
      const stats = {
        faults: 0, kills: 0, killsSkipped: 0, reloads: 0, switches: 0, flushes: 0, flushErrors: 0, steps: 0, deploys: 0, clears: 0,
        deploysSkipped: 0,
      };
      let newestScript = null;
      /** Every write issued, in issue order. */
      const writes = [];
      /** The operation under way and since when, for a failure report: a page script
       * that never returns says only that it timed out. */
      let doing = 'sign-in as alice';
      let doingSince = Date.now();
      const begin = (what) => { doing = what; doingSince = Date.now(); };
      report.now = async () => {
        if (doing === 'the checks') return ''; // their message says it all
        const state = await outboxState(page);
        const requests = await h.requests().then((rs) => rs.slice(-25), (e) => `unavailable: ${e.message}`);
        const text = `under way when it failed: ${doing} (for ${Date.now() - doingSince} ms)\npage and workers now: ${JSON.stringify(state, null, 1)}\nthe server's last requests: ${JSON.stringify(requests)}\nlast steps:\n${events.slice(-25).join('\n')}`;
        if (trace) appendFileSync(trace, `FAILED during ${doing}\n${text}\n`);
        return text;
      };

      async function setNetwork(up) {
        begin(`network ${up ? 'up' : 'down'}`);
        await h.setNetwork(up);
        netUp = up;
      }
      async function setRules(next) {
        begin('fault rules');
        await h.control('faults', { rules: next });
        rules = next;
      }

      function randomRule() {
        const path = pick(['/api/projects/p1/tasks', '/api/projects/p2/tasks', '/api/projects/p3/tasks',
          '/api/projects/*/tasks', '/api/notes']);
        const times = pick([1, 1, 2, 3, undefined]);
        const kind = pick(['refuse', 'drop-after-commit', 'hang', 'status-500', 'status-503', 'status-429', 'outcome-unknown']);
        const rule = { path, method: 'POST' };
        switch (kind) {
          case 'status-500': Object.assign(rule, { kind: 'status', status: 500 }); break;
          case 'status-503': Object.assign(rule, { kind: 'status', status: 503, retryAfter: pick(['0', '1']) }); break;
          case 'status-429': Object.assign(rule, { kind: 'status', status: 429 }, chance(0.5) ? { retryAfter: '1' } : {}); break;
          case 'outcome-unknown': Object.assign(rule, { kind: 'outcome-unknown', times: 1 }); return rule;
          default: rule.kind = kind;
        }
        if (times !== undefined) rule.times = times;
        return rule;
      }

      async function issueWrite() {
        const i = writes.length;
        const ws = pick(WORKSPACES);
        const path = pathOf(ws);
        const tag = `chaos-${SEED}-${i}`;
        const body = ws ? { title: tag } : { text: tag };
        begin(`write w${i} (${current} POST ${path})`);
        const r = await page.evaluate(async ([p, b, what, ms]) => {
          const controller = navigator.serviceWorker.controller?.scriptURL ?? null;
          window.__pendingStep = { what, since: new Date().toISOString(), controller };
          const answer = await Promise.race([window.demo.api('POST', p, b),
            new Promise((res) => { setTimeout(() => res(null), ms); })]);
          if (answer === null) return { unanswered: true, controller };
          window.__pendingStep = null;
          return { ...answer, controller };
        }, [path, body, `write w${i} POST ${path}`, WRITE_ANSWER_MS]);
        if (r.unanswered && !(await bypassedIntoHang(path))) {
          throw new Error(`write w${i} (${current} POST ${path}): the page got no answer within ${WRITE_ANSWER_MS} ms`);
        }
        let outcome;
        if (r.unanswered) outcome = 'unanswered';
        else if (r.status === 202 && r.body?.queued === true) outcome = 'queued';
        else if (r.status >= 200 && r.status < 300) outcome = 'applied';
        else if (r.status === 0) outcome = 'network-error';
        else outcome = 'http-error';
        const w = {
          i, tag, account: current, ws, path, body, status: r.status, outcome,
          id: outcome === 'queued' ? r.body.id : null,
          key: outcome === 'queued' ? r.body.idempotencyKey : null,
          answer: r.body,
          controller: r.controller,
          // Applied by its first attempt: a 2xx, or a 202 whose only request so far (the
          // first attempt, whose answer was lost: drop-after-commit) already ran the route.
          firstAttemptApplied: outcome === 'applied',
        };
        if (outcome === 'queued') {
          const [rows, reqs] = await Promise.all([h.applied(), h.requests()]);
          w.firstAttemptApplied = rows.some((a) => a.key === w.key)
            && reqs.filter((q) => q.key === w.key).length === 1;
        }
        if (outcome === 'unanswered') w.bypassed = true;
        writes.push(w);
        note(`w${i} ${current} ${ws ?? 'notes'} -> ${r.unanswered ? 'no answer (sent around the worker into a hang fault)' : r.status}${outcome === 'queued' ? ` #${r.body.id}` : ''}`);
        if (outcome === 'applied' || outcome === 'network-error' || outcome === 'unanswered') await reloadIfBypassed();
      }

      /** Whether a write the page got no answer to went around the worker (the Chromium
       * bypass below) into a server that holds it (a `hang` fault): the browser's own
       * request, keyless, still unanswered on `path`. The worker would have answered 202
       * after `attemptTimeoutMs`; without it, the page's fetch waits as long as the server
       * does, and the page was promised nothing. Seen once in CI (Chromium, seed 1966890855,
       * a write right after a new version took control following a worker stop). */
      async function bypassedIntoHang(path) {
        const keyless = (await h.requests()).filter(isKeylessWrite);
        return keyless.slice(keylessSeen).some((q) => q.path === path && q.status === null);
      }

      /** A keyless write request is one the browser sent around the worker (checked at the
       * end); from then on Chromium keeps the page's writes away from its controller, so
       * the page is reloaded, as the demo's user would. */
      let keylessSeen = 0;
      async function reloadIfBypassed() {
        const keyless = (await h.requests()).filter(isKeylessWrite).length;
        if (keyless === keylessSeen) return;
        keylessSeen = keyless;
        stats.reloads += 1;
        note('bypass seen: page reloaded');
        await h.openDemo({ page, path: demoPath });
        await captureReports(page);
      }

      /** Deploys a new build: another configuration is another worker script. */
      async function deploy() {
        if (noDeploy) {
          stats.deploysSkipped += 1;
          note('deploy skipped (the engine cannot take it mid-run)');
          return;
        }
        stats.deploys += 1;
        const cfg = { attemptTimeoutMs: ATTEMPT_TIMEOUT_MS, replayConcurrency: 1 + (stats.deploys % 6) };
        newestScript = `/sw.js?config=${encodeURIComponent(JSON.stringify(cfg))}`;
        begin(`deploy ${stats.deploys}: register ${newestScript}`);
        const ok = await page.evaluate((u) => navigator.serviceWorker.register(u, { scope: '/' }).then(() => true, () => false), newestScript);
        note(`deploy ${stats.deploys} (${ok ? 'registered' : 'refused'})`);
      }

      /** Signs out and clears the device while a write is on its first attempt. */
      async function clearMidWrite() {
        const i = writes.length;
        const ws = pick(WORKSPACES);
        const path = pathOf(ws);
        const tag = `chaos-${SEED}-${i}`;
        const body = ws ? { title: tag } : { text: tag };
        begin(`write w${i} (${current} POST ${path}) during a clear`);
        await page.evaluate(([p, b]) => { window.__midClear = window.demo.api('POST', p, b); }, [path, body]);
        await sleep(Math.floor(rng() * 300));
        begin(`CLEAR_DEVICE while w${i} is on its first attempt`);
        const cleared = await page.evaluate(() => window.demo.client.clearDevice().catch((e) => ({ ok: false, reason: e.message })));
        begin(`the answer to w${i} (written during a clear)`);
        const r = await page.evaluate((ms) => Promise.race([window.__midClear,
          new Promise((res) => { setTimeout(() => res({ unanswered: true }), ms); })]), WRITE_ANSWER_MS);
        if (r.unanswered) throw new Error(`write w${i} (${current} POST ${path}, during a clear): the page got no answer within ${WRITE_ANSWER_MS} ms`);
        let outcome;
        if (r.status === 202 && r.body?.queued === true) outcome = 'queued';
        else if (r.status === 503 && /cleared/.test(r.body?.error ?? '')) outcome = 'cleared';
        else if (r.status >= 200 && r.status < 300) outcome = 'applied';
        else if (r.status === 0) outcome = 'network-error';
        else outcome = 'http-error';
        writes.push({
          i, tag, account: current, ws, path, body, status: r.status, outcome,
          id: outcome === 'queued' ? r.body.id : null,
          key: outcome === 'queued' ? r.body.idempotencyKey : null,
          answer: r.body, firstAttemptApplied: outcome === 'applied',
        });
        if (cleared.ok) {
          stats.clears += 1;
          for (const w of writes) if (w.outcome === 'queued') w.clearable = true;
        }
        note(`w${i} ${current} ${ws ?? 'notes'} during a clear (${cleared.ok ? 'cleared' : cleared.reason}) -> ${r.status} ${outcome}`);
        // The session went with the device's data: sign in again (the network is needed).
        const wasUp = netUp;
        if (!netUp) await setNetwork(true);
        begin(`sign-out after a clear (${current})`);
        await signOutThroughUi(page, SESSION_WAIT);
        begin(`sign-in after a clear (${current})`);
        await signIn(page, current, SESSION_WAIT);
        if (!wasUp) await setNetwork(false);
      }

      async function tryFlush() {
        stats.flushes += 1;
        begin('FLUSH_QUEUE');
        try {
          const r = await page.evaluate(() => window.demo.client.flush());
          note(`flush ok=${r.ok}${r.reason ? ` (${r.reason})` : ''} affected=${r.affected ?? '-'}`);
          return r;
        } catch (err) {
          // A worker stopped while the command was pending loses its answer: not a failure here.
          stats.flushErrors += 1;
          note(`flush error ${err.message.split('\n')[0]}`);
          if (trace) appendFileSync(trace, `  page and workers then: ${JSON.stringify(await outboxState(page))}\n`);
          return null;
        }
      }

      /** Switches the signed-in account (sign-in needs the network; the previous state is restored). */
      async function switchTo(next) {
        const wasUp = netUp;
        if (!netUp) await setNetwork(true);
        await tryFlush(); // lets a flush under way finish before the session changes under it
        begin(`sign-out of ${current} (switching to ${next})`);
        await signOutThroughUi(page, SESSION_WAIT);
        begin(`sign-in as ${next}`);
        await signIn(page, next, SESSION_WAIT);
        current = next;
        stats.switches += 1;
        note(`switch -> ${next}`);
        if (!wasUp) await setNetwork(false);
      }

      // ---- chaos phase ----
      const deadline = Date.now() + PHASE_MS;
      while (writes.length < WRITES && Date.now() < deadline) {
        stats.steps += 1;
        const x = rng();
        if (x < 0.58) {
          await issueWrite();
        } else if (x < 0.68) {
          const up = !netUp;
          if (!up) stats.faults += 1;
          await setNetwork(up);
          note(`network ${up ? 'up' : 'down'}`);
        } else if (x < 0.77) {
          const next = Array.from({ length: chance(0.3) ? 2 : 1 }, randomRule);
          stats.faults += 1;
          await setRules(next);
          note(`faults ${JSON.stringify(next)}`);
        } else if (x < 0.81) {
          await setRules([]);
          note('faults cleared');
        } else if (x < 0.86) {
          if (noStop) {
            stats.killsSkipped += 1;
            note('worker stop skipped (the engine cannot)');
          } else {
            await h.stopWorkers();
            stats.kills += 1;
            note('worker stopped');
          }
        } else if (x < 0.93) {
          await tryFlush();
        } else if (x < 0.955) {
          await switchTo(current === 'alice' ? 'bob' : 'alice');
        } else if (x < 0.97) {
          await deploy();
        } else if (x < 0.975) {
          await clearMidWrite();
        } else {
          await sleep(Math.floor(rng() * 400));
        }
        if (chance(0.3)) await sleep(Math.floor(rng() * 150));
      }
      t.diagnostic(`chaos phase: ${stats.steps} steps, ${writes.length} writes`);
      if (newestScript) {
        begin('waiting for the newest build to control the page');
        // The last build takes over (a restart of the old worker mid-stop can make that wait
        // for Chromium's idle timeout, or its limit under DevTools: reported, not asserted).
        const took = await page.waitForFunction((u) => navigator.serviceWorker.controller?.scriptURL.endsWith(u),
          newestScript, { timeout: 90000 }).then(() => true, () => false);
        t.diagnostic(`deploys: ${stats.deploys}; the newest build ${took ? 'controls' : 'does not yet control'} the page`);
      }

      // ---- recovery ----
      await setRules([]);
      await setNetwork(true);
      /** The last MUTATIONS_BLOCKED of each account's final flush: id -> reason. */
      const lastBlocked = new Map();
      const queueSnapshot = async () => JSON.stringify((await listQueue(page))
        .map((r) => [r.id, r.ownerId, r.state, r.attentionReason ?? null]));
      for (const account of ACCOUNTS) {
        if (current !== account) await switchTo(account);
        let previous = null;
        let stable = false;
        for (let round = 0; round < 60 && !stable; round += 1) {
          await clearReports(page);
          const r = await tryFlush();
          if (!r || !r.ok) { await sleep(1100); continue; } // Retry-After window, or a lost answer
          begin(`recovery of ${account}: the flush's reports`);
          const { blocked } = await waitForFlushReports(page, { timeout: 60000 });
          begin(`recovery of ${account}: LIST_QUEUE`);
          const snap = await queueSnapshot();
          if (snap === previous && r.affected === 0) {
            stable = true;
            lastBlocked.set(account, new Map((blocked?.blocked ?? []).map((b) => [b.id, b])));
          }
          previous = snap;
        }
        assert.ok(stable, `${account}'s queue did not settle after 60 flushes: ${previous}\n${events.slice(-40).join('\n')}`);
      }

      // ---- checks ----
      begin('the checks');
      const applied = await h.applied();
      const requests = await h.requests();
      const finalQueue = await listQueue(page);
      const byTag = new Map(writes.map((w) => [w.tag, w]));
      const appliedOf = new Map(writes.map((w) => [w.tag, []]));
      const problems = [];
      const unexpectedApplied = [];
      for (const a of applied) {
        let tag = null;
        try { const b = JSON.parse(a.body); tag = b.title ?? b.text ?? null; } catch { /* not ours */ }
        if (!byTag.has(tag)) { unexpectedApplied.push(a); continue; }
        appliedOf.get(tag).push(a);
      }
      if (unexpectedApplied.length) problems.push(`applied rows that no write issued: ${JSON.stringify(unexpectedApplied)}`);

      // (b) no (user, key) twice in the applied log.
      const seenKeys = new Map();
      for (const a of applied) {
        if (a.key === null) continue;
        const k = `${a.user}\u0000${a.key}`;
        if (seenKeys.has(k)) problems.push(`(b) key ${a.key} applied twice for ${a.user}: seq ${seenKeys.get(k)} and ${a.seq}`);
        seenKeys.set(k, a.seq);
      }

      const queueById = new Map(finalQueue.map((r) => [r.id, r]));
      let duplicates = 0;
      let lost = 0;
      const blockedWrites = [];
      for (const w of writes) {
        const rows = appliedOf.get(w.tag);
        if (rows.length > 1) {
          duplicates += 1;
          problems.push(`(b) write ${w.i} (${w.account} ${w.path}, answered ${w.status}) applied ${rows.length} times: ${JSON.stringify(rows)}`);
        }
        // (d) under the account that issued it, on its path, with its body.
        for (const row of rows) {
          if (row.user !== w.account) problems.push(`(d) write ${w.i} issued by ${w.account} applied under ${row.user}: ${JSON.stringify(row)}`);
          if (row.path !== w.path) problems.push(`write ${w.i} applied on ${row.path}, issued on ${w.path}`);
          if (JSON.stringify(JSON.parse(row.body)) !== JSON.stringify(w.body)) problems.push(`write ${w.i} applied with body ${row.body}`);
        }
        if (w.outcome === 'queued') {
          for (const row of rows) {
            if (row.key !== w.key) problems.push(`write ${w.i} queued with key ${w.key} applied with key ${row.key}`);
          }
          const rec = queueById.get(w.id);
          if (!rec) {
            // Gone from the queue: the worker settled it, so the server must have applied it
            // once, unless the user cleared the device after it was queued.
            if (rows.length === 0 && !w.clearable) {
              lost += 1;
              const sent = requests.filter((q) => q.key === w.key).map((q) => [q.seq, q.user, q.status]);
              problems.push(`(a) write ${w.i} (${w.account} ${w.path}) answered 202 #${w.id} key ${w.key} left the queue but was never applied; sent: ${JSON.stringify(sent)}`);
            }
          } else {
            blockedWrites.push({ w, rec, appliedTimes: rows.length });
          }
        } else if (w.outcome === 'applied') {
          if (rows.length === 0) {
            lost += 1;
            problems.push(`(a) write ${w.i} (${w.account} ${w.path}) answered ${w.status} is not in the applied log`);
          }
          // Without a key: the browser sent it around the worker, which stamps every write
          // it forwards (the worker tests hold it to that). Seen in Chromium after a
          // version was stopped between installed and activating: the page's writes
          // bypassed its controller from then on.
          if (rows.some((row) => row.key === null)) w.bypassed = true;
        } else if (w.outcome === 'cleared') {
          // On its first attempt when the clear committed: never stored (not in the queue);
          // that attempt may have reached the server, so at most once (checked above).
          if (finalQueue.some((r) => r.id === w.id)) problems.push(`write ${w.i} answered cleared is in the queue`);
        } else if (w.outcome === 'http-error') {
          // An HTTP answer is passed to the page and nothing is queued (contract 2.3): every
          // non-2xx answer here was either injected before the route ran or a refusal.
          if (rows.length !== 0) problems.push(`write ${w.i} answered ${w.status} ${JSON.stringify(w.answer)} (not queued) was applied: ${JSON.stringify(rows)}`);
        }
        // 'network-error' (the page's fetch failed: the worker was stopped under it) and
        // 'unanswered' (sent around the worker into a hang fault): the page was promised
        // nothing; at most once is checked above.
      }

      const bypassed = writes.filter((w) => w.bypassed);
      const keylessRequests = requests.filter(isKeylessWrite).length;
      if (bypassed.length) {
        t.diagnostic(`bypassed the worker (browser): writes ${bypassed.map((w) => w.i).join(' ')}; page controlled by ${[...new Set(bypassed.map((w) => w.controller))].join(', ')}`);
      }

      // (e) and the blocked part of (a): every record left is blocked for a stated reason.
      const ownersRecords = (owner) => finalQueue.filter((r) => r.ownerId === owner).sort((x, y) => x.id - y.id);
      for (const rec of finalQueue) {
        const reported = lastBlocked.get(rec.ownerId)?.get(rec.id);
        if (!ACCOUNTS.includes(rec.ownerId)) { problems.push(`(e) record ${rec.id} has owner ${rec.ownerId}`); continue; }
        if (rec.state === 'needs-attention') {
          let allowed = ATTENTION_ALLOWED.has(rec.attentionReason);
          if (rec.attentionReason === 'rejected') {
            // Allowed only as the trace of an account switch racing a flush: the record was
            // sent under another session than its owner's and refused (409 mismatch / 403 csrf).
            const w = writes.find((x) => x.id === rec.id && x.outcome === 'queued');
            allowed = Boolean(w) && requests.some((q) => q.key === w.key && q.user !== rec.ownerId
              && (q.status === 409 || q.status === 403) && q.status === rec.lastStatus);
          }
          if (!allowed) problems.push(`(e) record ${rec.id} needs attention for ${rec.attentionReason} (status ${rec.lastStatus}), not a reason this run can cause`);
          if (reported?.reason !== rec.attentionReason) problems.push(`(e) record ${rec.id} (${rec.attentionReason}) reported as ${reported?.reason ?? 'nothing'} by ${rec.ownerId}'s last flush`);
        } else if (rec.state === 'queued') {
          // Held back by the ordering rules only: an earlier record of its owner is left in
          // its workspace, or either of them is account-level (the barrier).
          const earlier = ownersRecords(rec.ownerId).filter((o) => o.id < rec.id
            && (o.workspace === rec.workspace || o.workspace === null || rec.workspace === null));
          if (!earlier.length) problems.push(`(e) record ${rec.id} (${rec.ownerId} ${rec.path}) is still queued with nothing ahead of it`);
          if (reported?.reason !== 'workspace-order') problems.push(`(e) queued record ${rec.id} reported as ${reported?.reason ?? 'nothing'}, expected workspace-order`);
        } else {
          problems.push(`(e) record ${rec.id} in state ${rec.state} (${rec.attentionReason})`);
        }
      }
      for (const { w, rec, appliedTimes } of blockedWrites) {
        // Needs-attention: at most once (outcome-unknown may follow a drop-after-commit that
        // applied it). Held back by order: never sent past an unresolved earlier record.
        const max = rec.state === 'needs-attention' ? 1 : 0;
        if (appliedTimes > max) problems.push(`(a) write ${w.i} still queued (${rec.state} ${rec.attentionReason ?? 'workspace-order'}) but applied ${appliedTimes} times`);
      }

      // (c) per (account, workspace): the applied order is the issue order.
      const orderViolations = [];
      const seqOf = (w) => appliedOf.get(w.tag)[0]?.seq;
      for (const account of ACCOUNTS) {
        for (const ws of WORKSPACES) {
          const lane = writes.filter((w) => w.account === account && w.ws === ws && appliedOf.get(w.tag).length);
          // Every pair, not only neighbours: an exempt overtake must not hide another.
          for (const early of lane) {
            for (const late of lane) {
              if (!(early.i < late.i && seqOf(late) < seqOf(early))) continue;
              // One the browser sent around the worker was never in the worker's order.
              if (late.bypassed) continue;
              const v = `(c) ${account}/${ws ?? 'notes'}: write ${early.i} (${early.outcome}) applied after later-issued write ${late.i} (${late.outcome}${late.firstAttemptApplied ? ', by its first attempt' : ''})`;
              // A first attempt does not overtake an unresolved write of its lane either
              // (docs/PROTOCOL.md section 2, lane order), so every pair counts.
              orderViolations.push(v);
            }
          }
        }
      }
      problems.push(...orderViolations);

      const appliedCount = writes.filter((w) => appliedOf.get(w.tag).length).length;
      const misrouted = problems.filter((p) => p.startsWith('(d)')).length;
      const summary = `chaos ${engine}: seed=${SEED} writes=${writes.length} faults=${stats.faults} worker-kills=${stats.kills}${stats.killsSkipped ? ` (${stats.killsSkipped} skipped: ${noStop})` : ''} deploys=${stats.deploys}${stats.deploysSkipped ? ` (${stats.deploysSkipped} skipped: ${noDeploy})` : ''} clears=${stats.clears} applied=${appliedCount} duplicates=${duplicates} lost=${lost} misrouted=${misrouted} out-of-order=${orderViolations.length} blocked=${finalQueue.length} bypassed=${bypassed.length} (reloads ${stats.reloads}, keyless requests ${keylessRequests})`;
      process.stdout.write(`${summary}\n`);
      const outcomes = {};
      for (const w of writes) outcomes[w.outcome] = (outcomes[w.outcome] ?? 0) + 1;
      t.diagnostic(`answers: ${JSON.stringify(outcomes)}; switches ${stats.switches}, flushes ${stats.flushes} (${stats.flushErrors} unanswered)`);
      for (const { w, rec, appliedTimes } of blockedWrites) {
        if (rec.state === 'queued') continue;
        t.diagnostic(`blocked: write ${w.i} #${rec.id} ${w.account} ${w.path} ${rec.state} ${rec.attentionReason} (applied ${appliedTimes}x)`);
      }
      const heldBack = blockedWrites.filter((b) => b.rec.state === 'queued').length;
      if (heldBack) t.diagnostic(`blocked: ${heldBack} more held back behind them (workspace-order, never applied)`);
      assert.deepEqual(problems, [], `${summary}\nreplay with CHAOS_SEED=${SEED} CHAOS_WRITES=${WRITES} E2E_ENGINES=${engine}\nlast steps:\n${events.slice(-60).join('\n')}`);
    })));
});
