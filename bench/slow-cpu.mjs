// A slower CPU for the browser: a CFS bandwidth quota (cgroup `cpu` controller) on every
// process of one Chromium, so every thread of that browser, the service worker's included,
// gets a fraction of one core.
//
// Why not CDP: `Emulation.setCPUThrottlingRate` sent to a service worker target answers
// "Operation is only supported for pages, not workers", and the same call on the page
// slows the page's thread only (a tight loop timed inside the worker ran as fast as before:
// 29 ms against 25 ms unthrottled, while the page's took 110 ms).
//
// The quota applies to the browser as a whole (all its processes share it), so it is a
// single core about `factor` times slower, which is harsher on work that a phone would
// spread over several slow cores. The factor is checked, not assumed: `calibrate` times a
// fixed loop inside a service worker with and without the quota (on a quiet machine,
// quota = period / 4 made it 4.0× slower, on the worker's thread and on a page's).
//
// Needs root and a writable cgroup hierarchy: cgroup v1 (`/sys/fs/cgroup/cpu`) or v2
// (`/sys/fs/cgroup` with the cpu controller enabled for children).
import { chmodSync, existsSync, mkdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const V1 = '/sys/fs/cgroup/cpu';
const V2 = '/sys/fs/cgroup';

function hierarchy() {
  if (existsSync(join(V1, 'cpu.cfs_quota_us'))) return 'v1';
  if (existsSync(join(V2, 'cgroup.controllers'))) {
    const ctl = readFileSync(join(V2, 'cgroup.subtree_control'), 'utf8');
    if (/\bcpu\b/.test(ctl)) return 'v2';
  }
  return null;
}

/**
 * Creates a cgroup and a wrapper script that puts itself into it and then execs Chromium,
 * so the browser and every process it starts are under the quota from the first instruction.
 * Returns null with a reason when the machine has no usable cgroup.
 */
export function createSlowCpu({ name, wrapperDir, chromium = '/usr/bin/chromium', periodUs = 8000 }) {
  const kind = hierarchy();
  if (!kind) return { error: 'no writable cgroup cpu controller (cgroup v1 /sys/fs/cgroup/cpu or v2 with +cpu)' };
  const dir = join(kind === 'v1' ? V1 : V2, name);
  try {
    mkdirSync(dir, { recursive: true });
  } catch (e) {
    return { error: `cannot create ${dir}: ${e.message}` };
  }
  const setQuota = (quotaUs) => {
    if (kind === 'v1') {
      writeFileSync(join(dir, 'cpu.cfs_period_us'), String(periodUs));
      writeFileSync(join(dir, 'cpu.cfs_quota_us'), quotaUs == null ? '-1' : String(Math.round(quotaUs)));
    } else {
      writeFileSync(join(dir, 'cpu.max'), `${quotaUs == null ? 'max' : Math.round(quotaUs)} ${periodUs}`);
    }
  };
  setQuota(null);
  mkdirSync(wrapperDir, { recursive: true });
  const wrapper = join(wrapperDir, `${name}.sh`);
  writeFileSync(wrapper, `#!/bin/sh\necho $$ > '${join(dir, 'cgroup.procs')}'\nexec '${chromium}' "$@"\n`);
  chmodSync(wrapper, 0o755);

  const procs = () => readFileSync(join(dir, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean);
  return {
    kind, dir, wrapper, periodUs, setQuota, procs,
    /**
     * Sets the quota to `factor` times less than one core (periodUs / factor) and checks
     * it: `measure()` times a fixed loop on the worker's thread (ms), without the quota and
     * with it. The quota is fixed rather than fitted to the loop, so the setting means the
     * same at any load; the measured factor says what it did (under load from elsewhere
     * the unthrottled loop is slower too, so the factor comes out lower).
     */
    async calibrate(measure, factor) {
      const med = async () => { const xs = [await measure(), await measure(), await measure()]; return xs.sort((a, b) => a - b)[1]; };
      setQuota(null);
      const baseMs = await med();
      const quotaUs = Math.max(1000, Math.round(periodUs / factor)); // the kernel's floor is 1 ms
      setQuota(quotaUs);
      const slowMs = await med();
      return { periodUs, quotaUs, baseMs, slowMs, factor: slowMs / baseMs };
    },
    /** Lifts the quota and removes the cgroup (once the browser has exited). */
    async dispose() {
      try { setQuota(null); } catch { /* already gone */ }
      for (let i = 0; i < 20; i++) {
        try { rmdirSync(dir); return; } catch { /* processes still exiting */ }
        await new Promise((r) => setTimeout(r, 250));
      }
      // Leftover processes of this browser: move them to the parent so the group can go.
      const parent = join(dir, '..', 'cgroup.procs');
      for (const pid of procs()) { try { writeFileSync(parent, pid); } catch { /* exited */ } }
      try { rmdirSync(dir); } catch (e) { console.error(`[bench] could not remove ${dir}: ${e.message}`); }
    },
  };
}
