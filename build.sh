#!/usr/bin/env bash
# sw-outbox: set-up, build, demo and tests in one script, safe to re-run.
#
#   ./build.sh          install what is missing, build the worker and the server
#   ./build.sh demo     ... then run the demo (server + PWA) on http://127.0.0.1:8080
#   ./build.sh test     ... then run every test: host, service worker (Chromium and
#                       Firefox), end to end (Chromium and Firefox)
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
  # The server's PostgreSQL ledger tests start a throwaway cluster with these binaries
  # (they never use the cluster the package itself may create).
  if ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
    apt_install postgresql
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
       "geckodriver $GECKODRIVER_VERSION, wasm-opt $(wasm-opt --version | cut -d' ' -f3)"
}

build_worker() {
  step "worker (wasm)"
  wasm-pack build --mode no-install --release --target no-modules \
    --out-dir www/pkg --out-name sw_outbox --no-typescript --no-pack
  local wasm=www/pkg/sw_outbox_bg.wasm
  # binaryen 132 from npm; Debian's older wasm-opt breaks wasm-bindgen output.
  wasm-opt -Oz --enable-bulk-memory --enable-nontrapping-float-to-int \
    --enable-reference-types --enable-sign-ext --enable-mutable-globals --strip-debug --strip-producers \
    "$wasm" -o "$wasm.opt"
  mv "$wasm.opt" "$wasm"
  node scripts/check-wasm.mjs www/pkg
  local build
  build=$(sha256sum "$wasm" www/pkg/sw_outbox.js | sha256sum | cut -c1-12)
  printf 'self.SW_OUTBOX_BUILD = "%s";\n' "$build" > www/pkg/build.js
  rm -f www/pkg/.gitignore
  ls -l www/pkg
}

build_server() {
  step "reference server"
  cargo build --release -p sw-outbox-server
}

# Runs one suite, keeping its output to count tests afterwards.
LOGS=$(mktemp -d)
STATUS=0
suite() {
  local name=$1; shift
  step "$name"
  if ! "$@" 2>&1 | tee "$LOGS/$name.log"; then
    echo "!! $name failed"
    STATUS=1
  fi
}

# Adds up what each runner printed: cargo test and wasm-bindgen-test-runner
# ("test result: ok. N passed; M failed"), node --test ("# pass N", "# fail M").
suite_counts() {
  local log=$1 passed=0 failed=0 p f
  while read -r p f; do
    passed=$((passed + p)); failed=$((failed + f))
  done < <(sed -n 's/^test result: [a-zA-Z]*\. \([0-9]*\) passed; \([0-9]*\) failed.*/\1 \2/p' "$log")
  p=$(sed -n 's/^# pass \([0-9]*\)$/\1/p' "$log" | tail -1)
  f=$(sed -n 's/^# fail \([0-9]*\)$/\1/p' "$log" | tail -1)
  echo $((passed + ${p:-0})) $((failed + ${f:-0}))
}

count_results() {
  local passed=0 failed=0 p f log
  echo
  for log in "$LOGS"/*.log; do
    read -r p f < <(suite_counts "$log")
    [ "$p" = 0 ] && [ "$f" = 0 ] && continue
    printf '  %-24s %s passed, %s failed\n' "$(basename "$log" .log)" "$p" "$f"
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
  suite host cargo test --workspace
  suite service-worker wasm-pack test --mode no-install --headless --chrome
  # The same service-worker tests in Debian's Firefox ESR (webdriver.json names the binary).
  suite service-worker-firefox env GECKODRIVER="$HOME/.cargo/bin/geckodriver" \
    wasm-pack test --mode no-install --headless --firefox
  suite end-to-end npm run --silent test:e2e
  suite end-to-end-firefox env GECKODRIVER="$HOME/.cargo/bin/geckodriver" node --test --test-concurrency=1 tests/e2e-firefox/
  # The benchmark once at a tiny N: it still runs, no duplicates, order kept. No timings.
  suite bench-smoke node bench/run.mjs --smoke
  count_results
  return $STATUS
}

demo() {
  step "demo on http://127.0.0.1:$PORT (Ctrl-C stops it)"
  mkdir -p server/data
  exec target/release/sw-outbox-server --port "$PORT" --www www --mode demo \
    --db server/data/demo.sqlite
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
