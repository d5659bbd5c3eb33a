// The interop suite's page: registers the outbox worker with a test configuration,
// waits until it controls the page, and exposes what the tests drive on `window.interop`.
import { registerOutbox } from '/outbox-client.js';

/** No app shell (nothing to precache); a short first-attempt timeout, so a slow write is
 * queued soon enough for the tests. */
const config = { precache: [], attemptTimeoutMs: 3000 };

const interop = {
  config,
  client: null,
  csrfToken: null,
  /** Every message the worker sent this page, reports and answers. */
  messages: [],
};
window.interop = interop;

async function readAnswer(res) {
  const text = await res.text();
  let body = text;
  try { body = JSON.parse(text); } catch { /* not JSON: keep the text */ }
  return {
    status: res.status,
    headers: Object.fromEntries(res.headers.entries()),
    body,
  };
}

/** Signs in as the server's login route wants, then binds the worker to that account. */
interop.signIn = async (userId, password = userId) => {
  const res = await fetch('/api/auth/login', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ userId, password }),
  });
  const answer = await readAnswer(res);
  if (res.ok) interop.csrfToken = answer.body.csrfToken;
  const session = res.ok ? await interop.client.authSession(userId) : null;
  return { ...answer, session };
};

/** A task write as the app makes it: JSON, with the session's CSRF token, plus `headers`
 * (an `Idempotency-Key` of the page's own, for instance). */
interop.write = async (pid, title, headers = {}) => {
  const res = await fetch(`/api/projects/${encodeURIComponent(pid)}/tasks`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', 'X-CSRF-Token': interop.csrfToken ?? '', ...headers },
    body: JSON.stringify({ title }),
  });
  return readAnswer(res);
};

interop.flush = () => interop.client.flush();
interop.list = () => interop.client.list();
interop.clearDevice = () => interop.client.clearDevice();

interop.ready = (async () => {
  const client = await registerOutbox({
    scriptUrl: `/sw.js?config=${encodeURIComponent(JSON.stringify(config))}`,
  });
  client.on('*', (m) => { interop.messages.push(JSON.parse(JSON.stringify(m))); });
  interop.client = client;
  await client.controlled;
  return true;
})();
interop.ready.catch((err) => { interop.startError = String(err?.stack ?? err); });
