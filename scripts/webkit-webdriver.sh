#!/usr/bin/env bash
# WebKitWebDriver (WebKitGTK's WebDriver) on a virtual X server of its own: MiniBrowser,
# the browser it drives, needs a display, `--headless` too. Arguments go to the driver
# (`--port=N`). Used as "the safaridriver" of wasm-bindgen-test-runner
# (`wasm-pack test --headless --safari --safaridriver <this script>`; with no
# capabilities the driver launches its own MiniBrowser) and by tests/e2e-engines.
#
# Xvfb picks a free display itself (-displayfd), so parallel runs do not collide.
# wasm-bindgen-test-runner ends its driver with SIGKILL, which no trap sees: a watcher in
# its own process group ends the driver, the browser and Xvfb once this process is gone.
set -uo pipefail
set -m # every background job gets a process group of its own

dir=$(mktemp -d "${TMPDIR:-/tmp}/sw-outbox-xvfb.XXXXXX")
Xvfb -displayfd 3 -screen 0 1280x800x24 -nolisten tcp 3>"$dir/display" \
  </dev/null >"$dir/xvfb.log" 2>&1 &
xvfb=$!
driver=

end_all() {
  if [ -n "$driver" ] && kill -TERM -- "-$driver" 2>/dev/null; then
    for _ in $(seq 20); do
      kill -0 -- "-$driver" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL -- "-$driver" 2>/dev/null
  fi
  kill -TERM -- "-$xvfb" 2>/dev/null
  rm -rf "$dir"
}

for _ in $(seq 100); do
  [ -s "$dir/display" ] && break
  kill -0 "$xvfb" 2>/dev/null || break
  sleep 0.1
done
if [ ! -s "$dir/display" ]; then
  echo "webkit-webdriver: Xvfb did not start:" >&2
  cat "$dir/xvfb.log" >&2
  end_all
  exit 1
fi

DISPLAY=":$(head -1 "$dir/display")" WebKitWebDriver "$@" &
driver=$!
me=$$

# The watcher holds none of the caller's pipes (a runner reads them until they close).
(
  while kill -0 "$me" 2>/dev/null && kill -0 "$driver" 2>/dev/null; do sleep 0.5; done
  end_all
) </dev/null >/dev/null 2>&1 &

trap 'end_all; exit 143' TERM INT HUP
wait "$driver"
status=$?
end_all
exit "$status"
