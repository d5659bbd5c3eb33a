#!/usr/bin/env node
// Where the worker's time goes during offline enqueue: a V8 CPU profile of the service
// worker while a page sends N writes with 16 in flight to one workspace, the reference
// server dropping every connection (real network failures). Prints writes/s, the share
// of time the worker thread was idle, and the functions with the most self time.
//
//   node bench/profile-enqueue.mjs [--n=500] [--inflight=16] [--www=DIR]
//
// It drives Chromium through tests/e2e/cdp.mjs (DevTools attaches to the worker only for
// the profile), against the release server binary (`./build.sh` builds it). The profiler
// slows the worker down; the figures are for finding the hot spots, not for comparing.
import { resolve } from 'node:path';
import { launchChromium } from '../tests/e2e/cdp.mjs';
import { controlClient, repoRoot, startServer, stopServer } from '../tests/e2e/harness.mjs';

const arg = (name, dflt) => {
  const a = process.argv.find((x) => x.startsWith(`--${name}=`));
  return a ? a.slice(name.length + 3) : dflt;
};
const N = Number(arg('n', 500));
const IN_FLIGHT = Number(arg('inflight', 16));
const www = resolve(repoRoot, arg('www', 'www'));

const server = startServer(resolve(repoRoot, 'target/release/sw-outbox-server'), www);
const base = await server.baseUrl;
const control = controlClient(base);
const browser = await launchChromium();

try {
  // Sign in through the demo (the worker binds the account), then leave for a page of
  // the scope that runs nothing, so only the writes below reach the worker.
  const tab = await browser.openTab(`${base}/`);
  await tab.until(() => Boolean(window.demo?.client && navigator.serviceWorker.controller));
  await tab.signIn('alice');
  await tab.navigate(`${base}/icon.svg`);
  await tab.until(() => location.pathname === '/icon.svg' && document.readyState === 'complete'
    && Boolean(navigator.serviceWorker.controller));
  await control('network', { down: true });

  const writes = (n, ws) => tab.evaluate(async ([count, inFlight, workspace]) => {
    let next = 0;
    const statuses = {};
    const body = JSON.stringify({ title: 'x'.repeat(1000) });
    const t0 = performance.now();
    await Promise.all(Array.from({ length: inFlight }, async () => {
      while (next < count) {
        next += 1;
        const r = await fetch(`/api/projects/${workspace}/tasks`, {
          method: 'POST', headers: { 'Content-Type': 'application/json', 'X-Expected-Account': 'alice' }, body,
        });
        await r.text();
        statuses[r.status] = (statuses[r.status] || 0) + 1;
      }
    }));
    return { writesPerSec: count / ((performance.now() - t0) / 1000), statuses };
  }, [n, IN_FLIGHT, ws]);

  await writes(50, 'warm-up');
  const worker = (await browser.send('Target.getTargets')).targetInfos.find((x) => x.type === 'service_worker');
  const { sessionId } = await browser.send('Target.attachToTarget', { targetId: worker.targetId, flatten: true });
  const onWorker = (method, params) => browser.send(method, params, sessionId);
  await onWorker('Profiler.enable');
  await onWorker('Profiler.setSamplingInterval', { interval: 200 });
  await onWorker('Profiler.start');
  const result = await writes(N, 'profiled');
  const { profile } = await onWorker('Profiler.stop');

  const nodes = new Map(profile.nodes.map((n) => [n.id, n]));
  const selfUs = new Map();
  profile.samples.forEach((id, i) => {
    const { functionName, url, lineNumber } = nodes.get(id).callFrame;
    const name = `${functionName || '(anonymous)'}${url ? ` ${url.split('/').pop()}:${lineNumber + 1}` : ''}`;
    selfUs.set(name, (selfUs.get(name) ?? 0) + (profile.timeDeltas[i] ?? 0));
  });
  const total = [...selfUs.values()].reduce((a, b) => a + b, 0);
  const idle = selfUs.get('(idle)') ?? 0;
  console.log(`${N} writes, ${IN_FLIGHT} in flight, statuses ${JSON.stringify(result.statuses)}: ${result.writesPerSec.toFixed(0)} writes/s under the profiler`);
  console.log(`worker thread busy ${(100 * (1 - idle / total)).toFixed(0)}% of ${(total / 1000).toFixed(0)} ms: ${((total - idle) / 1000 / N).toFixed(2)} ms per write`);
  console.log('self time (ms), top 20:');
  for (const [name, us] of [...selfUs].sort((a, b) => b[1] - a[1]).slice(0, 20)) {
    console.log(`${(us / 1000).toFixed(1).padStart(9)}  ${name}`);
  }
} finally {
  await browser.close();
  await stopServer(server.child);
}
