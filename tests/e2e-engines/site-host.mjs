// The site's host as the browser reaches it: a small HTTP proxy in front of the reference
// server (which serves the site's files and its API), with a switch that drops every
// connection, pages and files included. The reference server's own network switch drops
// only /api/; an offline launch needs the page to fail too, in every engine (WebKit's
// automation has no offline switch, and in Chromium playwright's offline switch and CDP's
// worker stop do not mix in one context: bench/run.mjs). A dropped connection is a real
// network failure for the page and for the worker's fetch.
import http from 'node:http';

/**
 * Starts the proxy for `target` (the reference server's base URL). Resolves with
 * `{origin, setDown(down), close()}`; the proxy forwards the browser's own Host, so the
 * server's same-origin checks see the origin the page has.
 */
export async function startSiteHost(target) {
  const to = new URL(target);
  let down = false;
  const sockets = new Set();
  /** Every request forwarded, with the status the server answered. */
  const log = [];
  const server = http.createServer((req, res) => {
    if (down) {
      req.socket.destroy();
      return;
    }
    const upstream = http.request({
      host: to.hostname, port: to.port, method: req.method, path: req.url, headers: req.headers,
    }, (answer) => {
      log.push({ method: req.method, path: req.url, status: answer.statusCode });
      res.writeHead(answer.statusCode ?? 502, answer.rawHeaders);
      answer.pipe(res);
    });
    upstream.on('error', () => req.socket.destroy());
    req.pipe(upstream);
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise((resolve, reject) => server.listen(0, '127.0.0.1', resolve).on('error', reject));
  return {
    origin: `http://127.0.0.1:${server.address().port}`,
    /** The requests forwarded so far: `{method, path, status}`. */
    requests: () => log.slice(),
    /** Drops every connection (`true`), open ones included, or forwards again. */
    setDown(value) {
      down = value;
      if (down) for (const s of sockets) s.destroy();
    },
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}
