// What express-idempotency 1.0.6 really answers, asked from Node (no browser, no worker):
// the facts tests/interop/README.md lists and the outbox must read correctly. If a new
// version of the package answers otherwise, this file says so before the browser suite
// fails for a reason that is hard to see.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { eventually } from '../e2e/outbox-helpers.mjs';
import { startInteropServer } from './harness.mjs';

const TASKS = '/api/projects/p1/tasks';

let s;
before(async () => { s = await startInteropServer(); });
after(async () => { await s?.stop(); });

/** Signs in; returns the headers every write of that account needs. */
async function signIn(userId) {
  const res = await fetch(`${s.baseUrl}/api/auth/login`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ userId, password: userId }),
  });
  assert.equal(res.status, 200);
  const cookie = res.headers.get('set-cookie');
  assert.match(cookie, /^sid=[^;]+; Path=\/; HttpOnly; SameSite=Lax$/, `session cookie: ${cookie}`);
  const { user, csrfToken } = await res.json();
  assert.deepEqual(user, { id: userId });
  return { Cookie: cookie.split(';')[0], 'X-CSRF-Token': csrfToken };
}

/** POSTs a task as `auth`; returns status, the headers that matter here, and the body text. */
async function post(auth, title, key) {
  const headers = { ...auth, 'Content-Type': 'application/json' };
  if (key !== undefined) headers['Idempotency-Key'] = key;
  const res = await fetch(`${s.baseUrl}${TASKS}`, { method: 'POST', headers, body: JSON.stringify({ title }) });
  const pick = ['content-type', 'idempotency-key', 'idempotent-replayed', 'location', 'connection'];
  return {
    status: res.status,
    headers: Object.fromEntries(pick.map((n) => [n, res.headers.get(n)])),
    text: await res.text(),
  };
}

let alice;
async function fresh() {
  await s.reset();
  alice = await signIn('alice');
}

test('a fresh key runs the route: 201 JSON, the key echoed, Connection: close', async () => {
  await fresh();
  const r = await post(alice, 'one', 'k-fresh');
  assert.equal(r.status, 201);
  assert.deepEqual(r.headers, {
    'content-type': 'application/json; charset=utf-8',
    'idempotency-key': 'k-fresh',
    'idempotent-replayed': null,
    location: '/api/projects/p1/tasks/1',
    connection: 'close',
  });
  assert.deepEqual(JSON.parse(r.text), { id: 1, projectId: 'p1', title: 'one', done: false, owner: 'alice' });
  assert.equal((await s.applied()).length, 1);
});

test('the same key and request again: the stored 2xx, same status and body, only Content-Type kept, no replay marker', async () => {
  await fresh();
  const first = await post(alice, 'twice', 'k-again');
  const again = await post(alice, 'twice', 'k-again');
  assert.equal(again.status, 201);
  assert.equal(again.text, first.text);
  assert.equal(again.headers['content-type'], 'application/json; charset=utf-8');
  assert.equal(again.headers['idempotency-key'], 'k-again');
  assert.equal(again.headers['idempotent-replayed'], null, 'express-idempotency sends no Idempotent-Replayed');
  assert.equal(again.headers.location, null, 'a stored answer keeps Content-Type only: Location is gone');
  assert.equal((await s.applied()).length, 1, 'the route ran once');
});

test('the same key while the first request still runs: 409, an HTML error page, no JSON', async () => {
  await fresh();
  await s.fault('slow', 120000);
  const first = post(alice, 'held', 'k-held');
  await eventually(async () => (await s.running()) === 1, { what: 'the first request to be in the route' });
  const during = await post(alice, 'held', 'k-held');
  assert.equal(during.status, 409);
  assert.equal(during.headers['content-type'], 'text/html; charset=utf-8');
  assert.equal(during.headers['idempotency-key'], 'k-held');
  assert.equal(during.headers['idempotent-replayed'], null);
  assert.match(during.text, /^<!DOCTYPE html>\n[\s\S]*<pre>Conflict<\/pre>/, during.text);
  assert.throws(() => JSON.parse(during.text), 'no JSON body to read a code from');
  assert.deepEqual(await s.applied(), []);

  await s.release();
  const firstAnswer = await first;
  assert.equal(firstAnswer.status, 201);
  const after = await post(alice, 'held', 'k-held');
  assert.equal(after.status, 201, 'once the first finished, its stored 2xx');
  assert.equal(after.text, firstAnswer.text);
  assert.equal((await s.applied()).length, 1);
});

test('the same key with another request: 417, an HTML error page; the stored answer stays', async () => {
  await fresh();
  const first = await post(alice, 'original', 'k-misuse');
  const misuse = await post(alice, 'something else', 'k-misuse');
  assert.equal(misuse.status, 417);
  assert.equal(misuse.headers['content-type'], 'text/html; charset=utf-8');
  assert.match(misuse.text, /<pre>Expectation Failed<\/pre>/, misuse.text);
  assert.equal((await s.applied()).length, 1, 'the misuse ran nothing');
  const again = await post(alice, 'original', 'k-misuse');
  assert.equal(again.status, 201);
  assert.equal(again.text, first.text);
});

test('a non-2xx answer is not stored: the key is forgotten, and the retry runs the route', async () => {
  await fresh();
  await s.fault('fail-once');
  const failed = await post(alice, 'after 500', 'k-500');
  assert.equal(failed.status, 500);
  assert.deepEqual(JSON.parse(failed.text), { detail: 'injected' });
  assert.deepEqual(await s.applied(), []);
  const retry = await post(alice, 'after 500', 'k-500');
  assert.equal(retry.status, 201);
  const applied = await s.applied();
  assert.deepEqual(applied.map((a) => a.key), ['k-500'], 'applied once, by the retry');
});

test('keys of any shape are taken as they are', async () => {
  await fresh();
  const keys = ['order_1234', 'a'.repeat(80), 'k:7f3e', 'x'];
  for (const key of keys) {
    const r = await post(alice, `key ${key.length}`, key);
    assert.equal(r.status, 201, `${key}: ${r.text}`);
    assert.equal(r.headers['idempotency-key'], key);
  }
  assert.deepEqual((await s.applied()).map((a) => a.key), keys);
});

test('without a key the middleware does nothing: each request runs the route', async () => {
  await fresh();
  const a = await post(alice, 'no key');
  const b = await post(alice, 'no key');
  assert.equal(a.status, 201);
  assert.equal(b.status, 201);
  assert.equal(a.headers['idempotency-key'], null);
  assert.equal((await s.applied()).length, 2);
});

test('keys are not scoped by account: another account with the same key and body gets the stored answer', async () => {
  await fresh();
  const bob = await signIn('bob');
  const mine = await post(alice, 'shared key', 'k-shared');
  const theirs = await post(bob, 'shared key', 'k-shared');
  assert.equal(theirs.status, 201);
  assert.equal(theirs.text, mine.text, 'bob is answered alice\'s stored 201');
  assert.equal(JSON.parse(theirs.text).owner, 'alice');
  assert.deepEqual((await s.applied()).map((a) => a.account), ['alice']);
});

test('the app refuses a write without a session (401) or CSRF token (403) before the middleware', async () => {
  await fresh();
  const noSession = await post({}, 'x', 'k-auth');
  assert.equal(noSession.status, 401);
  assert.deepEqual(JSON.parse(noSession.text), { detail: 'not_signed_in' });
  const noCsrf = await post({ Cookie: alice.Cookie }, 'x', 'k-auth');
  assert.equal(noCsrf.status, 403);
  assert.deepEqual(JSON.parse(noCsrf.text), { detail: 'csrf_failed' });
  const ok = await post(alice, 'x', 'k-auth');
  assert.equal(ok.status, 201, 'the key was never claimed by the refused requests');
  const me = await fetch(`${s.baseUrl}/api/auth/me`, { headers: { Cookie: alice.Cookie } });
  assert.equal(me.status, 200);
  assert.deepEqual(await me.json(), { user: { id: 'alice' }, csrfToken: alice['X-CSRF-Token'] });
  const anon = await fetch(`${s.baseUrl}/api/auth/me`);
  assert.equal(anon.status, 401);
  assert.deepEqual(await anon.json(), { user: null });
});
