// Pages and locators over a W3C WebDriver session (selenium-webdriver, classic protocol),
// with the verbs of playwright's Page that the tests use — goto, reload, evaluate,
// waitForFunction, locator, getByTestId, getByRole and their locators' click, fill,
// isVisible, waitFor, filter, and, count, textContent, inputValue — so a scenario written
// for one runs unchanged on the other.
//
// A WebDriver session has one current tab: every command of a page runs under a lock
// that first switches to that page's tab, so two pages never interleave commands.
import { By } from 'selenium-webdriver';

/** A wait that ran out (like playwright's TimeoutError). */
export class TimeoutError extends Error {}

/** One command at a time per session, each in the tab (window handle) it names. */
export class SessionLock {
  constructor(driver) {
    this.driver = driver;
    this.current = null;
    this.tail = Promise.resolve();
  }

  /** Runs `fn` with the session switched to `handle` (null: wherever it is). */
  run(handle, fn) {
    const go = async () => {
      if (handle && this.current !== handle) {
        await this.driver.switchTo().window(handle);
        this.current = handle;
      } else if (!handle && this.current === null) {
        // The current tab was closed: a command for no tab in particular (a new tab, a
        // privileged script) still needs a live one to start from.
        const [first] = await this.driver.getAllWindowHandles();
        if (first) {
          await this.driver.switchTo().window(first);
          this.current = first;
        }
      }
      return fn(this.driver);
    };
    const result = this.tail.then(go, go);
    this.tail = result.then(() => {}, () => {});
    return result;
  }
}

/** The tabs of one WebDriver session, each as a WebDriverPage. */
export class WebDriverTabs {
  /**
   * `workerAnswers` (optional): the engine's own record of the navigations a service
   * worker answered, for engines whose Navigation Timing does not say (Firefox leaves
   * `workerStart` 0): `{ mark(): Promise<token>, since(token): Promise<string[]> }`, the
   * URLs answered by a worker since the mark.
   */
  constructor(driver, { workerAnswers = null } = {}) {
    this.lock = new SessionLock(driver);
    this.byHandle = new Map();
    this.workerAnswers = workerAnswers;
  }

  /** Starts with the session's first tab. */
  async init() {
    this.track(await this.lock.driver.getWindowHandle());
    return this;
  }

  track(handle) {
    const page = new WebDriverPage(this.lock, handle, (p) => this.byHandle.delete(p.handle), this.workerAnswers);
    this.byHandle.set(handle, page);
    return page;
  }

  /** The tabs opened or seen so far (not those the browser opened since: openPages). */
  pages() { return [...this.byHandle.values()]; }

  newPage() {
    return this.lock.run(null, async (d) => {
      await d.switchTo().newWindow('tab'); // switches to it
      const handle = await d.getWindowHandle();
      this.lock.current = handle;
      return this.track(handle);
    });
  }

  /** Every tab now open, those the browser opened itself (window.open,
   * clients.openWindow) included; tabs that closed are dropped. */
  openPages() {
    return this.lock.run(null, async (d) => {
      const handles = await d.getAllWindowHandles();
      for (const handle of handles) if (!this.byHandle.has(handle)) this.track(handle);
      for (const [handle, page] of [...this.byHandle]) {
        if (!handles.includes(handle)) {
          page.closed = true;
          this.byHandle.delete(handle);
        }
      }
      return this.pages();
    });
  }
}

/** The page script that runs `fn(arg)` and answers {ok, value} or {ok: false, error}
 * (the function's source is part of the script: no eval, whatever the page's CSP). */
const runner = (fn) => `const done = arguments[arguments.length - 1];
  Promise.resolve().then(() => (${fn})(arguments[0])).then(
    (value) => done({ ok: true, value: value === undefined ? null : value }),
    (e) => done({ ok: false, error: String((e && e.stack) ? (e.message + '\\n' + e.stack) : e) }));`;

/** A tab of a WebDriver browser. */
export class WebDriverPage {
  constructor(lock, handle, onClose, workerAnswers = null) {
    this.lock = lock;
    this.handle = handle;
    this.onClose = onClose;
    this.workerAnswers = workerAnswers;
    this.closed = false;
  }

  run(fn) {
    if (this.closed) return Promise.reject(new Error('the page is closed'));
    return this.lock.run(this.handle, fn);
  }

  /** Navigates to `url`; resolves with the navigation's answer (NavigationResponse). */
  async goto(url) {
    const mark = await this.workerAnswers?.mark();
    await this.run((d) => d.get(url));
    return this.navigationResponse(mark);
  }

  /**
   * Reloads the page as the page itself would (`location.reload()`: a WebDriver Refresh
   * is a hard reload in Firefox, which bypasses the service worker) and waits for the
   * new document to have loaded; resolves with its answer (NavigationResponse).
   */
  async reload({ timeout = 30000 } = {}) {
    const token = await this.workerAnswers?.mark();
    const mark = `reload-${Date.now()}-${Math.random()}`;
    await this.run((d) => d.executeScript('window.__reloadMark = arguments[0]; setTimeout(() => location.reload(), 0);', mark));
    await this.waitForFunction((m) => window.__reloadMark !== m && document.readyState === 'complete', mark, { timeout });
    return this.navigationResponse(token);
  }

  /** What the Navigation Timing entry of the current document says of its answer (and
   * the engine's record of worker answers since `token`, where it keeps one). */
  async navigationResponse(token) {
    const nav = await this.evaluate(() => {
      const e = performance.getEntriesByType('navigation')[0];
      return e ? { status: e.responseStatus ?? null, workerStart: e.workerStart, url: location.href } : null;
    });
    if (nav && this.workerAnswers) {
      const answered = await this.workerAnswers.since(token);
      nav.fromWorker = answered.includes(nav.url);
    }
    return new NavigationResponse(nav);
  }

  url() { return this.run((d) => d.getCurrentUrl()); }

  /**
   * Runs `fn` (a function or its source) in the page with one serialisable `arg`,
   * awaiting what it returns, as playwright's page.evaluate does; resolves with its JSON
   * value. A throw or rejection in the page rejects here with the page's stack.
   */
  async evaluate(fn, arg) {
    let r;
    try {
      r = await this.run((d) => d.executeAsyncScript(runner(String(fn)), arg === undefined ? null : arg));
    } catch (err) {
      // A script that never finished: its source names the step that hung (the stack
      // stops in selenium's HTTP client).
      if (err?.name === 'ScriptTimeoutError') err.message += `\nthe page script: ${String(fn).replace(/\s+/g, ' ').slice(0, 300)}`;
      throw err;
    }
    if (!r || typeof r !== 'object' || !('ok' in r)) throw new Error(`page script answered ${JSON.stringify(r)}`);
    if (!r.ok) throw new Error(`in the page: ${r.error}`);
    return r.value;
  }

  /** Polls `fn(arg)` in the page until it is truthy; resolves with that value. A page
   * that is navigating (the script fails) is polled again. */
  async waitForFunction(fn, arg, { timeout = 30000, polling = 100 } = {}) {
    const end = Date.now() + timeout;
    let last;
    for (;;) {
      try {
        const v = await this.evaluate(fn, arg);
        if (v) return v;
        last = v;
      } catch (err) {
        if (this.closed) throw err;
        last = err.message;
      }
      if (Date.now() > end) {
        throw new TimeoutError(`page.waitForFunction: timed out after ${timeout} ms waiting for ${String(fn).slice(0, 200)} (last: ${String(last).slice(0, 300)})`);
      }
      await new Promise((r) => setTimeout(r, polling));
    }
  }

  /** The elements whose data-testid is `id`, as a locator. */
  getByTestId(id) { return new Locator(this, testIdCss(id)); }

  /** The elements a CSS selector matches, as a locator. */
  locator(css) { return new Locator(this, css); }

  /** The elements of an ARIA role (the ones the tests use: heading, button), whose text
   * matches `name` (a string it contains, or a RegExp). */
  getByRole(role, { name } = {}) {
    const css = ROLE_CSS[role];
    if (!css) throw new Error(`getByRole: role ${role} is not mapped (known: ${Object.keys(ROLE_CSS).join(', ')})`);
    return new Locator(this, css, name ?? null);
  }

  async close() {
    if (this.closed) return;
    await this.run((d) => d.close());
    this.closed = true;
    this.lock.current = null;
    this.onClose?.(this);
  }
}

const testIdCss = (id) => `[data-testid="${id.replace(/"/g, '\\"')}"]`;

/** The elements of each role getByRole knows (implicit roles of HTML elements). */
const ROLE_CSS = {
  heading: 'h1, h2, h3, h4, h5, h6, [role="heading"]',
  button: 'button, [role="button"], input[type="button"], input[type="submit"]',
};

/**
 * A navigation's answer, as far as the engine can tell: `status()` its HTTP status
 * (Navigation Timing's `responseStatus`; null where the engine has none), and
 * `fromServiceWorker()` whether a service worker answered it: the engine's own record
 * where it keeps one (Firefox), else whether a worker took the navigation's fetch event
 * (`workerStart` > 0).
 */
export class NavigationResponse {
  constructor(nav) { this.nav = nav; }

  status() { return this.nav?.status ?? null; }

  fromServiceWorker() {
    if (typeof this.nav?.fromWorker === 'boolean') return this.nav.fromWorker;
    return (this.nav?.workerStart ?? 0) > 0;
  }
}

/** Whether `text` matches a locator's text filter (a string it contains, or a RegExp). */
function textMatches(text, hasText) {
  if (hasText === null) return true;
  if (hasText instanceof RegExp) return hasText.test(text);
  return text.includes(hasText);
}

/** The first element matching a CSS selector (and a text, with filter). */
class Locator {
  constructor(page, css, hasText = null) {
    this.page = page;
    this.css = css;
    this.hasText = hasText;
  }

  /** Only the elements whose text contains `hasText` (or matches it, a RegExp). */
  filter({ hasText }) { return new Locator(this.page, this.css, hasText); }

  /** The elements matching this locator and `other` too (both plain CSS selectors of
   * one element, e.g. attribute selectors: they are compounded). */
  and(other) {
    if (this.hasText !== null || other.hasText !== null) throw new Error('and(): text filters are not combined');
    return new Locator(this.page, `${this.css}${other.css}`);
  }

  /** The descendants of the matching elements whose data-testid is `id`. */
  getByTestId(id) {
    if (this.hasText !== null) throw new Error('getByTestId under a text filter is not supported');
    const parts = this.css.split(',').map((c) => `${c.trim()} ${testIdCss(id)}`);
    return new Locator(this.page, parts.join(', '));
  }

  /** The first match: every verb here acts on the first match already. */
  first() { return this; }

  /** The matching elements (text filter included). */
  async elements(d) {
    const out = [];
    for (const el of await d.findElements(By.css(this.css))) {
      if (this.hasText === null || textMatches(await el.getText(), this.hasText)) out.push(el);
    }
    return out;
  }

  /** The matching element, or null. */
  async element(d) {
    for (const el of await d.findElements(By.css(this.css))) {
      if (this.hasText === null || textMatches(await el.getText(), this.hasText)) return el;
    }
    return null;
  }

  /** Runs a read of the matching elements; when the page replaced one between its lookup
   * and the read (the demo re-renders its outbox panel on every report: a stale element
   * reference, seen in Firefox's CI run), looks it up again, as playwright's locators do. */
  async read(fn) {
    for (let tries = 1; ; tries += 1) {
      try {
        return await this.page.run(fn);
      } catch (err) {
        if (err?.name !== 'StaleElementReferenceError' || tries >= 20) throw err;
      }
    }
  }

  /** How many elements match now. */
  count() { return this.read(async (d) => (await this.elements(d)).length); }

  /** The value of the matching form field (waits for it to be attached). */
  async inputValue({ timeout = 30000 } = {}) {
    await this.waitFor({ state: 'attached', timeout });
    return this.read(async (d) => d.executeScript('return arguments[0].value', await this.element(d)));
  }

  async visibleNow(d) {
    const el = await this.element(d);
    return el !== null && await el.isDisplayed();
  }

  isVisible() { return this.read((d) => this.visibleNow(d)); }

  textContent() {
    return this.read(async (d) => {
      const el = await this.element(d);
      return el ? el.getAttribute('textContent') : null;
    });
  }

  /** Waits until the element is visible (the default), hidden, attached or detached. */
  async waitFor({ state = 'visible', timeout = 30000 } = {}) {
    const end = Date.now() + timeout;
    for (;;) {
      const ok = await this.read(async (d) => {
        if (state === 'attached') return (await this.element(d)) !== null;
        if (state === 'detached') return (await this.element(d)) === null;
        const visible = await this.visibleNow(d).catch(() => false);
        return state === 'visible' ? visible : !visible;
      });
      if (ok) return;
      if (Date.now() > end) throw new TimeoutError(`locator ${this.css}${this.hasText ? ` with text ${this.hasText}` : ''}: not ${state} after ${timeout} ms`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  /** Waits for the element to be visible, then clicks it (WebDriver Element Click: a
   * pointer click at its centre, refused if something else would receive it). */
  async click({ timeout = 30000 } = {}) {
    await this.act((el) => el.click(), timeout);
  }

  /** Waits for the field to be visible, empties it and types `value`. */
  async fill(value, { timeout = 30000 } = {}) {
    await this.act(async (el) => {
      await el.clear();
      await el.sendKeys(value);
    }, timeout);
  }

  /** Runs `action` on the visible element; if the page replaced the element between
   * the lookup and the action (the demo re-renders its outbox panel on every report;
   * seen in Firefox as a stale element reference), looks it up again, as playwright's
   * locators do, until `timeout`. */
  async act(action, timeout) {
    const end = Date.now() + timeout;
    for (;;) {
      await this.waitFor({ state: 'visible', timeout: Math.max(0, end - Date.now()) });
      try {
        const done = await this.page.run(async (d) => {
          const el = await this.element(d);
          if (el === null) return false;
          await action(el);
          return true;
        });
        if (done) return;
      } catch (err) {
        if (err?.name !== 'StaleElementReferenceError' || Date.now() > end) throw err;
      }
    }
  }
}
