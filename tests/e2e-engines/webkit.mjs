// WebKit: WebKitGTK's MiniBrowser (Debian's libwebkit2gtk-4.1-0) through WebKitWebDriver's
// W3C WebDriver API (selenium-webdriver as the client), on a virtual X server of its own
// (scripts/webkit-webdriver.sh). WebKitWebDriver has no command that reaches a service
// worker, the network state or a notification: those verbs are absent here (see
// FEATURES in engines.mjs for why).
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { Builder } from 'selenium-webdriver';
import { freePort, startDriver } from './processes.mjs';
import { WebDriverTabs } from './webdriver-page.mjs';
import { repoRoot } from '../e2e/harness.mjs';

/** MiniBrowser's path, from the package that ships it (or WEBKIT_MINIBROWSER). */
export function miniBrowser() {
  if (process.env.WEBKIT_MINIBROWSER) return process.env.WEBKIT_MINIBROWSER;
  try {
    const files = execFileSync('dpkg', ['-L', 'libwebkit2gtk-4.1-0'], { encoding: 'utf8' });
    const found = files.split('\n').find((f) => f.endsWith('/MiniBrowser'));
    if (found) return found;
  } catch { /* not installed: said below */ }
  throw new Error('MiniBrowser not found: ./build.sh installs Debian\'s webkit2gtk-driver (or set WEBKIT_MINIBROWSER)');
}

export async function launchWebKit() {
  const binary = miniBrowser();
  const wrapper = join(repoRoot, 'scripts/webkit-webdriver.sh');
  if (!existsSync(wrapper)) throw new Error(`${wrapper} is missing`);
  const port = await freePort();
  const server = await startDriver({ name: 'webkitwebdriver', bin: wrapper, args: [`--port=${port}`], port });
  let driver;
  try {
    driver = await new Builder().disableEnvironmentOverrides().usingServer(server.url).withCapabilities({
      browserName: 'MiniBrowser',
      pageLoadStrategy: 'normal',
      'webkitgtk:browserOptions': { binary, args: ['--automation'] },
    }).build();
    await driver.manage().setTimeouts({ script: 90000, pageLoad: 30000, implicit: 0 });
  } catch (err) {
    await server.stop().catch(() => {});
    throw err;
  }

  const tabs = await new WebDriverTabs(driver).init();

  return {
    name: 'webkit',
    driver,
    logs: server.output,
    pages: () => tabs.pages(),
    openPages: () => tabs.openPages(),
    newPage: () => tabs.newPage(),
    close: async () => {
      await driver.quit().catch(() => {});
      await server.stop().catch(() => {});
    },
  };
}
