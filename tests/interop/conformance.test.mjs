// The conformance check (server/conformance, the built sw-outbox-conformance binary)
// against the express-idempotency app of server.mjs: the results the README's "Server
// compatibility" table states for express-idempotency 1.0.6, asserted duty by duty.
// No browser.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { after, before, test } from 'node:test';
import { repoRoot } from '../e2e/harness.mjs';
import { startInteropServer } from './harness.mjs';

const BIN = process.env.SW_OUTBOX_CONFORMANCE
  || resolve(repoRoot, 'target/release/sw-outbox-conformance');

/** What the README tells an express-idempotency user to run (see "Check your server"). */
const ARGS = [
  '--user', 'alice', '--password', 'alice',
  '--count', '/__control/applied', '--count-pointer', '/applied',
  '--slow-hook', 'POST /__control/fault {"kind":"slow","ms":3000}',
  '--key-probe', '1s',
];

let s;
before(async () => {
  if (!existsSync(BIN)) throw new Error(`${BIN} is missing: run ./build.sh (it builds the conformance check)`);
  s = await startInteropServer();
});
after(async () => { await s?.stop(); });

/** Runs the binary; resolves with its exit code and output (never rejects on a nonzero exit). */
function conformance(args) {
  return new Promise((done, fail) => {
    execFile(BIN, [s.baseUrl, ...args], { timeout: 120000 }, (err, stdout, stderr) => {
      if (err && typeof err.code !== 'number') return fail(err);
      return done({ code: err ? err.code : 0, stdout, stderr });
    });
  });
}

test('express-idempotency: every duty as the README table states, expected account "not supported"', async () => {
  await s.reset();
  const run = await conformance([...ARGS, '--json']);
  const report = JSON.parse(run.stdout);
  const by = Object.fromEntries(report.findings.map((f) => [f.duty, f]));
  const outcomes = Object.fromEntries(report.findings.map((f) => [f.duty, f.outcome]));
  assert.deepEqual(outcomes, {
    'auth-me': 'pass',
    replay: 'pass',
    'concurrent-repeat': 'pass',
    'key-reuse': 'pass',
    'expected-account': 'not-supported',
    csrf: 'pass',
    'signed-out-write': 'pass',
    'key-window': 'pass',
    'page-keys': 'pass',
  }, run.stdout + run.stderr);
  assert.equal(run.code, 0, 'nothing the outbox needs failed');
  // The table's express column, row by row.
  assert.match(by.replay.server, /^201 then 201; ran once$/, 'a replay: 2xx, no marker');
  assert.ok(by.replay.notes.some((n) => /no Idempotent-Replayed/.test(n)), by.replay.notes.join('\n'));
  assert.ok(by.replay.notes.some((n) => /Location header is not replayed/.test(n)), 'only Content-Type kept');
  assert.match(by['concurrent-repeat'].server, /409 text\/html "Conflict"; ran once$/, 'a bare HTML 409 while running');
  assert.match(by['concurrent-repeat'].outbox, /leaves the record queued .* 3 such answers in a row → needs attention \(conflict\)/);
  assert.match(by['key-reuse'].server, /417 text\/html "Expectation Failed"; ran 0 times/);
  assert.equal(by['key-reuse'].outbox, 'needs attention: key-reused (status 417)');
  assert.match(by['expected-account'].server, /: 201; ran once$/, 'the header is ignored and the write applied');
  assert.match(by['expected-account'].outbox, /holds replays across a sign-in/);
  assert.match(by.csrf.server, /403 \{"detail":"csrf_failed"\}/, "the app's own 403");
  // The check wrote through the route, nothing else did: the ground truth agrees.
  const applied = await s.applied();
  assert.ok(applied.length >= 10, `applied ${applied.length}`);
  const keys = applied.map((a) => a.key);
  assert.equal(new Set(keys).size, keys.length, 'no key applied twice');
});

test('express-idempotency: the text report, as a person reads it', async () => {
  await s.reset();
  const run = await conformance(ARGS);
  assert.equal(run.code, 0, run.stdout + run.stderr);
  assert.match(run.stdout, /^\[not supported\] expected-account: /m);
  assert.match(run.stdout, /^9 duties: 8 pass, 0 fail, 1 not supported, 0 not checked$/m);
});

test('a slow hook the server refuses leaves the concurrent check "not checked", never "pass"', async () => {
  await s.reset();
  const run = await conformance([...ARGS.slice(0, -4), '--slow-hook', 'POST /__control/fault {"kind":"bogus"}', '--key-probe', '1s', '--json']);
  const concurrent = JSON.parse(run.stdout).findings.find((f) => f.duty === 'concurrent-repeat');
  assert.equal(concurrent.outcome, 'not-checked', JSON.stringify(concurrent));
  assert.match(concurrent.server, /slow hook POST \/__control\/fault answered 400/);
});
