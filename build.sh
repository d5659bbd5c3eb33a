#!/usr/bin/env bash
# sw-outbox: set-up, build, demo and tests in one script, safe to re-run.
#
#   ./build.sh          install what is missing, build the worker and the server
#   ./build.sh demo     ... then run the demo (server + PWA) on http://127.0.0.1:8080
#   ./build.sh test     ... then run every test: host, service worker (Chromium,
#                       Firefox, WebKit), end to end (Chromium, Firefox, WebKit), the npm
#                       package, the interop suite, the benchmark smoke, the shared
#                       PostgreSQL ledger of two servers, the idempotency crate's packing
#
# Nothing here downloads a prebuilt binary from outside the package registries:
# Rust tools come from crates.io, browsers from Debian, Node packages from npm, and
# wasm-pack is pointed at the installed tools (--mode no-install).
set -euo pipefail
cd "$(dirname "$0")"
ROOT=$(pwd)

WASM_PACK_VERSION=0.15.1
GECKODRIVER_VERSION=0.37.1
# The CLI must equal the crate's wasm-bindgen exactly; read it from Cargo.toml.
WASM_BINDGEN_VERSION=$(sed -n 's/^wasm-bindgen = "=\([0-9.]*\)".*/\1/p' Cargo.toml)
PORT=${PORT:-8080}

export PATH="$HOME/.cargo/bin:$ROOT/node_modules/.bin:$PATH"

step() { printf '\n== %s\n' "$*"; }

apt_updated=
apt_install() {
  if [ -z "$apt_updated" ]; then
    apt-get update -qq
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

setup() {
  step "toolchain"
  if ! rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown; then
    rustup target add wasm32-unknown-unknown
  fi
  if [ "$(wasm-pack --version 2>/dev/null)" != "wasm-pack $WASM_PACK_VERSION" ]; then
    cargo install --locked "wasm-pack@$WASM_PACK_VERSION"
  fi
  if [ "$(wasm-bindgen --version 2>/dev/null)" != "wasm-bindgen $WASM_BINDGEN_VERSION" ] \
     || ! command -v wasm-bindgen-test-runner >/dev/null; then
    # Without --locked: the CLI's lock file pins a yanked prerelease dependency.
    cargo install --force "wasm-bindgen-cli@$WASM_BINDGEN_VERSION"
  fi
  if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
    apt_install chromium chromium-driver
  fi
  # Firefox runs the service-worker tests too: Debian's ESR, geckodriver from crates.io.
  if [ ! -x /usr/bin/firefox-esr ]; then
    apt_install firefox-esr
  fi
  # WebKit (Safari's engine) runs the service-worker and end-to-end tests too:
  # WebKitGTK's WebDriver and its MiniBrowser, under a virtual X server (MiniBrowser
  # needs a display, even with --headless).
  if ! command -v WebKitWebDriver >/dev/null || ! command -v xvfb-run >/dev/null; then
    apt_install webkit2gtk-driver xvfb
  fi
  # The server's PostgreSQL ledger tests start a throwaway cluster with these binaries
  # (they never use the cluster the package itself may create).
  if ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
    apt_install postgresql
  fi
  # The multi-instance ledger test skews one server's clock with libfaketime (LD_PRELOAD).
  if ! compgen -G '/usr/lib/*/faketime/libfaketimeMT.so.1' >/dev/null; then
    apt_install faketime
  fi
  if [ "$(geckodriver --version 2>/dev/null | head -1 | cut -d' ' -f2)" != "$GECKODRIVER_VERSION" ]; then
    cargo install --locked "geckodriver@$GECKODRIVER_VERSION"
  fi
  step "node packages"
  if [ ! -x node_modules/.bin/wasm-opt ] || [ ! -d node_modules/playwright-core ] \
     || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    npm ci --no-audit --no-fund
  fi
  echo "wasm-pack $(wasm-pack --version | cut -d' ' -f2), wasm-bindgen $WASM_BINDGEN_VERSION," \
       "$(chromium --version 2>/dev/null | head -1), $(firefox-esr --version 2>/dev/null | head -1)," \
       "geckodriver $GECKODRIVER_VERSION, WebKitGTK $(dpkg-query -W -f '${Version}' libwebkit2gtk-4.1-0 2>/dev/null)," \
       "wasm-opt $(wasm-opt --version | cut -d' ' -f3)"
}

build_worker() {
  step "worker (wasm)"
  wasm-pack build --mode no-install --release --target no-modules \
    --out-dir www/pkg --out-name sw_outbox --no-typescript --no-pack
  local wasm=www/pkg/sw_outbox_bg.wasm
  # binaryen 132 from npm; Debian's older wasm-opt breaks wasm-bindgen output.
  # --converge repeats -Oz while it still shrinks the module; --low-memory-unused lets it
  # fold address offsets: rustc puts the stack at the bottom of memory, so the low 1 KB
  # is touched only by a stack about to overflow (1.8 KB gzip less, both).
  local features=(--enable-bulk-memory --enable-nontrapping-float-to-int --enable-reference-types
    --enable-sign-ext --enable-mutable-globals)
  wasm-opt -Oz --converge --low-memory-unused "${features[@]}" --strip-debug --strip-producers \
    "$wasm" -o "$wasm.opt"
  mv "$wasm.opt" "$wasm"
  # Short names for the glue's ~235 imports, their module and the exports (each
  # `__wbg_<name>_<16 hex>` was spelt once in each file: 6.4 KB gzip): binaryen renames
  # them in the module and prints its map, which apply-name-map.mjs applies to the glue.
  wasm-opt "${features[@]}" --minify-imports-and-exports-and-modules "$wasm" -o "$wasm.opt" \
    > www/pkg/names.json
  mv "$wasm.opt" "$wasm"
  node scripts/apply-name-map.mjs www/pkg/sw_outbox.js www/pkg/names.json "$wasm"
  rm www/pkg/names.json
  # The glue is generated code: shipped minified (esbuild from npm; top-level names, such
  # as the `wasm_bindgen` global sw.js calls, are kept), 10.4 -> 7.7 KB gzip.
  esbuild www/pkg/sw_outbox.js --minify --log-level=warning --outfile=www/pkg/sw_outbox.min.js
  mv www/pkg/sw_outbox.min.js www/pkg/sw_outbox.js
  # A module worker imports the glue (worker.js): there its top-level `let` is not
  # global, so the glue names itself on `self` (sw.js calls it by that name).
  printf '\nself.wasm_bindgen = wasm_bindgen;\n' >> www/pkg/sw_outbox.js
  node scripts/check-wasm.mjs www/pkg
  # The module's bytes as a script (scripts/wasm-script.mjs), which sw.js loads with
  # importScripts: the browser keeps it with the worker's version, out of reach of any
  # Cache Storage cleanup (issue 37). One character a byte: gzip -9 ~4% over the .wasm's.
  node scripts/wasm-script.mjs www/pkg
  local build
  build=$(sha256sum "$wasm" www/pkg/sw_outbox.js | sha256sum | cut -c1-12)
  printf 'self.SW_OUTBOX_BUILD = "%s";\n' "$build" > www/pkg/build.js
  rm -f www/pkg/.gitignore
  ls -l www/pkg
}

build_server() {
  step "reference server"
  # The workspace's release profile aborts on panic (for the worker's size); the server
  # unwinds, so the idempotency layer can store a panicking route's 500 before the panic
  # goes on.
  # And the conformance check (server/conformance), run against the interop app.
  cargo build --release -p sw-outbox-server -p sw-outbox-conformance \
    --config 'profile.release.panic="unwind"'
}

# Runs one suite, keeping its output to count tests afterwards.
LOGS=$(mktemp -d)
STATUS=0
# A suite that hangs is ended after SUITE_TIMEOUT seconds (default 20 min; the longest,
# one engine's end-to-end run with its chaos run, takes about 7 here) and counts as failed,
# so a hang shows as a failure instead of running CI out of time.
suite() {
  local name=$1 start=$SECONDS; shift
  step "$name"
  if ! timeout -k 30 "${SUITE_TIMEOUT:-1200}" "$@" 2>&1 | tee "$LOGS/$name.log"; then
    if [ "${PIPESTATUS[0]}" = 124 ]; then
      echo "!! $name failed: ended after ${SUITE_TIMEOUT:-1200} s"
    else
      echo "!! $name failed"
    fi
    STATUS=1
  fi
  echo $((SECONDS - start)) > "$LOGS/$name.seconds"
}

# Adds up what each runner printed: cargo test and wasm-bindgen-test-runner
# ("test result: ok. N passed; M failed; K ignored"), node --test ("# pass N",
# "# fail M", "# skipped K", "# todo T": a todo is a known failure, shown, not failing).
suite_counts() {
  local log=$1 passed=0 failed=0 skipped=0 p f k t
  while read -r p f k; do
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + k))
  done < <(sed -n 's/^test result: [a-zA-Z]*\. \([0-9]*\) passed; \([0-9]*\) failed; \([0-9]*\) ignored.*/\1 \2 \3/p' "$log")
  p=$(sed -n 's/^# pass \([0-9]*\)$/\1/p' "$log" | tail -1)
  f=$(sed -n 's/^# fail \([0-9]*\)$/\1/p' "$log" | tail -1)
  k=$(sed -n 's/^# skipped \([0-9]*\)$/\1/p' "$log" | tail -1)
  t=$(sed -n 's/^# todo \([0-9]*\)$/\1/p' "$log" | tail -1)
  echo $((passed + ${p:-0})) $((failed + ${f:-0})) $((skipped + ${k:-0})) "${t:-0}"
}

count_results() {
  local passed=0 failed=0 p f k t log name
  echo
  for log in "$LOGS"/*.log; do
    read -r p f k t < <(suite_counts "$log")
    [ "$p" = 0 ] && [ "$f" = 0 ] && [ "$k" = 0 ] && [ "$t" = 0 ] && continue
    name=$(basename "$log" .log)
    printf '  %-24s %s passed, %s failed, %s skipped%s (%ss)\n' "$name" "$p" "$f" "$k" \
      "$([ "$t" = 0 ] || echo ", $t todo")" "$(cat "$LOGS/$name.seconds" 2>/dev/null || echo '?')"
    passed=$((passed + p)); failed=$((failed + f))
  done
  echo "  (${SECONDS}s)"
  echo "total: $passed passed, $failed failed"
}

run_tests() {
  export CHROMEDRIVER=/usr/bin/chromedriver
  export WASM_BINDGEN_TEST_TIMEOUT=${WASM_BINDGEN_TEST_TIMEOUT:-120}
  suite lint bash -c 'cargo fmt --all --check &&
    cargo clippy --workspace --all-targets -- -D warnings &&
    cargo clippy --lib --tests --target wasm32-unknown-unknown -- -D warnings'
  # (The multi-instance test runs as a suite of its own, below.)
  suite host cargo test --workspace --exclude sw-outbox-conformance -- --skip multi_instance_
  # The ledger shared by two reference-server processes on one real PostgreSQL (started by
  # the test), one of them with its clock five minutes ahead (libfaketime): every write
  # applied once (server/tests/multi_instance.rs).
  suite multi-instance cargo test -p sw-outbox-server --test multi_instance
  # The idempotency crate as crates.io would take it: each ledger feature alone (the
  # PostgreSQL one without rusqlite), its docs without a warning, `cargo package` and
  # `cargo publish --dry-run` (nothing is published; they read crates.io's index).
  suite ledger-crate bash -c 'set -e
    cargo check -p sw-outbox-idempotency --no-default-features
    cargo check -p sw-outbox-idempotency --no-default-features --features sqlite
    cargo check -p sw-outbox-idempotency --no-default-features --features postgres
    if cargo tree -p sw-outbox-idempotency --no-default-features --features postgres -e normal \
        | grep -E "rusqlite|libsqlite3-sys"; then
      echo "the postgres feature alone must not pull in SQLite"; exit 1
    fi
    RUSTDOCFLAGS="-D warnings" cargo doc -p sw-outbox-idempotency --no-deps --all-features
    cargo package -p sw-outbox-idempotency
    cargo publish --dry-run -p sw-outbox-idempotency'
  # The conformance check against the reference server on SQLite and PostgreSQL, and
  # against a server without a ledger (it must fail there); the interop suite runs it
  # against express-idempotency.
  suite conformance cargo test -p sw-outbox-conformance
  suite service-worker wasm-pack test --mode no-install --headless --chrome
  # The same service-worker tests in Debian's Firefox ESR (webdriver.json names the binary).
  suite service-worker-firefox env GECKODRIVER="$HOME/.cargo/bin/geckodriver" \
    wasm-pack test --mode no-install --headless --firefox
  # And in WebKitGTK: wasm-bindgen-test-runner drives WebKitWebDriver as its
  # "safaridriver" (it sends no capabilities; the driver then launches its MiniBrowser),
  # on a virtual display of its own (scripts/webkit-webdriver.sh).
  suite service-worker-webkit wasm-pack test --mode no-install --headless --safari \
    --safaridriver "$ROOT/scripts/webkit-webdriver.sh"
  # The Chromium-only end-to-end test (tests/e2e): the update hand-over with DevTools on
  # one worker only (its own CDP client); every other scenario runs in tests/e2e-engines.
  suite end-to-end npm run --silent test:e2e
  # The worker against a third-party idempotency middleware (express-idempotency, npm).
  suite interop node --test --test-concurrency=1 tests/interop/
  # The npm package (./package): its declarations against a consumer fixture using every
  # export (tsc --noEmit --strict, typescript pinned), a fresh Vite app built with the
  # packed tarball and the sw-outbox/vite plugin, and npm's publish checks (--dry-run:
  # nothing is published, no credentials needed; it asks the registry for the versions).
  suite types node --test tests/types/
  # The page helper's state (OutboxStore) message by message, in Node (no browser API).
  suite page-helper node --test tests/page/
  # What the READMEs claim, against the build and the repository: the package's size
  # line (scripts/package-size.mjs --write rewrites it), README.md's length, commands and
  # code, the documents' links, docs/TESTING.md's row per suite.
  suite docs node --test tests/docs/
  suite vite-app node --test --test-concurrency=1 tests/bundler/
  # The package README's recipes (the outbox beside Workbox, Serwist, vite-plugin-pwa, in
  # SvelteKit's own worker, and a static site), built once with the pinned libraries and
  # run in the three engines.
  suite recipes env GECKODRIVER="$HOME/.cargo/bin/geckodriver" \
    node --test --test-concurrency=1 tests/recipes/
  suite publish-dry-run npm publish --dry-run ./package
  # One end-to-end suite, three engines (tests/e2e-engines), one run per engine so each
  # engine's time shows; a scenario an engine cannot run is a skip with its reason. The
  # chaos run takes the same seed in the three (printed; CHAOS_SEED=<n> replays it).
  local engine
  export CHAOS_SEED=${CHAOS_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
  for engine in chromium firefox webkit; do
    suite "end-to-end-$engine" env E2E_ENGINES=$engine GECKODRIVER="$HOME/.cargo/bin/geckodriver" \
      node --test --test-concurrency=1 tests/e2e-engines/
  done
  # The benchmark once at a tiny N: it still runs, no duplicates, order kept. No timings.
  suite bench-smoke node bench/run.mjs --smoke
  count_results
  return $STATUS
}

demo() {
  step "demo on http://127.0.0.1:$PORT (Ctrl-C stops it)"
  mkdir -p server/data
  # --key-ttl pairs with the demo worker's serverKeyTtlMs (www/sw.js): it must not be shorter.
  exec target/release/sw-outbox-server --port "$PORT" --www www --mode demo \
    --db server/data/demo.sqlite --key-ttl 24h
}

cmd=${1:-build}
setup
build_worker
build_server
case "$cmd" in
  build) ;;
  demo) demo ;;
  test) run_tests ;;
  *) echo "usage: $0 [build|demo|test]" >&2; exit 2 ;;
esac
