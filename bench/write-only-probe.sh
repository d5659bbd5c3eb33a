#!/usr/bin/env bash
# Builds the "write-path only" module of issue 36's split question into
# bench/out/www-write-only, to be benchmarked beside www/ with `bench/run.mjs --www=`.
#
# The split (a small module for the write path, the rest instantiated when first needed)
# was to pay only if the module's size decides the first write after a stopped worker.
# This measures its best case without building it: the same crate, with
# bench/write-only-probe.patch applied in a throw-away worktree, which makes every flush
# return at once and answers every command but AUTH_SESSION `ok` without running it, so
# the linker drops the replay, recovery and listing code. Writes, the session, the sign-in
# barrier and the database work as in the product: `--only=firstonline` runs unchanged.
# Never shipped: a worker built this way does not replay. It builds the committed HEAD,
# and compares against the product's build in www/pkg (bash build.sh build).
#
#   bash bench/write-only-probe.sh
#   node bench/run.mjs --only=firstonline --reps=8 --www=bench/out/www-write-only --no-scale
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
tmp=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$tmp/tree" 2>/dev/null || true; rm -rf "$tmp"' EXIT
git worktree add --quiet --detach "$tmp/tree" HEAD
cd "$tmp/tree"
git apply "$root/bench/write-only-probe.patch"
# A copy, never a link: build.sh's set-up may run `npm ci` in it, which empties the
# directory first. Newer than the lock file, so it does not.
cp -a "$root/node_modules" node_modules
touch node_modules/.package-lock.json
# A target directory of its own under target/ (the probe's features change the crate's
# build), kept between runs: the first run compiles everything, later ones the crate.
CARGO_TARGET_DIR="$root/target/write-only-probe" PROBE_FEATURES=probe-write-only-strict \
  bash build.sh build >"$tmp/build.log" 2>&1 || { tail -40 "$tmp/build.log"; exit 1; }
rm -rf "$root/bench/out/www-write-only"
mkdir -p "$root/bench/out"
cp -r www "$root/bench/out/www-write-only"
for f in sw_outbox_bg.wasm sw_outbox_wasm.js; do
  printf '%-20s product %7d B (gzip -9 %6d)   write-only %7d B (gzip -9 %6d)\n' "$f" \
    "$(wc -c <"$root/www/pkg/$f")" "$(gzip -9c "$root/www/pkg/$f" | wc -c)" \
    "$(wc -c <www/pkg/$f)" "$(gzip -9c www/pkg/$f | wc -c)"
done
