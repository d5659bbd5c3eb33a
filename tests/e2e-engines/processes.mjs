// The WebDriver servers the Firefox and WebKit engines talk to, started and ended by the
// test process: each in a process group of its own, so the browser it launched goes
// with it, and killed too when the test process ends without closing them.
import { spawn } from 'node:child_process';
import { createServer, connect } from 'node:net';
import { createInterface } from 'node:readline';

const endHooks = new Set();
let endHooked = false;

/** Registers `fn` (synchronous) to run when the process ends, whatever ends it (an
 * uncaught error, Ctrl-C, the runner's SIGTERM); returns its remover. */
export function atProcessEnd(fn) {
  if (!endHooked) {
    endHooked = true;
    // Last registered first: a browser is killed before its profile is removed.
    const runAll = () => {
      for (const f of [...endHooks].reverse()) { try { f(); } catch { /* best effort */ } }
      endHooks.clear();
    };
    process.on('exit', runAll);
    for (const [signal, code] of [['SIGINT', 130], ['SIGTERM', 143]]) {
      process.once(signal, () => { runAll(); process.exit(code); });
    }
  }
  endHooks.add(fn);
  return () => endHooks.delete(fn);
}

/**
 * SIGKILLs every process whose command line holds `marker` (a browser's unique profile
 * directory: only the browser this test process started has it), as a phone's system
 * kills a browser. Linux only (/proc). Resolves with how many were killed.
 */
export async function killProcessesUsing(marker) {
  const { readdir, readFile } = await import('node:fs/promises');
  let killed = 0;
  for (const pid of await readdir('/proc')) {
    if (!/^\d+$/.test(pid) || Number(pid) === process.pid) continue;
    const cmdline = await readFile(`/proc/${pid}/cmdline`, 'utf8').catch(() => '');
    if (!cmdline.split('\0').some((arg) => arg.includes(marker))) continue;
    try { process.kill(Number(pid), 'SIGKILL'); killed += 1; } catch { /* already gone */ }
  }
  return killed;
}

/** A TCP port free right now on 127.0.0.1 (for a driver that cannot pick its own). */
export function freePort() {
  return new Promise((resolvePort, reject) => {
    const srv = createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolvePort(port));
    });
  });
}

function accepts(port) {
  return new Promise((res) => {
    const s = connect(port, '127.0.0.1');
    s.once('connect', () => { s.destroy(); res(true); });
    s.once('error', () => res(false));
  });
}

/**
 * Starts a WebDriver server: `bin args…` in its own process group. The URL comes from a
 * "Listening on host:port" line (`listenLine`) or, given `port`, from that port
 * accepting connections. Resolves with {url, output, stop}.
 */
export async function startDriver({ name, bin, args, port, listenLine, timeoutMs = 20000 }) {
  const output = [];
  const note = (line) => { output.push(`[${name}] ${line}`); if (output.length > 400) output.shift(); };
  const child = spawn(bin, args, { stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  const killGroup = (signal) => { try { process.kill(-child.pid, signal); } catch { /* gone */ } };
  const unhook = atProcessEnd(() => killGroup('SIGKILL'));
  let exited = null;
  const exit = new Promise((r) => child.once('exit', (code, signal) => { exited = { code, signal }; r(); }));
  let announced = null;
  const onLine = (line) => {
    note(line);
    const m = listenLine && listenLine.exec(line);
    if (m && !announced) announced = `http://${m[1].replace(/^https?:\/\//, '')}`;
  };
  createInterface({ input: child.stdout }).on('line', onLine);
  createInterface({ input: child.stderr }).on('line', onLine);
  child.on('error', (err) => note(`spawn failed: ${err.message}`));

  async function stop() {
    unhook();
    if (!exited) {
      killGroup('SIGTERM');
      const timer = setTimeout(() => killGroup('SIGKILL'), 5000);
      await exit;
      clearTimeout(timer);
    }
    // The browser's own processes share the group; none may outlive the driver.
    killGroup('SIGKILL');
  }

  const end = Date.now() + timeoutMs;
  for (;;) {
    if (exited) throw new Error(`${name} exited early (${JSON.stringify(exited)}):\n${output.join('\n')}`);
    if (announced) return { url: announced, output, stop };
    if (port && await accepts(port)) return { url: `http://127.0.0.1:${port}`, output, stop };
    if (Date.now() > end) {
      await stop();
      throw new Error(`${name} did not listen within ${timeoutMs} ms:\n${output.join('\n')}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}
